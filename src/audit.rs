//! The audit trail: one `requests` row per request and one `attempts` row per upstream call or
//! skipped candidate (SPEC §7). Rows are queued on the hot path and written in batches by one
//! background task; `flush` waits until everything queued so far is on disk.

use crate::engine::{Millis, Reason};
use crate::store::{AttemptRecord, RequestRecord, Store};
use std::sync::Arc;
use tokio::sync::{mpsc, oneshot};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Primary,
    Retry,
    Rotate,
    Fallback,
    Probe,
    Skipped,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Primary => "primary",
            Kind::Retry => "retry",
            Kind::Rotate => "rotate",
            Kind::Fallback => "fallback",
            Kind::Probe => "probe",
            Kind::Skipped => "skipped",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Success,
    Failure,
    Skipped,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Success => "success",
            Outcome::Failure => "failure",
            Outcome::Skipped => "skipped",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AttemptRow {
    pub request_id: String,
    pub seq: u32,
    pub kind: Kind,
    pub agent: Option<String>,
    pub provider: String,
    pub model: String,
    pub profile_id: Option<String>,
    pub started_at: Millis,
    pub duration_ms: Option<Millis>,
    pub ttfb_ms: Option<Millis>,
    pub http_status: Option<u16>,
    pub outcome: Outcome,
    pub reason: Option<Reason>,
    pub retry_after_ms: Option<Millis>,
    pub cooldown_until: Option<Millis>,
    /// Already redacted and at most 500 characters.
    pub error: Option<String>,
    pub tokens_in: Option<i64>,
    pub tokens_out: Option<i64>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestRow {
    pub id: String,
    pub agent: Option<String>,
    pub api: &'static str,
    pub requested_model: Option<String>,
    pub served_model: Option<String>,
    pub served_profile: Option<String>,
    pub status: u16,
    pub attempts: u32,
    pub started_at: Millis,
    pub duration_ms: Millis,
    pub stream: bool,
    pub tokens_in: Option<i64>,
    pub tokens_out: Option<i64>,
}

impl From<AttemptRow> for AttemptRecord {
    fn from(a: AttemptRow) -> AttemptRecord {
        AttemptRecord {
            request_id: a.request_id,
            seq: i64::from(a.seq),
            kind: a.kind.as_str().into(),
            agent: a.agent,
            provider: a.provider,
            model: a.model,
            profile_id: a.profile_id,
            started_at: a.started_at,
            duration_ms: a.duration_ms,
            ttfb_ms: a.ttfb_ms,
            http_status: a.http_status.map(i64::from),
            outcome: a.outcome.as_str().into(),
            reason: a.reason.map(|r| r.as_str().into()),
            retry_after_ms: a.retry_after_ms,
            cooldown_until: a.cooldown_until,
            error: a.error,
            tokens_in: a.tokens_in,
            tokens_out: a.tokens_out,
        }
    }
}

impl From<RequestRow> for RequestRecord {
    fn from(r: RequestRow) -> RequestRecord {
        RequestRecord {
            id: r.id,
            agent: r.agent,
            api: r.api.into(),
            requested_model: r.requested_model,
            served_model: r.served_model,
            served_profile: r.served_profile,
            status: Some(i64::from(r.status)),
            attempts: i64::from(r.attempts),
            started_at: r.started_at,
            duration_ms: Some(r.duration_ms),
            stream: r.stream,
            tokens_in: r.tokens_in,
            tokens_out: r.tokens_out,
        }
    }
}

enum Msg {
    Attempt(AttemptRow),
    Request(RequestRow),
    Flush(oneshot::Sender<()>),
}

#[derive(Clone)]
pub struct Audit {
    tx: mpsc::UnboundedSender<Msg>,
    depth: Arc<std::sync::atomic::AtomicUsize>,
}

impl Audit {
    pub fn start(store: Arc<dyn Store>) -> Audit {
        let (tx, rx) = mpsc::unbounded_channel();
        let depth = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        tokio::spawn(write_loop(store, rx, depth.clone()));
        Audit { tx, depth }
    }

    pub fn attempt(&self, row: AttemptRow) {
        self.depth.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let _ = self.tx.send(Msg::Attempt(row));
    }

    pub fn request(&self, row: RequestRow) {
        self.depth.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let _ = self.tx.send(Msg::Request(row));
    }

    /// Rows queued and not yet written.
    pub fn queue_depth(&self) -> usize {
        self.depth.load(std::sync::atomic::Ordering::Relaxed)
    }

    pub async fn flush(&self) {
        let (tx, rx) = oneshot::channel();
        if self.tx.send(Msg::Flush(tx)).is_ok() {
            let _ = rx.await;
        }
    }
}

async fn write_loop(
    store: Arc<dyn Store>,
    mut rx: mpsc::UnboundedReceiver<Msg>,
    depth: Arc<std::sync::atomic::AtomicUsize>,
) {
    const BATCH: usize = 1024;
    let mut buf = Vec::with_capacity(BATCH);
    while rx.recv_many(&mut buf, BATCH).await > 0 {
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
        for attempt in 1..=8 {
            match store.insert_audit(&requests, &attempts).await {
                Ok(()) => break,
                Err(e) if attempt == 8 => tracing::error!(error = %e, rows = n, "audit rows could not be written"),
                Err(e) => {
                    tracing::warn!(error = %e, attempt, "writing audit rows failed; retrying");
                    tokio::time::sleep(delay).await;
                    delay *= 2;
                }
            }
        }
        depth.fetch_sub(n, std::sync::atomic::Ordering::Relaxed);
        for tx in waiting {
            let _ = tx.send(());
        }
    }
}
