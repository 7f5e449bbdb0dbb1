//! The two-stage failover of one request: for each model of the chain, the provider's profiles
//! in order (with same-profile retries), then the next model; every call and skip audited.

use super::sse::{Event, Splitter};
use super::upstream::Upstream;
use super::walk::{Attempt, Step, Trail, Verdict, Walk};
use super::wire::{self, Api, Seen};
use crate::agents::Agent;
use crate::audit::{AttemptRow, Audit, Outcome};
use crate::book::{Book, Credential};
use crate::config::Config;
use crate::engine::chain::{Candidate, ChainRequest, FallbackOverride};
use crate::engine::classify::{Classified, Classifier, Observed};
use crate::engine::{Clock, Failure, Millis, ProfileId, Reason};
use crate::metrics::Metrics;
use crate::redact::{redact, truncate};
use crate::refresh::{Refresher, access_of};
use crate::status::until_ms;
use crate::translate::{self, StreamTranslator};
use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures_util::StreamExt;
use secrecy::ExposeSecret;
use serde_json::Value;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::{Instant, timeout_at};

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

/// Everything a request needs, shared by all requests.
pub struct Engine {
    settings: std::sync::RwLock<Arc<Settings>>,
    pub book: Arc<Book>,
    pub upstream: Upstream,
    pub audit: Audit,
    pub metrics: Arc<Metrics>,
    pub clock: Arc<dyn Clock>,
    pub refresher: Arc<Refresher>,
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

/// What one upstream call came to.
enum Called {
    Served(Response, (Option<i64>, Option<i64>)),
    /// A stream whose first content event arrived: ready to commit.
    Stream(Box<OpenStream>),
    Failed(Box<CallFailure>),
}

/// A stream read up to its first content event.
struct OpenStream {
    /// Everything up to and including the first content event.
    held: Vec<Event>,
    /// Holds the start of the next event, if a chunk ended inside it.
    split: Splitter,
    rest: futures_util::stream::BoxStream<'static, reqwest::Result<Bytes>>,
    tokens: (Option<i64>, Option<i64>),
    ttfb_ms: Millis,
}

/// How one candidate is called: the API its provider speaks and the body it gets.
struct Plan {
    upstream_api: Api,
    body: serde_json::Map<String, Value>,
}

impl Plan {
    /// Whether the upstream's answers must be translated back to the client's format.
    fn translates(&self, client: Api) -> bool {
        self.upstream_api != client
    }
}

/// The call plan for a candidate, translating the request when the formats differ.
fn plan(inc: &Incoming, provider_api: crate::config::Api) -> Result<Plan, String> {
    use crate::config::Api as Wire;
    let (upstream_api, translated) = match (inc.api, provider_api) {
        (api, wire) if api.wire() == wire => (api, None),
        (Api::Chat, Wire::Anthropic) => (Api::Messages, Some(translate::chat_to_messages(&inc.body))),
        (Api::Messages, Wire::Openai) => (Api::Chat, Some(translate::messages_to_chat(&inc.body))),
        (api, _) => return Err(format!("the {} API is served only by OpenAI-format providers", api.as_str())),
    };
    match translated {
        None => Ok(Plan { upstream_api, body: inc.body.clone() }),
        Some(Ok(t)) => {
            if !t.dropped.is_empty() {
                tracing::warn!(request_id = %inc.request_id, fields = %t.dropped.join(", "), "dropped fields with no counterpart in the {} format", upstream_api.as_str());
            }
            Ok(Plan { upstream_api, body: t.body })
        }
        Some(Err(e)) => Err(e.to_string()),
    }
}

struct CallFailure {
    class: Classified,
    status: Option<u16>,
    /// The upstream's answer, redacted: returned as is when the reason stops the request.
    body: Option<Bytes>,
}

/// The secrets an upstream could echo back: the ones rota sent it.
pub(crate) fn secrets_of(cred: &Credential) -> Vec<&str> {
    let mut v = Vec::new();
    match cred {
        Credential::ApiKey(s) | Credential::Token(s) => v.push(s.expose_secret()),
        Credential::OAuth { access, refresh } => {
            v.extend(access.iter().map(|s| s.expose_secret()));
            v.extend(refresh.iter().map(|s| s.expose_secret()));
        }
    }
    v
}

fn json_response(api: Api, status: u16, message: &str, retry_after: Option<u64>, request_id: &str) -> Response {
    let code = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY);
    let mut resp = (code, axum::Json(api.error_body(status, message))).into_response();
    let h = resp.headers_mut();
    h.insert("x-request-id", HeaderValue::from_str(request_id).expect("uuid is a valid header"));
    if let Some(secs) = retry_after {
        h.insert("retry-after", HeaderValue::from(secs));
    }
    resp
}

/// An error answered before any upstream call (bad input, unknown model, bad pin).
pub fn refuse(api: Api, status: u16, message: &str, request_id: &str) -> Response {
    json_response(api, status, message, None, request_id)
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
                let class = Classified { reason: f.reason, hint: None, account_wide: true, message: f.message };
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
        walk.failed(&self.book, row, class, status, may_retry, self.now())
    }

    /// The settings in force now.
    pub fn settings(&self) -> Arc<Settings> {
        self.settings.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Puts new settings in force for the requests that start from now on.
    pub fn replace_settings(&self, settings: Settings) {
        self.book.set_policy(settings.config.cooldown_policy());
        *self.settings.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(settings);
    }

    fn now(&self) -> Millis {
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
        let mut walk = Walk::new(chain, inc.session.clone(), inc.pin.clone(), trail);
        // The call plan of the candidate under way (translation happens once per candidate).
        let mut planned: Option<(usize, Plan)> = None;
        loop {
            let admit = |index: usize, cand: &Candidate| {
                if planned.as_ref().is_none_or(|(i, _)| *i != index) {
                    planned = Some((index, plan(&inc, config.providers[&cand.provider].api)?));
                }
                Ok(())
            };
            let att = match walk.next(&self.book, config, &inc.agent.name, self.now(), admit) {
                Step::Try(att) => att,
                Step::Refuse(message) => return refuse(inc.api, 400, &message, &inc.request_id),
                Step::Exhausted(out) => {
                    tracing::warn!(request_id = %inc.request_id, status = out.status, "{}", out.message);
                    walk.trail.finish(out.status, None, (None, None));
                    return json_response(inc.api, out.status, &out.message, out.retry_after_secs, &inc.request_id);
                }
            };
            let plan = &planned.as_ref().expect("next admitted the candidate").1;
            let att = match self.ready(&mut walk, config, att).await {
                Ok(att) => att,
                Err((Verdict::Stop, message)) => {
                    walk.trail.finish(502, None, (None, None));
                    return json_response(inc.api, 502, &message, None, &inc.request_id);
                }
                Err(_) => continue,
            };
            let (cand, pid, cred) = (&att.cand, &att.pid, &att.cred);
            let started_at = self.now();
            self.book.mark_used(pid, inc.session.as_deref(), started_at);
            let row = walk.trail.row(att.kind, cand, Some(pid), started_at);
            let guard = InFlight { row: Some(row), trail: walk.trail.clone(), started: Instant::now() };
            let called = self.call(&inc, cand, cred, plan, deadline).await;
            let mut row = guard.done();
            row.duration_ms = Some(self.now() - started_at);
            match called {
                Called::Stream(open) => {
                    let translator = match (inc.api, plan.upstream_api) {
                        (Api::Chat, Api::Messages) => {
                            let usage = inc.body.get("stream_options").and_then(|o| o.get("include_usage"))
                                == Some(&Value::Bool(true));
                            Some(StreamTranslator::anthropic_to_chat(usage))
                        }
                        (Api::Messages, Api::Chat) => Some(StreamTranslator::chat_to_anthropic()),
                        _ => None,
                    };
                    walk.log_fallback(cand);
                    let resp = self.commit_stream(
                        &inc.settings,
                        inc.api,
                        cand,
                        pid,
                        cred,
                        row,
                        walk.trail.clone(),
                        *open,
                        translator,
                        deadline,
                    );
                    return with_rota_headers(resp, &walk.trail, cand, pid);
                }
                Called::Served(resp, tokens) => {
                    walk.succeeded(&self.book, row, resp.status().as_u16(), tokens, self.now());
                    return with_rota_headers(resp, &walk.trail, cand, pid);
                }
                Called::Failed(f) => {
                    let mut class = f.class.clone();
                    let may_retry = Instant::now() < deadline;
                    match self.settle(&mut walk, config, &att, row, &mut class, f.status, may_retry).await {
                        Verdict::Retry(backoff) => tokio::time::sleep(backoff).await,
                        Verdict::Moved => {}
                        Verdict::Stop => {
                            let status = f.status.unwrap_or(502);
                            walk.trail.finish(status, None, (None, None));
                            let resp = match f.body {
                                Some(body) if f.status.is_some() && !plan.translates(inc.api) => {
                                    let code = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY);
                                    (code, [("content-type", "application/json")], body).into_response()
                                }
                                _ => json_response(inc.api, status, &f.class.message, None, &inc.request_id),
                            };
                            return with_rota_headers(resp, &walk.trail, cand, pid);
                        }
                    }
                }
            }
        }
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

    /// One upstream call, up to a committed response or a classified failure.
    async fn call(
        &self,
        inc: &Incoming,
        cand: &Candidate,
        cred: &Credential,
        plan: &Plan,
        deadline: Instant,
    ) -> Called {
        let settings = &inc.settings;
        let provider = &settings.config.providers[&cand.provider];
        let mut body = plan.body.clone();
        body.insert("model".into(), Value::String(cand.model.clone()));
        let bytes = Bytes::from(serde_json::to_vec(&body).expect("a JSON map serializes"));
        let first_byte = deadline.min(Instant::now() + settings.config.timeouts.first_byte);
        let secrets = secrets_of(cred);
        let fail = |class: Classified, status: Option<u16>, body: Option<Bytes>| {
            let mut class = class;
            class.message = redact(&class.message, &secrets);
            Called::Failed(Box::new(CallFailure { class, status, body }))
        };
        let now = self.now();
        let sent = timeout_at(
            first_byte,
            self.upstream.send(provider, plan.upstream_api, cred, bytes, &inc.headers, inc.stream),
        )
        .await;
        let resp = match sent {
            Err(_) => {
                return fail(Self::transport(settings, "timed out waiting for the upstream's answer", now), None, None);
            }
            Ok(Err(text)) => return fail(Self::transport(settings, &text, now), None, None),
            Ok(Ok(r)) => r,
        };
        let status = resp.status().as_u16();
        let headers: Vec<(String, String)> = resp
            .headers()
            .iter()
            .map(|(k, v)| (k.as_str().to_string(), v.to_str().unwrap_or("").to_string()))
            .collect();
        let content_type = resp.headers().get("content-type").cloned();
        if !(200..300).contains(&status) || !inc.stream {
            let body = match timeout_at(first_byte, resp.bytes()).await {
                Ok(Ok(b)) => b,
                Ok(Err(e)) => {
                    return fail(Self::transport(settings, &super::upstream::error_text(&e), now), None, None);
                }
                Err(_) => {
                    return fail(Self::transport(settings, "timed out reading the upstream's answer", now), None, None);
                }
            };
            let text = String::from_utf8_lossy(&body);
            let json: Option<Value> = serde_json::from_str(&text).ok();
            if let Some(json) = json.filter(|j| (200..300).contains(&status) && j.is_object()) {
                let tokens = wire::usage(&json);
                let body = match (inc.api, plan.upstream_api) {
                    (Api::Chat, Api::Messages) => Bytes::from(translate::messages_response_to_chat(&json).to_string()),
                    (Api::Messages, Api::Chat) => Bytes::from(translate::chat_response_to_messages(&json).to_string()),
                    _ => body,
                };
                let mut resp = Response::new(Body::from(body));
                *resp.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::OK);
                let ct = if plan.translates(inc.api) {
                    Some(HeaderValue::from_static("application/json"))
                } else {
                    content_type
                };
                if let Some(ct) = ct {
                    resp.headers_mut().insert("content-type", ct);
                }
                return Called::Served(resp, tokens);
            }
            let class = settings
                .classifier
                .classify(&Observed { status: Some(status), headers: &headers, body: &text, transport: None }, now);
            let redacted = Bytes::from(redact(&text, &secrets));
            return fail(class, Some(status), Some(redacted));
        }
        self.open_stream(settings, cand, resp, status, first_byte, &secrets).await
    }

    fn transport(settings: &Settings, text: &str, now: Millis) -> Classified {
        settings.classifier.classify(&Observed { transport: Some(text), ..Default::default() }, now)
    }

    /// Reads a 2xx stream until its first content event; then commits the response and hands
    /// the rest to a forwarder task.
    async fn open_stream(
        &self,
        settings: &Settings,
        cand: &Candidate,
        resp: reqwest::Response,
        status: u16,
        first_byte: Instant,
        secrets: &[&str],
    ) -> Called {
        let wire_format = settings.config.providers[&cand.provider].api;
        let mut upstream = resp.bytes_stream().boxed();
        let mut split = Splitter::default();
        let mut held: Vec<Event> = Vec::new();
        let mut tokens = (None, None);
        let now = self.now();
        let fail = |msg: String, body: Option<&str>| {
            let class = match body {
                Some(b) => settings
                    .classifier
                    .classify(&Observed { status: Some(status), headers: &[], body: b, transport: None }, now),
                None => Self::transport(settings, &msg, now),
            };
            let mut class = class;
            class.message = redact(if body.is_some() { &class.message } else { &msg }, secrets);
            Called::Failed(Box::new(CallFailure { class, status: None, body: None }))
        };
        let ttfb = Instant::now();
        loop {
            let chunk = match timeout_at(first_byte, upstream.next()).await {
                Err(_) => return fail("timed out waiting for the first event of the stream".into(), None),
                Ok(None) => return fail("the stream ended before any content (empty reply)".into(), Some("")),
                Ok(Some(Err(e))) => return fail(super::upstream::error_text(&e), None),
                Ok(Some(Ok(c))) => c,
            };
            for ev in split.push(&chunk) {
                if let Some(v) = ev.json() {
                    merge_usage(&mut tokens, wire::usage(&v));
                }
                let seen = wire::classify_event(wire_format, &ev);
                match seen {
                    Seen::Other => held.push(ev),
                    Seen::Error => return fail(String::new(), Some(&ev.data)),
                    Seen::End => return fail("the stream ended before any content (empty reply)".into(), Some("")),
                    Seen::Content => {
                        held.push(ev);
                        let ttfb_ms = ttfb.elapsed().as_millis() as Millis;
                        return Called::Stream(Box::new(OpenStream { held, split, rest: upstream, tokens, ttfb_ms }));
                    }
                }
            }
        }
    }

    /// Sends the held bytes and forwards the rest of the stream from a task, which records the
    /// attempt and the request when the stream ends (or fails, or the client leaves).
    #[allow(clippy::too_many_arguments)]
    fn commit_stream(
        &self,
        settings: &Arc<Settings>,
        api: Api,
        cand: &Candidate,
        pid: &ProfileId,
        cred: &Credential,
        mut row: AttemptRow,
        mut trail: Trail,
        open: OpenStream,
        mut translator: Option<StreamTranslator>,
        deadline: Instant,
    ) -> Response {
        let OpenStream { held, mut split, rest: mut upstream, mut tokens, ttfb_ms } = open;
        // What the client gets first: the held events as received (or translated), and the
        // start of the next event when passing bytes through.
        let first: Vec<u8> = match translator.as_mut() {
            Some(t) => held.iter().flat_map(|ev| t.push(ev)).collect(),
            None => held.iter().flat_map(|ev| ev.raw.iter().copied()).chain(split.rest().iter().copied()).collect(),
        };
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(16);
        let book = self.book.clone();
        let clock = self.clock.clone();
        let idle = settings.config.timeouts.idle;
        let total = settings.config.timeouts.total;
        let settings = settings.clone();
        let (cand, pid, cred) = (cand.clone(), pid.clone(), cred.clone());
        let started_at = row.started_at;
        book.record_success(&pid, clock.now());
        let wire_format = settings.config.providers[&cand.provider].api;
        row.ttfb_ms = Some(ttfb_ms);
        row.http_status = Some(200);
        let began = Instant::now();
        tokio::spawn(async move {
            let secrets = secrets_of(&cred);
            let mut outcome: Result<(), (Reason, String)> = Ok(());
            // The upstream's own error event reaches the client as is; rota adds one only when
            // the stream broke without saying so.
            let mut upstream_said_error = false;
            if tx.send(Ok(Bytes::from(first))).await.is_err() {
                outcome = Err((Reason::Cancelled, "the client went away".into()));
            }
            let mut idle_deadline = Instant::now() + idle;
            while outcome.is_ok() {
                let next = tokio::select! {
                    _ = tx.closed() => {
                        outcome = Err((Reason::Cancelled, "the client went away; the upstream stream was aborted".into()));
                        break;
                    }
                    next = timeout_at(idle_deadline.min(deadline), upstream.next()) => next,
                };
                let chunk = match next {
                    Err(_) if Instant::now() >= deadline => {
                        outcome = Err((
                            Reason::Timeout,
                            format!("the request passed its {}s limit (timeouts.total)", total.as_secs()),
                        ));
                        break;
                    }
                    Err(_) => {
                        outcome = Err((Reason::Timeout, format!("the stream was idle for {}s", idle.as_secs())));
                        break;
                    }
                    Ok(None) => break,
                    Ok(Some(Err(e))) => {
                        outcome = Err((Reason::Network, redact(&super::upstream::error_text(&e), &secrets)));
                        break;
                    }
                    Ok(Some(Ok(c))) => c,
                };
                let events = split.push(&chunk);
                for ev in &events {
                    if !ev.is_keepalive() {
                        idle_deadline = Instant::now() + idle;
                    }
                    if let Some(v) = ev.json() {
                        merge_usage(&mut tokens, wire::usage(&v));
                    }
                    if wire::classify_event(wire_format, ev) == Seen::Error {
                        let seen = Observed { status: Some(200), headers: &[], body: &ev.data, transport: None };
                        let class = settings.classifier.classify(&seen, clock.now());
                        outcome = Err((class.reason, redact(&class.message, &secrets)));
                        upstream_said_error = true;
                    }
                }
                let out = match translator.as_mut() {
                    Some(t) => Bytes::from(events.iter().flat_map(|ev| t.push(ev)).collect::<Vec<u8>>()),
                    None => chunk,
                };
                if !out.is_empty() && tx.send(Ok(out)).await.is_err() {
                    outcome = Err((Reason::Cancelled, "the client went away".into()));
                }
            }
            if let (Ok(()), Some(t)) = (&outcome, translator.as_mut()) {
                let _ = tx.send(Ok(Bytes::from(t.finish()))).await;
            }
            row.duration_ms = Some(began.elapsed().as_millis() as Millis);
            (row.tokens_in, row.tokens_out) = tokens;
            match outcome {
                Ok(()) => row.outcome = Outcome::Success,
                Err((reason, msg)) => {
                    row.reason = Some(reason);
                    row.error = Some(truncate(&msg, 500));
                    if reason != Reason::Cancelled {
                        if !upstream_said_error {
                            let _ = tx
                                .send(Ok(Bytes::from(api.error_event(&format!("upstream stream failed: {msg}")))))
                                .await;
                        }
                        let now = clock.now();
                        let failure = Failure {
                            reason,
                            model: cand.model.clone(),
                            hint_ms: None,
                            account_wide: false,
                            started_at,
                        };
                        row.cooldown_until = book.record_failure(&pid, &failure, now).and_then(until_ms);
                    }
                }
            }
            trail.record(row);
            trail.finish(200, Some((&cand, &pid)), tokens);
        });
        let stream = tokio_stream_from(rx);
        let mut resp = Response::new(Body::from_stream(stream));
        let h = resp.headers_mut();
        h.insert("content-type", HeaderValue::from_static("text/event-stream"));
        h.insert("cache-control", HeaderValue::from_static("no-cache"));
        resp
    }
}

fn tokio_stream_from(
    mut rx: tokio::sync::mpsc::Receiver<Result<Bytes, std::io::Error>>,
) -> impl futures_util::Stream<Item = Result<Bytes, std::io::Error>> {
    futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

fn merge_usage(acc: &mut (Option<i64>, Option<i64>), new: (Option<i64>, Option<i64>)) {
    acc.0 = new.0.or(acc.0);
    acc.1 = new.1.or(acc.1);
}

fn with_rota_headers(mut resp: Response, trail: &Trail, cand: &Candidate, pid: &ProfileId) -> Response {
    let h = resp.headers_mut();
    let set = |h: &mut HeaderMap, k: &'static str, v: &str| {
        if let Ok(v) = HeaderValue::from_str(v) {
            h.insert(k, v);
        }
    };
    set(h, "x-request-id", &trail.request_id);
    set(h, "x-rota-provider", &cand.provider);
    set(h, "x-rota-model", &cand.model);
    set(h, "x-rota-profile", pid.as_str());
    set(h, "x-rota-attempts", &trail.seq.to_string());
    resp
}
