// The fairsched dashboard. Everything shown is built with textContent: a payload or an
// error holding markup shows as the text it is. The token is kept in sessionStorage and
// sent in the Authorization header, never in a cookie or a URL.
"use strict";

const TOKEN_KEY = "fairsched-web-token";
const POLL_MS = 5000; // the queue and the jobs; sooner when a queued job starts or ends
const SOONEST_MS = 1000;
const CHART_MS = 15000;
const $ = (id) => document.getElementById(id);
let following = null; // AbortController of the slots' stream
let chart = null;
let lastJobs = "";
let runningKey = null; // the queued jobs on the slots, as of the last frame
let lastRefresh = 0;
let refreshTimer = null;

function el(tag, text, cls) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  if (cls) node.className = cls;
  return node;
}

function token() { return sessionStorage.getItem(TOKEN_KEY) || ""; }

function headers() {
  const t = token();
  return t ? { Authorization: "Bearer " + t } : {};
}

function refused(yes) { $("refused").hidden = !yes; }

function setStatus(text, cls) {
  const s = $("status");
  s.textContent = text;
  s.className = "status " + (cls || "");
}

function notice(text) {
  const n = $("notice");
  n.textContent = text;
  n.hidden = !text;
}

async function api(path, options) {
  const resp = await fetch(path, Object.assign({ headers: headers(), cache: "no-store" }, options || {}));
  if (resp.status === 401) refused(true);
  let body = null;
  try { body = await resp.json(); } catch (e) { body = null; }
  if (!resp.ok) {
    const message = body && body.error ? body.error : resp.status + " " + resp.statusText;
    throw Object.assign(new Error(message), { status: resp.status });
  }
  if (options && options.method === "POST") refused(false); // reads may need no token
  return body;
}

async function act(path, question) {
  if (!window.confirm(question)) return;
  try {
    const answer = await api(path, { method: "POST" });
    notice(question.replace(/\?$/, "") + ": done" + (answer.status ? " (" + answer.status + ")" : ""));
  } catch (e) {
    notice(question.replace(/\?$/, "") + ": " + e.message);
  }
  refreshJobs();
  if (location.pathname.startsWith("/job/")) showJob();
}

// -- formats ----------------------------------------------------------------------------------

function duration(s) {
  if (s === null || s === undefined) return "-";
  if (s < 60) return s.toFixed(1) + "s";
  if (s < 3600) return Math.floor(s / 60) + "m" + String(Math.floor(s % 60)).padStart(2, "0") + "s";
  if (s < 86400) return Math.floor(s / 3600) + "h" + String(Math.floor((s % 3600) / 60)).padStart(2, "0") + "m";
  return Math.floor(s / 86400) + "d" + Math.floor((s % 86400) / 3600) + "h";
}

function bytes(n) {
  if (n === null || n === undefined) return "-";
  const units = ["B", "K", "M", "G"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return (i ? n.toFixed(1) : String(n)) + units[i];
}

function json(value) { return value === undefined ? "null" : JSON.stringify(value, null, 2); }

// -- the slots, live ---------------------------------------------------------------------------

function showSlots(ps) {
  const sup = ps.supervisor;
  $("supervisor").textContent = "pid " + sup.pid + " \u00b7 fairsched " + sup.version + " \u00b7 up " +
    duration(sup.uptime) + (sup.shutting_down ? " \u00b7 shutting down" : "") +
    (sup.database_connected ? "" : " \u00b7 database not connected");
  const body = el("tbody");
  let busy = 0;
  for (const s of ps.slots) {
    const tr = el("tr");
    tr.dataset.worker = s.worker;
    tr.dataset.slot = s.slot;
    tr.dataset.state = s.state;
    if (s.job_id !== null) tr.dataset.jobId = s.job_id;
    if (s.state === "busy") busy++;
    tr.append(el("td", s.worker), el("td", s.slot, "num"), el("td", s.pid === null ? "-" : s.pid, "num pid"),
      el("td", s.types.join(", ")), el("td", s.state, "state-" + s.state));
    const job = el("td");
    if (s.job_id !== null) {
      if (typeof s.job_id === "number") {
        const a = el("a", s.job_id);
        a.href = "/job/" + s.job_id;
        job.append(a);
      } else {
        job.append(el("span", s.job_id));
      }
      job.append(el("span", " " + (s.job_type || ""), "muted"));
    } else {
      job.textContent = "-";
    }
    const progress = el("td");
    if (s.progress !== null && s.progress !== undefined) {
      const bar = el("span", null, "bar");
      const fill = el("span");
      fill.style.width = Math.round(Math.max(0, Math.min(1, s.progress)) * 100) + "%";
      bar.append(fill);
      progress.append(bar, el("span", Math.round(s.progress * 100) + "%" + (s.message ? " " + s.message : "")));
    } else {
      progress.textContent = "-";
    }
    tr.append(job, el("td", duration(s.job_age), "num"), progress, el("td", bytes(s.rss), "num"));
    body.append(tr);
  }
  $("slots").querySelector("tbody").replaceWith(body);
  const key = ps.slots.filter((s) => typeof s.job_id === "number").map((s) => s.job_id).sort().join(",");
  if (runningKey !== null && key !== runningKey) refreshSoon();
  runningKey = key;
  $("slot-summary").textContent = busy + " of " + ps.slots.length + " busy";
  const groups = $("groups");
  const names = Object.keys(sup.groups);
  if (groups.dataset.names !== names.join("\n")) {
    groups.replaceChildren();
    for (const name of names) {
      const b = el("button", "Restart " + name, "danger");
      b.dataset.group = name;
      b.addEventListener("click", () => act("/api/workers/" + encodeURIComponent(name) + "/restart",
        "Restart every process of group " + name + "?"));
      groups.append(b);
    }
    groups.dataset.names = names.join("\n");
  }
}

async function follow() {
  if (following) following.abort();
  const control = new AbortController();
  following = control;
  while (!control.signal.aborted) {
    try {
      const resp = await fetch("/api/ps/stream", { headers: headers(), signal: control.signal, cache: "no-store" });
      if (resp.status === 401) {
        refused(true);
        setStatus("refused", "down");
        return; // until a token is given
      }
      if (!resp.ok) throw new Error(resp.status + " " + resp.statusText);
      setStatus("live", "live");
      const reader = resp.body.getReader();
      const decoder = new TextDecoder();
      let buffer = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffer += decoder.decode(value, { stream: true });
        let end;
        while ((end = buffer.indexOf("\n\n")) >= 0) {
          const block = buffer.slice(0, end);
          buffer = buffer.slice(end + 2);
          const data = block.split("\n").filter((l) => l.startsWith("data: ")).map((l) => l.slice(6)).join("\n");
          if (data) showSlots(JSON.parse(data));
        }
      }
    } catch (e) {
      if (control.signal.aborted) return;
    }
    setStatus("disconnected", "down");
    await new Promise((r) => setTimeout(r, 1000));
  }
}

// The queue and the jobs, read again: at once if the last reading is a second old, else
// a second after it (a busy queue changes the slots at every frame).
function refreshSoon() {
  if (refreshTimer !== null) return;
  refreshTimer = setTimeout(() => {
    refreshTimer = null;
    refreshQueue();
  }, Math.max(0, lastRefresh + SOONEST_MS - Date.now()));
}

function refreshQueue() {
  lastRefresh = Date.now();
  refreshCounts();
  refreshJobs();
}

// -- the queue and its last hour -----------------------------------------------------------------

async function refreshCounts() {
  let rows;
  try { rows = await api("/api/counts"); } catch (e) { return; }
  const body = el("tbody");
  for (const r of rows) {
    const tr = el("tr");
    tr.dataset.type = r.type;
    tr.append(el("td", r.type), el("td", r.pending, "num"), el("td", r.delayed, "num"),
      el("td", r.running, "num"), el("td", r.failed, "num"), el("td", duration(r.oldest_wait), "num"));
    body.append(tr);
  }
  $("queue").querySelector("tbody").replaceWith(body);
}

const COLOURS = ["#2f5fd0", "#1f7a3a", "#9a6700", "#7b3fb0", "#00838f", "#c2185b", "#5d4037", "#3f51b5"];

async function refreshChart() {
  let h;
  try { h = await api("/api/history"); } catch (e) { return; }
  const types = Object.keys(h.types).sort();
  const series = [{}];
  const data = [h.minutes];
  types.forEach((t, i) => {
    const counts = h.types[t];
    series.push({ label: t + " submitted", stroke: COLOURS[i % COLOURS.length], width: 1.5, points: { show: false } });
    data.push(counts.submitted || h.minutes.map(() => 0));
  });
  const finished = h.minutes.map((_, i) => types.reduce((sum, t) =>
    sum + Object.entries(h.types[t]).filter(([w]) => w !== "submitted").reduce((s, [, c]) => s + c[i], 0), 0));
  const failed = h.minutes.map((_, i) => types.reduce((sum, t) => sum + ((h.types[t].failed || [])[i] || 0), 0));
  series.push({ label: "finished", stroke: "#6b7385", width: 1.5, dash: [6, 4], points: { show: false } });
  data.push(finished);
  series.push({ label: "failed", stroke: "#b3261e", width: 1.5, dash: [2, 3], points: { show: false } });
  data.push(failed);
  const box = $("chart");
  const width = Math.max(320, box.clientWidth || 800);
  const key = series.map((s) => s.label).join("\n");
  if (chart && chart.key === key) {
    chart.setData(data);
    return;
  }
  if (chart) chart.destroy();
  if (typeof uPlot === "undefined") return;
  chart = new uPlot({ width: width, height: 220, series: series, scales: { x: { time: true } },
    axes: [{}, { label: "jobs / min" }] }, data, box);
  chart.key = key;
}

// -- jobs: the dead letters, or any status ------------------------------------------------------

function jobActions(job) {
  const box = el("div", null, "actions");
  if (job.status === "failed" || job.status === "cancelled") {
    const b = el("button", "Retry");
    b.dataset.action = "retry";
    b.addEventListener("click", () => act("/api/jobs/" + job.id + "/retry", "Retry job " + job.id + "?"));
    box.append(b);
  }
  if (job.status === "pending" || job.status === "running") {
    const b = el("button", "Cancel", "danger");
    b.dataset.action = "cancel";
    b.addEventListener("click", () => act("/api/jobs/" + job.id + "/cancel", "Cancel job " + job.id + "?"));
    box.append(b);
  }
  return box;
}

function jobCard(job) {
  const card = el("article", null, "job");
  card.dataset.jobId = job.id;
  card.dataset.status = job.status;
  const head = el("div", null, "job-head");
  const a = el("a", "#" + job.id);
  a.href = "/job/" + job.id;
  head.append(a, el("span", job.type), el("span", job.status, "job-status " + job.status),
    el("span", "attempts " + job.attempts + (job.max_attempts ? "/" + job.max_attempts : ""), "muted"),
    el("span", "created " + new Date(job.created_at).toLocaleString(), "muted"), jobActions(job));
  card.append(head);
  if (job.last_error) {
    card.append(el("div", "last error", "label"), el("pre", job.last_error, "error"));
  }
  card.append(el("div", "payload", "label"), el("pre", json(job.payload), "payload"));
  return card;
}

async function refreshJobs() {
  const status = $("job-status").value;
  let rows;
  try {
    rows = await api("/api/jobs?limit=50" + (status ? "&status=" + encodeURIComponent(status) : ""));
  } catch (e) { return; }
  const text = JSON.stringify(rows);
  if (text === lastJobs) return; // nothing changed: the reader's selection stays
  lastJobs = text;
  const box = el("div");
  box.id = "jobs";
  if (!rows.length) box.append(el("p", "No " + (status || "") + " jobs.", "muted"));
  for (const job of rows) box.append(jobCard(job));
  $("jobs").replaceWith(box);
}

// -- one job ------------------------------------------------------------------------------------

async function showJob() {
  const id = location.pathname.split("/")[2];
  $("status").hidden = true; // this page reads the job once, and again after an action
  $("overview").hidden = true;
  $("detail").hidden = false;
  $("detail-title").textContent = "Job " + id;
  let job;
  try {
    job = await api("/api/jobs/" + encodeURIComponent(id));
  } catch (e) {
    $("detail-fields").replaceChildren(el("dt", "error"), el("dd", e.message));
    return;
  }
  $("detail").dataset.status = job.status;
  $("detail-actions").replaceWith(Object.assign(jobActions(job), { id: "detail-actions" }));
  const fields = [];
  for (const [name, value] of Object.entries(job)) {
    const dd = el("dd");
    if (name === "payload" || name === "result") dd.append(el("pre", json(value), name));
    else if (name === "last_error" && value) dd.append(el("pre", value, "error"));
    else dd.textContent = value === null ? "-" : String(value);
    fields.push(el("dt", name), dd);
  }
  $("detail-fields").replaceChildren(...fields);
}

// -- start ----------------------------------------------------------------------------------------

function start() {
  $("token").value = token();
  $("token-form").addEventListener("submit", (event) => {
    event.preventDefault();
    sessionStorage.setItem(TOKEN_KEY, $("token").value.trim());
    refused(false);
    lastJobs = "";
    if (location.pathname.startsWith("/job/")) showJob();
    else { follow(); refreshCounts(); refreshJobs(); refreshChart(); }
  });
  if (location.pathname.startsWith("/job/")) {
    showJob();
    return;
  }
  $("job-status").addEventListener("change", () => { lastJobs = ""; refreshJobs(); });
  follow();
  refreshQueue();
  refreshChart();
  setInterval(() => { if (Date.now() - lastRefresh >= POLL_MS) refreshQueue(); }, SOONEST_MS);
  setInterval(refreshChart, CHART_MS);
}

document.addEventListener("DOMContentLoaded", start);
