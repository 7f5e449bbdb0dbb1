//! Budgets and limits per agent (docs/config.md): `requests_per_minute`, `tokens_per_day` and
//! `cost_per_day`, from `[agents.NAME]` or stored with the agent through the admin API. They are
//! checked before a request's first attempt (gateway and leases) against counters that every
//! server on the database shares (`agent_usage`, docs/schema.md).

use crate::agents::{DAY, Limits, MINUTE, day_start, minute_start};
use crate::engine::Millis;
use crate::store::Store;

/// Whole seconds from `now` to `end`, at least 1: a `Retry-After`.
fn seconds_until(end: Millis, now: Millis) -> u64 {
    ((end - now + 999) / 1000).max(1) as u64
}

/// A request refused because its agent is over a limit: the message (naming the limit) and
/// the seconds until the limit's window ends (`Retry-After`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OverLimit {
    pub message: String,
    pub retry_after: u64,
}

impl OverLimit {
    fn new(agent: &str, limit: String, used: Option<String>, retry_after: u64) -> OverLimit {
        let used = used.map(|u| format!("{u} used today; ")).unwrap_or_default();
        OverLimit {
            message: format!("agent {agent} is over its limit {limit} ({used}resets in {retry_after} s)"),
            retry_after,
        }
    }
}

/// USD as a person reads it: at most six decimals, no trailing zeros.
fn usd(x: f64) -> String {
    format!("{}", (x * 1e6).round() / 1e6)
}

/// Admits one request of `agent` under `limits` at `now` (the runtime's clock), or says which
/// limit it is over. The day's tokens and cost are read first (counting nothing); then, with
/// `requests_per_minute`, the request is counted in its minute unless the minute is full, in
/// one atomic statement (exact across servers). Agents without limits cost no round trip.
///
/// A database that cannot answer admits the request (logged): as with every shared state
/// (docs/scale.md), traffic flows from what the server has while the database is down.
pub async fn admit(store: &dyn Store, agent: &str, limits: &Limits, now: Millis) -> Result<(), OverLimit> {
    let (minute, day) = (minute_start(now), day_start(now));
    if limits.tokens_per_day.is_some() || limits.cost_per_day.is_some() {
        let used = match store.agent_usage(Some(agent), minute, day).await {
            Ok(mut all) => all.remove(agent).unwrap_or_default(),
            Err(e) => {
                tracing::warn!(error = %e, agent, "reading the agent's use of its day failed; admitting the request");
                Default::default()
            }
        };
        let retry_after = seconds_until(day + DAY, now);
        if let Some(cap) = limits.tokens_per_day.filter(|&cap| used.tokens_today >= cap) {
            let used = Some(used.tokens_today.to_string());
            return Err(OverLimit::new(agent, format!("tokens_per_day = {cap}"), used, retry_after));
        }
        if let Some(cap) = limits.cost_per_day.filter(|&cap| used.cost_today >= cap) {
            let (limit, used) = (format!("cost_per_day = {} USD", usd(cap)), Some(usd(used.cost_today)));
            return Err(OverLimit::new(agent, limit, used, retry_after));
        }
    }
    if let Some(cap) = limits.requests_per_minute {
        match store.count_request(agent, minute, cap).await {
            Ok(Some(_)) => {}
            Ok(None) => {
                let retry_after = seconds_until(minute + MINUTE, now);
                return Err(OverLimit::new(agent, format!("requests_per_minute = {cap}"), None, retry_after));
            }
            Err(e) => tracing::warn!(error = %e, agent, "counting the agent's request failed; admitting it"),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_are_clock_aligned_and_retry_after_is_at_least_a_second() {
        let t = 1_764_633_642_500; // 2025-12-02T00:00:42.5Z
        assert_eq!(minute_start(t), 1_764_633_600_000);
        assert_eq!(day_start(t), 1_764_633_600_000);
        assert_eq!(seconds_until(minute_start(t) + MINUTE, t), 18);
        assert_eq!(seconds_until(t + 1, t), 1);
        assert_eq!(seconds_until(t, t), 1);
        assert_eq!(day_start(t + DAY - 42_500 - 1), day_start(t));
    }

    #[test]
    fn the_message_names_the_limit_and_when_it_resets() {
        let o = OverLimit::new("planner", "requests_per_minute = 5".into(), None, 42);
        assert_eq!(o.message, "agent planner is over its limit requests_per_minute = 5 (resets in 42 s)");
        let o = OverLimit::new("planner", format!("cost_per_day = {} USD", usd(2.5)), Some(usd(2.6100004)), 7);
        assert_eq!(
            o.message,
            "agent planner is over its limit cost_per_day = 2.5 USD (2.61 used today; resets in 7 s)"
        );
    }
}
