// The dashboard: a hash-routed page that reads /ui/api and draws tables and charts.
// Everything is built with DOM calls and textContent, never from HTML strings, so
// nothing a job carries (ids, tenants, errors) can turn into markup.
"use strict";

const session = { csrf: null, actions: [], readOnly: true, operate: false, bulkMax: 500, states: [] };
let timer = null;

function h(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else if (v !== null && v !== undefined && v !== false) node.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat(Infinity)) {
    if (c === null || c === undefined) continue;
    node.appendChild(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}

function when(ms) {
  return ms ? new Date(ms).toISOString().replace("T", " ").slice(0, 23) + "Z" : "-";
}

function dur(ms) {
  if (ms === null || ms === undefined) return "-";
  if (ms < 1000) return `${ms} ms`;
  if (ms < 120000) return `${(ms / 1000).toFixed(1)} s`;
  return `${(ms / 60000).toFixed(1)} min`;
}

function table(headers, rows, empty) {
  if (!rows.length) return h("p", { class: "empty" }, empty || "nothing to show");
  return h("table", {}, h("thead", {}, h("tr", {}, headers.map((x) => h("th", {}, x)))),
    h("tbody", {}, rows.map((r) => h("tr", {}, r.map((c) => h("td", {}, c))))));
}

function status(text, isError) {
  const el = document.getElementById("status");
  el.textContent = text || "";
  el.className = isError ? "status error" : "status";
}

async function api(path, options) {
  const opts = Object.assign({ headers: {}, credentials: "same-origin" }, options || {});
  if (opts.method === "POST") {
    opts.headers["Content-Type"] = "application/json";
    if (session.csrf) opts.headers["X-CSRF-Token"] = session.csrf;
  }
  const res = await fetch(`api/${path}`, opts);
  if (res.status === 401) { location.href = "login"; throw new Error("logged out"); }
  const body = await res.json().catch(() => ({}));
  if (!res.ok) throw new Error(body.detail || `${res.status} ${res.statusText}`);
  return body;
}

// Renders overlap: an action re-draws its view while the operator has already moved on,
// and a refresh may start while another is in flight. Only the newest render may draw,
// so a slow answer for a page left behind never replaces the page now shown.
let renders = 0;
class Stale extends Error {}

async function read(path) {
  const mine = renders;
  const body = await api(path);
  if (mine !== renders) throw new Stale(path);
  return body;
}

function jobLink(id) {
  return h("a", { href: `#/job/${encodeURIComponent(id)}`, class: "mono" }, id);
}

function allowed(action) {
  return !session.readOnly && session.actions.includes(action);
}

// -- live view --------------------------------------------------------------------------

function laneSection(lane) {
  const classes = table(
    ["class", "share", "in flight", "waiting", "deferred", "assured", "ceiling", "borrowed", "lent", "next head", ""],
    lane.classes.map((c) => [c.name + (c.batch ? " (batch)" : ""), `${(c.nominal_share * 100).toFixed(0)}%`,
      c.in_flight, c.waiting, c.deferred, c.assured, c.ceiling,
      h("span", { class: c.borrowed ? "warn" : "" }, c.borrowed), c.lent, c.reason,
      Operate.button({ kind: "lane", lane: lane.name, class: c.name })]));
  const tenants = table(
    ["class", "tenant", "queued", "running", "weight", "share vs weight", "rejected (last min)", ""],
    lane.tenants.map((t) => [t.class, h("a", { href: `#/jobs?tenant=${encodeURIComponent(t.tenant)}` }, t.tenant),
      t.queued, t.running, t.weight,
      h("span", { class: "share" }, Charts.shareBars(t.share, t.weight_share),
        ` ${(t.share * 100).toFixed(0)}% / ${(t.weight_share * 100).toFixed(0)}%`),
      t.rejected_recent, Operate.button({ kind: "tenant", tenant: t.tenant })]),
    "no active tenants");
  return h("section", { class: "card lane", "data-lane": lane.name },
    h("h2", {}, `Lane ${lane.name} `, Operate.button({ kind: "lane", lane: lane.name }, "lane")),
    h("p", {}, `capacity ${lane.capacity} slots, ${lane.free} free, ${lane.pressure} waiting (non-batch), ${lane.delayed} scheduled for later`),
    Charts.laneBar(lane), h("h3", {}, "Classes"), classes, h("h3", {}, "Tenants"), tenants);
}

function adaptiveText(a) {
  if (!a) return "-";
  const value = a.value === null ? "" : ` (${a.value.toFixed(2)})`;
  return `${a.limit ?? "-"}${value} in [${a.min ?? "-"}, ${a.max ?? "-"}]`;
}

function num(x) {
  if (x === null || x === undefined) return "-";
  return Number.isInteger(x) ? String(x) : x.toFixed(2);
}

function rateText(r) {
  if (!r) return "not in force";
  return `${num(r.limit)} / ${num(r.per)} s, burst ${num(r.burst)}${r.cost === "units" ? " (units)" : ""}`;
}

function rateSection(rates, now) {
  const later = (ms) => (ms === null ? "-" : ms <= now ? "now" : `in ${dur(ms - now)}`);
  const rows = rates.keys.map((r) => [
    h("span", { class: "mono" }, r.key), rateText(r.rate),
    h("span", { class: r.tokens !== null && r.tokens < 0 ? "warn" : "" }, num(r.tokens)),
    r.paused_until_ms === null ? "-" : h("span", { class: "warn" }, `${later(r.paused_until_ms)}${r.pause_cause ? ` (${r.pause_cause})` : ""}`),
    r.waiters ? later(r.due_ms ?? r.next_tokens_ms) : "-",
    adaptiveText(r.adaptive), num(r.taken), num(r.refunded), num(r.debt), r.pushbacks,
    r.woken ? `${r.woken} / ${dur(Math.round(r.mean_wait_ms))}` : "-", r.waiters,
    h("span", {}, r.head.map((id) => [jobLink(id), " "]))]);
  const shown = rates.known > rates.keys.length ? h("p", { class: "note" }, `${rates.keys.length} of ${rates.known} rate keys shown (the most recently used)`) : null;
  return h("section", { class: "card", id: "rate-keys" }, h("h2", {}, "Rate keys"), shown,
    table(["key", "rate", "tokens", "paused", "waiters due", "adaptive", "taken", "refunded", "debt", "pushbacks",
      "woken / mean wait", "waiters", "first waiters"], rows, "no rate keys in use"));
}

function globalKeySection(shared) {
  const rows = shared.keys.flatMap((k) => k.shards.map((s, i) => [
    i === 0 ? h("span", { class: "mono" }, k.key) : "", i === 0 ? (k.limit ?? "none (rate key)") : "",
    s.shard, num(s.part), s.held ?? "-", s.used, s.waiting, num(s.weight)]));
  return h("section", { class: "card", id: "global-keys" }, h("h2", {}, "Global keys"),
    h("p", { class: "note" }, "keys the app's shards share: each shard holds a part of the key, moved toward the shards whose tenants wait"),
    table(["key", "limit", "shard", "part", "held", "used", "waiting", "waiting weight"], rows, ""));
}

async function viewLive(main) {
  const o = await read("overview");
  const counters = [["running", o.counts.running], ["dead letters", o.counts.dead], ["workers", o.counts.workers],
    ...["completed", "failed", "rejected", "deferred", "retried", "expired"].map((k) => [k, o.stats[k] || 0])];
  const top = Math.max(1, ...o.waits.by_class.map((w) => w.p99 || 0), ...o.waits.by_tenant.map((w) => w.p99 || 0));
  const dist = (label, w) => [label, w.n, dur(w.p50), dur(w.p95), dur(w.p99), Charts.percentiles(w, top)];
  main.replaceChildren(
    h("section", { class: "counters" }, counters.map(([k, v]) => h("div", { class: "counter" }, h("b", {}, v), h("span", {}, k)))),
    ...o.lanes.map(laneSection),
    h("section", { class: "card", id: "throttle-keys" }, h("h2", {}, "Throttle keys"),
      table(["key", "limit", "adaptive", "in use", "offered", "jobs naming it", "waiters", "first waiters"],
        o.throttles.map((t) => [h("span", { class: "mono" }, t.key), t.limit ?? (t.rate_key ? "none (rate key)" : "-"), adaptiveText(t.adaptive),
          t.in_use, t.offers, t.jobs, t.waiters,
          h("span", {}, t.head.map((id) => [jobLink(id), " "]))]), "no throttle keys in use")),
    rateSection(o.rates, o.now_ms),
    ...(o.global_keys.keys.length ? [globalKeySection(o.global_keys)] : []),
    h("section", { class: "card" }, h("h2", {}, "Start delays"), h("p", { class: "note" }, o.waits.note),
      table(["lane / class", "jobs", "p50", "p95", "p99", ""], o.waits.by_class.map((w) => dist(`${w.lane} / ${w.class}`, w)),
        "no completed jobs kept yet"),
      table(["tenant", "jobs", "p50", "p95", "p99", ""], o.waits.by_tenant.map((w) => dist(w.tenant, w)), "")),
  );
}

// -- jobs -------------------------------------------------------------------------------

function filterFrom(params) {
  return { states: params.getAll("state"), tenant: params.get("tenant") || "", class: params.get("class") || "",
    task: params.get("task") || "" };
}

function filterForm(f, tasks) {
  const form = h("form", { class: "card filters", id: "filters" },
    h("fieldset", {}, h("legend", {}, "State"), session.states.map((s) =>
      h("label", {}, h("input", { type: "checkbox", name: "state", value: s, checked: f.states.includes(s) }), s))),
    h("label", {}, "Tenant ", h("input", { name: "tenant", value: f.tenant })),
    h("label", {}, "Class ", h("input", { name: "class", value: f.class })),
    h("label", {}, "Task ", h("select", { name: "task" }, h("option", { value: "" }, "any"),
      tasks.map((t) => h("option", { value: t, selected: t === f.task }, t)))),
    h("button", { type: "submit" }, "Filter"));
  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    const q = new URLSearchParams();
    for (const [k, v] of new FormData(form).entries()) if (v) q.append(k, v);
    location.hash = `#/jobs?${q}`;
  });
  return form;
}

async function bulk(action, f) {
  const body = { action, states: f.states, tenant: f.tenant || null, class: f.class || null, task: f.task || null };
  const probe = await api("bulk", { method: "POST", body: JSON.stringify(body) });
  if (!probe.count) { status(`no matching job can be ${action === "redrive" ? "re-driven" : action + "ed"}`); return; }
  if (!confirm(`${action} ${probe.count} job(s) matching this filter? (at most ${session.bulkMax})`)) return;
  const done = await api("bulk", { method: "POST", body: JSON.stringify({ ...body, confirm: probe.count }) });
  status(`${action}: ${done.results.length} job(s) done`);
  await render();
}

function bulkButtons(f) {
  return h("div", { class: "bulk" }, ["retry", "cancel", "redrive"].filter(allowed).map((a) =>
    h("button", { type: "button", class: a === "cancel" ? "danger" : "", "data-bulk": a,
      onclick: () => bulk(a, f).catch((e) => status(e.message, true)) }, `${{ retry: "Retry", cancel: "Cancel", redrive: "Re-drive" }[a]} all matching`)));
}

function jobsTable(rows) {
  return table(["id", "task", "tenant", "class", "state", "attempts", "enqueued", "finished", "error"],
    rows.map((j) => [jobLink(j.id), j.task, j.tenant, j.class, h("span", { class: `st st-${j.state}` }, j.state),
      `${j.attempts}/${j.max_attempts ?? "?"}`, when(j.enqueued_ms), when(j.finished_ms), j.error || ""]),
    "no jobs match");
}

async function viewJobs(main, params) {
  const f = filterFrom(params);
  const q = new URLSearchParams();
  f.states.forEach((s) => q.append("state", s));
  for (const k of ["tenant", "class", "task"]) if (f[k]) q.set(k, f[k]);
  const found = await read(`jobs?${q}`);
  const note = `${found.matched} matching` + (found.truncated ? ` (indexes read up to ${found.per_index} ids each)` : "");
  const form = document.getElementById("filters");
  // a tenant's or a task's jobs: its pause (and a tenant's quarantine) beside them
  const operate = [f.tenant ? Operate.button({ kind: "tenant", tenant: f.tenant }, `tenant ${f.tenant}`) : null,
    f.tenant ? Operate.quarantineButton(f.tenant) : null,
    f.task ? Operate.button({ kind: "task", task: f.task }, `task ${f.task}`) : null].filter(Boolean);
  main.replaceChildren(form && main.dataset.view === "jobs" ? form : filterForm(f, found.tasks),
    operate.length ? h("section", { class: "card operate", id: "operate" }, operate) : "",
    h("section", { class: "card" }, h("p", {}, note), bulkButtons(f), jobsTable(found.jobs)));
}

// -- one job ----------------------------------------------------------------------------

async function act(action, id) {
  const verb = { cancel: "Cancel", retry: "Retry (as a new job)", redrive: "Re-drive" }[action];
  if (!confirm(`${verb} job ${id}?`)) return;
  const out = await api(`jobs/${encodeURIComponent(id)}/${action}`, { method: "POST" });
  status(`${action}: ${out.result}${out.new_id ? ` (new job ${out.new_id})` : ""}`);
  await render();
}

function runSection(run) {
  return h("section", { class: "card" }, h("h2", {}, "Workflow run"),
    h("p", {}, `pending signals: ${run.pending_signals}`),
    h("h3", {}, `Steps (${run.steps.length})`),
    table(["#", "kind", "name", "status", "took", "worker", "ended", "slice"],
      run.steps.map((s) => [s.index, s.kind, s.name, s.status, dur(s.ms), s.worker, when(s.ended_ms), s.slice ?? "-"]),
      "no checkpoints yet"),
    h("h3", {}, `Slices (${run.slices.length})`),
    table(["#", "worker", "attempt", "started", "ended", "how", "checkpoints", "idle after"],
      run.slices.map((s) => [s.index, s.worker, s.attempt, when(s.started_ms), when(s.ended_ms),
        s.outcome + (s.wait ? ` (${s.wait})` : ""), s.checkpoints, dur(s.idle_ms)]), "no slices yet"));
}

async function viewJob(main, id) {
  const j = await read(`jobs/${encodeURIComponent(id)}`);
  const buttons = [];
  if (allowed("cancel") && !["completed", "failed", "cancelled", "expired"].includes(j.status)) buttons.push("cancel");
  if (allowed("redrive") && j.state === "dead") buttons.push("redrive");
  if (allowed("retry") && ["failed", "cancelled", "expired"].includes(j.status) && j.state !== "dead") buttons.push("retry");
  const fields = [["state", j.state], ["task", j.task], ["tenant", j.tenant],
    ["fairness key", j.fairness_key ?? "-"], ["lane / class", `${j.lane} / ${j.class}`],
    ["attempts", `${j.attempts} of ${j.max_attempts ?? "?"}`], ["priority", j.priority], ["worker", j.worker || "-"],
    ["enqueued", when(j.enqueued_ms)], ["started", when(j.started_ms)], ["finished", when(j.finished_ms)],
    ["arguments", JSON.stringify(j.args)], ["result", j.result === null ? "-" : JSON.stringify(j.result)],
    ["error", j.error_full || "-"]];
  main.dataset.view = "job";
  main.dataset.job = j.id;  // lets a reader (or a test) know which job is shown
  main.replaceChildren(
    h("section", { class: "card" }, h("h2", {}, "Job ", h("span", { class: "mono" }, j.id)),
      h("dl", {}, fields.map(([k, v]) => [h("dt", {}, k), h("dd", {}, v)])),
      h("div", { class: "actions" }, buttons.map((a) => h("button", { type: "button", class: a === "cancel" ? "danger" : "",
        "data-action": a, onclick: () => act(a, j.id).catch((e) => status(e.message, true)) }, a)))),
    h("section", { class: "card" }, h("h2", {}, "Why it waited"),
      h("p", { class: "explain", id: "explanation" }, j.explanation.summary),
      // a job that has not started: when it is expected to (an estimate), or why not known
      j.start_estimate ? h("p", { class: "note", id: "start-estimate" }, j.start_estimate.line) : null,
      Charts.timeline(j.explanation.segments),
      h("div", { class: "legend" }, Object.entries(Charts.COLORS).map(([k, c]) =>
        h("span", {}, h("i", { class: `swatch seg-${k}` }), k))),
      table(["from", "for", "what", "why"], j.explanation.segments.map((s) =>
        [when(s.from_ms), dur(s.ms) + (s.open ? " so far" : ""), s.what, s.why]), "no segments")),
    ...(j.rate_keys.length ? [h("section", { class: "card", id: "job-rate-keys" }, h("h2", {}, "Rate keys"),
      j.pushbacks ? h("p", { class: "note" }, `${j.pushbacks} pushback(s) taken without spending an attempt`) : null,
      table(["key", "rate", "its cost", "tokens now", "paused", "adaptive"], j.rate_keys.map((r) =>
        [h("span", { class: "mono" }, r.key), rateText(r.rate), num(r.cost), num(r.tokens),
          r.paused_until_ms === null ? "-" : `until ${when(r.paused_until_ms)}${r.pause_cause ? ` (${r.pause_cause})` : ""}`,
          r.adaptive ? `${r.adaptive.limit} in [${r.adaptive.min}, ${r.adaptive.max}]` : "-"]), ""))] : []),
    h("section", { class: "card", id: "events" }, h("h2", {}, `Events (${j.events.length})`),
      h("p", { class: "note" }, "What the record cannot tell (submission, start and end are read from the record itself); the last 64 are kept."),
      table(["time", "event", "detail"], j.events.map((e) =>
        [when(e.ms), h("span", { class: "event" }, e.kind), JSON.stringify(e.detail)]),
        "no events logged: the job went straight from submission to a worker")),
    ...(j.run ? [runSection(j.run)] : []));
}

// -- dead letters and runs --------------------------------------------------------------

async function viewDead(main) {
  const found = await read("dead");
  const rows = found.jobs.map((j) => [jobLink(j.id), j.task, j.tenant, when(j.finished_ms), j.error || "",
    allowed("redrive") ? h("button", { type: "button", "data-action": "redrive",
      onclick: () => act("redrive", j.id).catch((e) => status(e.message, true)) }, "re-drive") : ""]);
  main.replaceChildren(h("section", { class: "card" }, h("h2", {}, `Dead letters (${found.matched})`),
    allowed("redrive") && found.matched ? h("button", { type: "button", "data-bulk": "redrive",
      onclick: () => bulk("redrive", { states: ["dead"] }).catch((e) => status(e.message, true)) }, "re-drive all") : null,
    table(["id", "task", "tenant", "died", "last error", ""], rows, "no dead letters")));
}

async function viewRuns(main) {
  const found = await read("runs");
  main.replaceChildren(h("section", { class: "card" }, h("h2", {}, "Workflow runs"),
    h("p", { class: "note" }, `workflows: ${found.workflows.join(", ") || "none registered"}`),
    jobsTable(found.jobs)));
}

// -- the audit trail --------------------------------------------------------------------

function auditForm(params, actions) {
  const form = h("form", { class: "card filters", id: "audit-filters" },
    h("label", {}, "Tenant ", h("input", { name: "tenant", value: params.get("tenant") || "" })),
    h("label", {}, "Action ", h("select", { name: "action" }, h("option", { value: "" }, "any"),
      actions.map((a) => h("option", { value: a, selected: a === params.get("action") }, a)))),
    h("button", { type: "submit" }, "Filter"));
  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    const q = new URLSearchParams();
    for (const [k, v] of new FormData(form).entries()) if (v) q.append(k, v);
    location.hash = `#/audit?${q}`;
  });
  return form;
}

async function viewAudit(main, params) {
  const q = new URLSearchParams();
  for (const k of ["tenant", "action"]) if (params.get(k)) q.set(k, params.get(k));
  const found = await read(`audit?${q}`);
  const rows = found.entries.map((e) => [when(e.at_ms), e.action, h("span", { class: "mono" }, e.key_id),
    e.tenant, e.outcome, e.detail, e.job_id ? jobLink(e.job_id) : ""]);
  main.replaceChildren(auditForm(params, found.actions), h("section", { class: "card" },
    h("h2", {}, `Audit trail (newest ${found.entries.length})`),
    table(["time", "action", "key id", "tenant", "outcome", "detail", "job / run"], rows, "no audit entries")));
}

// -- routing and refresh ----------------------------------------------------------------

async function render() {
  const main = document.getElementById("main");
  const [path, query] = (location.hash.slice(1) || "/").split("?");
  const params = new URLSearchParams(query || "");
  renders += 1;
  try {
    Operate.banner(await read("pauses"));  // the banner, and what each view's buttons say
    if (path.startsWith("/job/")) await viewJob(main, decodeURIComponent(path.slice(5)));
    else if (path === "/jobs") { await viewJobs(main, params); main.dataset.view = "jobs"; }
    else if (path === "/dead") { await viewDead(main); main.dataset.view = "dead"; }
    else if (path === "/runs") { await viewRuns(main); main.dataset.view = "runs"; }
    else if (path === "/audit") { await viewAudit(main, params); main.dataset.view = "audit"; }
    else { await viewLive(main); main.dataset.view = "live"; }
    document.body.dataset.updated = String(Date.now());
  } catch (e) {
    if (!(e instanceof Stale)) status(e.message, true);
  }
}

function schedule() {
  clearInterval(timer);
  const seconds = Number(document.getElementById("refresh").value);
  localStorage.setItem("fairlane-refresh", String(seconds));
  // a hidden tab asks nothing of the server; it catches up when shown again
  if (seconds > 0) timer = setInterval(() => { if (document.visibilityState === "visible") render(); }, seconds * 1000);
}

async function start() {
  const s = await api("session");
  Object.assign(session, { csrf: s.csrf, actions: s.actions, readOnly: s.read_only, operate: s.operate,
    bulkMax: s.bulk_max, states: s.states });
  document.getElementById("app-name").textContent = `Fairlane: ${s.app}`;
  document.getElementById("mode").hidden = !s.read_only;
  const refresh = document.getElementById("refresh");
  refresh.value = localStorage.getItem("fairlane-refresh") || "5";
  refresh.addEventListener("change", schedule);
  document.getElementById("find").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const id = document.getElementById("find-id").value.trim();
    if (id) location.hash = `#/job/${encodeURIComponent(id)}`;
  });
  document.addEventListener("visibilitychange", () => { if (document.visibilityState === "visible") render(); });
  window.addEventListener("hashchange", () => {
    const main = document.getElementById("main");
    status("");
    delete main.dataset.view;
    delete main.dataset.job;
    render();
  });
  schedule();
  await render();
}

start().catch((e) => status(e.message, true));
