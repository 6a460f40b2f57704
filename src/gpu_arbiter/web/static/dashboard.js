// Arbiter dashboard: polls the /ui/api/ JSON views and draws them (helpers in common.js).
// The heat map is one <canvas>: a fillRect per GPU, so 10,000 GPUs draw in a few ms.
"use strict";

const COLORS = {
  "0": "#d9dee7", "1": "#1f4fd1", "2": "#2fa36b", "3": "#e0a21b",
  "b": "#9b4fd6", "h": "#7fb3ff", "x": "#d8342c", "c": "#555c6b",
};
const EVENT_COLORS = { failure: "#d8342c", preemption: "#d9731a", cordon: "#555c6b", recovery: "#2fa36b" };
const POLL_MS = 2000;
const TIMELINE_MS = 10000;

// -- heat map -------------------------------------------------------------------------------

const heat = { data: null, panels: [], cell: 10 };

function layoutHeatmap(data, width) {
  const total = data.gpus;
  const cell = total <= 512 ? 20 : total <= 2048 ? 10 : total <= 6000 ? 7 : 5;
  const step = cell + 1;
  const rowsPerCol = 32;
  const panels = [];
  let x = 0, y = 0, rowH = 0;
  for (const rack of data.racks) {
    const width8 = Math.max(...rack.nodes.map((n) => n.cells.length), 1);
    const cols = Math.ceil(rack.nodes.length / rowsPerCol);
    const rows = Math.min(rack.nodes.length, rowsPerCol);
    const colW = width8 * step + 4;
    const w = Math.max(cols * colW, 44) + 10;
    const h = 16 + rows * step + 8;
    if (x + w > width && x > 0) { x = 0; y += rowH; rowH = 0; }
    panels.push({ rack, x, y, w, h, colW, rowsPerCol, step, cell });
    x += w; rowH = Math.max(rowH, h);
  }
  return { panels, height: y + rowH, cell };
}

function drawHeatmap(data) {
  const t0 = performance.now();
  const canvas = $("heatmap");
  const width = canvas.parentElement.clientWidth || 1200;
  const { panels, height, cell } = layoutHeatmap(data, width);
  const dpr = window.devicePixelRatio || 1;
  canvas.width = width * dpr; canvas.height = Math.max(height, 20) * dpr;
  canvas.style.width = width + "px"; canvas.style.height = Math.max(height, 20) + "px";
  const ctx = canvas.getContext("2d");
  ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  ctx.clearRect(0, 0, width, height);
  ctx.font = "11px system-ui, sans-serif";
  ctx.textBaseline = "top";
  for (const p of panels) {
    ctx.fillStyle = "#6b7385";
    ctx.fillText(p.rack.name, p.x + 2, p.y + 1, p.w - 6);
    p.rack.nodes.forEach((node, i) => {
      const col = Math.floor(i / p.rowsPerCol), row = i % p.rowsPerCol;
      const nx = p.x + 2 + col * p.colW, ny = p.y + 16 + row * p.step;
      const cells = node.cells;
      for (let g = 0; g < cells.length; g++) {
        ctx.fillStyle = COLORS[cells[g]] || "#000";
        ctx.fillRect(nx + g * p.step, ny, cell, cell);
      }
    });
  }
  heat.data = data; heat.panels = panels; heat.cell = cell;
  const ms = performance.now() - t0;
  canvas.dataset.gpus = data.gpus;
  canvas.dataset.nodes = data.nodes;
  canvas.dataset.racks = data.racks.length;
  canvas.dataset.counts = JSON.stringify(data.counts);
  canvas.dataset.drawMs = ms.toFixed(2);
  return ms;
}

function hitHeatmap(mx, my) {
  for (const p of heat.panels) {
    if (mx < p.x || mx >= p.x + p.w || my < p.y + 16 || my >= p.y + p.h) continue;
    const col = Math.floor((mx - p.x - 2) / p.colW);
    const row = Math.floor((my - p.y - 16) / p.step);
    const g = Math.floor((mx - p.x - 2 - col * p.colW) / p.step);
    const node = p.rack.nodes[col * p.rowsPerCol + row];
    if (!node || row >= p.rowsPerCol || g < 0 || g >= node.cells.length) return null;
    return { rack: p.rack.name, node, g };
  }
  return null;
}

function tipFor(hit) {
  const { node, g, rack } = hit;
  const code = node.cells[g];
  const free = [...node.cells].filter((c) => c === "0").length;
  const lines = [
    `node ${node.name} (${rack}, ${node.cells.length} × ${node.gpu_type}, ${free} free)`,
    `GPU ${g}: ${heat.data.legend[code]}`,
  ];
  if (node.state !== "up") lines.push(`node ${node.state}: ${node.reason || "no reason given"}`);
  for (const j of node.jobs) {
    if (!j.gpus.includes(g)) continue;
    const who = j.id ? `${j.id} of ${j.team}` : "a job of another team";
    lines.push(`${who}, tier ${j.tier}${j.borrowed ? ", borrowed" : ""}${j.preempting ? ", stopping" : ""}`);
  }
  return lines.join("\n");
}

function setupHeatmapHover() {
  const canvas = $("heatmap"), tip = $("tip");
  canvas.addEventListener("mousemove", (ev) => {
    const r = canvas.getBoundingClientRect();
    const hit = heat.data && hitHeatmap(ev.clientX - r.left, ev.clientY - r.top);
    if (!hit) { tip.hidden = true; return; }
    tip.textContent = tipFor(hit);
    const card = canvas.closest(".card").getBoundingClientRect();
    tip.style.left = (ev.clientX - card.left + 14) + "px";
    tip.style.top = (ev.clientY - card.top + 14) + "px";
    tip.hidden = false;
  });
  canvas.addEventListener("mouseleave", () => { tip.hidden = true; });
}

// Tiers are counted with their borrowed GPUs, which the map colours as borrowed.
function renderLegend(data) {
  $("legend").innerHTML = Object.entries(data.legend)
    .map(([code, name]) => {
      const n = code in data.by_tier ? data.by_tier[code] : data.counts[name];
      const note = code === "b" ? ` <span class="note">(in their tiers' counts)</span>` : "";
      return `<span data-cell="${code}"><i style="background:${COLORS[code]}"></i>${esc(name)} <b>${n}</b>${note}</span>`;
    })
    .join("");
}

function renderSummary(h, q, t) {
  if (h) {
    $("s-gpus").textContent = h.gpus.toLocaleString();
    $("s-util").textContent = (100 * h.utilisation).toFixed(0) + " %";
    $("s-free").textContent = h.counts.free.toLocaleString();
    $("s-failed").textContent = (h.counts.failed + h.counts.cordoned).toLocaleString();
  }
  if (q) $("s-pending").textContent = q.pending.toLocaleString();
  if (t) $("s-burn").textContent = num(t.teams.reduce((a, x) => a + x.burn_rate, 0), 1);
  $("s-updated").textContent = new Date().toLocaleTimeString();
}

// -- queue and teams ------------------------------------------------------------------------

function renderQueue(q) {
  const rows = q.jobs.map((j) => `<tr data-job="${esc(j.id)}" data-team="${esc(j.team)}" data-tier="${j.tier}" data-reason="${esc(j.reason)}">
    <td class="num">${j.position}</td>
    <td><b>${jobLink(j.id)}</b> ${esc(j.name)}</td>
    <td>${esc(j.team)}</td>
    <td>${tierBadge(j.tier, j.tier_requested)}</td>
    <td>${j.gpus} × ${esc(j.gpu_types.join("/"))}</td>
    <td class="num">${dur(j.wait_s)}</td>
    <td><span class="why ${esc(j.reason)}">${esc(j.reason)}</span>${esc(j.why)}${j.note ? `<div class="note">${esc(j.note)}${j.preemptions ? ` · preempted ${j.preemptions}×` : ""}</div>` : ""}</td>
  </tr>`);
  $("queue").tBodies[0].innerHTML = rows.join("") || `<tr><td colspan="7" class="muted">Nothing is waiting.</td></tr>`;
  const reasons = Object.entries(q.by_reason).map(([k, v]) => `${v} ${k}`).join(", ");
  const others = q.other_teams ? ` · ${q.other_teams} of other teams` : "";
  const cut = q.shown < q.pending - q.other_teams ? ` · first ${q.shown} shown` : "";
  $("queue-summary").textContent = `${q.pending} waiting${reasons ? " (" + reasons + ")" : ""}${others}${cut}`;
}

function renderRunning(r) {
  const rows = r.jobs.map((j) => `<tr data-job="${esc(j.id)}" data-team="${esc(j.team)}" data-tier="${j.tier}">
    <td><b>${jobLink(j.id)}</b> ${esc(j.name)}</td>
    <td>${esc(j.team)}</td>
    <td>${tierBadge(j.tier, j.tier_requested)}${j.borrowed ? ' <span class="note">borrowed</span>' : ""}${j.preempting ? ' <span class="note">stopping</span>' : ""}</td>
    <td>${j.gpus} × ${esc(j.gpu_type)}</td>
    <td>${esc(j.nodes.join(", "))}</td>
    <td>${clock(j.since)} <span class="note">${dur(j.running_s)}</span></td>
    <td class="num" data-field="cost">${num(j.cost)} <span class="note">${num(j.rate)} / h</span></td>
  </tr>`);
  $("running").tBodies[0].innerHTML = rows.join("") || `<tr><td colspan="7" class="muted">Nothing is running.</td></tr>`;
  const others = r.other_teams ? ` · ${r.other_teams} of other teams` : "";
  $("running-summary").textContent = `${r.running} running${others} · costs in credits`;
}

function renderTeams(t) {
  const rows = t.teams.map((x) => {
    const used = Object.entries(x.gpus_used).map(([k, v]) => `${v} ${k}`).join(", ") || "0";
    const quota = Object.entries(x.quota).map(([k, v]) => `${v} ${k}`).join(", ") || "none";
    let budget;
    if (x.budget != null) {
      const share = x.budget_used ?? 0;
      budget = `<span class="bar${share > 1 ? " over" : ""}"><span style="width:${Math.min(100, 100 * share).toFixed(1)}%"></span></span>`
        + `${num(x.spent_period)} / ${num(x.budget, 0)} credits (${(100 * share).toFixed(0)} %)`;
    } else {
      budget = `${num(x.spent_period)} credits <span class="note">no budget</span>`;
    }
    return `<tr data-team="${esc(x.team)}">
      <td><b>${esc(x.team)}</b> <span class="note">weight ${x.weight}</span></td>
      <td>${esc(used)} <span class="note">quota ${esc(quota)}</span></td>
      <td class="num" data-field="burn">${num(x.burn_rate)} <span class="note">${num(x.burn_money)} ${esc(t.currency)}</span></td>
      <td data-field="spent">${budget}</td>
      <td class="num">${num(x.gpu_hours_period, 3)}</td>
      <td class="num" data-field="per-useful">${num(x.cost_per_useful_gpu_hour)}</td>
    </tr>`;
  });
  $("teams").tBodies[0].innerHTML = rows.join("") || `<tr><td colspan="6" class="muted">No teams.</td></tr>`;
  $("teams-summary").textContent = `credits; 1 credit = ${t.credit_value} ${t.currency}`;
}

// -- timeline -------------------------------------------------------------------------------

function drawTimeline(tl) {
  const canvas = $("timeline");
  const width = canvas.parentElement.clientWidth - 32, height = 220;
  const dpr = window.devicePixelRatio || 1;
  canvas.width = width * dpr; canvas.height = height * dpr;
  canvas.style.width = width + "px"; canvas.style.height = height + "px";
  const ctx = canvas.getContext("2d");
  ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  const L = 40, R = width - 40, T = 24, B = height - 24;
  const x = (t) => L + (R - L) * (t - tl.start) / (tl.end - tl.start);
  const y = (v) => B - (B - T) * v;
  ctx.textBaseline = "top";
  ctx.font = "11px system-ui, sans-serif"; ctx.fillStyle = "#6b7385"; ctx.strokeStyle = "#e1e4ea";
  for (const v of [0, 0.25, 0.5, 0.75, 1]) {
    ctx.beginPath(); ctx.moveTo(L, y(v)); ctx.lineTo(R, y(v)); ctx.stroke();
    ctx.fillText((v * 100) + " %", 4, y(v) - 6);
  }
  for (let i = 0; i <= 4; i++) {
    const t = tl.start + (tl.end - tl.start) * i / 4;
    const fmt = tl.end - tl.start < 600 ? { minute: "2-digit", second: "2-digit" } : { hour: "2-digit", minute: "2-digit" };
    ctx.fillText(new Date(t * 1000).toLocaleTimeString([], fmt), x(t) - 14, B + 8);
  }
  // Utilisation as a filled area, goodput as a line on it: the gap between them is lost work.
  ctx.fillStyle = "rgba(31, 79, 209, 0.18)"; ctx.beginPath(); ctx.moveTo(x(tl.t[0]), y(0));
  tl.t.forEach((t, i) => ctx.lineTo(x(t), y(tl.utilisation[i])));
  ctx.lineTo(x(tl.t[tl.t.length - 1]), y(0)); ctx.closePath(); ctx.fill();
  const line = (key, color, w) => {
    ctx.strokeStyle = color; ctx.lineWidth = w; ctx.beginPath();
    tl.t.forEach((t, i) => (i ? ctx.lineTo(x(t), y(tl[key][i])) : ctx.moveTo(x(t), y(tl[key][i]))));
    ctx.stroke(); ctx.lineWidth = 1;
  };
  line("utilisation", "#1f4fd1", 1);
  line("goodput", "#2fa36b", 2);
  for (const e of tl.events) {
    ctx.strokeStyle = EVENT_COLORS[e.kind]; ctx.globalAlpha = 0.7;
    ctx.beginPath(); ctx.moveTo(x(e.at), T); ctx.lineTo(x(e.at), B); ctx.stroke();
    ctx.globalAlpha = 1; ctx.fillStyle = EVENT_COLORS[e.kind];
    ctx.beginPath(); ctx.arc(x(e.at), T, 3.5, 0, 2 * Math.PI); ctx.fill();
  }
  let lx = L;
  for (const [label, color] of [["utilisation", "#1f4fd1"], ["goodput", "#2fa36b"], ["preemption", EVENT_COLORS.preemption], ["failure", EVENT_COLORS.failure], ["cordon", EVENT_COLORS.cordon]]) {
    ctx.fillStyle = color; ctx.fillRect(lx, 4, 10, 10);
    ctx.fillStyle = "#1d2330"; ctx.fillText(label, lx + 14, 4);
    lx += ctx.measureText(label).width + 30;
  }
  canvas.dataset.events = tl.events.length;
  canvas.dataset.start = tl.start;
  $("timeline-since").textContent = tl.start > tl.end - $("window").value + 1 ? "since the service began, " + clock(tl.start) : "";
  const recent = tl.events.slice(-12).reverse();
  const subject = (e) => (e.action.startsWith("node") ? esc(e.subject) : jobLink(e.subject));
  $("events").innerHTML = recent.map((e) =>
    `<li data-subject="${esc(e.subject)}">${clock(e.at)} <b class="${e.kind}">${e.kind}</b> ${subject(e)}${e.reason ? ": " + esc(e.reason) : ""}</li>`
  ).join("") || `<li class="muted">No preemptions or failures in this window.</li>`;
}

// -- polling --------------------------------------------------------------------------------

async function refresh() {
  if (document.hidden) return;
  try {
    const [h, r, q, t] = await Promise.all(
      [api("/ui/api/heatmap"), api("/ui/api/running"), api("/ui/api/queue"), api("/ui/api/teams")]);
    renderLegend(h); drawHeatmap(h); renderRunning(r); renderQueue(q); renderTeams(t); renderSummary(h, q, t);
    document.body.dataset.loaded = "1";
  } catch (e) {
    if (e instanceof AuthError) return showLogin(e.message === "no token" ? "" : e.message);
    $("s-updated").textContent = "failed: " + e.message;
  }
}

async function refreshTimeline() {
  if (document.hidden || !token()) return;
  try {
    drawTimeline(await api("/ui/api/timeline?window=" + $("window").value));
  } catch (e) {
    if (!(e instanceof AuthError)) console.warn(e);
  }
}

function start() {
  setupHeatmapHover();
  setupLogin(() => { refresh(); refreshTimeline(); });
  $("window").addEventListener("change", refreshTimeline);
  window.addEventListener("resize", () => heat.data && drawHeatmap(heat.data));
  refresh(); refreshTimeline();
  setInterval(refresh, POLL_MS);
  setInterval(refreshTimeline, TIMELINE_MS);
  window.arbiter = { redraw: () => heat.data && drawHeatmap(heat.data) };
}

start();
