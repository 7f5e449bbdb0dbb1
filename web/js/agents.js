// The Agents view: the agent keys (GET /api/v1/agents), a new one (its key shown once, with a
// copy button) and revoking one.

import { $, api, el, guarded, localTime, notify, session } from "./core.js";

export async function loadAgents() {
  const agents = await api("GET", "/api/v1/agents");
  const tbody = $("#agents tbody");
  tbody.replaceChildren();
  const active = agents.filter((a) => !a.revoked_at);
  const revoked = agents.filter((a) => a.revoked_at);
  for (const a of [...active, ...revoked]) {
    const tr = el("tr", { "data-agent": a.name, "data-revoked": String(Boolean(a.revoked_at)) });
    tr.append(el("td", { className: "id" }, a.name, a.name === session.agent ? el("span", { className: "muted" }, " (you)") : null));
    tr.append(el("td", {}, a.admin ? "admin" : "agent"));
    tr.append(el("td", {}, localTime(Date.parse(a.created_at))));
    tr.append(el("td", { className: "agent-state" }, a.revoked_at ? `revoked ${localTime(Date.parse(a.revoked_at))}` : "active"));
    const actions = el("td", { className: "actions-cell" });
    if (!a.revoked_at) {
      const b = el("button", { type: "button", "data-action": "revoke", "aria-label": `Revoke ${a.name}` }, "Revoke");
      b.addEventListener("click", () => guarded("agents", () => revoke(a)));
      actions.append(el("div", { className: "row-actions" }, b));
    }
    tr.append(actions);
    tbody.append(tr);
  }
  if (!agents.length) tbody.append(el("tr", {}, el("td", { colSpan: 5, className: "muted" }, "No agents yet.")));
}

async function revoke(a) {
  const self = a.name === session.agent ? " This is the agent you are signed in as: the console signs out." : "";
  if (!confirm(`Revoke ${a.name}? Its key stops working at once.${self}`)) return;
  await api("DELETE", `/api/v1/agents/${encodeURIComponent(a.name)}`);
  notify("agents", `${a.name} revoked`);
  await loadAgents();
}

export function setupAgents() {
  $("#agent-form").addEventListener("submit", (event) => {
    event.preventDefault();
    guarded("agents", async () => {
      const name = $("#agent-name").value.trim();
      const created = await api("POST", "/api/v1/agents", { name, admin: $("#agent-admin").checked });
      showKey(created);
      $("#agent-form").reset();
      await loadAgents();
    });
  });
}

function showKey(created) {
  const panel = $("#agent-key");
  const key = el("code", { id: "new-key", className: "secret" }, created.key);
  const copy = el("button", { type: "button", id: "copy-key" }, "Copy");
  copy.addEventListener("click", () =>
    guarded("agents", async () => {
      await navigator.clipboard.writeText(created.key);
      copy.textContent = "Copied";
    }),
  );
  const done = el("button", { type: "button", className: "link" }, "Done: hide the key");
  done.addEventListener("click", () => {
    panel.replaceChildren();
    panel.hidden = true;
  });
  panel.replaceChildren(
    el("p", {}, `The key of ${created.agent.name}${created.agent.admin ? " (admin)" : ""}, shown this once (rota keeps only its digest):`),
    el("p", { className: "key-line" }, key, " ", copy),
    el("p", { className: "muted" }, "Agents send it as Authorization: Bearer … (or x-api-key)."),
    done,
  );
  panel.hidden = false;
}
