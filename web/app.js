// The rota console's shell: the session, the tabs (WAI-ARIA tabs: arrow keys move between them),
// the refreshes and the live countdowns. Each view is a module of web/js/.

import { $, api, can, guarded, notify, session, zone } from "./js/core.js";
import { loadAlerts } from "./js/alerts.js";
import { loadChanges } from "./js/changes.js";
import { loadAgents, setupAgents } from "./js/agents.js";
import { loadChains, renderChains } from "./js/chains.js";
import { loadOverview, renderOverview, resizeCharts, tickOverview } from "./js/overview.js";
import { loadProfiles, renderProfiles, tickProfiles } from "./js/profiles.js";
import { loadRequests } from "./js/requests.js";

const VIEWS = ["overview", "profiles", "requests", "chains", "agents", "alerts", "changes"];
let current = "overview";

const LOAD = {
  overview: (background) => loadOverview(background),
  profiles: async (background) => {
    await loadProfiles(background);
    renderProfiles();
  },
  requests: () => loadRequests(),
  chains: () => loadChains(),
  agents: () => loadAgents(),
  alerts: () => loadAlerts(),
  changes: () => loadChanges(),
};

function show(view, { focus = false } = {}) {
  current = view;
  for (const tab of document.querySelectorAll(".tab")) {
    const on = tab.dataset.view === view;
    tab.setAttribute("aria-selected", String(on));
    tab.tabIndex = on ? 0 : -1;
    if (on && focus) tab.focus();
  }
  for (const v of document.querySelectorAll(".view")) v.hidden = v.id !== `view-${view}`;
  history.replaceState(null, "", `/ui/#${view}`);
  return guarded(view, () => LOAD[view](false));
}

function tabKeys(event) {
  const i = VIEWS.indexOf(current);
  const to = { ArrowRight: i + 1, ArrowLeft: i - 1, Home: 0, End: VIEWS.length - 1 }[event.key];
  if (to === undefined) return;
  event.preventDefault();
  show(VIEWS[(to + VIEWS.length) % VIEWS.length], { focus: true });
}

function tick() {
  if (current === "profiles" && tickProfiles()) guarded("profiles", () => LOAD.profiles(true));
  if (current === "chains") renderChains();
  if (current === "overview") tickOverview();
}

async function main() {
  const s = await api("GET", "/api/v1/session");
  Object.assign(session, { csrf: s.csrf, agent: s.agent, role: s.role });
  $("#agent").textContent = `${s.agent} · ${s.role}`;
  document.body.dataset.role = s.role;
  $("#agent-new").hidden = !can("admin");
  for (const z of document.querySelectorAll(".zone")) z.textContent = `Times in ${zone}.`;
  for (const tab of document.querySelectorAll(".tab")) tab.addEventListener("click", () => show(tab.dataset.view));
  document.body.dataset.ready = "true";
  $('[role="tablist"]').addEventListener("keydown", tabKeys);
  $("#filters").addEventListener("submit", (e) => {
    e.preventDefault();
    guarded("requests", () => loadRequests());
  });
  $("#requests-more").addEventListener("click", () => guarded("requests", () => loadRequests(true)));
  $("#overview-window").addEventListener("change", () => guarded("overview", () => loadOverview()));
  setupAgents();
  $("#sign-out").addEventListener("click", () =>
    guarded(current, async () => {
      await api("DELETE", "/api/v1/session");
      location.reload();
    }),
  );
  const params = new URLSearchParams(location.search);
  const added = params.get("added");
  const wanted = location.hash.slice(1);
  await show(added ? "profiles" : VIEWS.includes(wanted) ? wanted : "overview");
  if (added) notify("profiles", `Logged in ${added}`);
  setInterval(tick, 1000);
  // Background refreshes: the profiles every 5 s; the overview's charts every 10 s over the last
  // hour, every minute over the last day (a day's buckets cost the database seconds on a busy
  // audit trail: docs/api.md).
  let polls = 0;
  setInterval(() => {
    polls += 1;
    const every = $("#overview-window").value.startsWith("86400") ? 12 : 2;
    if (current === "profiles" || (current === "overview" && polls % every === 0)) guarded(current, () => LOAD[current](true));
  }, 5_000);
  let resizing = null;
  window.addEventListener("resize", () => {
    clearTimeout(resizing);
    resizing = setTimeout(() => (current === "overview" ? renderOverview() : resizeCharts()), 150);
  });
}

main().catch((e) => {
  const box = document.querySelector("#view-overview .notices");
  if (box) box.textContent = `The console could not start: ${e.message}`;
});
