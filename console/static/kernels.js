// The tenant's live kernels (GET /kernels): run, state, age, last use, CPU
// and memory as the backend reports them, with interrupt, restart and
// stop; and the kernel quota's use. Kept current while the page is open.
import { $, CAN_WRITE, api, badge, el, fmtBytes, quotaText, runPage, time, toast } from './lib.js';

const tbody = $('#kernels tbody');

function cpu(k) {
  return k.cpu_seconds == null ? el('span', { class: 'muted', text: 'n/a', title: 'The backend does not report it' }) : `${k.cpu_seconds.toFixed(1)} s`;
}

function mem(k) {
  return k.memory_bytes == null ? el('span', { class: 'muted', text: 'n/a', title: 'The backend does not report it' }) : fmtBytes(k.memory_bytes);
}

async function act(k, action) {
  const path = `/kernels/${encodeURIComponent(k.run_id)}`;
  try {
    const r = action === 'stop' ? await api('DELETE', path) : await api('POST', `${path}/${action}`);
    const n = r.interrupted ? ` (${r.interrupted} cell${r.interrupted > 1 ? 's' : ''} interrupted)` : '';
    toast(`${action === 'stop' ? 'Stopped' : action === 'restart' ? 'Restarted' : 'Interrupted'} ${k.run_id}'s kernel${n}`);
  } catch (e) {
    toast(e.text || String(e));
  }
  await load();
}

function row(k) {
  const btn = (action, label, cls = '') => el('button', {
    type: 'button', class: `btn btn-quiet small ${cls}`.trim(), text: label, dataset: { action },
    'aria-label': `${label} ${k.run_id}'s kernel`, disabled: !CAN_WRITE, onclick: () => act(k, action),
  });
  // data-label names each cell where a narrow screen stacks the row.
  return el('tr', { dataset: { run: k.run_id } },
    el('td', { class: 'k-run' }, el('a', { class: 'runlink mono', href: runPage(k.run_id), text: k.run_id }), k.contexts ? el('div', { class: 'muted small', text: `${k.contexts} context${k.contexts > 1 ? 's' : ''}` }) : null),
    el('td', { dataset: { label: 'State' } }, k.busy ? badge('busy', 'running') : badge('idle', 'open')),
    el('td', { dataset: { label: 'Started' } }, time(k.started)),
    el('td', { dataset: { label: 'Last used' } }, time(k.last_used)),
    el('td', { class: 'num', dataset: { label: 'CPU' } }, cpu(k)),
    el('td', { class: 'num', dataset: { label: 'Memory' } }, mem(k)),
    el('td', { class: 'k-actions' }, el('div', { class: 'kactions' }, btn('interrupt', 'Interrupt'), btn('restart', 'Restart'), btn('stop', 'Stop', 'btn-danger'))));
}

async function load() {
  try {
    const kl = await api('GET', '/kernels');
    tbody.replaceChildren(...kl.kernels.map(row));
    $('#kernels-empty').hidden = kl.kernels.length > 0;
    $('#kernel-quota').textContent = quotaText(kl);
  } catch (e) {
    toast(e.text || String(e));
  }
}

$('#kernels-refresh').addEventListener('click', load);
setInterval(() => {
  if (document.visibilityState === 'visible') load();
}, 5000);
load();
