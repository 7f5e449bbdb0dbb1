//! The lease table (docs/api.md): the outstanding leases, each an attempt of its failover walk;
//! the ids that ended recently, to answer a late report clearly; the per-agent counts and
//! failure-report rate; and the task that expires unreported leases, audited `cancelled`.
//! The HTTP side is `api::leases`.

use crate::engine::recent::Recent;
use crate::engine::{Clock, Millis, Reason};
use crate::settings::Settings;
use crate::store::AttemptRow;
use crate::walk::{Attempt, Spent, Walk};
use parking_lot::Mutex;
use std::collections::HashMap;
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
