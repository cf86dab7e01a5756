// slotcron dashboard: a small page over the JSON API, refreshed every few seconds.
// The admin token is asked once and kept in sessionStorage (this tab only, gone when it closes).
"use strict";

const REFRESH_MS = 3000;
const PAGE = 25;
const TOKEN_KEY = "slotcron.token";
const RESTARTABLE = new Set(["FAILED", "STOPPED", "ABANDONED"]);
const STATUSES = ["QUEUED", "RUNNING", "COMPLETED", "FAILED", "SKIPPED", "MISSED", "STOPPED", "ABANDONED"];

const view = { offset: 0, nextOffset: null, expanded: new Set(), jobNames: [] };
let pending = null;  // a write waiting for the token
let timer = null;

const $ = (id) => document.getElementById(id);
const token = () => sessionStorage.getItem(TOKEN_KEY);

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (key === "class") node.className = value;
    else if (key === "text") node.textContent = value;
    else if (key.startsWith("data-")) node.setAttribute(key, value);
    else node[key] = value;
  }
  for (const child of children) node.append(child);
  return node;
}

function when(iso) {
  return iso ? iso.replace("T", " ").replace(/\.\d+Z$/, "Z") : "";
}

function relative(iso) {
  if (!iso) return "";
  const seconds = Math.round((Date.parse(iso) - Date.now()) / 1000);
  const size = Math.abs(seconds);
  const text = size < 90 ? `${size}s` : size < 5400 ? `${Math.round(size / 60)}m` : `${Math.round(size / 3600)}h`;
  return seconds >= 0 ? `in ${text}` : `${text} ago`;
}

function status(name) {
  return name ? el("span", { class: `status status-${name}`, text: name }) : "";
}

function notice(text, isError = false) {
  const box = $("notice");
  box.textContent = text;
  box.className = isError ? "error" : "";
  box.hidden = !text;
}

class HttpError extends Error {
  constructor(status, body) {
    super(body.error || `HTTP ${status}`);
    this.status = status;
  }
}

async function api(method, path, body) {
  const headers = { Accept: "application/json" };
  if (token()) headers.Authorization = `Bearer ${token()}`;
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const response = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  const data = await response.json().catch(() => ({}));
  if (!response.ok) throw new HttpError(response.status, data);
  return data;
}

// Token

function renderTokenButton() {
  $("token-button").textContent = token() ? "forget admin token" : "enter admin token";
}

function askToken(why) {
  $("token-why").textContent = why || "";
  $("token-form").hidden = false;
  $("token-input").value = "";
  $("token-input").focus();
}

$("token-button").addEventListener("click", () => {
  if (token()) {
    sessionStorage.removeItem(TOKEN_KEY);
    renderTokenButton();
    notice("admin token forgotten");
  } else {
    askToken();
  }
});

$("token-form").addEventListener("submit", (event) => {
  event.preventDefault();
  const value = $("token-input").value.trim();
  if (!value) return;
  sessionStorage.setItem(TOKEN_KEY, value);
  $("token-form").hidden = true;
  renderTokenButton();
  const action = pending;
  pending = null;
  if (action) action(); else refresh();
});

$("token-cancel").addEventListener("click", () => {
  $("token-form").hidden = true;
  pending = null;
});

// Writes

async function write(label, method, path, body) {
  if (!token()) {
    pending = () => write(label, method, path, body);
    askToken(`needed to ${label}`);
    return;
  }
  try {
    const result = await api(method, path, body);
    if (result.execution_id !== undefined) {
      notice(`${label}: queued execution ${result.execution_id}`);
    } else {
      notice(`${label}: ${result.changed ? "done" : "nothing to change"}`);
    }
  } catch (error) {
    if (error.status === 401 || error.status === 403) {
      sessionStorage.removeItem(TOKEN_KEY);
      renderTokenButton();
      if (error.status === 403 && /disabled/.test(error.message)) {
        notice(`${label}: refused: ${error.message}`, true);
        return;
      }
      pending = () => write(label, method, path, body);
      askToken(error.message);
      return;
    }
    notice(`${label}: ${error.message}`, true);
  }
  refresh();
}

const jobPath = (name, verb) => `api/jobs/${encodeURIComponent(name)}/${verb}`;

// Reads

function renderJobs(jobs) {
  const rows = jobs.map((job) => {
    const actions = el("td", { class: "actions" },
      el("button", { type: "button", "data-action": "trigger", text: "Trigger",
        onclick: () => write(`trigger ${job.name}`, "POST", jobPath(job.name, "trigger"), {}) }),
      job.paused
        ? el("button", { type: "button", "data-action": "resume", text: "Resume",
          onclick: () => write(`resume ${job.name}`, "POST", jobPath(job.name, "resume")) })
        : el("button", { type: "button", "data-action": "pause", text: "Pause",
          onclick: () => write(`pause ${job.name}`, "POST", jobPath(job.name, "pause"), { reason: "paused from the dashboard" }) }));
    const drift = Object.keys(job.drift || {}).length ? " (versions disagree)" : "";
    return el("tr", { "data-job": job.name },
      el("td", { class: "mono", text: job.name }),
      el("td", { class: "mono", text: job.schedule + drift }),
      el("td", { text: job.timezone }),
      el("td", { text: `${when(job.next_slot)} ${job.paused ? "" : relative(job.next_slot)}` }),
      el("td", {}, status(job.last_status)),
      el("td", job.paused ? { class: "paused", text: "paused", title: job.paused_reason || "" } : { text: "" }),
      actions);
  });
  $("jobs").tBodies[0].replaceChildren(...rows);
  if (!jobs.length) $("jobs").tBodies[0].append(el("tr", {}, el("td", { colSpan: 7, class: "muted", text: "no jobs registered yet" })));
  const names = jobs.map((job) => job.name);
  if (names.join("\n") !== view.jobNames.join("\n")) {
    view.jobNames = names;
    const select = $("job-filter");
    const chosen = select.value;
    select.replaceChildren(el("option", { value: "", text: "all" }), ...names.map((n) => el("option", { value: n, text: n })));
    select.value = names.includes(chosen) ? chosen : "";
  }
}

function renderExecutions(page) {
  const rows = [];
  for (const run of page.executions) {
    const lastLine = (run.error || "").trim().split("\n").pop();
    const firstLine = lastLine.length > 100 ? `${lastLine.slice(0, 99)}…` : lastLine;
    const errorCell = el("td", { class: "error", text: firstLine, title: run.error ? "show the whole error" : "" });
    if (run.error) {
      errorCell.addEventListener("click", () => {
        if (view.expanded.has(run.id)) view.expanded.delete(run.id); else view.expanded.add(run.id);
        refresh();
      });
    }
    const restart = RESTARTABLE.has(run.status)
      ? el("button", { type: "button", "data-action": "restart", text: "Restart",
        onclick: () => write(`restart execution ${run.id}`, "POST", `api/executions/${run.id}/restart`) })
      : "";
    rows.push(el("tr", { "data-execution": String(run.id), "data-status": run.status, "data-trigger": run.trigger },
      el("td", { class: "num", text: String(run.id) }),
      el("td", { class: "mono", text: run.job }),
      el("td", { text: when(run.scheduled_at) }),
      el("td", { text: run.trigger }),
      el("td", {}, status(run.status)),
      el("td", { class: "num", text: String(run.attempt) }),
      el("td", { class: "mono", text: run.instance_id || "" }),
      el("td", { class: "num", text: run.duration_ms === null ? "" : `${(run.duration_ms / 1000).toFixed(2)}s` }),
      errorCell,
      el("td", { class: "actions" }, restart)));
    if (run.error && view.expanded.has(run.id)) {
      rows.push(el("tr", { class: "detail" }, el("td", { colSpan: 10 }, el("pre", { text: run.error }))));
    }
  }
  if (!rows.length) rows.push(el("tr", {}, el("td", { colSpan: 10, class: "muted", text: "no executions match" })));
  $("executions").tBodies[0].replaceChildren(...rows);
  view.nextOffset = page.next_offset;
  $("newer").disabled = view.offset === 0;
  $("older").disabled = page.next_offset === null;
  $("page").textContent = page.executions.length ? `${view.offset + 1}–${view.offset + page.executions.length}` : "";
}

function renderInstances(instances) {
  const rows = instances.map((inst) => el("tr", { "data-instance": inst.instance_id },
    el("td", { class: "mono", text: inst.instance_id }),
    el("td", { text: inst.host }),
    el("td", { class: "num", text: String(inst.pid) }),
    el("td", { text: inst.version }),
    el("td", { text: inst.state }),
    el("td", inst.leader ? { class: "leader", text: "★ leader" } : { text: "" }),
    el("td", { text: when(inst.started_at) }),
    el("td", { text: `${when(inst.heartbeat_at)} (${relative(inst.heartbeat_at)})` })));
  $("instances").tBodies[0].replaceChildren(...rows);
}

async function refresh() {
  clearTimeout(timer);
  const params = new URLSearchParams({ limit: String(PAGE), offset: String(view.offset) });
  if ($("status-filter").value) params.set("status", $("status-filter").value);
  if ($("job-filter").value) params.set("job", $("job-filter").value);
  try {
    const [health, jobs, page, instances] = await Promise.all([
      api("GET", "healthz"),
      api("GET", "api/jobs"),
      api("GET", `api/executions?${params}`),
      api("GET", "api/instances"),
    ]);
    $("served-by").textContent = `served by ${health.instance} (${health.state})`;
    renderJobs(jobs.jobs);
    renderExecutions(page);
    renderInstances(instances.instances);
    $("updated").textContent = `updated ${new Date().toLocaleTimeString()}`;
    document.body.dataset.loaded = "true";
  } catch (error) {
    if (error.status === 401 || error.status === 403) {
      sessionStorage.removeItem(TOKEN_KEY);
      renderTokenButton();
      if ($("token-form").hidden) askToken("this instance asks for the admin token to show its data");
    } else {
      $("updated").textContent = `update failed: ${error.message}`;
    }
  }
  timer = setTimeout(refresh, REFRESH_MS);
}

for (const name of STATUSES) $("status-filter").append(el("option", { value: name, text: name }));
for (const id of ["status-filter", "job-filter"]) {
  $(id).addEventListener("change", () => { view.offset = 0; refresh(); });
}
$("newer").addEventListener("click", () => { view.offset = Math.max(0, view.offset - PAGE); refresh(); });
$("older").addEventListener("click", () => { if (view.nextOffset !== null) { view.offset = view.nextOffset; refresh(); } });
renderTokenButton();
refresh();
