//! The audit trail's rows: as the request path builds them (`AttemptRow`, `RequestRow`, typed)
//! and as they are stored and listed (`AttemptRecord`, `RequestRecord`, docs/schema.md). The
//! audit writer (`crate::audit`) queues the former and writes them as the latter.

use crate::engine::{Millis, Reason};

/// What an attempt was: the first call, a same-profile retry, the next profile, the next
/// model, a probe of a cooling profile, or a candidate skipped without a call.
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

/// How an attempt ended.
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

/// One `attempts` row as the request path records it: an upstream call or a skipped candidate.
#[derive(Clone, Debug, PartialEq)]
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
    /// USD, rounded to the micro-dollar; None where no price is known (docs/schema.md).
    pub cost: Option<f64>,
    /// The upstream reported token counts out of range: they were held to it (docs/schema.md).
    pub usage_suspect: bool,
}

/// One `requests` row as the request path records it, once the request is answered.
#[derive(Clone, Debug, PartialEq)]
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
    /// rota's own message when it answered with an error of its own; already redacted and at
    /// most 500 characters.
    pub error: Option<String>,
    /// USD, rounded to the micro-dollar; None where no price is known (docs/schema.md).
    pub cost: Option<f64>,
    /// The served attempt's token counts were held to their range (docs/schema.md).
    pub usage_suspect: bool,
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
            cost: a.cost,
            usage_suspect: a.usage_suspect,
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
            error: r.error,
            cost: r.cost,
            usage_suspect: r.usage_suspect,
        }
    }
}

/// One `attempts` row as stored (docs/schema.md).
#[derive(Clone, Debug, PartialEq, serde::Serialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct AttemptRecord {
    pub request_id: String,
    pub seq: i64,
    pub kind: String,
    pub agent: Option<String>,
    pub provider: String,
    pub model: String,
    pub profile_id: Option<String>,
    pub started_at: i64,
    pub duration_ms: Option<i64>,
    pub ttfb_ms: Option<i64>,
    pub http_status: Option<i64>,
    pub outcome: String,
    pub reason: Option<String>,
    pub retry_after_ms: Option<i64>,
    pub cooldown_until: Option<i64>,
    pub error: Option<String>,
    pub tokens_in: Option<i64>,
    pub tokens_out: Option<i64>,
    /// USD, rounded to the micro-dollar; None where no price is known (docs/schema.md).
    pub cost: Option<f64>,
    /// The upstream reported token counts out of range: they were held to it (docs/schema.md).
    pub usage_suspect: bool,
}

/// One `requests` row as stored (docs/schema.md).
#[derive(Clone, Debug, PartialEq, serde::Serialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct RequestRecord {
    pub id: String,
    pub agent: Option<String>,
    pub api: String,
    pub requested_model: Option<String>,
    pub served_model: Option<String>,
    pub served_profile: Option<String>,
    pub status: Option<i64>,
    pub attempts: i64,
    pub started_at: i64,
    pub duration_ms: Option<i64>,
    pub stream: bool,
    pub tokens_in: Option<i64>,
    pub tokens_out: Option<i64>,
    /// rota's own message when it answered with an error of its own (a refusal, an exhausted
    /// walk, a timeout); NULL when it relayed an answer (an upstream's error included).
    pub error: Option<String>,
    /// USD, rounded to the micro-dollar; None where no price is known (docs/schema.md).
    pub cost: Option<f64>,
    /// The served attempt's token counts were held to their range.
    pub usage_suspect: bool,
}
