// The runs list: the tenant's runs, newest first, filtered by status and
// recipe, a page at a time, kept up to date while runs progress.
import { $, api, badge, el, fmtDur, onKey, runPage, time, toast } from './lib.js';

const tbody = $('#runs tbody');
const status = $('#f-status');
const recipe = $('#f-recipe');
const more = $('#more');
const live = $('#live');
const PAGE = 25;
let cursor = '';
let loaded = 0;
const rows = new Map(); // run id -> {tr, sum}

const params = new URLSearchParams(location.search);
status.value = params.get('status') || '';

function query(limit, after) {
  const q = new URLSearchParams({ limit: String(limit) });
  if (status.value) q.set('status', status.value);
  if (recipe.value) q.set('recipe', recipe.value);
  if (after) q.set('cursor', after);
  return `/runs?${q}`;
}

function duration(s) {
  const end = s.status === 'running' || s.status === 'queued' ? Date.now() : new Date(s.updated).getTime();
  return fmtDur(end - new Date(s.created).getTime());
}

function cells(s) {
  const objective = s.objective ? el('div', { class: 'objective', text: s.objective, title: s.objective }) : null;
  return [
    el('td', { class: 'c-run' }, el('a', { class: 'runlink', href: runPage(s.run_id), text: s.run_id }), objective),
    el('td', { 'data-label': '' }, badge(s.status)),
    el('td', { 'data-label': '' }, s.recipe ? el('span', { text: s.recipe }) : el('span', { class: 'muted', text: 'manual' })),
    el('td', { class: 'num', 'data-label': 'steps' }, String(s.steps)),
    el('td', { class: 'counts', 'data-label': '' },
      el('span', { class: 'p', title: `${s.passed} passed`, text: `✓ ${s.passed}` }), '  ',
      el('span', { class: 'f', title: `${s.failed} failed`, text: `✗ ${s.failed}` })),
    el('td', { 'data-label': 'last' }, s.last_verdict ? badge(s.last_verdict) : el('span', { class: 'muted', text: '—' })),
    el('td', { 'data-label': '' }, time(s.created)),
    el('td', { class: 'num', 'data-label': 'took' }, duration(s)),
  ];
}

function row(s) {
  const tr = el('tr', { dataset: { run: s.run_id } }, cells(s));
  tr.addEventListener('click', (e) => {
    if (e.target.closest('a')) return;
    location.href = runPage(s.run_id);
  });
  return tr;
}

const key = (s) => [s.status, s.steps, s.passed, s.failed, s.last_verdict, s.updated, s.objective].join('|');

// show puts summaries in the table: new runs at the top (a refresh) or
// the bottom (next page), changed ones updated in place.
function show(list, append) {
  const fresh = [];
  for (const s of list) {
    const have = rows.get(s.run_id);
    if (have) {
      if (key(have.sum) !== key(s)) {
        have.tr.replaceChildren(...cells(s));
        have.tr.classList.remove('flash');
        void have.tr.offsetWidth;
        have.tr.classList.add('flash');
      } else {
        have.tr.lastElementChild.textContent = duration(s);
      }
      have.sum = s;
      continue;
    }
    const tr = row(s);
    rows.set(s.run_id, { tr, sum: s });
    fresh.push(tr);
  }
  if (append) tbody.append(...fresh);
  else {
    tbody.prepend(...fresh);
    fresh.forEach((tr) => tr.classList.add('flash'));
  }
  $('#empty').hidden = rows.size > 0;
}

async function load(reset) {
  if (reset) {
    rows.clear();
    tbody.replaceChildren();
    cursor = '';
    loaded = 0;
  }
  try {
    const page = await api('GET', query(PAGE, cursor));
    show(page.runs, true);
    loaded += page.runs.length;
    cursor = page.next_cursor || '';
    more.hidden = !cursor;
  } catch (e) {
    toast(e.text || String(e));
  }
}

// refresh re-reads the first pages (as many runs as are shown) while the
// tab is visible, so statuses, steps and verdicts move as runs progress.
async function refresh() {
  if (document.visibilityState !== 'visible') return;
  try {
    const page = await api('GET', query(Math.min(200, Math.max(PAGE, loaded))));
    show(page.runs, false);
    live.classList.add('on');
  } catch {
    live.classList.remove('on');
  }
}

function applyFilters() {
  const q = new URLSearchParams();
  if (status.value) q.set('status', status.value);
  if (recipe.value) q.set('recipe', recipe.value);
  history.replaceState(null, '', q.toString() ? `/?${q}` : '/');
  load(true);
}

async function recipes() {
  try {
    const list = await api('GET', '/recipes');
    for (const r of list.recipes) recipe.append(el('option', { value: r.name, text: r.name }));
  } catch {
    /* no sandbox, no recipes: manual only */
  }
  recipe.value = params.get('recipe') || '';
}

status.addEventListener('change', applyFilters);
recipe.addEventListener('change', applyFilters);
more.addEventListener('click', () => load(false));

// j and k move through the runs; Enter on the focused link opens it.
function move(d) {
  const trs = [...tbody.rows];
  if (!trs.length) return;
  let i = trs.findIndex((tr) => tr.classList.contains('sel'));
  trs[i]?.classList.remove('sel');
  i = Math.max(0, Math.min(trs.length - 1, i < 0 ? 0 : i + d));
  trs[i].classList.add('sel');
  trs[i].querySelector('a').focus();
}
onKey('j', () => move(1));
onKey('k', () => move(-1));

await recipes();
await load(true);
live.classList.add('on');
setInterval(refresh, 3000);
