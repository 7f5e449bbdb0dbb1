// The Requests view: one row per request (GET /api/v1/requests), refused ones included,
// expanding to its attempts (GET /api/v1/attempts?request_id=) with their errors.

import { $, REASONS, api, clearErrors, el, localTime, options, zone } from "./core.js";
import { loadProfiles, state as book } from "./profiles.js";

let cursor = null;
let lastQuery = new URLSearchParams(); // the query of the rows shown: "Older requests" goes on from it
let filtersReady = false;

const FILTERS = [["agent", "filter-agent"], ["provider", "filter-provider"], ["profile", "filter-profile"], ["reason", "filter-reason"], ["outcome", "filter-outcome"]];

/** Fills the dropdowns with the values rota knows (agents, providers, profiles, reasons). */
async function fillFilters() {
  const [agents] = await Promise.all([api("GET", "/api/v1/agents"), book.providers.length ? null : loadProfiles()]);
  options($("#filter-agent"), agents.map((a) => a.name));
  options($("#filter-provider"), book.providers.map((p) => p.name));
  options($("#filter-profile"), book.profiles.map((p) => p.id).sort());
  options($("#filter-reason"), REASONS);
  filtersReady = true;
}

function query() {
  const q = new URLSearchParams({ limit: "50" });
  for (const [field, id] of FILTERS) {
    const v = $(`#${id}`).value;
    if (v) q.set(field, v);
  }
  const since = $("#filter-since").value;
  if (since) q.set("since", String(Date.now() - Number(since) * 1000));
  return q;
}

export async function loadRequests(more = false) {
  if (!filtersReady) await fillFilters();
  for (const z of document.querySelectorAll("#view-requests .zone")) z.textContent = `Times in ${zone}.`;
  const q = more && cursor ? new URLSearchParams(lastQuery) : query();
  if (more && cursor) q.set("cursor", cursor);
  const tbody = $("#requests tbody");
  let page;
  try {
    page = await api("GET", `/api/v1/requests?${q}`);
  } catch (e) {
    // Rows that no longer match the filters shown would mislead: none rather than stale ones.
    if (!more) tbody.replaceChildren(emptyRow("No requests shown: the filter was refused."));
    $("#requests-more").hidden = true;
    throw e;
  }
  clearErrors("requests");
  lastQuery = q;
  if (!more) tbody.replaceChildren();
  for (const r of page.items) tbody.append(requestRow(r));
  cursor = page.next_cursor;
  $("#requests-more").hidden = !cursor;
  if (!tbody.children.length) tbody.append(emptyRow("No requests match."));
}

function emptyRow(text) {
  return el("tr", {}, el("td", { colSpan: 9, className: "muted" }, text));
}

/** served, failed or refused (no attempt was made). */
function verdict(r) {
  if (r.status >= 200 && r.status < 300) return "served";
  return r.attempts === 0 ? "refused" : "failed";
}

function requestRow(r) {
  const tr = el("tr", { className: "request", "data-request": r.id, "data-outcome": verdict(r) });
  const toggle = el("button", { type: "button", className: "expand", "aria-expanded": "false", "aria-label": `Attempts of request ${r.id}` }, "▸");
  toggle.disabled = r.attempts === 0 && !r.error;
  tr.append(el("td", { className: "time", title: new Date(r.started_at).toString() }, toggle, " ", localTime(r.started_at)));
  tr.append(el("td", {}, r.agent || "—"));
  const served = r.served_model && r.served_model !== r.requested_model ? ` → ${r.served_model}` : "";
  tr.append(el("td", { className: "model" }, `${r.requested_model || "(default chain)"}${served}`));
  tr.append(el("td", { className: "id" }, r.served_profile || "—"));
  tr.append(el("td", { className: "num attempts" }, String(r.attempts)));
  tr.append(el("td", { className: "status" }, el("span", { className: "outcome", "data-outcome": verdict(r) }, `${r.status ?? "—"} ${verdict(r)}`)));
  const tokens = r.tokens_in == null && r.tokens_out == null ? "—" : `${r.tokens_in ?? "—"} · ${r.tokens_out ?? "—"}`;
  tr.append(el("td", { className: "num" }, tokens));
  // USD to the micro-dollar as stored; "—" where no price is known (never a guess).
  tr.append(el("td", { className: "num cost", title: r.cost == null ? "no price known for this model, or nothing served" : `${r.cost} USD` }, r.cost == null ? "—" : `$${r.cost.toFixed(r.cost < 0.01 ? 6 : 4)}`));
  tr.append(el("td", { className: "num" }, r.duration_ms == null ? "—" : String(r.duration_ms)));
  let detail = null;
  toggle.addEventListener("click", async () => {
    const open = toggle.getAttribute("aria-expanded") === "true";
    toggle.setAttribute("aria-expanded", String(!open));
    toggle.textContent = open ? "▸" : "▾";
    if (open) {
      detail?.remove();
      detail = null;
      return;
    }
    detail = el("tr", { className: "attempts-of", "data-request": r.id }, el("td", { colSpan: 9 }, el("p", { className: "muted" }, "Loading…")));
    tr.after(detail);
    const cell = detail.firstElementChild;
    try {
      cell.replaceChildren(await attemptsTable(r));
    } catch (e) {
      cell.replaceChildren(el("p", { className: "error" }, e.message));
    }
  });
  return tr;
}

async function attemptsTable(r) {
  const box = el("div", { className: "attempts-box" });
  if (r.error) box.append(el("p", { className: "request-error" }, `rota answered ${r.status}: ${r.error}`));
  if (r.attempts === 0) return box;
  const page = await api("GET", `/api/v1/attempts?request_id=${encodeURIComponent(r.id)}&limit=100`);
  const items = page.items.sort((a, b) => a.seq - b.seq);
  const table = el("table", { className: "grid sub" });
  table.append(el("thead", {}, el("tr", {}, ...["#", "Kind", "Model", "Profile", "Outcome", "Reason", "HTTP", "ms", "Error"].map((h) => el("th", { scope: "col" }, h)))));
  const body = el("tbody");
  for (const a of items) {
    const row = el("tr", { className: "attempt", "data-outcome": a.outcome });
    for (const c of [a.seq, a.kind, `${a.provider}/${a.model}`, a.profile_id || "—", a.outcome, a.reason || "", a.http_status ?? "", a.duration_ms ?? "", a.error || ""]) {
      row.append(el("td", {}, String(c)));
    }
    row.children[4].className = "outcome";
    row.children[4].dataset.outcome = a.outcome;
    row.lastElementChild.className = "error-text";
    body.append(row);
  }
  table.append(body);
  box.append(el("div", { className: "scroll" }, table));
  return box;
}
