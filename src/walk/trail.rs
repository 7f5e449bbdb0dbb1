//! The audit trail of one request: its attempt rows in sequence, and its `requests` row with
//! what the serving attempt spent, written through the audit writer and counted in the metrics
//! (docs/audit.md).

use super::Runtime;
use crate::alerts::{Alerts, Event};
use crate::audit::Audit;
use crate::book::Book;
use crate::config::{AlertKind, NamedModels};
use crate::engine::chain::Candidate;
use crate::engine::{Millis, ProfileId, Reason};
use crate::limits::Limiter;
use crate::metrics::Metrics;
use crate::prices::{Prices, Tokens};
use crate::redact::truncate;
use crate::settings::{ServedAlerts, Settings};
use crate::store::{AttemptRow, Kind, Outcome, RequestRow};
use serde_json::json;
use std::sync::Arc;
use tokio::time::Instant;

/// The request-level audit state: the attempt sequence and the `requests` row.
#[derive(Clone)]
pub struct Trail {
    audit: Audit,
    metrics: Arc<Metrics>,
    /// Told what the request spent (its agent's day).
    limits: Arc<Limiter>,
    /// The alerts a served request may raise, when a rule listens for them.
    alerts: Option<(Arc<Alerts>, Arc<ServedAlerts>, Arc<Book>)>,
    /// The prices in force when the request arrived.
    prices: Arc<Prices>,
    /// The models the config named then (metric labels).
    named: Arc<NamedModels>,
    /// `provider/model` of the first attempt or skip, to tell a failover.
    first_candidate: Option<String>,
    /// Time spent in upstream calls, to tell rota's own overhead.
    upstream_ms: Millis,
    /// `provider/model via profile: reason` of each failed upstream call, for a timeout's answer.
    tried: Vec<String>,
    /// `PROFILE MODEL STATUS REASON` of each failed call and skip, the first `TRIED_MAX`, and how
    /// many more: the `x-rota-tried` header.
    passed: (Vec<String>, u32),
    pub request_id: String,
    agent: String,
    api: &'static str,
    requested_model: Option<String>,
    stream: bool,
    started_at: Millis,
    started: Instant,
    pub seq: u32,
    /// rota's own message for a request it answers with an error of its own (the aggregated
    /// error of an exhausted walk): `requests.error`.
    error: Option<String>,
}

/// The most attempts `x-rota-tried` names; the rest are counted.
const TRIED_MAX: usize = 16;

/// A message of rota's as `requests.error` keeps it: anything shaped like a credential masked
/// (the message is built from model names and redacted upstream messages; a client may put
/// anything in a model name), at most 500 characters.
fn request_error(message: &str) -> String {
    truncate(&crate::redact::redact(message, &[]), 500)
}

impl Trail {
    /// The trail of a request of `agent` arriving now, written through `runtime`'s audit
    /// writer and metrics, priced and labelled with `settings`.
    pub fn new(
        runtime: &Runtime,
        settings: &Settings,
        request_id: String,
        agent: String,
        (api, requested_model, stream): (&'static str, Option<String>, bool),
    ) -> Trail {
        Trail {
            audit: runtime.audit.clone(),
            metrics: runtime.metrics.clone(),
            limits: runtime.limits.clone(),
            alerts: settings.served_alerts.clone().map(|watch| (runtime.alerts.clone(), watch, runtime.book.clone())),
            prices: settings.prices.clone(),
            named: settings.named.clone(),
            first_candidate: None,
            upstream_ms: 0,
            tried: Vec::new(),
            passed: (Vec::new(), 0),
            request_id,
            agent,
            api,
            requested_model,
            stream,
            started_at: runtime.now(),
            started: Instant::now(),
            seq: 0,
            error: None,
        }
    }

    pub fn agent(&self) -> &str {
        &self.agent
    }

    /// Whether the config named `provider/model` when the request arrived.
    pub fn names(&self, provider: &str, model: &str) -> bool {
        self.named.get(provider).is_some_and(|m| m.contains(model))
    }

    /// A new attempt row with the next sequence number, outcome `failure` until told otherwise.
    pub fn row(&mut self, kind: Kind, cand: &Candidate, profile: Option<&ProfileId>, started_at: Millis) -> AttemptRow {
        self.seq += 1;
        AttemptRow {
            request_id: self.request_id.clone(),
            seq: self.seq,
            kind,
            agent: Some(self.agent.clone()),
            provider: cand.provider.clone(),
            model: cand.model.clone(),
            profile_id: profile.map(|p| p.to_string()),
            started_at,
            duration_ms: None,
            ttfb_ms: None,
            http_status: None,
            outcome: Outcome::Failure,
            reason: None,
            retry_after_ms: None,
            cooldown_until: None,
            error: None,
            tokens_in: None,
            tokens_out: None,
            cost: None,
            usage_suspect: false,
        }
    }

    /// Sets the row's token counts, held to their range (a row whose counts had to be is
    /// `usage_suspect`, and unpriced), and, when `priced` (the counts are final), what they cost.
    pub(super) fn spend(&self, row: &mut AttemptRow, tokens: Tokens, priced: bool) -> Spent {
        let (tokens, suspect) = tokens.clamped();
        if suspect {
            tracing::warn!(request_id = %row.request_id, provider = %row.provider, "the upstream's token counts are out of range: held to 0..=100,000,000 and flagged usage_suspect");
        }
        (row.tokens_in, row.tokens_out, row.usage_suspect) = (tokens.input, tokens.output, suspect);
        row.cost = (priced && !suspect).then(|| self.prices.cost(&row.provider, &row.model, tokens)).flatten();
        Spent { tokens_in: row.tokens_in, tokens_out: row.tokens_out, cost: row.cost, usage_suspect: suspect }
    }

    /// Audits one attempt or skip (and counts it in the metrics).
    pub fn record(&mut self, row: AttemptRow) {
        crate::telemetry::attempt_ended(&row);
        if self.first_candidate.is_none() {
            self.first_candidate = Some(format!("{}/{}", row.provider, row.model));
        }
        if let Some(profile) = &row.profile_id {
            self.upstream_ms += row.duration_ms.unwrap_or(0);
            if row.outcome == Outcome::Failure {
                let reason = row.reason.map_or("failure", Reason::as_str);
                self.tried.push(format!("{}/{} via {profile}: {reason}", row.provider, row.model));
            }
        }
        if row.outcome != Outcome::Success {
            self.pass(&row);
        }
        self.metrics.observe_attempt(&row, &self.named);
        self.audit.attempt(row);
    }

    /// The failed upstream calls so far.
    pub fn tried(&self) -> &[String] {
        &self.tried
    }

    /// Notes a failed call or a skip for `x-rota-tried`.
    fn pass(&mut self, row: &AttemptRow) {
        if self.passed.0.len() >= TRIED_MAX {
            self.passed.1 += 1;
            return;
        }
        let status = row.http_status.map_or_else(|| "-".to_string(), |s| s.to_string());
        let reason = match row.outcome {
            Outcome::Skipped => format!("skipped:{}", row.reason.map_or("-", Reason::as_str)),
            _ => row.reason.map_or("failure", Reason::as_str).to_string(),
        };
        let line = format!(
            "{} {}/{} {status} {reason}",
            row.profile_id.as_deref().unwrap_or("-"),
            row.provider,
            crate::engine::chain::bounded(&row.model)
        );
        // A header value holds visible ASCII only; a model a client named may hold anything.
        self.passed.0.push(line.chars().map(|c| if c.is_ascii_graphic() || c == ' ' { c } else { '?' }).collect());
    }

    /// The `x-rota-tried` value: the calls that failed and the candidates skipped (before the
    /// one that served, when one did), comma-separated, with the count of those past
    /// `TRIED_MAX`; `None` when there were none.
    pub fn passed(&self) -> Option<String> {
        let (lines, more) = &self.passed;
        if lines.is_empty() {
            return None;
        }
        let mut value = lines.join(", ");
        if *more > 0 {
            value.push_str(&format!(", +{more} more"));
        }
        Some(value)
    }

    /// The message of the error rota answers the request with itself (the aggregated error of
    /// an exhausted walk), kept as `requests.error`.
    pub(super) fn answered(&mut self, message: &str) {
        self.error = Some(request_error(message));
    }

    /// Writes the `requests` row; `spent`: what the serving attempt used.
    pub fn finish(&self, status: u16, served: Option<(&Candidate, &ProfileId)>, spent: Spent) {
        self.write(status, served, spent, self.error.clone());
    }

    /// Writes the `requests` row of a request rota answered with an error of its own: a
    /// refusal (an unknown model, a bad request, a pin it cannot serve), a timeout, a refresh
    /// that failed. `message` is what the client was told.
    pub fn refuse(&self, status: u16, message: &str) {
        self.write(status, None, Spent::default(), Some(request_error(message)));
    }

    fn write(&self, status: u16, served: Option<(&Candidate, &ProfileId)>, spent: Spent, error: Option<String>) {
        let duration_ms = self.started.elapsed().as_millis() as Millis;
        if let (Some((alerts, watch, book)), Some((served, profile))) = (&self.alerts, served) {
            self.raise((alerts, watch, book), served, profile);
        }
        let row = RequestRow {
            id: self.request_id.clone(),
            agent: Some(self.agent.clone()),
            api: self.api,
            requested_model: self.requested_model.clone(),
            served_model: served.map(|(c, _)| c.label()),
            served_profile: served.map(|(_, p)| p.to_string()),
            status,
            attempts: self.seq,
            started_at: self.started_at,
            duration_ms,
            stream: self.stream,
            tokens_in: spent.tokens_in,
            tokens_out: spent.tokens_out,
            error,
            cost: spent.cost,
            usage_suspect: spent.usage_suspect,
        };
        // Only a buffered gateway answer tells rota's own share of the time; a stream's or a
        // lease's time is the client's.
        let overhead = (!self.stream && self.api != "lease").then(|| duration_ms - self.upstream_ms);
        self.metrics.observe_request(&row, self.first_candidate.as_deref(), overhead);
        let tokens = row.tokens_in.unwrap_or(0).saturating_add(row.tokens_out.unwrap_or(0));
        if tokens > 0 || row.cost.is_some() {
            self.limits.spent(&self.agent, self.started_at, tokens, row.cost.unwrap_or(0.0));
        }
        self.audit.request(row);
    }
}

impl Trail {
    /// The `fallback` and `paid` alerts of a served request (docs/operations.md, "Alerts").
    fn raise(&self, (alerts, watch, book): (&Alerts, &ServedAlerts, &Book), served: &Candidate, profile: &ProfileId) {
        let label = served.label();
        let details = || {
            json!({
                "request_id": self.request_id,
                "agent": self.agent,
                "requested_model": self.requested_model,
                "first_choice": self.first_candidate,
                "served_model": label,
                "served_profile": profile.to_string(),
            })
        };
        if watch.fallback
            && let Some(first) = self.first_candidate.as_deref().filter(|first| *first != label)
        {
            // The subject and summary name what the config names: a model the client made up
            // is its provider's `other` (an alert per invented name would be a flood).
            let configured = |p_m: &str| match p_m.split_once('/') {
                Some((p, m)) if self.names(p, m) => p_m.to_string(),
                Some((p, _)) => format!("{p}/other"),
                None => "other".to_string(),
            };
            let (first, served) = (configured(first), configured(&label));
            alerts.raise(Event {
                kind: AlertKind::Fallback,
                subject: first.clone(),
                summary: format!("{first} failed over: a request was served by {served}"),
                details: details(),
                share: None,
            });
        }
        if watch.paid.as_ref().is_some_and(|declared| declared.contains(profile) || book.marked_paid(profile)) {
            alerts.raise(Event {
                kind: AlertKind::Paid,
                subject: profile.to_string(),
                summary: format!("a request of {} was served by the paid profile {profile} ({label})", self.agent),
                details: details(),
                share: None,
            });
        }
    }
}

/// What the attempt that served a request used: the request row's tokens and cost.
#[derive(Clone, Copy, Debug, Default)]
pub struct Spent {
    pub tokens_in: Option<i64>,
    pub tokens_out: Option<i64>,
    pub cost: Option<f64>,
    pub usage_suspect: bool,
}
