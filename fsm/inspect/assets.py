"""The inspector's one script and one style sheet (served from /static, no inline code)."""

from __future__ import annotations

SCRIPT = """\
// Live updates without reloading: fetch this page's fragment and swap it in.
// The server renders every value escaped; nothing here builds HTML from data.
// With server-sent events (/events: committed transitions, from any process) the page
// refetches when one arrives, and polls 5x slower for the rest (renewals, effects, ages);
// where the browser has no EventSource, or the stream is refused (busy, signed out), it
// polls every data-every ms.
(function () {
  var live = document.getElementById('live');
  var status = document.getElementById('status');
  if (!live) { return; }
  var every = parseInt(live.getAttribute('data-every'), 10) || 2000;
  var settle = parseInt(live.getAttribute('data-settle'), 10) || 0;
  var events = live.getAttribute('data-events');
  var GAP = 500;  // at most two refetches a second, however fast transitions come
  var busy = false, again = false, pending = null, last = 0, polling = null, source = null;
  function mode() { return source ? 'live (events)' : 'live (polling)'; }
  function tick() {
    if (busy) { again = true; return; }
    var active = document.activeElement;
    if (active && live.contains(active) && (active.tagName === 'INPUT' || active.tagName === 'SELECT')) {
      return;  // never swap the form under the user's cursor
    }
    var edited = Array.prototype.some.call(live.querySelectorAll('form.action input'), function (i) {
      return i.value !== i.defaultValue;
    });
    if (edited) { return; }  // nor an action form the operator has started to fill in
    busy = true;
    last = Date.now();
    fetch(live.getAttribute('data-src'), {headers: {'Accept': 'text/html'}, cache: 'no-store'})
      .then(function (r) { if (!r.ok) { throw new Error('HTTP ' + r.status); } return r.text(); })
      .then(function (text) {
        live.innerHTML = text;
        status.textContent = mode() + ' · updated ' + new Date().toLocaleTimeString();
        status.className = 'status ok';
      })
      .catch(function (err) {
        status.textContent = 'not updating: ' + err.message;
        status.className = 'status bad';
      })
      .finally(function () {
        busy = false;
        if (again) { again = false; changed(); }
      });
  }
  function changed() {
    if (pending !== null) { return; }
    pending = setTimeout(function () { pending = null; tick(); }, Math.max(0, last + GAP - Date.now()));
  }
  function poll() {
    if (polling === null) { polling = setInterval(tick, every); }
  }
  if (events && window.EventSource) {
    source = new EventSource(events);
    source.addEventListener('transition', function () {
      changed();
      // the cached counts: the refetch after the cache's age starts a recount (if none ran
      // since the event), the one after that shows it
      if (settle) { setTimeout(changed, settle); setTimeout(changed, 2 * settle); }
    });
    source.onopen = function () { status.textContent = mode(); status.className = 'status ok'; };
    source.onerror = function () {
      if (source && source.readyState === EventSource.CLOSED) {  // refused: no retry will come
        source.close();
        source = null;
        poll();
      }
    };
    // what is no transition (renewals, effects, progress), ages and cached counts: 5x slower than polling
    setInterval(tick, every * 5);
  } else {
    poll();
  }
})();
"""

STYLE = """\
body { font: 14px/1.4 system-ui, sans-serif; margin: 0; color: #1d2330; background: #f6f7f9; }
header { background: #1d2330; color: #fff; padding: 8px 16px; display: flex; gap: 12px; align-items: center; }
header .home { color: #fff; font-weight: 600; text-decoration: none; }
.ro { background: #3b4456; border-radius: 3px; padding: 1px 6px; font-size: 12px; }
.status { margin-left: auto; font-size: 12px; color: #b8c0cc; }
.status.bad { color: #ffb4a8; }
main { padding: 12px 16px 40px; }
h1 { font-size: 18px; margin: 8px 0; }
h2 { font-size: 15px; margin: 18px 0 8px; }
h3 { font-size: 14px; margin: 0 0 6px; }
section { background: #fff; border: 1px solid #dde1e7; border-radius: 6px; padding: 8px 12px 12px; margin-top: 12px; }
table { border-collapse: collapse; width: 100%; }
th, td { text-align: left; padding: 3px 8px; border-bottom: 1px solid #eceef2; vertical-align: top; }
th { font-weight: 600; color: #4a5366; background: #fafbfc; }
td.n, th.n { text-align: right; font-variant-numeric: tabular-nums; }
.cards { display: flex; flex-wrap: wrap; gap: 12px; }
.card { border: 1px solid #dde1e7; border-radius: 6px; padding: 8px; min-width: 220px; }
.card table td { border: none; padding: 1px 6px; }
.total { font-weight: normal; color: #6b7385; font-size: 12px; }
.muted { color: #6b7385; font-weight: normal; }
.meta { color: #4a5366; margin: 4px 0; }
.empty { color: #6b7385; font-style: italic; }
.id { font-family: ui-monospace, monospace; word-break: break-all; }
.state { border-radius: 10px; padding: 0 8px; background: #e8ebf0; white-space: nowrap; }
.s-running, .s-finalizing { background: #dbe9ff; }
.s-completed { background: #daf3df; }
.s-failed { background: #fde0dc; }
.s-queued { background: #f1ecd9; }
.held { color: #0b5d1e; }
.expired { color: #a11d0b; font-weight: 600; }
.unknown td { color: #a11d0b; }
.alert { color: #a11d0b; font-weight: 600; margin: 0 0 6px; }
.alert a { color: inherit; }
.entities td:not(.id), .reaper td:first-child { white-space: nowrap; }
.entities td.id { min-width: 11em; }
.entities td.held, .entities td.expired, .entities td.failure { white-space: normal; word-break: break-word; }
.entities td.failure { min-width: 14em; }
.filters { display: flex; flex-wrap: wrap; gap: 10px; align-items: center; margin-bottom: 8px; }
.split { display: grid; grid-template-columns: minmax(320px, 1fr) minmax(320px, 1fr); gap: 12px; }
.facts th { width: 130px; }
th[title] { cursor: help; text-decoration: underline dotted #9aa3b5; }
.legend { color: #6b7385; font-size: 12px; margin: 4px 0 0; }
.attempts td.of-state { white-space: nowrap; }
pre { margin: 4px 0; white-space: pre-wrap; word-break: break-all; font-size: 12px; }
pre.data { background: #fafbfc; border: 1px solid #eceef2; padding: 6px; max-height: 280px; overflow: auto; }
.diagram-box img.diagram { width: 100%; max-height: 75vh; object-fit: contain; min-height: 320px; }
.diagram-fallback table.transitions tr.current td { background: #fff4d6; font-weight: 600; }
.hint { color: #6b4e00; background: #fff8e1; border: 1px solid #f0d98a; border-radius: 4px; padding: 6px 8px; }
.charts { display: flex; flex-wrap: wrap; gap: 14px; }
figure.chart { margin: 0; padding: 6px; border: 1px solid #eceef2; border-radius: 4px; background: #fafbfc; }
figure.chart figcaption { font-size: 12px; font-weight: 600; margin-bottom: 4px; }
figure.chart svg { display: block; background: #fff; }
figure.chart line.axis { stroke: #9aa5b8; }
figure.chart rect { fill: #4a78c2; }
figure.c-claims rect { fill: #16a085; } figure.c-latency rect { fill: #8e44ad; }
figure.c-reaper rect, figure.c-ticks rect { fill: #c0392b; }
.axis-labels { display: flex; justify-content: space-between; font-size: 11px; color: #6b7385; }
tr.idle td { color: #6b7385; background: #fafbfc; }
td.failure, td.error { color: #a11d0b; }
.pager { margin: 6px 0 0; }
.pager a { margin-right: 12px; }
.problem { font-size: 15px; }
details summary { cursor: pointer; color: #4a5366; }
.timeline { list-style: none; padding: 0; margin: 0; }
.timeline li { border-left: 3px solid #9aa5b8; padding: 4px 10px; margin: 0 0 6px; background: #fafbfc; }
.timeline li.reaper { border-color: #c0392b; }
.timeline li.effect { border-color: #2e86de; }
.timeline li.renewal { border-color: #27ae60; }
.timeline li.acquired { border-color: #16a085; }
.timeline li.progress { border-color: #8e44ad; }
.timeline li.timer { border-left-style: dashed; border-color: #c0392b; background: #fff8f6; }
.timeline li.timer.overdue { background: #fde0dc; }
.timeline .when { display: inline-block; min-width: 90px; margin-right: 6px; color: #4a5366; }
.when.due { color: #c0392b; font-weight: 600; }
.when.due.overdue { color: #a11d0b; }
.facts div.timer + div.timer { margin-top: 2px; }
span.timer { color: #c0392b; white-space: nowrap; }
span.timer-due { color: #c0392b; font-size: 12px; white-space: nowrap; }
.tag { font-size: 11px; text-transform: uppercase; letter-spacing: .04em; color: #4a5366; margin-right: 6px; }
td.bad { color: #a11d0b; font-weight: 600; }
td.succeeded { color: #0b5d1e; } td.failed { color: #a11d0b; }
.schedules td, .schedules th { white-space: nowrap; }
.schedules td.id, .schedules td:nth-last-child(2) { white-space: normal; word-break: break-all; }
.schedules code { font-size: 12px; background: #f1f3f6; border-radius: 3px; padding: 0 4px; }
.schedules td.links a { margin-right: 6px; }
.state.sched-active { background: #daf3df; }
.state.sched-paused { background: #f1ecd9; color: #6b4e00; }
"""

__all__ = ["SCRIPT", "STYLE"]
