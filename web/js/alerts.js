// The Alerts view: the [[alerts]] rules (where each posts, as a scheme and host only), a test
// send per rule for admins, and the recent alerts with each delivery attempt (GET /api/v1/alerts).

import { $, api, can, el, guarded, localTime, notify } from "./core.js";

export async function loadAlerts() {
  const view = await api("GET", "/api/v1/alerts");
  renderRules(view.rules);
  renderAlerts(view.alerts);
}

function renderRules(rules) {
  const tbody = $("#alert-rules tbody");
  tbody.replaceChildren();
  for (const r of rules) {
    const where = r.destination ?? `not set (${r.url_env} is empty)`;
    const actions = el("td", { className: "actions-cell" });
    if (can("admin")) {
      const b = el("button", { type: "button", "data-action": "test", "aria-label": `Send a test alert through ${r.name}` }, "Send a test");
      b.addEventListener("click", () => guarded("alerts", () => sendTest(r.name)));
      actions.append(b);
    }
    tbody.append(
      el(
        "tr",
        { "data-rule": r.name },
        el("td", { className: "id" }, r.name),
        el("td", {}, r.on.join(", ")),
        el("td", {}, `${r.format}${r.signed ? " · signed" : ""}`),
        el("td", { className: "id", title: r.url_env ? `read from ${r.url_env}` : "" }, where),
        el("td", {}, `1 per subject per ${every(r.min_interval_secs)}, at most ${r.cap}`),
        actions,
      ),
    );
  }
  if (!rules.length) {
    tbody.append(el("tr", {}, el("td", { colSpan: 6, className: "muted" }, "No rules: add [[alerts]] to the config file (docs/operations.md, Alerts).")));
  }
}

function every(secs) {
  if (secs % 3600 === 0) return `${secs / 3600} h`;
  if (secs % 60 === 0) return `${secs / 60} min`;
  return `${secs} s`;
}

/** A delivery attempt in words: the receiver's status, or why there was none. */
function attempt(d) {
  const what = d.error ? `${d.status ?? "no answer"}: ${d.error}` : `${d.status} delivered`;
  return `${localTime(d.at)} · ${what} (${d.duration_ms} ms)`;
}

function renderAlerts(alerts) {
  const tbody = $("#alerts tbody");
  tbody.replaceChildren();
  for (const a of alerts) {
    const tries = el("td", { className: "deliveries" });
    if (!a.deliveries.length) tries.append(el("span", { className: "muted" }, "not tried yet"));
    for (const d of a.deliveries) tries.append(el("div", { "data-outcome": d.error ? "failure" : "success" }, attempt(d)));
    tbody.append(
      el(
        "tr",
        { "data-alert": a.id, "data-kind": a.kind, "data-state": a.state },
        el("td", {}, localTime(a.raised_at)),
        el("td", { className: "id" }, a.rule),
        el("td", {}, el("code", {}, a.kind)),
        el("td", {}, a.summary),
        el("td", { className: "alert-state", "data-state": a.state }, a.state),
        tries,
      ),
    );
  }
  if (!alerts.length) tbody.append(el("tr", {}, el("td", { colSpan: 6, className: "muted" }, "No alerts yet.")));
}

async function sendTest(rule) {
  await api("POST", `/api/v1/alerts/${encodeURIComponent(rule)}/test`);
  notify("alerts", `Test alert of ${rule} queued; its delivery shows below.`);
  await loadAlerts();
  // The sender posts it within a moment: show how it went.
  setTimeout(() => guarded("alerts", loadAlerts), 1500);
}
