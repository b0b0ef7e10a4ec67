// tern dashboard: a small single-page app over the service's JSON API.
//
// Security rules this file keeps:
// - Every string from the API reaches the page through textContent or a form value, never
//   innerHTML: file names and labels can hold anything.
// - The token lives in sessionStorage (this tab only) and travels only in the Authorization
//   header, never in a URL. Links carry job ids (integers) and nothing else.
// - The page can do what the token's scope allows; the API decides, the UI only hides buttons.
'use strict';

const TOKEN_KEY = 'tern.token';
const POLL_MS = 1000;
const HIDDEN_POLL_MS = 5000;
const STATES = ['running', 'retrying', 'queued', 'failed', 'succeeded', 'canceled'];
const SCOPES = ['read', 'transfer', 'admin'];
const OPTION_NAMES = {
  streams: 'Streams', chunk_size: 'Chunk size', bwlimit: 'Bandwidth limit', no_encrypt: 'No encryption',
  verify_full: 'Full verify', checksum: 'Checksum', delete: 'Delete extra', retry_for: 'Reconnect for (s)',
  token_file: 'Token file', remote_bin: 'Remote tern', ssh: 'ssh command',
};

// ---------- DOM helpers ----------

/** h('div', {class: 'x', onclick: f}, child, 'text', ...): elements built from parts. */
function h(tag, attrs, ...kids) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith('on')) el.addEventListener(k.slice(2), v);
    else if (k === 'text') el.textContent = v;
    else if (k === 'value') el.value = v;
    else el.setAttribute(k, v === true ? '' : String(v));
  }
  append(el, kids);
  return el;
}

function append(el, kids) {
  for (const c of kids.flat(Infinity)) {
    if (c === undefined || c === null || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

function setText(el, s) {
  const v = s === undefined || s === null ? '' : String(s);
  if (el.textContent !== v) el.textContent = v;
}

const $ = (sel, root = document) => root.querySelector(sel);

function toast(msg, isError) {
  const t = h('div', { class: 'toast' + (isError ? ' error' : ''), text: msg });
  $('#toasts').append(t);
  setTimeout(() => t.remove(), isError ? 8000 : 4000);
}

// ---------- formatting ----------

function fmtBytes(n) {
  if (!Number.isFinite(n) || n < 0) return '–';
  const u = ['B', 'kB', 'MB', 'GB', 'TB', 'PB'];
  let i = 0;
  while (n >= 1000 && i < u.length - 1) { n /= 1000; i++; }
  return (i === 0 ? String(Math.round(n)) : n.toFixed(n < 10 ? 2 : n < 100 ? 1 : 0)) + ' ' + u[i];
}
const fmtRate = (bps) => (Number.isFinite(bps) && bps > 0 ? fmtBytes(bps) + '/s' : '–');
const fmtGbit = (bps) => (bps > 0 ? (bps * 8 / 1e9).toFixed(bps * 8 < 1e9 ? 3 : 2) + ' Gb/s' : '');

function fmtDuration(s) {
  if (!Number.isFinite(s) || s < 0) return '–';
  s = Math.round(s);
  if (s < 60) return s + ' s';
  const m = Math.floor(s / 60);
  if (m < 60) return m + ' min ' + String(s % 60).padStart(2, '0') + ' s';
  const hr = Math.floor(m / 60);
  if (hr < 48) return hr + ' h ' + String(m % 60).padStart(2, '0') + ' min';
  return Math.floor(hr / 24) + ' d ' + (hr % 24) + ' h';
}

function fmtAgo(unix) {
  if (!unix) return '–';
  const d = Date.now() / 1000 - unix;
  if (d < 0) return 'in ' + fmtDuration(-d);
  if (d < 5) return 'just now';
  return fmtDuration(d).replace(/ \d+ s$/, '') + ' ago';
}
const fmtTime = (unix) => (unix ? new Date(unix * 1000).toLocaleString() : '–');

// ---------- the API ----------

const session = { token: sessionStorage.getItem(TOKEN_KEY), me: null };

class ApiError extends Error {
  constructor(status, message) { super(message); this.status = status; }
}

async function api(method, path, body) {
  const headers = { Authorization: 'Bearer ' + session.token, Accept: 'application/json' };
  const init = { method, headers, cache: 'no-store', credentials: 'omit', referrerPolicy: 'no-referrer' };
  if (body !== undefined) {
    headers['Content-Type'] = 'application/json';
    init.body = JSON.stringify(body);
  }
  let r;
  try {
    r = await fetch(path, init);
  } catch (e) {
    throw new ApiError(0, 'cannot reach the tern service (' + e.message + '); is it running?');
  }
  let data = null;
  try { data = await r.json(); } catch (_) { /* not JSON: keep the status line */ }
  if (!r.ok) {
    const err = new ApiError(r.status, (data && data.error) || r.status + ' ' + r.statusText);
    if (r.status === 401 && session.me) signOut(err.message);
    throw err;
  }
  return data;
}

const can = (need) => session.me && SCOPES.indexOf(session.me.scope) >= SCOPES.indexOf(need);

function signOut(reason) {
  if (current) current.stop();
  current = null;
  sessionStorage.removeItem(TOKEN_KEY);
  session.token = null;
  session.me = null;
  loginView(reason);
}

// ---------- routing ----------

let current = null; // { stop() } of the view on screen

function route() {
  if (current) current.stop();
  current = null;
  if (!session.me) return;
  let hash = location.hash || '#/jobs';
  // A view this token cannot use (a deep link, or a sign-in with a weaker token) is the list.
  if ((hash === '#/submit' && !can('transfer')) || (hash === '#/tokens' && !can('admin'))) {
    hash = '#/jobs';
    history.replaceState(null, '', hash);
  }
  let m;
  if ((m = hash.match(/^#\/jobs\/(\d{1,15})$/))) current = jobView(Number(m[1]));
  else if (hash === '#/submit') current = submitView();
  else if (hash === '#/tokens') current = tokensView();
  else if (hash === '#/paths') current = pathsView();
  else current = jobsView();
  const view = hash.split('/')[1] || 'jobs';
  for (const a of document.querySelectorAll('#nav a')) {
    if (a.dataset.view === view) a.setAttribute('aria-current', 'page');
    else a.removeAttribute('aria-current');
  }
}

/** Runs `tick` now and then every second (every 5 s while the tab is hidden), never overlapping. */
function poller(tick) {
  let timer = null;
  let stopped = false;
  const loop = async () => {
    if (stopped) return;
    try { await tick(); } catch (e) { if (!stopped && e.status !== 401) showError(e); }
    if (!stopped) timer = setTimeout(loop, document.hidden ? HIDDEN_POLL_MS : POLL_MS);
  };
  loop();
  return { stop() { stopped = true; clearTimeout(timer); } };
}

let lastError = '';
function showError(e) {
  // One toast per distinct message, not one a second while the service is down.
  if (e.message !== lastError) toast(e.message, true);
  lastError = e.message;
  setTimeout(() => { lastError = ''; }, 10000);
}

function mount(...kids) {
  const main = $('#main');
  main.replaceChildren(...kids.flat());
  return main;
}

// ---------- sign in ----------

function loginView(reason) {
  $('#nav').hidden = true;
  $('#who').hidden = true;
  const input = h('input', { type: 'password', id: 'token', name: 'token', class: 'mono', autocomplete: 'off', spellcheck: 'false', required: true, 'aria-describedby': 'token-hint' });
  const err = h('p', { class: 'form-error', role: 'alert', text: reason || '' });
  const form = h('form', { method: 'post', novalidate: true },
    h('div', { class: 'field' },
      h('label', { for: 'token', text: 'API token' }),
      input,
      h('span', { class: 'hint', id: 'token-hint' }, 'From ', h('code', { text: 'tern token create' }), ' or the service’s ', h('code', { text: 'admin.token' }), '. Kept in this browser tab only, sent only in the Authorization header.')),
    err,
    h('div', {}, h('button', { class: 'btn primary', type: 'submit', text: 'Sign in' })));
  form.addEventListener('submit', async (ev) => {
    ev.preventDefault();
    const t = input.value.trim();
    if (!t) { err.textContent = 'Paste a token first.'; input.setAttribute('aria-invalid', 'true'); input.focus(); return; }
    session.token = t;
    try {
      session.me = await api('GET', '/v1/whoami');
    } catch (e) {
      session.token = null;
      err.textContent = e.message;
      input.setAttribute('aria-invalid', 'true');
      input.focus();
      return;
    }
    sessionStorage.setItem(TOKEN_KEY, t);
    signedIn();
  });
  mount(h('section', { class: 'panel login', 'aria-labelledby': 'login-title' },
    h('h1', { id: 'login-title', text: 'Sign in to the tern service' }),
    h('p', { text: 'Managed transfers: watch them move, cancel, retry, and manage tokens.' }),
    form));
  input.focus();
}

function signedIn() {
  const me = session.me;
  setText($('#who-name'), me.name ? me.name + ' (' + me.id + ')' : me.id);
  const sc = $('#who-scope');
  setText(sc, me.scope);
  sc.className = 'scope ' + me.scope;
  if (me.path_prefix) sc.title = 'limited to ' + me.path_prefix;
  for (const a of document.querySelectorAll('#nav a[data-needs]')) a.hidden = !can(a.dataset.needs);
  $('#nav').hidden = false;
  $('#who').hidden = false;
  route();
}

// ---------- job helpers ----------

function badge(state, large) {
  return h('span', { class: 'badge st-' + state + (large ? ' large' : ''), 'data-state': state, text: state });
}

function progressOf(job) {
  const p = job.progress || {};
  const s = job.summary || {};
  // A finished attempt's summary is exact; its last progress line (saved every 2 s) may be
  // missing or stale, but it is the only place the total is known.
  const finished = job.summary != null && job.state !== 'running';
  const bytes = finished ? (s.bytes || 0) + (s.bytes_skipped || 0) : (p.bytes || 0) + (p.bytes_skipped || 0);
  const total = job.state === 'succeeded' ? bytes : Math.max(p.bytes_total || 0, finished ? 0 : bytes);
  let frac = null;
  if (job.state === 'succeeded') frac = 1;
  else if (total > 0) frac = Math.min(1, bytes / total);
  return {
    frac,
    bytes,
    total,
    filesDone: finished ? (s.files || 0) + (s.files_skipped || 0) : (p.files_done || 0) + (p.files_skipped || 0),
    filesTotal: finished ? null : p.files_total || 0,
    filesFailed: finished ? s.files_failed || 0 : p.files_failed || 0,
    watch: p.watch || null,
  };
}

function setBar(bar, job, frac) {
  bar.className = 'bar s-' + job.state + (bar.classList.contains('large') ? ' large' : '');
  const span = bar.firstChild;
  const indeterminate = frac === null && (job.state === 'running' || job.state === 'queued');
  bar.classList.toggle('indeterminate', indeterminate);
  span.style.width = frac === null ? '0%' : (frac * 100).toFixed(1) + '%';
  if (frac === null) bar.removeAttribute('aria-valuenow');
  else bar.setAttribute('aria-valuenow', Math.round(frac * 100));
}

function newBar(large, label) {
  return h('div', { class: 'bar' + (large ? ' large' : ''), role: 'progressbar', 'aria-valuemin': 0, 'aria-valuemax': 100, 'aria-label': label }, h('span'));
}

function route2(spec) {
  return h('div', { class: 'route' }, h('span', { text: spec.src }), h('span', { class: 'arrow', 'aria-label': 'to', text: '→' }), h('span', { text: spec.dst }));
}

const jobTitle = (job) => job.spec.label || 'Job ' + job.id;
const isActive = (st) => st === 'running' || st === 'queued' || st === 'retrying';

function filesText(pr) {
  const t = pr.filesTotal ? pr.filesDone + ' / ' + pr.filesTotal : String(pr.filesDone);
  return t;
}

// ---------- view: job list ----------

function jobsView() {
  let filter = 'all';
  const rows = new Map();
  const tiles = {
    running: h('div', { class: 'v', text: '–' }),
    queued: h('div', { class: 'v', text: '–' }),
    rate: h('div', { class: 'v', text: '–' }),
    failed: h('div', { class: 'v', text: '–' }),
  };
  const tile = (k, v) => h('div', { class: 'tile' }, h('div', { class: 'k', text: k }), v);
  const chipEls = {};
  const chips = h('div', { class: 'chips', role: 'group', 'aria-label': 'Filter by state' },
    ['all', ...STATES].map((s) => (chipEls[s] = h('button', { type: 'button', class: 'chip', 'aria-pressed': String(s === filter), onclick: () => { filter = s; for (const [k, c] of Object.entries(chipEls)) c.setAttribute('aria-pressed', String(k === s)); render(); } }, s, h('span', { class: 'n' })))));
  const tbody = h('tbody');
  const empty = h('p', { class: 'empty', hidden: true });
  const nodes = nodesPanel();
  const table = h('table', { class: 'jobs' },
    h('caption', { class: 'skip', text: 'Transfers, newest first' }),
    h('thead', {}, h('tr', {}, ['Job', 'State', 'Progress', 'Rate', 'ETA', 'Files', 'Updated'].map((c, i) => h('th', { scope: 'col', class: i >= 3 ? 'num' : undefined, text: c })))),
    tbody);
  mount(
    h('div', { class: 'head' }, h('h1', { text: 'Transfers' }), h('span', { class: 'spacer' }),
      can('transfer') ? h('a', { class: 'btn primary', href: '#/submit', text: 'New transfer' }) : null),
    h('div', { class: 'tiles' }, tile('Running', tiles.running), tile('Waiting', tiles.queued), tile('Throughput now', tiles.rate), tile('Failed', tiles.failed)),
    chips,
    h('section', { class: 'panel', 'aria-label': 'Transfers' }, h('div', { class: 'table-wrap' }, table), empty),
    nodes.el);

  let jobs = [];
  function render() {
    const counts = Object.fromEntries(STATES.map((s) => [s, 0]));
    for (const j of jobs) counts[j.state] = (counts[j.state] || 0) + 1;
    for (const s of STATES) setText(chipEls[s].lastChild, counts[s]);
    setText(chipEls.all.lastChild, jobs.length);
    setText(tiles.running, counts.running);
    setText(tiles.queued, counts.queued + counts.retrying);
    setText(tiles.rate, fmtRate(jobs.filter((j) => j.state === 'running').reduce((a, j) => a + (j.rate_bytes_per_s || 0), 0)));
    setText(tiles.failed, counts.failed);
    const shown = jobs.filter((j) => filter === 'all' || j.state === filter);
    const keep = new Set(shown.map((j) => j.id));
    for (const [id, r] of rows) if (!keep.has(id)) { r.tr.remove(); rows.delete(id); }
    let prev = null;
    for (const j of shown) {
      let r = rows.get(j.id);
      if (!r) { r = jobRow(j.id); rows.set(j.id, r); }
      r.update(j);
      // Keep DOM order = list order without re-inserting rows that are already in place.
      const want = prev ? prev.nextSibling : tbody.firstChild;
      if (want !== r.tr) tbody.insertBefore(r.tr, want);
      prev = r.tr;
    }
    empty.hidden = shown.length > 0;
    setText(empty, jobs.length ? 'No ' + filter + ' transfers.' : (can('transfer') ? 'No transfers yet. Start one with “New transfer” or `tern submit SRC DST`.' : 'No transfers yet.'));
  }

  return poller(async () => {
    const [list, cluster] = await Promise.all([api('GET', '/v1/jobs?limit=200'), api('GET', '/v1/cluster')]);
    jobs = list.jobs;
    render();
    nodes.update(cluster);
  });
}

// ---------- the cluster's nodes ----------

const NODE_STATES = { active: 'succeeded', draining: 'retrying', joining: 'queued', left: 'canceled', unreachable: 'failed' };

/** The transfers view's Nodes panel: hidden unless this service is a cluster node (GET /v1/cluster lists nodes). */
function nodesPanel() {
  const tbody = h('tbody');
  const title = h('h2', { id: 'nodes-title', text: 'Nodes' });
  const el = h('section', { class: 'panel nodes', 'aria-labelledby': 'nodes-title', hidden: true },
    h('div', { class: 'head' }, title, h('span', { class: 'hint', text: 'as each node’s last heartbeat reported it' })),
    h('div', { class: 'table-wrap' }, h('table', { class: 'jobs' },
      h('thead', {}, h('tr', {}, ['Node', 'State', 'Rate', 'Jobs', 'Load', 'Heartbeat'].map((c, i) => h('th', { scope: 'col', class: i >= 2 ? 'num' : undefined, text: c })))),
      tbody)));
  const rows = new Map();
  function row() {
    const name = h('span', { class: 'mono' });
    const self = h('span', { class: 'tag', text: 'this node', hidden: true });
    const host = h('div', { class: 'sub' });
    const stateCell = h('td', { 'data-k': 'State' });
    const cells = ['Rate', 'Jobs', 'Load', 'Heartbeat'].map((k) => h('td', { class: 'num', 'data-k': k }));
    const tr = h('tr', {}, h('td', { class: 'what' }, name, self, host), stateCell, cells);
    let lastState = null;
    return {
      tr,
      update(n, me) {
        tr.dataset.node = n.node;
        setText(name, n.node);
        self.hidden = n.node !== me;
        setText(host, n.host + ' · tern ' + n.version);
        if (n.state !== lastState) {
          // A node's own words, in the colour of the job state that means the same to a reader.
          stateCell.replaceChildren(h('span', { class: 'badge st-' + (NODE_STATES[n.state] || 'queued'), 'data-state': n.state, text: n.state }));
          lastState = n.state;
        }
        setText(cells[0], fmtRate(n.rate_bps));
        setText(cells[1], n.running_jobs);
        setText(cells[2], Number.isFinite(n.load1) ? n.load1.toFixed(2) : '–');
        setText(cells[3], fmtDuration(n.heartbeat_age_s) + ' ago');
      },
    };
  }
  return {
    el,
    update(c) {
      el.hidden = !c.nodes.length;
      setText(title, c.cluster ? 'Nodes of cluster ' + c.cluster : 'Nodes');
      const keep = new Set(c.nodes.map((n) => n.node));
      for (const [k, r] of rows) if (!keep.has(k)) { r.tr.remove(); rows.delete(k); }
      for (const n of c.nodes) {
        let r = rows.get(n.node);
        if (!r) { r = row(); rows.set(n.node, r); }
        r.update(n, c.node);
        tbody.append(r.tr);
      }
    },
  };
}

function jobRow(id) {
  const href = '#/jobs/' + id;
  const title = h('a', { class: 'title', href });
  const tagEl = h('span', { class: 'tag', text: 'sync', hidden: true });
  const watchTag = h('span', { class: 'tag', text: 'watch', hidden: true });
  const route = h('div', { class: 'route' });
  const stateCell = h('td', { 'data-k': 'State' });
  const bar = newBar(false, 'progress of job ' + id);
  const pctEl = h('span');
  const bytesEl = h('span');
  const rate = h('td', { class: 'num', 'data-k': 'Rate' });
  const eta = h('td', { class: 'num', 'data-k': 'ETA' });
  const files = h('td', { class: 'num', 'data-k': 'Files' });
  const filesOk = h('span');
  const filesBad = h('div', { class: 'bad sub' });
  append(files, [filesOk, filesBad]);
  const updated = h('td', { class: 'num sub', 'data-k': 'Updated' });
  const tr = h('tr', { class: 'link', 'data-job': id },
    h('td', { class: 'what' }, title, tagEl, watchTag, route),
    stateCell,
    h('td', { class: 'prog', 'data-k': 'Progress' }, bar, h('div', { class: 'sub' }, pctEl, bytesEl)),
    rate, eta, files, updated);
  // The whole row opens the job; the title link is the keyboard and screen-reader way in.
  tr.addEventListener('click', (ev) => { if (!ev.target.closest('a,button')) location.hash = href; });
  let lastState = null;
  let lastRoute = '';
  return {
    tr,
    update(j) {
      setText(title, jobTitle(j));
      tagEl.hidden = !j.spec.sync;
      const r = j.spec.src + '\u0000' + j.spec.dst;
      if (r !== lastRoute) { route.replaceChildren(...route2(j.spec).childNodes); lastRoute = r; }
      if (j.state !== lastState) { stateCell.replaceChildren(badge(j.state)); lastState = j.state; }
      const pr = progressOf(j);
      watchTag.hidden = !pr.watch;
      setBar(bar, j, pr.frac);
      if (pr.watch) {
        setText(pctEl, 'backlog ' + fmtBytes(pr.watch.backlog_bytes));
        setText(bytesEl, 'lag ' + fmtDuration(pr.watch.lag_seconds));
      } else {
        setText(pctEl, pr.frac === null ? (isActive(j.state) ? 'scanning…' : '') : Math.floor(pr.frac * 100) + '%');
        setText(bytesEl, pr.total ? fmtBytes(pr.bytes) + ' / ' + fmtBytes(pr.total) : pr.bytes ? fmtBytes(pr.bytes) : '');
      }
      const bps = pr.watch && pr.watch.rate_bps ? pr.watch.rate_bps : j.rate_bytes_per_s;
      setText(rate, j.state === 'running' ? fmtRate(bps) : j.state === 'succeeded' && j.summary && j.summary.seconds > 0 ? fmtRate(j.summary.bytes / j.summary.seconds) : '–');
      setText(eta, j.state === 'running' && j.eta_s != null ? fmtDuration(j.eta_s) : '–');
      setText(filesOk, filesText(pr));
      setText(filesBad, pr.filesFailed ? pr.filesFailed + ' failed' : '');
      setText(updated, fmtAgo(j.updated_at));
      updated.title = fmtTime(j.updated_at);
    },
  };
}

// ---------- view: one job ----------

function jobView(id) {
  const title = h('h1');
  const stateBox = h('div');
  const routeBox = h('div');
  const cancelBtn = h('button', { type: 'button', class: 'btn danger', text: 'Cancel', hidden: true });
  const retryBtn = h('button', { type: 'button', class: 'btn primary', text: 'Retry', hidden: true });
  const alertBox = h('div', { class: 'alert', role: 'alert', hidden: true });
  const warnBox = h('div', { class: 'warn', role: 'status', hidden: true });

  const big = h('span', { class: 'big', text: '–' });
  const bytesLine = h('span', { class: 'sub' });
  const bar = newBar(true, 'progress of job ' + id);
  const stat = (k, cls) => { const v = h('div', { class: 'v' + (cls ? ' ' + cls : ''), text: '–' }); return [h('div', { class: 'stat' }, h('div', { class: 'k', text: k }), v), v]; };
  const [sRateT, sRate] = stat('Rate now');
  const [sAvgT, sAvg] = stat('Average');
  const [sEtaT, sEta] = stat('ETA');
  const [sFilesT, sFiles] = stat('Files');
  const [sFailT, sFail] = stat('Failed files');
  const [sAttT, sAtt] = stat('Attempts');
  const [sBacklogT, sBacklog] = stat('Backlog');
  const [sLagT, sLag] = stat('Lag');
  sBacklogT.hidden = true;
  sLagT.hidden = true;

  const canvas = h('canvas', { id: 'chart', role: 'img', 'aria-label': 'Throughput chart: no samples yet' });
  const legendNow = h('b', { text: '–' });
  const legendPeak = h('b', { text: '–' });
  const legendAvg = h('b', { text: '–' });
  const chartNote = h('span', {});

  const errBody = h('tbody');
  const errPanel = h('section', { class: 'panel', 'aria-labelledby': 'errs-title', hidden: true },
    h('h2', { id: 'errs-title', text: 'Per-file errors' }),
    h('div', { class: 'table-wrap' }, h('table', { class: 'errors' },
      h('thead', {}, h('tr', {}, ['Path', 'Side', 'Reason'].map((c) => h('th', { scope: 'col', text: c })))), errBody)));
  const details = h('dl', { class: 'kv' });

  mount(
    h('div', { class: 'crumbs' }, h('a', { href: '#/jobs', text: 'Transfers' }), ' / job ' + id),
    h('div', { class: 'head job-head' },
      h('div', {}, h('div', { class: 'head' }, title, stateBox), routeBox),
      h('span', { class: 'spacer' }),
      can('transfer') ? [cancelBtn, retryBtn] : null),
    alertBox,
    h('div', { class: 'grid2' },
      h('div', { class: 'stack' },
        h('section', { class: 'panel', 'aria-label': 'Progress' },
          h('div', { class: 'pct' }, big, bytesLine), bar,
          h('div', { class: 'stats' }, sRateT, sAvgT, sEtaT, sFilesT, sFailT, sAttT, sBacklogT, sLagT),
          warnBox),
        h('section', { class: 'panel', 'aria-labelledby': 'chart-title' },
          h('h2', { id: 'chart-title', text: 'Throughput' }),
          h('div', { class: 'chart-box' }, canvas),
          h('div', { class: 'legend' }, h('span', {}, 'now ', legendNow), h('span', {}, 'peak ', legendPeak), h('span', {}, 'average ', legendAvg), chartNote)),
        errPanel),
      h('section', { class: 'panel', 'aria-labelledby': 'details-title' }, h('h2', { id: 'details-title', text: 'Details' }), details)));

  let job = null;
  let samples = [];
  let busy = false;

  async function act(what) {
    if (busy) return;
    busy = true;
    cancelBtn.disabled = retryBtn.disabled = true;
    try {
      job = await api('POST', '/v1/jobs/' + id + '/' + what);
      toast('Job ' + id + (what === 'cancel' ? ' canceled' : ' queued again'));
      if (what === 'retry') samples = [];
      update();
    } catch (e) {
      toast(e.message, true);
    } finally {
      busy = false;
      cancelBtn.disabled = retryBtn.disabled = false;
    }
  }
  cancelBtn.addEventListener('click', () => act('cancel'));
  retryBtn.addEventListener('click', () => act('retry'));

  const ro = new ResizeObserver(() => drawChart(canvas, samples, job));
  ro.observe(canvas);

  function update() {
    if (!job) return;
    setText(title, jobTitle(job));
    document.title = 'tern · ' + jobTitle(job);
    if (stateBox.dataset.state !== job.state) { stateBox.replaceChildren(badge(job.state, true)); stateBox.dataset.state = job.state; }
    if (!routeBox.firstChild) routeBox.append(route2(job.spec));
    cancelBtn.hidden = !isActive(job.state);
    retryBtn.hidden = !(job.state === 'failed' || job.state === 'canceled');
    alertBox.hidden = !job.error || job.state === 'succeeded';
    setText(alertBox, job.error ? (job.state === 'retrying' ? 'Retrying after: ' : '') + job.error : '');

    const pr = progressOf(job);
    setBar(bar, job, pr.frac);
    setText(big, pr.frac === null ? (isActive(job.state) ? (job.state === 'running' ? 'Scanning…' : 'Waiting') : '–') : Math.floor(pr.frac * 100) + '%');
    setText(bytesLine, pr.total ? fmtBytes(pr.bytes) + ' of ' + fmtBytes(pr.total) : pr.bytes ? fmtBytes(pr.bytes) : '');
    const last = samples.length ? samples[samples.length - 1] : null;
    const running = job.state === 'running';
    setText(sRate, running && last ? fmtRate(last.bps) : '–');
    sRate.title = running && last ? fmtGbit(last.bps) : '';
    const s = job.summary;
    setText(sAvg, running ? fmtRate(job.rate_bytes_per_s) : s && s.seconds > 0 ? fmtRate(s.bytes / s.seconds) : '–');
    setText(sEta, running && job.eta_s != null ? fmtDuration(job.eta_s) : job.state === 'succeeded' && s ? 'done in ' + fmtDuration(s.seconds) : '–');
    setText(sFiles, filesText(pr));
    setText(sFail, pr.filesFailed);
    sFail.classList.toggle('bad', pr.filesFailed > 0);
    setText(sAtt, job.attempts + (job.retries ? ' (' + job.retries + ' retries)' : ''));
    const w = pr.watch;
    sBacklogT.hidden = sLagT.hidden = !w;
    if (w) {
      setText(sBacklog, fmtBytes(w.backlog_bytes) + (w.backlog_units != null ? ' · ' + w.backlog_units + ' units' : ''));
      setText(sLag, fmtDuration(w.lag_seconds));
      if (w.rate_bps) setText(sRate, fmtRate(w.rate_bps));
    }
    warnBox.hidden = !(w && w.eta_warning);
    // The watcher words the warning itself; a bare flag gets a generic sentence.
    setText(warnBox, !(w && w.eta_warning) ? '' : typeof w.eta_warning === 'string' ? w.eta_warning : 'Data is produced faster than it moves: the backlog is growing.');

    const errs = (s && Array.isArray(s.errors) ? s.errors : []);
    errPanel.hidden = errs.length === 0;
    if (errBody.childElementCount !== errs.length || errBody.dataset.job !== String(job.updated_at)) {
      errBody.replaceChildren(...errs.map((e) => h('tr', {},
        h('td', { class: 'path', text: e.path || '(whole transfer)' }),
        h('td', {}, h('span', { class: 'scope', text: e.side || '?' })),
        h('td', { text: e.message || '' }))));
      errBody.dataset.job = String(job.updated_at);
    }

    const o = job.spec.options || {};
    const kv = [
      ['Source', job.spec.src, 'mono'], ['Destination', job.spec.dst, 'mono'],
      ['Mode', job.spec.sync ? 'sync' : 'copy'],
      ['Created', fmtTime(job.created_at)], ['Started', fmtTime(job.started_at)], ['Finished', fmtTime(job.finished_at)],
      ['Notify', job.spec.notify],
      ['Owner token', job.owner, 'mono'],
      ...Object.entries(o).map(([k, v]) => [OPTION_NAMES[k] || k, v === true ? 'on' : v, 'mono']),
    ].filter((x) => x[1] !== undefined && x[1] !== null && x[1] !== '');
    const sig = JSON.stringify(kv);
    if (details.dataset.sig !== sig) {
      details.replaceChildren(...kv.flatMap(([k, v, c]) => [h('dt', { text: k }), h('dd', { class: c, text: String(v) })]));
      details.dataset.sig = sig;
    }

    const peak = samples.reduce((a, x) => Math.max(a, x.bps), 0);
    setText(legendNow, running && last ? fmtRate(last.bps) : '–');
    setText(legendPeak, fmtRate(peak));
    const avg = s && s.seconds > 0 && !running ? s.bytes / s.seconds : job.rate_bytes_per_s;
    setText(legendAvg, fmtRate(avg));
    setText(chartNote, !samples.length && !running ? 'No samples kept for this job (the service keeps recent history of running jobs in memory).' : '');
    canvas.setAttribute('aria-label', 'Throughput chart: ' + samples.length + ' samples; now ' + legendNow.textContent + ', peak ' + legendPeak.textContent);
    drawChart(canvas, samples, job);
  }

  const p = poller(async () => {
    const since = samples.length ? samples[samples.length - 1].t : 0;
    let j, tp;
    try {
      [j, tp] = await Promise.all([
        api('GET', '/v1/jobs/' + id),
        api('GET', '/v1/jobs/' + id + '/throughput?since=' + since),
      ]);
    } catch (e) {
      if (e.status !== 404) throw e;
      p.stop();
      mount(h('div', { class: 'crumbs' }, h('a', { href: '#/jobs', text: 'Transfers' })),
        h('p', { class: 'panel', text: e.message + ' (a token limited to a path sees only its own jobs).' }));
      return;
    }
    job = j;
    // A new attempt restarts the child's counters: keep the series, it is time-based.
    samples = samples.concat(tp.samples);
    // Bounded for day-long jobs: the older half thins out, the newest stay at 1 s.
    if (samples.length > 1800) samples = samples.filter((_, i) => i % 2 === 0 || i >= samples.length - 900);
    update();
  });
  return { stop() { p.stop(); ro.disconnect(); document.title = 'tern · transfers'; } };
}

// ---------- the throughput chart (canvas, drawn here: no library) ----------

function niceStep(range, maxTicks) {
  const raw = range / maxTicks;
  const mag = Math.pow(10, Math.floor(Math.log10(raw)));
  for (const m of [1, 2, 2.5, 5, 10]) if (raw <= m * mag) return m * mag;
  return 10 * mag;
}

/** A y-axis label in the unit of the axis' top, with no more decimals than the steps need. */
function axisLabel(v, top) {
  if (v === 0) return '0';
  const units = ['B/s', 'kB/s', 'MB/s', 'GB/s', 'TB/s'];
  const i = Math.min(units.length - 1, Math.max(0, Math.floor(Math.log10(top) / 3)));
  const x = v / Math.pow(1000, i);
  return (Number.isInteger(Math.round(x * 100) / 100) ? x.toFixed(0) : String(Math.round(x * 100) / 100)) + ' ' + units[i];
}

function drawChart(canvas, samples, job) {
  const w = canvas.clientWidth;
  const hgt = canvas.clientHeight;
  if (!w || !hgt) return;
  const dpr = window.devicePixelRatio || 1;
  if (canvas.width !== Math.round(w * dpr) || canvas.height !== Math.round(hgt * dpr)) {
    canvas.width = Math.round(w * dpr);
    canvas.height = Math.round(hgt * dpr);
  }
  const ctx = canvas.getContext('2d');
  ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  ctx.clearRect(0, 0, w, hgt);
  const css = getComputedStyle(document.documentElement);
  const col = (n) => css.getPropertyValue(n).trim();
  const font = '12px ' + col('--sans');
  const pad = { l: 72, r: 14, t: 10, b: 26 };
  const pw = w - pad.l - pad.r;
  const ph = hgt - pad.t - pad.b;

  const t0 = samples.length ? samples[0].t - 1000 : 0;
  const tLast = samples.length ? samples[samples.length - 1].t : 0;
  // At least 30 s wide, so a job's first seconds do not fill the whole width.
  const span = Math.max(30000, tLast - t0);
  const maxBps = samples.reduce((a, s) => Math.max(a, s.bps), 0);
  const yStep = niceStep(Math.max(maxBps * 1.1, 1e6), 4);
  const yMax = Math.ceil(Math.max(maxBps * 1.1, 1e6) / yStep) * yStep;
  const X = (t) => pad.l + ((t - t0) / span) * pw;
  const Y = (v) => pad.t + ph - (v / yMax) * ph;

  // Grid and labels.
  ctx.font = font;
  ctx.lineWidth = 1;
  ctx.strokeStyle = col('--chart-grid');
  ctx.fillStyle = col('--muted');
  ctx.textAlign = 'right';
  ctx.textBaseline = 'middle';
  for (let v = 0; v <= yMax + 1; v += yStep) {
    const y = Math.round(Y(v)) + 0.5;
    ctx.beginPath(); ctx.moveTo(pad.l, y); ctx.lineTo(w - pad.r, y); ctx.stroke();
    ctx.fillText(axisLabel(v, yMax), pad.l - 8, y);
  }
  ctx.textAlign = 'center';
  ctx.textBaseline = 'top';
  const xStep = [5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200].find((s) => span / 1000 / s <= 6) || 14400;
  for (let s = 0; s * 1000 <= span; s += xStep) {
    const x = X(t0 + s * 1000);
    const label = s >= 3600 ? Math.floor(s / 3600) + 'h' + String(Math.floor((s % 3600) / 60)).padStart(2, '0') : Math.floor(s / 60) + ':' + String(s % 60).padStart(2, '0');
    ctx.fillText(label, x, pad.t + ph + 7);
  }

  if (!samples.length) {
    ctx.textAlign = 'center';
    ctx.textBaseline = 'middle';
    ctx.fillStyle = col('--muted');
    ctx.font = '14px ' + col('--sans');
    const msg = job && isActive(job.state) ? 'Waiting for the first progress report…' : 'No throughput samples';
    ctx.fillText(msg, pad.l + pw / 2, pad.t + ph / 2);
    return;
  }

  // The series, in segments: a pause (canceled, waiting to retry) longer than 3 s is a gap,
  // not a slope. Area first, then the line, then the newest point.
  const segs = [];
  for (const s of samples) {
    const seg = segs[segs.length - 1];
    if (seg && s.t - seg[seg.length - 1].t <= 3000) seg.push(s);
    else segs.push([s]);
  }
  const stateColor = job && job.state !== 'running' ? col('--' + job.state) : '';
  const line = stateColor || col('--chart-line');
  const grad = ctx.createLinearGradient(0, pad.t, 0, pad.t + ph);
  grad.addColorStop(0, col('--chart-fill'));
  grad.addColorStop(1, 'rgba(0,0,0,0)');
  ctx.lineWidth = 2;
  ctx.lineJoin = 'round';
  for (const seg of segs) {
    ctx.beginPath();
    ctx.moveTo(X(seg[0].t), Y(0));
    for (const s of seg) ctx.lineTo(X(s.t), Y(s.bps));
    ctx.lineTo(X(seg[seg.length - 1].t), Y(0));
    ctx.closePath();
    ctx.fillStyle = grad;
    ctx.fill();
    ctx.beginPath();
    seg.forEach((s, i) => (i ? ctx.lineTo(X(s.t), Y(s.bps)) : ctx.moveTo(X(s.t), Y(s.bps))));
    ctx.strokeStyle = line;
    ctx.stroke();
  }
  const lx = X(tLast);
  const ly = Y(samples[samples.length - 1].bps);
  ctx.fillStyle = line;
  ctx.beginPath(); ctx.arc(lx, ly, 3.5, 0, Math.PI * 2); ctx.fill();
}

// ---------- scheduled path tests (GET /v1/path-tests, drawn as inline SVG) ----------

const SVG_NS = 'http://www.w3.org/2000/svg';

/** svgEl('line', {x1: 0, ...}): an SVG element; attributes only, text through textContent. */
function svgEl(tag, attrs, text) {
  const el = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs || {})) el.setAttribute(k, String(v));
  if (text !== undefined) el.textContent = text;
  return el;
}

function fmtGbps(g) {
  if (g === null || g === undefined) return '–';
  return g >= 1 ? g.toFixed(2) + ' Gb/s' : (g * 1000).toFixed(g >= 0.1 ? 0 : 1) + ' Mb/s';
}

/**
 * One path's history: N-stream and 1-stream rates (left axis) and the round trip (right axis)
 * over time, a point per successful result, a cross on the time axis per failed one, and the
 * baseline's alert threshold as a dashed line (perfSONAR's throughput graph, compact).
 */
function pathChart(results, test) {
  const W = 760, H = 240, pad = { l: 64, r: 64, t: 12, b: 28 };
  const pw = W - pad.l - pad.r, ph = H - pad.t - pad.b;
  const svg = svgEl('svg', { class: 'path-chart', viewBox: '0 0 ' + W + ' ' + H, role: 'img', preserveAspectRatio: 'none' });
  const ok = results.filter((r) => r.ok && r.many_gbps !== null);
  svg.setAttribute('aria-label', 'Path test history: ' + ok.length + ' results');
  if (!results.length) {
    svg.append(svgEl('text', { x: W / 2, y: H / 2, 'text-anchor': 'middle', class: 'pc-note' }, 'No results yet: the first test runs as soon as the service is free.'));
    return svg;
  }
  const t0 = results[0].at, t1 = Math.max(results[results.length - 1].at, t0 + 60);
  const maxRate = Math.max(1e-3, ...ok.map((r) => Math.max(r.many_gbps || 0, r.one_gbps || 0)), test.baseline_gbps || 0) * 1.1;
  const maxRtt = Math.max(1e-3, ...ok.map((r) => r.rtt_ms || 0)) * 1.1;
  const X = (t) => pad.l + ((t - t0) / (t1 - t0)) * pw;
  const Y = (g) => pad.t + ph - (g / maxRate) * ph;
  const R = (ms) => pad.t + ph - (ms / maxRtt) * ph;
  for (let i = 0; i <= 4; i++) {
    const y = pad.t + (ph * i) / 4;
    svg.append(svgEl('line', { x1: pad.l, x2: W - pad.r, y1: y, y2: y, class: 'pc-grid' }));
    svg.append(svgEl('text', { x: pad.l - 6, y: y + 4, 'text-anchor': 'end', class: 'pc-axis' }, fmtGbps(maxRate * (1 - i / 4))));
    svg.append(svgEl('text', { x: W - pad.r + 6, y: y + 4, class: 'pc-axis pc-rtt-axis' }, (maxRtt * (1 - i / 4)).toFixed(2) + ' ms'));
  }
  for (const [t, anchor] of [[t0, 'start'], [t1, 'end']]) {
    svg.append(svgEl('text', { x: X(t), y: H - 8, 'text-anchor': anchor, class: 'pc-axis' }, new Date(t * 1000).toLocaleString()));
  }
  if (test.baseline_gbps) {
    const y = Y(test.baseline_gbps * test.spec.alert_below);
    svg.append(svgEl('line', { x1: pad.l, x2: W - pad.r, y1: y, y2: y, class: 'pc-threshold' }));
  }
  const series = [['rtt_ms', R, 'pc-rtt'], ['one_gbps', Y, 'pc-one'], ['many_gbps', Y, 'pc-many']];
  for (const [k, scale, cls] of series) {
    const pts = ok.filter((r) => r[k] !== null && r[k] !== undefined);
    if (pts.length > 1) svg.append(svgEl('polyline', { points: pts.map((r) => X(r.at).toFixed(1) + ',' + scale(r[k]).toFixed(1)).join(' '), class: 'pc-line ' + cls }));
    for (const r of pts) {
      const c = svgEl('circle', { cx: X(r.at).toFixed(1), cy: scale(r[k]).toFixed(1), r: k === 'many_gbps' ? 3.5 : 2.5, class: 'pt ' + cls + (r.regressed && k === 'many_gbps' ? ' pt-regressed' : '') });
      c.append(svgEl('title', {}, new Date(r.at * 1000).toLocaleString() + ': ' + (k === 'rtt_ms' ? r[k].toFixed(3) + ' ms' : fmtGbps(r[k]))));
      svg.append(c);
    }
  }
  for (const r of results.filter((r) => !r.ok)) {
    const m = svgEl('text', { x: X(r.at), y: pad.t + ph - 2, 'text-anchor': 'middle', class: 'pt-failed' }, '×');
    m.append(svgEl('title', {}, new Date(r.at * 1000).toLocaleString() + ': ' + (r.error || 'failed')));
    svg.append(m);
  }
  return svg;
}

function pathsView() {
  const list = h('div', { class: 'stack' });
  mount(h('div', { class: 'head' }, h('h1', { text: 'Paths' }), h('span', { class: 'spacer' }),
    h('span', { class: 'hint' }, 'Scheduled with ', h('code', { text: 'tern test --every 6h DEST' }))), list);
  const legend = () => h('div', { class: 'legend' },
    h('span', { class: 'lg lg-many', text: 'N streams' }), h('span', { class: 'lg lg-one', text: '1 stream' }),
    h('span', { class: 'lg lg-rtt', text: 'round trip (right axis)' }), h('span', { class: 'lg lg-threshold', text: 'alert threshold' }));
  let shown = '';
  return poller(async () => {
    const tests = (await api('GET', '/v1/path-tests')).path_tests;
    const results = [];
    for (const t of tests) results.push((await api('GET', '/v1/path-tests/' + Number(t.id) + '/results?limit=500')).results);
    // Redrawn only when something changed: a tooltip being read stays put.
    const key = JSON.stringify([tests, results]);
    if (key === shown) return;
    shown = key;
    const panels = [];
    for (const [i, t] of tests.entries()) {
      const res = results[i];
      const last = t.last;
      const state = t.regressed ? h('span', { class: 'badge st-failed', text: 'below ' + Math.round(t.spec.alert_below * 100) + ' % of baseline' }) : h('span', { class: 'badge st-succeeded', text: 'ok' });
      panels.push(h('section', { class: 'panel path', 'data-id': t.id, 'aria-label': 'Path ' + t.spec.dest },
        h('div', { class: 'head' }, h('h2', { class: 'mono', text: t.spec.dest }), t.spec.label ? h('span', { class: 'hint', text: t.spec.label }) : null, state),
        h('p', { class: 'hint' }, 'every ' + fmtDuration(t.spec.every_s) + ' · last ' + (last ? (last.ok ? fmtGbps(last.many_gbps) + ' with ' + last.streams + ' streams, ' + fmtGbps(last.one_gbps) + ' with one, ' + (last.rtt_ms || 0).toFixed(2) + ' ms' : 'failed: ' + last.error) : '–') + ' · baseline ' + fmtGbps(t.baseline_gbps)),
        h('div', { class: 'path-chart-box' }, pathChart(res, t)), legend()));
    }
    if (!panels.length) panels.push(h('p', { class: 'empty', text: 'No scheduled path tests. Schedule one with tern test --every 6h DEST.' }));
    list.replaceChildren(...panels);
  });
}

// ---------- file browser ----------

// A panel that lists the service host's directories a job of this token may use
// (GET /v1/fs) and fills `target` with the chosen path.
function fileBrowser(target, id) {
  const list = h('ul', { class: 'browse-list', id: id + '-list' });
  const where = h('code', { class: 'browse-path' });
  const msg = h('p', { class: 'form-error', role: 'alert' });
  const up = h('button', { class: 'btn ghost', type: 'button', text: 'Up' });
  const use = h('button', { class: 'btn', type: 'button', id: id + '-use', text: 'Use this folder' });
  const panel = h('div', { class: 'browse', id, role: 'region', 'aria-label': 'Directories on the service host', hidden: true },
    h('div', { class: 'browse-head' }, where, up, use), msg, list);
  let current = null;
  const parent = (p) => p.replace(/\/[^/]*\/?$/, '') || '/';
  // `orStart`: above a root (or the token's prefix), go back to the list of starting points.
  async function open(path, orStart) {
    msg.textContent = '';
    try {
      const r = await api('GET', '/v1/fs' + (path ? '?path=' + encodeURIComponent(path) : ''));
      current = r.path;
      where.textContent = current || 'Start here';
      up.disabled = !current;
      use.disabled = !current;
      list.replaceChildren(...r.entries.map((e) => {
        const full = current ? current.replace(/\/$/, '') + '/' + e.name : e.name;
        const pick = e.kind === 'dir'
          ? h('button', { type: 'button', class: 'linkish', text: e.name + '/', onclick: () => open(full) })
          : h('button', { type: 'button', class: 'linkish', text: e.name, onclick: () => { target.value = full; panel.hidden = true; target.focus(); } });
        return h('li', { class: 'kind-' + e.kind }, pick, e.kind === 'file' ? h('span', { class: 'muted', text: ' ' + fmtBytes(e.size) }) : null);
      }));
      if (r.omitted) list.append(h('li', { class: 'muted', text: r.omitted + ' more not shown' }));
    } catch (e) {
      if (orStart) return open(null);
      msg.textContent = e.message;
    }
  }
  up.addEventListener('click', () => current && open(parent(current), true));
  use.addEventListener('click', () => { if (current) { target.value = current; panel.hidden = true; target.focus(); } });
  const button = h('button', { class: 'btn ghost', type: 'button', id: id + '-open', text: 'Browse…', 'aria-controls': id,
    onclick: () => {
      panel.hidden = !panel.hidden;
      if (!panel.hidden) open(target.value.trim().startsWith('/') ? target.value.trim() : null);
    } });
  return { button, panel };
}

// ---------- view: submit ----------

function submitView() {
  const field = (id, label, input, hint, wide) => h('div', { class: 'field' + (wide ? ' wide' : '') },
    h('label', { for: id, text: label }), input, hint ? h('span', { class: 'hint', id: id + '-hint', text: hint }) : null);
  const inp = (id, attrs) => h('input', Object.assign({ id, name: id, type: 'text', autocomplete: 'off', spellcheck: 'false', 'aria-describedby': id + '-hint' }, attrs));
  const prefix = session.me.path_prefix;
  const src = inp('src', { class: 'mono', required: true, placeholder: '/data/run42' });
  const dst = inp('dst', { class: 'mono', required: true, placeholder: 'tern://archive:7700/runs' });
  const label = inp('label', { placeholder: 'run42 to archive', maxlength: 200 });
  const notify = inp('notify', { type: 'url', placeholder: 'https://hooks.example.org/tern' });
  const sync = h('input', { type: 'checkbox', id: 'sync', name: 'sync' });
  const streams = inp('streams', { type: 'number', min: 1, max: 64, placeholder: 'auto' });
  const bwlimit = inp('bwlimit', { class: 'mono', placeholder: 'e.g. 800Mbit or 50M' });
  const chunk = inp('chunk_size', { class: 'mono', placeholder: 'e.g. 4M' });
  const retryFor = inp('retry_for', { type: 'number', min: 0, placeholder: 'seconds' });
  const tokenFile = inp('token_file', { class: 'mono', placeholder: '/etc/tern/daemon.token' });
  const verify = h('input', { type: 'checkbox', id: 'verify_full' });
  const noEnc = h('input', { type: 'checkbox', id: 'no_encrypt' });
  const err = h('p', { class: 'form-error', role: 'alert' });
  const go = h('button', { class: 'btn primary', type: 'submit', text: 'Start transfer' });
  const endpointsHint = 'A path on the service host, user@host:/path (ssh) or tern://host:port/path' + (prefix ? '; must be under ' + prefix : '') + '.';
  const srcBrowse = fileBrowser(src, 'src-browse');
  const dstBrowse = fileBrowser(dst, 'dst-browse');
  const withBrowse = (input, b) => h('div', { class: 'with-browse' }, input, b.button);
  const form = h('form', { class: 'grid panel', method: 'post', novalidate: true, 'aria-labelledby': 'submit-title' },
    field('src', 'Source', withBrowse(src, srcBrowse), endpointsHint, true),
    h('div', { class: 'field wide' }, srcBrowse.panel),
    field('dst', 'Destination', withBrowse(dst, dstBrowse), 'Copies land inside it when it is a directory, as with cp -r.', true),
    h('div', { class: 'field wide' }, dstBrowse.panel),
    field('label', 'Label', label, 'Optional; shown in the list and notifications.'),
    field('notify', 'Notify URL', notify, 'Optional webhook called with the job when it ends.'),
    h('div', { class: 'field wide' }, h('label', { class: 'check', for: 'sync' }, sync, 'Sync (only send what differs; needed for checksum/delete)')),
    h('details', { class: 'adv' }, h('summary', { text: 'Transfer options' }),
      h('div', { class: 'inner' },
        field('streams', 'Streams', streams, '1–64 parallel TCP streams.'),
        field('bwlimit', 'Bandwidth limit', bwlimit, 'Bytes (50M = 50 MB/s) or bits (800Mbit) per second.'),
        field('chunk_size', 'Chunk size', chunk, 'Unit of verification and resume.'),
        field('retry_for', 'Reconnect for', retryFor, 'Seconds to ride out network drops.'),
        field('token_file', 'Daemon token file', tokenFile, 'For tern:// endpoints, a file on the service host.'),
        h('div', { class: 'field' }, h('label', { class: 'check', for: 'verify_full' }, verify, 'Re-read and verify every file at the end')),
        h('div', { class: 'field' }, h('label', { class: 'check', for: 'no_encrypt' }, noEnc, 'No encryption (data stays authenticated)')))),
    h('div', { class: 'actions' }, go, h('a', { class: 'btn ghost', href: '#/jobs', text: 'Back to transfers' })),
    err);
  form.addEventListener('submit', async (ev) => {
    ev.preventDefault();
    err.textContent = '';
    for (const el of [src, dst]) el.setAttribute('aria-invalid', String(!el.value.trim()));
    if (!src.value.trim() || !dst.value.trim()) { err.textContent = 'Source and destination are both needed.'; (src.value.trim() ? dst : src).focus(); return; }
    const options = {};
    if (streams.value) options.streams = Number(streams.value);
    if (bwlimit.value.trim()) options.bwlimit = bwlimit.value.trim();
    if (chunk.value.trim()) options.chunk_size = chunk.value.trim();
    if (retryFor.value) options.retry_for = Number(retryFor.value);
    if (tokenFile.value.trim()) options.token_file = tokenFile.value.trim();
    if (verify.checked) options.verify_full = true;
    if (noEnc.checked) options.no_encrypt = true;
    const body = { src: src.value.trim(), dst: dst.value.trim(), sync: sync.checked, options };
    if (label.value.trim()) body.label = label.value.trim();
    if (notify.value.trim()) body.notify = notify.value.trim();
    go.disabled = true;
    try {
      const job = await api('POST', '/v1/jobs', body);
      toast('Job ' + job.id + ' submitted');
      location.hash = '#/jobs/' + Number(job.id);
    } catch (e) {
      err.textContent = e.message;
    } finally {
      go.disabled = false;
    }
  });
  mount(h('div', { class: 'head' }, h('h1', { id: 'submit-title', text: 'New transfer' })), form);
  src.focus();
  return { stop() {} };
}

// ---------- view: tokens ----------

function tokensView() {
  const tbody = h('tbody');
  const secretBox = h('div', { class: 'secret', role: 'status', hidden: true });
  const name = h('input', { id: 't-name', type: 'text', autocomplete: 'off', maxlength: 200, placeholder: 'nightly-backup' });
  const scope = h('select', { id: 't-scope' }, SCOPES.filter(can).map((s) => h('option', { value: s, text: s, selected: s === 'read' })));
  const expires = h('select', { id: 't-expires' }, [['12h', '12 hours'], ['7d', '7 days'], ['30d', '30 days'], ['90d', '90 days'], ['365d', '1 year'], ['never', 'never']].map(([v, t]) => h('option', { value: v, text: t, selected: v === '90d' })));
  const path = h('input', { id: 't-path', type: 'text', class: 'mono', autocomplete: 'off', spellcheck: 'false', placeholder: '/data/shared/run42' });
  const err = h('p', { class: 'form-error', role: 'alert' });
  const go = h('button', { class: 'btn primary', type: 'submit', text: 'Create token' });
  const field = (id, label, input, hint) => h('div', { class: 'field' }, h('label', { for: id, text: label }), input, hint ? h('span', { class: 'hint', text: hint }) : null);
  const form = h('form', { class: 'grid', method: 'post', novalidate: true },
    field('t-name', 'Name', name, 'Who or what uses it.'),
    field('t-scope', 'Scope', scope, 'read: watch; transfer: also submit/cancel/retry; admin: also tokens.'),
    field('t-expires', 'Expires', expires),
    field('t-path', 'Limit to path', path, 'Optional: jobs only under this path, and only its own jobs visible.'),
    h('div', { class: 'actions' }, go), err);

  const dialog = h('dialog', { 'aria-labelledby': 'rv-title' });
  document.body.append(dialog);

  mount(
    h('div', { class: 'head' }, h('h1', { text: 'Tokens' })),
    secretBox,
    h('section', { class: 'panel', 'aria-labelledby': 'new-title' }, h('h2', { id: 'new-title', text: 'New token' }), form),
    h('section', { class: 'panel', 'aria-labelledby': 'list-title' }, h('h2', { id: 'list-title', text: 'All tokens' }),
      h('div', { class: 'table-wrap' }, h('table', { class: 'tokens' },
        h('thead', {}, h('tr', {}, ['Token', 'Name', 'Scope', 'Path', 'Created', 'Expires', 'Last used', 'Status', ''].map((c) => h('th', { scope: 'col', text: c })))),
        tbody))));

  function showSecret(t) {
    const out = h('input', { type: 'text', readonly: true, value: t.token, id: 'new-secret', 'aria-label': 'The new token', onfocus: (e) => e.target.select() });
    const copy = h('button', { type: 'button', class: 'btn', text: 'Copy', onclick: async () => {
      try { await navigator.clipboard.writeText(t.token); toast('Token copied'); } catch (_) { out.focus(); out.select(); toast('Press Ctrl+C to copy', false); }
    } });
    secretBox.replaceChildren(
      h('h2', { text: 'Token ' + t.id + ' created: copy it now' }),
      h('div', { class: 'hint' }, 'This is the only time the secret is shown; the service stores only its hash. Use it with ', h('code', { text: 'TERN_TOKEN=…' }), ' or paste it here to sign in.'),
      h('div', { class: 'row' }, out, copy, h('button', { type: 'button', class: 'btn ghost', text: 'Done', onclick: () => { secretBox.hidden = true; secretBox.replaceChildren(); } })));
    secretBox.hidden = false;
    out.focus();
  }

  form.addEventListener('submit', async (ev) => {
    ev.preventDefault();
    err.textContent = '';
    const body = { scope: scope.value, expires: expires.value };
    if (name.value.trim()) body.name = name.value.trim();
    if (path.value.trim()) body.path_prefix = path.value.trim();
    go.disabled = true;
    try {
      const t = await api('POST', '/v1/tokens', body);
      showSecret(t);
      name.value = '';
      path.value = '';
      await load();
    } catch (e) {
      err.textContent = e.message;
    } finally {
      go.disabled = false;
    }
  });

  function confirmRevoke(t) {
    const yes = h('button', { type: 'button', class: 'btn danger', text: 'Revoke', id: 'rv-confirm' });
    const no = h('button', { type: 'button', class: 'btn', text: 'Keep it' });
    dialog.replaceChildren(
      h('h2', { id: 'rv-title', text: 'Revoke token ' + t.id + '?' }),
      h('p', {}, 'Scripts and people using ', h('b', { text: t.name || t.id }), ' get “revoked” on their next request. This cannot be undone.'),
      h('div', { class: 'actions' }, no, yes));
    no.addEventListener('click', () => dialog.close());
    yes.addEventListener('click', async () => {
      yes.disabled = true;
      try {
        await api('DELETE', '/v1/tokens/' + encodeURIComponent(t.id));
        toast('Token ' + t.id + ' revoked');
        dialog.close();
        await load();
      } catch (e) {
        dialog.close();
        toast(e.message, true);
      }
    });
    dialog.showModal();
    no.focus();
  }

  async function load() {
    const list = (await api('GET', '/v1/tokens')).tokens;
    const nowS = Date.now() / 1000;
    list.sort((a, b) => b.created_at - a.created_at);
    tbody.replaceChildren(...list.map((t) => {
      const status = t.revoked_at ? 'revoked' : t.expires_at && t.expires_at <= nowS ? 'expired' : 'live';
      const mine = session.me && t.id === session.me.id;
      return h('tr', { class: status === 'live' ? '' : 'muted-row', 'data-token': t.id },
        h('td', { class: 'mono', text: t.id + (mine ? ' (you)' : '') }),
        h('td', { text: t.name || '–' }),
        h('td', {}, h('span', { class: 'scope ' + t.scope, text: t.scope })),
        h('td', { class: 'mono', text: t.path_prefix || 'any' }),
        h('td', { title: fmtTime(t.created_at), text: fmtAgo(t.created_at) }),
        h('td', { title: fmtTime(t.expires_at), text: t.expires_at ? fmtAgo(t.expires_at) : 'never' }),
        h('td', { title: fmtTime(t.last_used_at), text: fmtAgo(t.last_used_at) }),
        h('td', {}, h('span', { class: 'badge ' + (status === 'live' ? 'st-succeeded' : 'st-canceled'), text: status })),
        h('td', {}, status === 'live' ? h('button', { type: 'button', class: 'btn danger small', text: 'Revoke', 'aria-label': 'Revoke token ' + t.id, onclick: () => confirmRevoke(t) }) : null));
    }));
  }
  load().catch(showError);
  return { stop() { dialog.remove(); } };
}

// ---------- start ----------

window.addEventListener('hashchange', route);
document.addEventListener('DOMContentLoaded', async () => {
  $('#signout').addEventListener('click', () => signOut('Signed out.'));
  $('#skip').addEventListener('click', (ev) => { ev.preventDefault(); $('#main').focus(); });
  if (!session.token) return loginView();
  try {
    session.me = await api('GET', '/v1/whoami');
    signedIn();
  } catch (e) {
    signOut(e.message);
  }
});
