// commitfleet console: plain JS, no dependencies. Every value from the fleet goes
// into the page as text (textContent), never as markup.
"use strict";

const STATUS_EVERY_MS = 2000;
const HISTORY_EVERY_MS = 30000;
const MAX_EVENTS = 200;
let history = null;

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
  fill("pending", doc.pending, (p) => el("tr", { "data-dataset": p.dataset },
    el("td", {}, p.dataset), el("td", {}, p.job), el("td", {}, p.shard), el("td", {}, p.status),
    el("td", {}, p.state), el("td", { class: "reason" }, p.reason || "")));
  fill("quarantined", doc.quarantined, (q) => el("tr", { "data-dataset": q.dataset, "data-job": q.job },
    el("td", {}, q.dataset), el("td", {}, q.job), el("td", { class: "reason" }, q.reason),
    el("td", {},
      el("button", { class: "retry", type: "button", onclick: () => act("retry", q) }, "Retry"), " ",
      el("button", { class: "skip", type: "button", onclick: () => act("skip", q) }, "Skip"))));
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

function addEvent(type, ev) {
  const list = document.getElementById("events");
  const when = new Date(ev.at * 1000).toLocaleTimeString();
  list.prepend(el("li", { class: type, "data-type": type, "data-dataset": ev.dataset || "" },
    `${when} `, el("span", { class: "tag" }, type), " ", describe(ev)));
  while (list.children.length > MAX_EVENTS) list.lastChild.remove();
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

function follow() {
  const live = document.getElementById("live");
  const source = new EventSource("/events?from=$");
  source.onopen = () => { live.className = "live on"; live.textContent = "events: live"; };
  source.onerror = () => { live.className = "live off"; live.textContent = "events: reconnecting"; };
  const types = ["worker_joined", "worker_left", "shards_assigned", "commit_started", "committed", "aborted",
    "quarantined", "lock_taken_over", "recovery_done", "message_rejected", "job_timed_out", "operator_action",
    "shard_set_aside", "stream_reset"];
  for (const type of types) {
    source.addEventListener(type, (msg) => {
      const ev = JSON.parse(msg.data);
      addEvent(type, ev);
      if (type === "committed") countCommit(ev);
      if (type !== "commit_started") refreshStatus();
    });
  }
}

refreshStatus();
refreshHistory();
follow();
setInterval(refreshStatus, STATUS_EVERY_MS);
setInterval(refreshHistory, HISTORY_EVERY_MS);
