//! The audit trail's writer: one `requests` row per request and one `attempts` row per upstream
//! call or skipped candidate (docs/audit.md; the rows are `crate::store::{RequestRow, AttemptRow}`).
//! Rows are queued on the hot path and written in batches by a write-behind (`crate::behind`);
//! `flush` waits until everything queued so far is on disk. The queue is bounded
//! (`audit.queue`): when the database cannot keep up, rows are shed and counted
//! (`rota_audit_dropped_total`), never the requests themselves (docs/audit.md). While the
//! writer works but lags, new requests wait for it (`admit`), so that a crash never loses
//! more than the last moment's rows.

use crate::behind::{self, Sink, Writer};
use crate::store::{AttemptRecord, AttemptRow, RequestRecord, RequestRow, Store, StoreError};
use parking_lot::{Mutex, MutexGuard};
use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

enum Row {
    Attempt(AttemptRow),
    Request(RequestRow),
}

/// The rows waiting for the writer (each with when it was queued), how many were queued
/// since start, and since when the oldest row of the batch being written waits.
#[derive(Default)]
struct Queue {
    rows: VecDeque<(Instant, Row)>,
    queued: u64,
    writing_since: Option<Instant>,
}

impl Queue {
    /// How long the oldest row not yet written has waited.
    fn lag(&self) -> Duration {
        let oldest = self.writing_since.or(self.rows.front().map(|r| r.0));
        oldest.map_or(Duration::ZERO, |t| t.elapsed())
    }
}

/// What the writer and the handlers share: the queue, its depth (waiting and being written),
/// the rows shed, and the write-behind's state.
struct Shared {
    capacity: usize,
    queue: Mutex<Queue>,
    depth: AtomicUsize,
    dropped_requests: AtomicU64,
    dropped_attempts: AtomicU64,
    /// Rows the database refused for their content, set aside (`Rows::isolate`).
    invalid_requests: AtomicU64,
    invalid_attempts: AtomicU64,
    /// When a shed row was last logged (ms since the writer started): one line a second.
    logged_at: AtomicU64,
    /// Requests that waited in `Audit::admit`.
    held: AtomicU64,
    /// When a batch was last written (ms since the writer started).
    written_at: AtomicU64,
    started: Instant,
    writer: Arc<Writer>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock()
    }

    /// Rows that are written without gathering: `BATCH`, or half the queue when that is fewer,
    /// so that rows gathering for a write never fill the queue (a small `audit.queue`).
    fn whole(&self) -> usize {
        BATCH.min(self.capacity.div_ceil(2)).max(1)
    }
}

/// The writer's state, for `/healthz` and `/metrics`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Health {
    pub queued: usize,
    pub capacity: usize,
    pub dropped_requests: u64,
    pub dropped_attempts: u64,
    /// Rows the database refused for their content (a value out of its range, a failed
    /// check), set aside so that the rows behind them are written.
    pub invalid_requests: u64,
    pub invalid_attempts: u64,
    /// The last write failed; the writer is retrying it.
    pub failing: bool,
    /// How long the oldest row not yet written has waited (ms).
    pub lag_ms: u64,
    /// The longest one batch's write took since start (ms), waits for the database included.
    pub slowest_write_ms: u64,
    /// Requests that waited for the writer before they were served (`admit`), since start.
    pub held: u64,
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
/// write under way (docs/audit.md). Each write costs the same few statements and a commit
/// whatever its rows (the roll-ups' upserts): below the saturated rate, a longer gather makes
/// fewer of them (with 10 ms: 11–14 % more instructions a failover-mix request).
const GATHER: Duration = Duration::from_millis(50);

/// A request is served only once the oldest unwritten row is younger than this (`admit`): a
/// SIGKILL loses the rows of the requests answered in the last 250 ms at most (docs/audit.md),
/// and this leaves room for one batch's write beside it.
const ADMIT_LAG: Duration = Duration::from_millis(100);

/// The longest a request waits for the writer to catch up. A writer that has not written a
/// batch in that long is stuck (the database is locked by another process or failing, and the
/// busy timeout has not run out yet): requests are then served without waiting, and rows shed
/// and counted when the queue is full, as while it fails.
const ADMIT_WAIT: Duration = Duration::from_millis(500);

/// Rows written in one transaction at most; a batch this large (or half the queue) is written
/// without gathering.
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
            invalid_requests: AtomicU64::new(0),
            invalid_attempts: AtomicU64::new(0),
            logged_at: AtomicU64::new(0),
            held: AtomicU64::new(0),
            written_at: AtomicU64::new(0),
            started: Instant::now(),
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
            queue.rows.push_back((Instant::now(), row));
            queue.queued += 1;
            let whole = queue.rows.len() == shared.whole();
            shared.depth.fetch_add(1, Ordering::Relaxed);
            drop(queue);
            shared.writer.wake();
            if whole {
                shared.writer.hurry();
            }
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

    /// Shutdown gave up waiting for the database: the rows still queued (not the batch under
    /// way, which may yet land) are shed and counted with the others (`dropped_*`,
    /// `rota_audit_dropped_total`), so that what was lost is a count, not only a log line.
    pub fn give_up(&self) -> Health {
        let shared = self.shared();
        let rows: Vec<(Instant, Row)> = shared.lock().rows.drain(..).collect();
        shared.depth.fetch_sub(rows.len(), Ordering::Relaxed);
        for (_, row) in rows {
            match row {
                Row::Request(_) => shared.dropped_requests.fetch_add(1, Ordering::Relaxed),
                Row::Attempt(_) => shared.dropped_attempts.fetch_add(1, Ordering::Relaxed),
            };
        }
        self.health()
    }

    pub fn health(&self) -> Health {
        let s = self.shared();
        Health {
            queued: s.depth.load(Ordering::Relaxed),
            capacity: s.capacity,
            dropped_requests: s.dropped_requests.load(Ordering::Relaxed),
            dropped_attempts: s.dropped_attempts.load(Ordering::Relaxed),
            invalid_requests: s.invalid_requests.load(Ordering::Relaxed),
            invalid_attempts: s.invalid_attempts.load(Ordering::Relaxed),
            failing: s.writer.failing(),
            lag_ms: s.lock().lag().as_millis() as u64,
            slowest_write_ms: s.writer.slowest().as_millis() as u64,
            held: s.held.load(Ordering::Relaxed),
        }
    }

    /// Waits, before a request is served, while the writer works but lags: while the oldest
    /// row not yet written has waited more than `ADMIT_LAG`, for `ADMIT_WAIT` at most. So the
    /// rows a SIGKILL can lose stay those of the last moment at any load: when requests come
    /// faster than the database takes their rows, they are served at the rate it does
    /// (docs/audit.md, "A crash loses at most the last moment"). Not while the writer fails:
    /// then rows are shed and counted, and requests are served as before.
    pub async fn admit(&self) {
        let shared = self.shared();
        let stuck = || {
            let since = shared
                .started
                .elapsed()
                .saturating_sub(Duration::from_millis(shared.written_at.load(Ordering::Relaxed)));
            shared.writer.failing() || since > ADMIT_WAIT
        };
        if shared.lock().lag() <= ADMIT_LAG || stuck() {
            return;
        }
        shared.held.fetch_add(1, Ordering::Relaxed);
        let until = tokio::time::Instant::now() + ADMIT_WAIT;
        let mut written = shared.writer.subscribe();
        while shared.lock().lag() > ADMIT_LAG && !stuck() {
            if tokio::time::timeout_at(until, written.changed()).await.is_err() {
                return;
            }
        }
    }

    /// Waits until every row queued so far is written.
    pub async fn flush(&self) {
        let shared = self.shared();
        let target = shared.lock().queued;
        shared.writer.written(target).await;
    }

    /// `flush`, for at most `limit`: whether everything queued was written.
    pub async fn flush_within(&self, limit: Duration) -> bool {
        tokio::time::timeout(limit, self.flush()).await.is_ok()
    }
}

/// The audit writer's sink: the queued rows, in order, `BATCH` at most at a time.
struct Rows(Arc<Shared>);

impl Sink for Rows {
    type Batch = (Vec<RequestRecord>, Vec<AttemptRecord>);
    const WHAT: &'static str = "audit rows";

    fn ready(&self) -> bool {
        self.0.lock().rows.len() >= self.0.whole()
    }

    fn take(&mut self) -> (Self::Batch, u64) {
        let mut queue = self.0.lock();
        let n = queue.rows.len().min(BATCH);
        queue.writing_since = queue.rows.front().map(|r| r.0);
        let rows: Vec<Row> = queue.rows.drain(..n).map(|r| r.1).collect();
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

    /// A batch the database keeps refusing is written row by row: a row refused for its content
    /// (`StoreError::is_content`) is set aside, logged once with the reason and counted
    /// (`invalid_*`), and the rows behind it are written. Another failure stops here: the
    /// database is failing, not the row, and the batch is retried whole (rows already written
    /// are not written twice).
    async fn isolate(&mut self, store: &dyn Store, (requests, attempts): &Self::Batch) -> bool {
        let shared = &self.0;
        let mut set_aside = 0;
        for r in requests {
            match store.insert_audit(std::slice::from_ref(r), &[]).await {
                Ok(()) => {}
                Err(e) if e.is_content() => {
                    tracing::error!(request_id = %r.id, error = %e, "a requests row the database refuses was set aside");
                    shared.invalid_requests.fetch_add(1, Ordering::Relaxed);
                    set_aside += 1;
                }
                Err(_) => return false,
            }
        }
        for a in attempts {
            match store.insert_audit(&[], std::slice::from_ref(a)).await {
                Ok(()) => {}
                Err(e) if e.is_content() => {
                    tracing::error!(request_id = %a.request_id, seq = a.seq, error = %e, "an attempts row the database refuses was set aside");
                    shared.invalid_attempts.fetch_add(1, Ordering::Relaxed);
                    set_aside += 1;
                }
                Err(_) => return false,
            }
        }
        if set_aside == 0 {
            return false; // every row went in alone: the batch's failure was the database's
        }
        shared.depth.fetch_sub(requests.len() + attempts.len(), Ordering::Relaxed);
        shared.lock().writing_since = None;
        true
    }

    async fn write(&mut self, store: &dyn Store, batch: &Self::Batch) -> Result<(), StoreError> {
        store.insert_audit(&batch.0, &batch.1).await?;
        self.0.depth.fetch_sub(Self::rows(batch), Ordering::Relaxed);
        self.0.lock().writing_since = None;
        self.0.written_at.store(self.0.started.elapsed().as_millis() as u64, Ordering::Relaxed);
        Ok(())
    }
}
