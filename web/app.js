// The rota console: everything comes from /api/v1 with the session cookie; changes carry the
// session's CSRF token. Text from the server is always set with textContent, never as HTML.
"use strict";

let csrf = "";
let profiles = [];
let providers = [];
let attemptsCursor = null;

const $ = (sel, root = document) => root.querySelector(sel);

function el(tag, attrs = {}, text) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k.startsWith("data-")) e.setAttribute(k, v);
    else e[k] = v;
  }
  if (text !== undefined) e.textContent = text;
  return e;
}

// `background`: a refresh nobody asked for (the 5 s profile poll); it does not count as a use
// of the session, so an unattended console still signs out after server.session_idle.
async function api(method, path, body, { background = false } = {}) {
  const headers = {};
  if (method !== "GET") headers["x-csrf-token"] = csrf;
  if (background) headers["x-rota-background"] = "1";
  if (body !== undefined) headers["content-type"] = "application/json";
  const resp = await fetch(path, {
    method,
    credentials: "same-origin",
    headers,
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  if (resp.status === 401) {
    location.reload(); // the session ended: back to sign-in
    throw new Error("signed out");
  }
  const text = await resp.text();
  const data = text ? JSON.parse(text) : null;
  if (!resp.ok) throw new Error((data && data.error && data.error.message) || `${method} ${path}: ${resp.status}`);
  return data;
}

function flash(message, kind = "info") {
  const f = $("#flash");
  f.textContent = message;
  f.dataset.kind = kind;
  f.hidden = false;
  clearTimeout(flash.timer);
  if (kind !== "error") flash.timer = setTimeout(() => (f.hidden = true), 6000);
}

async function guarded(action) {
  try {
    await action();
  } catch (e) {
    flash(e.message, "error");
  }
}

// -- time -----------------------------------------------------------------------------------

function clock(ms) {
  const s = Math.max(0, Math.ceil(ms / 1000));
  const h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60), sec = s % 60;
  const pad = (n) => String(n).padStart(2, "0");
  return h ? `${h}:${pad(m)}:${pad(sec)}` : `${m}:${pad(sec)}`;
}

function ago(ms) {
  if (ms == null) return "never";
  const s = Math.round((Date.now() - ms) / 1000);
  if (s < 60) return `${s}s ago`;
  if (s < 3600) return `${Math.round(s / 60)} min ago`;
  if (s < 86400) return `${Math.round(s / 3600)} h ago`;
  return new Date(ms).toISOString().slice(0, 16).replace("T", " ");
}

// -- profiles -------------------------------------------------------------------------------

function stateText(p) {
  const st = p.status;
  switch (st.state) {
    case "usable":
      return "usable";
    case "cooling": {
      // The window that ends last, then how many other windows (each model cools on its own).
      const others = st.windows.length - 1;
      const more = others > 0 ? ` +${others} more` : "";
      return `cooling ${clock(st.until - Date.now())} · ${st.reason}${st.model ? ` (${st.model})` : ""}${more}`;
    }
    case "disabled":
      if (p.type === "oauth" && st.reason === "auth_permanent") return "disabled · needs re-login";
      return st.until ? `disabled ${clock(st.until - Date.now())} · ${st.reason}` : `disabled · ${st.reason} (until cleared)`;
    default:
      return `off · ${st.why}`;
  }
}

/// The provider's profiles in the order rotation tries them first: the explicit order, then the rest.
function ordered(provider) {
  const mine = profiles.filter((p) => p.provider === provider.name);
  const rank = (id) => {
    const i = provider.order.indexOf(id);
    return i < 0 ? provider.order.length : i;
  };
  return mine.sort((a, b) => rank(a.id) - rank(b.id) || a.id.localeCompare(b.id));
}

async function loadProfiles(background = false) {
  const opts = { background };
  [providers, profiles] = await Promise.all([
    api("GET", "/api/v1/providers", undefined, opts),
    api("GET", "/api/v1/profiles", undefined, opts),
  ]);
  renderProfiles();
}

function renderProfiles() {
  const root = $("#providers");
  const open = new Map([...root.querySelectorAll("section[data-provider]")].map((s) => [s.dataset.provider, $(".panel", s)]));
  root.replaceChildren();
  for (const provider of providers) {
    const section = $("#provider-template").content.firstElementChild.cloneNode(true);
    section.dataset.provider = provider.name;
    $(".name", section).textContent = provider.name;
    const source = { stored: "explicit order", config: "order from the config file", round_robin: "least recently used first" }[provider.order_source];
    $(".meta", section).textContent = `${provider.api} · ${source}`;
    for (const b of section.querySelectorAll("[data-action]")) {
      if (["add-account", "device-login", "paste-url"].includes(b.dataset.action)) b.hidden = !provider.oauth;
      b.addEventListener("click", () => guarded(() => providerAction(b.dataset.action, provider, section)));
    }
    const previous = open.get(provider.name);
    if (previous && !previous.hidden) $(".panel", section).replaceWith(previous);
    const rows = ordered(provider);
    $(".empty", section).hidden = rows.length > 0;
    $("table", section).hidden = rows.length === 0;
    const tbody = $("tbody", section);
    rows.forEach((p, i) => tbody.append(profileRow(p, provider, rows, i)));
    root.append(section);
  }
}

function profileRow(p, provider, rows, index) {
  const tr = el("tr", { "data-profile": p.id });
  tr.append(el("td", { className: "id" }, p.id));
  tr.append(el("td", { className: "type" }, p.type));
  tr.append(el("td", { className: "email" }, p.email || ""));
  tr.append(el("td", { className: "last-used" }, ago(p.usage_stats.last_used)));
  const state = el("td", { className: "state", "data-state": p.status.state, title: p.status_text }, stateText(p));
  tr.append(state);
  const s = p.usage_stats;
  tr.append(el("td", { className: "counters" }, `${s.success_count} · ${s.failure_total} · ${s.error_count}`));
  const actions = el("td", { className: "row-actions" });
  const button = (action, label, enabled = true) => {
    const b = el("button", { "data-action": action, title: label, disabled: !enabled }, label);
    b.addEventListener("click", () => guarded(() => rowAction(action, p, provider, rows, index)));
    actions.append(b);
  };
  button("up", "↑", index > 0);
  button("down", "↓", index < rows.length - 1);
  if (p.enabled) button("disable", "Disable");
  else button("enable", "Enable");
  if (p.status.state === "cooling" || p.status.state === "disabled") button("clear", "Clear");
  if (p.type === "oauth") button("relogin", "Re-login");
  if (p.source === "stored") button("delete", "Delete");
  tr.append(actions);
  return tr;
}

async function rowAction(action, p, provider, rows, index) {
  const id = encodeURIComponent(p.id);
  switch (action) {
    case "enable":
    case "disable":
    case "clear":
      await api("POST", `/api/v1/profiles/${id}/${action}`);
      flash(`${p.id}: ${action === "clear" ? "cleared" : action + "d"}`);
      break;
    case "delete":
      if (!confirm(`Delete ${p.id} and its secret?`)) return;
      await api("DELETE", `/api/v1/profiles/${id}`);
      flash(`${p.id} deleted`);
      break;
    case "up":
    case "down": {
      const ids = rows.map((r) => r.id);
      const j = action === "up" ? index - 1 : index + 1;
      [ids[index], ids[j]] = [ids[j], ids[index]];
      await api("PUT", `/api/v1/providers/${encodeURIComponent(provider.name)}/order`, { profiles: ids });
      flash(`${provider.name}: ${ids.join(" → ")}`);
      break;
    }
    case "relogin":
      await startLogin(provider, null);
      return;
  }
  await loadProfiles();
}

// -- adding profiles ------------------------------------------------------------------------

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
      return addKey(provider, panel);
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
    el("p", {}, `2. The browser then ends on ${auth.redirect_uri}…, which may not load. Copy that whole address and paste it here:`),
    el("textarea", { id: "paste-url", rows: 3, spellcheck: false, placeholder: `${auth.redirect_uri}?code=…&state=…` }),
  );
  const submit = el("button", { id: "paste-submit", className: "primary" }, "Finish login");
  submit.addEventListener("click", () =>
    guarded(async () => {
      const url = $("#paste-url", panel).value.trim();
      const done = await api("POST", `/api/v1/oauth/${encodeURIComponent(provider.name)}/paste`, { url, state: auth.state });
      panel.hidden = true;
      flash(`Logged in ${done.profile_id}`);
      await loadProfiles();
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
    el("p", { className: "muted", id: "device-status" }, `Waiting for the login (the code expires at ${d.expires_at.slice(11, 16)} UTC)…`),
  );
  panel.append(cancelButton(panel));
  panel.hidden = false;
  const poll = async () => {
    if (panel.hidden) return;
    const f = await api("GET", `/api/v1/oauth/flows/${encodeURIComponent(d.flow_id)}`);
    if (f.state === "pending") return setTimeout(() => guarded(poll), 1500);
    panel.hidden = true;
    if (f.state === "done") flash(`Logged in ${f.profile_id}`);
    else flash(`Device login failed: ${f.error}`, "error");
    await loadProfiles();
  };
  setTimeout(() => guarded(poll), 1500);
}

function addKey(provider, panel) {
  const form = el("form", { className: "inline" });
  form.append(
    el("label", { htmlFor: "key-name" }, "Name"),
    el("input", { id: "key-name", required: true, placeholder: "work", autocomplete: "off" }),
    el("label", { htmlFor: "key-secret" }, "API key"),
    el("input", { id: "key-secret", type: "password", required: true, autocomplete: "off", placeholder: "sk-…" }),
    el("button", { id: "key-submit", type: "submit", className: "primary" }, "Add"),
  );
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    guarded(async () => {
      const p = await api("POST", "/api/v1/profiles", {
        provider: provider.name,
        name: $("#key-name", form).value.trim(),
        secret: $("#key-secret", form).value,
      });
      panel.hidden = true;
      flash(`Added ${p.id}`);
      await loadProfiles();
    });
  });
  panel.replaceChildren(form, cancelButton(panel));
  panel.hidden = false;
  $("#key-name", form).focus();
}

function cancelButton(panel) {
  const b = el("button", { className: "link" }, "Cancel");
  b.addEventListener("click", () => (panel.hidden = true));
  return b;
}

// -- attempts -------------------------------------------------------------------------------

async function loadAttempts(more = false) {
  const q = new URLSearchParams({ limit: "50" });
  for (const [field, id] of [["provider", "filter-provider"], ["profile", "filter-profile"], ["reason", "filter-reason"], ["outcome", "filter-outcome"]]) {
    const v = $(`#${id}`).value.trim();
    if (v) q.set(field, v);
  }
  if (more && attemptsCursor) q.set("cursor", attemptsCursor);
  const page = await api("GET", `/api/v1/attempts?${q}`);
  const tbody = $("#attempts tbody");
  if (!more) tbody.replaceChildren();
  for (const a of page.items) {
    const tr = el("tr", { "data-outcome": a.outcome });
    const cells = [
      new Date(a.started_at).toISOString().slice(11, 19),
      a.agent || "",
      a.kind,
      `${a.provider}/${a.model}`,
      a.profile_id || "—",
      a.outcome,
      a.reason || "",
      a.http_status ?? "",
      a.duration_ms ?? "",
      a.error || "",
    ];
    for (const c of cells) tr.append(el("td", {}, String(c)));
    tbody.append(tr);
  }
  attemptsCursor = page.next_cursor;
  $("#attempts-more").hidden = !attemptsCursor;
  if (!tbody.children.length) {
    const tr = el("tr");
    tr.append(el("td", { colSpan: 10, className: "muted" }, "No attempts match."));
    tbody.append(tr);
  }
}

// -- chains ---------------------------------------------------------------------------------

async function loadChains() {
  const [models] = await Promise.all([api("GET", "/api/v1/models"), loadProfiles()]);
  const root = $("#chains");
  root.replaceChildren();
  for (const c of models.chains) {
    const card = el("section", { className: "card chain", "data-agent": c.agent });
    card.append(el("h2", {}, c.agent === "(default)" ? "Every agent (default)" : `Agent ${c.agent}`));
    if (c.error) card.append(el("p", { className: "error" }, c.error));
    const list = el("ol");
    for (const model of c.chain) {
      const li = el("li", {}, model);
      const provider = model.split("/")[0];
      const states = profiles.filter((p) => p.provider === provider).map((p) => `${p.name}: ${stateText(p)}`);
      li.append(el("span", { className: "muted" }, states.length ? ` — ${states.join(", ")}` : " — no profiles"));
      list.append(li);
    }
    card.append(list);
    root.append(card);
  }
  for (const v of models.virtual_models) {
    const card = el("section", { className: "card chain", "data-model": v.name });
    card.append(el("h2", {}, `Virtual model ${v.name} (${v.strategy})`), el("p", {}, v.chain.join(" → ")));
    root.append(card);
  }
}

// -- shell ----------------------------------------------------------------------------------

function show(view) {
  for (const tab of document.querySelectorAll(".tab")) tab.setAttribute("aria-selected", String(tab.dataset.view === view));
  for (const v of document.querySelectorAll(".view")) v.hidden = v.id !== `view-${view}`;
  const load = { profiles: loadProfiles, attempts: () => loadAttempts(), chains: loadChains }[view];
  guarded(load);
}

function tick() {
  // Live countdowns; a window that ended reloads the table.
  let ended = false;
  for (const p of profiles) {
    const cell = $(`tr[data-profile="${CSS.escape(p.id)}"] .state`);
    if (!cell) continue;
    cell.textContent = stateText(p);
    if (p.status.until && p.status.until <= Date.now()) ended = true;
  }
  if (ended) guarded(loadProfiles);
}

async function main() {
  const session = await api("GET", "/api/v1/session");
  csrf = session.csrf;
  $("#agent").textContent = session.agent;
  for (const tab of document.querySelectorAll(".tab")) tab.addEventListener("click", () => show(tab.dataset.view));
  $("#filters").addEventListener("submit", (e) => {
    e.preventDefault();
    guarded(() => loadAttempts());
  });
  $("#attempts-more").addEventListener("click", () => guarded(() => loadAttempts(true)));
  $("#sign-out").addEventListener("click", () =>
    guarded(async () => {
      await api("DELETE", "/api/v1/session");
      location.reload();
    }),
  );
  const added = new URLSearchParams(location.search).get("added");
  if (added) {
    flash(`Logged in ${added}`);
    history.replaceState(null, "", "/ui/");
  }
  show("profiles");
  setInterval(tick, 1000);
  setInterval(() => {
    if (!$("#view-profiles").hidden) guarded(() => loadProfiles(true));
  }, 5000);
}

guarded(main);
