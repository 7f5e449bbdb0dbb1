//! Budgets and limits per agent (docs/config.md, "Budgets and limits per agent"):
//! `requests_per_minute`, `tokens_per_day` and `cost_per_day`, from `[agents.NAME]` or stored
//! with the agent through the admin API. They are checked before a request's first attempt
//! (gateway and leases), in memory, against counters that every server on the database shares
//! (`agent_usage`, docs/schema.md):
//!
//! - `requests_per_minute`: each server claims slots of the agent's minute from the shared
//!   counter a chunk at a time (`chunk`), ahead of need, and admits from what it claimed. The
//!   counter never passes the limit, so the servers together admit at most the limit in a
//!   minute; slots a server claimed and did not use are lost to the others for that minute (at
//!   most one chunk per server, none under a limit of 64).
//! - `tokens_per_day` and `cost_per_day`: the day's totals as read from the database at most
//!   `FRESH` ago (one read for every request waiting meanwhile), plus what this server's
//!   requests spent since that read began.
//!
//! A database that does not answer within `watchdog::TIMEOUT` holds no request longer than
//! that: the request is admitted (logged), as with every shared state (docs/scale.md).

use crate::agents::{DAY, Limits, MINUTE, day_start, minute_start};
use crate::config::Config;
use crate::engine::Millis;
use crate::store::{Store, StoreError};
use crate::watchdog::{TIMEOUT, Watchdog};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// How old the day's totals may be before they are read again: what other servers (and other
/// writers) spent counts within this much.
pub const FRESH: Duration = Duration::from_millis(250);

/// The slots a server claims at once for a limit of `cap` requests a minute: a thirty-second
/// of it, 1 to 1,024. A limit under 64 is claimed one request at a time, when it arrives
/// (exact across servers: a round trip per request, at most one a second); a larger one costs
/// a round trip per chunk, taken before the slots run out.
pub fn chunk(cap: i64) -> i64 {
    (cap / 32).clamp(1, 1024)
}

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

/// Ends when the task it was made for is over (a claim, a read): a sender dropped or a `true`.
type Done = watch::Receiver<bool>;

/// One agent's minute: the slots this server claimed and has not used yet.
#[derive(Default)]
struct Minute {
    start: Millis,
    /// The limit the slots were claimed under.
    cap: i64,
    left: i64,
    /// The shared counter is at the limit: refused until the minute ends.
    full: bool,
    /// The last claim failed (the database refused or did not answer): requests are admitted
    /// until a claim succeeds.
    failed: bool,
    claim: Option<Done>,
}

/// One agent's day: the totals as read, and what this server spent since.
#[derive(Default)]
struct Day {
    start: Millis,
    /// As read from the database (`None`: not read yet), and this server's spend counted
    /// in it: `spent` when the read began.
    read: Option<(Instant, i64, f64)>,
    base: (i64, f64),
    /// This server's spend this day (its requests' tokens and cost), counted as they end.
    spent: (i64, f64),
    reading: Option<Done>,
}

impl Day {
    fn used(&self) -> (i64, f64) {
        let (_, tokens, cost) = self.read.unwrap_or((Instant::now(), 0, 0.0));
        (tokens.saturating_add(self.spent.0).saturating_sub(self.base.0), cost + self.spent.1 - self.base.1)
    }
}

#[derive(Default)]
struct Gate {
    minute: Minute,
    day: Day,
}

/// `agent`'s gate, made on its first request (the lookup allocates nothing after that).
fn gate<'a>(gates: &'a mut HashMap<String, Gate>, agent: &str) -> &'a mut Gate {
    if !gates.contains_key(agent) {
        gates.insert(agent.to_string(), Gate::default());
    }
    gates.get_mut(agent).expect("inserted above")
}

/// The admission of every agent with a limit, shared by the gateway and the lease API.
pub struct Limiter {
    store: Arc<dyn Store>,
    watchdog: Arc<Watchdog>,
    gates: Mutex<HashMap<String, Gate>>,
}

impl Limiter {
    pub fn new(store: Arc<dyn Store>, watchdog: Arc<Watchdog>) -> Arc<Limiter> {
        Arc::new(Limiter { store, watchdog, gates: Mutex::new(HashMap::new()) })
    }

    /// Admits one request of `agent` under `limits` at `now` (the runtime's clock), or says
    /// which limit it is over, within `TIMEOUT` whatever the database does. Agents without
    /// limits cost nothing.
    pub async fn admit(self: &Arc<Self>, agent: &str, limits: &Limits, now: Millis) -> Result<(), OverLimit> {
        let deadline = tokio::time::Instant::now() + TIMEOUT;
        if limits.tokens_per_day.is_some() || limits.cost_per_day.is_some() {
            self.check_day(agent, limits, now, deadline).await?;
        }
        if let Some(cap) = limits.requests_per_minute {
            self.take_slot(agent, cap, now, deadline).await?;
        }
        Ok(())
    }

    /// A request of `agent` started at `started_at` spent this: counted against its day at once
    /// (the audit writer adds it to the shared counter with the request's row).
    pub fn spent(&self, agent: &str, started_at: Millis, tokens: i64, cost: f64) {
        let mut gates = self.gates.lock();
        if let Some(day) = gates.get_mut(agent).map(|g| &mut g.day).filter(|d| d.start == day_start(started_at)) {
            day.spent.0 = day.spent.0.saturating_add(tokens);
            day.spent.1 += cost;
        }
    }

    async fn check_day(
        self: &Arc<Self>,
        agent: &str,
        limits: &Limits,
        now: Millis,
        deadline: tokio::time::Instant,
    ) -> Result<(), OverLimit> {
        let day = day_start(now);
        let stale = {
            let mut gates = self.gates.lock();
            let d = &mut gate(&mut gates, agent).day;
            if d.start != day {
                *d = Day { start: day, ..Day::default() };
            }
            let stale = d.read.is_none_or(|(at, ..)| at.elapsed() >= FRESH);
            if stale && d.reading.is_none() {
                d.reading = Some(self.read_day(agent, day, d.spent));
            }
            if stale { d.reading.clone() } else { None }
        };
        if let Some(mut reading) = stale.filter(|_| self.watchdog.answering()) {
            // Totals older than `FRESH` are read again first: one read for every request that
            // waits meanwhile, a few a second at most.
            let _ = tokio::time::timeout_at(deadline, reading.wait_for(|done| *done)).await;
        }
        let used = {
            let gates = self.gates.lock();
            gates.get(agent).filter(|g| g.day.start == day).map_or((0, 0.0), |g| g.day.used())
        };
        let retry_after = seconds_until(day + DAY, now);
        if let Some(cap) = limits.tokens_per_day.filter(|&cap| used.0 >= cap) {
            return Err(OverLimit::new(
                agent,
                format!("tokens_per_day = {cap}"),
                Some(used.0.to_string()),
                retry_after,
            ));
        }
        if let Some(cap) = limits.cost_per_day.filter(|&cap| used.1 >= cap) {
            let (limit, used) = (format!("cost_per_day = {} USD", usd(cap)), Some(usd(used.1)));
            return Err(OverLimit::new(agent, limit, used, retry_after));
        }
        Ok(())
    }

    /// Reads the agent's day from the database in the background; `spent` is this server's
    /// spend when the read began (the rows written by then are in what it reads).
    fn read_day(self: &Arc<Self>, agent: &str, day: Millis, spent: (i64, f64)) -> Done {
        let (tx, rx) = watch::channel(false);
        let (me, agent) = (self.clone(), agent.to_string());
        tokio::spawn(async move {
            let began = Instant::now();
            let read = tokio::time::timeout(TIMEOUT, me.store.agent_usage(Some(&agent), minute_start(day), day)).await;
            let mut gates = me.gates.lock();
            let Some(d) = gates.get_mut(&agent).map(|g| &mut g.day).filter(|d| d.start == day) else { return };
            d.reading = None;
            match read {
                Ok(Ok(mut all)) => {
                    let u = all.remove(&agent).unwrap_or_default();
                    d.read = Some((began, u.tokens_today, u.cost_today));
                    d.base = spent;
                }
                Ok(Err(e)) => tracing::warn!(error = %e, agent, "reading the agent's use of its day failed; admitting"),
                Err(_) => {
                    tracing::warn!(agent, "the database did not answer the agent's use of its day in time; admitting")
                }
            }
            let _ = tx.send(true);
        });
        rx
    }

    async fn take_slot(
        self: &Arc<Self>,
        agent: &str,
        cap: i64,
        now: Millis,
        deadline: tokio::time::Instant,
    ) -> Result<(), OverLimit> {
        let minute = minute_start(now);
        loop {
            let mut claim = {
                let mut gates = self.gates.lock();
                let m = &mut gate(&mut gates, agent).minute;
                if (m.start, m.cap) != (minute, cap) {
                    // A new minute, or a changed limit: what was claimed under the old one goes.
                    *m = Minute { start: minute, cap, ..Minute::default() };
                }
                if m.left > 0 {
                    m.left -= 1;
                    // The next chunk is claimed before this one runs out. A limit claimed one slot
                    // at a time is claimed on demand: no server holds a slot another could use.
                    let chunk = chunk(cap);
                    if chunk > 1 && m.left < (chunk + 1) / 2 && m.claim.is_none() && !m.full {
                        m.claim = Some(self.claim(agent, minute, cap));
                    }
                    return Ok(());
                }
                if m.full {
                    let retry_after = seconds_until(minute + MINUTE, now);
                    return Err(OverLimit::new(agent, format!("requests_per_minute = {cap}"), None, retry_after));
                }
                if m.failed {
                    // The database failed the last claim: admitted while the next one is tried.
                    if m.claim.is_none() {
                        m.claim = Some(self.claim(agent, minute, cap));
                    }
                    return Ok(());
                }
                m.claim.get_or_insert_with(|| self.claim(agent, minute, cap)).clone()
            };
            if !self.watchdog.answering() {
                tracing::debug!(agent, "the database does not answer: admitting without a claimed slot");
                return Ok(());
            }
            if tokio::time::timeout_at(deadline, claim.wait_for(|done| *done)).await.is_err() {
                tracing::warn!(agent, "no slot claimed from the database in time: admitting");
                return Ok(());
            }
        }
    }

    /// Claims the next chunk of `agent`'s minute in the background (one request's slot when the
    /// chunk no longer fits under the limit).
    fn claim(self: &Arc<Self>, agent: &str, minute: Millis, cap: i64) -> Done {
        let (tx, rx) = watch::channel(false);
        let (me, agent) = (self.clone(), agent.to_string());
        tokio::spawn(async move {
            let mut want = chunk(cap);
            let got = loop {
                match tokio::time::timeout(TIMEOUT, me.store.claim_requests(&agent, minute, want, cap)).await {
                    Ok(Ok(None)) if want > 1 => want = 1,
                    Ok(Ok(counted)) => break Ok(counted.map(|_| want)),
                    Ok(Err(e)) => break Err(e.to_string()),
                    Err(_) => break Err(format!("no answer within {}s", TIMEOUT.as_secs())),
                }
            };
            let mut gates = me.gates.lock();
            let Some(m) = gates.get_mut(&agent).map(|g| &mut g.minute).filter(|m| (m.start, m.cap) == (minute, cap))
            else {
                return;
            };
            m.claim = None;
            match got {
                Ok(Some(slots)) => (m.left, m.failed) = (m.left + slots, false),
                Ok(None) => (m.full, m.failed) = (true, false),
                Err(why) => {
                    tracing::warn!(agent, "claiming the agent's requests of this minute failed ({why}); admitting");
                    m.failed = true;
                }
            }
            let _ = tx.send(true);
        });
        rx
    }
}

/// USD as a person reads it: at most six decimals, no trailing zeros.
fn usd(x: f64) -> String {
    format!("{}", (x * 1e6).round() / 1e6)
}

/// Each active agent's use of each limit in force (a share: 1 is the limit), from the counters
/// every server shares; none when the database does not answer within a second (a scrape or
/// the alerts' watch is not held up).
pub async fn used(store: &dyn Store, config: &Config, now: Millis) -> Vec<((String, String), f64)> {
    let (minute, day) = (minute_start(now), day_start(now));
    let read = async { Ok::<_, StoreError>((store.agents().await?, store.agent_usage(None, minute, day).await?)) };
    let Ok(Ok((agents, usage))) = tokio::time::timeout(Duration::from_secs(1), read).await else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for a in agents.iter().filter(|a| a.revoked_at.is_none()) {
        let limits = config.agent_limits(a);
        let used = usage.get(&a.name).copied().unwrap_or_default();
        let pairs = [
            ("requests_per_minute", limits.requests_per_minute.map(|l| (used.requests_this_minute as f64, l as f64))),
            ("tokens_per_day", limits.tokens_per_day.map(|l| (used.tokens_today as f64, l as f64))),
            ("cost_per_day", limits.cost_per_day.map(|l| (used.cost_today, l))),
        ];
        for (limit, pair) in pairs {
            if let Some((used, cap)) = pair {
                out.push(((a.name.clone(), limit.to_string()), used / cap));
            }
        }
    }
    out
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
    fn chunks_are_a_thirty_second_of_the_limit_from_1_to_1024() {
        assert_eq!([1, 5, 31, 32, 64, 3_200, 32_768, 1_000_000].map(chunk), [1, 1, 1, 1, 2, 100, 1024, 1024]);
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
