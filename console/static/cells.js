// Code cells as the console shows them: highlighted source, and outputs as
// the kernel produced them (streams, results, images, HTML rebuilt from an
// allowlist, tracebacks). Shared by the scratch notebook, the run page and
// the notebook preview.
import { el, fileURL, sanitize, stripAnsi } from './lib.js';
import { highlight } from './vendor/editor.js';

// code is a read-only, highlighted block of Python.
export function code(src, label) {
  return el('pre', { class: 'code', tabindex: '0', 'aria-label': label || null }, el('code', {}, highlight(String(src))));
}

// image returns an <img> for an image a cell displayed: base64 while it
// streams or in a notebook, a stored run file in an answer. An SVG shown
// as an image runs no script.
export function image(run, mime, v) {
  let src;
  if (Array.isArray(v)) v = v.join('');
  if (typeof v === 'string') {
    src = mime === 'image/svg+xml'
      ? 'data:image/svg+xml;charset=utf-8,' + encodeURIComponent(v)
      : `data:${mime};base64,${v.replace(/\s/g, '')}`;
  } else if (v && v.path) {
    src = fileURL(run, v.path);
  } else return null;
  return el('img', { src, alt: `${mime} output`, class: 'out-img' });
}

const text = (v) => (Array.isArray(v) ? v.join('') : v);

// bundle renders a display or result bundle: the richest type it has.
export function bundle(run, data) {
  for (const m of ['image/png', 'image/jpeg', 'image/gif', 'image/svg+xml']) {
    if (data[m] !== undefined) {
      const img = image(run, m, data[m]);
      if (img) return img;
    }
  }
  const html = text(data['text/html']);
  if (typeof html === 'string') return el('div', { class: 'html' }, sanitize(html));
  if (data['application/json'] !== undefined) return el('pre', { text: JSON.stringify(data['application/json'], null, 2) });
  const md = text(data['text/markdown']);
  if (typeof md === 'string') return el('pre', { text: md });
  const plain = text(data['text/plain']);
  if (typeof plain === 'string') return el('pre', { class: 'result', text: stripAnsi(plain) });
  return null;
}

// stream appends stdout or stderr, joining consecutive pieces.
export function stream(out, kind, s) {
  const last = out.lastElementChild;
  if (last && last.classList.contains(kind)) last.textContent += s;
  else out.append(el('pre', { class: kind, text: s }));
}

// errorBlock shows a cell's error: its traceback, or its message and what
// to do.
export function errorBlock(err) {
  // IPython opens a traceback with a ruler of dashes as wide as a
  // terminal: on a phone it wraps into two lines of noise, and it says
  // nothing the box around the traceback does not.
  const tb = (err.traceback || []).map(stripAnsi).join('\n').split('\n').filter((l) => !/^-{20,}$/.test(l.trim())).join('\n');
  const head = err.ename ? `${err.ename}: ${err.evalue || ''}` : err.message || 'The cell failed';
  return el('div', { class: 'error', role: 'group', 'aria-label': 'Error' },
    el('pre', { class: 'traceback', text: tb || head }),
    !tb && err.suggestion ? el('p', { class: 'small', text: err.suggestion }) : null);
}

// nbOutput renders one output of a notebook's code cell (nbformat 4).
export function nbOutput(run, out, o) {
  switch (o.output_type) {
    case 'stream':
      stream(out, o.name === 'stderr' ? 'stderr' : 'stdout', text(o.text) || '');
      break;
    case 'display_data':
    case 'execute_result': {
      const b = bundle(run, o.data || {});
      if (b) out.append(b);
      break;
    }
    case 'error':
      out.append(errorBlock(o));
      break;
  }
}
