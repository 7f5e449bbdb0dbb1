//! `/api/v1/usage/series`: the audit log counted per time bucket, for the console's charts,
//! and each profile's cooling and disabled windows over the range.

use super::Params;
use super::audit::parse_time;
use crate::api::{ApiError, ApiState, Viewer};
use crate::engine::{Mark, Millis, ProfileId, ProfileView, Reason};
use crate::store::FailureWindow;
use axum::Json;
use axum::extract::State;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

pub fn routes() -> OpenApiRouter<ApiState> {
    OpenApiRouter::new().routes(routes!(usage_series))
}

/// At most this many buckets in one answer.
pub const MAX_BUCKETS: i64 = 1_440;
/// The bucket sizes allowed, in seconds (whole minutes: the counts are kept per minute).
const STEPS: std::ops::RangeInclusive<i64> = 60..=86_400;
/// How far back a window that ends in the range may have started, at most.
const LOOKBACK_CAP: Millis = 7 * 86_400_000;
/// The longest stretch the timeline covers, with a bucket more (a day's range rounded out to its
/// step): the end of a longer range (a month holds some 300,000 windows at 5 million attempts:
/// an answer of 26 MB, seconds to make).
const TIMELINE_SPAN: Millis = 86_400_000;

#[derive(Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct SeriesParams {
    /// Start of the range (RFC 3339 or Unix ms), rounded down to a multiple of `step`; default
    /// one hour before `until`.
    pub since: Option<String>,
    /// End of the range, exclusive (RFC 3339 or Unix ms), rounded up to a multiple of `step`;
    /// default now.
    pub until: Option<String>,
    /// Bucket size in seconds, a whole number of minutes from 60 to 86400 (default 60); at most
    /// 1440 buckets.
    pub step: Option<String>,
}

#[derive(Serialize, ToSchema, Debug, PartialEq, Eq)]
pub struct Series {
    /// Start of the range (Unix ms, inclusive), a multiple of `step_ms`.
    pub since: Millis,
    /// End of the range (Unix ms, exclusive), a multiple of `step_ms`.
    pub until: Millis,
    pub step_ms: Millis,
    /// The start of each bucket (Unix ms); every `counts` below has one number per bucket.
    pub buckets: Vec<Millis>,
    /// Attempts per provider and outcome (`success`, `failure`, `skipped`); only the pairs
    /// with attempts in the range.
    pub attempts: Vec<AttemptSeries>,
    /// Requests by outcome: `served` (a 2xx answer), `failed`, `refused` (no attempt: a bad
    /// request, an unknown model); always the three.
    pub requests: Vec<RequestSeries>,
    /// Failed attempts by reason, most first.
    pub reasons: Vec<ReasonSeries>,
    /// Attempts per profile over the whole range, most first (attempts without a profile,
    /// skipped candidates, are not counted).
    pub profiles: Vec<ProfileShare>,
    /// Start of the stretch `timeline` covers (Unix ms): `since`, or a day and a bucket before
    /// `until` when the range is longer.
    pub timeline_since: Millis,
    /// Every profile in force, with the windows it was cooling or disabled in from
    /// `timeline_since` to `until`.
    pub timeline: Vec<ProfileTimeline>,
}

#[derive(Serialize, ToSchema, Debug, PartialEq, Eq)]
pub struct AttemptSeries {
    pub provider: String,
    pub outcome: String,
    pub counts: Vec<i64>,
}

#[derive(Serialize, ToSchema, Debug, PartialEq, Eq)]
pub struct RequestSeries {
    pub outcome: String,
    pub counts: Vec<i64>,
}

#[derive(Serialize, ToSchema, Debug, PartialEq, Eq)]
pub struct ReasonSeries {
    pub reason: String,
    pub counts: Vec<i64>,
    pub total: i64,
}

#[derive(Serialize, ToSchema, Debug, PartialEq, Eq)]
pub struct ProfileShare {
    pub profile: String,
    pub attempts: i64,
    pub successes: i64,
    pub failures: i64,
}

#[derive(Serialize, ToSchema, Debug, PartialEq, Eq)]
pub struct ProfileTimeline {
    pub profile: String,
    /// Oldest first, not overlapping; empty: usable all along.
    pub segments: Vec<Segment>,
}

#[derive(Serialize, ToSchema, Debug, Clone, PartialEq, Eq)]
pub struct Segment {
    /// Unix ms, inclusive.
    pub from: Millis,
    /// Unix ms, exclusive.
    pub until: Millis,
    /// `cooling` or `disabled`.
    pub state: String,
    /// The reason of the failure that set the window (docs/rotation.md).
    pub reason: String,
}

/// Usage per time bucket
///
/// Attempts, requests and failure reasons per bucket, each profile's share and its cooling and
/// disabled windows (over the range's last day at most), from the audit log (and the profiles'
/// state now).
#[utoipa::path(get, path = "/api/v1/usage/series", tag = "admin", params(SeriesParams),
    responses((status = 200, body = Series), (status = 400, body = crate::api::ErrorBody)))]
async fn usage_series(
    State(state): State<ApiState>,
    _: Viewer,
    Params(p): Params<SeriesParams>,
) -> Result<Json<Series>, ApiError> {
    let now = state.runtime.clock.now();
    let (since, until, step) = range(&p, now)?;
    state.runtime.audit.flush_within(std::time::Duration::from_secs(2)).await;
    let n = ((until - since) / step) as usize;
    let settings = state.runtime.settings();
    let policy = &settings.config.cooldown_policy();
    let cooldown_max = policy.cooldown.max.as_millis() as Millis;
    // A cooldown window lasts `cooldown.max` at most; the disabled lane up to the longest
    // billing window or provider hint.
    let lookback = (policy.cooldown.hint_max.max(policy.billing.max).as_millis() as Millis).min(LOOKBACK_CAP);
    // The counts, the profiles' usage and the windows: three reads at once (docs/performance.md,
    // "Audit at scale").
    let from = since.max(until - TIMELINE_SPAN - step);
    let far = from - lookback.max(cooldown_max);
    let (rows, usage, windows) = tokio::try_join!(
        state.store.usage_series(since, until, step),
        state.store.usage(since, until),
        state.store.failure_windows((far, from - cooldown_max), from, until),
    )
    .map_err(ApiError::from)?;
    let add = |into: &mut Vec<i64>, counts: &[i64]| into.iter_mut().zip(counts).for_each(|(sum, n)| *sum += n);
    let mut attempts: BTreeMap<(String, String), Vec<i64>> = BTreeMap::new();
    let mut reasons: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    for (provider, outcome, reason, counts) in rows.attempts {
        if outcome == "failure" {
            let reason = reason.unwrap_or_else(|| "unknown".into());
            add(reasons.entry(reason).or_insert_with(|| vec![0; n]), &counts);
        }
        add(attempts.entry((provider, outcome)).or_insert_with(|| vec![0; n]), &counts);
    }
    let mut requests: BTreeMap<String, Vec<i64>> =
        ["served", "failed", "refused"].into_iter().map(|o| (o.to_string(), vec![0; n])).collect();
    for (outcome, counts) in rows.requests {
        if let Some(sums) = requests.get_mut(&outcome) {
            add(sums, &counts);
        }
    }
    let mut reasons: Vec<ReasonSeries> = reasons
        .into_iter()
        .map(|(reason, counts)| ReasonSeries { total: counts.iter().sum(), reason, counts })
        .collect();
    reasons.sort_by(|a, b| b.total.cmp(&a.total).then_with(|| a.reason.cmp(&b.reason)));

    let mut profiles: Vec<ProfileShare> = usage
        .into_iter()
        .filter(|u| u.attempts > 0)
        .map(|u| ProfileShare {
            profile: u.profile_id,
            attempts: u.attempts,
            successes: u.successes,
            failures: u.failures,
        })
        .collect();
    profiles.sort_by(|a, b| b.attempts.cmp(&a.attempts).then_with(|| a.profile.cmp(&b.profile)));

    let roster = state.runtime.book.roster();
    let timeline = timeline(&roster.views, windows, (from, until), now, cooldown_max);

    Ok(Json(Series {
        since,
        until,
        step_ms: step,
        buckets: (0..n as i64).map(|i| since + i * step).collect(),
        attempts: attempts
            .into_iter()
            .map(|((provider, outcome), counts)| AttemptSeries { provider, outcome, counts })
            .collect(),
        requests: ["served", "failed", "refused"]
            .into_iter()
            .map(|o| RequestSeries { outcome: o.into(), counts: requests.remove(o).unwrap_or_default() })
            .collect(),
        reasons,
        profiles,
        timeline_since: from,
        timeline,
    }))
}

/// The range and step in milliseconds: `since` rounded down and `until` up to the step.
fn range(p: &SeriesParams, now: Millis) -> Result<(Millis, Millis, Millis), ApiError> {
    let step = match p.step.as_deref() {
        None => 60,
        Some(raw) => raw
            .trim()
            .parse::<i64>()
            .map_err(|_| ApiError::BadRequest(format!("step `{raw}` is not a whole number of seconds")))?,
    };
    if !STEPS.contains(&step) {
        return Err(ApiError::BadRequest(format!(
            "step {step} is out of range: give a bucket size of {} to {} seconds",
            STEPS.start(),
            STEPS.end()
        )));
    }
    if step % 60 != 0 {
        return Err(ApiError::BadRequest(format!(
            "step {step} is not a whole number of minutes: give a multiple of 60 seconds"
        )));
    }
    let step = step * 1000;
    let until = p.until.as_deref().map(|u| parse_time(u, "until")).transpose()?.unwrap_or(now);
    let since = p.since.as_deref().map(|s| parse_time(s, "since")).transpose()?.unwrap_or(until - 3_600_000);
    if since >= until {
        return Err(ApiError::BadRequest("since must be before until".into()));
    }
    let since = since.div_euclid(step) * step;
    let until = (until.div_euclid(step) + i64::from(until.rem_euclid(step) != 0)) * step;
    let buckets = (until - since) / step;
    if buckets > MAX_BUCKETS {
        return Err(ApiError::BadRequest(format!(
            "the range holds {buckets} buckets of {} s, more than {MAX_BUCKETS}: give a larger step or a shorter range",
            step / 1000
        )));
    }
    Ok((since, until, step))
}

/// One window before merging: `[from, until)`, disabled or not, and its reason.
#[derive(Clone, Debug)]
struct Raw {
    from: Millis,
    until: Millis,
    disabled: bool,
    reason: String,
}

/// Each profile's windows within `[since, until)`: those its failures set (from the end of the
/// failed attempt to `cooldown_until`, or to its next success when one came first), and the
/// ones it is in now (from when they opened), merged; a disabled window covers a cooling one.
fn timeline(
    views: &crate::engine::Views,
    windows: Vec<FailureWindow>,
    (since, until): (Millis, Millis),
    now: Millis,
    cooldown_max: Millis,
) -> Vec<ProfileTimeline> {
    let mut raw: BTreeMap<&ProfileId, Vec<Raw>> = views.keys().map(|id| (id, Vec::new())).collect();
    for w in windows {
        let Ok(id) = w.profile_id.parse::<ProfileId>() else { continue };
        let Some(list) = raw.get_mut(&id) else { continue };
        let reason = w.reason.clone().unwrap_or_else(|| "unknown".into());
        let parsed = reason.parse::<Reason>().ok();
        if parsed.is_some_and(|r| r.mark() == Mark::Model) {
            continue; // the model's window on the provider, not the profile's
        }
        let from = w.started_at + w.duration_ms.unwrap_or(0).max(0);
        let end = match w.cooldown_until {
            Some(end) => end,
            // Disabled until cleared: until the profile's next success, its last clear, or now.
            None => {
                let view = views.get(&id);
                let still = view.is_some_and(|v| v.stats.active_disabled(now).is_some());
                let cleared = view.and_then(|v| v.stats.cleared_at).filter(|c| *c > from);
                if still { until } else { cleared.unwrap_or(from) }
            }
        };
        let disabled = parsed.is_some_and(|r| r.mark() == Mark::Disabled) || end - from > cooldown_max;
        let end = w.next_success.map_or(end, |s| end.min(s));
        list.push(Raw { from, until: end, disabled, reason });
    }
    // The windows in force now, from when they opened (or the range's start).
    for (id, list) in raw.iter_mut() {
        let Some(v) = views.get(*id) else { continue };
        list.extend(current(v, now, until));
    }
    raw.into_iter()
        .map(|(profile, list)| ProfileTimeline { profile: profile.to_string(), segments: merge(list, since, until) })
        .collect()
}

/// The profile's windows active at `now`: the disabled lane and each cooldown window.
fn current(v: &ProfileView, now: Millis, until: Millis) -> Vec<Raw> {
    let s = &v.stats;
    let mut out = Vec::new();
    if let Some(d) = s.active_disabled(now) {
        out.push(Raw {
            from: s.window_opened_at.unwrap_or(now).min(now),
            until: d.until.unwrap_or(until.max(now)),
            disabled: true,
            reason: d.reason.to_string(),
        });
    }
    for c in s.active_cooldowns(now) {
        out.push(Raw { from: c.opened_at.min(now), until: c.until, disabled: false, reason: c.reason.to_string() });
    }
    out
}

/// The windows clipped to `[since, until)` and flattened: where windows overlap, a disabled
/// one wins, then the one that ends last (then the one listed last); adjacent pieces of the same
/// state and reason join. One sweep over the windows' edges, with those open at each in a heap.
fn merge(list: Vec<Raw>, since: Millis, until: Millis) -> Vec<Segment> {
    let (list, edges) = clipped(list, since, until);
    let mut opening: Vec<usize> = (0..list.len()).collect();
    opening.sort_by_key(|&i| list[i].from);
    let mut opening = opening.into_iter().peekable();
    let mut open = std::collections::BinaryHeap::new();
    let mut out: Vec<Segment> = Vec::new();
    for pair in edges.windows(2) {
        let (a, b) = (pair[0], pair[1]);
        while let Some(i) = opening.next_if(|&i| list[i].from <= a) {
            open.push((list[i].disabled, list[i].until, i));
        }
        // A window still open at `a` ends at an edge after it, so it covers `[a, b)`.
        while open.peek().is_some_and(|&(_, end, _)| end <= a) {
            open.pop();
        }
        if let Some(&(_, _, top)) = open.peek() {
            piece(&mut out, (a, b), &list[top]);
        }
    }
    out
}

/// The windows clipped to `[since, until)`, those left empty dropped, and their edges in order.
fn clipped(list: Vec<Raw>, since: Millis, until: Millis) -> (Vec<Raw>, Vec<Millis>) {
    let list: Vec<Raw> = list
        .into_iter()
        .map(|r| Raw { from: r.from.max(since), until: r.until.min(until), ..r })
        .filter(|r| r.from < r.until)
        .collect();
    let mut edges: Vec<Millis> = list.iter().flat_map(|r| [r.from, r.until]).collect();
    edges.sort_unstable();
    edges.dedup();
    (list, edges)
}

/// `[a, b)` in the state of `top`, joined to the last segment when it goes on in the same state
/// and reason.
fn piece(out: &mut Vec<Segment>, (a, b): (Millis, Millis), top: &Raw) {
    let state = if top.disabled { "disabled" } else { "cooling" };
    match out.last_mut() {
        Some(last) if last.until == a && last.state == state && last.reason == top.reason => last.until = b,
        _ => out.push(Segment { from: a, until: b, state: state.into(), reason: top.reason.clone() }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(from: Millis, until: Millis, disabled: bool, reason: &str) -> Raw {
        Raw { from, until, disabled, reason: reason.into() }
    }

    fn seg(from: Millis, until: Millis, state: &str, reason: &str) -> Segment {
        Segment { from, until, state: state.into(), reason: reason.into() }
    }

    #[test]
    fn windows_merge_clip_and_a_disabled_one_covers_a_cooling_one() {
        let list = vec![
            raw(10, 50, false, "rate_limit"),
            raw(40, 80, false, "rate_limit"),
            raw(60, 200, true, "billing"),
            raw(-100, 5, false, "timeout"),
            raw(300, 400, false, "overloaded"),
        ];
        assert_eq!(
            merge(list, 0, 350),
            [
                seg(0, 5, "cooling", "timeout"),
                seg(10, 60, "cooling", "rate_limit"),
                seg(60, 200, "disabled", "billing"),
                seg(300, 350, "cooling", "overloaded"),
            ]
        );
        assert_eq!(merge(vec![raw(10, 10, false, "x"), raw(400, 500, false, "x")], 0, 350), []);
    }

    /// The flattening by definition: for each piece between two edges, the top window that
    /// covers it (the sweep's oracle).
    fn merge_by_definition(list: Vec<Raw>, since: Millis, until: Millis) -> Vec<Segment> {
        let (list, edges) = clipped(list, since, until);
        let mut out: Vec<Segment> = Vec::new();
        for pair in edges.windows(2) {
            let (a, b) = (pair[0], pair[1]);
            let top = list.iter().filter(|r| r.from <= a && b <= r.until).max_by_key(|r| (r.disabled, r.until));
            if let Some(top) = top {
                piece(&mut out, (a, b), top);
            }
        }
        out
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(512))]
        #[test]
        fn the_sweep_flattens_as_the_definition_does(
            windows in proptest::collection::vec((-20i64..120, 0i64..60, proptest::bool::ANY, 0usize..3), 0..40),
        ) {
            let list: Vec<Raw> = windows
                .into_iter()
                .map(|(from, len, disabled, r)| raw(from, from + len, disabled, ["rate_limit", "timeout", "billing"][r]))
                .collect();
            proptest::prop_assert_eq!(merge(list.clone(), 0, 100), merge_by_definition(list, 0, 100));
        }
    }

    #[test]
    fn the_range_is_rounded_to_the_step_and_bounded() {
        let p = |since: &str, until: &str, step: Option<&str>| SeriesParams {
            since: Some(since.into()),
            until: Some(until.into()),
            step: step.map(Into::into),
        };
        assert_eq!(range(&p("61000", "120001", None), 0).unwrap(), (60_000, 180_000, 60_000));
        assert_eq!(range(&p("60000", "120000", None), 0).unwrap(), (60_000, 120_000, 60_000));
        let defaults = SeriesParams { since: None, until: None, step: None };
        assert_eq!(range(&defaults, 3_600_000 * 5 + 1).unwrap(), (3_600_000 * 4, 3_600_000 * 5 + 60_000, 60_000));
        let err = |p: SeriesParams| match range(&p, 0) {
            Err(ApiError::BadRequest(m)) => m,
            other => panic!("{:?}", other.map(|_| ())),
        };
        assert!(err(p("0", "60000", Some("59"))).contains("60 to 86400"));
        assert!(err(p("0", "60000", Some("86401"))).contains("60 to 86400"));
        assert!(err(p("0", "60000", Some("1m"))).contains("whole number"));
        assert!(err(p("0", "60000", Some("90"))).contains("multiple of 60"));
        assert!(err(p("60000", "60000", None)).contains("before"));
        assert!(err(p("0", "86460000", None)).contains("1441 buckets"));
        assert_eq!(range(&p("0", "86400000", None), 0).unwrap().1, 86_400_000);
    }
}
