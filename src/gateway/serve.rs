//! The two-stage failover of one request (the serve loop): for each model of the chain, the
//! provider's profiles in order (with same-profile retries), then the next model, until an
//! answer, a stop or the request's deadline. The walk decides, `call` makes each upstream
//! call, `relay` carries a committed stream; the walk's runtime holds what every request
//! shares.

use super::answer::{self, GatewayError, with_rota_headers};
use super::call::{Call, CallFailure, Called};
use super::plan::{Plan, Prepared};
use super::relay::{self, Committed};
use super::thinking;
use super::upstream::Upstream;
use super::wire::Api;
use crate::access::AgentCache;
use crate::agents::Agent;
use crate::engine::chain::{Candidate, FallbackOverride};
use crate::engine::{Millis, ProfileId, Reason};
use crate::settings::Settings;
use crate::store::{AttemptRow, Store};
use crate::walk::{Attempt, Failed, Runtime, STOPPING, Spent, Step, Trail, Verdict, Walk};
use axum::http::HeaderMap;
use axum::response::Response;
use bytes::Bytes;
use serde_json::Value;
use std::ops::ControlFlow;
use std::sync::Arc;
use tokio::time::Instant;
use tracing::Instrument;

/// The gateway's state: the runtime its walks share, the client that calls upstreams, the
/// agents it serves and the store that counts their use of their limits.
#[derive(Clone)]
pub struct Gateway {
    pub runtime: Arc<Runtime>,
    pub upstream: Upstream,
    pub agents: Arc<AgentCache>,
    pub store: Arc<dyn Store>,
    /// The memory large request bodies may take from their first byte until their request ends.
    pub bodies: Arc<super::bodies::Bodies>,
    /// Which provider signed the thinking blocks it relayed (`thinking`).
    pub signed: Arc<super::thinking::Origins>,
}

/// One client request, parsed.
pub struct Incoming {
    pub settings: Arc<Settings>,
    pub api: Api,
    pub agent: Agent,
    /// Shared with a committed stream's relay, which reads what the upstream says of it.
    pub body: Arc<serde_json::Map<String, Value>>,
    /// The body's share of `limits.bodies_in_flight_mb`, held as long as the body.
    pub body_share: Arc<super::bodies::Share>,
    pub stream: bool,
    pub session: Option<String>,
    pub pin: Option<ProfileId>,
    pub fallbacks: FallbackOverride,
    pub headers: HeaderMap,
    pub request_id: String,
}

/// A request as the gateway walks it, beside the walk itself (which a committed stream's relay
/// takes with it).
struct Serving<'a> {
    inc: &'a Incoming,
    /// Where `timeouts.total` ends the request.
    deadline: Instant,
    /// The call of the candidate under way, planned when the walk admitted it.
    planned: Option<Prepared>,
    /// A refused thinking signature is retried once, without thinking (`thinking`).
    thinking_retried: bool,
}

/// What an attempt's answer leads to: the request's answer, or the walk going on.
type Turn = ControlFlow<Result<Response, GatewayError>, Walk>;

/// Records the attempt in flight (and the request) as cancelled if the client goes away and
/// the request future is dropped mid-call.
struct InFlight {
    row: Option<AttemptRow>,
    trail: Trail,
    started: Instant,
}

impl InFlight {
    fn done(mut self) -> AttemptRow {
        self.row.take().expect("row is present until done or dropped")
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if let Some(mut row) = self.row.take() {
            row.duration_ms = Some(self.started.elapsed().as_millis() as Millis);
            row.reason = Some(Reason::Cancelled);
            row.error = Some("the client went away; the upstream call was aborted".into());
            self.trail.record(row);
            self.trail.finish(499, None, Spent::default());
        }
    }
}

/// rota's answer to a request cut by the shutdown (503, the client may try another instance),
/// its `requests` row written with it.
fn stopped(walk: &Walk) -> GatewayError {
    let message = format!("{STOPPING}: try again");
    walk.trail.refuse(503, &message);
    GatewayError::Failed { status: 503, message, retry_after: None, tried: walk.trail.passed() }
}

impl Gateway {
    /// Answers one request: the upstream's answer, or rota's error in the client's format.
    #[tracing::instrument(skip_all, fields(request_id = %inc.request_id, api = inc.api.as_str(), agent = %inc.agent.name))]
    pub async fn serve(&self, inc: Incoming) -> Response {
        let (api, request_id) = (inc.api, inc.request_id.clone());
        self.walk(inc).await.unwrap_or_else(|e| e.answer(api, &request_id))
    }

    async fn walk(&self, inc: Incoming) -> Result<Response, GatewayError> {
        // While the audit writer lags, requests wait for it here, so that a crash cannot lose
        // more than the last moment's rows (docs/audit.md).
        self.runtime.audit.admit().await;
        let deadline = Instant::now() + inc.settings.config.timeouts.total;
        let mut walk = self.walk_for(&inc)?;
        self.runtime.recall_session(&walk).await;
        let mut req = Serving { inc: &inc, deadline, planned: None, thinking_retried: false };
        loop {
            if Instant::now() >= deadline {
                return Err(self.timed_out(&inc, &walk));
            }
            if self.runtime.stopping.is_cancelled() {
                return Err(stopped(&walk));
            }
            let Some(att) = self.next_attempt(&mut req, &mut walk).await? else { continue };
            let row = walk.trail.row(att.kind, &att.cand, Some(&att.pid), self.runtime.now());
            // The fields are read only when the span is enabled (`info`): a disabled one costs no
            // formatting. Never a secret or a body in them (docs/gateway.md).
            let span = tracing::info_span!(
                "attempt",
                provider = att.cand.provider.as_str(),
                model = att.cand.model.as_str(),
                // As `/metrics` labels it: a profile named after an email is hashed.
                profile = %crate::metrics::profile_label(&att.pid),
                n = i64::from(row.seq),
                outcome = tracing::field::Empty,
                reason = tracing::field::Empty,
                ttfb_ms = tracing::field::Empty,
                status = tracing::field::Empty,
                otel.status_code = tracing::field::Empty,
            );
            // Boxed: the attempt's future is most of the request's, and inline it would be
            // copied whole wherever the request's future moves (docs/performance.md).
            walk = match Box::pin(self.attempt(&mut req, walk, att, row).instrument(span)).await {
                ControlFlow::Break(answer) => return answer,
                ControlFlow::Continue(walk) => walk,
            };
        }
    }

    /// The request's walk through its chain of candidates, or the refusal of a model no chain
    /// serves (audited).
    fn walk_for(&self, inc: &Incoming) -> Result<Walk, GatewayError> {
        let config = &inc.settings.config;
        let requested = inc.body.get("model").and_then(Value::as_str).map(str::to_string);
        let trail = self.trail(&inc.request_id, inc.api, &inc.agent, requested.clone(), inc.stream);
        let chain = match self.runtime.chain(config, &inc.agent, requested.as_deref(), inc.fallbacks.clone()) {
            Ok(chain) => chain,
            Err(e) => {
                let e = GatewayError::of_chain(e, requested.is_some());
                trail.refuse(e.status_code().as_u16(), &e.to_string());
                return Err(e);
            }
        };
        Ok(Walk::new(chain, inc.session.clone(), inc.pin.clone(), trail).failover(config.failover.enabled))
    }

    /// The walk's next attempt, its credential ready and the call of its candidate planned
    /// (`prepare`); `None` when a refresh of its credential failed and the walk goes on. The
    /// error ends the request: a pin that cannot serve it, every candidate failed, a refresh
    /// failure that does not fail over.
    async fn next_attempt(&self, req: &mut Serving<'_>, walk: &mut Walk) -> Result<Option<Attempt>, GatewayError> {
        let (inc, planned) = (req.inc, &mut req.planned);
        let config = &inc.settings.config;
        let admit = |index: usize, cand: &Candidate| {
            if planned.as_ref().is_none_or(|p| p.index != index) {
                *planned = Some(self.prepare(inc, index, cand)?);
            }
            Ok(())
        };
        let att = match walk.next(&self.runtime.book, config, &inc.agent.name, self.runtime.now(), admit) {
            Step::Try(att) => att,
            Step::Refuse(message) => {
                walk.trail.refuse(400, &message);
                return Err(GatewayError::BadRequest(message));
            }
            Step::Exhausted(out) => {
                self.runtime.durable(walk).await;
                tracing::warn!(status = out.status, "{}", out.message);
                walk.trail.finish(out.status, None, Spent::default());
                let (status, message, retry_after) = (out.status, out.message, out.retry_after_secs);
                return Err(GatewayError::Failed { status, message, retry_after, tried: walk.trail.passed() });
            }
        };
        match self.runtime.ready(walk, config, att).await {
            Ok(att) => Ok(Some(att)),
            Err((Verdict::Stop, message)) => {
                self.runtime.durable(walk).await;
                walk.trail.refuse(502, &message);
                Err(GatewayError::Failed { status: 502, message, retry_after: None, tried: walk.trail.passed() })
            }
            Err(_) => Ok(None),
        }
    }

    /// The call of candidate `index` planned: the request in its provider's wire format, with
    /// the thinking blocks another provider signed taken out (`thinking`). The error says why
    /// that format cannot carry the request.
    fn prepare(&self, inc: &Incoming, index: usize, cand: &Candidate) -> Result<Prepared, String> {
        let plan = Plan::choose(inc.api, inc.settings.config.providers[&cand.provider].api_for(&cand.model));
        let (mut body, mut dropped) = match plan.request(&inc.body)? {
            Some(t) => (Some(t.body), t.dropped),
            None => (None, Vec::new()),
        };
        if plan.upstream() == Api::Messages
            && let Some(verifiable) = self.signed.for_provider(body.as_ref().unwrap_or(&inc.body), &cand.provider)
        {
            body = Some(verifiable);
            dropped.push("thinking blocks signed elsewhere".into());
        }
        if !dropped.is_empty() {
            tracing::warn!(fields = %dropped.join(", "), "dropped fields with no counterpart in the {} format", plan.upstream().as_str());
        }
        Ok(Prepared { index, plan, body, dropped })
    }

    /// One attempt: its upstream call, and what the answer leads to (docs/gateway.md): the
    /// request's answer, or the walk going on.
    async fn attempt(&self, req: &mut Serving<'_>, mut walk: Walk, att: Attempt, row: AttemptRow) -> Turn {
        let Serving { inc, deadline, planned, thinking_retried } = req;
        let (inc, deadline) = (*inc, *deadline);
        let prepared = planned.as_mut().expect("next admitted the candidate");
        let (plan, body) = (prepared.plan, prepared.body.as_ref().unwrap_or(&*inc.body));
        let dropped = super::plan::dropped_header(&prepared.dropped);
        let guard = InFlight { row: Some(row), trail: walk.trail.clone(), started: Instant::now() };
        let call = tokio::select! {
            call = self.call(inc, &att, plan, body, deadline) => Some(call),
            _ = self.runtime.stopping.cancelled() => None,
        };
        let mut row = guard.done();
        let Some(Call { called, timing }) = call else {
            row.duration_ms = Some(self.runtime.now().saturating_sub(row.started_at).max(0));
            walk.stopped(row, STOPPING);
            self.runtime.durable(&walk).await;
            return ControlFlow::Break(Err(stopped(&walk)));
        };
        row.ttfb_ms = timing.ttfb_ms;
        row.duration_ms = Some(timing.sent.elapsed().as_millis() as Millis);
        let f = match called {
            Called::Stream(opened) => {
                self.runtime.durable(&walk).await;
                walk.log_fallback(&att.cand);
                let (cand, pid, trail) = (att.cand.clone(), att.pid.clone(), walk.trail.clone());
                let committed = Committed { walk, att, row, opened: *opened, sent: timing.sent };
                let resp = relay::respond(&self.runtime, inc.settings.clone(), inc.api, committed, deadline);
                return ControlFlow::Break(Ok(with_rota_headers(resp, &trail, &cand, &pid, dropped)));
            }
            Called::Served(resp, tokens) => {
                walk.succeeded(&self.runtime.book, &att, row, resp.status().as_u16(), tokens, self.runtime.now());
                self.runtime.durable(&walk).await;
                return ControlFlow::Break(Ok(with_rota_headers(resp, &walk.trail, &att.cand, &att.pid, dropped)));
            }
            Called::Failed(f) => *f,
        };
        if f.deadline {
            walk.abandoned(row, &f.class.message);
            self.runtime.durable(&walk).await;
            return ControlFlow::Break(Err(self.timed_out(inc, &walk)));
        }
        if !*thinking_retried
            && plan.upstream() == Api::Messages
            && thinking::refused_signature(f.status, f.body.as_deref().unwrap_or_default())
            && thinking::has_thinking(body)
        {
            *thinking_retried = true;
            walk.retry_same(att, row, &f.class, f.status, "thinking blocks taken out");
            let without = thinking::without_thinking(body).expect("the guard saw thinking");
            prepared.body = Some(without);
            prepared.dropped.push("thinking blocks".into());
            return ControlFlow::Continue(walk);
        }
        let CallFailure { mut class, status, body: said, .. } = f;
        let (cand, pid) = (att.cand.clone(), att.pid.clone());
        let failed = Failed { row, class: &mut class, status, may_retry: Instant::now() < deadline, marks: true };
        match self.runtime.settle(&mut walk, &inc.settings.config, att, failed).await {
            Verdict::Retry(backoff) => tokio::time::sleep_until(deadline.min(Instant::now() + backoff)).await,
            Verdict::Moved => {}
            Verdict::Stop => {
                let resp = self.upstream_stopped(inc, &walk, (status, said), class.message, plan).await;
                return ControlFlow::Break(Ok(with_rota_headers(resp, &walk.trail, &cand, &pid, dropped)));
            }
        }
        ControlFlow::Continue(walk)
    }

    /// The answer when the upstream's failure (its status and redacted body, rota's `message`)
    /// does not fail over: the upstream's own answer when the client speaks its format, else
    /// rota's error. Its `requests` row is written once the windows the walk opened are.
    async fn upstream_stopped(
        &self,
        inc: &Incoming,
        walk: &Walk,
        (status, body): (Option<u16>, Option<Bytes>),
        message: String,
        plan: Plan,
    ) -> Response {
        self.runtime.durable(walk).await;
        let code = status.unwrap_or(502);
        walk.trail.finish(code, None, Spent::default());
        match body {
            Some(body) if status.is_some() && !plan.translates() => answer::upstream_answer(code, body),
            _ => GatewayError::Failed { status: code, message, retry_after: None, tried: None }
                .answer(inc.api, &inc.request_id),
        }
    }

    /// The audit trail of one request, from its arrival.
    fn trail(&self, request_id: &str, api: Api, agent: &Agent, requested: Option<String>, stream: bool) -> Trail {
        Trail::new(
            &self.runtime,
            &self.runtime.settings(),
            request_id.to_string(),
            agent.name.clone(),
            (api.as_str(), requested, stream),
        )
    }

    /// Audits a request refused before its walk began (its body unreadable or malformed, a
    /// malformed pin), once its agent was authenticated: a `requests` row with no attempt,
    /// the status and message the client got. `requested` is the body's `model`, when read.
    pub fn refused(&self, api: Api, agent: &Agent, request_id: &str, requested: Option<String>, e: &GatewayError) {
        self.trail(request_id, api, agent, requested, false).refuse(e.status_code().as_u16(), &e.to_string());
    }

    /// The request's deadline (`timeouts.total`) passed: the walk stops where it is (docs/gateway.md).
    fn timed_out(&self, inc: &Incoming, walk: &Walk) -> GatewayError {
        let message = walk.timed_out(inc.settings.config.timeouts.total);
        tracing::warn!("{message}");
        walk.trail.refuse(504, &message);
        GatewayError::TimedOut(message)
    }
}
