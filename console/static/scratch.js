// Scratch cells on a manual run: a notebook-like list of cells, each run
// through sandbox.exec with its output streamed (POST /sandbox/exec with
// Accept: text/event-stream), a files panel, and a kernel restart.
import {
  $, ApiError, CAN_WRITE, NONCE, RUN, api, apiHeaders, el, errorOf, fileURL, fmtBytes, fmtDur, isRecord, sse, toast, showQuota,
} from './lib.js';
import { bundle as renderBundle, errorBlock, stream } from './cells.js';
import { createEditor } from './vendor/editor.js';

const cellsEl = $('#cells');
const KEY = `triad-cells-${RUN}`;
const NEW = new URLSearchParams(location.search).get('new') === '1';
const cells = []; // {root, ed, out, count, saved}
const bundle = (data) => renderBundle(RUN, data);

// final renders a finished cell from its answer (wire.ExecResponse): how
// a cell is shown again after a reload.
function final(out, r) {
  out.replaceChildren();
  if (r.stdout) stream(out, 'stdout', r.stdout);
  if (r.stderr) stream(out, 'stderr', r.stderr);
  for (const d of r.display || []) {
    const b = bundle(d.data || {});
    if (b) out.append(b);
  }
  if (r.result) {
    const b = bundle(r.result.data || {});
    if (b) out.append(b);
  }
  if (r.error) out.append(errorBlock(r.error));
  meta(out, r);
}

function meta(out, r) {
  const bits = [`${r.ok ? 'ok' : 'failed'} in ${fmtDur(r.duration_ms)}`];
  const wrote = (r.files_out || []).map((f) => f.path).filter((p) => !p.startsWith('outputs/'));
  if (wrote.length) bits.push(`wrote ${wrote.slice(0, 5).join(', ')}${wrote.length > 5 ? ` and ${wrote.length - 5} more` : ''}`);
  if (r.kernel?.restarted) bits.push('the kernel restarted: variables are gone');
  if (r.truncated) bits.push('output truncated (the full text is in the run\'s files)');
  out.append(el('div', { class: 'meta', text: bits.join(' · ') }));
}

// ---- cells --------------------------------------------------------------

function addCell(saved) {
  const n = cells.length + 1;
  const count = el('div', { class: 'cell-count', 'aria-hidden': 'true', text: '[ ]' });
  const out = el('div', { class: 'cell-out', 'aria-live': 'polite' });
  const box = el('div', { class: 'cell-editor' });
  const run = el('button', { type: 'button', class: 'btn btn-quiet small cell-run', title: 'Run (Shift+Enter)', 'aria-label': `Run cell ${n}` },
    el('span', { 'aria-hidden': 'true', text: '▶' }), el('span', { class: 'word', text: 'Run' }));
  const root = el('div', { class: 'cell', dataset: { n } }, el('div', { class: 'cell-in' }, count, box, run), out);
  const cell = { root, out, count, saved: saved || null };
  cells.push(cell);
  cellsEl.append(root);
  // Shift+Enter runs the cell and goes to the next (a new one at the
  // end); Ctrl+Enter runs it and stays; Tab indents (Escape, then Tab,
  // moves on).
  cell.ed = createEditor(box, {
    nonce: NONCE,
    doc: saved?.code || '',
    label: `Cell ${n} code`,
    placeholder: n === 1 ? 'print("hello")  — Shift+Enter runs' : '',
    readOnly: !CAN_WRITE,
    keys: [
      {
        key: 'Shift-Enter',
        run: () => {
          runCell(cell);
          const i = cells.indexOf(cell);
          (cells[i + 1] || addCell()).ed.focus();
          return true;
        },
      },
      { key: 'Mod-Enter', run: () => (runCell(cell), true) },
    ],
  });
  box.editor = cell.ed; // for the browser test: the text as the editor holds it
  if (saved?.answer) {
    count.textContent = `[${saved.answer.execution_count || ' '}]`;
    final(out, saved.answer);
  } else if (saved?.error) {
    out.append(errorBlock(saved.error));
  }
  run.addEventListener('click', () => runCell(cell));
  if (!CAN_WRITE) run.disabled = true;
  return cell;
}

function save() {
  const list = cells.filter((c) => c.saved).map((c) => c.saved);
  try {
    sessionStorage.setItem(KEY, JSON.stringify(list));
  } catch {
    /* over the quota: the cells stay on the page */
  }
}

async function runCell(cell) {
  const code = cell.ed.value;
  if (!code.trim() || cell.root.classList.contains('running')) return;
  cell.root.classList.add('running');
  cell.count.textContent = '[*]';
  cell.out.replaceChildren();
  cell.saved = { code };
  try {
    const resp = await fetch('/sandbox/exec', {
      method: 'POST', credentials: 'same-origin',
      headers: apiHeaders('POST', RUN, { 'Content-Type': 'application/json', Accept: 'text/event-stream' }),
      body: JSON.stringify({ code }),
    });
    if (!resp.ok) throw await errorOf(resp);
    for await (const ev of sse(resp)) {
      const d = JSON.parse(ev.data);
      switch (ev.event) {
        case 'stdout':
        case 'stderr':
          stream(cell.out, ev.event, d.text || '');
          break;
        case 'display':
        case 'result': {
          const b = d.bundle && bundle(d.bundle.data || {});
          if (b) cell.out.append(b);
          break;
        }
        case 'clear':
          cell.out.replaceChildren();
          break;
        case 'done':
          cell.count.textContent = `[${d.execution_count || ' '}]`;
          if (d.error) cell.out.append(errorBlock(d.error));
          meta(cell.out, d);
          cell.saved.answer = d;
          break;
        case 'error':
          cell.count.textContent = '[!]';
          cell.out.append(errorBlock(d.error || {}));
          cell.saved.error = d.error;
          break;
      }
    }
  } catch (e) {
    cell.count.textContent = '[!]';
    const err = { message: e.message || String(e), suggestion: e.suggestion || '' };
    cell.out.append(errorBlock(err));
    cell.saved.error = err;
  } finally {
    cell.root.classList.remove('running');
    save();
    refreshFiles();
  }
}

// ---- files --------------------------------------------------------------

const hidden = (p) => /^CEL\.step_\d+\.md$/.test(p) || p.startsWith('outputs/');

// refreshFiles lists the run's files; a new scratch run that no cell or
// upload has made yet has none, and is not asked (a 404 the browser would
// log as an error).
async function refreshFiles(ask = true) {
  try {
    let files = [];
    if (ask) try {
      ({ files } = await api('GET', `/runs/${RUN}/files`));
    } catch (e) {
      // A new scratch run is made by its first cell or upload.
      if (!(e instanceof ApiError && e.status === 404 && NEW)) throw e;
    }
    const shown = files.filter((f) => !hidden(f.path));
    // The cells' files first, Triad's records after them.
    shown.sort((x, y) => isRecord(x.path) - isRecord(y.path) || x.path.localeCompare(y.path));
    $('#filelist').replaceChildren(...(shown.length ? shown.map((f) => el('li', { class: isRecord(f.path) ? 'record' : null },
      el('a', { href: fileURL(RUN, f.path, true), download: f.path.split('/').pop(), text: f.path, title: `Download ${f.path}` }),
      el('span', { class: 'muted', text: fmtBytes(f.size) }))) : [el('li', { class: 'muted', text: 'No files yet.' })]));
  } catch (e) {
    toast(e.text || String(e));
  }
}

$('#files-refresh').addEventListener('click', refreshFiles);
$('#upload')?.addEventListener('change', async (e) => {
  const input = e.target;
  for (const f of input.files) {
    try {
      await api('PUT', `/tmp/files/${encodeURIComponent(f.name)}`, { run: RUN, body: f, headers: { 'Content-Type': 'application/octet-stream' } });
      toast(`Uploaded ${f.name}: open('${f.name}') reads it`);
    } catch (err) {
      toast(`${f.name}: ${err.text || err}`);
    }
  }
  input.value = '';
  refreshFiles();
});

// Restart asks twice (no window.confirm: a dialog would block the page).
let armed = 0;
$('#restart-btn')?.addEventListener('click', async (e) => {
  const btn = e.target;
  if (Date.now() - armed > 4000) {
    armed = Date.now();
    btn.textContent = 'Click again to restart';
    setTimeout(() => { if (Date.now() - armed >= 4000) btn.textContent = 'Restart kernel'; }, 4100);
    return;
  }
  armed = 0;
  btn.disabled = true;
  btn.textContent = 'Restarting…';
  try {
    await api('POST', '/sandbox/restart', { run: RUN });
    toast('Kernel restarted: variables are gone, files stay');
    cellsEl.append(el('p', { class: 'muted small center', text: '— kernel restarted —' }));
  } catch (err) {
    toast(err.text || String(err));
  } finally {
    btn.disabled = false;
    btn.textContent = 'Restart kernel';
  }
});

// ---- start --------------------------------------------------------------

let restored = [];
try {
  restored = JSON.parse(sessionStorage.getItem(KEY) || '[]');
} catch {
  restored = [];
}
restored.forEach((s) => addCell(s));
addCell().ed.focus();
refreshFiles(!NEW);
showQuota($('#kernel-quota'));
