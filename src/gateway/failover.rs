//! The two-stage failover of one request (the serve loop): for each model of the chain, the
//! provider's profiles in order (with same-profile retries), then the next model, until an
//! answer, a stop or the request's deadline. The walk decides, `call` makes each upstream
//! call, `relay` carries a committed stream; `Engine` holds what every request shares.

use super::answer::{self, refuse, with_rota_headers};
use super::call::{Call, Called};
use super::plan::{Plan, Prepared};
use super::relay;
use super::upstream::Upstream;
use super::walk::{Attempt, Step, Trail, Verdict, Walk};
use super::wire::Api;
use crate::agents::Agent;
use crate::audit::Audit;
use crate::book::{Book, Credential};
use crate::config::Config;
use crate::engine::chain::{Candidate, ChainRequest, FallbackOverride};
use crate::engine::classify::{Classified, Classifier};
use crate::engine::{Clock, Millis, ProfileId, Reason};
use crate::metrics::Metrics;
use crate::refresh::{Refresher, access_of};
use crate::store::AttemptRow;
use axum::http::HeaderMap;
use axum::response::Response;
use serde_json::Value;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// The configuration in force and what is derived from it. A request keeps the one it started
/// with, so a config reload never changes a request half-way.
pub struct Settings {
    pub config: Config,
    pub classifier: Classifier,
}

impl Settings {
    pub fn new(config: Config) -> Settings {
        let classifier = Classifier::with_overrides(config.classification.rules.clone());
        Settings { config, classifier }
    }
}

/// How long an answer waits for the window its failures opened to be written.
const DURABLE_WAIT: Duration = Duration::from_secs(2);

/// Everything a request needs, shared by all requests.
pub struct Engine {
    settings: std::sync::RwLock<Arc<Settings>>,
    pub book: Arc<Book>,
    pub upstream: Upstream,
    pub audit: Audit,
    pub metrics: Arc<Metrics>,
    pub clock: Arc<dyn Clock>,
    pub refresher: Arc<Refresher>,
    /// Cancelled when the shutdown grace (`server.shutdown_grace`) is over: open streams end
    /// with the in-band error.
    pub stopping: tokio_util::sync::CancellationToken,
}

/// One client request, parsed.
pub struct Incoming {
    pub settings: Arc<Settings>,
    pub api: Api,
    pub agent: Agent,
    pub body: serde_json::Map<String, Value>,
    pub stream: bool,
    pub session: Option<String>,
    pub pin: Option<ProfileId>,
    pub fallbacks: FallbackOverride,
    pub headers: HeaderMap,
    pub request_id: String,
}

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
            self.trail.finish(499, None, (None, None));
        }
    }
}

impl Engine {
    pub fn new(
        settings: Settings,
        book: Arc<Book>,
        upstream: Upstream,
        audit: Audit,
        clock: Arc<dyn Clock>,
        refresher: Arc<Refresher>,
    ) -> Engine {
        let metrics = Arc::new(Metrics::default());
        Engine {
            settings: std::sync::RwLock::new(Arc::new(settings)),
            book,
            upstream,
            audit,
            metrics,
            clock,
            refresher,
            stopping: tokio_util::sync::CancellationToken::new(),
        }
    }

    /// The attempt with a credential to call with: an OAuth token about to expire is refreshed
    /// first. A refresh that fails is the attempt's failure, recorded as such; the error holds
    /// what it led to and its message.
    pub async fn ready(
        &self,
        walk: &mut Walk,
        config: &Config,
        mut att: Attempt,
    ) -> Result<Attempt, (Verdict, String)> {
        match self.refresher.fresh(config, &att.pid, &att.cred).await {
            Ok(None) => Ok(att),
            Ok(Some(cred)) => {
                att.cred = cred;
                Ok(att)
            }
            Err(f) => {
                let now = self.now();
                let mut row = walk.trail.row(att.kind, &att.cand, Some(&att.pid), now);
                row.duration_ms = Some(0);
                let class =
                    Classified { reason: f.reason, hint: None, account_wide: true, message: f.message, claim: false };
                Err((walk.failed(&self.book, row, &class, None, false, now), class.message))
            }
        }
    }

    /// What a failed attempt leads to (SPEC §4), for the gateway and leases alike. An OAuth
    /// token the upstream refused (401) is refreshed first, and the same profile is then tried
    /// once more (`Retry` without backoff); a refresh token refused for good makes the failure
    /// `auth_permanent`. `class` ends as recorded.
    #[allow(clippy::too_many_arguments)]
    pub async fn settle(
        &self,
        walk: &mut Walk,
        config: &Config,
        att: &Attempt,
        row: AttemptRow,
        class: &mut Classified,
        status: Option<u16>,
        may_retry: bool,
    ) -> Verdict {
        if class.reason == Reason::Auth && matches!(att.cred, Credential::OAuth { .. }) && walk.first_try() {
            match self.refresher.refresh(config, &att.pid, access_of(&att.cred).as_deref()).await {
                Ok(_) => {
                    walk.retry_refreshed(row, class, status);
                    return Verdict::Retry(Duration::ZERO);
                }
                Err(r) if r.reason == Reason::AuthPermanent => (class.reason, class.message) = (r.reason, r.message),
                Err(_) => {}
            }
        }
        let verdict = walk.failed(&self.book, row, class, status, may_retry, self.now());
        if verdict == Verdict::Stop && class.reason == Reason::ContextOverflow {
            match config.context_chain(&att.cand, fastrand::u64(..)) {
                Ok(larger) => {
                    if walk.overflow_to(larger) {
                        return Verdict::Moved;
                    }
                }
                Err(e) => tracing::warn!("models.context_fallbacks.\"{}\": {e}", att.cand.label()),
            }
        }
        verdict
    }

    /// The settings in force now.
    pub fn settings(&self) -> Arc<Settings> {
        self.settings.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Puts new settings in force for the requests that start from now on.
    pub fn replace_settings(&self, settings: Settings) {
        self.book.set_config(&settings.config);
        *self.settings.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(settings);
    }

    pub(super) fn now(&self) -> Millis {
        self.clock.now()
    }

    pub async fn serve(self: Arc<Self>, inc: Incoming) -> Response {
        let config = &inc.settings.config;
        let deadline = Instant::now() + config.timeouts.total;
        let requested = inc.body.get("model").and_then(Value::as_str).map(str::to_string);
        let chain = match self.chain(config, &inc.agent.name, requested.as_deref(), inc.fallbacks.clone()) {
            Ok(c) => c,
            Err(e) => {
                let status = if requested.is_some() { 404 } else { 400 };
                return refuse(inc.api, status, &e.to_string(), &inc.request_id);
            }
        };
        let trail = Trail::new(
            self.audit.clone(),
            self.metrics.clone(),
            inc.request_id.clone(),
            inc.agent.name.clone(),
            inc.api.as_str(),
            requested,
            inc.stream,
            self.now(),
        );
        let mut walk = Walk::new(chain, inc.session.clone(), inc.pin.clone(), trail).failover(config.failover.enabled);
        let mut planned: Option<Prepared> = None;
        loop {
            if Instant::now() >= deadline {
                return self.timed_out(&inc, &walk);
            }
            let admit = |index: usize, cand: &Candidate| {
                if planned.as_ref().is_none_or(|p| p.index != index) {
                    let plan = Plan::choose(inc.api, config.providers[&cand.provider].api)?;
                    let translated = plan.request(&inc.body)?;
                    if let Some(t) = translated.as_ref().filter(|t| !t.dropped.is_empty()) {
                        tracing::warn!(request_id = %inc.request_id, fields = %t.dropped.join(", "), "dropped fields with no counterpart in the {} format", plan.upstream().as_str());
                    }
                    planned = Some(Prepared { index, plan, body: translated.map(|t| t.body) });
                }
                Ok(())
            };
            let att = match walk.next(&self.book, config, &inc.agent.name, self.now(), admit) {
                Step::Try(att) => att,
                Step::Refuse(message) => return refuse(inc.api, 400, &message, &inc.request_id),
                Step::Exhausted(out) => {
                    self.durable(&walk).await;
                    tracing::warn!(request_id = %inc.request_id, status = out.status, "{}", out.message);
                    walk.trail.finish(out.status, None, (None, None));
                    return answer::error(inc.api, out.status, &out.message, out.retry_after_secs, &inc.request_id);
                }
            };
            let prepared = planned.as_ref().expect("next admitted the candidate");
            let (plan, body) = (prepared.plan, prepared.body.as_ref().unwrap_or(&inc.body));
            let att = match self.ready(&mut walk, config, att).await {
                Ok(att) => att,
                Err((Verdict::Stop, message)) => {
                    self.durable(&walk).await;
                    walk.trail.finish(502, None, (None, None));
                    return answer::error(inc.api, 502, &message, None, &inc.request_id);
                }
                Err(_) => continue,
            };
            let (cand, pid) = (&att.cand, &att.pid);
            let started_at = self.now();
            let row = walk.trail.row(att.kind, cand, Some(pid), started_at);
            let guard = InFlight { row: Some(row), trail: walk.trail.clone(), started: Instant::now() };
            let Call { called, sent, ttfb_ms } = self.call(&inc, &att, plan, body, deadline).await;
            let mut row = guard.done();
            row.ttfb_ms = ttfb_ms;
            row.duration_ms = Some(sent.elapsed().as_millis() as Millis);
            match called {
                Called::Stream(opened) => {
                    self.durable(&walk).await;
                    walk.log_fallback(cand);
                    let (cand, pid) = (cand.clone(), pid.clone());
                    let trail = walk.trail.clone();
                    let timing = (sent, ttfb_ms);
                    let settings = inc.settings.clone();
                    let resp = relay::respond(&self, settings, inc.api, walk, row, *opened, att.cred, timing, deadline);
                    return with_rota_headers(resp, &trail, &cand, &pid);
                }
                Called::Served(resp, tokens) => {
                    walk.succeeded(&self.book, row, resp.status().as_u16(), tokens, self.now());
                    self.durable(&walk).await;
                    return with_rota_headers(resp, &walk.trail, cand, pid);
                }
                Called::Failed(f) if f.deadline => {
                    walk.abandoned(row, &f.class.message);
                    self.durable(&walk).await;
                    return self.timed_out(&inc, &walk);
                }
                Called::Failed(f) => {
                    let mut class = f.class.clone();
                    let may_retry = Instant::now() < deadline;
                    match self.settle(&mut walk, config, &att, row, &mut class, f.status, may_retry).await {
                        Verdict::Retry(backoff) => {
                            tokio::time::sleep_until(deadline.min(Instant::now() + backoff)).await
                        }
                        Verdict::Moved => {}
                        Verdict::Stop => {
                            self.durable(&walk).await;
                            let status = f.status.unwrap_or(502);
                            walk.trail.finish(status, None, (None, None));
                            let resp = match f.body {
                                Some(body) if f.status.is_some() && !plan.translates() => {
                                    answer::upstream_error(status, body)
                                }
                                _ => answer::error(inc.api, status, &class.message, None, &inc.request_id),
                            };
                            return with_rota_headers(resp, &walk.trail, cand, pid);
                        }
                    }
                }
            }
        }
    }

    /// A window this request's failures opened is written before the client hears the answer
    /// (all requests waiting share the writer's transactions), so a restart right after cannot
    /// forget what rota acted on. While the database fails, the answer waits `DURABLE_WAIT` at
    /// most: requests are served, and `/healthz` says the writer fails.
    pub async fn durable(&self, walk: &Walk) {
        if walk.marked() && !self.book.durable(DURABLE_WAIT).await {
            tracing::warn!(request_id = %walk.trail.request_id, "answering before the cooldown it caused is written: the database does not take writes");
        }
    }

    /// The request's deadline (`timeouts.total`) passed: the walk stops where it is (SPEC §6).
    fn timed_out(&self, inc: &Incoming, walk: &Walk) -> Response {
        let message = walk.timed_out(inc.settings.config.timeouts.total);
        tracing::warn!(request_id = %inc.request_id, "{message}");
        walk.trail.finish(504, None, (None, None));
        answer::error(inc.api, 504, &message, None, &inc.request_id)
    }

    /// The candidates a request for `model` by `agent` walks through.
    pub fn chain(
        &self,
        config: &Config,
        agent: &str,
        model: Option<&str>,
        fallback_override: FallbackOverride,
    ) -> Result<Vec<Candidate>, crate::engine::chain::ChainError> {
        config.chain(&ChainRequest {
            model,
            agent_fallbacks: config.agents.get(agent).and_then(|a| a.fallbacks.as_deref()),
            fallback_override,
            roll: fastrand::u64(..),
            failover: config.failover.enabled,
        })
    }
}
