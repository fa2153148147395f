// commitfleet console: plain JS, no dependencies. Every value from the fleet goes
// into the page as text (textContent), never as markup.
"use strict";

const STATUS_EVERY_MS = 2000;
const HISTORY_EVERY_MS = 30000;
const RELOAD_EVENTS_MS = 5000;  // the wait before the history is asked for again after a failure
const PAGE_EVENTS = 200;  // events per /events/recent page
const MAX_EVENTS_KEPT = 1000;  // events the panel keeps (the oldest go first)
// The admin event types (the server's ADMIN_EVENT_TYPES; a unit test keeps them equal).
const EVENT_TYPES = ["worker_joined", "worker_left", "shards_assigned", "commit_started", "committed", "aborted",
  "quarantined", "lock_taken_over", "recovery_done", "message_rejected", "job_timed_out", "operator_action",
  "shard_set_aside", "stream_reset"];
let history = null;
// The events panel: its live stream, the ids shown (no event twice), the cursor of older events,
// and a generation that outdates the answers of filters changed since.
let source = null;
const seen = new Set();
let cursor = null;
let generation = 0;

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") node.className = v;
    else if (k.startsWith("data-")) node.setAttribute(k, v);
    else node[k] = v;
  }
  for (const c of children) node.append(c instanceof Node ? c : document.createTextNode(String(c ?? "")));
  return node;
}

function ranges(nums) {
  const out = [];
  let i = 0;
  while (i < nums.length) {
    let j = i;
    while (j + 1 < nums.length && nums[j + 1] === nums[j] + 1) j++;
    out.push(i === j ? `${nums[i]}` : `${nums[i]}-${nums[j]}`);
    i = j + 1;
  }
  return out.join(",");
}

function ago(at) {
  const s = Math.max(0, Date.now() / 1000 - at);
  return s < 60 ? `${s.toFixed(1)} s ago` : `${Math.round(s / 60)} min ago`;
}

function fill(id, rows, makeRow) {
  const body = document.querySelector(`#${id} tbody`);
  body.replaceChildren(...rows.map(makeRow));
  document.getElementById(`${id}-count`).textContent = `(${rows.length})`;
}

async function getJSON(url) {
  const resp = await fetch(url, { credentials: "same-origin", cache: "no-store" });
  if (resp.status === 401) { location.href = "/ui/login"; throw new Error("signed out"); }
  if (!resp.ok) throw new Error(`${url}: HTTP ${resp.status}`);
  return resp.json();
}

function renderStatus(doc) {
  document.getElementById("fleet").textContent = doc.fleet;
  const c = doc.counters || {};
  const summary = document.getElementById("summary");
  summary.replaceChildren(
    ...[["leader", doc.leader || "none"], ["shards", doc.shards], ["committed", c.committed || 0],
        ["aborted", c.aborted || 0], ["rejected", c.rejected || 0]]
      .map(([k, v]) => el("span", {}, `${k} `, el("b", {}, v))));
  fill("workers", doc.workers, (w) => el("tr", { "data-worker": w.id },
    el("td", {}, w.id), el("td", {}, w.host), el("td", {}, w.pid), el("td", {}, ago(w.heartbeat_at)),
    el("td", {}, `${w.shards.length}: ${ranges(w.shards)}`)));
  const t = doc.totals || {};
  pendingTotal = (t.waiting || 0) + (t.queued || 0) + (t.running || 0) + (t.blocked || 0);
  if (!pendingExpanded) loadPending(false);
  else countPending();
  fill("quarantined", doc.quarantined, (q) => el("tr", { "data-dataset": q.dataset, "data-job": q.job },
    el("td", {}, q.dataset), el("td", {}, q.job), el("td", { class: "reason" }, q.reason),
    el("td", {},
      el("button", { class: "retry", type: "button", onclick: () => act("retry", q) }, "Retry"), " ",
      el("button", { class: "skip", type: "button", onclick: () => act("skip", q) }, "Skip"))));
}

// The pending table: pages of GET /status/datasets?state=pending (the status summary has only
// counts), the first page on each refresh, further pages on "more" (then refreshes leave it be).
const PENDING_PAGE = 100;
let pendingNext = null;
let pendingTotal = 0;
let pendingExpanded = false;

function pendingRow(p) {
  return el("tr", { "data-dataset": p.dataset },
    el("td", {}, p.dataset), el("td", {}, p.job), el("td", {}, p.shard), el("td", {}, p.status),
    el("td", {}, p.state), el("td", { class: "reason" }, p.reason || ""));
}

function countPending() {
  const shown = document.querySelector("#pending tbody").rows.length;
  document.getElementById("pending-count").textContent =
    shown < pendingTotal ? `(${shown} of ${pendingTotal})` : `(${shown})`;
  document.getElementById("pending-more").hidden = !pendingNext;
}

async function loadPending(more) {
  const body = document.querySelector("#pending tbody");
  let cursor = more ? pendingNext : null;
  const rows = [];
  // A page may come back short (each request reads a bounded part of the state): read on a little.
  for (let i = 0; i < 10 && rows.length < PENDING_PAGE; i++) {
    const q = new URLSearchParams({ state: "pending", limit: String(PENDING_PAGE - rows.length) });
    if (cursor) q.set("cursor", cursor);
    let page;
    try { page = await getJSON(`/status/datasets?${q}`); } catch (e) { console.warn(e); return; }
    rows.push(...page.items.map(pendingRow));
    cursor = page.next;
    if (!cursor) break;
  }
  pendingNext = cursor;
  if (more) body.append(...rows); else body.replaceChildren(...rows);
  countPending();
}

async function act(op, q) {
  const result = document.getElementById("action-result");
  if (op === "skip" && !confirm(`Skip ${q.dataset} / ${q.job}? Its staged output is dropped.`)) return;
  result.className = "result";
  result.textContent = `${op} of ${q.dataset} / ${q.job}: sending…`;
  const resp = await fetch(`/ui/api/${op}`, {
    method: "POST", credentials: "same-origin",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ dataset: q.dataset, job: q.job }),
  });
  const body = await resp.json().catch(() => ({}));
  if (resp.ok) {
    result.textContent = `${op} of ${q.dataset} / ${q.job}: queued for shard ${body.shard}; the outcome shows below as operator_action`;
  } else {
    result.className = "result error";
    result.textContent = `${op} of ${q.dataset} / ${q.job}: ${body.error || "HTTP " + resp.status}`;
  }
  refreshStatus();
}

function describe(ev) {
  const skip = new Set(["v", "type", "at", "phases", "assignment"]);
  return Object.entries(ev).filter(([k, v]) => !skip.has(k) && v !== "" && v !== null)
    .map(([k, v]) => `${k}=${typeof v === "object" ? JSON.stringify(v) : v}`).join(" ");
}

function eventItem(id, type, ev) {
  const when = new Date(ev.at * 1000).toLocaleTimeString();
  return el("li", { class: type, "data-id": id, "data-type": type, "data-dataset": ev.dataset || "",
    "data-job": ev.job || "" }, `${when} `, el("span", { class: "tag" }, type), " ", describe(ev));
}

function trimEvents(list) {
  // Live events push the oldest out; "older events" then goes on from the oldest one kept.
  while (list.children.length > MAX_EVENTS_KEPT) {
    seen.delete(list.lastChild.dataset.id);
    list.lastChild.remove();
    cursor = list.lastChild.dataset.id;
  }
  showOlder();
}

function addEvent(id, type, ev) {
  // A live event: newest on top, once (the history was read up to the head the stream starts after).
  if (seen.has(id)) return;
  seen.add(id);
  const list = document.getElementById("events");
  list.prepend(eventItem(id, type, ev));
  trimEvents(list);
}

function addOlder(items) {
  // A page of /events/recent: newest first, below what is shown (asked for: not trimmed here).
  const list = document.getElementById("events");
  for (const { id, event } of items) {
    if (seen.has(id)) continue;
    seen.add(id);
    list.append(eventItem(id, event.type, event));
  }
}

function bars(svg, values, max) {
  const w = 600 / values.length;
  svg.replaceChildren(...values.map((v, i) => {
    const h = max > 0 ? (v / max) * 115 : 0;
    const r = document.createElementNS("http://www.w3.org/2000/svg", "rect");
    r.setAttribute("x", (i * w + 0.5).toFixed(1)); r.setAttribute("width", Math.max(1, w - 1).toFixed(1));
    r.setAttribute("y", (120 - h).toFixed(1)); r.setAttribute("height", h.toFixed(1));
    return r;
  }));
}

function line(cls, values, max) {
  // A polyline through the minutes that had commits, and a mark on each (one point alone shows too).
  const NS = "http://www.w3.org/2000/svg";
  const w = 600 / values.length;
  const g = document.createElementNS(NS, "g");
  g.setAttribute("class", cls);
  const pts = [];
  values.forEach((v, i) => {
    if (v === null) return;
    const x = i * w + w / 2, y = 120 - (v / max) * 115;
    pts.push(`${x.toFixed(1)},${y.toFixed(1)}`);
    const mark = document.createElementNS(NS, "rect");
    mark.setAttribute("x", (x - 3).toFixed(1)); mark.setAttribute("y", (y - 2).toFixed(1));
    mark.setAttribute("width", "6"); mark.setAttribute("height", "4");
    g.append(mark);
  });
  const pl = document.createElementNS(NS, "polyline");
  pl.setAttribute("points", pts.join(" "));
  g.prepend(pl);
  return g;
}

function renderHistory() {
  if (!history) return;
  const pts = history.points;
  const rates = pts.map((p) => p.per_s);
  bars(document.getElementById("chart-rate"), rates, Math.max(...rates, 0.0001));
  const last = pts[pts.length - 1];
  document.getElementById("rate-now").textContent =
    `${history.commits} in the hour, ${last.commits} this minute`;
  const maxes = pts.map((p) => p.max_s);
  const top = Math.max(...maxes.filter((v) => v !== null), 0.001);
  const svg = document.getElementById("chart-latency");
  svg.replaceChildren(line("max", maxes, top), line("mean", pts.map((p) => p.mean_s), top));
  const seen = pts.filter((p) => p.mean_s !== null);
  document.getElementById("lat-now").textContent = seen.length
    ? `last mean ${seen[seen.length - 1].mean_s.toFixed(3)} s, hour max ${top.toFixed(3)} s` : "no commits";
}

function countCommit(ev) {
  // Live: the current minute's point grows with each committed event; the server's
  // history (refreshed every 30 s) stays the reference.
  if (!history) return;
  const t = Math.floor(ev.at / 60) * 60;
  let p = history.points[history.points.length - 1];
  if (p.t < t) { history.points.shift(); p = { t, commits: 0, per_s: 0, mean_s: null, max_s: null }; history.points.push(p); }
  if (p.t !== t) return;
  const sum = (p.mean_s || 0) * p.commits + ev.duration_s;
  p.commits += 1; p.per_s = p.commits / 60; p.mean_s = +(sum / p.commits).toFixed(4);
  p.max_s = Math.max(p.max_s || 0, ev.duration_s); history.commits += 1;
  renderHistory();
}

async function refreshStatus() {
  try { renderStatus(await getJSON("/status")); } catch (e) { console.warn(e); }
}

async function refreshHistory() {
  try { history = await getJSON("/ui/api/commits"); renderHistory(); } catch (e) { console.warn(e); }
}

function eventQuery() {
  // The panel's filters as a query string (empty ones left out); the same for history and live.
  const q = new URLSearchParams();
  const type = document.getElementById("ev-type").value;
  const job = document.getElementById("ev-job").value.trim();
  const dataset = document.getElementById("ev-dataset").value.trim();
  if (type) q.set("type", type);
  if (job) q.set("job", job);
  if (dataset) q.set("dataset", dataset);
  return q;
}

function showOlder() {
  document.getElementById("events-older").hidden = cursor === null;
}

async function recent(q) {
  // One page of /events/recent; a refused filter (400) shows the server's reason.
  const resp = await fetch(`/events/recent?${q}`, { credentials: "same-origin", cache: "no-store" });
  if (resp.status === 401) { location.href = "/ui/login"; throw new Error("signed out"); }
  const body = await resp.json().catch(() => ({}));
  if (!resp.ok) throw Object.assign(new Error(body.error || `HTTP ${resp.status}`), { status: resp.status });
  return body;
}

async function loadEvents() {
  // The last events (bounded), then the live ones after the head that history was read to.
  const gen = ++generation;
  if (source) { source.close(); source = null; }
  const note = document.getElementById("events-note");
  const list = document.getElementById("events");
  list.replaceChildren();
  seen.clear();
  cursor = null;
  showOlder();
  note.className = "result";
  note.textContent = "loading…";
  const q = eventQuery();
  q.set("limit", String(PAGE_EVENTS));
  let page;
  try { page = await recent(q); } catch (e) {
    if (gen !== generation) return;
    note.className = "result error";
    note.textContent = `events: ${e.message}`;
    if (e.status !== 400) {
      // Redis or the coordinator unavailable: try again (a refused filter waits for new filters).
      const live = document.getElementById("live");
      live.className = "live off"; live.textContent = "events: reconnecting";
      setTimeout(() => { if (gen === generation) loadEvents(); }, RELOAD_EVENTS_MS);
    }
    return;
  }
  if (gen !== generation) return;  // the filters changed meanwhile
  addOlder(page.events);
  cursor = page.cursor;
  showOlder();
  note.textContent = page.events.length ? "" : "no matching events in the newest part of the stream";
  q.delete("limit");
  follow(q, page.head);
}

async function loadOlder() {
  if (cursor === null) return;
  const gen = generation;
  const q = eventQuery();
  q.set("limit", String(PAGE_EVENTS));
  q.set("before", cursor);
  const note = document.getElementById("events-note");
  try {
    const page = await recent(q);
    if (gen !== generation) return;
    addOlder(page.events);
    cursor = page.cursor;
    showOlder();
    note.className = "result";
    note.textContent = page.events.length ? "" : `no matching events in ${page.scanned} older entries`;
  } catch (e) {
    note.className = "result error";
    note.textContent = `events: ${e.message}`;
  }
}

function follow(q, head) {
  // The live events that match, from just after the head (the browser resumes with Last-Event-ID).
  const live = document.getElementById("live");
  q.set("from", head);
  source = new EventSource(`/events?${q}`);
  const mine = source;
  source.onopen = () => { live.className = "live on"; live.textContent = "events: live"; };
  source.onerror = () => {
    if (source !== mine) return;
    live.className = "live off"; live.textContent = "events: reconnecting";
  };
  for (const type of EVENT_TYPES) {
    source.addEventListener(type, (msg) => {
      if (source !== mine) return;
      const ev = JSON.parse(msg.data);
      addEvent(msg.lastEventId, type, ev);
      if (type === "committed") countCommit(ev);
      if (type !== "commit_started") refreshStatus();
    });
  }
}

function setupEvents() {
  const select = document.getElementById("ev-type");
  select.append(...EVENT_TYPES.map((t) => el("option", { value: t }, t)));
  select.addEventListener("change", loadEvents);
  document.getElementById("event-filter").addEventListener("submit", (e) => { e.preventDefault(); loadEvents(); });
  document.getElementById("events-older").addEventListener("click", loadOlder);
  loadEvents();
}

document.getElementById("pending-more").addEventListener("click", () => {
  pendingExpanded = true;
  loadPending(true);
});
refreshStatus();
refreshHistory();
setupEvents();
setInterval(refreshStatus, STATUS_EVERY_MS);
setInterval(refreshHistory, HISTORY_EVERY_MS);
