// Launch a recipe: a form built from the recipe's params (types,
// defaults, descriptions) and input files (upload, or the default), then
// POST /run and on to the run's live page.
import { $, CAN_WRITE, api, el, runPage, showQuota } from './lib.js';

const box = $('#recipes');
const form = $('#launch-form');
const errBox = $('#launch-error');
let recipe = null; // wire.RecipeInfo, in full

// pick shows a recipe's form. Chosen by hand on a narrow screen, where
// the form is below the list, it scrolls the form into view.
async function pick(name, byHand = false) {
  for (const b of box.querySelectorAll('.recipe-opt')) b.setAttribute('aria-checked', String(b.dataset.name === name));
  history.replaceState(null, '', `/console/launch?recipe=${encodeURIComponent(name)}`);
  await load(name);
  if (byHand && matchMedia('(max-width: 900px)').matches) $('#form-card').scrollIntoView({ block: 'start' });
}

async function list() {
  let rs;
  try {
    rs = (await api('GET', '/recipes')).recipes;
  } catch (e) {
    box.replaceChildren(el('p', { class: 'alert', text: e.text || String(e) }));
    return;
  }
  box.replaceChildren(...rs.map((r) => el('button', {
    type: 'button', role: 'radio', class: 'recipe-opt', 'aria-checked': 'false', dataset: { name: r.name },
    onclick: () => pick(r.name, true),
  }, el('div', { class: 't' }, r.title || r.name, ' ', el('span', { class: 'muted mono small', text: r.name })),
  el('div', { class: 'd', text: r.description || '' }),
  el('div', { class: 'muted small', text: `backend: ${r.backend}` }))));
  const want = document.querySelector('.launch').dataset.recipe;
  if (want && rs.some((r) => r.name === want)) pick(want);
}

function field(p) {
  const id = `p-${p.name}`;
  const help = `${p.description || ''}${p.required ? ' Required.' : ''}`.trim();
  const label = el('label', { for: id }, p.name, el('span', { class: 'type', text: p.type }));
  const describedBy = help ? `${id}-help` : null;
  const helpEl = help ? el('p', { class: 'help', id: `${id}-help`, text: help }) : null;
  const def = p.default;
  let input;
  switch (p.type) {
    case 'bool':
      input = el('input', { type: 'checkbox', id, name: p.name, checked: def === true, 'aria-describedby': describedBy });
      return el('div', { class: 'field check' }, input, label, helpEl);
    case 'int':
      input = el('input', { type: 'number', step: '1', id, name: p.name, value: def ?? '', required: p.required, 'aria-describedby': describedBy, inputmode: 'numeric' });
      break;
    case 'float':
      input = el('input', { type: 'number', step: 'any', id, name: p.name, value: def ?? '', required: p.required, 'aria-describedby': describedBy, inputmode: 'decimal' });
      break;
    case 'list':
      input = el('textarea', { id, name: p.name, rows: Math.min(6, Math.max(2, (def || []).length)), required: p.required, 'aria-describedby': describedBy });
      input.value = (def || []).join('\n');
      label.append(el('span', { class: 'type', text: 'one per line' }));
      break;
    default:
      if (p.name === 'objective' || String(def || '').length > 60) {
        input = el('textarea', { id, name: p.name, rows: 2, required: p.required, 'aria-describedby': describedBy });
        input.value = def ?? '';
      } else {
        input = el('input', { type: 'text', id, name: p.name, value: def ?? '', required: p.required, 'aria-describedby': describedBy });
      }
  }
  return el('div', { class: 'field' }, label, input, helpEl);
}

function inputField(inp) {
  const id = `in-${inp.name}`;
  const help = [inp.description, inp.default ? `Leave it empty to use the bundled sample ${inp.default}.` : inp.required ? 'Required.' : 'Optional.']
    .filter(Boolean).join(' ');
  return el('div', { class: 'field' },
    el('label', { for: id }, inp.name, el('span', { class: 'type', text: inp.path })),
    el('input', { type: 'file', id, name: inp.name, dataset: { path: inp.path }, 'aria-describedby': `${id}-help` }),
    el('p', { class: 'help', id: `${id}-help`, text: help }));
}

async function load(name) {
  errBox.hidden = true;
  try {
    recipe = await api('GET', `/recipes/${encodeURIComponent(name)}`);
  } catch (e) {
    errBox.textContent = e.text || String(e);
    errBox.hidden = false;
    return;
  }
  $('#form-card').hidden = false;
  $('#form-title').textContent = recipe.title || recipe.name;
  $('#recipe-desc').textContent = recipe.description || '';
  $('#params').replaceChildren(el('legend', { class: 'sr-only', text: 'Parameters' }), ...(recipe.params || []).map(field));
  const ins = recipe.inputs || [];
  $('#inputs').hidden = ins.length === 0;
  $('#inputs').replaceChildren(el('legend', { text: 'Input files' }), ...ins.map(inputField));
}

// values reads the form as typed params; empty optional fields are left
// out, so the recipe's defaults (or derived values, like the seed) apply.
function values() {
  const out = {};
  for (const p of recipe.params || []) {
    const input = form.elements.namedItem(p.name);
    if (!input) continue;
    if (p.type === 'bool') {
      out[p.name] = input.checked;
      continue;
    }
    const raw = input.value.trim();
    if (raw === '') {
      if (p.required) throw new Error(`${p.name} is required`);
      continue;
    }
    switch (p.type) {
      case 'int': {
        const n = Number(raw);
        if (!Number.isInteger(n)) throw new Error(`${p.name} must be a whole number`);
        out[p.name] = n;
        break;
      }
      case 'float': {
        const n = Number(raw);
        if (Number.isNaN(n)) throw new Error(`${p.name} must be a number`);
        out[p.name] = n;
        break;
      }
      case 'list':
        out[p.name] = raw.split('\n').map((s) => s.trim()).filter(Boolean);
        break;
      default:
        out[p.name] = raw;
    }
  }
  return out;
}

form.addEventListener('submit', async (e) => {
  e.preventDefault();
  if (!CAN_WRITE) return; // the form is disabled: the key cannot start runs
  errBox.hidden = true;
  const btn = $('#launch-btn');
  btn.disabled = true;
  btn.textContent = 'Launching…';
  try {
    const params = values();
    const uploads = [...form.querySelectorAll('input[type=file]')].filter((i) => i.files.length);
    let started;
    if (uploads.length) {
      // The files go with the request: the run is set up from them before
      // its first call, and a refused launch leaves no run behind.
      const fd = new FormData();
      fd.append('request', JSON.stringify({ recipe: recipe.name, params }));
      for (const u of uploads) fd.append(`input:${u.name}`, u.files[0], u.files[0].name);
      started = await api('POST', '/run', { body: fd });
    } else {
      started = await api('POST', '/run', { json: { recipe: recipe.name, params } });
    }
    location.href = runPage(started.run_id);
  } catch (err) {
    errBox.textContent = err.text || err.message || String(err);
    errBox.hidden = false;
    btn.disabled = false;
    btn.textContent = 'Launch run';
  }
});

list();
showQuota($('#kernel-quota'));
