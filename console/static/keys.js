// API keys, for admin keys: every key (never its secret) with its last
// use, a form that creates one (its token shown once), and revoke after a
// confirmation. All through the API's /keys routes.
import { $, api, copyButton, el, time, toast } from './lib.js';

const tbody = $('#keys tbody');
const form = $('#key-form');
let keys = [];

function row(k) {
  const revoked = Boolean(k.revoked);
  return el('tr', { dataset: { key: k.id }, class: revoked ? 'revoked' : null },
    el('td', {}, el('div', { class: 'key-name', text: k.name }), el('div', { class: 'mono muted small', text: k.id })),
    el('td', { text: k.tenant }),
    el('td', { text: (k.scopes || []).join(', ') }),
    el('td', {}, time(k.created)),
    el('td', {}, k.last_used ? time(k.last_used) : el('span', { class: 'muted', text: 'never' })),
    el('td', {}, revoked
      ? el('span', { class: 'muted small' }, 'revoked ', time(k.revoked))
      : el('button', { type: 'button', class: 'btn btn-quiet small btn-danger revoke', text: 'Revoke', 'aria-label': `Revoke key ${k.name} (${k.id})`, onclick: () => revoke(k) })),
  );
}

function draw() {
  const all = $('#show-revoked').checked;
  const shown = keys.filter((k) => all || !k.revoked);
  tbody.replaceChildren(...shown.map(row));
  $('#keys-empty').hidden = shown.length > 0;
}

async function load() {
  try {
    keys = (await api('GET', '/keys')).keys;
    keys.sort((a, b) => Boolean(a.revoked) - Boolean(b.revoked) || new Date(b.created) - new Date(a.created));
    draw();
  } catch (e) {
    toast(e.text || String(e));
  }
}

function revoke(k) {
  const d = $('#revoke-dialog');
  $('#revoke-what').textContent = `${k.name} (${k.id}), tenant ${k.tenant}, scopes ${(k.scopes || []).join(', ')}.`;
  d.returnValue = '';
  d.showModal();
  d.addEventListener('close', async () => {
    if (d.returnValue !== 'revoke') return;
    try {
      await api('DELETE', `/keys/${encodeURIComponent(k.id)}`);
      toast(`Key ${k.name} revoked`);
      await load();
    } catch (e) {
      toast(e.text || String(e));
    }
  }, { once: true });
}

form?.addEventListener('submit', async (e) => {
  e.preventDefault();
  const err = $('#key-error');
  err.hidden = true;
  const btn = $('#key-create');
  btn.disabled = true;
  try {
    const body = { name: $('#key-name').value.trim(), tenant: $('#key-tenant').value.trim() || 'default', scopes: [form.elements.scope.value] };
    const made = await api('POST', '/keys', { json: body });
    $('#new-key-token').value = made.token;
    $('#new-key-actions').replaceChildren(copyButton(made.token, 'Copy the key'),
      el('span', { class: 'muted small', text: `${made.key.name} · tenant ${made.key.tenant} · ${made.key.scopes.join(', ')}` }));
    $('#new-key').hidden = false;
    $('#new-key-token').select();
    form.reset();
    await load();
  } catch (e2) {
    err.textContent = e2.text || String(e2);
    err.hidden = false;
  } finally {
    btn.disabled = false;
  }
});
$('#show-revoked')?.addEventListener('change', draw);

if (form) load(); // else not an admin: the page says so

