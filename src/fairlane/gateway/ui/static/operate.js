// The operator's controls: pausing and resuming a tenant, a task or a lane (or one class),
// quarantining a tenant, and the banner that lists what is paused. Every change asks
// first in the page's one dialog (`Operate.ask`, a <dialog> form the next operator
// action -- a drain -- can use as well), then calls /ui/api and re-draws the view.
// Built with DOM calls and textContent only, as app.js is.
"use strict";

const Operate = (() => {
  // what the last read of /ui/api/pauses said: scope key -> its pause
  let paused = new Map();

  function key(scope) {
    return [scope.kind, scope.tenant || "", scope.fairness_key || "", scope.task || "", scope.lane || "",
      scope.class || ""].join("\u0000");
  }

  function text(scope) {
    if (scope.kind === "tenant") return `tenant ${scope.tenant}`;
    if (scope.kind === "refuse") return `submissions of tenant ${scope.tenant}`;
    if (scope.kind === "key") return `fairness key ${scope.fairness_key} of tenant ${scope.tenant}`;
    if (scope.kind === "task") return `task ${scope.task}`;
    return `lane ${scope.lane}${scope.class ? "/" + scope.class : ""}`;
  }

  // The path of a scope's endpoint: tenants/<t>, tasks/<t>, lanes/<l> (a class goes in the body).
  function path(scope, verb) {
    const name = { tenant: "tenants", refuse: "tenants", task: "tasks", lane: "lanes" }[scope.kind];
    const id = scope.kind === "task" ? scope.task : scope.kind === "lane" ? scope.lane : scope.tenant;
    return `${name}/${encodeURIComponent(id)}/${verb}`;
  }

  // Ask the operator: a title, then fields ({name, label, type: text|number|checkbox}).
  // Resolves to the values, or null when the dialog is cancelled or dismissed.
  function ask(title, fields, confirmLabel) {
    const dialog = document.getElementById("ask");
    document.getElementById("ask-title").textContent = title;
    document.getElementById("ask-ok").textContent = confirmLabel || "Confirm";
    const inputs = fields.map((f) => h("input", { name: f.name, type: f.type || "text", min: f.min, step: f.step,
      maxlength: f.type === "text" || !f.type ? 200 : null, placeholder: f.placeholder }));
    document.getElementById("ask-fields").replaceChildren(...fields.map((f, i) =>
      h("label", { class: f.type === "checkbox" ? "check" : "" }, f.type === "checkbox" ? [inputs[i], ` ${f.label}`] : [f.label, inputs[i]])));
    return new Promise((resolve) => {
      dialog.addEventListener("close", () => {
        if (dialog.returnValue !== "ok") { resolve(null); return; }
        resolve(Object.fromEntries(fields.map((f, i) =>
          [f.name, f.type === "checkbox" ? inputs[i].checked : inputs[i].value.trim()])));
      }, { once: true });
      dialog.returnValue = "";
      dialog.showModal();
      (inputs[0] || document.getElementById("ask-ok")).focus();
    });
  }

  function seconds(minutes) {
    const n = Number(minutes);
    return minutes === "" ? null : n * 60;
  }

  async function pause(scope) {
    const fields = [
      { name: "reason", label: "Reason", placeholder: "shown wherever the pause is" },
      { name: "minutes", label: "For (minutes, empty: until resumed)", type: "number", min: "0", step: "any" },
      { name: "cancel_running", label: "also cancel its running jobs", type: "checkbox" },
    ];
    if (scope.kind === "tenant") fields.push({ name: "refuse", label: "also refuse its new submissions", type: "checkbox" });
    const quarantine = scope.kind === "refuse";
    const title = quarantine ? `Refuse the new submissions of tenant ${scope.tenant}?` : `Pause ${text(scope)}?`;
    const got = await ask(title, quarantine ? fields.slice(0, 2) : fields, quarantine ? "Quarantine" : "Pause");
    if (!got) return;
    const body = { reason: got.reason, for: seconds(got.minutes) };
    if (!quarantine) body.cancel_running = got.cancel_running;
    if (scope.kind === "tenant") body.refuse_submissions = got.refuse;
    if (scope.kind === "lane" && scope.class) body.class = scope.class;
    const out = await api(path(scope, quarantine ? "quarantine" : "pause"), { method: "POST", body: JSON.stringify(body) });
    const until = out.until_ms ? ` until ${when(out.until_ms)}` : " until resumed";
    status(`${quarantine ? "quarantined" : "paused"} ${out.text}${until}${out.running_asked ? `; ${out.running_asked} running job(s) asked to stop` : ""}`);
    await render();
  }

  async function resume(scope) {
    const what = scope.kind === "refuse" ? `tenant ${scope.tenant} (its pause and its quarantine)` : text(scope);
    if (!confirm(`Resume ${what}?`)) return;
    const body = scope.kind === "lane" && scope.class ? JSON.stringify({ class: scope.class }) : undefined;
    const out = await api(path(scope, "resume"), { method: "POST", body });
    status(`resumed ${out.text}${out.moved_back ? `; ${out.moved_back} parked job(s) back in their queues` : ""}`);
    await render();
  }

  function act(fn, scope) {
    return () => fn(scope).catch((e) => status(e.message, true));
  }

  // A pause or resume button for a scope, as its pause stands now (nothing without operate).
  function button(scope, label) {
    if (!session.operate) return null;
    const on = paused.has(key(scope));
    return h("button", { type: "button", class: on ? "" : "danger", "data-op": on ? "resume" : "pause",
      "data-scope": key(scope).split("\u0000").filter(Boolean).join(":"),
      onclick: act(on ? resume : pause, scope) }, `${on ? "Resume" : "Pause"}${label ? " " + label : ""}`);
  }

  function quarantineButton(tenant) {
    const scope = { kind: "refuse", tenant };
    if (!session.operate || paused.has(key(scope))) return null;
    return h("button", { type: "button", class: "danger", "data-op": "quarantine", onclick: act(pause, scope) },
      "Refuse its submissions");
  }

  function banner(read) {
    paused = new Map(read.pauses.map((p) => [key(p.scope), p]));
    const el = document.getElementById("paused");
    el.hidden = read.pauses.length === 0;
    el.replaceChildren(h("strong", {}, `Paused (${read.pauses.length})`), h("ul", {}, read.pauses.map((p) => {
      const told = [p.reason || "no reason given", p.by ? `by ${p.by}` : null, `since ${when(p.at_ms)}`,
        p.ending ? "ending now" : p.until_ms ? `until ${when(p.until_ms)}` : "until resumed",
        p.parked ? `${p.parked} parked job(s)` : null].filter(Boolean).join(", ");
      const scope = p.scope.kind === "refuse" ? { kind: "refuse", tenant: p.scope.tenant } : p.scope;
      return h("li", { "data-scope": key(p.scope).split("\u0000").filter(Boolean).join(":") },
        h("b", {}, p.text), `: ${told} `,
        session.operate && !p.ending ? h("button", { type: "button", "data-op": "resume", onclick: act(resume, scope) }, "Resume") : null);
    })));
  }

  return { ask, banner, button, quarantineButton, key };
})();
