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
    el("td", {}, pageLink("dataset", q.dataset)), el("td", {}, pageLink("job", q.job)), el("td", { class: "reason" }, q.reason),
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
    el("td", {}, pageLink("dataset", p.dataset)), el("td", {}, pageLink("job", p.job)), el("td", {}, p.shard),
    el("td", {}, p.status),
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

async function act(op, q, resultId = "action-result") {
  const result = document.getElementById(resultId);
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
  // "k=v" pairs as text; a job or dataset value is a link to its page.
  const skip = new Set(["v", "type", "at", "phases", "assignment"]);
  return Object.entries(ev).filter(([k, v]) => !skip.has(k) && v !== "" && v !== null)
    .flatMap(([k, v], i) => {
      const value = (k === "job" || k === "dataset") && typeof v === "string"
        ? pageLink(k, v) : `${typeof v === "object" ? JSON.stringify(v) : v}`;
      return [i ? " " : "", `${k}=`, value];
    });
}

function eventItem(id, type, ev) {
  const when = new Date(ev.at * 1000).toLocaleTimeString();
  return el("li", { class: type, "data-id": id, "data-type": type, "data-dataset": ev.dataset || "",
    "data-job": ev.job || "" }, `${when} `, el("span", { class: "tag" }, type), " ", ...describe(ev));
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

// ---- The job and dataset pages (GET /jobs/{job}, GET /datasets/{name}) --------------------------
// Opened from the header's search box, or a job / dataset link in the tables and the events panel:
// each sets the location's hash (#job=<id>, #dataset=<name>), so the browser's back button and a
// copied link work. One page of a job's datasets is shown at a time (the server pages them).

const LOOKUP_PAGE = 100;  // a job's datasets per page
let lookupGeneration = 0;

function pageLink(kind, name) {
  // A link to a job's or a dataset's page; the name is text, the hash is encoded.
  if (!name) return "";
  return el("a", { href: `#${kind}=${encodeURIComponent(name)}`, class: `open-${kind}`, "data-name": name }, name);
}

function lookupTarget() {
  // The page the hash names: {kind, name}, or null (no page open, or a hash that is not ours).
  const m = /^#(job|dataset)=(.*)$/.exec(location.hash);
  if (!m) return null;
  try { return { kind: m[1], name: decodeURIComponent(m[2]) }; } catch (e) { return { kind: m[1], name: null }; }
}

async function pageJSON(url) {
  // GET a page: {status, body}; a 4xx/5xx answer's body carries the server's error.
  const resp = await fetch(url, { credentials: "same-origin", cache: "no-store" });
  if (resp.status === 401) { location.href = "/ui/login"; throw new Error("signed out"); }
  const body = await resp.json().catch(() => ({}));
  return { status: resp.status, body };
}

function lookupTable(cls, heads, rows) {
  return el("table", { class: cls },
    el("thead", {}, el("tr", {}, ...heads.map((h) => el("th", {}, h)))),
    el("tbody", {}, ...rows));
}

function when(at) {
  return at === null || at === undefined ? "-" : `${new Date(at * 1000).toLocaleTimeString()} (${ago(at)})`;
}

function renderJob(doc, cursor) {
  const body = document.getElementById("lookup-body");
  const live = doc.liveness;
  const line = [`liveness: ${live.state}`];
  if (live.state !== "ended") {
    line.push(`last driver beat ${when(live.beat_at)}`, `silent ${Number(live.silent_s).toFixed(1)} s of ${live.timeout_s} s`);
  }
  const shards = lookupTable("job-shards", ["shard", "state", "opened / ended", "results", "driver beat"],
    doc.shards.map((s) => el("tr", { "data-shard": s.shard },
      el("td", {}, s.shard), el("td", {}, s.state),
      el("td", {}, s.state === "open" ? when(s.opened_at) : `${(s.ended || {}).status || "-"} ${when((s.ended || {}).at)}`),
      el("td", {}, s.results), el("td", {}, s.alive ? when(s.alive.beat_at) : "-"))));
  const datasets = lookupTable("job-datasets", ["dataset", "shard", "status", "state", "files", "bytes", "reason / manifest"],
    doc.datasets.map((d) => {
      const r = d.result || {};
      return el("tr", { "data-dataset": d.dataset, "data-status": d.status },
        el("td", {}, pageLink("dataset", d.dataset)), el("td", {}, d.shard), el("td", {}, d.status), el("td", {}, d.state),
        el("td", {}, r.files ?? ""), el("td", {}, r.bytes ?? ""),
        el("td", { class: "reason" }, r.manifest || d.reason || r.reason || ""));
    }));
  const nav = el("p", { class: "pager" });
  // Another page: shown from its top (the button was at the bottom of the last one).
  const turn = async (next) => { await showJob(doc.job, next); document.getElementById("lookup").scrollIntoView({ block: "start" }); };
  if (cursor) nav.append(el("button", { type: "button", class: "link first-page", onclick: () => turn(null) }, "first page"), " ");
  if (doc.next) nav.append(el("button", { type: "button", class: "link next-page", onclick: () => turn(doc.next) }, "next page"));
  const parts = [el("p", { class: "liveness" }, line.join(" · ")), shards,
    el("h3", {}, `Datasets (${doc.datasets.length} on this page)`), datasets, nav];
  if (doc.events) {
    const list = el("ol", { class: "events job-events" }, ...doc.events.map(({ id, event }) => eventItem(id, event.type, event)));
    parts.push(el("h3", {}, "Newest events"), doc.events.length ? list : el("p", { class: "hint" }, "no recent event names this job"));
  }
  body.replaceChildren(...parts);
}

function renderDataset(doc) {
  const body = document.getElementById("lookup-body");
  const parts = [el("p", { class: "ds-shard" }, `shard ${doc.shard} · owner ${doc.owner || "none"}`)];
  const st = doc.store;
  if (st === null) {
    parts.push(el("p", { class: "hint" }, "the coordinator has no store: no lock, commits or watermarks"));
  } else {
    const lock = st.lock;
    let text = "lock: never taken";
    if (lock && lock.error) text = `lock: unreadable: ${lock.error}`;
    else if (lock) {
      const state = lock.held ? "held" : (lock.released ? "released" : "expired");
      text = `lock: ${state} · holder ${lock.holder} · epoch ${lock.epoch} · expires ${when(lock.expires_at)}`;
    }
    parts.push(el("p", { class: "ds-lock" }, text));
    if (st.watermarks && st.watermarks.values) {
      const marks = Object.entries(st.watermarks.values).map(([k, v]) => `${k}=${v}`).join(", ");
      parts.push(el("p", { class: "ds-watermarks" }, `watermarks: ${marks || "none"}`));
    }
    parts.push(el("h3", {}, `Newest commits (${st.commits.length})`));
    parts.push(lookupTable("ds-commits", ["job", "files", "bytes", "committed", "epoch", "watermarks"],
      st.commits.map((c) => el("tr", { "data-job": c.job },
        el("td", {}, pageLink("job", c.job)), el("td", {}, c.files ?? ""), el("td", {}, c.bytes ?? ""),
        el("td", {}, c.error ? c.error : when(c.committed_at)), el("td", {}, c.epoch ?? ""),
        el("td", {}, Object.entries(c.watermarks || {}).map(([k, v]) => `${k}=${v}`).join(", "))))));
  }
  parts.push(el("h3", {}, `Open work (${doc.open_work.length}${doc.open_work_next ? "+" : ""})`));
  parts.push(lookupTable("ds-open", ["job", "status", "state", "reason"],
    doc.open_work.map((w) => el("tr", { "data-job": w.job },
      el("td", {}, pageLink("job", w.job)), el("td", {}, w.status), el("td", {}, w.state || ""),
      el("td", { class: "reason" }, w.reason || "")))));
  parts.push(el("h3", {}, `Quarantined (${doc.quarantined.length})`));
  parts.push(lookupTable("ds-quarantined", ["job", "from", "reason", ""],
    doc.quarantined.map((q) => el("tr", { "data-job": q.job },
      el("td", {}, pageLink("job", q.job)), el("td", {}, q.source), el("td", { class: "reason" }, q.reason),
      el("td", {}, ...q.actions.flatMap((op) => [
        el("button", { class: op, type: "button", onclick: () => lookupAct(op, doc.dataset, q.job) },
          op === "retry" ? "Retry" : "Skip"), " "]))))));
  body.replaceChildren(...parts);
}

async function lookupAct(op, dataset, job) {
  // The outcome stays in the note; the page is read again below it.
  await act(op, { dataset, job }, "lookup-note");
  await showDataset(dataset, true);
}

async function showJob(name, cursor) {
  const gen = ++lookupGeneration;
  const note = document.getElementById("lookup-note");
  const q = new URLSearchParams({ limit: String(LOOKUP_PAGE) });
  if (cursor) q.set("cursor", cursor);
  const { status, body } = await pageJSON(`/jobs/${encodeURIComponent(name)}?${q}`);
  if (gen !== lookupGeneration) return;
  if (status !== 200) { lookupFailed(status, body); return; }
  note.className = "result"; note.textContent = "";
  renderJob(body, cursor);
}

async function showDataset(name, keepNote = false) {
  const gen = ++lookupGeneration;
  const note = document.getElementById("lookup-note");
  const { status, body } = await pageJSON(`/datasets/${encodeURIComponent(name)}`);
  if (gen !== lookupGeneration) return;
  if (status !== 200) { lookupFailed(status, body); return; }
  if (!keepNote) { note.className = "result"; note.textContent = ""; }
  renderDataset(body);
}

function lookupFailed(status, body) {
  const note = document.getElementById("lookup-note");
  note.className = "result error";
  note.textContent = status === 404 ? `not found: ${body.error || "HTTP 404"}` : (body.error || `HTTP ${status}`);
  document.getElementById("lookup-body").replaceChildren();
}

async function showLookup() {
  // Show the page the hash names (or hide the section when it names none).
  const section = document.getElementById("lookup");
  const target = lookupTarget();
  if (!target) { lookupGeneration++; section.hidden = true; return; }
  section.hidden = false;
  document.getElementById("lookup-title").textContent = `${target.kind} ${target.name ?? ""}`;
  const note = document.getElementById("lookup-note");
  if (!target.name) { lookupFailed(400, { error: "no name given" }); return; }
  note.className = "result"; note.textContent = "loading…";
  try {
    if (target.kind === "job") await showJob(target.name, null);
    else await showDataset(target.name);
  } catch (e) {
    note.className = "result error"; note.textContent = `${target.kind}: ${e.message}`;
  }
  section.scrollIntoView({ block: "start" });
}

function setupLookup() {
  document.getElementById("lookup-form").addEventListener("submit", (e) => {
    e.preventDefault();
    const name = document.getElementById("lookup-name").value.trim();
    if (!name) return;
    const next = `#${document.getElementById("lookup-kind").value}=${encodeURIComponent(name)}`;
    if (location.hash === next) showLookup(); else location.hash = next;
  });
  document.getElementById("lookup-close").addEventListener("click", () => {
    window.history.pushState(null, "", location.pathname + location.search);
    showLookup();
  });
  window.addEventListener("hashchange", showLookup);
  showLookup();
}

setupLookup();
