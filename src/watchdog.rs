//! Whether the database answers (docs/gateway.md, "Audit, health and shutdown"): a probe every
//! `EVERY`, so that `/healthz` says `degraded` soon after a database stops answering (a frozen
//! server, a lock held for long), and the limits (crate::limits) stop waiting for it. Before
//! each probe it checks that this process can still write the database's files
//! (`Store::files_problem`): one made immutable or taken away is logged and shown, and not
//! probed (a write to a mapped `-shm` that can no longer be written is a SIGBUS).

use crate::store::Store;
use parking_lot::Mutex;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

pub use crate::store::TIMEOUT;

/// How often the database is asked.
const EVERY: Duration = Duration::from_millis(250);

/// When the database last answered a probe, and what keeps rota from writing its files.
pub struct Watchdog {
    started: Instant,
    /// Milliseconds from `started` to the last answer.
    answered: AtomicU64,
    files: Mutex<Option<String>>,
}

impl Watchdog {
    /// Probes `store` until `tasks` is cancelled.
    pub fn start(store: Arc<dyn Store>, tasks: CancellationToken) -> Arc<Watchdog> {
        let dog = Arc::new(Watchdog { started: Instant::now(), answered: AtomicU64::new(0), files: Mutex::new(None) });
        let probing = dog.clone();
        tokio::spawn(tasks.run_until_cancelled_owned(async move {
            loop {
                let asked = Instant::now();
                if probing.files_checked(store.files_problem()) {
                    tokio::time::sleep_until((asked + EVERY).into()).await;
                    continue;
                }
                if let Ok(Ok(())) = tokio::time::timeout(TIMEOUT, store.ping()).await {
                    probing.answered.store(probing.started.elapsed().as_millis() as u64, Ordering::Relaxed);
                }
                tokio::time::sleep_until((asked + EVERY).into()).await;
            }
        }));
        dog
    }

    /// Keeps what the files' check found, logging a change; whether there is a problem.
    fn files_checked(&self, now: Option<String>) -> bool {
        let mut files = self.files.lock();
        match (&*files, &now) {
            (None, Some(why)) => tracing::error!("the database's files cannot be written: {why}"),
            (Some(_), None) => tracing::info!("the database's files can be written again"),
            _ => {}
        }
        let problem = now.is_some();
        *files = now;
        problem
    }

    /// Why the database's files cannot be written, when they cannot.
    pub fn files(&self) -> Option<String> {
        self.files.lock().clone()
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
