// The runs list: the tenant's runs, searched, filtered by status and
// recipe, sorted, a page at a time, kept up to date while runs progress.
import { $, api, badge, el, fmtBytes, fmtCPU, fmtDur, onKey, runPage, time, toast } from './lib.js';

const tbody = $('#runs tbody');
const search = $('#f-q');
const status = $('#f-status');
const recipe = $('#f-recipe');
const sort = $('#f-sort');
const more = $('#more');
const live = $('#live');
const PAGE = 25;
let cursor = '';
let loaded = 0;
const rows = new Map(); // run id -> {tr, sum}

const params = new URLSearchParams(location.search);
search.value = params.get('q') || '';
status.value = params.get('status') || '';
sort.value = params.get('sort') || '';

function query(limit, after) {
  const q = new URLSearchParams({ limit: String(limit) });
  if (search.value.trim()) q.set('q', search.value.trim());
  if (status.value) q.set('status', status.value);
  if (recipe.value) q.set('recipe', recipe.value);
  if (sort.value) q.set('sort', sort.value);
  if (after) q.set('cursor', after);
  return `/runs?${q}`;
}

const filtering = () => Boolean(search.value.trim() || status.value || recipe.value);

function duration(s) {
  const end = s.status === 'running' || s.status === 'queued' ? Date.now() : new Date(s.updated).getTime();
  return fmtDur(end - new Date(s.created).getTime());
}

// tagButton filters the list by a tag.
function tagButton(t) {
  return el('button', {
    type: 'button', class: 'tag', text: t, title: `Show the runs tagged ${t}`,
    onclick: (e) => {
      e.stopPropagation();
      search.value = `tag:${t}`;
      applyFilters();
    },
  });
}

// used is a run's usage in brief: CPU, peak memory, stored bytes. A
// figure the backend does not measure shows as n/a, as the kernels view
// shows it, with a title that says why.
function used(u) {
  if (!u) return el('span', { class: 'muted', text: '—' });
  const fig = (v, fmt, what) => (v == null
    ? el('span', { class: 'muted', text: `${what} n/a`, title: `${what}: not measured by this server's sandbox backend` })
    : el('span', { text: `${fmt(v)} ${what}` }));
  return el('span', { class: 'used' },
    fig(u.cpu_seconds, fmtCPU, 'CPU'), el('span', { class: 'sep', 'aria-hidden': 'true', text: ' · ' }),
    fig(u.memory_peak_bytes, fmtBytes, 'peak'), el('span', { class: 'sep', 'aria-hidden': 'true', text: ' · ' }),
    el('span', { text: `${fmtBytes(u.stored_bytes)} stored` }));
}

function cells(s) {
  const name = s.name ? el('div', { class: 'run-name', text: s.name }) : null;
  const objective = s.objective ? el('div', { class: 'objective', text: s.objective, title: s.objective }) : null;
  const tags = s.tags?.length ? el('div', { class: 'tags' }, s.tags.map(tagButton)) : null;
  return [
    el('td', { class: 'c-run' }, name, el('a', { class: 'runlink', href: runPage(s.run_id), text: s.run_id, 'aria-label': s.name ? `${s.name} (${s.run_id})` : null }), objective, tags),
    el('td', { 'data-label': '' }, badge(s.status)),
    el('td', { 'data-label': '' }, s.recipe ? el('span', { text: s.recipe }) : el('span', { class: 'muted', text: 'manual' })),
    el('td', { class: 'num', 'data-label': 'steps' }, String(s.steps)),
    el('td', { class: 'counts', 'data-label': '' },
      el('span', { class: 'p', title: `${s.passed} passed`, text: `✓ ${s.passed}` }), '  ',
      el('span', { class: 'f', title: `${s.failed} failed`, text: `✗ ${s.failed}` })),
    el('td', { 'data-label': 'last' }, s.last_verdict ? badge(s.last_verdict) : el('span', { class: 'muted', text: '—' })),
    el('td', { class: 'c-used', 'data-label': '' }, used(s.usage)),
    el('td', { 'data-label': '' }, time(s.created)),
    el('td', { class: 'num', 'data-label': 'took' }, duration(s)),
  ];
}

function row(s) {
  const tr = el('tr', { dataset: { run: s.run_id } }, cells(s));
  tr.addEventListener('click', (e) => {
    if (e.target.closest('a, button')) return;
    location.href = runPage(s.run_id);
  });
  return tr;
}

const key = (s) => [s.status, s.steps, s.passed, s.failed, s.last_verdict, s.updated, s.objective, s.name, (s.tags || []).join(','),
  s.usage?.cpu_seconds, s.usage?.memory_peak_bytes, s.usage?.stored_bytes].join('|');

// put shows a summary: a new row, or the row it has, updated in place.
function put(s, flash) {
  const have = rows.get(s.run_id);
  if (!have) {
    const tr = row(s);
    rows.set(s.run_id, { tr, sum: s });
    if (flash) tr.classList.add('flash');
    return tr;
  }
  if (key(have.sum) !== key(s)) {
    have.tr.replaceChildren(...cells(s));
    have.tr.classList.remove('flash');
    void have.tr.offsetWidth;
    have.tr.classList.add('flash');
  } else {
    have.tr.lastElementChild.textContent = duration(s);
  }
  have.sum = s;
  return have.tr;
}

function drop(id) {
  rows.get(id)?.tr.remove();
  rows.delete(id);
}

function empty() {
  const none = rows.size === 0;
  $('#empty').hidden = !none;
  $('#empty-none').hidden = filtering();
  $('#empty-filtered').hidden = !filtering();
  if (none && filtering()) {
    const what = [];
    if (search.value.trim()) what.push(`“${search.value.trim()}”`);
    if (status.value) what.push(`status ${status.selectedOptions[0].textContent.toLowerCase()}`);
    if (recipe.value) what.push(recipe.value === 'manual' ? 'manual runs' : `recipe ${recipe.value}`);
    $('#empty-what').textContent = what.join(', ');
  }
}

async function load(reset) {
  const q = query(PAGE, reset ? '' : cursor);
  try {
    const page = await api('GET', q);
    if (reset) {
      rows.clear();
      tbody.replaceChildren();
      loaded = 0;
    }
    tbody.append(...page.runs.map((s) => put(s, false)));
    loaded += page.runs.length;
    cursor = page.next_cursor || '';
    more.hidden = !cursor;
    empty();
  } catch (e) {
    toast(e.text || String(e));
  }
}

// refresh re-reads as many runs as are shown (up to 200), while the tab
// is visible, and redraws the list in the answer's order: statuses, steps
// and verdicts move as runs progress, new runs appear, and a run that no
// longer matches the filters (a running run that finished) leaves.
async function refresh() {
  if (document.visibilityState !== 'visible') return;
  const n = Math.min(200, Math.max(PAGE, loaded));
  let page;
  try {
    page = await api('GET', query(n));
    live.classList.add('on');
  } catch {
    live.classList.remove('on');
    return;
  }
  const fresh = new Set(page.runs.map((s) => s.run_id));
  // The answer covers every shown row unless more than it were loaded.
  const covers = !page.next_cursor || loaded <= n;
  const beyond = [];
  for (const [id, r] of rows) {
    if (fresh.has(id)) continue;
    if (covers) drop(id);
    else beyond.push(r.tr);
  }
  const first = rows.size === 0 && loaded === 0;
  const ordered = page.runs.map((s) => put(s, !first && !rows.has(s.run_id)));
  tbody.replaceChildren(...ordered, ...beyond);
  if (covers) {
    loaded = page.runs.length;
    cursor = page.next_cursor || '';
    more.hidden = !cursor;
  }
  empty();
}

function applyFilters() {
  const q = new URLSearchParams();
  if (search.value.trim()) q.set('q', search.value.trim());
  if (status.value) q.set('status', status.value);
  if (recipe.value) q.set('recipe', recipe.value);
  if (sort.value) q.set('sort', sort.value);
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

let typingTimer = 0;
search.addEventListener('input', () => {
  clearTimeout(typingTimer);
  typingTimer = setTimeout(applyFilters, 250);
});
$('#filters').addEventListener('submit', (e) => {
  e.preventDefault();
  clearTimeout(typingTimer);
  applyFilters();
});
for (const s of [status, recipe, sort]) s.addEventListener('change', applyFilters);
$('#clear-filters').addEventListener('click', () => {
  search.value = '';
  status.value = '';
  recipe.value = '';
  applyFilters();
  search.focus();
});
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
