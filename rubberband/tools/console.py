"""The administrative console (dissertation 5.5): one page, served by every super at
``/console`` of its admin address, with no build step and nothing fetched from elsewhere.

The page itself holds no data and needs no token; it asks for the admin token and then
polls ``/status`` every second with it, drawing the ring (each storage process's id,
partition, state, load and size), the standby processes, the leading router, and two
charts over the last two minutes: operations applied per second by all storage
processes together, and the slowest heartbeat round trip to a storage process.  Its
forms submit ``expand``, ``contract``, ``replace`` and ``rebalance`` to ``/reconfigure``
(with a dry run that shows the plan first).  The token stays in the browser tab's
session storage.
"""

from __future__ import annotations

PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<title>Rubberband console</title>
<style>
 body { font: 14px system-ui, sans-serif; margin: 1.2em 2em; color: #222; }
 h1 { font-size: 1.3em; margin: 0 0 .4em; }
 table { border-collapse: collapse; margin: .5em 0 1em; }
 th, td { padding: 3px 10px; border-bottom: 1px solid #ddd; text-align: left; }
 th { background: #f3f3f3; }
 td.num { text-align: right; font-variant-numeric: tabular-nums; }
 .suspected { color: #b00; font-weight: bold; }
 .busy, .incomplete { color: #b60; }
 .active { color: #070; }
 #summary span { margin-right: 1.5em; }
 .charts { display: flex; gap: 2em; }
 canvas { border: 1px solid #ccc; background: #fcfcfc; }
 form { margin: .5em 0; } input, select, button { font: inherit; margin-right: .4em; }
 pre { background: #f6f6f6; padding: .6em; max-width: 60em; white-space: pre-wrap; }
 #error { color: #b00; }
</style></head>
<body>
<h1>Rubberband console <small id="who"></small></h1>
<form id="login"><label>admin token <input id="token" type="password" size="40"></label>
<button type="submit">connect</button></form>
<div id="error"></div>
<div id="summary"></div>
<h2>Ring</h2>
<table id="ring"><thead><tr><th>#</th><th>process</th><th>id</th><th>partition</th>
<th>state</th><th>ops/s</th><th>items</th><th>bytes</th><th>queued</th><th>rtt ms</th>
</tr></thead><tbody></tbody></table>
<div>standby: <span id="standby">-</span></div>
<h2>Load</h2>
<div class="charts">
 <div>operations applied per second (all storage processes): <b id="ops-now"></b><br>
  <canvas id="ops" width="480" height="160"></canvas></div>
 <div>slowest heartbeat round trip to a storage process, ms<br>
  <canvas id="rtt" width="480" height="160"></canvas></div>
</div>
<h2>Reconfigure</h2>
<form id="reconfigure">
 <select id="op"><option>expand</option><option>contract</option><option>replace</option>
 <option>rebalance</option></select>
 <input id="a1" placeholder="process (storage:N)" size="16">
 <input id="a2" placeholder="key, or new process" size="16">
 <button type="button" id="plan">dry run</button>
 <button type="submit" id="run">run</button>
</form>
<pre id="result"></pre>
<script>
"use strict";
const history = [];  // [time, ops/s, rtt]
let token = sessionStorage.getItem("rb-token") || "";
document.getElementById("token").value = token;
document.getElementById("login").onsubmit = (e) => {
  e.preventDefault();
  token = document.getElementById("token").value.trim();
  sessionStorage.setItem("rb-token", token);
  refresh();
};
function headers() {
  return {"Authorization": "Bearer " + token, "Content-Type": "application/json"};
}
function cell(row, text, cls) {
  const td = row.insertCell(); td.textContent = text == null ? "" : text;
  if (cls) td.className = cls; return td;
}
function state(st, name) {
  if (st.busy.includes(name)) return "busy";
  if (st.incomplete.includes(name)) return "incomplete";
  return "active";
}
function draw(id, index, color) {
  const c = document.getElementById(id), g = c.getContext("2d");
  g.clearRect(0, 0, c.width, c.height);
  if (!history.length) return;
  const t1 = history[history.length - 1][0], t0 = t1 - 120;
  const max = Math.max(1, ...history.map(h => h[index] || 0)) * 1.15;
  g.fillStyle = "#888"; g.font = "11px sans-serif";
  g.fillText(max.toFixed(max < 10 ? 1 : 0), 4, 12); g.fillText("0", 4, c.height - 4);
  g.strokeStyle = color; g.lineWidth = 2; g.beginPath();
  history.forEach((h, i) => {
    const x = (h[0] - t0) / 120 * c.width, y = c.height - (h[index] || 0) / max * c.height;
    if (i) g.lineTo(x, y); else g.moveTo(x, y);
  });
  g.stroke();
}
async function refresh() {
  if (!token) return;
  let st;
  try {
    const r = await fetch("/status", {headers: headers()});
    st = await r.json();
    if (!r.ok) throw new Error(st.error || r.status);
  } catch (e) {
    document.getElementById("error").textContent = "status: " + e.message; return;
  }
  document.getElementById("error").textContent = "";
  if (!st.joined) { document.getElementById("summary").textContent = "not joined yet"; return; }
  const load = st.load || {};
  document.getElementById("summary").innerHTML = "";
  const facts = [["version", st.version], ["replication", st.replication],
    ["partitioning", st.partitioning], ["leading router", st.leader],
    ["supers", st.supers.join(", ")], ["coordinator", st.coordinator],
    ["clients", st.clients],
    ["pending", Object.keys(st.pending).join(", ") || "none"]];
  for (const [k, v] of facts) {
    const s = document.createElement("span"); s.textContent = k + ": " + v;
    s.id = "fact-" + k.replace(/ /g, "-"); document.getElementById("summary").appendChild(s);
  }
  const body = document.querySelector("#ring tbody"); body.innerHTML = "";
  let ops = 0, rtt = 0;
  st.ring.forEach((p, i) => {
    const row = body.insertRow(); row.dataset.name = p.name;
    const l = load[p.name] || {};
    const s = p.suspected ? "suspected" : state(st, p.name);
    cell(row, i); cell(row, p.name); cell(row, p.id); cell(row, p.partition);
    cell(row, s, s); cell(row, l.ops_per_s, "num"); cell(row, l.items, "num");
    cell(row, l.bytes, "num"); cell(row, l.queued, "num"); cell(row, l.rtt_ms, "num");
    ops += l.ops_per_s || 0; rtt = Math.max(rtt, l.rtt_ms || 0);
  });
  document.getElementById("standby").textContent = st.standby.join(", ") || "none";
  history.push([Date.now() / 1000, ops, rtt]);
  while (history.length && history[0][0] < Date.now() / 1000 - 120) history.shift();
  document.getElementById("ops-now").textContent = ops.toFixed(0);
  draw("ops", 1, "#1f77b4"); draw("rtt", 2, "#d62728");
}
async function reconfigure(dryRun) {
  const op = document.getElementById("op").value;
  const a1 = document.getElementById("a1").value.trim();
  const a2 = document.getElementById("a2").value.trim();
  const args = [a1];
  if (op === "replace") args.push(a2);
  else if (op !== "contract") args.push(/^-?\\d+$/.test(a2) ? Number(a2) : a2);
  const out = document.getElementById("result");
  out.textContent = (dryRun ? "planning " : "running ") + op + " " + args.join(" ") + " ...";
  try {
    const r = await fetch("/reconfigure", {method: "POST", headers: headers(),
      body: JSON.stringify({op: op, args: args, dry_run: dryRun, wait: true})});
    const body = await r.json();
    out.textContent = (r.ok ? "" : "refused (" + r.status + "): ") + JSON.stringify(body, null, 1);
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
