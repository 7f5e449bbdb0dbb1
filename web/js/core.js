// What every view of the console shares: API calls with the session, elements built from text
// (server text is always set with textContent, never as HTML), notices scoped to a view, times.

export const session = { csrf: "", agent: "", role: "viewer" };

const RANKS = { viewer: 0, operator: 1, admin: 2 };

/** Whether the signed-in role may do what `role` may (docs/operations.md, "Roles"). */
export const can = (role) => RANKS[session.role] >= RANKS[role];

export const $ = (sel, root = document) => root.querySelector(sel);

export function el(tag, attrs = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("data-") || k.startsWith("aria-") || k === "role") e.setAttribute(k, v);
    else e[k] = v;
  }
  for (const c of children) {
    if (c === undefined || c === null) continue;
    e.append(typeof c === "string" || typeof c === "number" ? document.createTextNode(String(c)) : c);
  }
  return e;
}

/** An error the API answered: its message, the HTTP status and the error code. */
export class ApiError extends Error {
  constructor(message, status, code) {
    super(message);
    Object.assign(this, { status, code });
  }
}

// `background`: a refresh nobody asked for (the 5 s poll); it does not count as a use of the
// session, so an unattended console still signs out after server.session_idle.
export async function api(method, path, body, { background = false } = {}) {
  const headers = {};
  if (method !== "GET") headers["x-csrf-token"] = session.csrf;
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
    throw new ApiError("signed out", 401, "unauthorized");
  }
  const text = await resp.text();
  let data = null;
  try {
    data = text ? JSON.parse(text) : null;
  } catch {
    // not JSON: said below in words, never as a parser's message
  }
  if (!resp.ok) {
    const message = data && data.error && data.error.message;
    throw new ApiError(message || `rota answered ${resp.status} to ${method} ${path.split("?")[0]}`, resp.status, data && data.error && data.error.code);
  }
  if (text && data === null) throw new ApiError(`rota answered ${method} ${path.split("?")[0]} with something that is not JSON`, resp.status);
  return data;
}

// -- notices --------------------------------------------------------------------------------

/** A message in the view's own notice area. Errors stay until dismissed, the view reloads or a
 * success takes them away (what they said no longer holds). */
export function notify(view, message, kind = "info") {
  if (kind !== "error") clearErrors(view);
  const box = $(`#view-${view} .notices`);
  const note = el("div", { className: "notice", "data-kind": kind, role: kind === "error" ? "alert" : "status" });
  note.append(el("span", {}, message));
  const close = el("button", { className: "dismiss", type: "button", "aria-label": "Dismiss" }, "×");
  close.addEventListener("click", () => note.remove());
  note.append(close);
  box.append(note);
  while (box.children.length > 3) box.firstElementChild.remove();
  if (kind !== "error") setTimeout(() => note.remove(), 6000);
  return note;
}

export function clearErrors(view) {
  for (const n of document.querySelectorAll(`#view-${view} .notices .notice[data-kind="error"]`)) n.remove();
}

/** Runs an action of `view`; its failure is shown in that view. */
export async function guarded(view, action) {
  try {
    return await action();
  } catch (e) {
    if (e.status !== 401) notify(view, e.message, "error");
    return undefined;
  }
}

// -- time -----------------------------------------------------------------------------------

export function clock(ms) {
  const s = Math.max(0, Math.ceil(ms / 1000));
  const h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60), sec = s % 60;
  const pad = (n) => String(n).padStart(2, "0");
  return h ? `${h}:${pad(m)}:${pad(sec)}` : `${m}:${pad(sec)}`;
}

export const zone = Intl.DateTimeFormat().resolvedOptions().timeZone || "local time";

const timeFmt = new Intl.DateTimeFormat(undefined, { hour: "2-digit", minute: "2-digit", second: "2-digit", hour12: false });
const dayFmt = new Intl.DateTimeFormat(undefined, { month: "short", day: "numeric" });

/** A time in the browser's zone: the clock today, with the day otherwise. */
export function localTime(ms) {
  const d = new Date(ms);
  const today = new Date().toDateString() === d.toDateString();
  return today ? timeFmt.format(d) : `${dayFmt.format(d)} ${timeFmt.format(d)}`;
}

export function ago(ms) {
  if (ms == null) return "never";
  const s = Math.round((Date.now() - ms) / 1000);
  if (s < 60) return `${Math.max(0, s)}s ago`;
  if (s < 3600) return `${Math.round(s / 60)} min ago`;
  if (s < 86400) return `${Math.round(s / 3600)} h ago`;
  return localTime(ms);
}

/** How long until `ms` (or since, when past), in words. */
export function until(ms) {
  const left = ms - Date.now();
  if (left <= 0) return "expired";
  const d = Math.floor(left / 86_400_000);
  if (d >= 2) return `in ${d} days`;
  const h = Math.floor(left / 3_600_000);
  if (h >= 1) return `in ${h} h`;
  return `in ${clock(left)}`;
}

// -- profile states ---------------------------------------------------------------------------

/** Whether the profile's state is the OAuth "needs re-login" one. */
export const needsRelogin = (p) => p.type === "oauth" && p.status.state === "disabled" && p.status.reason === "auth_permanent";

/** The short state shown in a row and the words that explain it. */
export function stateOf(p) {
  const st = p.status;
  switch (st.state) {
    case "usable":
      return { short: "usable", detail: "usable now" };
    case "cooling": {
      // The window that ends last, then how many other windows (each model cools on its own).
      const others = st.windows.length - 1;
      const scope = st.model ? ` for ${st.model}` : "";
      const more = others > 0 ? `, and ${others} more window${others > 1 ? "s" : ""}` : "";
      return { short: `cooling ${clock(st.until - Date.now())}`, detail: `${st.reason}${scope}: back at ${localTime(st.until)}${more}` };
    }
    case "disabled":
      if (needsRelogin(p)) return { short: "needs re-login", detail: "the provider refused its tokens: log in again" };
      return st.until
        ? { short: `disabled ${clock(st.until - Date.now())}`, detail: `${st.reason}: back at ${localTime(st.until)}` }
        : { short: "disabled", detail: `${st.reason}: until cleared` };
    default:
      return { short: p.enabled ? "unusable" : "disabled", detail: st.why };
  }
}

/** The time a blocked profile comes back by itself, if it does. */
export const backAt = (p) => (p.status.state === "cooling" || p.status.state === "disabled" ? p.status.until ?? null : null);

/** The engine's failure reasons (docs/rotation.md), for the filters. */
export const REASONS = [
  "rate_limit", "overloaded", "server_error", "timeout", "network", "auth", "auth_permanent", "billing",
  "model_not_found", "context_overflow", "format", "wire_format", "cancelled", "no_profile", "unknown",
];

export function options(select, values, { any = "any", current = select.value } = {}) {
  select.replaceChildren(el("option", { value: "" }, any), ...values.map((v) => el("option", { value: v }, v)));
  if (values.includes(current)) select.value = current;
}
