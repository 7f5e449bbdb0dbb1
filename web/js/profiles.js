// The Profiles view: one card per provider, its profiles in the order rotation tries them now
// (GET /api/v1/providers `rotation`, `next`), their states, the actions on them and the ways to
// add one (the sign-ins and credentials the provider's catalog entry allows: `sign_ins`).

import { $, api, backAt, can, el, guarded, needsRelogin, notify, stateOf, until, ago } from "./core.js";

export const state = { profiles: [], providers: [] };

export async function loadProfiles(background = false) {
  const opts = { background };
  const [providers, profiles] = await Promise.all([
    api("GET", "/api/v1/providers", undefined, opts),
    api("GET", "/api/v1/profiles", undefined, opts),
  ]);
  Object.assign(state, { providers, profiles });
  return state;
}

/** The provider's profiles in rotation order. */
export function ordered(provider) {
  const byId = new Map(state.profiles.filter((p) => p.provider === provider.name).map((p) => [p.id, p]));
  const rows = (provider.rotation || []).map((id) => byId.get(id)).filter(Boolean);
  for (const p of byId.values()) if (!rows.includes(p)) rows.push(p);
  return rows;
}

const ORDER_WORDS = {
  stored: "Fixed order (set with ↑/↓, the CLI or the API); blocked profiles move to the end.",
  config: "Fixed order from the config file; blocked profiles move to the end.",
  round_robin: "Least recently used first; blocked profiles last.",
};

export function renderProfiles() {
  const root = $("#providers");
  const open = new Map([...root.querySelectorAll("section[data-provider]")].map((s) => [s.dataset.provider, $(".panel", s)]));
  const focused = document.activeElement && document.activeElement.closest("[data-provider]") ? document.activeElement : null;
  const focusKey = focused && [focused.closest("[data-provider]").dataset.provider, focused.closest("tr")?.dataset.profile, focused.dataset.action];
  root.replaceChildren();
  for (const provider of state.providers) {
    const section = $("#provider-template").content.firstElementChild.cloneNode(true);
    section.dataset.provider = provider.name;
    $(".name", section).textContent = provider.name;
    $(".meta", section).textContent = provider.preset ? `${provider.preset} preset · ${provider.api} wire format` : `${provider.api} wire format`;
    const note = $(".order-note", section);
    note.append(ORDER_WORDS[provider.order_source] || "");
    if (provider.order_source === "stored" && can("operator")) {
      const reset = el("button", { type: "button", className: "link", "data-action": "reset-order" }, "Back to least recently used");
      reset.addEventListener("click", () => guarded("profiles", () => resetOrder(provider)));
      note.append(" ", reset);
    }
    // A viewer changes nothing: no button to.
    $(".actions", section).replaceChildren(...(can("operator") ? addButtons(provider, section) : []));
    const previous = open.get(provider.name);
    if (previous && !previous.hidden) $(".panel", section).replaceWith(previous);
    const rows = ordered(provider);
    $(".empty", section).hidden = rows.length > 0;
    $("table", section).hidden = rows.length === 0;
    const tbody = $("tbody", section);
    rows.forEach((p, i) => tbody.append(profileRow(p, provider, rows, i)));
    root.append(section);
  }
  if (focusKey) {
    const [prov, row, action] = focusKey;
    const sel = `section[data-provider="${CSS.escape(prov)}"] ${row ? `tr[data-profile="${CSS.escape(row)}"] ` : ""}[data-action="${action}"]`;
    document.querySelector(sel)?.focus();
  }
}

function profileRow(p, provider, rows, index) {
  const tr = el("tr", { "data-profile": p.id, "data-state": p.status.state });
  const isNext = provider.next === p.id;
  const pos = el("td", { className: "pos" }, String(index + 1));
  if (isNext) pos.append(" ", el("span", { className: "badge next", title: "the next request goes here" }, "next"));
  tr.append(pos);
  const who = el("td", { className: "id" }, el("span", { className: "pid" }, p.id));
  if (p.email) who.append(el("span", { className: "email muted" }, p.email));
  if (p.paid) who.append(" ", el("span", { className: "badge paid", title: "each call costs money: a request it serves raises the paid alert" }, "paid"));
  tr.append(who);
  const { short, detail } = stateOf(p);
  tr.append(el("td", { className: "state-cell" }, el("span", {
    className: "state", tabIndex: 0, "data-state": p.status.state, "data-detail": detail, title: detail, "aria-label": `${short}: ${detail}`,
  }, short)));
  tr.append(quotaCell(p, provider));
  tr.append(el("td", { className: "type" }, p.type));
  tr.append(el("td", { className: "expires", title: p.expires_at || "" }, p.expires_at ? until(Date.parse(p.expires_at)) : "—"));
  tr.append(el("td", { className: "last-used" }, ago(p.usage_stats.last_used)));
  const s = p.usage_stats;
  tr.append(el("td", { className: "counters" }, `${s.success_count} · ${s.failure_total} · ${s.error_count}`));
  const actions = el("div", { className: "row-actions" });
  const button = (action, label, { enabled = true, primary = false, name } = {}) => {
    if (!can(action === "delete" ? "admin" : "operator")) return;
    const b = el("button", { type: "button", "data-action": action, disabled: !enabled, className: primary ? "primary" : "", "aria-label": name }, label);
    b.addEventListener("click", () => guarded("profiles", () => rowAction(action, p, provider, rows, index)));
    actions.append(b);
  };
  if (needsRelogin(p)) button("relogin", "Re-login", { primary: true });
  if (backAt(p) !== null || p.status.state === "disabled") button("clear", "Clear", { primary: !needsRelogin(p) });
  if (p.enabled) button("disable", "Disable");
  else button("enable", "Enable", { primary: true });
  const fix = provider.order_source === "stored" ? "" : " (fixes the order)";
  button("up", "↑", { enabled: index > 0, name: `Move ${p.id} up${fix}` });
  button("down", "↓", { enabled: index < rows.length - 1, name: `Move ${p.id} down${fix}` });
  if (p.type === "oauth" && !needsRelogin(p)) button("relogin", "Re-login");
  if (can("operator")) {
    const paid = el("input", { type: "checkbox", "data-action": "paid", checked: p.paid, "aria-label": `${p.id} costs money per call (paid)` });
    paid.addEventListener("change", () => guarded("profiles", () => rowAction("paid", p, provider, rows, index)));
    actions.append(el("label", { className: "toggle", title: "each call costs money: a request it serves raises the paid alert" }, paid, " paid"));
  }
  if (p.source === "stored") button("delete", "Delete");
  tr.append(el("td", { className: "actions-cell" }, actions));
  return tr;
}

/** What the provider last reported of the profile's quota for the model rotation is shown for
 * (else the latest report), and whether that puts the profile after the others now. */
function quotaCell(p, provider) {
  const model = (provider.rotation_model || "").split("/").slice(1).join("/");
  const q = (p.quota || []).find((x) => x.model === model) || (p.quota || [])[0];
  if (!q) return el("td", { className: "quota muted", title: "no rate-limit headers seen yet" }, "—");
  const part = (left, limit, what) => (left == null ? null : `${left}${limit == null ? "" : `/${limit}`} ${what}`);
  const short = [
    part(q.remaining_requests, q.limit_requests, "req"),
    part(q.remaining_tokens, q.limit_tokens, "tok"),
    q.plan_left_percent == null ? null : `${q.plan_left_percent}% of plan`,
  ]
    .filter(Boolean)
    .join(" · ");
  const resets = [q.requests_reset_at, q.tokens_reset_at, q.plan_reset_at].filter((t) => t && t > Date.now());
  const detail = `${q.model}: ${short} left${resets.length ? `, resets ${until(Math.min(...resets))}` : ""}, reported ${ago(q.seen_at)}`;
  const td = el("td", { className: "quota", title: detail }, el("span", { "aria-label": detail }, short));
  if (q.low_until) {
    const why = `at its quota floor: tried after the profiles with quota, ${until(q.low_until)}`;
    td.append(" ", el("span", { className: "badge low", title: why, "aria-label": why }, "last until reset"));
  }
  return td;
}

async function rowAction(action, p, provider, rows, index) {
  const id = encodeURIComponent(p.id);
  switch (action) {
    case "enable":
    case "disable":
    case "clear":
      await api("POST", `/api/v1/profiles/${id}/${action}`);
      notify("profiles", `${p.id}: ${action === "clear" ? "cleared" : action + "d"}`);
      break;
    case "paid":
      await api("PATCH", `/api/v1/profiles/${id}`, { paid: !p.paid });
      notify("profiles", `${p.id}: ${p.paid ? "no longer marked paid" : "marked paid (a request it serves raises the paid alert)"}`);
      break;
    case "delete":
      if (!confirm(`Delete ${p.id} and its secret?`)) return;
      await api("DELETE", `/api/v1/profiles/${id}`);
      notify("profiles", `${p.id} deleted`);
      break;
    case "up":
    case "down": {
      const ids = rows.map((r) => r.id);
      const j = action === "up" ? index - 1 : index + 1;
      [ids[index], ids[j]] = [ids[j], ids[index]];
      await api("PUT", `/api/v1/providers/${encodeURIComponent(provider.name)}/order`, { profiles: ids });
      notify("profiles", `${provider.name} now follows a fixed order: ${ids.join(" → ")}`);
      break;
    }
    case "relogin":
      await startLogin(provider, null);
      return;
  }
  await loadProfiles();
  renderProfiles();
}

async function resetOrder(provider) {
  await api("DELETE", `/api/v1/providers/${encodeURIComponent(provider.name)}/order`);
  notify("profiles", `${provider.name}: back to least recently used first`);
  await loadProfiles();
  renderProfiles();
}

// -- adding profiles ------------------------------------------------------------------------

/** The kinds of credential typed or uploaded into the add-key form, with their names there. */
const KEY_KINDS = {
  api_key: "API key",
  token: "token",
  client_credentials: "OAuth client (client credentials)",
  service_account: "Service account key (JSON)",
};

/** One button per way the provider's catalog entry allows to add an account (`sign_ins`); an
 * API key and a token share one. */
function addButtons(provider, section) {
  const kinds = provider.sign_ins.map((s) => s.kind);
  const buttons = [];
  for (const s of provider.sign_ins) {
    let action = { browser: "add-account", device: "device-login", paste: "paste-url", client_credentials: "add-client", service_account: "add-service-account" }[s.kind];
    let label = s.label;
    if (s.kind === "api_key" || (s.kind === "token" && !kinds.includes("api_key"))) {
      action = "add-key";
      label = kinds.includes("api_key") ? "Add key or token" : s.label;
    }
    if (!action) continue;
    const b = el("button", { type: "button", "data-action": action, "data-kind": s.kind, className: buttons.length ? "" : "primary" }, label);
    b.addEventListener("click", () => guarded("profiles", () => providerAction(action, provider, section)));
    buttons.push(b);
  }
  return buttons;
}

async function providerAction(action, provider, section) {
  const panel = $(".panel", section);
  switch (action) {
    case "add-account":
      return startLogin(provider, panel);
    case "paste-url":
      return pasteLogin(provider, panel, await api("POST", `/api/v1/oauth/${encodeURIComponent(provider.name)}/authorize`));
    case "device-login":
      return deviceLogin(provider, panel);
    case "add-key":
      return addKey(provider, panel, provider.sign_ins.some((s) => s.kind === "api_key") ? "api_key" : "token");
    case "add-client":
      return addKey(provider, panel, "client_credentials");
    case "add-service-account":
      return addKey(provider, panel, "service_account");
  }
}

async function startLogin(provider, panel) {
  const auth = await api("POST", `/api/v1/oauth/${encodeURIComponent(provider.name)}/authorize`);
  if (!auth.paste) {
    location.assign(auth.authorize_url); // the provider sends the browser back to /oauth/callback
    return;
  }
  const section = $(`section[data-provider="${CSS.escape(provider.name)}"]`);
  pasteLogin(provider, panel || $(".panel", section), auth);
}

function pasteLogin(provider, panel, auth) {
  panel.replaceChildren(
    el("p", {}, "1. Open the provider's login page and sign in:"),
    el("a", { id: "paste-open", href: auth.authorize_url, target: "_blank", rel: "noopener noreferrer" }, "Open the login page ↗"),
    el("p", {}, el("label", { htmlFor: "paste-url" }, `2. The browser then ends on ${auth.redirect_uri}…, which may not load. Copy that whole address and paste it here:`)),
    el("textarea", { id: "paste-url", rows: 3, spellcheck: false, placeholder: `${auth.redirect_uri}?code=…&state=…` }),
  );
  const submit = el("button", { id: "paste-submit", type: "button", className: "primary" }, "Finish login");
  submit.addEventListener("click", () =>
    guarded("profiles", async () => {
      const url = $("#paste-url", panel).value.trim();
      const done = await api("POST", `/api/v1/oauth/${encodeURIComponent(provider.name)}/paste`, { url, state: auth.state });
      panel.hidden = true;
      notify("profiles", `Logged in ${done.profile_id}`);
      await loadProfiles();
      renderProfiles();
    }),
  );
  panel.append(submit, cancelButton(panel));
  panel.hidden = false;
}

async function deviceLogin(provider, panel) {
  const d = await api("POST", `/api/v1/oauth/${encodeURIComponent(provider.name)}/device`);
  const link = d.verification_uri_complete || d.verification_uri;
  panel.replaceChildren(
    el("p", {}, "Open this page on any device, sign in and enter the code:"),
    el("a", { id: "device-link", href: link, target: "_blank", rel: "noopener noreferrer" }, link),
    el("p", { className: "code", id: "device-code" }, d.user_code),
    el("p", { className: "muted", id: "device-status" }, `Waiting for the login (the code expires ${until(Date.parse(d.expires_at))})…`),
  );
  panel.append(cancelButton(panel));
  panel.hidden = false;
  const poll = async () => {
    if (panel.hidden) return;
    const f = await api("GET", `/api/v1/oauth/flows/${encodeURIComponent(d.flow_id)}`);
    if (f.state === "pending") return setTimeout(() => guarded("profiles", poll), 1500);
    panel.hidden = true;
    if (f.state === "done") notify("profiles", `Logged in ${f.profile_id}`);
    else notify("profiles", `Device login failed: ${f.error}`, "error");
    await loadProfiles();
    renderProfiles();
  };
  setTimeout(() => guarded("profiles", poll), 1500);
}

function addKey(provider, panel, chosen) {
  const form = el("form", { className: "inline add-key" });
  // The kinds the provider takes; a service identity (docs/providers.md) is exchanged for tokens by rota.
  const kinds = provider.sign_ins.map((s) => s.kind).filter((k) => k in KEY_KINDS);
  const kind = el("select", { id: "key-type" }, ...kinds.map((k) => el("option", { value: k, selected: k === chosen }, KEY_KINDS[k])));
  const expiry = el("input", { id: "key-expires", type: "datetime-local", disabled: true });
  const nameLabel = el("label", { htmlFor: "key-name" }, "Name");
  const name = el("input", { id: "key-name", required: true, placeholder: "work", autocomplete: "off" });
  const secret = el("input", { id: "key-secret", type: "password", required: true, autocomplete: "off", placeholder: "sk-…" });
  const secretLabel = el("label", { htmlFor: "key-secret" }, "Secret");
  // A service account key is uploaded: the profile is named after its client_email.
  const file = el("input", { id: "key-file", type: "file", accept: "application/json,.json", hidden: true });
  file.addEventListener("change", async () => {
    const text = (await file.files[0]?.text()) ?? "";
    let email = "";
    try {
      email = JSON.parse(text).client_email ?? "";
    } catch {
      email = "";
    }
    name.value = email;
    secret.value = text;
  });
  kind.addEventListener("change", () => {
    expiry.disabled = kind.value !== "token";
    const client = kind.value === "client_credentials";
    const account = kind.value === "service_account";
    nameLabel.textContent = client ? "Client ID" : account ? "Account" : "Name";
    name.placeholder = client ? "the application (client) id" : account ? "from the key file" : "work";
    name.readOnly = account;
    secretLabel.textContent = account ? "Key file" : "Secret";
    secretLabel.htmlFor = account ? "key-file" : "key-secret";
    secret.hidden = account;
    file.hidden = !account;
    file.required = account;
    secret.placeholder = client ? "client secret" : "sk-…";
  });
  kind.dispatchEvent(new Event("change"));
  form.append(
    el("label", { htmlFor: "key-type" }, "Type"), kind,
    nameLabel,
    name,
    secretLabel,
    secret,
    file,
    el("label", { htmlFor: "key-expires" }, "Expires (tokens)"), expiry,
    el("button", { id: "key-submit", type: "submit", className: "primary" }, "Add"),
  );
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    guarded("profiles", async () => {
      const body = { provider: provider.name, name: $("#key-name", form).value.trim(), secret: $("#key-secret", form).value, type: kind.value };
      if (kind.value === "token" && expiry.value) body.expires_at = new Date(expiry.value).toISOString();
      const p = await api("POST", "/api/v1/profiles", body);
      panel.hidden = true;
      notify("profiles", `Added ${p.id}`);
      await loadProfiles();
      renderProfiles();
    });
  });
  panel.replaceChildren(form, cancelButton(panel));
  panel.hidden = false;
  $("#key-name", form).focus();
}

function cancelButton(panel) {
  const b = el("button", { type: "button", className: "link" }, "Cancel");
  b.addEventListener("click", () => (panel.hidden = true));
  return b;
}

/** Live countdowns; true when a window ended (the data needs a reload). */
export function tickProfiles() {
  let ended = false;
  for (const p of state.profiles) {
    const cell = $(`#providers tr[data-profile="${CSS.escape(p.id)}"] .state`);
    if (cell) {
      const { short } = stateOf(p);
      if (cell.textContent !== short) cell.textContent = short;
    }
    const back = backAt(p);
    if (back !== null && back <= Date.now()) ended = true;
  }
  return ended;
}
