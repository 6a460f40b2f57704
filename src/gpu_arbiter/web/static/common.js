// Arbiter dashboard pages: the token, API calls, the sign-in form and formatting, shared by
// dashboard.js and job.js. No framework, no CDN.
"use strict";

const $ = (id) => document.getElementById(id);

function token() {
  const m = location.hash.match(/token=([^&]+)/);
  if (m) {
    localStorage.setItem("arbiterToken", decodeURIComponent(m[1]));
    history.replaceState(null, "", location.pathname + location.search);
  }
  return localStorage.getItem("arbiterToken");
}

class AuthError extends Error {}

async function api(path) {
  const t = token();
  if (!t) throw new AuthError("no token");
  const r = await fetch(path, { headers: { Authorization: "Bearer " + t } });
  if (r.status === 401) throw new AuthError((await r.json()).detail);
  if (!r.ok) throw new Error(path + ": HTTP " + r.status);
  return r.json();
}

function esc(s) {
  return String(s ?? "").replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
}

function dur(s) {
  if (s < 90) return Math.round(s) + " s";
  if (s < 5400) return (s / 60).toFixed(1) + " min";
  if (s < 172800) return (s / 3600).toFixed(1) + " h";
  return (s / 86400).toFixed(1) + " d";
}

function num(x, digits = 2) {
  return x == null ? "–" : x.toLocaleString(undefined, { minimumFractionDigits: digits, maximumFractionDigits: digits });
}

function clock(t) {
  return new Date(t * 1000).toLocaleTimeString();
}

function tierBadge(tier, asked) {
  const capped = asked !== tier ? ` <span class="note">(asked ${asked})</span>` : "";
  return `<span class="badge tier${tier}">tier ${tier}</span>${capped}`;
}

function jobLink(id) {
  return `<a href="/jobs/${encodeURIComponent(id)}">${esc(id)}</a>`;
}

async function whoami() {
  const me = await api("/v1/whoami");
  $("who").innerHTML = `${esc(me.team ? "team " + me.team : me.role)} <button id="logout">sign out</button>`;
  $("logout").onclick = () => { localStorage.removeItem("arbiterToken"); location.reload(); };
  if (me.role === "admin") {
    // The cluster's own history as a trace (GET /v1/history), for `arbiter whatif`.
    $("who").insertAdjacentHTML("afterbegin", '<a href="/v1/history" id="export-history">export history</a> ');
    $("export-history").onclick = async (ev) => {
      ev.preventDefault();
      const r = await fetch("/v1/history", { headers: { Authorization: "Bearer " + token() } });
      const link = document.createElement("a");
      link.href = URL.createObjectURL(await r.blob());
      link.download = "arbiter-history.jsonl";
      link.click();
      URL.revokeObjectURL(link.href);
    };
  }
}

// The sign-in form stands in for the page until a token works; `onSignIn` loads the page.
function showLogin(message) {
  $("login").hidden = false;
  document.body.dataset.signin = "1";
  $("login-error").textContent = message || "";
}

function setupLogin(onSignIn) {
  $("login").addEventListener("submit", (ev) => {
    ev.preventDefault();
    localStorage.setItem("arbiterToken", $("token").value.trim());
    $("login").hidden = true;
    delete document.body.dataset.signin;
    whoami().catch(() => {});
    onSignIn();
  });
  if (!token()) showLogin("");
  else whoami().catch(() => {});
}
