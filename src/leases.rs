//! The lease table (docs/api.md): the outstanding leases, each an attempt of its failover walk;
//! the ids that ended recently, to answer a late report clearly; the per-agent counts and
//! failure-report rate; and the task that expires unreported leases, audited `cancelled`.
//! The HTTP side is `api::leases`.

use crate::engine::ProfileId;
use crate::engine::recent::Recent;
use crate::engine::{Clock, Millis, Reason};
use crate::settings::Settings;
use crate::store::AttemptRow;
use crate::walk::{Attempt, Spent, Walk};
use parking_lot::Mutex;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// How long a reported or expired lease id is remembered, to answer a late report clearly.
pub const ENDED_TTL: Millis = 24 * 3_600_000;
pub const ENDED_KEYS: usize = 100_000;
/// Outstanding leases at most; past it, new leases are refused (503) until some are reported.
pub const MAX_LIVE: usize = 100_000;

/// An outstanding lease: the walk it belongs to and its attempt row.
pub struct Live {
    pub agent: String,
    pub walk: Walk,
    pub settings: Arc<Settings>,
    pub attempt: Attempt,
    pub row: AttemptRow,
    pub issued_at: Millis,
    pub expires_at: Millis,
}

#[derive(Clone, Copy)]
pub enum Ended {
    Reported,
    Expired,
}

pub struct Table {
    pub live: HashMap<Uuid, Live>,
    pub ended: Recent<Uuid, (String, Ended)>,
    /// Outstanding leases per agent.
    pub held: HashMap<String, usize>,
    /// Reports per agent and kind (success or not) in the current minute: (the minute's
    /// start, count).
    pub reports: HashMap<(String, bool), (Millis, u32)>,
    /// What each untrusted agent's reports did to each provider's profiles in the current
    /// `leases.claim_window`.
    pub claims: HashMap<(String, String), Claims>,
}

/// The profiles of one provider that one agent's reports cooled or ordered last in a window.
#[derive(Default)]
pub struct Claims {
    start: Millis,
    moved: HashSet<ProfileId>,
    pushed: HashSet<ProfileId>,
}

/// What an untrusted agent's report would do to a profile.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Claim {
    /// Cool it (a failure).
    Cool,
    /// Order it after the others until a reset its quota headers give.
    Push,
}

impl Table {
    pub fn insert(&mut self, id: Uuid, live: Live) {
        *self.held.entry(live.agent.clone()).or_default() += 1;
        self.live.insert(id, live);
    }

    pub fn remove(&mut self, id: &Uuid) -> Option<Live> {
        let live = self.live.remove(id)?;
        if let Some(n) = self.held.get_mut(&live.agent) {
            *n -= 1;
            if *n == 0 {
                self.held.remove(&live.agent);
            }
        }
        Some(live)
    }

    /// Counts a report of `agent` (a success, or a failure); `Err(seconds until the minute
    /// ends)` past the limit of its kind.
    pub fn count_report(&mut self, agent: &str, success: bool, limit: u32, now: Millis) -> Result<(), u64> {
        let (start, n) = self.reports.entry((agent.to_string(), success)).or_insert((now, 0));
        if now - *start >= 60_000 {
            (*start, *n) = (now, 0);
        }
        if *n >= limit {
            return Err((((*start + 60_000 - now).max(0) as u64).div_ceil(1000)).max(1));
        }
        *n += 1;
        Ok(())
    }

    /// Whether `agent`'s report may do `claim` to `pid`, one of `profiles` profiles of its
    /// provider (docs/api.md, "A report is a claim"): within `window`, the agent's reports move
    /// at most `share` of them (at least one; a profile already moved may be again), and order
    /// each last at most once. `Err`: why not.
    pub fn admit_claim(
        &mut self,
        agent: &str,
        pid: &ProfileId,
        claim: Claim,
        (profiles, share, window): (usize, f64, Millis),
        now: Millis,
    ) -> Result<(), String> {
        let claims = self.claims.entry((agent.to_string(), pid.provider().to_string())).or_default();
        if now - claims.start >= window || now < claims.start {
            *claims = Claims { start: now, ..Claims::default() };
        }
        let most = ((profiles as f64 * share).floor() as usize).max(1);
        if claim == Claim::Push && claims.pushed.contains(pid) {
            return Err(format!(
                "agent {agent}'s reports ordered {pid} last once in this window already (leases.claim_window)"
            ));
        }
        if !claims.moved.contains(pid) && claims.moved.len() >= most {
            return Err(format!(
                "agent {agent}'s reports moved {most} of {}'s {profiles} profiles in this window, its share (leases.claim_share)",
                pid.provider()
            ));
        }
        claims.moved.insert(pid.clone());
        if claim == Claim::Push {
            claims.pushed.insert(pid.clone());
        }
        Ok(())
    }
}

pub struct Leases {
    table: Mutex<Table>,
}

impl Leases {
    /// The lease table, with a task that expires unreported leases every second.
    pub fn start(clock: Arc<dyn Clock>, tasks: CancellationToken) -> Arc<Leases> {
        let leases = Arc::new(Leases {
            table: Mutex::new(Table {
                live: HashMap::new(),
                ended: Recent::new(ENDED_TTL, ENDED_KEYS),
                held: HashMap::new(),
                reports: HashMap::new(),
                claims: HashMap::new(),
            }),
        });
        let weak = Arc::downgrade(&leases);
        tokio::spawn(tasks.run_until_cancelled_owned(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(1)).await;
                let Some(leases) = weak.upgrade() else { return };
                leases.expire(clock.now(), false);
            }
        }));
        leases
    }

    pub fn lock(&self) -> parking_lot::MutexGuard<'_, Table> {
        self.table.lock()
    }

    /// Ends every lease past its expiry (`all`: every lease, at shutdown, so that none leaves
    /// its request unaudited). Each attempt is audited as cancelled; no stats change.
    pub fn expire(&self, now: Millis, all: bool) {
        let mut table = self.lock();
        let due: Vec<Uuid> = table.live.iter().filter(|(_, l)| all || now >= l.expires_at).map(|(id, _)| *id).collect();
        for id in due {
            let live = table.remove(&id).expect("listed above");
            table.ended.insert(id, (live.agent.clone(), Ended::Expired), now);
            let why = if all { "rota shut down before the lease was reported" } else { "the lease expired unreported" };
            expire_one(live, now, why);
        }
    }
}

/// Ends one lease unreported: its attempt audited as cancelled, its request finished.
pub fn expire_one(mut live: Live, now: Millis, why: &str) {
    live.row.reason = Some(Reason::Cancelled);
    live.row.duration_ms = Some(now.min(live.expires_at) - live.issued_at);
    live.row.error = Some(format!("{why}; no stats changed"));
    live.walk.trail.record(live.row);
    live.walk.trail.finish(499, None, Spent::default());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_agents_claims_move_at_most_its_share_and_push_each_profile_once_a_window() {
        let mut t = Table {
            live: HashMap::new(),
            ended: Recent::new(ENDED_TTL, ENDED_KEYS),
            held: HashMap::new(),
            reports: HashMap::new(),
            claims: HashMap::new(),
        };
        let p = |n: &str| -> ProfileId { n.parse().unwrap() };
        let bounds = (5, 0.5, 3_600_000);
        let mut admit = |agent: &str, id: &str, claim, now| t.admit_claim(agent, &p(id), claim, bounds, now);
        assert!(admit("a", "openai:1", Claim::Cool, 0).is_ok());
        assert!(admit("a", "openai:2", Claim::Push, 1).is_ok());
        assert!(admit("a", "openai:3", Claim::Cool, 2).unwrap_err().contains("leases.claim_share"), "2 of 5");
        assert!(admit("a", "openai:1", Claim::Cool, 3).is_ok(), "a profile already moved may be again");
        assert!(admit("a", "openai:2", Claim::Push, 4).unwrap_err().contains("once"), "pushed once a window");
        assert!(admit("a", "openai:1", Claim::Push, 5).is_ok(), "its first push");
        assert!(admit("b", "openai:3", Claim::Cool, 6).is_ok(), "another agent has its own share");
        assert!(admit("a", "anthropic:1", Claim::Cool, 7).is_ok(), "and so has another provider");
        assert!(admit("a", "openai:3", Claim::Cool, 3_600_000).is_ok(), "a new window");
        let one = (1, 0.5, 3_600_000);
        assert!(t.admit_claim("c", &p("solo:1"), Claim::Cool, one, 0).is_ok(), "at least one profile");
    }
}
