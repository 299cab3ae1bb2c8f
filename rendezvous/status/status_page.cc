// The status page served at / by the daemon's HTTP port. Self-contained (no
// CDN, fonts or images from elsewhere): it polls /api/status every second and
// builds the DOM with textContent only, so nothing a node reports (host
// names, tracebacks) is ever interpreted as HTML.

#include "rendezvous/status/status_http.h"

namespace meshrun::rdzv {

const std::string& StatusPageHtml() {
  static const std::string kPage = R"HTML(<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>meshrun status</title>
<style>
  :root { --fg:#1d2330; --muted:#6b7385; --line:#e3e6ec; --bg:#f5f6f8; --card:#fff;
          --ok:#1f883d; --warn:#b76e00; --bad:#cf222e; --info:#0969da; }
  * { box-sizing: border-box; }
  body { margin:0; font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;
         color:var(--fg); background:var(--bg); }
  header { display:flex; align-items:center; gap:16px; padding:14px 24px;
           background:#1d2330; color:#fff; }
  header h1 { font-size:17px; margin:0; font-weight:600; letter-spacing:.2px; }
  header .sub { color:#aab2c3; font-size:13px; }
  header .live { margin-left:auto; font-size:13px; color:#aab2c3; display:flex;
                 align-items:center; gap:8px; }
  .dot { width:9px; height:9px; border-radius:50%; background:var(--ok); display:inline-block; }
  .dot.stale { background:var(--bad); }
  main { padding:20px 24px; max-width:1200px; }
  .empty { color:var(--muted); padding:40px 0; text-align:center; }
  .run { background:var(--card); border:1px solid var(--line); border-radius:8px;
         margin-bottom:18px; overflow:hidden; }
  .run-head { display:flex; flex-wrap:wrap; align-items:center; gap:10px 22px;
              padding:12px 16px; border-bottom:1px solid var(--line); }
  .run-id { font-weight:600; font-size:15px; font-family:ui-monospace,Menlo,monospace; }
  .badge { font-size:12px; font-weight:600; padding:2px 9px; border-radius:10px;
           text-transform:uppercase; letter-spacing:.4px; }
  .badge.active { background:#dafbe1; color:var(--ok); }
  .badge.gathering { background:#fff1d6; color:var(--warn); }
  .badge.abandoned { background:#ffe1e1; color:var(--bad); }
  .badge.closed { background:#eaeef2; color:var(--muted); }
  .badge.failed { background:#ffe1e1; color:var(--bad); }
  .badge.succeeded { background:#dafbe1; color:var(--ok); }
  .stat { color:var(--muted); font-size:13px; }
  .stat b { color:var(--fg); font-size:15px; font-variant-numeric:tabular-nums; }
  .stat.hot b { color:var(--bad); }
  table { width:100%; border-collapse:collapse; }
  th, td { text-align:left; padding:7px 16px; border-bottom:1px solid var(--line);
           font-variant-numeric:tabular-nums; }
  th { font-size:12px; color:var(--muted); font-weight:600; text-transform:uppercase;
       letter-spacing:.4px; background:#fafbfc; }
  tr:last-child td { border-bottom:none; }
  td.mono { font-family:ui-monospace,Menlo,monospace; font-size:13px; }
  .age.ok { color:var(--ok); } .age.late { color:var(--warn); } .age.dead { color:var(--bad); }
  td.unhealthy { color:var(--bad); }
  .section { padding:12px 16px; border-top:1px solid var(--line); }
  .section h3 { margin:0 0 6px; font-size:12px; color:var(--muted); text-transform:uppercase;
                letter-spacing:.4px; }
  .failure { border-left:3px solid var(--bad); padding-left:12px; }
  .failure .cause { font-weight:600; color:var(--bad); }
  .failure .meta { color:var(--muted); font-size:13px; }
  pre { background:#1d2330; color:#e6e9ef; padding:10px 12px; border-radius:6px;
        overflow:auto; font-size:12px; margin:8px 0 0; max-height:260px; }
  .exits span { display:inline-block; margin:2px 6px 2px 0; padding:1px 8px;
                border-radius:10px; background:#eaeef2; font-size:12px; }
  .exits span.bad { background:#ffe1e1; color:var(--bad); }
  .exits span.stopped { background:#fff1d6; color:var(--warn); }
  .closed-reason { color:var(--muted); font-size:13px; }
</style>
</head>
<body>
<header>
  <h1>meshrun</h1><span class="sub">rendezvous daemon status</span>
  <span id="version" class="sub"></span>
  <span id="etcd" class="sub"></span>
  <span class="live"><span id="dot" class="dot"></span><span id="updated">connecting...</span></span>
</header>
<main id="runs"><div class="empty">loading...</div></main>
<script>
"use strict";
function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined && text !== null) e.textContent = String(text);
  return e;
}
function age(ms) {
  if (ms < 60000) return (ms / 1000).toFixed(1) + " s";
  if (ms < 3600000) return Math.floor(ms / 60000) + " m " + Math.floor(ms / 1000) % 60 + " s";
  return Math.floor(ms / 3600000) + " h " + Math.floor(ms / 60000) % 60 + " m";
}
function when(ms) { return ms > 0 ? new Date(ms).toISOString().replace("T", " ").slice(0, 23) + " UTC" : "-"; }
function stat(label, value, hot, field) {
  const s = el("span", "stat" + (hot ? " hot" : ""));
  s.append(label + " ");
  const b = el("b", null, value);
  if (field) b.dataset.field = field;
  s.append(b);
  return s;
}
function renderRun(run) {
  const card = el("section", "run");
  card.dataset.run = run.run_id;
  const head = el("div", "run-head");
  head.append(el("span", "run-id", run.run_id));
  const badge = run.outcome || run.state;
  const b = el("span", "badge " + badge, run.outcome ? run.state + ": " + run.outcome : run.state);
  b.dataset.field = "state";
  head.append(b);
  head.append(stat("round", run.round, false, "round"));
  head.append(stat("restarts", run.restart_count + " / " + run.max_restarts,
                   run.restart_count > 0, "restart-count"));
  head.append(stat("nodes", run.nodes.length + " (min " + run.min_nodes + ", max " + run.max_nodes + ")",
                   false, "node-count"));
  head.append(stat("world size", run.world_size, false, "world-size"));
  card.append(head);
  if (run.closed_reason) {
    const s = el("div", "section closed-reason", "closed: " + run.closed_reason);
    card.append(s);
  }
  const table = el("table");
  const hr = el("tr");
  for (const h of ["node", "host", "state", "group rank", "global ranks", "nproc", "heartbeat age"])
    hr.append(el("th", null, h));
  const thead = el("thead");
  thead.append(hr);
  table.append(thead);
  const body = el("tbody");
  for (const n of run.nodes) {
    const tr = el("tr");
    tr.dataset.node = n.node_id;
    const st = el("td", n.health ? "unhealthy" : null, n.state);
    if (n.health) { st.title = n.health; st.append(el("div", "mono", n.health)); }
    tr.append(el("td", "mono", n.node_id), el("td", "mono", n.host), st,
              el("td", null, n.group_rank >= 0 ? n.group_rank : "-"),
              el("td", null, n.ranks ? n.ranks[0] + " - " + n.ranks[1] : "-"),
              el("td", null, n.nproc));
    const cls = n.heartbeat_age_ms < 7000 ? "ok" : n.heartbeat_age_ms < 15000 ? "late" : "dead";
    const a = el("td", "age " + (run.state === "closed" ? "" : cls), age(n.heartbeat_age_ms));
    a.dataset.field = "heartbeat-age";
    tr.append(a);
    body.append(tr);
  }
  if (!run.nodes.length) {
    const tr = el("tr"); const td = el("td", "stat", "no live nodes"); td.colSpan = 7;
    tr.append(td); body.append(tr);
  }
  table.append(body);
  card.append(table);
  const f = run.last_failure;
  if (f) {
    const sec = el("div", "section");
    sec.append(el("h3", null, "last failure"));
    const box = el("div", "failure");
    box.dataset.field = "last-failure";
    const c = f.root_cause;
    if (c) {
      box.append(el("div", "cause", "rank " + c.exit.global_rank + " (local " + c.exit.local_rank +
                    ") on " + f.host + ": " + c.exit.description));
      box.append(el("div", "meta", "round " + f.round + " \u00b7 node " + f.node_id + " \u00b7 " +
                    when(c.exit.time_unix_ms)));
      if (c.message) box.append(el("div", null, c.message));
      if (c.traceback) box.append(el("pre", null, c.traceback));
    } else {
      box.append(el("div", "meta", "round " + f.round + " \u00b7 node " + f.node_id));
      box.append(el("pre", null, f.detail));
    }
    sec.append(box);
    card.append(sec);
  }
  if (run.worker_exits.length) {
    const sec = el("div", "section exits");
    sec.append(el("h3", null, "worker exits (latest round per node)"));
    for (const node of run.worker_exits) {
      const line = el("div");
      line.append(el("span", "", node.node_id + " @ " + node.host + ", round " + node.round));
      // A signal is usually meshrun stopping the survivors of a failure.
      for (const x of node.exits)
        line.append(el("span", x.signal !== 0 ? "stopped" : x.exit_code !== 0 ? "bad" : "",
                       "rank " + x.global_rank + ": " + x.description));
      sec.append(line);
    }
    card.append(sec);
  }
  if (run.slow_ranks && run.slow_ranks.length) {
    const sec = el("div", "section stragglers");
    sec.dataset.field = "slow-ranks";
    sec.append(el("h3", null, "slow ranks (their reported step times)"));
    for (const r of run.slow_ranks)
      sec.append(el("div", null, "rank " + r.rank + " on " + r.node_id + " @ " + r.host + ": " +
                    r.mean_step_ms + " ms a step, " + r.times_median + "x the median"));
    card.append(sec);
  }
  if (run.stragglers && run.stragglers.length) {
    const sec = el("div", "section stragglers");
    sec.dataset.field = "stragglers";
    sec.append(el("h3", null, "slowest replica groups (at the step quorum)"));
    for (const g of run.stragglers)
      sec.append(el("div", null, "replica group " + g.replica + ": " + g.mean_lag_ms +
                    " ms behind the first (mean), last at " + g.slowest + " of " + g.quorums));
    card.append(sec);
  }
  return card;
}
async function refresh() {
  let data;
  try {
    const r = await fetch("/api/status", {cache: "no-store"});
    if (!r.ok) throw new Error("HTTP " + r.status);
    data = await r.json();
  } catch (e) {
    document.getElementById("dot").className = "dot stale";
    document.getElementById("updated").textContent = "daemon unreachable (" + e.message + ")";
    return;
  }
  try {
    const main = document.getElementById("runs");
    main.replaceChildren();
    if (!data.runs.length) main.append(el("div", "empty", "no runs yet"));
    for (const run of data.runs) main.append(renderRun(run));
    document.getElementById("dot").className = "dot";
    document.getElementById("updated").textContent = "updated " + when(data.now_unix_ms);
    if (data.version)
      document.getElementById("version").textContent =
          data.version + " (commit " + data.commit + ")";
    const etcd = document.getElementById("etcd");
    if (data.etcd) {
      etcd.textContent = data.etcd.reachable
          ? "etcd: leading in term " + data.etcd.leader_term + " (" + data.etcd.member + ")"
          : "etcd UNREACHABLE (term " + data.etcd.leader_term + "): runs keep their round; " +
            "no new round or store write until it is back";
      etcd.style.color = data.etcd.reachable ? "" : "var(--bad)";
    }
  } catch (e) {
    document.getElementById("dot").className = "dot stale";
    document.getElementById("updated").textContent = "cannot show the status: " + e.message;
  }
}
refresh();
setInterval(refresh, 1000);
</script>
</body>
</html>
)HTML";
  return kPage;
}

}  // namespace meshrun::rdzv
