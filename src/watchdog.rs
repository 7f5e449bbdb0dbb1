//! Whether the database answers (docs/gateway.md, "Audit, health and shutdown"): a probe every
//! `EVERY`, so that `/healthz` says `degraded` soon after a database stops answering (a frozen
//! server, a lock held for long), and the limits (crate::limits) stop waiting for it.

use crate::store::Store;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

pub use crate::store::TIMEOUT;

/// How often the database is asked.
const EVERY: Duration = Duration::from_millis(250);

/// When the database last answered a probe.
pub struct Watchdog {
    started: Instant,
    /// Milliseconds from `started` to the last answer.
    answered: AtomicU64,
}

impl Watchdog {
    /// Probes `store` until `tasks` is cancelled.
    pub fn start(store: Arc<dyn Store>, tasks: CancellationToken) -> Arc<Watchdog> {
        let dog = Arc::new(Watchdog { started: Instant::now(), answered: AtomicU64::new(0) });
        let probing = dog.clone();
        tokio::spawn(tasks.run_until_cancelled_owned(async move {
            loop {
                let asked = Instant::now();
                if let Ok(Ok(())) = tokio::time::timeout(TIMEOUT, store.ping()).await {
                    probing.answered.store(probing.started.elapsed().as_millis() as u64, Ordering::Relaxed);
                }
                tokio::time::sleep_until((asked + EVERY).into()).await;
            }
        }));
        dog
    }

    /// How long since the database last answered.
    pub fn silent_for(&self) -> Duration {
        self.started.elapsed().saturating_sub(Duration::from_millis(self.answered.load(Ordering::Relaxed)))
    }

    /// Whether the database answered within `TIMEOUT`.
    pub fn answering(&self) -> bool {
        self.silent_for() <= TIMEOUT
    }
}
