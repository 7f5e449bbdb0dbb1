// The Chains view: each agent's chain model by model, each provider's profiles with live states,
// and the chain's verdict: where the next request goes, or until when nothing is usable.

import { $, api, clock, el, localTime, stateOf } from "./core.js";
import { loadProfiles, ordered, state as book } from "./profiles.js";

let models = null;

export async function loadChains() {
  [models] = await Promise.all([api("GET", "/api/v1/models"), loadProfiles()]);
  renderChains();
}

/** When the profile can serve `model` again: 0 now, a time, or Infinity (not by itself). */
function freeAt(p, model) {
  const st = p.status;
  if (st.state === "usable") return 0;
  if (st.state === "cooling") {
    const blocking = st.windows.filter((w) => !w.model || w.model === model);
    return blocking.length ? Math.max(...blocking.map((w) => w.until)) : 0;
  }
  if (st.state === "disabled" && st.until) return st.until;
  return Infinity;
}

/** The chain's verdict: { ready, text }. */
function verdict(chain) {
  let soonest = Infinity;
  for (const ref of chain) {
    const [provider, ...rest] = ref.split("/");
    const model = rest.join("/");
    const prov = book.providers.find((p) => p.name === provider);
    if (!prov) continue;
    for (const p of ordered(prov)) {
      const at = freeAt(p, model);
      if (at <= Date.now()) return { ready: true, text: `Usable: the next request goes to ${ref} via ${p.id}.` };
      soonest = Math.min(soonest, at);
    }
  }
  if (soonest === Infinity) return { ready: false, text: "Nothing usable: every profile on this chain is disabled until cleared, off or missing." };
  return { ready: false, text: `Nothing usable until ${localTime(soonest)} (in ${clock(soonest - Date.now())}).` };
}

function chainCard(title, attrs, chain, error) {
  const card = el("section", { className: "card chain", ...attrs });
  card.append(el("h2", {}, title));
  if (error) card.append(el("p", { className: "error" }, error));
  const v = verdict(chain);
  card.append(el("p", { className: "verdict", "data-ready": String(v.ready) }, v.text));
  const list = el("ol", { className: "chain-models" });
  for (const ref of chain) {
    const provider = ref.split("/")[0];
    const prov = book.providers.find((p) => p.name === provider);
    const li = el("li", {}, el("span", { className: "model-ref" }, ref));
    const rows = prov ? ordered(prov) : [];
    if (!rows.length) li.append(el("span", { className: "muted" }, " — no profiles"));
    const states = el("ul", { className: "chain-profiles" });
    for (const p of rows) {
      const { short, detail } = stateOf(p);
      states.append(el("li", { "data-profile": p.id }, `${p.name}: `, el("span", { className: "state", "data-state": p.status.state, title: detail }, short)));
    }
    if (rows.length) li.append(states);
    list.append(li);
  }
  card.append(list);
  return card;
}

export function renderChains() {
  if (!models) return;
  const root = $("#chains");
  root.replaceChildren();
  for (const c of models.chains) {
    root.append(chainCard(c.agent === "(default)" ? "Every agent (default)" : `Agent ${c.agent}`, { "data-agent": c.agent }, c.chain, c.error));
  }
  for (const v of models.virtual_models) {
    root.append(chainCard(`Virtual model ${v.name} (${v.strategy})`, { "data-model": v.name }, v.chain));
  }
}
