//! The audit trail: one `requests` row per request and one `attempts` row per upstream call or
//! skipped candidate (SPEC §7). Rows are queued on the hot path and written in batches by one
//! background task; `flush` waits until everything queued so far is on disk. The queue is
//! bounded (`audit.queue`): when the database cannot keep up, rows are shed and counted
//! (`rota_audit_dropped_total`), never the requests themselves (docs/audit.md).

use crate::store::{AttemptRecord, AttemptRow, RequestRecord, RequestRow, Store};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use tokio::sync::mpsc::error::TrySendError;
use tokio::sync::{mpsc, oneshot};

enum Msg {
    Attempt(AttemptRow),
    Request(RequestRow),
    Flush(oneshot::Sender<()>),
}

/// What the writer and the handlers share: the queue's depth, the rows shed, and whether the
/// last write failed.
struct Shared {
    capacity: usize,
    depth: AtomicUsize,
    dropped_requests: AtomicU64,
    dropped_attempts: AtomicU64,
    failing: AtomicBool,
    /// When a shed row was last logged (ms since the writer started): one line a second.
    logged_at: AtomicU64,
    started: std::time::Instant,
}

/// The writer's state, for `/healthz` and `/metrics`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Health {
    pub queued: usize,
    pub capacity: usize,
    pub dropped_requests: u64,
    pub dropped_attempts: u64,
    /// The last write failed; the writer is retrying it.
    pub failing: bool,
}

impl Health {
    /// Failing, or more than half full: rows may soon be shed.
    pub fn degraded(&self) -> bool {
        self.failing || self.queued > self.capacity / 2
    }
}

/// The audit writer's handle: rows go into a bounded queue that one task writes in batches.
/// A full queue sheds rows and counts them; a failing write is retried until it succeeds, so
/// the rows queued are written in order once the database takes writes again.
#[derive(Clone)]
pub struct Audit {
    tx: mpsc::Sender<Msg>,
    shared: Arc<Shared>,
}

impl Audit {
    /// `capacity`: rows queued at most (`audit.queue`).
    pub fn start(store: Arc<dyn Store>, capacity: usize) -> Audit {
        let (tx, rx) = mpsc::channel(capacity.max(1));
        let shared = Arc::new(Shared {
            capacity,
            depth: AtomicUsize::new(0),
            dropped_requests: AtomicU64::new(0),
            dropped_attempts: AtomicU64::new(0),
            failing: AtomicBool::new(false),
            logged_at: AtomicU64::new(0),
            started: std::time::Instant::now(),
        });
        tokio::spawn(write_loop(store, rx, shared.clone()));
        Audit { tx, shared }
    }

    pub fn attempt(&self, row: AttemptRow) {
        self.queue(Msg::Attempt(row));
    }

    pub fn request(&self, row: RequestRow) {
        self.queue(Msg::Request(row));
    }

    fn queue(&self, msg: Msg) {
        let shared = &self.shared;
        shared.depth.fetch_add(1, Ordering::Relaxed);
        match self.tx.try_send(msg) {
            Ok(()) => {}
            Err(TrySendError::Closed(_)) => {
                shared.depth.fetch_sub(1, Ordering::Relaxed);
            }
            Err(TrySendError::Full(msg)) => {
                shared.depth.fetch_sub(1, Ordering::Relaxed);
                match msg {
                    Msg::Request(_) => shared.dropped_requests.fetch_add(1, Ordering::Relaxed),
                    _ => shared.dropped_attempts.fetch_add(1, Ordering::Relaxed),
                };
                let now = shared.started.elapsed().as_millis() as u64;
                let last = shared.logged_at.load(Ordering::Relaxed);
                if now.saturating_sub(last) >= 1000
                    && shared.logged_at.compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed).is_ok()
                {
                    let h = self.health();
                    tracing::error!(
                        dropped_requests = h.dropped_requests,
                        dropped_attempts = h.dropped_attempts,
                        capacity = h.capacity,
                        "the audit queue is full (the database is not keeping up): audit rows are shed"
                    );
                }
            }
        }
    }

    pub fn health(&self) -> Health {
        let s = &self.shared;
        Health {
            queued: s.depth.load(Ordering::Relaxed),
            capacity: s.capacity,
            dropped_requests: s.dropped_requests.load(Ordering::Relaxed),
            dropped_attempts: s.dropped_attempts.load(Ordering::Relaxed),
            failing: s.failing.load(Ordering::Relaxed),
        }
    }

    /// Waits until every row queued so far is written.
    pub async fn flush(&self) {
        let (tx, rx) = oneshot::channel();
        if self.tx.send(Msg::Flush(tx)).await.is_ok() {
            let _ = rx.await;
        }
    }

    /// `flush`, for at most `limit`: whether everything queued was written.
    pub async fn flush_within(&self, limit: std::time::Duration) -> bool {
        tokio::time::timeout(limit, self.flush()).await.is_ok()
    }
}

/// How long rows gather before a write: the most of them a SIGKILL can lose, beside the
/// write under way (docs/audit.md).
const GATHER: std::time::Duration = std::time::Duration::from_millis(10);

/// The longest pause between two tries of a failing write.
const BACKOFF_MAX: std::time::Duration = std::time::Duration::from_secs(1);

async fn write_loop(store: Arc<dyn Store>, mut rx: mpsc::Receiver<Msg>, shared: Arc<Shared>) {
    const BATCH: usize = 1024;
    let mut buf = Vec::with_capacity(BATCH);
    while rx.recv_many(&mut buf, BATCH).await > 0 {
        // A few milliseconds more make one transaction of what would be dozens: fewer pages
        // written to the log, and the stats writer gets its turn.
        if buf.len() < BATCH {
            tokio::time::sleep(GATHER).await;
            while buf.len() < BATCH
                && let Ok(m) = rx.try_recv()
            {
                buf.push(m);
            }
        }
        let (mut requests, mut attempts, mut waiting) = (Vec::new(), Vec::new(), Vec::new());
        for m in buf.drain(..) {
            match m {
                Msg::Attempt(a) => attempts.push(AttemptRecord::from(a)),
                Msg::Request(r) => requests.push(RequestRecord::from(r)),
                Msg::Flush(tx) => waiting.push(tx),
            }
        }
        let n = requests.len() + attempts.len();
        let mut delay = std::time::Duration::from_millis(50);
        let mut tries = 0u32;
        while let Err(e) = store.insert_audit(&requests, &attempts).await {
            tries += 1;
            shared.failing.store(true, Ordering::Relaxed);
            store.write_failed(&e);
            if tries == 1 || tries.is_power_of_two() {
                tracing::error!(error = %e, rows = n, tries, "writing audit rows failed; retrying until the database takes them");
            }
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(BACKOFF_MAX);
        }
        if tries > 0 {
            tracing::info!(rows = n, tries, "audit rows written after the database recovered");
        }
        shared.failing.store(false, Ordering::Relaxed);
        shared.depth.fetch_sub(n, Ordering::Relaxed);
        for tx in waiting {
            let _ = tx.send(());
        }
    }
}
