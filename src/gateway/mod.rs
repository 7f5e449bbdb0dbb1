//! The LLM gateway: OpenAI- and Anthropic-compatible endpoints for agents (docs/api.md), and
//! calling the upstreams. The failover walk they drive lives in `crate::walk`.

mod answer;
pub mod bodies;
mod call;
mod codex;
mod plan;
pub mod relay;
mod serve;
mod thinking;
pub mod translate;
pub mod upstream;
pub mod wire;

pub use answer::GatewayError;
pub use serve::Gateway;

use crate::access::{AgentCache, presented_key};
use crate::agents::Agent;
use crate::engine::ProfileId;
use crate::engine::chain::{FallbackOverride, bounded, check_names};
use crate::middleware::{BodyTimeout, RequestId};
use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};
use serve::Incoming;
use std::collections::BTreeSet;
use wire::Api;

pub fn router() -> Router<Gateway> {
    Router::new()
        .route("/v1/chat/completions", post(|s, id, h, b| handle(Api::Chat, s, id, h, b)))
        .route("/v1/responses", post(|s, id, h, b| handle(Api::Responses, s, id, h, b)))
        .route("/v1/messages", post(|s, id, h, b| handle(Api::Messages, s, id, h, b)))
        .route("/v1/messages/count_tokens", post(count_tokens))
        .route("/v1/models", get(models))
}

async fn authenticate(agents: &AgentCache, headers: &HeaderMap) -> Result<Agent, GatewayError> {
    let key = presented_key(headers).ok_or(GatewayError::MissingKey)?;
    let agent = agents.find(key).await.ok_or(GatewayError::InvalidKey)?;
    crate::telemetry::agent(&agent.name);
    Ok(agent)
}

async fn handle(
    api: Api,
    State(gw): State<Gateway>,
    RequestId(request_id): RequestId,
    headers: HeaderMap,
    body: Body,
) -> Response {
    match accept(api, &gw, headers, body, request_id.clone()).await {
        Ok(incoming) => gw.serve(incoming).await,
        Err(Refused { agent, model, error }) => {
            if let Some(agent) = agent {
                gw.refused(api, &agent, &request_id, model, &error);
            }
            error.answer(api, &request_id)
        }
    }
}

/// A request refused before its walk: the error, and the agent (once authenticated) and the
/// body's `model` (once read), for its `requests` row.
struct Refused {
    agent: Option<Agent>,
    model: Option<String>,
    error: GatewayError,
}

impl From<GatewayError> for Refused {
    fn from(error: GatewayError) -> Refused {
        Refused { agent: None, model: None, error }
    }
}

/// The client's request, authenticated and parsed.
async fn accept(
    api: Api,
    gw: &Gateway,
    headers: HeaderMap,
    body: Body,
    request_id: String,
) -> Result<Incoming, Refused> {
    let agent = authenticate(&gw.agents, &headers).await?;
    parse(api, gw, headers, body, request_id, agent).await
}

/// The request of an authenticated agent, parsed; a refusal keeps the agent and the body's
/// `model` (once read) for its `requests` row.
async fn parse(
    api: Api,
    gw: &Gateway,
    headers: HeaderMap,
    body: Body,
    request_id: String,
    agent: Agent,
) -> Result<Incoming, Refused> {
    // What is kept of a refused request's model is bounded, whatever the client sent.
    let refused = |agent, model: Option<&Value>, error| Refused {
        agent: Some(agent),
        model: model.and_then(Value::as_str).map(|m| bounded(m).to_string()),
        error,
    };
    let settings = gw.runtime.settings();
    // The agent's limits come before its body is read: an agent over them costs no memory.
    if let Err(over) =
        gw.runtime.limits.admit(&agent.name, &settings.config.agent_limits(&agent), gw.runtime.now()).await
    {
        tracing::debug!(agent = %agent.name, "{}", over.message);
        let error = GatewayError::OverLimit { message: over.message, retry_after: over.retry_after };
        return Err(refused(agent, None, error));
    }
    let limit = settings.config.limits.max_body_bytes;
    let deadline = tokio::time::Instant::now() + settings.config.server.body_timeout;
    let (bytes, share) = match gw.bodies.read(body, &headers, limit, deadline).await {
        Ok(read) => read,
        Err(unread) => {
            let error = match unread {
                bodies::Unread::Failed(e) if BodyTimeout::caused(&e).is_some() => {
                    GatewayError::BodyTimeout(e.to_string())
                }
                bodies::Unread::Waited => GatewayError::BodyTimeout(format!(
                    "the request body waited for its share of limits.bodies_in_flight_mb past server.body_timeout ({}s)",
                    settings.config.server.body_timeout.as_secs_f64()
                )),
                _ => GatewayError::BodyTooLarge(limit),
            };
            return Err(refused(agent, None, error));
        }
    };
    if let Err(why) = bodies::values_within(&bytes, bodies::VALUES_MAX) {
        return Err(refused(agent, None, GatewayError::BadRequest(why)));
    }
    // A large body's model is checked before the body is parsed whole: a name past its bound
    // costs no parsed copy.
    if let Some(model) = bodies::long_model(&bytes) {
        let why = format!("the model name is longer than {} bytes", crate::engine::chain::MODEL_NAME_MAX);
        let error = GatewayError::BadRequest(why);
        return Err(refused(agent, Some(&Value::String(model)), error));
    }
    let parsed = serde_json::from_slice::<Value>(&bytes);
    drop(bytes); // the parsed body is the one copy kept
    let body = match parsed {
        Ok(Value::Object(m)) => m,
        Ok(_) => {
            let error = GatewayError::BadRequest("the request body must be a JSON object".into());
            return Err(refused(agent, None, error));
        }
        Err(e) => return Err(refused(agent, None, GatewayError::BadRequest(format!("invalid JSON: {e}")))),
    };
    if body.get("model").is_some_and(|m| !m.is_string()) {
        return Err(refused(agent, None, GatewayError::BadRequest("`model` must be a string".into())));
    }
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).map(str::trim).filter(|v| !v.is_empty());
    let pin = match header("x-rota-profile").map(str::parse::<ProfileId>).transpose() {
        Ok(pin) => pin,
        Err(e) => {
            let error = GatewayError::BadRequest(format!("x-rota-profile: {e}"));
            return Err(refused(agent, body.get("model"), error));
        }
    };
    let fallbacks = header("x-rota-fallbacks").map(FallbackOverride::parse).unwrap_or_default();
    if let Err(why) = check_names(body.get("model").and_then(Value::as_str), &fallbacks) {
        return Err(refused(agent, body.get("model"), GatewayError::BadRequest(why)));
    }
    // The session, from what clients send, first found wins (docs/rotation.md, rule 7): rota's
    // own header, Claude Code's and Codex's (`session-id` in 0.169, `session_id` before), then the body's.
    let session = ["x-rota-session", "x-claude-code-session-id", "session-id", "session_id"]
        .into_iter()
        .find_map(header)
        .map(str::to_string)
        .or_else(|| api.body_session(&body));
    Ok(Incoming {
        settings,
        api,
        stream: body.get("stream").and_then(Value::as_bool).unwrap_or(false),
        agent,
        body: std::sync::Arc::new(body),
        body_share: std::sync::Arc::new(share),
        session,
        pin,
        fallbacks,
        headers,
        request_id,
    })
}

/// `POST /v1/messages/count_tokens` (docs/gateway.md): passed to the first model of the chain when
/// its provider speaks Anthropic's format, with the profile a request would take first (not marked
/// used, not audited: counting is free and limited apart); estimated otherwise, or when that call
/// gets no answer, and then marked `x-rota-estimated: true`.
async fn count_tokens(
    State(gw): State<Gateway>,
    RequestId(request_id): RequestId,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let api = Api::Messages;
    let inc = match accept(api, &gw, headers, body, request_id.clone()).await {
        Ok(inc) => inc,
        Err(Refused { error, .. }) => return error.answer(api, &request_id),
    };
    let config = &inc.settings.config;
    let model = inc.body.get("model").and_then(Value::as_str);
    let chain = match gw.runtime.chain(config, &inc.agent, model, inc.fallbacks.clone()) {
        Ok(chain) => chain,
        Err(e) => return GatewayError::of_chain(e, model.is_some()).answer(api, &request_id),
    };
    let first = &chain[0];
    let provider = &config.providers[&first.provider];
    // Claude on Vertex AI counts at another endpoint: estimated here.
    if provider.api == crate::config::WireFormat::Anthropic
        && !provider.claude_on_vertex(&first.model)
        && let Some(answer) = gw.count_upstream(&inc, first, provider).await
    {
        return answer;
    }
    let mut resp = axum::Json(json!({"input_tokens": translate::estimate_tokens(&inc.body)})).into_response();
    resp.headers_mut().insert("x-rota-estimated", axum::http::HeaderValue::from_static("true"));
    resp
}

impl Gateway {
    /// The upstream's count, or `None` when no profile can ask or the call gets no answer.
    async fn count_upstream(
        &self,
        inc: &Incoming,
        cand: &crate::engine::chain::Candidate,
        provider: &crate::config::Provider,
    ) -> Option<Response> {
        let now = self.runtime.now();
        let order =
            self.runtime.book.roster().order(&inc.settings.config, &cand.provider, &cand.model, None, None, now);
        let pid = order.ok()?.slots.into_iter().find(|s| s.blocked.is_none())?.id;
        let cred = self.runtime.book.credential(&pid)?;
        let body = serde_json::to_vec(&plan::WithModel { body: &inc.body, model: &cand.model, in_url: false }).ok()?;
        let path = "/v1/messages/count_tokens";
        let out = upstream::Outgoing {
            body: body.into(),
            client_headers: &inc.headers,
            stream: false,
            trace: crate::telemetry::outgoing(),
        };
        let send = self.upstream.send_to(provider, path, &cred, out);
        let resp = tokio::time::timeout(inc.settings.config.timeouts.first_byte, send).await.ok()?.ok()?;
        let status = resp.status().as_u16();
        let bytes = resp.bytes().await.ok()?;
        let text = crate::redact::redact(&String::from_utf8_lossy(&bytes), &cred.secrets());
        Some(answer::upstream_answer(status, bytes::Bytes::from(text)))
    }
}

/// The models and virtual models this agent may name, in the OpenAI list format.
async fn models(State(gw): State<Gateway>, RequestId(request_id): RequestId, headers: HeaderMap) -> Response {
    if let Err(e) = authenticate(&gw.agents, &headers).await {
        return e.answer(Api::Chat, &request_id);
    }
    let settings = gw.runtime.settings();
    let c = &settings.config;
    let mut ids: BTreeSet<String> = BTreeSet::new();
    ids.extend(c.aliases.keys().cloned());
    ids.extend(c.aliases.values().cloned());
    ids.extend(c.virtual_models.keys().cloned());
    ids.extend(c.virtual_models.values().flat_map(|v| v.targets.iter().map(|t| t.model().to_string())));
    ids.extend(c.models.primary.iter().cloned());
    ids.extend(c.models.fallbacks.iter().cloned());
    let data: Vec<Value> = ids
        .into_iter()
        .map(|id| {
            let owner = crate::engine::chain::split_model_ref(&id).map_or("rota", |(p, _)| p).to_string();
            json!({"id": id, "object": "model", "created": 0, "owned_by": owner})
        })
        .collect();
    axum::Json(json!({"object": "list", "data": data})).into_response()
}
