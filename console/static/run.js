// A run's page: the live timeline of its journaled calls (Server-Sent
// Events from GET /runs/{id}/events), its journal rendered, the note box,
// finalize and resume, and its files with previews, downloads and share
// links.
import {
  $, ApiError, CAN_WRITE, errorOf, RUN, WHO, api, badge, blobURL, copyButton, el, fileURL, fmtByteSeconds, fmtBytes, fmtCPU, fmtDur, fmtTime, isRecord, time, toast,
} from './lib.js';
import { code, nbOutput } from './cells.js';

const timeline = $('#timeline');
const steps = new Map(); // step number -> li
let view = null; // wire.RunView
let recipeState = null;
let files = [];

// ---- header -------------------------------------------------------------

function chips() {
  const v = view;
  if (!v) return;
  const st = recipeState?.status || v.status;
  const passed = [...steps.values()].filter((li) => li.classList.contains('v-pass')).length;
  const ungraded = [...steps.values()].filter((li) => li.classList.contains('v-ungraded')).length;
  const failed = steps.size - passed - ungraded;
  const start = v.created ? new Date(v.created).getTime() : null;
  const last = [...steps.values()].pop();
  let end = v.finished ? new Date(v.finished).getTime() : last ? Number(last.dataset.end) : start;
  if (st === 'running' || st === 'queued') end = Date.now();
  $('#run-chips').replaceChildren(...[
    badge(st),
    el('span', {}, v.recipe ? el('b', { text: v.recipe }) : el('b', { text: 'manual run' })),
    el('span', {}, el('b', { text: String(steps.size) }), steps.size === 1 ? ' step' : ' steps'),
    el('span', { class: 'counts' }, el('span', { class: 'p', text: `✓ ${passed} PASS` }), ' ', el('span', { class: 'f', text: `✗ ${failed} FAIL` }),
      ungraded ? el('span', { class: 'u', text: ` … ${ungraded} UNGRADED` }) : null),
    v.created ? el('span', {}, 'created ', time(v.created)) : null,
    start ? el('span', {}, 'took ', el('b', { text: fmtDur(end - start) })) : null,
    v.started_by ? el('span', {}, 'by ', el('b', { text: v.started_by.name || v.started_by.key_id || 'operator' })) : null,
  ].filter(Boolean));
  const title = v.name || v.objective || (v.recipe ? `${v.recipe} run` : 'Manual run');
  $('#run-title').textContent = title;
  document.title = `${title} · Triad`;
  $('#run-tags').replaceChildren(...(v.tags || []).map((t) => el('a', { class: 'tag', href: `/?q=${encodeURIComponent(`tag:${t}`)}`, text: t, title: `Runs tagged ${t}` })));
  $('#run-tags').hidden = !(v.tags || []).length;
  $('#scratch-link').hidden = Boolean(v.recipe);
  const resume = $('#resume-btn');
  if (resume) resume.hidden = !(v.recipe && st === 'failed');
  const err = recipeState?.error || v.error;
  $('#run-error').hidden = !(err && st === 'failed');
  $('#run-error').textContent = err ? `The run failed: ${err}` : '';
}

async function loadView() {
  try {
    view = await api('GET', `/runs/${RUN}`);
    if (view.recipe_steps?.length && !recipeState) {
      recipeState = { status: view.status, steps: view.recipe_steps, error: view.error };
      recipeSteps();
    }
    chips();
    usage(view.usage);
  } catch (e) {
    toast(e.text || String(e));
  }
}

// ---- usage --------------------------------------------------------------

// usage shows what the run used (wire.RunUsage). A figure the sandbox
// backend does not measure is absent from the answer, and says so here:
// it is unknown, not zero.
function usage(u) {
  if (!u) return;
  const unknown = (what) => el('span', { class: 'muted', text: 'not measured', title: `This server's sandbox backend does not measure ${what}` });
  const row = (label, value) => [el('dt', { text: label }), el('dd', {}, value)];
  const egress = u.egress_bytes_out == null ? unknown('egress before a kernel ran')
    : `${fmtBytes(u.egress_bytes_out)} out · ${fmtBytes(u.egress_bytes_in ?? 0)} in`;
  $('#usage').replaceChildren(
    ...row('CPU', u.cpu_seconds == null ? unknown('CPU time') : fmtCPU(u.cpu_seconds)),
    ...row('Peak memory', u.memory_peak_bytes == null ? unknown('memory') : fmtBytes(u.memory_peak_bytes)),
    ...row('Memory over time', u.memory_byte_seconds == null ? unknown('memory') : fmtByteSeconds(u.memory_byte_seconds)),
    ...row('Stored', fmtBytes(u.stored_bytes)),
    ...row('Egress', egress),
  );
}

// refreshUsage re-reads the run's usage after a call (its kernel is read
// as the call is recorded), leaving the rest of the view as it was. It
// asks the runs list for this run's summary, whose size does not grow
// with the run (GET /runs/{id} lists every step).
async function refreshUsage() {
  try {
    const list = await api('GET', `/runs?q=${encodeURIComponent(RUN)}&limit=5`);
    const s = list.runs.find((r) => r.run_id === RUN);
    if (s?.usage) usage(s.usage);
  } catch {
    /* the next call tries again */
  }
}

// ---- recipe steps -------------------------------------------------------

function recipeSteps() {
  const ol = $('#recipe-steps');
  const list = recipeState?.steps || [];
  ol.hidden = list.length === 0;
  ol.replaceChildren(...list.map((s) => el('li', { dataset: { id: s.id } },
    badge(s.status), el('span', { class: 'rs-title', title: `${s.title} (${s.id})`, text: `${s.n}. ${s.title || s.id}` }),
    el('span', { class: 'muted small', text: s.evaluation || '' }))));
}

// ---- timeline -----------------------------------------------------------

function shortValue(v) {
  let s = typeof v === 'string' ? v : JSON.stringify(v);
  if (s.length > 90) s = s.slice(0, 87) + '…';
  return s;
}

function addCall(c, live) {
  if (steps.has(c.step)) return;
  // UNGRADED: the evaluator could not answer yet; the step is graded
  // again and a "verdict" event replaces it. Never shown as a FAIL.
  const verdict = c.verdict === 'PASS' ? 'pass' : c.verdict === 'UNGRADED' ? 'ungraded' : 'fail';
  const inputs = Object.entries(c.inputs || {}).map(([k, v]) => `${k}=${shortValue(v)}`).join(' · ');
  const outs = c.outputs || [];
  // A cell in a new interpreter after earlier cells: they left no
  // variables behind (a restart, a crash, a server restart, a kernel
  // stopped while idle).
  const replaced = c.fresh_kernel && [...steps.entries()].some(([n, x]) => n < c.step && x.dataset.tool === 'sandbox.exec');
  const li = el('li', { id: `step-${c.step}`, class: `v-${verdict}${live ? ' new' : ''}`, dataset: { step: c.step, tool: c.tool, end: new Date(c.started).getTime() + c.duration_ms } },
    replaced ? el('div', { class: 'kernel-new', role: 'note', text: 'New kernel: variables from earlier cells are gone; the files stay' }) : null,
    el('div', { class: 'step-line' },
      el('span', { class: 'step-n', text: `#${c.step}` }),
      el('span', { class: 'step-tool', text: c.tool }),
      el('span', { class: `badge badge-${verdict}`, title: `evaluator score ${c.score.toFixed(2)}`, text: `${c.verdict} ${c.score.toFixed(2)}` }),
      c.label ? el('span', { class: 'step-label', text: c.label }) : null,
      el('span', { class: 'step-dur', title: fmtTime(c.started), text: fmtDur(c.duration_ms) })),
    inputs ? el('div', { class: 'step-inputs', text: inputs }) : null,
    c.error ? el('div', { class: 'step-error', text: c.error }) : null,
    c.critique ? el('div', { class: 'step-critique' }, el('span', { class: 'muted', text: 'Evaluator: ' }), c.critique) : null,
    outs.length ? el('div', { class: 'step-outputs', text: '→ ' + outs.slice(0, 4).map((o) => o.path).join(', ') + (outs.length > 4 ? ` and ${outs.length - 4} more` : '') }) : null,
  );
  // Calls arrive in order, but keep the list sorted whatever happens.
  const after = [...steps.keys()].filter((n) => n < c.step).sort((a, b) => b - a)[0];
  if (after !== undefined) steps.get(after).after(li);
  else timeline.prepend(li);
  steps.set(c.step, li);
  $('#timeline-empty').hidden = true;
}

// ---- live events --------------------------------------------------------

let es = null;
function setLive(on, text) {
  $('#live').classList.toggle('on', on);
  $('#live-text').textContent = text;
}

function connect() {
  es?.close();
  es = new EventSource(`/runs/${RUN}/events`);
  es.onopen = () => setLive(true, 'Live');
  es.onerror = () => {
    if (es.readyState === EventSource.CLOSED) setLive(false, 'Disconnected');
    else setLive(false, 'Reconnecting…');
  };
  es.addEventListener('state', (e) => {
    recipeState = JSON.parse(e.data);
    recipeSteps();
    chips();
  });
  es.addEventListener('call', (e) => {
    const c = JSON.parse(e.data);
    // Calls the page already knew of are not news.
    const news = !view || c.step > view.steps.length;
    addCall(c, news);
    chips();
    if (news) {
      addOutputs(c);
      soon(refreshCEL);
      soon(refreshUsage, 600);
    }
  });
  es.addEventListener('journal', () => soon(refreshCEL));
  // The late verdict of a call that was UNGRADED: the call again.
  es.addEventListener('verdict', (e) => {
    const c = JSON.parse(e.data);
    const old = steps.get(c.step);
    if (old) {
      steps.delete(c.step);
      old.remove();
    }
    addCall(c, false);
    chips();
    soon(refreshCEL);
  });
  es.addEventListener('step', (e) => {
    const ev = JSON.parse(e.data);
    const s = recipeState?.steps?.find((x) => x.id === ev.id || x.n === ev.step);
    if (s) {
      s.status = ev.status;
      recipeSteps();
    }
  });
  es.addEventListener('run', (e) => {
    const ev = JSON.parse(e.data);
    if (recipeState) recipeState.status = ev.status;
    chips();
  });
  es.addEventListener('end', async (e) => {
    recipeState = JSON.parse(e.data);
    es.close();
    setLive(false, `Run ${recipeState.status}`);
    recipeSteps();
    await Promise.all([loadView(), refreshFiles(), refreshCEL()]);
  });
}

const timers = new Map();
function soon(fn, ms = 350) {
  clearTimeout(timers.get(fn));
  timers.set(fn, setTimeout(fn, ms));
}

// ---- journal ------------------------------------------------------------

// journalSize is how many bytes of CEL.md the page shows: a refresh asks
// for what was appended after them (?from=), and the server answers the
// rendered tail with the offsets it covers (X-Journal-From, X-Journal-Size),
// so an update costs the new sections, not the journal. An answer that
// starts anywhere else (From 0: the server sent the whole journal) replaces
// what is shown. See docs/DECISIONS.md, "Live journal updates from an
// offset".
let journalSize = 0;
let celBusy = null;
function refreshCEL() {
  // One refresh at a time: two at once would append the same tail twice.
  celBusy = (celBusy || Promise.resolve()).then(celOnce, celOnce);
  return celBusy;
}

async function celOnce() {
  const box = $('#cel');
  const atEnd = box.scrollTop + box.clientHeight >= box.scrollHeight - 20;
  const from = journalSize;
  const resp = await fetch(`/console/runs/${RUN}/cel${from ? `?from=${from}` : ''}`, { credentials: 'same-origin' });
  if (resp.status === 400 && from) {
    journalSize = 0; // not an offset the server knows: start again
    return celOnce();
  }
  if (!resp.ok) return;
  const got = resp.headers.get('X-Journal-Size');
  if (got === null) { // 204 with no size: no journal yet
    journalSize = 0;
    box.replaceChildren(el('p', { class: 'muted', text: 'The journal starts with the run\'s first call.' }));
    return;
  }
  const start = Number(resp.headers.get('X-Journal-From'));
  // Server-rendered Markdown: goldmark's safe renderer (no raw HTML, no
  // dangerous URLs) over a journal that escapes caller text.
  const html = resp.status === 204 ? '' : await resp.text();
  if (start === 0) {
    box.innerHTML = html;
    outward(box);
  } else if (start === from) {
    const t = document.createElement('template');
    t.innerHTML = html;
    uniqueIds(t.content);
    outward(t.content);
    box.append(t.content);
  } else {
    return; // an answer to an older question
  }
  journalSize = Number(got);
  if (atEnd && html) box.scrollTop = box.scrollHeight;
}

// uniqueIds gives a heading of an appended tail the id goldmark gives it
// in the whole journal: its slug, then -1, -2... when the page has it
// already (a second "Summary").
function uniqueIds(root) {
  for (const h of root.querySelectorAll('[id]')) {
    const base = h.id;
    for (let i = 1; document.getElementById(h.id); i++) h.id = `${base}-${i}`;
  }
}

// outward opens links to other sites (a search's sources) in a new tab,
// so reading them does not leave the run.
function outward(root) {
  for (const a of root.querySelectorAll('a[href]')) {
    if (new URL(a.href, location.href).origin !== location.origin) {
      a.target = '_blank';
      a.rel = 'noopener noreferrer';
    }
  }
}

// Links in the journal (and in a Markdown preview) to the run's files
// open the file's preview here instead of leaving the console.
document.addEventListener('click', (e) => {
  const a = e.target.closest('#cel a[href], #preview-body .markdown a[href]');
  if (!a || e.defaultPrevented || e.button !== 0 || e.ctrlKey || e.metaKey || e.shiftKey || e.altKey) return;
  const u = new URL(a.href, location.href);
  const prefix = `/runs/${encodeURIComponent(RUN)}/files/`;
  if (u.origin !== location.origin || !u.pathname.startsWith(prefix)) return;
  e.preventDefault();
  const p = u.pathname.slice(prefix.length).split('/').map(decodeURIComponent).join('/');
  const f = files.find((x) => x.path === p);
  if (f) preview(f);
  else toast(`${p} is not in the run any more`);
});

$('#note-form')?.addEventListener('submit', async (e) => {
  e.preventDefault();
  const ta = $('#note');
  const text = ta.value.trim();
  if (!text) return;
  const btn = e.submitter || $('#note-form button');
  btn.disabled = true;
  try {
    await api('POST', '/cel/note', { run: RUN, json: { text, author: WHO } });
    ta.value = '';
    toast('Note added: the next step will see it');
    await refreshCEL();
  } catch (err) {
    toast(err.text || String(err));
  } finally {
    btn.disabled = false;
  }
});
$('#note')?.addEventListener('keydown', (e) => {
  if (e.key === 'Enter' && (e.ctrlKey || e.metaKey)) {
    e.preventDefault();
    $('#note-form').requestSubmit();
  }
});

$('#finalize-btn')?.addEventListener('click', async (e) => {
  e.target.disabled = true;
  try {
    await api('POST', '/cel/finalize', { run: RUN });
    toast('Journal finalized: its summary is at the end');
    await refreshCEL();
    $('#cel').scrollTop = $('#cel').scrollHeight;
  } catch (err) {
    toast(err.text || String(err));
  } finally {
    e.target.disabled = false;
  }
});

// ---- delete -------------------------------------------------------------

$('#delete-btn')?.addEventListener('click', () => {
  const d = $('#delete-dialog');
  d.returnValue = '';
  d.showModal();
  d.addEventListener('close', async () => {
    if (d.returnValue !== 'delete') return;
    try {
      await api('DELETE', `/runs/${encodeURIComponent(RUN)}`);
      location.href = '/?deleted=' + encodeURIComponent(RUN);
    } catch (err) {
      toast(err.text || String(err));
    }
  }, { once: true });
});

// ---- name and tags ------------------------------------------------------

const labels = $('#labels-form');
$('#labels-btn')?.addEventListener('click', () => {
  labels.hidden = !labels.hidden;
  if (!labels.hidden) {
    $('#run-name').value = view?.name || '';
    $('#run-tags-in').value = (view?.tags || []).join(' ');
    $('#run-name').focus();
  }
});
$('#labels-cancel')?.addEventListener('click', () => {
  labels.hidden = true;
  $('#labels-btn').focus();
});
labels?.addEventListener('submit', async (e) => {
  e.preventDefault();
  const btn = e.submitter || labels.querySelector('button[type=submit]');
  btn.disabled = true;
  try {
    const tags = $('#run-tags-in').value.split(/[\s,]+/).filter(Boolean);
    const s = await api('PATCH', `/runs/${RUN}`, { json: { name: $('#run-name').value, tags } });
    view = { ...view, name: s.name || '', tags: s.tags || [] };
    chips();
    labels.hidden = true;
    toast('Saved: the runs list finds it by these');
  } catch (err) {
    toast(err.text || String(err));
  } finally {
    btn.disabled = false;
  }
});

$('#resume-btn')?.addEventListener('click', async (e) => {
  e.target.disabled = true;
  try {
    await api('POST', '/run', { json: { run_id: RUN } });
    toast('Resumed: finished steps are skipped');
    recipeState = null;
    await loadView();
    connect();
  } catch (err) {
    toast(err.text || String(err));
  } finally {
    e.target.disabled = false;
  }
});

// ---- files --------------------------------------------------------------

const PREVIEW = {
  png: 'image', jpg: 'image', jpeg: 'image', gif: 'image', webp: 'image', svg: 'image',
  csv: 'csv', tsv: 'csv', md: 'markdown', markdown: 'markdown', html: 'html', htm: 'html', pdf: 'pdf',
  json: 'json', ipynb: 'notebook', jsonl: 'text', txt: 'text', log: 'text', py: 'text', r: 'text', sql: 'text', yaml: 'text', yml: 'text',
};
const kindOf = (p) => PREVIEW[(p.split('.').pop() || '').toLowerCase()];


// filesSeen is the file list last drawn: a refresh that finds the same
// list leaves the tree alone, so an open share box, a folder or the focus
// is not lost to a redraw.
let filesSeen = '';
// recordsStale says a call changed Triad's records (CEL.md, trace.jsonl...)
// since the list was read: a live call brings only the files it made
// (addOutputs), so the records are read again when their folder opens.
let recordsStale = false;
async function refreshFiles() {
  let got;
  try {
    got = (await api('GET', `/runs/${RUN}/files`)).files;
  } catch (e) {
    if (!(e instanceof ApiError)) toast(String(e));
    return;
  }
  recordsStale = false;
  files = got;
  drawFiles();
}

// addOutputs puts the files a live call made into the list, from its call
// event, without reading the run's whole list again: an update costs the
// call, not the run (see refreshCEL).
function addOutputs(c) {
  if (!(c.outputs || []).length) return;
  recordsStale = true;
  const byPath = new Map(files.map((f) => [f.path, f]));
  for (const o of c.outputs) byPath.set(o.path, { ...byPath.get(o.path), ...o, step: c.step, tool: c.tool });
  files = [...byPath.values()].sort((a, b) => (a.path < b.path ? -1 : a.path > b.path ? 1 : 0));
  soon(drawFiles);
}

function drawFiles() {
  const seen = JSON.stringify(files);
  if (seen === filesSeen) return;
  filesSeen = seen;
  $('#dl-ipynb').hidden = !files.some((f) => f.path === 'run.ipynb');
  const deliverables = files.filter((f) => f.path.startsWith('artifacts/') && f.path !== 'artifacts/index.json');
  $('#art-count').textContent = `${deliverables.length} deliverable${deliverables.length === 1 ? '' : 's'} · ${files.length} files`;
  const tree = {};
  const records = [];
  for (const f of files) {
    if (isRecord(f.path)) {
      if (!/^CEL\.step_\d+\.md$/.test(f.path)) records.push(f);
      continue;
    }
    const parts = f.path.split('/');
    let node = tree;
    for (const d of parts.slice(0, -1)) node = (node[d + '/'] ||= {});
    node[parts.at(-1)] = f;
  }
  const render = (node, prefix) => {
    const names = Object.keys(node).sort((a, b) => (b.endsWith('/') - a.endsWith('/')) || a.localeCompare(b));
    return el('ul', {}, names.map((n) => {
      if (n.endsWith('/')) {
        const dir = prefix + n;
        const d = folder(dir.slice(0, -1), n, render(node[n], dir));
        return el('li', {}, d);
      }
      return fileRow(node[n], n);
    }));
  };
  const top = Object.keys(tree).sort((a, b) => (a === 'artifacts/' ? -1 : b === 'artifacts/' ? 1 : a.localeCompare(b)));
  const ordered = Object.fromEntries(top.map((k) => [k, tree[k]]));
  const prefixes = [...shares.entries()].filter(([k]) => k.endsWith('/')).map(([, box]) => box);
  $('#tree').replaceChildren(...[
    prefixes.length ? el('div', { class: 'shared-prefixes' }, el('h3', { class: 'small', text: 'Shared folders' }), prefixes) : null,
    files.length ? render(ordered, '') : el('p', { class: 'muted', text: 'No files yet.' }),
    records.length ? folder('(records)', 'Triad\'s records', el('ul', {}, records.map((f) => fileRow(f, f.path)))) : null,
  ].filter(Boolean));
}

// Folders stay as the person left them across refreshes; the
// deliverables start open.
const openDirs = new Set(['artifacts', 'artifacts/charts']);
function folder(dir, label, list) {
  const d = el('details', { dataset: { dir }, open: openDirs.has(dir) }, el('summary', { text: label }), list);
  d.addEventListener('toggle', () => {
    if (d.open) openDirs.add(dir);
    else openDirs.delete(dir);
    if (d.open && dir === '(records)' && recordsStale) refreshFiles();
  });
  return d;
}

function fileRow(f, name) {
  const kind = kindOf(f.path);
  const base = f.path.split('/').pop();
  const sha = String(f.sha256);
  const nameEl = kind
    ? el('button', { type: 'button', class: 'file-name', text: name, title: `Preview ${f.path}`, onclick: () => preview(f) })
    : el('span', { class: 'file-name plain', text: name });
  const li = el('li', { class: 'file', dataset: { path: f.path } },
    el('div', { class: 'file-top' }, nameEl, el('span', { class: 'file-size', text: fmtBytes(f.size) })),
    el('div', { class: 'file-meta' },
      el('span', {}, el('span', { class: 'sha', title: `sha256 ${sha}`, text: sha.slice(0, 12) }), ' ', copyButton(sha, 'Copy sha256')),
      f.step ? el('a', { href: `#step-${f.step}`, text: `step ${f.step}`, title: `produced by step ${f.step} (${f.tool})` }) : el('span', { text: 'Triad' }),
      el('a', { class: 'dl', href: blobURL(RUN, sha, base), download: base, text: 'download' }),
      CAN_WRITE ? el('button', { type: 'button', class: 'linkbtn share', text: 'share', onclick: (e) => share(f, li, e.target) }) : null,
    ),
  );
  const box = shares.get(f.path);
  if (box) li.append(box); // a link made before this refresh stays shown
  return li;
}

const shares = new Map(); // path -> its share box

async function share(f, li, btn) {
  btn.disabled = true;
  try {
    const s = await api('POST', `/runs/${RUN}/share`, { json: { path: f.path, ttl: '24h' } });
    li.querySelector('.share-box')?.remove();
    const box = shareBox(s);
    shares.set(f.path, box);
    li.append(box);
    box.querySelector('input').select();
  } catch (e) {
    toast(e.text || String(e));
  } finally {
    btn.disabled = false;
  }
}

// shareBox shows a live link: its URL to copy, its expiry, and revoke.
function shareBox(s) {
  const key = s.path || s.prefix;
  const input = el('input', { type: 'text', readonly: true, value: s.url, 'aria-label': `Share link for ${key}` });
  const box = el('div', { class: 'share-box', dataset: { share: s.id } },
    s.prefix ? el('span', { class: 'small' }, 'Every file under ', el('code', { text: s.prefix })) : null,
    input,
    el('div', { class: 'actions' },
      copyButton(s.url, 'Copy link'),
      el('span', { class: 'muted expires' }, 'expires ', el('time', { datetime: s.expires, title: fmtTime(s.expires), text: fmtTime(s.expires) })),
      el('button', {
        type: 'button', class: 'linkbtn btn-danger revoke', text: 'revoke', 'aria-label': `Revoke the share link for ${key}`,
        onclick: async (e) => {
          e.target.disabled = true;
          try {
            await api('DELETE', `/shares/${s.id}`);
            box.replaceChildren(el('span', { class: 'muted revoked', text: 'Link revoked: it no longer works.' }));
            setTimeout(() => { box.remove(); shares.delete(key); }, 8000);
          } catch (err) {
            toast(err.text || String(err));
            e.target.disabled = false;
          }
        },
      })));
  return box;
}

// loadShares shows the run's live links, made in this page or before it
// was loaded: path links under their file, prefix links above the tree.
async function loadShares() {
  if (!CAN_WRITE) return;
  let list;
  try {
    list = (await api('GET', `/runs/${RUN}/shares`)).shares;
  } catch {
    return; // share links off: nothing to show
  }
  for (const s of list.reverse()) { // oldest first: the newest wins a path
    const key = s.path || s.prefix;
    shares.get(key)?.remove();
    shares.set(key, shareBox(s));
  }
  filesSeen = ''; // redraw the tree with the boxes
  await refreshFiles();
}

// ---- previews -----------------------------------------------------------

const dialog = $('#preview');
const MAX_TEXT = 2 << 20;

async function preview(f) {
  const body = $('#preview-body');
  $('#preview-title').textContent = f.path;
  $('#preview-dl').href = fileURL(RUN, f.path, true);
  body.replaceChildren(el('p', { class: 'muted', text: 'Loading…' }));
  if (!dialog.open) dialog.showModal();
  const url = fileURL(RUN, f.path);
  try {
    switch (kindOf(f.path)) {
      case 'image':
        // An SVG shown as an image runs no script.
        body.replaceChildren(el('img', { src: url, alt: f.path, class: 'preview-img' }));
        break;
      case 'html':
        // Sandboxed twice: the attribute (no allow-scripts, no
        // allow-same-origin) and the file's own CSP sandbox.
        body.replaceChildren(el('iframe', { src: url, sandbox: '', title: `Preview of ${f.path}`, referrerpolicy: 'no-referrer' }));
        break;
      case 'pdf':
        body.replaceChildren(el('iframe', { src: url, title: `Preview of ${f.path}` }));
        break;
      case 'markdown': {
        const resp = await fetch(`/console/runs/${RUN}/render/${f.path.split('/').map(encodeURIComponent).join('/')}`, { credentials: 'same-origin' });
        if (!resp.ok) throw await errorOf(resp);
        const art = el('article', { class: 'markdown' });
        art.innerHTML = await resp.text(); // server-rendered, safe (see refreshCEL)
        outward(art);
        body.replaceChildren(art);
        break;
      }
      case 'csv': {
        const t = await text(url, f);
        body.replaceChildren(csvTable(t.text, f.path.endsWith('.tsv') ? '\t' : ',', t.partial ? f.size : 0));
        break;
      }
      case 'notebook':
        body.replaceChildren(await notebook(f));
        break;
      case 'json': {
        const t = await text(url, f);
        let pretty = t.text;
        if (!t.partial) {
          try {
            pretty = JSON.stringify(JSON.parse(t.text), null, 2);
          } catch {
            /* not JSON after all: show it as it is */
          }
        }
        body.replaceChildren(el('div', {}, partialNote(t, f), el('pre', { class: 'json', text: pretty })));
        break;
      }
      case 'text': {
        const t = await text(url, f);
        body.replaceChildren(el('div', {}, partialNote(t, f), el('pre', { text: t.text })));
        break;
      }
      default:
        body.replaceChildren(el('p', { class: 'muted', text: `There is no preview for this kind of file (${fmtBytes(f.size)}). Download it to open it.` }));
    }
  } catch (e) {
    body.replaceChildren(el('p', { class: 'alert', text: `No preview: ${e.text || e.message || e}` }));
  }
}

// text reads a file to preview: whole up to MAX_TEXT, else its first
// HEAD_BYTES by a range read, cut at the last whole line.
const HEAD_BYTES = 256 << 10;
async function text(url, f) {
  const partial = f.size > MAX_TEXT;
  const resp = await fetch(url, { credentials: 'same-origin', headers: partial ? { Range: `bytes=0-${HEAD_BYTES - 1}` } : {} });
  if (!resp.ok) throw new Error(`${resp.status} ${resp.statusText}`);
  if (!partial) return { text: await resp.text(), partial: false };
  let b = new Uint8Array(await resp.arrayBuffer());
  const cut = b.lastIndexOf(10); // the last newline: no half line, no half character
  if (cut > 0) b = b.subarray(0, cut + 1);
  return { text: new TextDecoder().decode(b), partial: true, bytes: b.length };
}

// notebook renders a .ipynb file as a notebook: Markdown cells rendered
// by the server, code cells highlighted, with their outputs.
async function notebook(f) {
  const resp = await fetch(`/console/runs/${RUN}/notebook/${f.path.split('/').map(encodeURIComponent).join('/')}`, { credentials: 'same-origin' });
  if (!resp.ok) throw await errorOf(resp);
  const nb = await resp.json();
  const root = el('div', { class: 'notebook' });
  let n = 0;
  for (const c of nb.cells) {
    if (c.type === 'markdown') {
      const art = el('article', { class: 'markdown nb-md' });
      art.innerHTML = c.html; // server-rendered, safe (see refreshCEL)
      root.append(art);
      continue;
    }
    n++;
    const count = c.type === 'code' ? `[${c.execution_count ?? ' '}]` : '';
    const out = el('div', { class: 'cell-out' });
    for (const o of c.outputs || []) nbOutput(RUN, out, o);
    root.append(el('div', { class: 'nb-cell' },
      el('div', { class: 'nb-in' }, el('span', { class: 'cell-count', 'aria-hidden': 'true', text: count }),
        c.type === 'code' ? code(c.source, `Cell ${n}`) : el('pre', { class: 'raw', text: c.source })),
      out));
  }
  if (!nb.cells.length) root.append(el('p', { class: 'muted', text: 'The notebook has no cells.' }));
  return root;
}

function partialNote(t, f) {
  return t.partial ? el('p', { class: 'muted small', text: `The first ${fmtBytes(t.bytes)} of ${fmtBytes(f.size)}; download the file for the rest.` }) : null;
}

// parseCSV parses RFC 4180 CSV: quoted fields, doubled quotes, CRLF.
function parseCSV(s, sep, maxRows) {
  const rows = [];
  let row = [];
  let field = '';
  let q = false;
  for (let i = 0; i < s.length; i++) {
    const c = s[i];
    if (q) {
      if (c === '"') {
        if (s[i + 1] === '"') {
          field += '"';
          i++;
        } else q = false;
      } else field += c;
    } else if (c === '"') q = true;
    else if (c === sep) {
      row.push(field);
      field = '';
    } else if (c === '\n' || c === '\r') {
      if (c === '\r' && s[i + 1] === '\n') i++;
      row.push(field);
      rows.push(row);
      row = [];
      field = '';
      if (rows.length > maxRows) return rows;
    } else field += c;
  }
  if (field || row.length) {
    row.push(field);
    rows.push(row);
  }
  return rows;
}

// csvTable shows the first 200 rows, sortable by any column; of is the
// file's size when s is only its beginning.
function csvTable(s, sep, of = 0) {
  const all = parseCSV(s, sep, 201);
  const head = all[0] || [];
  const data = all.slice(1, 201);
  const numeric = head.map((_, i) => data.every((r) => r[i] === undefined || r[i] === '' || !Number.isNaN(Number(r[i]))));
  const tbody = el('tbody');
  const fill = (rows) => tbody.replaceChildren(...rows.map((r) => el('tr', {}, head.map((_, i) => el('td', { text: r[i] ?? '' })))));
  const ths = head.map((h, i) => el('th', { scope: 'col', 'aria-sort': 'none' }, el('button', {
    type: 'button', text: h, title: `Sort by ${h}`,
    onclick: () => {
      const dir = ths[i].getAttribute('aria-sort') === 'ascending' ? -1 : 1;
      ths.forEach((t) => t.setAttribute('aria-sort', 'none'));
      ths[i].setAttribute('aria-sort', dir === 1 ? 'ascending' : 'descending');
      const cmp = numeric[i] ? (a, b) => Number(a[i]) - Number(b[i]) : (a, b) => String(a[i] ?? '').localeCompare(String(b[i] ?? ''));
      fill([...data].sort((a, b) => dir * cmp(a, b)));
    },
  })));
  fill(data);
  const note = all.length > 201 || of
    ? el('p', { class: 'muted small csv-note', text: `The first ${data.length} rows${of ? ` of a ${fmtBytes(of)} file` : ''}; download the file for the rest.` })
    : null;
  return el('div', {}, el('table', { class: 'grid csv' }, el('thead', {}, el('tr', {}, ths)), tbody), note);
}

dialog.addEventListener('close', () => $('#preview-body').replaceChildren());

// ---- start --------------------------------------------------------------

await loadView();
connect();
refreshFiles().then(loadShares);
refreshCEL();
setInterval(chips, 5000);
if (!CAN_WRITE) document.querySelectorAll('.share').forEach((b) => b.remove());
