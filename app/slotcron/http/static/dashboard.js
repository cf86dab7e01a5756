// slotcron dashboard: a small page over the JSON API.
// Every few seconds it asks only for a change marker (GET /api/changes: a few index reads) and
// refetches jobs, executions and timelines only when the marker moves, after a write, or when the
// view changes. The token (an admin token, or a read token that may only look) is asked once
// and kept in sessionStorage (this tab only); a write refused to a read token asks for an admin
// token and keeps the read token should the person cancel.
// Two views, chosen by the URL's fragment: the overview (""), and a job's page
// ("#job=NAME", "#job=NAME&execution=ID" with that execution opened); a runtime schedule's page
// is a job's page under its id. Everything shown goes in as text (textContent, never HTML):
// names, ids and params are user data.
"use strict";

const REFRESH_MS = 3000;
const PAGE = 25;
const JOBS_PAGE = 20;
const SCHEDULES_PAGE = 25;
const PARAMS_SHOWN = 60;
const SLOTS = 100;
const NEXT_ON_OVERVIEW = 2;
const NEXT_ON_JOB_PAGE = 5;
const TOKEN_KEY = "slotcron.token";
const RESTARTABLE = new Set(["FAILED", "STOPPED", "ABANDONED"]);
const STATUSES = ["QUEUED", "RUNNING", "COMPLETED", "FAILED", "SKIPPED", "MISSED", "STOPPED", "ABANDONED"];
const SVG = "http://www.w3.org/2000/svg";

const view = {
  offset: 0, nextOffset: null, expanded: new Set(), jobNames: [], jobsOffset: 0,
  jobs: [], marker: null, routeKey: null, jobOffset: 0, jobNextOffset: null,
  schedules: null, schedulesOffset: 0, scheduleTask: "",
};
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

function svg(tag, attrs = {}, text = "") {
  const node = document.createElementNS(SVG, tag);
  for (const [key, value] of Object.entries(attrs)) node.setAttribute(key, String(value));
  if (text) node.textContent = text;
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

function ms(value) {
  if (value === null || value === undefined) return "";
  const abs = Math.abs(value);
  return abs < 1000 ? `${value}ms` : abs < 120000 ? `${(value / 1000).toFixed(2)}s` : `${(value / 60000).toFixed(1)}m`;
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

// Routes

function route() {
  const params = new URLSearchParams(location.hash.slice(1));
  const execution = params.get("execution");
  return { job: params.get("job"), execution: execution && /^\d+$/.test(execution) ? execution : null };
}

const jobHref = (name, execution) => {
  const params = new URLSearchParams({ job: name });
  if (execution !== undefined) params.set("execution", String(execution));
  return `#${params}`;
};

// The API

class HttpError extends Error {
  constructor(status, body) {
    super(body.error || `HTTP ${status}`);
    this.status = status;
  }
}

// The server compares the token's UTF-8 bytes. A fetch header is a byte string (each character
// one byte, U+0000 to U+00FF), so the token goes as its UTF-8 bytes, one character per byte:
// "tökén" is sent as the same bytes curl would send.
function headerToken(value) {
  return Array.from(new TextEncoder().encode(value), (byte) => String.fromCharCode(byte)).join("");
}

// What no HTTP header can carry, whatever the encoding: control characters. And what the
// server never accepts as a token (SCHEDULER_ADMIN_TOKEN, SCHEDULER_READ_TOKEN): anything but
// printable ASCII.
function tokenProblem(value) {
  if (/[\u0000-\u001f\u007f]/.test(value)) {
    return "this token holds a control character (a tab, a line break…), which no HTTP header can carry: check SCHEDULER_ADMIN_TOKEN or SCHEDULER_READ_TOKEN";
  }
  if (/[^\u0020-\u007e]/.test(value)) {
    return "this token holds a character outside printable ASCII, which no slotcron token does: check what you pasted";
  }
  return null;
}

// A write refused because the token given may only read (SCHEDULER_READ_TOKEN).
const readOnly = (error) => error.status === 403 && /may only read/.test(error.message);

async function api(method, path, body) {
  const headers = { Accept: "application/json" };
  if (token()) headers.Authorization = `Bearer ${headerToken(token())}`;
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const response = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  const data = await response.json().catch(() => ({}));
  if (!response.ok) throw new HttpError(response.status, data);
  return data;
}

// Token

function renderTokenButton() {
  $("token-button").textContent = token() ? "forget token" : "enter token";
}

function askToken(why, isError = false) {
  $("token-why").textContent = why || "";
  $("token-why").className = isError ? "error-text" : "muted";
  $("token-form").hidden = false;
  $("token-input").value = "";
  $("token-input").focus();
}

$("token-button").addEventListener("click", () => {
  if (token()) {
    sessionStorage.removeItem(TOKEN_KEY);
    renderTokenButton();
    notice("token forgotten");
  } else {
    askToken();
  }
});

$("token-form").addEventListener("submit", (event) => {
  event.preventDefault();
  const value = $("token-input").value.trim();
  if (!value) return;
  const problem = tokenProblem(value);
  if (problem) {
    askToken(problem, true);
    return;
  }
  sessionStorage.setItem(TOKEN_KEY, value);
  $("token-form").hidden = true;
  renderTokenButton();
  const action = pending;
  pending = null;
  if (action) action(); else refresh(true);
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
    if (readOnly(error)) {
      // The read token stays (the page keeps reading with it) unless an admin token is given.
      pending = () => write(label, method, path, body);
      askToken(`${label}: ${error.message}`, true);
      return;
    }
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
  refresh(true);
}

const jobPath = (name, verb) => `api/jobs/${encodeURIComponent(name)}/${verb}`;

function jobButtons(job) {
  return [
    el("button", { type: "button", "data-action": "trigger", text: "Trigger",
      onclick: () => write(`trigger ${job.name}`, "POST", jobPath(job.name, "trigger"), {}) }),
    job.paused
      ? el("button", { type: "button", "data-action": "resume", text: "Resume",
        onclick: () => write(`resume ${job.name}`, "POST", jobPath(job.name, "resume")) })
      : el("button", { type: "button", "data-action": "pause", text: "Pause",
        onclick: () => write(`pause ${job.name}`, "POST", jobPath(job.name, "pause"), { reason: "paused from the dashboard" }) }),
  ];
}

function restartButton(run) {
  return RESTARTABLE.has(run.status)
    ? el("button", { type: "button", "data-action": "restart", text: "Restart",
      onclick: () => write(`restart execution ${run.id}`, "POST", `api/executions/${run.id}/restart`) })
    : "";
}

// Schedules: a page of the runtime schedules (there may be a million), read with their last
// status in two bounded queries; their buttons are a job's, by id.

function timing(schedule) {
  const what = schedule.cron !== null && schedule.cron !== undefined ? schedule.cron : `every ${schedule.every}s`;
  return `${what} (${schedule.timezone})`;
}

function paramsCell(params) {
  const text = JSON.stringify(params || {});
  const shown = text.length > PARAMS_SHOWN ? `${text.slice(0, PARAMS_SHOWN - 1)}…` : text;
  return el("td", { class: "mono clipped", text: shown, title: text });
}

function lastStatusCell(schedule) {
  if (!schedule.last_status) return el("td", { class: "muted", text: "none yet", title: "no run yet" });
  return el("td", { title: `latest run: slot ${when(schedule.last_run_at)} (${relative(schedule.last_run_at)})` },
    status(schedule.last_status));
}

function renderSchedules(page) {
  const problem = $("schedules-error");
  problem.textContent = page.error || "";
  problem.hidden = !page.error;
  const schedules = page.schedules || [];
  const rows = schedules.map((schedule) => el("tr", {
    "data-schedule": schedule.id, "data-paused": String(schedule.paused), "data-last-status": schedule.last_status || "",
  },
  el("td", { class: "mono clipped" }, el("a", { href: jobHref(schedule.id), text: schedule.id, title: `${schedule.id}: open its history` })),
  el("td", { class: "mono", text: schedule.task }),
  el("td", { class: "mono", text: timing(schedule) }),
  paramsCell(schedule.params),
  el("td", { text: `${when(schedule.next_slot)} ${schedule.paused ? "" : relative(schedule.next_slot)}` }),
  lastStatusCell(schedule),
  el("td", schedule.paused ? { class: "paused", text: "paused" } : { text: "" }),
  el("td", { class: "actions" }, ...jobButtons({ name: schedule.id, paused: schedule.paused }))));
  if (!rows.length && !page.error) {
    const why = view.schedulesOffset ? "no schedules on this page" : view.scheduleTask ? "no schedules of this task" : "no schedules yet";
    rows.push(el("tr", {}, el("td", { colSpan: 8, class: "muted", text: why })));
  }
  $("schedules").tBodies[0].replaceChildren(...rows);
  view.schedulesNext = page.next_offset ?? null;
  $("schedules-prev").disabled = view.schedulesOffset === 0;
  $("schedules-next").disabled = view.schedulesNext === null;
  $("schedules-page").textContent = schedules.length ? `${view.schedulesOffset + 1}–${view.schedulesOffset + schedules.length}` : "";
}

// A refused read of the schedules (a bad filter) shows in its section, not over the whole page;
// a refused token is the page's business.
function schedulesPage() {
  const params = new URLSearchParams({ limit: String(SCHEDULES_PAGE), offset: String(view.schedulesOffset) });
  if (view.scheduleTask) params.set("task", view.scheduleTask);
  return api("GET", `api/schedules?${params}`).catch((error) => {
    if (error.status === 401 || error.status === 403) throw error;
    return { error: `schedules: ${error.message}` };
  });
}

// Timeline

function cellTitle(cell) {
  const lines = [`slot ${when(cell.slot)}`, `${cell.status} (attempt ${cell.attempt}, ${cell.trigger})`];
  lines.push(`instance ${cell.instance_id || "none"}`);
  lines.push(`lag ${cell.lag_ms === null ? "none (never started)" : ms(cell.lag_ms)}`);
  lines.push(`duration ${cell.duration_ms === null ? (cell.status === "RUNNING" ? "still running" : "none") : ms(cell.duration_ms)}`);
  if (cell.reason) lines.push(`why: ${cell.reason}`);
  lines.push(`execution ${cell.id}: click to open`);
  return lines.join("\n");
}

function timelineCells(timeline, selected) {
  const cells = timeline.slots.slice().reverse().map((cell) => el("a", {
    class: `cell s-${cell.status}${String(cell.id) === selected ? " selected" : ""}`,
    href: jobHref(timeline.job, cell.id),
    title: cellTitle(cell),
    "data-status": cell.status,
    "data-execution": String(cell.id),
  }));
  const notes = timeline.next_notes || {};
  for (const slot of timeline.next_slots) {
    const note = notes[slot];
    const why = note ? `: it will be SKIPPED (${note})` : timeline.paused ? ": the job is paused, so it will be SKIPPED" : "";
    cells.push(el("span", {
      class: `cell s-PENDING${note ? " will-skip" : ""}`,
      title: `slot ${when(slot)} (${relative(slot)})\nnot yet decided${why}`,
      "data-status": "PENDING",
      ...(note ? { "data-note": note } : {}),
    }));
  }
  return el("div", { class: "cells" }, ...cells);
}

function renderTimeline(target, timelines, selected = null, withNames = true) {
  const rows = timelines.map((timeline) => el("div", { class: "tl-row", "data-job": timeline.job },
    ...(withNames ? [el("a", { class: "tl-name mono", href: jobHref(timeline.job), text: timeline.job, title: `open ${timeline.job}` })] : []),
    timelineCells(timeline, selected)));
  if (!rows.length) rows.push(el("p", { class: "muted", text: "no jobs registered yet" }));
  target.replaceChildren(...rows);
}

function renderLegend() {
  const names = ["COMPLETED", "FAILED", "MISSED", "SKIPPED", "ABANDONED", "STOPPED", "RUNNING", "QUEUED", "PENDING"];
  $("legend").replaceChildren(...names.map((name) => el("span", { class: "legend-item" },
    el("span", { class: `cell s-${name}` }), name === "PENDING" ? "not yet decided" : name)),
  el("span", { class: "legend-item" }, el("span", { class: "cell s-PENDING will-skip" }), "will be skipped (a skip, a holiday)"));
}

async function timelines(names, next) {
  if (!names.length) return [];
  const params = new URLSearchParams(names.map((name) => ["job", name]));
  params.set("limit", String(SLOTS));
  params.set("next", String(next));
  return (await api("GET", `api/timeline?${params}`)).timelines;
}

// Chart: start lag and duration of the runs that started, oldest left, as two lines.

function renderChart(timeline) {
  const runs = timeline.slots.filter((cell) => cell.lag_ms !== null).reverse();
  const box = $("job-chart");
  if (!runs.length) {
    box.replaceChildren(el("p", { class: "muted", text: "no run has started yet" }));
    return;
  }
  const width = 640, height = 180, left = 56, right = 12, top = 12, bottom = 22;
  const values = runs.flatMap((run) => [Math.max(run.lag_ms, 0), run.duration_ms ?? 0]);
  const top_ = Math.max(1, ...values);
  const x = (i) => left + (runs.length === 1 ? (width - left - right) / 2 : i * (width - left - right) / (runs.length - 1));
  const y = (value) => top + (height - top - bottom) * (1 - Math.max(value, 0) / top_);
  const chart = svg("svg", { viewBox: `0 0 ${width} ${height}`, width, height, role: "img", class: "chart",
    "aria-label": "start lag and duration of recent runs" });
  for (const fraction of [0, 0.5, 1]) {
    const value = top_ * fraction;
    chart.append(svg("line", { x1: left, x2: width - right, y1: y(value), y2: y(value), class: "grid" }));
    chart.append(svg("text", { x: left - 6, y: y(value) + 4, "text-anchor": "end", class: "axis" }, ms(Math.round(value))));
  }
  chart.append(svg("text", { x: left, y: height - 6, class: "axis" }, when(runs[0].slot)));
  chart.append(svg("text", { x: width - right, y: height - 6, "text-anchor": "end", class: "axis" }, when(runs[runs.length - 1].slot)));
  for (const [series, pick] of [["lag", (run) => run.lag_ms], ["duration", (run) => run.duration_ms]]) {
    const points = runs.map((run, i) => [i, pick(run)]).filter(([, value]) => value !== null);
    if (points.length > 1) {
      chart.append(svg("polyline", { class: `series-${series}`, points: points.map(([i, v]) => `${x(i).toFixed(1)},${y(v).toFixed(1)}`).join(" ") }));
    }
    for (const [i, value] of points) {
      const dot = svg("circle", { cx: x(i).toFixed(1), cy: y(value).toFixed(1), r: 2.5, class: `series-${series}`, "data-series": series });
      dot.append(svg("title", {}, `${series} ${ms(value)} (slot ${when(runs[i].slot)}, ${runs[i].status})`));
      chart.append(dot);
    }
  }
  const legend = el("div", { class: "chart-legend" },
    el("span", { class: "key key-lag" }), "start lag (start minus slot)  ",
    el("span", { class: "key key-duration" }), "duration");
  box.replaceChildren(chart, legend);
}

// Overview

function renderJobs(jobs) {
  const rows = jobs.map((job) => {
    const superseded = Object.keys(job.superseded || {});
    const drift = (Object.keys(job.drift || {}).length ? " (versions disagree)" : "") +
      (superseded.length ? ` (superseded on ${superseded.join(", ")})` : "");
    return el("tr", { "data-job": job.name },
      el("td", { class: "mono" }, el("a", { href: jobHref(job.name), text: job.name })),
      el("td", { class: "mono", text: job.schedule + drift }),
      el("td", { text: job.timezone }),
      el("td", { text: `${when(job.next_slot)} ${job.paused ? "" : relative(job.next_slot)}` }),
      el("td", {}, status(job.last_status)),
      el("td", job.paused ? { class: "paused", text: "paused", title: job.paused_reason || "" } : { text: "" }),
      el("td", { class: "actions" }, ...jobButtons(job)));
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

function errorCell(run) {
  const lastLine = (run.error || "").trim().split("\n").pop();
  const firstLine = lastLine.length > 100 ? `${lastLine.slice(0, 99)}…` : lastLine;
  const cell = el("td", { class: "error", text: firstLine, title: run.error ? "show the whole error" : "" });
  if (run.error) {
    cell.addEventListener("click", () => {
      if (view.expanded.has(run.id)) view.expanded.delete(run.id); else view.expanded.add(run.id);
      refresh(true);
    });
  }
  return cell;
}

// A MISSED record standing for a passed-over range shows its first and last slot.
function slotText(run) {
  return run.until ? `${when(run.scheduled_at)} – ${when(run.until)}` : when(run.scheduled_at);
}

function renderExecutions(page) {
  const rows = [];
  for (const run of page.executions) {
    rows.push(el("tr", { "data-execution": String(run.id), "data-status": run.status, "data-trigger": run.trigger },
      el("td", { class: "num" }, el("a", { href: jobHref(run.job, run.id), text: String(run.id) })),
      el("td", { class: "mono", text: run.job }),
      el("td", { text: slotText(run) }),
      el("td", { text: run.trigger }),
      el("td", {}, status(run.status)),
      el("td", { class: "num", text: String(run.attempt) }),
      el("td", { class: "mono", text: run.instance_id || "" }),
      el("td", { class: "num", text: run.duration_ms === null ? "" : `${(run.duration_ms / 1000).toFixed(2)}s` }),
      errorCell(run),
      el("td", { class: "actions" }, restartButton(run))));
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

async function loadOverview() {
  const params = new URLSearchParams({ limit: String(PAGE), offset: String(view.offset) });
  if ($("status-filter").value) params.set("status", $("status-filter").value);
  if ($("job-filter").value) params.set("job", $("job-filter").value);
  const [jobs, page, schedules] = await Promise.all([
    api("GET", "api/jobs"), api("GET", `api/executions?${params}`), schedulesPage(),
  ]);
  view.jobs = jobs.jobs;
  if (view.jobsOffset >= view.jobs.length) view.jobsOffset = Math.max(0, view.jobs.length - JOBS_PAGE);
  const shown = view.jobs.slice(view.jobsOffset, view.jobsOffset + JOBS_PAGE).map((job) => job.name);
  renderTimeline($("timeline"), await timelines(shown, NEXT_ON_OVERVIEW));
  $("jobs-prev").disabled = view.jobsOffset === 0;
  $("jobs-next").disabled = view.jobsOffset + JOBS_PAGE >= view.jobs.length;
  $("jobs-page").textContent = view.jobs.length > JOBS_PAGE ? `jobs ${view.jobsOffset + 1}–${view.jobsOffset + shown.length} of ${view.jobs.length}` : "";
  renderJobs(view.jobs);
  renderExecutions(page);
  view.schedules = schedules;
  renderSchedules(schedules);
}

// Job page

function renderExecutionDetail(run) {
  const box = $("execution-detail");
  if (!run) {
    box.hidden = true;
    return;
  }
  const lag = run.started_at ? Date.parse(run.started_at) - Date.parse(run.scheduled_at) : null;
  const fields = [
    ["job", run.job], ["slot", slotText(run)], ["status", status(run.status)],
    ["attempt", String(run.attempt)], ["trigger", run.trigger], ["instance", run.instance_id || "none"],
    ["started", when(run.started_at) || "never"], ["finished", when(run.finished_at) || ""],
    ["lag", lag === null ? "" : ms(lag)], ["duration", ms(run.duration_ms)],
    ["params", JSON.stringify(run.params)], ["state", JSON.stringify(run.state)],
  ];
  $("execution-id").textContent = String(run.id);
  $("execution-fields").replaceChildren(...fields.flatMap(([name, value]) => [el("dt", { text: name }), el("dd", {}, value)]),
    el("dt", { text: "" }), el("dd", {}, restartButton(run)));
  $("execution-error").textContent = run.error || "";
  $("execution-error").hidden = !run.error;
  box.dataset.execution = String(run.id);
  box.dataset.status = run.status;
  box.hidden = false;
}

function renderJobHistory(page) {
  const rows = [];
  for (const run of page.executions) {
    const lag = run.started_at ? Date.parse(run.started_at) - Date.parse(run.scheduled_at) : null;
    rows.push(el("tr", { "data-execution": String(run.id), "data-status": run.status, "data-trigger": run.trigger },
      el("td", { class: "num" }, el("a", { href: jobHref(run.job, run.id), text: String(run.id) })),
      el("td", { text: slotText(run) }),
      el("td", { text: run.trigger }),
      el("td", {}, status(run.status)),
      el("td", { class: "num", text: String(run.attempt) }),
      el("td", { class: "mono", text: run.instance_id || "" }),
      el("td", { class: "num", text: ms(lag) }),
      el("td", { class: "num", text: ms(run.duration_ms) }),
      errorCell(run),
      el("td", { class: "actions" }, restartButton(run))));
    if (run.error && view.expanded.has(run.id)) {
      rows.push(el("tr", { class: "detail" }, el("td", { colSpan: 10 }, el("pre", { text: run.error }))));
    }
  }
  if (!rows.length) rows.push(el("tr", {}, el("td", { colSpan: 10, class: "muted", text: "no executions yet" })));
  $("job-history").tBodies[0].replaceChildren(...rows);
  view.jobNextOffset = page.next_offset;
  $("job-newer").disabled = view.jobOffset === 0;
  $("job-older").disabled = page.next_offset === null;
  $("job-page-range").textContent = page.executions.length ? `${view.jobOffset + 1}–${view.jobOffset + page.executions.length}` : "";
}

// Upcoming skips and backfills of the job page

function renderSkips(skips) {
  const items = skips.map((skip) => el("li", { "data-skip": skip.at,
    text: `${when(skip.at)} (${relative(skip.at)}): ${skip.reason || "skipped by an operator"}` }));
  if (!items.length) items.push(el("li", { class: "muted", text: "none" }));
  $("job-skips").replaceChildren(...items);
}

function progressBar(backfill) {
  const total = Math.max(backfill.slots, 1);
  const part = (n, kind) => el("span", { class: `bar-${kind}`, style: `width: ${(100 * n / total).toFixed(2)}%` });
  const decided = backfill.slots - backfill.left - backfill.done - backfill.failed;
  return el("span", { class: "progress", title: `${backfill.done} done, ${backfill.failed} failed, ${backfill.left} left, ${backfill.passed} passed over (completed before, skipped)` },
    part(backfill.done, "done"), part(backfill.failed, "failed"), part(Math.max(decided, 0), "passed"));
}

function renderBackfills(backfills) {
  const rows = backfills.map((backfill) => el("tr", { "data-backfill": String(backfill.id), "data-status": backfill.status },
    el("td", { class: "mono", text: String(backfill.id) }),
    el("td", { text: `${when(backfill.from)} → ${when(backfill.to)}` }),
    el("td", {}, status(backfill.status)),
    el("td", {}, progressBar(backfill)),
    el("td", { class: "mono", text: `${backfill.done}/${backfill.slots} done, ${backfill.failed} failed, ${backfill.left} left` }),
    el("td", { text: backfill.rate === 0 ? "capacity" : `${backfill.rate}/s` }),
    el("td", { class: "muted", text: backfill.note || "" })));
  if (!rows.length) rows.push(el("tr", {}, el("td", { colSpan: 7, class: "muted", text: "no backfills of this job" })));
  $("job-backfills").tBodies[0].replaceChildren(...rows);
}

// A runtime schedule's page is a job's page: its history and timeline are under its id.
async function scheduleAsJob(id) {
  const schedule = await api("GET", `api/schedules/${encodeURIComponent(id)}`).catch((error) => {
    if (error.status === 404) return null;
    throw error;
  });
  if (!schedule) return null;
  return { name: schedule.id, schedule: `task ${schedule.task}, ${schedule.cron ?? `every ${schedule.every}s`}`,
    timezone: schedule.timezone, paused: schedule.paused, paused_reason: null };
}

async function loadJobPage(where) {
  const params = new URLSearchParams({ job: where.job, limit: String(PAGE), offset: String(view.jobOffset) });
  const [jobs, found, page, run, backfills] = await Promise.all([
    api("GET", "api/jobs"),
    timelines([where.job], NEXT_ON_JOB_PAGE),
    api("GET", `api/executions?${params}`),
    where.execution ? api("GET", `api/executions/${where.execution}`).catch((error) => {
      if (error.status === 404) return null;
      throw error;
    }) : Promise.resolve(null),
    api("GET", `api/backfills?${new URLSearchParams({ job: where.job })}`),
  ]);
  view.jobs = jobs.jobs;
  const job = view.jobs.find((candidate) => candidate.name === where.job) || await scheduleAsJob(where.job);
  const timeline = found[0];
  $("job-title").textContent = where.job;
  $("job-schedule").textContent = job ? `${job.schedule} (${job.timezone})` : "not a job this database knows";
  $("job-paused").textContent = job && job.paused ? `paused${job.paused_reason ? `: ${job.paused_reason}` : ""}` : "";
  $("job-controls").replaceChildren(...(job ? jobButtons(job) : []));
  renderTimeline($("job-timeline"), [timeline], where.execution, false);
  const notes = timeline.next_notes || {};
  $("job-next").replaceChildren(...timeline.next_slots.map((slot) => el("li",
    { text: `${when(slot)} (${relative(slot)})${notes[slot] ? `: SKIPPED, ${notes[slot]}` : ""}`, ...(notes[slot] ? { class: "will-skip-text" } : {}) })));
  if (!timeline.next_slots.length) $("job-next").append(el("li", { class: "muted", text: "none known" }));
  renderSkips(timeline.skips || []);
  renderBackfills(backfills);
  renderChart(timeline);
  renderJobHistory(page);
  renderExecutionDetail(run);
}

// Refresh: cheap reads every time, the listings only when something changed.

async function refresh(force = false) {
  clearTimeout(timer);
  const where = route();
  const routeKey = `${where.job}\n${where.execution}`;
  if (routeKey !== view.routeKey) {
    if (where.job !== (view.routeKey || "").split("\n")[0]) view.jobOffset = 0;
    view.routeKey = routeKey;
    force = true;
  }
  $("overview").hidden = where.job !== null;
  $("job-page").hidden = where.job === null;
  try {
    const [health, changes, instances] = await Promise.all([
      api("GET", "healthz"),
      api("GET", "api/changes"),
      where.job === null ? api("GET", "api/instances") : Promise.resolve(null),
    ]);
    $("served-by").textContent = `served by ${health.instance} (${health.state})`;
    if (instances) renderInstances(instances.instances);
    if (force || changes.marker !== view.marker) {
      if (where.job === null) await loadOverview(); else await loadJobPage(where);
      view.marker = changes.marker;
    } else if (where.job === null) {
      renderJobs(view.jobs);  // only the relative times moved
      if (view.schedules) renderSchedules(view.schedules);
    }
    $("updated").textContent = `updated ${new Date().toLocaleTimeString()}`;
    document.body.dataset.loaded = "true";
  } catch (error) {
    if (error.status === 401 || error.status === 403) {
      sessionStorage.removeItem(TOKEN_KEY);
      renderTokenButton();
      if ($("token-form").hidden) askToken(error.status === 403 ? error.message : "this instance asks for a token (read or admin) to show its data");
    } else {
      $("updated").textContent = `update failed: ${error.message}`;
    }
  }
  timer = setTimeout(refresh, REFRESH_MS);
}

for (const name of STATUSES) $("status-filter").append(el("option", { value: name, text: name }));
for (const id of ["status-filter", "job-filter"]) {
  $(id).addEventListener("change", () => { view.offset = 0; refresh(true); });
}
$("newer").addEventListener("click", () => { view.offset = Math.max(0, view.offset - PAGE); refresh(true); });
$("older").addEventListener("click", () => { if (view.nextOffset !== null) { view.offset = view.nextOffset; refresh(true); } });
$("schedules-filter").addEventListener("submit", (event) => event.preventDefault());
$("schedule-task").addEventListener("change", () => {
  view.scheduleTask = $("schedule-task").value.trim();
  view.schedulesOffset = 0;
  refresh(true);
});
$("schedules-prev").addEventListener("click", () => { view.schedulesOffset = Math.max(0, view.schedulesOffset - SCHEDULES_PAGE); refresh(true); });
$("schedules-next").addEventListener("click", () => { if (view.schedulesNext !== null) { view.schedulesOffset = view.schedulesNext; refresh(true); } });
$("jobs-prev").addEventListener("click", () => { view.jobsOffset = Math.max(0, view.jobsOffset - JOBS_PAGE); refresh(true); });
$("jobs-next").addEventListener("click", () => { view.jobsOffset += JOBS_PAGE; refresh(true); });
$("job-newer").addEventListener("click", () => { view.jobOffset = Math.max(0, view.jobOffset - PAGE); refresh(true); });
$("job-older").addEventListener("click", () => { if (view.jobNextOffset !== null) { view.jobOffset = view.jobNextOffset; refresh(true); } });
$("back").addEventListener("click", (event) => { event.preventDefault(); location.hash = ""; });
$("execution-close").addEventListener("click", () => { location.hash = jobHref(route().job); });
window.addEventListener("hashchange", () => refresh());
renderLegend();
renderTokenButton();
refresh(true);
