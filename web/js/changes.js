// The Changes view: every change made through the console or the admin API (GET
// /api/v1/admin-actions), newest first, with who made it, their role, and the value before and
// after.

import { $, api, el, localTime } from "./core.js";

/** A value as the table shows it: `—` for none, else its JSON, short. */
function shown(v) {
  if (v === null || v === undefined) return "—";
  const text = JSON.stringify(v);
  return text.length > 160 ? `${text.slice(0, 157)}…` : text;
}

export async function loadChanges() {
  const actions = await api("GET", "/api/v1/admin-actions?limit=200");
  const tbody = $("#changes tbody");
  tbody.replaceChildren();
  for (const a of actions) {
    tbody.append(
      el(
        "tr",
        { "data-action": a.action, "data-actor": a.actor_email ?? a.actor },
        el("td", {}, localTime(Date.parse(a.at))),
        el("td", { className: "id", title: a.actor }, a.actor_email ?? a.actor, el("span", { className: "muted" }, ` (${a.actor_kind})`)),
        el("td", {}, a.role),
        el("td", {}, el("code", {}, a.action)),
        el("td", { className: "id" }, a.target ?? "—"),
        el("td", { className: "change" }, el("code", {}, shown(a.before)), " → ", el("code", {}, shown(a.after))),
      ),
    );
  }
  if (!actions.length) tbody.append(el("tr", {}, el("td", { colSpan: 6, className: "muted" }, "No changes yet.")));
}
