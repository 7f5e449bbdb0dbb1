//! Leases (docs/api.md): an agent that calls a provider itself asks rota for a credential, makes
//! the call, and reports what came of it. A lease is one attempt of a failover walk — the
//! same walk the gateway drives — so rotation, retries, fallback, cooldowns and the audit rows
//! are the gateway's for the same faults. A failure report answers with the walk's next lease.
//!
//! Issuing a lease marks its profile used (`lastUsed`, a selection mark, so that concurrent
//! leases spread); its counters and windows change only when it is reported. An unreported
//! lease expires after `leases.ttl`, audited as `cancelled`, changing no counter or window.

use super::ApiState;
use super::{ApiError, Body, Caller};
use crate::book::Credential;
use crate::config::{KeyHeader, WireFormat};
use crate::engine::chain::{ChainError, FallbackOverride, bounded, check_names};
use crate::engine::classify::{Classified, Echoed, Observed};
use crate::engine::{Mark, Millis, ProfileId, ProfileType, Reason};
use crate::gateway::upstream::Upstream;
use crate::leases::{Claim, Ended, Leases, Live, MAX_LIVE, expire_one};
use crate::middleware::RequestId;
use crate::prices::{TOKENS_MAX, Tokens};
use crate::redact::redact;
use crate::settings::Settings;
use crate::store::Kind;
use crate::walk::{Attempt, Failed, Runtime, Spent, Step, Trail, Verdict, Walk};
use axum::Json;
use axum::extract::{Path, State};
use secrecy::ExposeSecret;
use serde::{Deserialize, Serialize, Serializer};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;
use uuid::Uuid;

pub fn routes() -> OpenApiRouter<ApiState> {
    OpenApiRouter::new().routes(routes!(create)).routes(routes!(report))
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct LeaseRequest {
    /// A model (`provider/model`), an alias or a virtual model; the configured primary when absent.
    pub model: Option<String>,
    /// Sticks this session to the profile that served it last (as `x-rota-session`).
    pub session: Option<String>,
    /// Pins one profile (as `x-rota-profile`): it is the only one tried for its provider.
    pub profile: Option<String>,
    /// Profile ids this request must not use.
    #[serde(default)]
    pub exclude: Vec<String>,
    /// Replaces the fallbacks (as `x-rota-fallbacks`): a list of models, `[]` for none.
    pub fallbacks: Option<Vec<String>>,
}

/// One credential to make one call with.
#[derive(Serialize, ToSchema)]
pub struct Lease {
    pub lease_id: String,
    /// Report before this time (RFC 3339); later, the lease is expired.
    pub expires_at: String,
    /// The request this lease is an attempt of (the `requests`/`attempts` rows' id).
    pub request_id: String,
    /// The attempt's sequence number in the request.
    pub attempt: u32,
    /// `primary`, `retry`, `rotate`, `fallback` or `probe`.
    #[serde(serialize_with = "attempt_kind")]
    #[schema(value_type = String)]
    pub kind: Kind,
    /// For a retry: wait this long before calling.
    pub retry_in_ms: u64,
    pub profile_id: String,
    pub provider: String,
    /// The provider's wire format: `openai`, `openai-chat`, `openai-responses` or `anthropic`
    /// (docs/config.md).
    #[serde(serialize_with = "wire_format")]
    #[schema(value_type = String)]
    pub api: WireFormat,
    /// The base URL the provider's official SDK takes.
    pub base_url: String,
    /// The model to send upstream.
    pub model: String,
    pub credential: LeasedCredential,
}

#[derive(Serialize, ToSchema)]
pub struct LeasedCredential {
    /// `api_key`, `token` or `oauth` (an OAuth access token).
    #[serde(rename = "type")]
    #[schema(value_type = String)]
    pub kind: ProfileType,
    /// The secret itself: an API key goes in the SDK's `api_key`; a token or OAuth access token
    /// in `Authorization: Bearer`.
    pub secret: String,
    /// The header the secret travels in: `authorization` (as `Bearer SECRET`), `x-api-key`
    /// or `api-key` (the provider's `key_header`, docs/providers.md).
    pub header: &'static str,
    /// When the credential stops working, if known (RFC 3339).
    pub expires_at: Option<String>,
}

#[derive(Deserialize, Serialize, ToSchema, Clone, Copy, PartialEq, Eq, Debug)]
#[serde(rename_all = "lowercase")]
pub enum ReportOutcome {
    Success,
    Failure,
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Report {
    pub outcome: ReportOutcome,
    /// The provider's HTTP status; absent for a transport failure (connection refused, timeout).
    pub http_status: Option<u16>,
    /// The provider's error body or the transport error's text.
    pub error: Option<String>,
    /// The provider's response headers (`retry-after`, `x-ratelimit-reset-*`, …).
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    pub usage: Option<Usage>,
}

impl Report {
    /// A report that can be true: a success with no error and no other status than a 2xx, an
    /// HTTP status code, token counts in range.
    fn check(&self) -> Result<(), ApiError> {
        if self.outcome == ReportOutcome::Success
            && (self.error.is_some() || self.http_status.is_some_and(|s| !(200..300).contains(&s)))
        {
            return Err(ApiError::BadRequest("a success report carries no error and a 2xx http_status".into()));
        }
        if self.http_status.is_some_and(|s| !(100..600).contains(&s)) {
            return Err(ApiError::BadRequest("http_status must be an HTTP status code (100-599)".into()));
        }
        if let Some(usage) = &self.usage {
            usage.check()?;
        }
        Ok(())
    }
}

/// The provider's token counts, for the attempt's and the request's rows and their cost.
#[derive(Deserialize, ToSchema, Clone, Copy, Default)]
#[serde(deny_unknown_fields)]
pub struct Usage {
    /// The whole prompt, cached and cache-written tokens included. Each count is 0 to
    /// `TOKENS_MAX`.
    pub input_tokens: Option<i64>,
    pub output_tokens: Option<i64>,
    /// Of the prompt, tokens read from the provider's cache (OpenAI `cached_tokens`, Anthropic
    /// `cache_read_input_tokens`).
    pub cached_input_tokens: Option<i64>,
    /// Of the prompt, tokens written to the cache for 5 minutes (Anthropic
    /// `cache_creation_input_tokens`).
    pub cache_write_tokens: Option<i64>,
}

impl Usage {
    /// Every count within 0 to `TOKENS_MAX`, and the cached and cache-written tokens within
    /// the prompt: the error names the field.
    fn check(&self) -> Result<(), ApiError> {
        let counts = [
            ("input_tokens", self.input_tokens),
            ("output_tokens", self.output_tokens),
            ("cached_input_tokens", self.cached_input_tokens),
            ("cache_write_tokens", self.cache_write_tokens),
        ];
        for (field, n) in counts {
            if n.is_some_and(|n| !(0..=TOKENS_MAX).contains(&n)) {
                return Err(ApiError::BadRequest(format!("usage.{field} must be a count from 0 to {TOKENS_MAX}")));
            }
        }
        let within = self.cached_input_tokens.unwrap_or(0) + self.cache_write_tokens.unwrap_or(0);
        if self.input_tokens.is_some_and(|input| within > input) {
            return Err(ApiError::BadRequest(
                "usage.cached_input_tokens and usage.cache_write_tokens are part of usage.input_tokens".into(),
            ));
        }
        Ok(())
    }
}

#[derive(Serialize, ToSchema)]
pub struct ReportAnswer {
    pub request_id: String,
    /// The reported attempt as rota classified it.
    pub recorded: Recorded,
    /// After a failure: the next lease of the walk (a retry, the next profile or the next model).
    pub next: Option<Lease>,
}

/// What a report came to.
#[derive(Serialize, ToSchema)]
pub struct Recorded {
    pub outcome: ReportOutcome,
    /// The failure reason (docs/rotation.md), for a failure.
    #[schema(value_type = Option<String>)]
    pub reason: Option<Reason>,
}

/// A lease's `kind`: the attempt's kind by the name the `attempts` rows hold.
fn attempt_kind<S: Serializer>(kind: &Kind, to: S) -> Result<S::Ok, S::Error> {
    to.serialize_str(kind.as_str())
}

/// A lease's `api`: the wire format by its name in the config file.
fn wire_format<S: Serializer>(api: &WireFormat, to: S) -> Result<S::Ok, S::Error> {
    to.serialize_str(api.as_str())
}

fn rfc3339(ms: Millis) -> String {
    crate::status::time(ms)
}

/// Issues the lease for the walk's next attempt, or ends the walk.
async fn issue(
    runtime: &Runtime,
    leases: &Leases,
    agent: &str,
    settings: Arc<Settings>,
    mut walk: Walk,
    retry_in: Duration,
) -> Result<Lease, ApiError> {
    // The caps come before a profile is chosen: a refused lease marks nothing (`last_used`
    // moves only when a lease is issued).
    within_caps(leases, agent, settings.config.leases.max_live_per_agent, &mut walk)?;
    let att = loop {
        let att = match walk.next(&runtime.book, &settings.config, agent, runtime.clock.now(), |_, _| Ok(())) {
            Step::Try(att) => att,
            Step::Refuse(message) => {
                if walk.trail.seq > 0 {
                    walk.trail.finish(400, None, Spent::default());
                }
                return Err(ApiError::BadRequest(message));
            }
            Step::Exhausted(out) => {
                tracing::warn!(request_id = %walk.trail.request_id, status = out.status, "{}", out.message);
                // rota's own answer: never a 401 or a 403, which an agent reads as its rota key
                // refused (a single candidate's own status may be one).
                let status = if matches!(out.status, 401 | 403 | 407) { 502 } else { out.status };
                walk.trail.finish(status, None, Spent::default());
                let (message, retry_after) = (out.message, out.retry_after_secs);
                return Err(ApiError::AllModelsFailed { status, message, retry_after });
            }
        };
        match runtime.ready(&mut walk, &settings.config, att).await {
            Ok(att) => break att,
            Err((Verdict::Stop, message)) => {
                walk.trail.finish(502, None, Spent::default());
                return Err(ApiError::NotRetryable { status: 502, message, reason: None });
            }
            Err(_) => {}
        }
    };
    let now = runtime.clock.now();
    let provider = &settings.config.providers[&att.cand.provider];
    let row = walk.trail.row(att.kind, &att.cand, Some(&att.pid), now);
    let expires_at = now + settings.config.leases.ttl.as_millis() as Millis;
    let id = Uuid::new_v4();
    let (kind, secret) = leased_secret(&att.cred);
    let lease = Lease {
        lease_id: id.to_string(),
        expires_at: rfc3339(expires_at),
        request_id: walk.trail.request_id.clone(),
        attempt: row.seq,
        kind: att.kind,
        retry_in_ms: retry_in.as_millis() as u64,
        profile_id: att.pid.to_string(),
        provider: att.cand.provider.clone(),
        api: provider.api_for(&att.cand.model),
        base_url: match &provider.claude_base_url {
            Some(claude) if provider.claude_on_vertex(&att.cand.model) => claude.clone(),
            _ => provider.base_url.clone(),
        },
        model: att.cand.model.clone(),
        credential: LeasedCredential {
            kind,
            secret,
            header: match (kind, provider.key_header) {
                (ProfileType::ApiKey, KeyHeader::XApiKey) => "x-api-key",
                (ProfileType::ApiKey, KeyHeader::ApiKey) => "api-key",
                _ => "authorization",
            },
            expires_at: runtime.book.expires_at(&att.pid).map(rfc3339),
        },
    };
    let live = Live { agent: agent.to_string(), walk, settings, attempt: att, row, issued_at: now, expires_at };
    leases.lock().insert(id, live);
    Ok(lease)
}

/// Refuses a lease past the caps, the agent's (`leases.max_live_per_agent`) and then everyone's
/// (`MAX_LIVE`), and ends the walk's request with the refusal.
fn within_caps(leases: &Leases, agent: &str, cap: usize, walk: &mut Walk) -> Result<(), ApiError> {
    let (total, mine) = {
        let table = leases.lock();
        (table.live.len(), table.held.get(agent).copied().unwrap_or(0))
    };
    if mine >= cap {
        walk.trail.finish(429, None, Spent::default());
        return Err(ApiError::TooManyLeases {
            status: 429,
            message: format!(
                "agent {agent} holds {mine} outstanding leases, its limit (leases.max_live_per_agent = {cap}): report them first"
            ),
        });
    }
    if total >= MAX_LIVE {
        walk.trail.finish(503, None, Spent::default());
        return Err(ApiError::TooManyLeases {
            status: 503,
            message: format!("{MAX_LIVE} leases are outstanding: report them first"),
        });
    }
    Ok(())
}

/// The credential a lease hands out: its type and its secret (an OAuth profile's access token,
/// empty when it has none).
fn leased_secret(cred: &Credential) -> (ProfileType, String) {
    match cred {
        Credential::ApiKey(s) => (ProfileType::ApiKey, s.expose_secret().to_string()),
        Credential::Token(s) => (ProfileType::Token, s.expose_secret().to_string()),
        Credential::OAuth { access, .. } => {
            (ProfileType::OAuth, access.as_ref().map(|s| s.expose_secret().to_string()).unwrap_or_default())
        }
        Credential::Client { access, how, .. } => {
            (how.kind(), access.as_ref().map(|s| s.expose_secret().to_string()).unwrap_or_default())
        }
    }
}

/// Lease a credential
///
/// Picks the profile the gateway would use for this request and hands out its credential.
/// Report the call's outcome to `/api/v1/leases/{id}/report`.
#[utoipa::path(
    post,
    path = "/api/v1/leases",
    tag = "leases",
    request_body = LeaseRequest,
    responses(
        (status = 201, description = "A lease", body = Lease),
        (status = 400, description = "Bad input (unknown field, malformed profile id, bad pin)", body = super::ErrorBody),
        (status = 401, description = "Missing or invalid agent key", body = super::ErrorBody),
        (status = 404, description = "Unknown model", body = super::ErrorBody),
        (status = 429, description = "Every candidate is cooling (`Retry-After` says until when), the agent holds `leases.max_live_per_agent` leases (`too_many_leases`), or it is over one of its limits (`over_limit`, with `Retry-After`)", body = super::ErrorBody),
        (status = 502, description = "No candidate can be tried", body = super::ErrorBody),
    )
)]
async fn create(
    State(state): State<ApiState>,
    Caller(agent): Caller,
    RequestId(request_id): RequestId,
    Body(req): Body<LeaseRequest>,
) -> Result<(axum::http::StatusCode, Json<Lease>), ApiError> {
    crate::telemetry::agent(&agent.name);
    let runtime = &state.runtime;
    runtime.audit.admit().await; // as the gateway's requests: docs/audit.md
    let settings = runtime.settings();
    let parse =
        |raw: &str, what: &str| raw.parse::<ProfileId>().map_err(|e| ApiError::BadRequest(format!("{what}: {e}")));
    let pin = req.profile.as_deref().map(|p| parse(p, "profile")).transpose()?;
    let exclude = req.exclude.iter().map(|p| parse(p, "exclude")).collect::<Result<Vec<_>, _>>()?;
    let fallbacks = match req.fallbacks {
        None => FallbackOverride::Inherit,
        Some(list) if list.is_empty() => FallbackOverride::NoFallback,
        Some(list) => FallbackOverride::List(list),
    };
    let model = req.model.as_deref().map(|m| bounded(m).to_string());
    let trail = Trail::new(runtime, &settings, request_id, agent.name.clone(), ("lease", model, false));
    if let Err(why) = check_names(req.model.as_deref(), &fallbacks) {
        trail.refuse(400, &why);
        return Err(ApiError::BadRequest(why));
    }
    let chain = runtime.chain(&settings.config, &agent, req.model.as_deref(), fallbacks);
    let chain = chain.map_err(|e| {
        // Refused before any attempt, like the gateway's unknown model: a `requests` row with none.
        let e = match e {
            ChainError::NotAllowed { .. } => ApiError::ModelNotAllowed(e.to_string()),
            e => ApiError::UnknownModel { named: req.model.is_some(), message: e.to_string() },
        };
        trail.refuse(e.status_code().as_u16(), &e.to_string());
        e
    })?;
    let limits = settings.config.agent_limits(&agent);
    if let Err(over) = runtime.limits.admit(&agent.name, &limits, runtime.clock.now()).await {
        tracing::debug!(agent = %agent.name, "{}", over.message);
        trail.refuse(429, &over.message);
        return Err(ApiError::OverLimit { message: over.message, retry_after: over.retry_after });
    }
    let walk = Walk::new(chain, req.session, pin, trail).excluding(exclude).failover(settings.config.failover.enabled);
    runtime.recall_session(&walk).await;
    let lease = issue(runtime, &state.leases, &agent.name, settings, walk, Duration::ZERO).await?;
    Ok((axum::http::StatusCode::CREATED, Json(lease)))
}

/// Report a lease's outcome
///
/// Classifies a failure exactly as the gateway does, updates the profile's usage stats, writes
/// the audit rows and, after a failure, answers with the next lease (or the aggregated error
/// when every candidate has failed). A lease is reported once.
#[utoipa::path(
    post,
    path = "/api/v1/leases/{id}/report",
    tag = "leases",
    params(("id" = String, Path, description = "The lease id")),
    request_body = Report,
    responses(
        (status = 200, description = "Recorded; `next` holds the next lease after a failure", body = ReportAnswer),
        (status = 400, description = "Malformed lease id or report", body = super::ErrorBody),
        (status = 401, description = "Missing or invalid agent key", body = super::ErrorBody),
        (status = 403, description = "The lease belongs to another agent", body = super::ErrorBody),
        (status = 404, description = "No such lease", body = super::ErrorBody),
        (status = 409, description = "The lease was already reported", body = super::ErrorBody),
        (status = 410, description = "The lease expired before its report", body = super::ErrorBody),
        (status = 429, description = "Every candidate failed, all cooling (`Retry-After`), or the agent passed `leases.failure_reports_per_minute` or `leases.success_reports_per_minute` (`too_many_failure_reports`, `too_many_success_reports`; the lease stays valid)", body = super::ErrorBody),
        (status = 502, description = "Every candidate failed, or the failure does not fail over", body = super::ErrorBody),
    )
)]
async fn report(
    State(state): State<ApiState>,
    Caller(agent): Caller,
    Path(raw_id): Path<String>,
    Body(report): Body<Report>,
) -> Result<Json<ReportAnswer>, ApiError> {
    let id = Uuid::parse_str(&raw_id)
        .map_err(|_| ApiError::BadRequest(format!("`{raw_id}` is not a lease id (a UUID from POST /api/v1/leases)")))?;
    report.check()?;
    let runtime = &state.runtime;
    let now = runtime.clock.now();
    let live = take_reported(&state, &agent.name, id, report.outcome, now)?;
    let Live { agent: name, mut walk, settings, attempt, mut row, issued_at, .. } = live;
    row.duration_ms = Some(now - issued_at);
    let request_id = walk.trail.request_id.clone();
    let trusted = settings.config.agents.get(&name).is_some_and(|a| a.trusted);
    record_quota(&state, &name, &settings, &attempt, &report, trusted, now);
    if report.outcome == ReportOutcome::Success {
        let usage = report.usage.unwrap_or_default();
        let tokens = Tokens {
            input: usage.input_tokens,
            output: usage.output_tokens,
            cached: usage.cached_input_tokens,
            cache_write: usage.cache_write_tokens,
            cache_write_1h: None,
        };
        walk.succeeded(&runtime.book, &attempt, row, report.http_status.unwrap_or(200), tokens, now);
        let recorded = Recorded { outcome: ReportOutcome::Success, reason: None };
        return Ok(Json(ReportAnswer { request_id, recorded, next: None }));
    }
    let http_status = report.http_status;
    let mut class = classify_failure(&settings, &attempt, report, now);
    let mut marks = true;
    if !trusted {
        weigh_claim(runtime, &state.upstream, &settings, &attempt, &mut class).await;
        let cools = !matches!(class.reason.mark(), Mark::None | Mark::Model);
        if cools && let Err(why) = admit_claim(&state, &name, &settings, &attempt, Claim::Cool, now) {
            class.message = format!("{} ({why}: no cooldown)", class.message);
            marks = false;
        }
    }
    let failed = Failed { row, class: &mut class, status: http_status, may_retry: true, marks };
    let verdict = runtime.settle(&mut walk, &settings.config, attempt, failed).await;
    runtime.durable(&walk).await;
    let reason = class.reason;
    let recorded = Recorded { outcome: ReportOutcome::Failure, reason: Some(reason) };
    match verdict {
        Verdict::Stop => {
            let status = http_status.unwrap_or(502);
            walk.trail.finish(status, None, Spent::default());
            let why = if settings.config.failover.enabled {
                format!("{reason} does not fail over")
            } else {
                format!("{reason}, and failover is off (failover.enabled = false)")
            };
            let message = format!("{why}: {}", class.message);
            Err(ApiError::NotRetryable { status, message, reason: Some(reason.to_string()) })
        }
        verdict => {
            let wait = if let Verdict::Retry(backoff) = verdict { backoff } else { Duration::ZERO };
            let next = issue(runtime, &state.leases, &name, settings, walk, wait).await?;
            Ok(Json(ReportAnswer { request_id, recorded, next: Some(next) }))
        }
    }
}

/// Takes the lease `id` out of the table for its report: refused when it is unknown, another
/// agent's, already ended, or past the agent's report rate (the lease then stays valid). A lease
/// found past its expiry is expired here.
fn take_reported(
    state: &ApiState,
    agent: &str,
    id: Uuid,
    outcome: ReportOutcome,
    now: Millis,
) -> Result<Live, ApiError> {
    let mut table = state.leases.lock();
    let owner = table
        .live
        .get(&id)
        .map(|l| (l.agent.clone(), None))
        .or_else(|| table.ended.get(&id, now).map(|((a, e), _)| (a.clone(), Some(*e))));
    match owner {
        None => {
            return Err(ApiError::NotFound(format!("no lease {id}: it was never issued, or ended over a day ago")));
        }
        Some((owner, _)) if owner != agent => {
            return Err(ApiError::Forbidden(format!("lease {id} belongs to another agent")));
        }
        Some((_, Some(Ended::Reported))) => {
            return Err(ApiError::LeaseReported(format!("lease {id} was already reported")));
        }
        Some((_, Some(Ended::Expired))) => return Err(expired(id)),
        Some((_, None)) => {}
    }
    // Both kinds are rate-limited: a failure may cool a profile, a success's quota headers
    // may order it last.
    let success = outcome == ReportOutcome::Success;
    let leases = &state.runtime.settings().config.leases;
    let (limit, key, kind) = match success {
        true => (leases.success_reports_per_minute, "success_reports_per_minute", "success"),
        false => (leases.failure_reports_per_minute, "failure_reports_per_minute", "failure"),
    };
    if let Err(wait) = table.count_report(agent, success, limit, now) {
        return Err(ApiError::TooManyReports {
            success,
            message: format!(
                "agent {agent} made {limit} {kind} reports this minute, its limit (leases.{key}); the lease stays valid: report it again later"
            ),
            retry_after: wait,
        });
    }
    let live = table.remove(&id).expect("found above");
    if now >= live.expires_at {
        table.ended.insert(id, (live.agent.clone(), Ended::Expired), now);
        drop(table);
        expire_one(live, now, "the lease expired unreported");
        return Err(expired(id));
    }
    table.ended.insert(id, (live.agent.clone(), Ended::Reported), now);
    Ok(live)
}

/// Whether an untrusted agent's report may cool or order last the leased profile
/// (`Table::admit_claim`, under `leases.claim_share` and `leases.claim_window`).
fn admit_claim(
    state: &ApiState,
    agent: &str,
    settings: &Settings,
    attempt: &Attempt,
    claim: Claim,
    now: Millis,
) -> Result<(), String> {
    let leases = &settings.config.leases;
    let profiles = state.runtime.book.profile_count(attempt.pid.provider());
    let bounds = (profiles, leases.claim_share, leases.claim_window.as_millis() as Millis);
    state.leases.lock().admit_claim(agent, &attempt.pid, claim, bounds, now)
}

/// The remaining quota the provider's headers reported, after an answer the upstream served or
/// throttled (as for rota's own calls; not a missing model's). An agent's claim: its reset may
/// order the profile last for no longer than a claimed cooldown (`cooldown.max`), once per
/// `leases.claim_window`, and within the agent's share (`admit_claim`).
fn record_quota(
    state: &ApiState,
    agent: &str,
    settings: &Settings,
    attempt: &Attempt,
    report: &Report,
    trusted: bool,
    now: Millis,
) {
    let cooldown = &settings.config.cooldown;
    let max_wait = if trusted { cooldown.hint_max } else { cooldown.max }.as_millis() as Millis;
    let pairs = report.headers.iter().map(|(k, v)| (k.as_str(), v.as_str()));
    let served_or_throttled = report.outcome == ReportOutcome::Success || report.http_status == Some(429);
    let families = &settings.config.providers[&attempt.cand.provider].quota;
    let Some(quota) =
        crate::engine::quota::read(pairs, families, &attempt.cand.model, now, max_wait).filter(|_| served_or_throttled)
    else {
        return;
    };
    let pushes = quota.low_until(settings.config.rotation.floor(), now).is_some_and(|until| until > now);
    if !trusted
        && pushes
        && let Err(why) = admit_claim(state, agent, settings, attempt, Claim::Push, now)
    {
        tracing::info!(agent, profile = %attempt.pid, "a report's quota headers are not taken: {why}");
        return;
    }
    state.runtime.book.record_quota(&attempt.pid, quota);
}

/// A failure report classified as the gateway classifies its own answers, with the leased
/// secrets redacted from the agent's text and from the classification's message.
fn classify_failure(settings: &Settings, attempt: &Attempt, report: Report, now: Millis) -> Classified {
    let secrets = attempt.cred.secrets();
    let headers: Vec<(String, String)> = report.headers.into_iter().map(|(k, v)| (k.to_ascii_lowercase(), v)).collect();
    let text = redact(report.error.as_deref().unwrap_or(""), &secrets);
    let models = [attempt.cand.model.as_str()];
    let echoed = Echoed::strings(&models);
    let observed = match report.http_status {
        Some(status) => Observed { status: Some(status), headers: &headers, body: &text, transport: None, echoed },
        None => Observed {
            transport: Some(if text.is_empty() { "transport failure (no detail reported)" } else { &text }),
            headers: &headers,
            echoed,
            ..Default::default()
        },
    };
    let mut class = settings.classifier.classify(&observed, now);
    class.message = redact(&class.message, &secrets);
    class
}

/// An untrusted agent's report is a claim (docs/rotation.md "Evidence"): it may cool the profile on the
/// ladder, but it reaches the disabled lanes only when rota's own call with that credential
/// agrees — a revocation confirmed by a 401/403, an empty balance by a billing answer.
async fn weigh_claim(
    runtime: &Runtime,
    upstream: &Upstream,
    settings: &Settings,
    attempt: &Attempt,
    class: &mut Classified,
) {
    if matches!(class.reason, Reason::AuthPermanent | Reason::Billing) {
        let provider = &settings.config.providers[&attempt.cand.provider];
        let timeout = settings.config.timeouts.first_byte.min(Duration::from_secs(10));
        // An OAuth token is checked as it is now, refreshed first if it expired since the lease:
        // a 401 for an expired token proves nothing about the account.
        let cred = match &attempt.cred {
            Credential::OAuth { .. } | Credential::Client { .. } => {
                let now = runtime.book.tokens(&attempt.pid).map_or_else(|| attempt.cred.clone(), |t| t.0);
                match runtime.refresher.fresh(&settings.config, &attempt.pid, &now).await {
                    Ok(fresh) => fresh.unwrap_or(now),
                    Err(e) => {
                        class.message = format!(
                            "{} (an agent's claim; rota could not refresh the token to check it: {}; a cooldown, not the disabled lane)",
                            class.message, e.message
                        );
                        class.claim = true;
                        return;
                    }
                }
            }
            other => other.clone(),
        };
        let own = match upstream.confirm(provider, &cred, timeout).await {
            Ok((status, headers, body)) if !(200..300).contains(&status) => {
                let seen = Observed { status: Some(status), headers: &headers, body: &body, ..Default::default() };
                let own = settings.classifier.classify(&seen, runtime.clock.now());
                Some((status, own.reason))
            }
            Ok((status, ..)) => Some((status, Reason::Unknown)),
            Err(_) => None,
        };
        let agrees = match own {
            Some((_, Reason::Auth | Reason::AuthPermanent)) => class.reason == Reason::AuthPermanent,
            Some((_, Reason::Billing)) => class.reason == Reason::Billing,
            _ => false,
        };
        let said = own.map_or("no answer".to_string(), |(status, reason)| match reason {
            Reason::Unknown if (200..300).contains(&status) => format!("HTTP {status}"),
            reason => format!("HTTP {status}, {reason}"),
        });
        if agrees {
            class.message = format!("{} (confirmed by rota's own call: {said})", class.message);
            return;
        }
        class.message = format!(
            "{} (an agent's claim; rota's own call said {said}: a cooldown, not the disabled lane)",
            class.message
        );
    }
    class.claim = true;
}

fn expired(id: Uuid) -> ApiError {
    ApiError::LeaseExpired(format!("lease {id} expired before its report (leases.ttl); no stats changed — lease again"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The credential's type, the outcome and the reason go on the wire by their names (`as_str`).
    #[test]
    fn the_lease_apis_enums_are_written_by_their_names() {
        for kind in [ProfileType::OAuth, ProfileType::Token, ProfileType::ApiKey] {
            let credential = LeasedCredential { kind, secret: "s".into(), header: "authorization", expires_at: None };
            let want =
                format!(r#"{{"type":"{}","secret":"s","header":"authorization","expires_at":null}}"#, kind.as_str());
            assert_eq!(serde_json::to_string(&credential).unwrap(), want);
        }
        let success = Recorded { outcome: ReportOutcome::Success, reason: None };
        assert_eq!(serde_json::to_string(&success).unwrap(), r#"{"outcome":"success","reason":null}"#);
        for reason in Reason::ALL {
            let failure = Recorded { outcome: ReportOutcome::Failure, reason: Some(reason) };
            let want = format!(r#"{{"outcome":"failure","reason":"{}"}}"#, reason.as_str());
            assert_eq!(serde_json::to_string(&failure).unwrap(), want);
        }
    }
}
