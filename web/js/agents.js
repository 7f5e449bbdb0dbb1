// The Agents view: the agent keys (GET /api/v1/agents) with their limits and their use of each
// (this minute's requests, today's tokens and cost, shared by every server), a new one (its key
// shown once, with a copy button), revoking one, and the lines that point an agent's clients at
// rota (GET /api/v1/agents/{name}/setup).

import { $, api, can, el, guarded, localTime, notify, session } from "./core.js";

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
    tr.append(el("td", { className: "limits-cell" }, limits(a)));
    tr.append(el("td", {}, localTime(Date.parse(a.created_at))));
    tr.append(el("td", { className: "agent-state" }, a.revoked_at ? `revoked ${localTime(Date.parse(a.revoked_at))}` : "active"));
    const actions = el("td", { className: "actions-cell" });
    const buttons = el("div", { className: "row-actions" });
    if (!a.revoked_at) {
      const b = el("button", { type: "button", "data-action": "setup", "aria-label": `Setup lines for ${a.name}` }, "Setup");
      b.addEventListener("click", () => guarded("agents", () => showSetup(a.name)));
      buttons.append(b);
    }
    if (!a.revoked_at && can("admin")) {
      const b = el("button", { type: "button", "data-action": "revoke", "aria-label": `Revoke ${a.name}` }, "Revoke");
      b.addEventListener("click", () => guarded("agents", () => revoke(a)));
      buttons.append(b);
    }
    actions.append(buttons);
    tr.append(actions);
    tbody.append(tr);
  }
  if (!agents.length) tbody.append(el("tr", {}, el("td", { colSpan: 6, className: "muted" }, "No agents yet.")));
}

const usd = (x) => `$${x > 0 && x < 0.01 ? x.toFixed(4) : x.toFixed(2)}`;

// Each limit in force with the agent's use of it: "3 / 5 requests this minute", a meter, and
// "(config)" for a limit the config file sets (the admin API cannot change it).
const LIMITS = [
  { key: "requests_per_minute", use: (u) => u.requests_this_minute, text: (used, cap) => `${used} / ${cap} requests this minute` },
  { key: "tokens_per_day", use: (u) => u.tokens_today, text: (used, cap) => `${used} / ${cap} tokens today (UTC)` },
  { key: "cost_per_day", use: (u) => u.cost_today, text: (used, cap) => `${usd(used)} / ${usd(cap)} today (UTC)` },
];

function limits(a) {
  const set = LIMITS.filter((l) => a.limits[l.key] != null);
  if (!set.length) return el("span", { className: "muted" }, `no limits · ${a.usage.tokens_today} tokens today`);
  const list = el("ul", { className: "limits" });
  for (const l of set) {
    const cap = a.limits[l.key];
    const used = l.use(a.usage);
    const state = used >= cap ? "over" : used >= 0.8 * cap ? "near" : "ok";
    const text = l.text(used, cap);
    const config = a.limits_from_config.includes(l.key) ? el("span", { className: "muted", title: `${l.key} is set in the config file` }, " (config)") : null;
    list.append(
      el(
        "li",
        { "data-limit": l.key, "data-state": state },
        // Green below 80 %, amber from there, red at the limit.
        el("meter", { min: 0, max: cap, low: 0.8 * cap, high: 0.99 * cap, optimum: 0, value: Math.min(used, cap), "aria-label": `${a.name}: ${text}` }),
        " ",
        el("span", { className: "use" }, text),
        state === "over" ? el("strong", { className: "over" }, " · at the limit") : null,
        config,
      ),
    );
  }
  return list;
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
      await showKey(created);
      $("#agent-form").reset();
      await loadAgents();
    });
  });
}

/** A copy button for `text`. */
function copyButton(text, label) {
  const b = el("button", { type: "button", className: "copy", "aria-label": label }, "Copy");
  b.addEventListener("click", () =>
    guarded("agents", async () => {
      await navigator.clipboard.writeText(text);
      b.textContent = "Copied";
    }),
  );
  return b;
}

/** The agent's setup lines for this address, each with a copy button; with its key (at
 * creation) they start with the line that sets it. */
async function setupLines(name, key) {
  const setup = await api("GET", `/api/v1/agents/${encodeURIComponent(name)}/setup?base=${encodeURIComponent(location.origin)}`);
  const box = el("div", { className: "setup", "data-agent": name });
  const keyLine = key ? `export ${setup.key_var}=${key}` : `export ${setup.key_var}=…   # the key shown once, when ${name} was created`;
  box.append(el("p", { className: "muted" }, `Each block reads the key from $${setup.key_var}; model ${setup.model ?? "PROVIDER/MODEL (set models.primary, or the agent's models)"}.`));
  for (const block of [{ client: "key", title: "The key, in the shell the client runs in", text: keyLine }, ...setup.clients]) {
    box.append(
      el("h3", {}, block.title, " ", copyButton(block.text, `Copy the ${block.client} lines`)),
      el("pre", { "data-client": block.client }, el("code", {}, block.text)),
    );
  }
  return box;
}

async function showSetup(name) {
  const panel = $("#agent-setup");
  const close = el("button", { type: "button", className: "link" }, "Close");
  close.addEventListener("click", () => {
    panel.replaceChildren();
    panel.hidden = true;
  });
  panel.replaceChildren(el("h2", {}, `Setup for ${name}`), await setupLines(name), close);
  panel.hidden = false;
  panel.scrollIntoView({ block: "nearest" });
}

async function showKey(created) {
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
    el("p", { className: "muted" }, "Agents send it as Authorization: Bearer … (or x-api-key). To point a client at rota with it:"),
    await setupLines(created.agent.name, created.key),
    done,
  );
  panel.hidden = false;
}
