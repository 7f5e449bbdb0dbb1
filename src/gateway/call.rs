//! One upstream call: the request sent, its answer read up to a buffered response, a committed
//! stream or a classified failure, with the attempt's timings measured from the moment the
//! request was sent.

use super::plan::{Plan, WithModel};
use super::relay::{Phase, Relay};
use super::serve::{Gateway, Incoming};
use super::upstream::Outgoing;
use super::wire::Api;
use crate::config::Preset;
use crate::engine::classify::{Classified, Echoed, Observed};
use crate::engine::{Millis, Reason};
use crate::prices::Tokens;
use crate::redact::error_text;
use crate::redact::redact;
use crate::settings::Settings;
use crate::walk::Attempt;
use axum::body::Body;
use axum::http::{HeaderValue, StatusCode};
use axum::response::Response;
use bytes::Bytes;
use futures_util::StreamExt;
use futures_util::stream::BoxStream;
use serde_json::{Map, Value};
use std::sync::Arc;
use tokio::time::{Instant, timeout_at};

/// What one upstream call came to.
pub enum Called {
    Served(Response, Tokens),
    /// A stream whose first content event arrived: ready to commit.
    Stream(Box<Opened>),
    Failed(Box<CallFailure>),
}

/// A stream read up to its commit: the relay holding the client's first bytes, and the rest.
pub struct Opened {
    pub relay: Relay,
    pub rest: BoxStream<'static, reqwest::Result<Bytes>>,
    /// What the client sent, which an error event may echo.
    pub client: ClientText,
    /// Where the stream's thinking signatures are noted.
    pub signed: Arc<super::thinking::Origins>,
}

/// What the client sent, kept for reading what the upstream says of it (`Echoed`): the model it
/// asked for and the one called, its header values and its body.
pub struct ClientText {
    models: [String; 2],
    headers: http::HeaderMap,
    body: Arc<Map<String, Value>>,
    /// Held as long as the body (`limits.bodies_in_flight_mb`).
    _share: Arc<super::bodies::Share>,
}

impl ClientText {
    pub fn of(inc: &Incoming, called: &str) -> ClientText {
        let requested = inc.body.get("model").and_then(Value::as_str).unwrap_or("");
        ClientText {
            models: [called.to_string(), requested.to_string()],
            headers: inc.headers.clone(),
            body: inc.body.clone(),
            _share: inc.body_share.clone(),
        }
    }

    /// Its loose strings (for `Echoed::strings`): the models and the header values.
    pub fn strings(&self) -> Vec<&str> {
        let headers = self.headers.values().filter_map(|v| v.to_str().ok());
        self.models.iter().map(String::as_str).chain(headers).collect()
    }

    pub fn echoed<'a>(&'a self, strings: &'a [&'a str]) -> Echoed<'a> {
        Echoed { strings, body: Some(&self.body) }
    }
}

pub struct CallFailure {
    pub class: Classified,
    pub status: Option<u16>,
    /// The upstream's answer, redacted: returned as is when the reason stops the request.
    pub body: Option<Bytes>,
    /// rota's own request deadline (`timeouts.total`) ended the call, not the upstream.
    pub deadline: bool,
}

/// A call and its timings.
pub struct Call {
    pub called: Called,
    pub timing: Timing,
}

/// An attempt's timings, measured from the moment its request was sent.
#[derive(Clone, Copy)]
pub struct Timing {
    /// When the request was sent.
    pub sent: Instant,
    /// Time to the first byte of the upstream's body.
    pub ttfb_ms: Option<Millis>,
}

impl Timing {
    /// The request is sent now.
    fn sent_now() -> Timing {
        Timing { sent: Instant::now(), ttfb_ms: None }
    }

    /// A byte of the answer came: the first one, unless one came before.
    fn answered(&mut self) {
        self.ttfb_ms.get_or_insert_with(|| self.sent.elapsed().as_millis() as Millis);
    }
}

impl Gateway {
    /// Calls the attempt's candidate with `body` (the client's, or its translation).
    pub(super) async fn call(
        &self,
        inc: &Incoming,
        att: &Attempt,
        plan: Plan,
        body: &Map<String, Value>,
        deadline: Instant,
    ) -> Call {
        let settings = &inc.settings;
        let provider = &settings.config.providers[&att.cand.provider];
        let model = &att.cand.model;
        let in_url = provider.claude_on_vertex(model);
        // The Codex backend answers only as a stream: one answer is read whole (docs/providers.md).
        let codex = provider.preset == Some(Preset::Codex) && plan.upstream() == Api::Responses;
        let codex_body = codex.then(|| super::codex::body(body));
        let body = codex_body.as_ref().unwrap_or(body);
        let bytes = serde_json::to_vec(&WithModel { body, model, in_url }).expect("a JSON map serializes");
        let first_byte = deadline.min(Instant::now() + settings.config.timeouts.first_byte);
        let secrets = att.cred.secrets();
        let now = self.runtime.now();
        let fail = |class: Classified, status: Option<u16>, body: Option<Bytes>| {
            let mut class = class;
            class.message = redact(&class.message, &secrets);
            let deadline = class.reason == Reason::Timeout && Instant::now() >= deadline;
            Called::Failed(Box::new(CallFailure { class, status, body, deadline }))
        };
        let transport = |text: &str| transport(settings, text, now);
        let mut timing = Timing::sent_now();
        let answer = timeout_at(
            first_byte,
            self.upstream.send(
                provider,
                (plan.upstream(), model),
                &att.cred,
                Outgoing {
                    body: Bytes::from(bytes),
                    client_headers: &inc.headers,
                    stream: inc.stream || codex,
                    trace: crate::telemetry::outgoing(),
                },
            ),
        )
        .await;
        let mut resp = match answer {
            Err(_) => {
                return Call {
                    called: fail(transport("timed out waiting for the upstream's answer"), None, None),
                    timing,
                };
            }
            Ok(Err(e)) => return Call { called: fail(transport(&e.to_string()), None, None), timing },
            Ok(Ok(r)) => r,
        };
        let status = resp.status().as_u16();
        // An answer for a model the upstream served or throttled: not one it does not know (a
        // client may name models without end; each would be kept).
        if (200..300).contains(&status) || status == 429 {
            self.observe_quota(settings, att, resp.headers());
        }
        if (200..300).contains(&status) && inc.stream {
            let called = match self.open((inc, att), plan, resp, first_byte, &mut timing).await {
                Ok(opened) => Called::Stream(Box::new(opened)),
                Err(class) => fail(class, None, None),
            };
            return Call { called, timing };
        }
        let mut body = match timeout_at(first_byte, read_body(&mut resp, &mut timing)).await {
            Ok(Ok(b)) => b,
            Ok(Err(e)) => return Call { called: fail(transport(&error_text(&e)), None, None), timing },
            Err(_) => {
                return Call { called: fail(transport("timed out reading the upstream's answer"), None, None), timing };
            }
        };
        if codex && (200..300).contains(&status) {
            body = match super::codex::whole(&body) {
                super::codex::Whole::Completed(answer) => answer,
                super::codex::Whole::Failed(data) => {
                    let client = ClientText::of(inc, &att.cand.model);
                    let strings = client.strings();
                    let seen = Observed {
                        status: Some(200),
                        body: &data,
                        echoed: client.echoed(&strings),
                        ..Default::default()
                    };
                    return Call { called: fail(settings.classifier.classify(&seen, now), Some(status), None), timing };
                }
                super::codex::Whole::Cut => {
                    let message = "the Codex stream ended before `response.completed`".to_string();
                    let class =
                        Classified { reason: Reason::Network, hint: None, account_wide: false, message, claim: false };
                    return Call { called: fail(class, Some(status), None), timing };
                }
            };
        }
        if (200..300).contains(&status)
            && let Some((answer, tokens)) = plan.response(body.clone())
        {
            if plan.upstream() == super::wire::Api::Messages && contains(&body, b"\"signature\"") {
                let v: Value = serde_json::from_slice(&body).unwrap_or_default();
                self.signed.record(&att.cand.provider, super::thinking::signatures(&v));
            }
            let ct = match plan.translates() || codex {
                false => resp.headers().get("content-type").cloned(),
                true => Some(HeaderValue::from_static("application/json")),
            };
            let mut out = Response::new(Body::from(answer));
            *out.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::OK);
            if let Some(ct) = ct {
                out.headers_mut().insert("content-type", ct);
            }
            return Call { called: Called::Served(out, tokens), timing };
        }
        let text = String::from_utf8_lossy(&body);
        let headers: Vec<(String, String)> = resp
            .headers()
            .iter()
            .map(|(k, v)| (k.as_str().to_string(), v.to_str().unwrap_or("").to_string()))
            .collect();
        let client = ClientText::of(inc, &att.cand.model);
        let strings = client.strings();
        let echoed = client.echoed(&strings);
        let seen = Observed { status: Some(status), headers: &headers, body: &text, transport: None, echoed };
        let mut class = settings.classifier.classify(&seen, now);
        if (300..400).contains(&status) {
            let to = resp.headers().get("location").and_then(|v| v.to_str().ok()).unwrap_or("(no Location header)");
            class.message = format!(
                "the upstream answered {status} redirecting to {to}: rota does not follow redirects (a credential must not travel to another host)"
            );
        }
        let redacted = Bytes::from(redact(&text, &secrets));
        Call { called: fail(class, Some(status), Some(redacted)), timing }
    }

    /// Keeps what the answer's rate-limit headers say of the profile's remaining quota for the
    /// model (rota's own evidence: the answer to its own call), so that the next request can
    /// rotate before the 429.
    fn observe_quota(&self, settings: &Settings, att: &Attempt, headers: &http::HeaderMap) {
        let max_wait = settings.config.cooldown.hint_max.as_millis() as Millis;
        let pairs = headers.iter().filter_map(|(k, v)| Some((k.as_str(), v.to_str().ok()?)));
        let families = &settings.config.providers[&att.cand.provider].quota;
        if let Some(quota) = crate::engine::quota::read(pairs, families, &att.cand.model, self.runtime.now(), max_wait)
        {
            self.runtime.book.record_quota(&att.pid, quota);
        }
    }

    /// Reads a 2xx stream up to its first content event (docs/gateway.md): what came before it is
    /// held, and an error event, a stall or an end before it is a failure that fails over.
    async fn open(
        &self,
        (inc, att): (&Incoming, &Attempt),
        plan: Plan,
        resp: reqwest::Response,
        first_byte: Instant,
        timing: &mut Timing,
    ) -> Result<Opened, Classified> {
        let settings = &inc.settings;
        let mut rest = resp.bytes_stream().boxed();
        let mut relay = Relay::new(plan.upstream(), plan.stream_translator(&inc.body));
        let now = self.runtime.now();
        loop {
            let chunk = match timeout_at(first_byte, rest.next()).await {
                Err(_) => return Err(transport(settings, "timed out waiting for the first event of the stream", now)),
                Ok(None) => {
                    let (reason, message) = relay.closed().expect_err("a held stream is not whole");
                    return Err(Classified { reason, hint: None, account_wide: false, message, claim: false });
                }
                Ok(Some(Err(e))) => return Err(transport(settings, &error_text(&e), now)),
                Ok(Some(Ok(c))) => c,
            };
            timing.answered();
            relay.push(&chunk);
            match relay.phase() {
                Phase::Held => {}
                Phase::Failed { data, committed: false } => {
                    let client = ClientText::of(inc, &att.cand.model);
                    let strings = client.strings();
                    let echoed = client.echoed(&strings);
                    let seen = Observed { status: Some(200), headers: &[], body: data, transport: None, echoed };
                    return Err(settings.classifier.classify(&seen, now));
                }
                Phase::Empty => {
                    let (reason, message) = relay.closed().expect_err("an empty stream is not whole");
                    return Err(Classified { reason, hint: None, account_wide: false, message, claim: false });
                }
                Phase::Flowing | Phase::Complete | Phase::Failed { committed: true, .. } => {
                    let (client, signed) = (ClientText::of(inc, &att.cand.model), self.signed.clone());
                    return Ok(Opened { relay, rest, client, signed });
                }
            }
        }
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

fn transport(settings: &Settings, text: &str, now: Millis) -> Classified {
    settings.classifier.classify(&Observed { transport: Some(text), ..Default::default() }, now)
}

/// The whole body of a buffered answer, noting when its first byte came (the end, for an
/// empty body).
async fn read_body(resp: &mut reqwest::Response, timing: &mut Timing) -> reqwest::Result<Bytes> {
    let mut first: Option<Bytes> = None;
    let mut more: Vec<u8> = Vec::new();
    while let Some(chunk) = resp.chunk().await? {
        timing.answered();
        match &first {
            None => first = Some(chunk),
            Some(f) => {
                if more.is_empty() {
                    more.extend_from_slice(f);
                }
                more.extend_from_slice(&chunk);
            }
        }
    }
    timing.answered();
    Ok(if more.is_empty() { first.unwrap_or_default() } else { Bytes::from(more) })
}
