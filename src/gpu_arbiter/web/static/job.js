// Arbiter job page: one job's telemetry curves, checkpoints, events and cost, polled from
// /ui/api/jobs/ID (helpers in common.js). Curves are drawn on canvases, no chart library.
"use strict";

const POLL_MS = 5000;
const MARKS = { preemption: "#d9731a", failure: "#d8342c", "breaker trip": "#9b4fd6" };
const JOB = document.getElementById("job").dataset.job;

function drawChart(canvas, t, ys, data) {
  const width = canvas.parentElement.clientWidth - 16, height = 180;
  const dpr = window.devicePixelRatio || 1;
  canvas.width = width * dpr; canvas.height = height * dpr;
  canvas.style.width = width + "px"; canvas.style.height = height + "px";
  const ctx = canvas.getContext("2d");
  ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  ctx.clearRect(0, 0, width, height);
  ctx.font = "11px system-ui, sans-serif"; ctx.textBaseline = "middle"; ctx.fillStyle = "#6b7385";
  const points = t.map((x, i) => [x, ys[i]]).filter(([, y]) => y != null);
  canvas.dataset.points = points.length;
  if (!points.length) { ctx.fillText("no reports yet", 10, height / 2); return; }
  const t0 = Math.min(t[0], ...data.checkpoints.map((c) => c.at)), t1 = Math.max(t[t.length - 1], t0 + 1);
  let lo = Math.min(...points.map((p) => p[1])), hi = Math.max(...points.map((p) => p[1]));
  if (hi === lo) { hi += Math.abs(hi) * 0.1 || 1; lo -= Math.abs(lo) * 0.1 || 0; }
  const L = 52, R = width - 10, T = 14, B = height - 22;
  const x = (v) => L + (R - L) * (v - t0) / (t1 - t0);
  const y = (v) => B - (B - T) * (v - lo) / (hi - lo);
  ctx.strokeStyle = "#e1e4ea";
  for (const v of [lo, (lo + hi) / 2, hi]) {
    ctx.beginPath(); ctx.moveTo(L, y(v)); ctx.lineTo(R, y(v)); ctx.stroke();
    ctx.fillText(Number(v.toPrecision(3)).toLocaleString(), 4, y(v));
  }
  ctx.fillText(clock(t0), L, B + 12); ctx.fillText(clock(t1), R - 60, B + 12);
  ctx.setLineDash([4, 3]); ctx.strokeStyle = "#2fa36b";
  for (const c of data.checkpoints) {
    if (c.at < t0 || c.at > t1) continue;
    ctx.beginPath(); ctx.moveTo(x(c.at), T); ctx.lineTo(x(c.at), B); ctx.stroke();
  }
  ctx.setLineDash([]);
  for (const e of data.events) {
    if (!(e.kind in MARKS) || e.at < t0 || e.at > t1) continue;
    ctx.fillStyle = MARKS[e.kind]; ctx.beginPath(); ctx.arc(x(e.at), T - 6, 4, 0, 2 * Math.PI); ctx.fill();
  }
  ctx.strokeStyle = "#1f4fd1"; ctx.lineWidth = 1.5; ctx.beginPath();
  points.forEach(([a, b], i) => (i ? ctx.lineTo(x(a), y(b)) : ctx.moveTo(x(a), y(b))));
  ctx.stroke(); ctx.lineWidth = 1;
}

function render(d) {
  const j = d.job;
  $("j-name").textContent = j.name;
  $("j-state").textContent = j.state;
  const alloc = j.allocation ? Object.keys(j.allocation.nodes).join(", ") + ` (${j.allocation.gpu_type})` : "–";
  const facts = [
    ["team", esc(j.team)], ["tier", tierBadge(j.tier, j.tier_requested)], ["GPUs", j.gpus],
    ["nodes", esc(alloc)], ["submitted", clock(j.submitted_at)],
    ["running since", j.started_at ? `${clock(j.started_at)} (${dur(d.now - j.started_at)})` : "–"],
    ["restarts", j.restarts], ["command", `<code>${esc(j.command)}</code>`],
  ];
  if (j.reason) facts.push(["note", esc(j.reason)]);
  $("facts").innerHTML = facts.map(([k, v]) => `<div><dt>${k}</dt><dd>${v}</dd></div>`).join("");
  $("n-preemptions").textContent = d.counts.preemptions;
  $("n-failures").textContent = d.counts.failures;
  $("n-breaker-trips").textContent = d.counts.breaker_trips;
  $("n-checkpoints").textContent = d.counts.checkpoints;
  $("n-cost").textContent = num(d.cost.total);
  const tl = d.telemetry;
  for (const key of ["loss", "tokens_per_s", "io_wait_share"]) drawChart($("chart-" + key), tl.t, tl[key], d);
  $("telemetry-summary").textContent = tl.t.length
    ? `${tl.t.length} reports, last step ${tl.step[tl.step.length - 1] ?? "–"} at ${clock(tl.t[tl.t.length - 1])}` : "no reports yet";
  $("events").tBodies[0].innerHTML = d.events.slice().reverse().map((e) =>
    `<tr data-kind="${esc(e.kind)}"><td>${clock(e.at)}</td><td><b class="ev ${esc(e.kind.replace(" ", "-"))}">${esc(e.kind)}</b></td><td>${esc(e.actor)}</td><td>${esc(e.reason)}</td></tr>`
  ).join("") || `<tr><td colspan="4" class="muted">Nothing yet.</td></tr>`;
  $("checkpoints").tBodies[0].innerHTML = d.checkpoints.slice().reverse().map((c) =>
    `<tr><td>${clock(c.at)}</td><td class="num">${c.step ?? "–"}</td></tr>`
  ).join("") || `<tr><td colspan="2" class="muted">No checkpoint reported.</td></tr>`;
  const open = d.cost.accruing > 0
    ? [`<tr data-kind="accruing"><td>now</td><td>running</td><td>open segment, ${num(d.cost.rate)} credits / h</td><td></td><td class="num">${num(d.cost.accruing)}</td></tr>`] : [];
  $("cost").tBodies[0].innerHTML = open.concat(d.cost.entries.slice().reverse().map((e) =>
    `<tr data-kind="${esc(e.kind)}"><td>${clock(e.at)}</td><td>${esc(e.kind)}</td><td>${esc(e.reason)}</td><td class="num">${num(e.gpu_hours, 3)}</td><td class="num">${e.kind === "refund" ? "−" : ""}${num(e.credits)}</td></tr>`
  )).join("") || `<tr><td colspan="5" class="muted">Nothing charged yet.</td></tr>`;
  $("cost-summary").textContent = `${num(d.cost.total)} credits: ${num(d.cost.charged)} charged, ${num(d.cost.accruing)} accruing`;
  $("s-updated").textContent = new Date().toLocaleTimeString();
}

async function refresh() {
  if (document.hidden) return;
  try {
    render(await api("/ui/api/jobs/" + encodeURIComponent(JOB)));
    document.body.dataset.loaded = "1";
  } catch (e) {
    if (e instanceof AuthError) return showLogin(e.message === "no token" ? "" : e.message);
    $("s-updated").textContent = "failed: " + e.message;
  }
}

setupLogin(refresh);
refresh();
setInterval(refresh, POLL_MS);
