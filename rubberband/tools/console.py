"""The administrative console (dissertation 5.5): one page, served by every super at
``/console`` of its admin address, with no build step and nothing fetched from elsewhere.

The page itself holds no data and needs no token; it asks for the admin token and then
polls ``/status`` and ``/history`` every second with it, and shows on one screen every
process with its health (the routers as the super's E-Cast endpoint sees them: leader,
follower, unreachable, left the view; the supers; the storage processes on the ring and
in standby; the clients at work, as the storage processes heard them), the ring as a
picture (one arc per primary segment in ring order, red when suspected, outlined while
it receives ranges) and as a table (id, partition, state, load, size), the last hour of
throughput and heartbeat round trips (kept by the super, so the charts are full on
loading), and the history of reconfigurations, repairs, suspicions and keyspace
versions; each materialized view's progress, positions behind and staleness in
seconds, as its maintainer reports it every second.  Its form submits ``expand``,
``contract`` (one or more processes, taken off together), ``replace`` and ``rebalance``
to ``/reconfigure``: a dry run shows the
plan, a run asks for confirmation first, and both print the plan as text.  The token
stays in the browser tab's session storage.
"""

from __future__ import annotations

PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<title>Rubberband console</title>
<style>
 body { font: 14px system-ui, sans-serif; margin: 1em 1.6em; color: #222; }
 h1 { font-size: 1.3em; margin: 0 0 .4em; } h2 { font-size: 1.1em; margin: .8em 0 .3em; }
 table { border-collapse: collapse; margin: .3em 0 .6em; }
 th, td { padding: 2px 9px; border-bottom: 1px solid #ddd; text-align: left; }
 th { background: #f3f3f3; }
 td.num { text-align: right; font-variant-numeric: tabular-nums; }
 .bad { color: #b00; font-weight: bold; } .warn { color: #b60; } .good { color: #070; }
 #summary span { margin-right: 1.5em; }
 .row { display: flex; gap: 2em; align-items: flex-start; flex-wrap: wrap; }
 canvas { border: 1px solid #ccc; background: #fcfcfc; }
 form { margin: .5em 0; } input, select, button { font: inherit; margin-right: .4em; }
 pre { background: #f6f6f6; padding: .6em; max-width: 60em; white-space: pre-wrap; }
 #events { max-height: 16em; overflow-y: auto; font-size: 13px; }
 #events div { padding: 1px 0; } #events .t { color: #777; margin-right: .6em; }
 #error { color: #b00; }
</style></head>
<body>
<h1>Rubberband console <small id="who"></small></h1>
<form id="login"><label>admin token <input id="token" type="password" size="40"></label>
<button type="submit">connect</button></form>
<div id="error"></div>
<div id="summary"></div>
<div class="row">
 <div><h2>Processes</h2>
  <table id="processes"><thead><tr><th>role</th><th>process</th><th>health</th><th>detail</th>
  </tr></thead><tbody></tbody></table>
  <div>standby: <span id="standby">-</span></div></div>
 <div><h2>Ring</h2><svg id="ringpic" width="300" height="300" viewBox="-150 -150 300 300"
  role="img" aria-label="the ring"></svg><div id="pending"></div></div>
</div>
<table id="ring"><thead><tr><th>#</th><th>process</th><th>id</th><th>partition</th>
<th>state</th><th>ops/s</th><th>items</th><th>bytes</th><th>queued</th><th>rtt ms</th>
<th>clients</th></tr></thead><tbody></tbody></table>
<h2>Views (as their maintainers report them)</h2>
<table id="views"><thead><tr><th>view</th><th>maintainer</th><th>position</th>
<th>behind (positions)</th><th>staleness s</th><th>rows</th><th>report age s</th>
</tr></thead><tbody></tbody></table><div id="no-views"></div>
<h2>Load, the last hour (kept by the super)</h2>
<div class="row">
 <div>operations applied per second (the ring's storage processes): <b id="ops-now"></b><br>
  <canvas id="ops" width="520" height="150"></canvas></div>
 <div>slowest heartbeat round trip to a storage process, ms: <b id="rtt-now"></b><br>
  <canvas id="rtt" width="520" height="150"></canvas></div>
</div>
<div class="row">
 <div><h2>Reconfigure</h2>
  <form id="reconfigure">
   <select id="op"><option>expand</option><option>contract</option><option>replace</option>
   <option>rebalance</option></select>
   <input id="a1" placeholder="process (storage:N)" size="16"
    title="contract: one or more processes, taken off the ring together">
   <input id="a2" placeholder="key, or new process" size="16"
    title='a number, a string, or a JSON array: ["~view", "name", ["M"]] among a view&#39;s rows'>
   <button type="button" id="plan">dry run</button>
   <button type="submit" id="run">run</button>
  </form>
  <pre id="result"></pre></div>
 <div><h2>Repairs and reconfigurations</h2><div id="events"></div></div>
</div>
<script>
"use strict";
const COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2",
  "#17becf", "#bcbd22", "#7f7f7f", "#aec7e8", "#98df8a", "#c5b0d5"];
let samples = [], events = [], last = 0, token = sessionStorage.getItem("rb-token") || "";
document.getElementById("token").value = token;
document.getElementById("login").onsubmit = (e) => {
  e.preventDefault();
  token = document.getElementById("token").value.trim();
  sessionStorage.setItem("rb-token", token);
  samples = []; events = []; last = 0; refresh();
};
function headers() {
  return {"Authorization": "Bearer " + token, "Content-Type": "application/json"};
}
function cell(row, text, cls) {
  const td = row.insertCell(); td.textContent = text == null ? "" : text;
  if (cls) td.className = cls; return td;
}
function state(st, p) {
  if (p.suspected) return "suspected";
  if (st.busy.includes(p.name)) return "receiving";
  if (st.incomplete.includes(p.name)) return "incomplete";
  return "active";
}
const HEALTH = {active: "good", receiving: "warn", incomplete: "warn", suspected: "bad"};
function clock(t) { return new Date(t * 1000).toLocaleTimeString(); }
function draw(id, index, color) {
  const c = document.getElementById(id), g = c.getContext("2d");
  g.clearRect(0, 0, c.width, c.height);
  const pts = samples.filter(s => s[index] != null);
  if (!pts.length) return;
  const t1 = pts[pts.length - 1][0], t0 = Math.min(pts[0][0], t1 - 60);
  const max = Math.max(1, ...pts.map(s => s[index])) * 1.15;
  g.fillStyle = "#888"; g.font = "11px sans-serif";
  g.fillText(max.toFixed(max < 10 ? 1 : 0), 4, 12); g.fillText("0", 4, c.height - 4);
  g.fillText(clock(t0), 24, c.height - 4);
  g.fillText(clock(t1), c.width - 60, c.height - 4);
  g.strokeStyle = color; g.lineWidth = 2; g.beginPath();
  let prev = null;
  for (const s of pts) {  // a gap where no sample came (the super was down)
    const x = (s[0] - t0) / (t1 - t0 || 1) * c.width, y = c.height - s[index] / max * c.height;
    if (prev !== null && s[0] - prev < 5) g.lineTo(x, y); else g.moveTo(x, y);
    prev = s[0];
  }
  g.stroke();
}
function svg(tag, attrs, parent) {
  const e = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  parent.appendChild(e); return e;
}
function drawRing(st) {
  // One arc per primary segment, in ring order, each of the same angle (ids are keys or
  // hashes, not sizes); filled with its owner's color, red when suspected, with a dashed
  // outline while it receives ranges (a migration in flight).
  const pic = document.getElementById("ringpic"); pic.innerHTML = "";
  const n = st.ring.length;
  if (!n) {
    svg("text", {x: 0, y: 0, "text-anchor": "middle"}, pic).textContent = "empty ring";
    return;
  }
  st.ring.forEach((p, i) => {
    const a0 = 2 * Math.PI * i / n - Math.PI / 2, a1 = 2 * Math.PI * (i + 1) / n - Math.PI / 2;
    const R = 130, r = 80, big = a1 - a0 > Math.PI ? 1 : 0;
    const pt = (rad, a) => (rad * Math.cos(a)).toFixed(1) + " " + (rad * Math.sin(a)).toFixed(1);
    const d = n === 1
      ? "M 0 -130 A 130 130 0 1 1 -0.1 -130 L -0.1 -80 A 80 80 0 1 0 0 -80 Z"
      : "M " + pt(R, a0) + " A " + R + " " + R + " 0 " + big + " 1 " + pt(R, a1) +
        " L " + pt(r, a1) + " A " + r + " " + r + " 0 " + big + " 0 " + pt(r, a0) + " Z";
    const s = state(st, p);
    const arc = svg("path", {d: d, fill: s === "suspected" ? "#d62728" : COLORS[i % COLORS.length],
      stroke: s === "receiving" ? "#000" : "#fff", "stroke-width": s === "receiving" ? 3 : 2,
      "stroke-dasharray": s === "receiving" ? "6 4" : "none"}, pic);
    arc.dataset.name = p.name; arc.dataset.state = s;
    svg("title", {}, arc).textContent = p.name + " " + p.partition + " (" + s + ")";
    const mid = (a0 + a1) / 2;
    const label = svg("text", {x: (150 * Math.cos(mid) * 0.7).toFixed(1),
      y: (150 * Math.sin(mid) * 0.7 + 4).toFixed(1), "text-anchor": "middle",
      "font-size": 11}, pic);
    label.textContent = p.name.replace("storage:", "");
  });
  svg("text", {x: 0, y: 4, "text-anchor": "middle", "font-size": 13}, pic).textContent =
    "version " + st.version;
}
function row(body, role, name, health, cls, detail) {
  const r = body.insertRow(); r.dataset.role = role; r.dataset.name = name;
  cell(r, role); cell(r, name); cell(r, health, cls); cell(r, detail); return r;
}
function processes(st) {
  const body = document.querySelector("#processes tbody"); body.innerHTML = "";
  for (const r of st.routers || []) {
    const ok = r.connected && r.role !== "left the view";
    row(body, "router", r.name, ok ? "up" : (r.connected ? "left" : "unreachable"),
        ok ? "good" : "bad", r.role + (r.address ? " at " + r.address : ""));
  }
  for (const s of st.supers) {
    row(body, "super", s, "up", "good", s === st.coordinator ? "coordinator" : "");
  }
  const load = st.load || {};
  st.ring.forEach((p) => {
    const s = state(st, p), l = load[p.name] || {};
    row(body, "storage", p.name, s, HEALTH[s], "on the ring, id " + p.id +
        (l.ops_per_s != null ? ", " + l.ops_per_s + " ops/s" : ""));
  });
  for (const s of st.standby) row(body, "storage", s, "standby", "", "holds nothing");
  const names = st.client_names || [];
  row(body, "clients", String(st.clients), st.clients ? "at work" : "none", "",
      names.slice(0, 8).join(", ") + (names.length > 8 ? ", ..." : ""));
}
async function getJson(path) {
  const r = await fetch(path, {headers: headers()});
  const body = await r.json();
  if (!r.ok) throw new Error(body.error || r.status);
  return body;
}
async function refresh() {
  if (!token) return;
  let st, h;
  try {
    st = await getJson("/status");
    h = await getJson("/history?since=" + last);
  } catch (e) {
    document.getElementById("error").textContent = "status: " + e.message; return;
  }
  document.getElementById("error").textContent = "";
  if (!st.joined) { document.getElementById("summary").textContent = "not joined yet"; return; }
  samples = samples.concat(h.samples).filter(s => s[0] > Date.now() / 1000 - 3600);
  // Asked since the last sample: events stamped after it came last time too.
  const seen = events.length ? events[events.length - 1].t : 0;
  events = events.concat(h.events.filter(e => e.t > seen)).slice(-200);
  if (h.samples.length) last = h.samples[h.samples.length - 1][0];
  const facts = [["version", st.version], ["replication", st.replication],
    ["partitioning", st.partitioning], ["leading router", st.leader],
    ["clients", st.clients],
    ["pending", Object.keys(st.pending).join(", ") || "none"]];
  const summary = document.getElementById("summary"); summary.innerHTML = "";
  for (const [k, v] of facts) {
    const s = document.createElement("span"); s.textContent = k + ": " + v;
    s.id = "fact-" + k.replace(/ /g, "-"); summary.appendChild(s);
  }
  processes(st); drawRing(st);
  const pend = Object.entries(st.pending).map(
    ([v, w]) => "version " + v + " waits for " + w.join(", "));
  document.getElementById("pending").textContent = pend.join("; ") || "no migration in flight";
  const body = document.querySelector("#ring tbody"); body.innerHTML = "";
  const load = st.load || {};
  st.ring.forEach((p, i) => {
    const r = body.insertRow(); r.dataset.name = p.name;
    const l = load[p.name] || {}, s = state(st, p);
    cell(r, i); cell(r, p.name); cell(r, p.id); cell(r, p.partition); cell(r, s, HEALTH[s]);
    cell(r, l.ops_per_s, "num"); cell(r, l.items, "num"); cell(r, l.bytes, "num");
    cell(r, l.queued, "num"); cell(r, l.rtt_ms, "num"); cell(r, l.clients, "num");
  });
  const vbody = document.querySelector("#views tbody"); vbody.innerHTML = "";
  for (const v of st.views || []) {
    const r = vbody.insertRow(); r.dataset.name = v.name;
    cell(r, v.name); cell(r, v.maintainer); cell(r, v.position, "num");
    cell(r, v.behind, "num"); cell(r, v.staleness_s.toFixed(3), "num " + (
      v.staleness_s > 5 ? "bad" : v.staleness_s > 1 ? "warn" : "good"));
    cell(r, v.rows, "num"); cell(r, v.age_s, "num");
  }
  document.getElementById("no-views").textContent = (st.views || []).length ? "" :
    "no maintainer has reported (rubberband views maintain reports every second)";
  document.getElementById("standby").textContent = st.standby.join(", ") || "none";
  const now = samples.length ? samples[samples.length - 1] : null;
  document.getElementById("ops-now").textContent = now ? now[1].toFixed(0) : "";
  document.getElementById("rtt-now").textContent = now && now[2] != null ? now[2].toFixed(1) : "";
  draw("ops", 1, "#1f77b4"); draw("rtt", 2, "#d62728");
  const list = document.getElementById("events"); list.innerHTML = "";
  for (const e of events.slice().reverse().slice(0, 50)) {
    const d = document.createElement("div"), t = document.createElement("span");
    t.className = "t"; t.textContent = clock(e.t); d.appendChild(t);
    d.appendChild(document.createTextNode(describe(e)));
    d.className = {suspected: "bad", refused: "warn", repair_failed: "bad"}[e.what] || "";
    list.appendChild(d);
  }
}
// An argument as typed: a tuple key (a JSON array) as JSON, not joined by commas.
function shown(a) { return typeof a === "string" ? a : JSON.stringify(a); }
function describe(e) {
  const asked = e.op ? e.op + " " + (e.args || []).map(shown).join(" ") : "";
  switch (e.what) {
    case "reconfigured": return asked + ": version " + e.version;
    case "refused": return asked + " refused: " + e.error;
    case "reconfigure_timeout": return asked + ": no answer in time";
    case "repaired": return "repair " + (e.request || []).join(" ") + ": version " + e.detail;
    case "repair_failed": return "repair " + (e.request || []).join(" ") + " failed: " + e.detail;
    case "suspected": return e.process + " suspected (silent " + e.silent_s + " s)";
    case "stalled": return "this super stalled for " + e.seconds + " s";
    case "version": return "version " + e.version +
      (e.joined.length ? ": on the ring " + e.joined.join(", ") : "") +
      (e.left.length ? (e.joined.length ? ";" : ":") + " off the ring " + e.left.join(", ") : "");
    default: return e.what;
  }
}
function planText(r) {
  const what = r.op + " " + r.args.map(shown).join(" ");
  const head = r.submitted ? what + ": version " + r.version_from + " -> " + r.version
    : "dry run: " + what + " from version " + r.version_from + " (nothing changed)";
  return [head, ...(r.instructions || []).map(l => "  " + l)].join("\\n") +
    (r.lost ? "\\n  DATA LOST: some ranges had no holder left" : "");
}
// A key typed as a JSON array is a tuple key (a place among a view's rows), as the
// admin command line reads it; anything else is the text.
function jsonKey(text) {
  if (text.startsWith("[")) {
    try { return JSON.parse(text); } catch (e) { /* the text itself */ }
  }
  return text;
}
async function reconfigure(dryRun) {
  const op = document.getElementById("op").value;
  const a1 = document.getElementById("a1").value.trim();
  const a2 = document.getElementById("a2").value.trim();
  // contract takes one or more processes off the ring together (spaces or commas).
  const args = op === "contract" ? a1.split(/[\\s,]+/).filter(Boolean) : [a1];
  if (op === "replace") args.push(a2);
  else if (op !== "contract") args.push(/^-?\\d+$/.test(a2) ? Number(a2) : jsonKey(a2));
  const out = document.getElementById("result");
  const asked = op + " " + args.map(shown).join(" ");
  if (!dryRun && !confirm("Run " + asked + " on the cluster? Data moves " +
      "between storage processes; a dry run shows the plan first.")) {
    out.textContent = "not run"; return;
  }
  out.textContent = (dryRun ? "planning " : "running ") + asked + " ...";
  try {
    const r = await fetch("/reconfigure", {method: "POST", headers: headers(),
      body: JSON.stringify({op: op, args: args, dry_run: dryRun, wait: true})});
    const body = await r.json();
    out.textContent = r.ok ? planText(body) : "refused (" + r.status + "): " + body.error;
    out.dataset.status = r.status;
  } catch (e) { out.textContent = "failed: " + e.message; }
  refresh();
}
document.getElementById("plan").onclick = () => reconfigure(true);
document.getElementById("reconfigure").onsubmit = (e) => {
  e.preventDefault(); reconfigure(false);
};
setInterval(refresh, 1000); refresh();
</script>
</body></html>
"""


def _inline_hashes(tag: str) -> str:
    """CSP sources for the page's own inline ``<tag>`` blocks, by their SHA-256."""
    import base64
    import hashlib
    import re

    blocks = re.findall(rf"<{tag}>(.*?)</{tag}>", PAGE, re.S)
    return " ".join(
        f"'sha256-{base64.b64encode(hashlib.sha256(b.encode()).digest()).decode()}'" for b in blocks
    )


HEADERS = {
    "Content-Security-Policy": (
        f"default-src 'none'; script-src {_inline_hashes('script')}; "
        f"style-src {_inline_hashes('style')}; connect-src 'self'; img-src 'self' data:; "
        "frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
    ),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
"""What the console is served with: only its own script and style run, it is never
framed (clickjacking of its run button), and nothing leaves it for other sites."""
