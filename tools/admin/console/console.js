// The idemkafka console: a page over idemkafka-admin serve's JSON API. No build
// step, no dependencies. Every failed request is shown in #errors, never dropped.
'use strict';

const state = { config: null, cause: null, previewed: false };

function token() { return sessionStorage.getItem('idemkafka-token') || ''; }

function showError(what, message) {
  const box = document.getElementById('errors');
  box.textContent += (box.textContent ? '\n' : '') + what + ': ' + message;
}

function clearErrors() { document.getElementById('errors').textContent = ''; }

async function api(path, options) {
  const headers = Object.assign({ 'Accept': 'application/json' }, (options && options.headers) || {});
  if (token()) headers['Authorization'] = 'Bearer ' + token();
  let res;
  try {
    res = await fetch(path, Object.assign({}, options || {}, { headers }));
  } catch (e) {
    throw new Error('the console cannot be reached (' + e.message + ')');
  }
  let body = null;
  try { body = await res.json(); } catch (e) { throw new Error('HTTP ' + res.status + ' without JSON'); }
  if (res.status === 401) document.getElementById('token-box').hidden = false;
  if (!res.ok) throw new Error(body && body.error ? body.error : 'HTTP ' + res.status);
  return body;
}

function cell(row, text, cls) {
  const td = document.createElement('td');
  td.textContent = text === null || text === undefined ? '-' : String(text);
  if (cls) td.className = cls;
  row.appendChild(td);
  return td;
}

function fill(tableId, items, each) {
  const body = document.querySelector('#' + tableId + ' tbody');
  body.replaceChildren();
  for (const item of items) {
    const tr = document.createElement('tr');
    each(tr, item);
    body.appendChild(tr);
  }
}

function sources(list) {
  return list.map((s) => s.topic + ' [' + s.partitions.join(',') + ']').join(' ');
}

async function loadConfig() {
  state.config = await api('/api/config');
  document.getElementById('topic').textContent = 'dead-letter topic: ' + state.config.dead_letter_topic;
  document.getElementById('mode').textContent = state.config.allow_replay ? 'replay allowed' : 'read-only';
}

async function loadCauses() {
  const data = await api('/api/dead-letters/groups');
  document.getElementById('dl-summary').textContent =
    data.read + ' dead letters, ' + data.groups.length + ' causes (read in ' + data.read_ms + ' ms)';
  fill('causes', data.groups, (tr, g) => {
    tr.dataset.cause = g.id;
    tr.dataset.testid = 'cause-row';
    cell(tr, g.count, 'num count');
    cell(tr, g.consumer_group);
    cell(tr, g.reason, 'reason');
    cell(tr, g.error_pattern, 'mono pattern');
    cell(tr, g.first_seen);
    cell(tr, g.last_seen);
    cell(tr, sources(g.sources));
    const td = cell(tr, '');
    const b = document.createElement('button');
    b.type = 'button';
    b.textContent = 'Open';
    b.dataset.testid = 'open-cause';
    b.addEventListener('click', () => openCause(g));
    td.appendChild(b);
  });
}

async function loadRecords() {
  const payload = document.getElementById('payload').checked;
  const data = await api('/api/dead-letters/records?limit=200&cause=' + encodeURIComponent(state.cause.id) +
    (payload ? '&payload=1' : ''));
  document.getElementById('records').classList.toggle('show-payload', payload);
  fill('records', data.records, (tr, r) => {
    cell(tr, r.partition + '@' + r.offset, 'mono');
    cell(tr, r.dead_lettered_at);
    cell(tr, (r.original.topic || '-') + '/' + r.original.partition + '@' + r.original.offset, 'mono');
    cell(tr, r.event_id, 'mono');
    cell(tr, r.attempts, 'num');
    cell(tr, r.error);
    cell(tr, payload ? r.key : '', 'payload mono');
    cell(tr, payload ? r.value : '', 'payload mono');
  });
}

function openCause(g) {
  state.cause = g;
  state.previewed = false;
  document.getElementById('cause-detail').hidden = false;
  document.getElementById('cause-id').textContent = g.id;
  document.getElementById('cause-pattern').textContent =
    g.count + ' x ' + g.consumer_group + ' / ' + g.reason + ': ' + g.error_pattern;
  document.getElementById('replay-result').textContent = '';
  document.getElementById('replay').disabled = true;
  loadRecords().catch((e) => showError('records', e.message));
}

function replayBody(dryRun) {
  return JSON.stringify({
    cause: state.cause.id,
    rate: Number(document.getElementById('rate').value || 0),
    again: document.getElementById('again').checked,
    requested_by: document.getElementById('requested-by').value,
    dry_run: dryRun,
  });
}

function summary(r, dryRun) {
  const would = r.records.filter((x) => x.outcome === 'would_publish').length;
  return dryRun
    ? 'Preview: ' + r.matched + ' matching, ' + would + ' would be replayed, ' + r.replayed_before +
      ' replayed before, ' + r.no_source + ' without source'
    : 'Replay ' + r.audit_id + ': ' + r.published + ' published, ' + r.failed + ' failed, ' +
      r.replayed_before + ' replayed before, ' + r.no_source + ' without source';
}

async function runReplay(dryRun) {
  const out = document.getElementById('replay-result');
  out.textContent = dryRun ? 'Previewing...' : 'Replaying...';
  try {
    const r = await api('/api/replay', { method: 'POST', body: replayBody(dryRun),
      headers: { 'Content-Type': 'application/json' } });
    out.textContent = summary(r, dryRun);
    out.className = r.failed ? 'bad' : 'ok';
    state.previewed = dryRun;
    document.getElementById('replay').disabled = !(dryRun && state.config.allow_replay);
    if (!dryRun) await Promise.all([loadAudit(), loadCauses()]);
  } catch (e) {
    out.textContent = '';
    showError(dryRun ? 'preview' : 'replay', e.message);
  }
}

async function loadLag() {
  const data = await api('/api/lag');
  fill('lag', data.partitions, (tr, p) => {
    cell(tr, p.group);
    cell(tr, p.topic);
    cell(tr, p.partition, 'num');
    cell(tr, p.committed, 'num');
    cell(tr, p.log_end, 'num');
    cell(tr, p.records_behind, 'num');
    cell(tr, p.seconds_behind === null ? null : p.seconds_behind.toFixed(1), 'num');
  });
}

async function loadAudit() {
  const data = await api('/api/replays');
  fill('audit', data.replays, (tr, a) => {
    tr.dataset.testid = 'audit-row';
    cell(tr, a.id, 'num');
    cell(tr, a.started_at);
    cell(tr, a.requested_by);
    cell(tr, a.tool);
    cell(tr, JSON.stringify(a.filter), 'mono');
    cell(tr, a.matched, 'num');
    cell(tr, a.published, 'num published');
    cell(tr, a.failed, 'num');
    cell(tr, a.skipped, 'num');
    cell(tr, a.outcome, 'outcome');
  });
}

async function loadClaims() {
  const s = await api('/api/status');
  const box = document.getElementById('claims');
  box.replaceChildren();
  const p = document.createElement('p');
  p.textContent = s.table + ': ' + (s.exists ? s.rows + ' claims, ' + s.mode + ', ' +
    (s.partitions || []).length + ' partitions, dedup horizon ' + Math.round(s.dedup_horizon_ms / 3600000) + ' h'
    : 'missing (' + s.migrate_command + ')');
  box.appendChild(p);
  for (const g of s.groups || []) {
    const line = document.createElement('div');
    line.textContent = g.consumer_group + ': ' + g.rows + ' claims, newest ' + g.newest_claim;
    box.appendChild(line);
  }
}

async function refresh() {
  clearErrors();
  const parts = [['config', loadConfig], ['dead letters', loadCauses], ['lag', loadLag],
    ['replay audit', loadAudit], ['claims table', loadClaims]];
  await Promise.all(parts.map(([name, f]) => f().catch((e) => showError(name, e.message))));
  document.body.dataset.loaded = 'true';
}

document.getElementById('refresh').addEventListener('click', refresh);
document.getElementById('preview').addEventListener('click', () => runReplay(true));
document.getElementById('replay').addEventListener('click', () => runReplay(false));
document.getElementById('payload').addEventListener('change',
  () => loadRecords().catch((e) => showError('records', e.message)));
document.getElementById('token-save').addEventListener('click', () => {
  sessionStorage.setItem('idemkafka-token', document.getElementById('token').value);
  document.getElementById('token-box').hidden = true;
  refresh();
});
if (location.hash.startsWith('#token=')) {
  sessionStorage.setItem('idemkafka-token', decodeURIComponent(location.hash.slice(7)));
  history.replaceState(null, '', location.pathname);
}
refresh();
