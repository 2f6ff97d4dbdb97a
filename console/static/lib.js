// Shared helpers of the console's pages: calling the API, building DOM
// (text only: run content never goes through innerHTML), formatting,
// keyboard shortcuts. Plain ES module; no build step.

export const RUN = document.body.dataset.run || '';
export const CAN_WRITE = document.body.dataset.canWrite === 'true';
export const WHO = document.body.dataset.who || '';
const CSRF = document.querySelector('meta[name="csrf-token"]')?.content || '';
// NONCE is this page's CSP nonce: the editor's one <style> element carries
// it (the page's policy allows no other inline style).
export const NONCE = document.querySelector('meta[name="csp-nonce"]')?.content || '';

// ApiError is the API's error body: {error: {kind, message, suggestion}}.
export class ApiError extends Error {
  constructor(status, kind, message, suggestion) {
    super(message);
    this.status = status;
    this.kind = kind;
    this.suggestion = suggestion;
  }
  get text() {
    return this.suggestion ? `${this.message}. ${this.suggestion}` : this.message;
  }
}

// headers for an API call: the session's CSRF token on every
// state-changing request, and the run.
export function apiHeaders(method, run, extra = {}) {
  const h = { ...extra };
  if (CSRF && method !== 'GET' && method !== 'HEAD') h['X-CSRF-Token'] = CSRF;
  if (run) h['X-Run-Id'] = run;
  return h;
}

// api calls the JSON API as the signed-in session and returns the parsed
// answer; it throws ApiError with the server's message and suggestion.
export async function api(method, path, { json, body, run, headers, raw, signal } = {}) {
  const h = apiHeaders(method, run, headers);
  let b = body;
  if (json !== undefined) {
    h['Content-Type'] = 'application/json';
    b = JSON.stringify(json);
  }
  const resp = await fetch(path, { method, headers: h, body: b, credentials: 'same-origin', signal });
  if (!resp.ok) throw await errorOf(resp);
  if (raw) return resp;
  const ct = resp.headers.get('Content-Type') || '';
  return ct.includes('json') ? resp.json() : resp.text();
}

// errorOf reads a failed answer's error; a 401 means the session ended,
// and the page goes to the sign-in form.
export async function errorOf(resp) {
  let e = {};
  try {
    e = (await resp.json()).error || {};
  } catch {
    /* not JSON */
  }
  if (resp.status === 401) signInAgain();
  return new ApiError(resp.status, e.kind || 'error', e.message || `${resp.status} ${resp.statusText}`, e.suggestion || '');
}

let leaving = false;
export function signInAgain() {
  if (leaving) return;
  leaving = true;
  location.href = '/console/signin?next=' + encodeURIComponent(location.pathname + location.search);
}

// el builds an element. attrs: class, text, dataset, on<event>, and any
// attribute; children: nodes, strings (as text), arrays, null.
export function el(tag, attrs = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === 'class') e.className = v;
    else if (k === 'text') e.textContent = v;
    else if (k === 'dataset') Object.assign(e.dataset, v);
    else if (k.startsWith('on') && typeof v === 'function') e.addEventListener(k.slice(2), v);
    else if (v === true) e.setAttribute(k, '');
    else e.setAttribute(k, String(v));
  }
  append(e, children);
  return e;
}

function append(e, children) {
  for (const c of children) {
    if (c === null || c === undefined || c === false) continue;
    if (Array.isArray(c)) append(e, c);
    else e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
}

export const $ = (sel, root = document) => root.querySelector(sel);

// The run's pages in the console.
export const runPage = (id) => `/console/runs/${encodeURIComponent(id)}`;
export const scratchPage = (id) => `${runPage(id)}/scratch`;

// fileURL is a run file's URL for previews and downloads (not journaled).
export function fileURL(run, path, download) {
  const p = path.split('/').map(encodeURIComponent).join('/');
  return `/runs/${encodeURIComponent(run)}/files/${p}${download ? '?download=1' : ''}`;
}

// blobURL downloads a run file by its sha256.
export function blobURL(run, sha, name) {
  return `/blobs/${sha}?run=${encodeURIComponent(run)}&name=${encodeURIComponent(name)}`;
}

// isRecord reports whether a run path is one of Triad's own records (the
// journal, trace, evaluations, run state, notebook and setup, searches'
// citations, spooled cell output) rather than a file the work produced.
const RECORDS = new Set(['CEL.md', 'trace.jsonl', 'evaluations.jsonl', 'run.json', 'run.ipynb', 'run.setup.json']);
export const isRecord = (p) => RECORDS.has(p) || /^CEL\.step_\d+\.md$/.test(p) || p.startsWith('citations/') || p.startsWith('outputs/');

export function fmtBytes(n) {
  if (n < 1024) return `${n} B`;
  const u = ['KiB', 'MiB', 'GiB', 'TiB'];
  let i = -1;
  do {
    n /= 1024;
    i++;
  } while (n >= 1024 && i < u.length - 1);
  return `${n < 10 ? n.toFixed(1) : Math.round(n)} ${u[i]}`;
}

// fmtCPU shows CPU seconds: hundredths under a minute.
export function fmtCPU(s) {
  if (s == null || Number.isNaN(s)) return '—';
  return s < 60 ? `${s.toFixed(2)} s` : fmtDur(s * 1000);
}

// fmtByteSeconds shows memory held over time: byte-seconds, or GiB-hours
// once there are many.
export function fmtByteSeconds(bs) {
  if (bs == null || Number.isNaN(bs)) return '—';
  const gibHour = 3600 * 2 ** 30;
  return bs >= gibHour ? `${(bs / gibHour).toFixed(2)} GiB·h` : `${fmtBytes(bs)}·s`;
}

export function fmtDur(ms) {
  if (ms == null || ms < 0 || Number.isNaN(ms)) return '—';
  if (ms < 1000) return `${Math.round(ms)} ms`;
  const s = ms / 1000;
  if (s < 60) return `${s < 10 ? s.toFixed(1) : Math.round(s)} s`;
  const m = Math.floor(s / 60);
  if (m < 60) return `${m} min ${Math.round(s % 60)} s`;
  return `${Math.floor(m / 60)} h ${m % 60} min`;
}

const rtf = new Intl.RelativeTimeFormat(undefined, { numeric: 'auto' });
export function fmtAgo(t) {
  const d = (new Date(t).getTime() - Date.now()) / 1000;
  const a = Math.abs(d);
  if (a < 45) return rtf.format(Math.round(d), 'second');
  if (a < 2700) return rtf.format(Math.round(d / 60), 'minute');
  if (a < 79200) return rtf.format(Math.round(d / 3600), 'hour');
  return rtf.format(Math.round(d / 86400), 'day');
}

export function fmtTime(t) {
  return new Date(t).toLocaleString(undefined, { dateStyle: 'medium', timeStyle: 'short' });
}

// time is a <time> element: relative, with the absolute time as its
// title. Relative times are kept current while the page is open.
export function time(t) {
  return el('time', { class: 'rel', datetime: t, title: fmtTime(t), text: fmtAgo(t) });
}
setInterval(() => {
  for (const e of document.querySelectorAll('time.rel')) e.textContent = fmtAgo(e.dateTime);
}, 15000);

// badge shows a status or verdict.
export function badge(text, kind = text) {
  return el('span', { class: `badge badge-${String(kind || '').toLowerCase()}`, text });
}

export function toast(msg, ms = 3500) {
  const t = $('#toast');
  if (!t) return;
  t.textContent = msg;
  t.classList.add('show');
  clearTimeout(toast.timer);
  toast.timer = setTimeout(() => t.classList.remove('show'), ms);
}

// copyButton copies text to the clipboard.
export function copyButton(text, label = 'Copy') {
  return el('button', {
    type: 'button', class: 'linkbtn', 'aria-label': `${label}: ${text}`, text: 'copy',
    onclick: async () => {
      try {
        await navigator.clipboard.writeText(text);
        toast('Copied');
      } catch {
        toast('Copy failed: select the text and copy it by hand');
      }
    },
  });
}

// stripAnsi removes terminal colour codes (tracebacks carry them).
export const stripAnsi = (s) => String(s).replace(/\x1b\[[0-9;?]*[A-Za-z]/g, '');

// sanitize rebuilds HTML a cell displayed (a DataFrame) from an
// allowlist of tags, with no attributes but colspan and rowspan: the
// parsed document is inert (DOMParser runs nothing and loads nothing),
// and only new elements made here reach the page. Anything else is
// dropped or kept as its text.
const KEEP = new Set(['TABLE', 'THEAD', 'TBODY', 'TFOOT', 'TR', 'TH', 'TD', 'CAPTION', 'COLGROUP', 'COL', 'DIV', 'SPAN', 'P',
  'B', 'I', 'EM', 'STRONG', 'CODE', 'PRE', 'BR', 'UL', 'OL', 'LI', 'H1', 'H2', 'H3', 'H4', 'H5', 'H6', 'SMALL', 'SUB', 'SUP', 'HR']);
const DROP = new Set(['SCRIPT', 'STYLE', 'TEMPLATE', 'IFRAME', 'OBJECT', 'EMBED', 'SVG', 'MATH', 'NOSCRIPT', 'LINK', 'META',
  'TITLE', 'HEAD', 'IMG', 'VIDEO', 'AUDIO', 'SOURCE', 'FORM', 'INPUT', 'BUTTON', 'TEXTAREA', 'SELECT']);
export function sanitize(html) {
  const doc = new DOMParser().parseFromString(String(html), 'text/html');
  const out = document.createDocumentFragment();
  const walk = (src, dst) => {
    for (const n of src.childNodes) {
      if (n.nodeType === Node.TEXT_NODE) {
        dst.append(document.createTextNode(n.data));
      } else if (n.nodeType === Node.ELEMENT_NODE) {
        if (DROP.has(n.tagName)) continue;
        if (KEEP.has(n.tagName)) {
          const e = document.createElement(n.tagName.toLowerCase());
          for (const a of ['colspan', 'rowspan']) {
            const v = n.getAttribute(a);
            if (v && /^[0-9]{1,3}$/.test(v)) e.setAttribute(a, v);
          }
          walk(n, e);
          dst.append(e);
        } else {
          walk(n, dst);
        }
      }
    }
  };
  walk(doc.body, out);
  return out;
}

// sse reads Server-Sent Events from a fetch answer.
export async function* sse(resp) {
  const reader = resp.body.getReader();
  const dec = new TextDecoder();
  let buf = '';
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += dec.decode(value, { stream: true });
    let m;
    while ((m = /\r?\n\r?\n/.exec(buf))) {
      const block = buf.slice(0, m.index);
      buf = buf.slice(m.index + m[0].length);
      const ev = { event: 'message', data: '' };
      for (const line of block.split(/\r?\n/)) {
        if (line.startsWith(':')) continue;
        const j = line.indexOf(':');
        const k = j < 0 ? line : line.slice(0, j);
        const v = j < 0 ? '' : line.slice(j + 1).replace(/^ /, '');
        if (k === 'event') ev.event = v;
        else if (k === 'data') ev.data += (ev.data ? '\n' : '') + v;
        else if (k === 'id') ev.id = v;
      }
      if (ev.data) yield ev;
    }
  }
}

// freshRunId mints a run id as POST /runs does (r-<uuid v4>), in the
// browser: a scratch run comes into being with its first cell or upload,
// so one opened and left untouched leaves nothing behind.
function freshRunId() {
  const b = crypto.getRandomValues(new Uint8Array(16));
  b[6] = (b[6] & 0x0f) | 0x40;
  b[8] = (b[8] & 0x3f) | 0x80;
  const h = [...b].map((x) => x.toString(16).padStart(2, '0')).join('');
  return `r-${h.slice(0, 8)}-${h.slice(8, 12)}-${h.slice(12, 16)}-${h.slice(16, 20)}-${h.slice(20)}`;
}

// quotaText says how much of the tenant's kernel quota is in use
// (GET /kernels' answer) and what a new kernel will do.
export function quotaText(kl) {
  const q = kl.quota;
  const inUse = q.busy + q.starting;
  const live = `${q.live} live kernel${q.live === 1 ? '' : 's'}, ${q.busy} busy`;
  if (!q.limit) return `Kernels: ${live}; no kernel quota.`;
  if (inUse >= q.limit) return `Kernels: ${live}, of ${q.limit}. Every kernel is in use: a new one is refused until a cell ends, or you interrupt or stop one under Kernels.`;
  if (q.live >= q.limit) return `Kernels: ${live}, of ${q.limit}. A new kernel stops the least recently used idle one (its run keeps its files; its journal says so).`;
  return `Kernels: ${live}, of ${q.limit}.`;
}

// showQuota fills the element with the kernel quota's use, if the key
// may read it.
export async function showQuota(target) {
  if (!target) return;
  try {
    target.textContent = quotaText(await api('GET', '/kernels'));
  } catch {
    target.textContent = '';
  }
}

// newScratch opens a new manual run's cells. When every kernel of the
// tenant is in use, it says so first: the run's first cell would be
// refused.
export async function newScratch() {
  const kl = await api('GET', '/kernels').catch(() => null);
  if (kl && kl.quota.limit && kl.quota.busy + kl.quota.starting >= kl.quota.limit) {
    toast(quotaText(kl), 8000);
    return;
  }
  location.href = `${scratchPage(freshRunId())}?new=1`;
}

// Keyboard shortcuts; none fires while typing in a field.
const typing = (t) => t && (t.isContentEditable || ['INPUT', 'TEXTAREA', 'SELECT'].includes(t.tagName));
let pendingG = 0;
const pageKeys = {};
export function onKey(key, fn) {
  pageKeys[key] = fn;
}
document.addEventListener('keydown', (e) => {
  if (e.ctrlKey || e.metaKey || e.altKey || typing(e.target) || document.querySelector('dialog[open]')) return;
  const k = e.key;
  if (pendingG && Date.now() - pendingG < 1200) {
    pendingG = 0;
    if (k === 'r') {
      e.preventDefault();
      location.href = '/';
    }
    return;
  }
  if (k === 'g') {
    pendingG = Date.now();
    return;
  }
  if (pageKeys[k]) {
    pageKeys[k](e);
    return;
  }
  switch (k) {
    case '?':
      e.preventDefault();
      $('#shortcuts')?.showModal();
      break;
    case 'n':
      if (CAN_WRITE) location.href = '/console/launch';
      break;
    case 'c':
      if (CAN_WRITE) newScratch();
      break;
    case '/': {
      const f = $('main select, main input:not([type=hidden]), main textarea');
      if (f) {
        e.preventDefault();
        f.focus();
      }
      break;
    }
  }
});
$('#shortcuts-btn')?.addEventListener('click', () => $('#shortcuts')?.showModal());
$('#new-scratch')?.addEventListener('click', newScratch);
