//! One write-behind: items are queued on the request path and written to the store in batches
//! by one background task, so that a request never waits on the database. The usage-stats
//! writer (`book`) and the audit writer (`audit`) are two of them, each a `Sink`: where its
//! batches come from and how one is written.
//!
//! The task wakes when something is queued, lets more gather for a moment (unless someone waits
//! for the write, the writer is closing, or a whole batch waits), takes a batch and writes it. A
//! failing write is retried until the database takes it, pausing 50 ms, then twice as long each
//! time up to a second (`BACKOFF`); meanwhile the writer says it is failing (`/healthz`,
//! `rota_database_write_failing`). The count of items written is published, so `Writer::written`
//! waits until everything queued up to a point is on disk (flush, group commit).
//!
//! Each write is made in the writers' turn (`Store::write_turn`: SQLite has one writer at a
//! time, and the writers of one process queue for it in order). After a write failed on a full
//! disk, the drain of what waited is paced (`pace`): the log is emptied before each batch, a
//! batch is written only while the disk keeps `DRAIN_FLOOR` free, and one a `DRAIN_PAUSE` at
//! most, so that the backlog cannot fill the space an operator just freed (docs/audit.md).

use crate::store::{Store, StoreError};
use backon::{BackoffBuilder, ExponentialBuilder};
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::{Notify, watch};

/// The longest pause between two tries of a failing write.
const BACKOFF_MAX: Duration = Duration::from_secs(1);

/// The pauses between the tries of a failing write: 50 ms, doubling up to `BACKOFF_MAX`, for as
/// long as the write fails.
const BACKOFF: ExponentialBuilder = ExponentialBuilder::new()
    .with_min_delay(Duration::from_millis(50))
    .with_factor(2.0)
    .with_max_delay(BACKOFF_MAX)
    .without_max_times();

/// From this many failed tries of a batch on, the sink may also write it item by item
/// (`Sink::isolate`).
const ISOLATE_AFTER: u32 = 3;

/// After a full disk, a batch is written only while the database's file system has this much
/// free: room for the write-ahead log of a second of writes at the saturated rate, and for
/// whatever else the machine writes there.
pub const DRAIN_FLOOR: u64 = 32 << 20;

/// After a full disk, the writer writes one batch per this pause at most until it has caught up
/// and the disk has twice `DRAIN_FLOOR` free: at most about 10,000 audit rows (10 MB) a second.
const DRAIN_PAUSE: Duration = Duration::from_millis(100);

/// What a write-behind's task and the handles that queue for it share: the wake-ups, whether
/// the last write failed, and the count of items written so far.
pub struct Writer {
    /// Something was queued, a flush waits, or the writer closes.
    wake: Notify,
    /// A flush waits: write without gathering.
    urgent: AtomicBool,
    /// Cuts a gather short.
    hurry: Notify,
    /// Items written so far (the sink's count of items queued that they reach).
    written: watch::Sender<u64>,
    /// The last write failed; the writer is retrying it.
    failing: AtomicBool,
    /// The handles are gone: write what is left, then end.
    closed: AtomicBool,
    /// The longest one batch's write took since start (µs), in the writers' turn: waits for the
    /// database's lock (another process, a checkpoint) included, the other writer's turn not.
    slowest: AtomicU64,
    /// A write failed on a full disk: what waits is drained at a pace (`pace`) until the
    /// writer has caught up.
    full: AtomicBool,
}

impl Writer {
    pub fn new() -> Arc<Writer> {
        Arc::new(Writer {
            wake: Notify::new(),
            urgent: AtomicBool::new(false),
            hurry: Notify::new(),
            written: watch::Sender::new(0),
            failing: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            slowest: AtomicU64::new(0),
            full: AtomicBool::new(false),
        })
    }

    /// A receiver that sees each batch written (`changed`).
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.written.subscribe()
    }

    /// The longest one batch's write took since start.
    pub fn slowest(&self) -> Duration {
        Duration::from_micros(self.slowest.load(Ordering::Relaxed))
    }

    /// Something was queued: the writer gathers and writes it.
    pub fn wake(&self) {
        self.wake.notify_one();
    }

    /// A whole batch waits: a gather under way ends, and the batch is written.
    pub fn hurry(&self) {
        self.hurry.notify_one();
    }

    /// Waits until the items queued up to `target` (the sink's count) are written, or given up;
    /// the writer writes at once. Concurrent callers share its transactions (group commit).
    pub async fn written(&self, target: u64) {
        let mut written = self.written.subscribe();
        self.urgent.store(true, Ordering::Relaxed);
        self.hurry.notify_one();
        self.wake.notify_one();
        let _ = written.wait_for(|w| *w >= target).await;
    }

    /// The writer writes what is left, without gathering, and ends.
    pub fn close(&self) {
        self.closed.store(true, Ordering::Relaxed);
        self.hurry.notify_one();
        self.wake.notify_one();
    }

    /// Whether `close` was called.
    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Relaxed)
    }

    /// Whether the last write failed (the writer retries it).
    pub fn failing(&self) -> bool {
        self.failing.load(Ordering::Relaxed)
    }

    /// Everything queued up to `upto` is written (or given up).
    fn done(&self, upto: u64) {
        self.failing.store(false, Ordering::Relaxed);
        self.written.send_modify(|w| *w = (*w).max(upto));
    }
}

/// One write-behind's items: where its batches come from and how one is written. The methods
/// run in the writer's task, one at a time.
pub trait Sink: Send + 'static {
    type Batch: Send + Sync;
    /// What the log lines call the items: `audit rows`, `usage stats`.
    const WHAT: &'static str;

    /// Moves what is queued (or the first batch of it) to the writer, with the count of items
    /// queued up to it (what `Writer::written` waits for).
    fn take(&mut self) -> (Self::Batch, u64);

    /// The rows of a batch; none: there is nothing to write.
    fn rows(batch: &Self::Batch) -> usize;

    /// A whole batch waits: it is written without gathering.
    fn ready(&self) -> bool {
        false
    }

    /// Writes the batch in one transaction.
    fn write(&mut self, store: &dyn Store, batch: &Self::Batch) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// After the third failed try of a batch and each one after: writes its items one by one.
    /// True when some of them could be written: the others are bad items, given up, and the
    /// batch is done. By default the batch is retried whole until the database takes it.
    fn isolate(&mut self, store: &dyn Store, batch: &Self::Batch) -> impl Future<Output = bool> + Send {
        let _ = (store, batch);
        async { false }
    }
}

/// Starts the writer's task: it writes the sink's batches, gathering items for `gather` before
/// each, until `writer` is closed and everything queued is written.
pub fn spawn<S: Sink>(writer: Arc<Writer>, store: Arc<dyn Store>, sink: S, gather: Duration) {
    tokio::spawn(run(writer, store, sink, gather));
}

async fn run<S: Sink>(writer: Arc<Writer>, store: Arc<dyn Store>, mut sink: S, gather: Duration) {
    loop {
        writer.wake.notified().await;
        // A moment more makes one transaction of what would be dozens: fewer pages
        // written to the log, and the other writer gets its turn (SQLite has one writer).
        if !writer.urgent.swap(false, Ordering::Relaxed) && !writer.closed.load(Ordering::Relaxed) && !sink.ready() {
            tokio::select! {
                _ = tokio::time::sleep(gather) => {}
                _ = writer.hurry.notified() => {}
            }
        }
        loop {
            let closed = writer.closed.load(Ordering::Relaxed);
            let paced = writer.full.load(Ordering::Relaxed);
            if paced {
                pace(store.as_ref()).await;
            }
            let (batch, upto) = sink.take();
            let empty = S::rows(&batch) == 0;
            if !empty {
                write(&writer, store.as_ref(), &mut sink, &batch).await;
            }
            writer.done(upto);
            if paced {
                let roomy = store.free_bytes().is_none_or(|f| f >= 2 * DRAIN_FLOOR);
                if sink.ready() {
                    writer.wake(); // the next batch of the backlog, after the pause
                } else if !writer.failing() && roomy {
                    writer.full.store(false, Ordering::Relaxed);
                    tracing::info!("{}: the backlog after the full disk is written", S::WHAT);
                }
                tokio::time::sleep(DRAIN_PAUSE).await;
            }
            if !closed {
                break;
            }
            if empty {
                return;
            }
        }
    }
}

/// Writes one batch, retrying until the database takes it (busy, read-only or failing for a
/// while: nothing is dropped), or until the sink isolates its bad items.
async fn write<S: Sink>(writer: &Writer, store: &dyn Store, sink: &mut S, batch: &S::Batch) {
    let rows = S::rows(batch);
    let mut pauses = BACKOFF.build();
    let mut tries = 0u32;
    loop {
        let turn = store.write_turn().await;
        let started = Instant::now();
        let done = sink.write(store, batch).await;
        writer.slowest.fetch_max(started.elapsed().as_micros() as u64, Ordering::Relaxed);
        drop(turn);
        match done {
            Ok(()) => {
                if tries > 0 {
                    tracing::info!(rows, tries, "{} written after the database recovered", S::WHAT);
                }
                return;
            }
            Err(e) => {
                tries += 1;
                writer.failing.store(true, Ordering::Relaxed);
                // A full disk, or a failure with the disk nearly full (an `fsync` that found no
                // room for blocks the file system had promised fails as an I/O error).
                if e.is_full() || store.free_bytes().is_some_and(|f| f < DRAIN_FLOOR) {
                    writer.full.store(true, Ordering::Relaxed);
                }
                store.write_failed(&e);
                if tries == 1 || tries.is_power_of_two() {
                    tracing::error!(
                        error = %e,
                        rows,
                        tries,
                        "writing {} failed; retrying until the database takes them",
                        S::WHAT
                    );
                }
            }
        }
        if tries >= ISOLATE_AFTER {
            let turn = store.write_turn().await;
            let isolated = sink.isolate(store, batch).await;
            drop(turn);
            if isolated {
                return;
            }
        }
        tokio::time::sleep(pauses.next().unwrap_or(BACKOFF_MAX)).await;
    }
}

/// Before each batch of the drain after a full disk: the write-ahead log is copied into the
/// database and emptied, which gives its space back, and the batch waits while the database's
/// file system has less than `DRAIN_FLOOR` free (rows meanwhile queue, and the audit queue sheds
/// and counts what overflows it).
async fn pace(store: &dyn Store) {
    let mut logged = false;
    loop {
        let _ = store.checkpoint(true).await;
        match store.free_bytes() {
            Some(free) if free < DRAIN_FLOOR => {
                if !logged {
                    tracing::warn!(
                        free_mb = free >> 20,
                        floor_mb = DRAIN_FLOOR >> 20,
                        "the disk that was full has too little free space: the writers wait before writing more"
                    );
                    logged = true;
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            _ => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use parking_lot::Mutex;

    #[test]
    fn the_pauses_double_from_50_ms_to_a_second_and_never_end() {
        let pauses: Vec<u128> = BACKOFF.build().take(9).map(|d| d.as_millis()).collect();
        assert_eq!(pauses, [50, 100, 200, 400, 800, 1000, 1000, 1000, 1000]);
        assert!(BACKOFF.build().nth(100_000).is_some());
    }

    /// A queue of numbers whose writes fail `fails` times first.
    #[derive(Default)]
    struct State {
        queue: Vec<u32>,
        queued: u64,
        fails: u32,
        tries: u32,
        isolated: u32,
        written: Vec<Vec<u32>>,
        ended: bool,
    }

    struct Numbers(Arc<Mutex<State>>);

    impl Drop for Numbers {
        fn drop(&mut self) {
            self.0.lock().ended = true;
        }
    }

    impl Sink for Numbers {
        type Batch = Vec<u32>;
        const WHAT: &'static str = "numbers";

        fn take(&mut self) -> (Vec<u32>, u64) {
            let mut s = self.0.lock();
            (std::mem::take(&mut s.queue), s.queued)
        }

        fn rows(batch: &Vec<u32>) -> usize {
            batch.len()
        }

        async fn write(&mut self, _: &dyn Store, batch: &Vec<u32>) -> Result<(), StoreError> {
            let mut s = self.0.lock();
            s.tries += 1;
            if s.fails > 0 {
                s.fails -= 1;
                return Err(StoreError::Corrupt { table: "numbers", detail: "refused".into() });
            }
            s.written.push(batch.clone());
            Ok(())
        }

        async fn isolate(&mut self, _: &dyn Store, _: &Vec<u32>) -> bool {
            self.0.lock().isolated += 1;
            false
        }
    }

    fn push(state: &Mutex<State>, writer: &Writer, n: u32) -> u64 {
        let mut s = state.lock();
        s.queue.push(n);
        s.queued += 1;
        writer.wake();
        s.queued
    }

    #[tokio::test]
    async fn a_failing_batch_is_retried_until_written_and_a_flush_waits_for_it() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(crate::store::SqliteStore::open(&dir.path().join("rota.db")).await.unwrap());
        let state = Arc::new(Mutex::new(State { fails: 4, ..State::default() }));
        let writer = Writer::new();
        spawn(writer.clone(), store, Numbers(state.clone()), Duration::from_millis(10));
        push(&state, &writer, 1);
        let upto = push(&state, &writer, 2);
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(writer.failing(), "the writer says it is failing while it retries");
        let t = std::time::Instant::now();
        writer.written(upto).await;
        // Pauses of 50, 100, 200 and 400 ms between the five tries.
        assert!(t.elapsed() >= Duration::from_millis(600), "{:?}", t.elapsed());
        assert!(!writer.failing());
        let s = state.lock();
        assert_eq!((s.tries, s.isolated), (5, 2), "isolation offered from the third failure on");
        assert_eq!(s.written, [vec![1, 2]]);
    }

    #[tokio::test]
    async fn a_closed_writer_writes_what_is_left_then_ends() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(crate::store::SqliteStore::open(&dir.path().join("rota.db")).await.unwrap());
        let state = Arc::new(Mutex::new(State::default()));
        let writer = Writer::new();
        spawn(writer.clone(), store, Numbers(state.clone()), Duration::from_secs(3600));
        for n in 0..3 {
            push(&state, &writer, n);
        }
        writer.close();
        let t = std::time::Instant::now();
        while !state.lock().ended {
            assert!(t.elapsed() < Duration::from_secs(5), "the writer ended, without gathering for an hour");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(state.lock().written, [vec![0, 1, 2]]);
    }
}
