// The Overview: a strip per provider (usable / cooling / disabled, the next profile and the next
// one back) and charts of the audit trail from GET /api/v1/usage/series, drawn with uPlot
// (web/vendor, embedded in the binary). Each chart carries its numbers in a table too: for
// screen readers, and for the tests that check them against the API and SQL.

import { $, api, backAt, clock, el, localTime, zone } from "./core.js";
import { loadProfiles, ordered, state as book } from "./profiles.js";

const COLORS = {
  success: "#2f9e44", served: "#2f9e44", usable: "#b2f2bb",
  failure: "#e03131", failed: "#e03131", disabled: "#e03131",
  skipped: "#adb5bd", refused: "#868e96",
  cooling: "#f08c00",
};
// Attempts are traffic, not failures: a neutral blue, with the successes among them green.
const ATTEMPTS = "#74c0fc";
const PALETTE = ["#e03131", "#f08c00", "#1c7ed6", "#7048e8", "#0ca678", "#d6336c", "#5c940d", "#495057", "#e8590c", "#1098ad", "#ae3ec9", "#74b816", "#f59f00", "#364fc7", "#c2255c"];
const TIMELINE_MAX = 30;

let series = null;
const charts = [];

export async function loadOverview(background = false) {
  const [span, step] = $("#overview-window").value.split(":").map(Number);
  const until = Date.now();
  const q = new URLSearchParams({ since: String(until - span * 1000), until: String(until), step: String(step) });
  // The strips need only the profiles: they show even when the charts' data cannot be had.
  let failed = null;
  [series] = await Promise.all([
    api("GET", `/api/v1/usage/series?${q}`, undefined, { background }).catch((e) => {
      failed = e;
      return null;
    }),
    loadProfiles(background),
  ]);
  renderOverview();
  if (failed) throw failed;
}

// -- the provider strips ---------------------------------------------------------------------

function strip(provider) {
  const rows = ordered(provider);
  const count = (f) => rows.filter(f).length;
  const usable = count((p) => p.status.state === "usable");
  const cooling = count((p) => p.status.state === "cooling");
  const disabled = rows.length - usable - cooling;
  const card = el("section", { className: "card strip", "data-provider": provider.name });
  card.append(el("h2", {}, provider.name));
  const counts = el("p", { className: "counts" },
    el("span", { className: "count", "data-state": "usable" }, el("strong", {}, String(usable)), " usable"), " · ",
    el("span", { className: "count", "data-state": "cooling" }, el("strong", {}, String(cooling)), " cooling"), " · ",
    el("span", { className: "count", "data-state": "disabled" }, el("strong", {}, String(disabled)), " disabled or off"));
  card.append(counts);
  const next = rows.find((p) => p.id === provider.next);
  card.append(el("p", { className: "next" }, next ? `Next: ${next.id}` : rows.length ? "Next: none usable now" : "No profiles"));
  const back = rows.filter((p) => backAt(p) !== null).sort((a, b) => backAt(a) - backAt(b))[0];
  if (back) card.append(el("p", { className: "back", "data-until": String(backAt(back)) }, `Next back: ${back.id} at ${localTime(backAt(back))} (in ${clock(backAt(back) - Date.now())})`));
  if (!series) return card;
  const mine = series.attempts.filter((a) => a.provider === provider.name);
  card.append(chart({
    id: `attempts-${provider.name}`,
    title: `${provider.name}: attempts per ${stepWords()} by outcome`,
    kind: "attempts",
    layers: ["success", "failure", "skipped"].map((o) => ({ label: o, color: COLORS[o], counts: (mine.find((a) => a.outcome === o) || { counts: zeros() }).counts })),
    height: 110,
  }));
  return card;
}

// -- charts ----------------------------------------------------------------------------------

const zeros = () => series.buckets.map(() => 0);

/** The time the charts show: from a few buckets before the first with any traffic (at least ten
 * buckets' worth) to the window's end, so that a minute of traffic is not a sliver of an hour. */
function shownRange() {
  const busy = (counts) => counts.findIndex((n) => n > 0);
  const firsts = [...series.requests, ...series.attempts, ...series.reasons].map((l) => busy(l.counts)).filter((i) => i >= 0);
  if (!firsts.length) return [series.since, series.until];
  const from = series.buckets[Math.min(...firsts)] - 4 * series.step_ms;
  return [Math.max(series.since, Math.min(from, series.until - 10 * series.step_ms)), series.until];
}

const hourMinute = new Intl.DateTimeFormat(undefined, { hour: "2-digit", minute: "2-digit", hourCycle: "h23" });
const dayMonth = new Intl.DateTimeFormat(undefined, { month: "short", day: "numeric" });

/** The time axis: 24-hour times in the page's zone, the date at midnight; `fig`'s `data-ticks`
 * holds them as drawn (the canvas has no text to read). */
const timeAxis = (fig) => ({
  stroke: "#5f6b7a",
  grid: { show: false },
  values: (u, splits) => {
    const labels = splits.map((ms) => {
      const d = new Date(ms);
      return d.getHours() === 0 && d.getMinutes() === 0 ? dayMonth.format(d) : hourMinute.format(d);
    });
    fig.dataset.ticks = labels.join(" ");
    return labels;
  },
});
const stepWords = () => (series.step_ms === 60_000 ? "minute" : `${series.step_ms / 60_000} minutes`);
const sum = (xs) => xs.reduce((a, b) => a + b, 0);

/** The numbers of a chart as a table: one row per layer, its total. */
function numbers(kind, rows, head = ["", "total"]) {
  const table = el("table", { className: "grid numbers", "data-numbers": kind });
  table.append(el("thead", {}, el("tr", {}, ...head.map((h) => el("th", { scope: "col" }, h)))));
  const body = el("tbody");
  for (const r of rows) body.append(el("tr", { "data-key": r[0] }, el("th", { scope: "row" }, r[0]), ...r.slice(1).map((v) => el("td", { className: "num" }, String(v)))));
  table.append(body);
  return el("details", { className: "numbers-box" }, el("summary", {}, "Numbers"), table);
}

function figure(id, title, kind) {
  const fig = el("figure", { className: "chart", "data-chart": kind, id: `chart-${id}` });
  fig.append(el("figcaption", {}, title));
  return fig;
}

/** Drawn once the figure is in the page (uPlot needs its width). */
function plot(fig, opts, data) {
  const host = el("div", { className: "plot", "aria-hidden": "true" });
  fig.insertBefore(host, fig.children[1] || null);
  queueMicrotask(() => {
    const width = Math.max(200, host.clientWidth || fig.clientWidth || 300);
    const u = new uPlot({ width, ...opts }, data, host);
    charts.push({ u, host });
  });
}

/**
 * Stacked bars over time: each layer is drawn as the running total up to it, the tallest first,
 * so that they stack; the legend shows each layer's own count.
 */
function chart({ id, title, kind, layers, height = 160 }) {
  const fig = figure(id, title, kind);
  const shown = layers.filter((l) => sum(l.counts) > 0);
  const use = shown.length ? shown : layers.slice(0, 1);
  const running = [];
  let acc = series.buckets.map(() => 0);
  for (const l of use) {
    acc = acc.map((v, i) => v + l.counts[i]);
    running.push(acc);
  }
  const order = use.map((_, i) => i).reverse();
  const bars = uPlot.paths.bars({ size: [0.8, 24], align: 1 });
  const opts = {
    height,
    ms: 1,
    legend: { show: true },
    cursor: { points: { show: false } },
    // Up to the window's end: the newest bucket's bar (drawn right of its start) stays in view.
    scales: { x: { time: true, range: () => shownRange() }, y: { range: (u, min, max) => [0, Math.max(1, max)] } },
    axes: [timeAxis(fig), { stroke: "#5f6b7a", size: 40, incrs: [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000] }],
    series: [
      {},
      ...order.map((i) => ({
        label: use[i].label,
        fill: use[i].color,
        stroke: use[i].color,
        width: 0,
        paths: bars,
        points: { show: false },
        value: (u, v, si, idx) => (idx == null ? "—" : String(use[i].counts[idx])),
      })),
    ],
  };
  plot(fig, opts, [series.buckets, ...order.map((i) => running[i])]);
  fig.append(numbers(kind, layers.map((l) => [l.label, sum(l.counts)])));
  return fig;
}

/** Traffic share: attempts per profile (successes and failures) over the window. */
function shareChart() {
  const rows = [...series.profiles].sort((a, b) => b.attempts - a.attempts);
  const top = rows.slice(0, 12);
  const fig = figure("share", `Traffic share per profile (attempts${rows.length > 12 ? ", the 12 busiest" : ""})`, "share");
  if (top.length) {
    const xs = top.map((_, i) => i);
    const bars = uPlot.paths.bars({ size: [0.6, 60] });
    const label = (i) => (top[i] ? top[i].profile : "");
    const opts = {
      height: 180,
      legend: { show: true },
      cursor: { points: { show: false } },
      scales: { x: { time: false, range: [-0.5, top.length - 0.5] }, y: { range: (u, min, max) => [0, Math.max(1, max)] } },
      axes: [
        { stroke: "#5f6b7a", splits: () => xs, values: (u, splits) => splits.map((i) => label(i).slice(0, 18)), grid: { show: false }, rotate: 0 },
        { stroke: "#5f6b7a", size: 40 },
      ],
      series: [
        { label: "profile", value: (u, v) => label(v) },
        { label: "attempts", fill: ATTEMPTS, stroke: ATTEMPTS, width: 0, paths: bars, points: { show: false } },
        { label: "successes", fill: COLORS.success, stroke: COLORS.success, width: 0, paths: bars, points: { show: false } },
      ],
    };
    plot(fig, opts, [xs, top.map((p) => p.attempts), top.map((p) => p.successes)]);
  } else {
    fig.append(el("p", { className: "muted" }, "No attempts in this window."));
  }
  fig.append(numbers("share", rows.map((p) => [p.profile, p.attempts, p.successes, p.failures]), ["profile", "attempts", "successes", "failures"]));
  return fig;
}

/** A strip per profile: usable, cooling or disabled over the window. */
function timeline() {
  const fig = figure("timeline", "Profiles over the window: usable, cooling, disabled", "timeline");
  const known = new Map(series.timeline.map((t) => [t.profile, t.segments]));
  const rows = [];
  for (const provider of book.providers) for (const p of ordered(provider)) rows.push({ id: p.id, segments: known.get(p.id) || [] });
  rows.sort((a, b) => (b.segments.length > 0) - (a.segments.length > 0));
  const shown = rows.slice(0, TIMELINE_MAX);
  if (rows.length > shown.length) fig.append(el("p", { className: "muted" }, `${shown.length} of ${rows.length} profiles, those that cooled first.`));
  const legend = el("p", { className: "timeline-legend" },
    ...["usable", "cooling", "disabled"].map((s) => el("span", { className: "key", "data-state": s }, el("span", { className: "swatch", "data-state": s }), ` ${s} `)));
  fig.append(legend);
  const list = el("div", { className: "timeline" });
  for (const row of shown) {
    const line = el("div", { className: "timeline-row", "data-profile": row.id });
    line.append(el("span", { className: "timeline-name" }, row.id));
    const host = el("div", { className: "timeline-plot", "aria-hidden": "true" });
    line.append(host);
    list.append(line);
    const { xs, layers } = steps(row.segments);
    const opts = {
      height: 26,
      ms: 1,
      legend: { show: false },
      cursor: { show: false },
      padding: [2, 4, 2, 4],
      scales: { x: { range: shownRange() }, y: { range: [0, 1] } },
      axes: [{ show: false }, { show: false }],
      series: [{}, ...["usable", "cooling", "disabled"].map((s) => ({
        label: s, fill: COLORS[s], stroke: COLORS[s], width: 0, points: { show: false },
        paths: uPlot.paths.stepped({ align: 1 }),
      }))],
    };
    queueMicrotask(() => charts.push({ u: new uPlot({ width: Math.max(120, host.clientWidth || 300), ...opts }, [xs, ...layers], host), host }));
  }
  fig.append(list);
  const cooled = series.timeline.flatMap((t) => t.segments.map((s) => [t.profile, s.state, s.reason || "", Math.round((s.until - s.from) / 1000)]));
  const table = numbers("timeline", cooled, ["profile", "state", "reason", "seconds"]);
  fig.append(table);
  return fig;
}

/** Stepped layers (1 or 0) for usable / cooling / disabled from the segments. */
function steps(segments) {
  const cuts = new Set([series.since, series.until]);
  for (const s of segments) {
    cuts.add(Math.max(series.since, s.from));
    cuts.add(Math.min(series.until, s.until));
  }
  const xs = [...cuts].sort((a, b) => a - b);
  const at = (t) => {
    const hit = segments.filter((s) => s.from <= t && t < s.until);
    if (hit.some((s) => s.state === "disabled")) return "disabled";
    return hit.length ? "cooling" : "usable";
  };
  const states = xs.map((t) => at(t));
  // A value holds until the next cut (stepped, align 1); 0 draws nothing.
  const layers = ["usable", "cooling", "disabled"].map((name) => states.map((s) => (s === name ? 1 : 0)));
  return { xs, layers };
}

export function renderOverview() {
  for (const c of charts.splice(0)) c.u.destroy();
  const strips = $("#strips");
  strips.replaceChildren(...book.providers.map(strip));
  const root = $("#charts");
  if (!series) {
    root.replaceChildren();
    return;
  }
  for (const z of document.querySelectorAll("#view-overview .zone")) z.textContent = `Times in ${zone}. Charts from the audit trail, ${localTime(series.since)} to ${localTime(series.until)}.`;
  Object.assign(root.dataset, { since: String(series.since), until: String(series.until), step: String(series.step_ms), shownFrom: String(shownRange()[0]) });
  root.replaceChildren(
    chart({
      id: "requests",
      title: `Requests per ${stepWords()} by outcome`,
      kind: "requests",
      layers: ["served", "failed", "refused"].map((o) => ({ label: o, color: COLORS[o], counts: (series.requests.find((r) => r.outcome === o) || { counts: zeros() }).counts })),
    }),
    chart({
      id: "reasons",
      title: `Failures per ${stepWords()} by reason`,
      kind: "reasons",
      layers: series.reasons.length
        ? series.reasons.map((r, i) => ({ label: r.reason, color: PALETTE[i % PALETTE.length], counts: r.counts }))
        : [{ label: "no failures", color: PALETTE[0], counts: zeros() }],
    }),
    shareChart(),
    timeline(),
  );
}

/** Keeps the charts as wide as their boxes. */
export function resizeCharts() {
  for (const { u, host } of charts) {
    const w = host.clientWidth;
    if (w && Math.abs(w - u.width) > 2) u.setSize({ width: w, height: u.height });
  }
}

/** Live "next back" countdowns in the strips. */
export function tickOverview() {
  for (const p of document.querySelectorAll("#strips .back[data-until]")) {
    const at = Number(p.dataset.until);
    p.textContent = p.textContent.replace(/\(in [^)]*\)$/, `(in ${clock(at - Date.now())})`);
  }
}
