//! The audit trail's writer: one `requests` row per request and one `attempts` row per upstream
//! call or skipped candidate (SPEC §7; the rows are `crate::store::{RequestRow, AttemptRow}`).
//! Rows are queued on the hot path and written in batches by a write-behind (`crate::behind`);
//! `flush` waits until everything queued so far is on disk. The queue is bounded
//! (`audit.queue`): when the database cannot keep up, rows are shed and counted
//! (`rota_audit_dropped_total`), never the requests themselves (docs/audit.md).

use crate::behind::{self, Sink, Writer};
use crate::store::{AttemptRecord, AttemptRow, RequestRecord, RequestRow, Store, StoreError};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

enum Row {
    Attempt(AttemptRow),
    Request(RequestRow),
}

/// The rows waiting for the writer, and how many were queued since start.
#[derive(Default)]
struct Queue {
    rows: VecDeque<Row>,
    queued: u64,
}

/// What the writer and the handlers share: the queue, its depth (waiting and being written),
/// the rows shed, and the write-behind's state.
struct Shared {
    capacity: usize,
    queue: Mutex<Queue>,
    depth: AtomicUsize,
    dropped_requests: AtomicU64,
    dropped_attempts: AtomicU64,
    /// When a shed row was last logged (ms since the writer started): one line a second.
    logged_at: AtomicU64,
    started: std::time::Instant,
    writer: Arc<Writer>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        // A row is pushed or a batch drained in one step: a panic cannot leave the queue
        // half-changed.
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }
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
/// the rows queued are written in order once the database takes writes again. When the last
/// handle is dropped, the task writes what is left and ends.
#[derive(Clone)]
pub struct Audit {
    handle: Arc<Handle>,
}

struct Handle(Arc<Shared>);

impl Drop for Handle {
    fn drop(&mut self) {
        self.0.writer.close();
    }
}

/// How long rows gather before a write: the most of them a SIGKILL can lose, beside the
/// write under way (docs/audit.md).
const GATHER: std::time::Duration = std::time::Duration::from_millis(10);

/// Rows written in one transaction at most; a batch this large is written without gathering.
const BATCH: usize = 1024;

impl Audit {
    /// `capacity`: rows queued at most (`audit.queue`).
    pub fn start(store: Arc<dyn Store>, capacity: usize) -> Audit {
        let shared = Arc::new(Shared {
            capacity,
            queue: Mutex::new(Queue::default()),
            depth: AtomicUsize::new(0),
            dropped_requests: AtomicU64::new(0),
            dropped_attempts: AtomicU64::new(0),
            logged_at: AtomicU64::new(0),
            started: std::time::Instant::now(),
            writer: Writer::new(),
        });
        behind::spawn(shared.writer.clone(), store, Rows(shared.clone()), GATHER);
        Audit { handle: Arc::new(Handle(shared)) }
    }

    pub fn attempt(&self, row: AttemptRow) {
        self.queue(Row::Attempt(row));
    }

    pub fn request(&self, row: RequestRow) {
        self.queue(Row::Request(row));
    }

    fn shared(&self) -> &Shared {
        &self.handle.0
    }

    fn queue(&self, row: Row) {
        let shared = self.shared();
        let mut queue = shared.lock();
        if queue.rows.len() < shared.capacity.max(1) {
            queue.rows.push_back(row);
            queue.queued += 1;
            shared.depth.fetch_add(1, Ordering::Relaxed);
            drop(queue);
            shared.writer.wake();
            return;
        }
        drop(queue);
        match row {
            Row::Request(_) => shared.dropped_requests.fetch_add(1, Ordering::Relaxed),
            Row::Attempt(_) => shared.dropped_attempts.fetch_add(1, Ordering::Relaxed),
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

    pub fn health(&self) -> Health {
        let s = self.shared();
        Health {
            queued: s.depth.load(Ordering::Relaxed),
            capacity: s.capacity,
            dropped_requests: s.dropped_requests.load(Ordering::Relaxed),
            dropped_attempts: s.dropped_attempts.load(Ordering::Relaxed),
            failing: s.writer.failing(),
        }
    }

    /// Waits until every row queued so far is written.
    pub async fn flush(&self) {
        let shared = self.shared();
        let target = shared.lock().queued;
        shared.writer.written(target).await;
    }

    /// `flush`, for at most `limit`: whether everything queued was written.
    pub async fn flush_within(&self, limit: std::time::Duration) -> bool {
        tokio::time::timeout(limit, self.flush()).await.is_ok()
    }
}

/// The audit writer's sink: the queued rows, in order, `BATCH` at most at a time.
struct Rows(Arc<Shared>);

impl Sink for Rows {
    type Batch = (Vec<RequestRecord>, Vec<AttemptRecord>);
    const WHAT: &'static str = "audit rows";

    fn ready(&self) -> bool {
        self.0.lock().rows.len() >= BATCH
    }

    fn take(&mut self) -> (Self::Batch, u64) {
        let mut queue = self.0.lock();
        let n = queue.rows.len().min(BATCH);
        let rows: Vec<Row> = queue.rows.drain(..n).collect();
        let upto = queue.queued - queue.rows.len() as u64;
        let more = !queue.rows.is_empty();
        drop(queue);
        if more {
            self.0.writer.wake(); // the next batch, once this one is written
        }
        let (mut requests, mut attempts) = (Vec::new(), Vec::new());
        for row in rows {
            match row {
                Row::Attempt(a) => attempts.push(AttemptRecord::from(a)),
                Row::Request(r) => requests.push(RequestRecord::from(r)),
            }
        }
        ((requests, attempts), upto)
    }

    fn rows((requests, attempts): &Self::Batch) -> usize {
        requests.len() + attempts.len()
    }

    async fn write(&mut self, store: &dyn Store, batch: &Self::Batch) -> Result<(), StoreError> {
        store.insert_audit(&batch.0, &batch.1).await?;
        self.0.depth.fetch_sub(Self::rows(batch), Ordering::Relaxed);
        Ok(())
    }
}
