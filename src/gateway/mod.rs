//! The LLM gateway: OpenAI- and Anthropic-compatible endpoints for agents (SPEC §8).

mod answer;
mod call;
pub mod failover;
mod plan;
pub mod relay;
pub mod sse;
pub mod upstream;
pub mod walk;
pub mod wire;

use crate::agents::{Agent, digest};
use crate::engine::ProfileId;
use crate::engine::chain::FallbackOverride;
use crate::server::AppState;
use crate::store::{Store, StoreError};
use answer::refuse;
use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
pub(crate) use call::secrets_of;
use failover::Incoming;
use secrecy::SecretString;
use serde_json::{Value, json};
use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, RwLock};
use wire::Api;

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/v1/chat/completions", post(|s, h, b| handle(Api::Chat, s, h, b)))
        .route("/v1/responses", post(|s, h, b| handle(Api::Responses, s, h, b)))
        .route("/v1/messages", post(|s, h, b| handle(Api::Messages, s, h, b)))
        .route("/v1/models", get(models))
}

/// The active agents by key digest, in memory, so authenticating never waits on the database.
/// A background task follows the change feed, so agents created or revoked with the CLI or by
/// another instance take effect on a running server within a second.
pub struct AgentCache {
    by_digest: RwLock<HashMap<String, Agent>>,
}

impl AgentCache {
    /// Loads the active agents, and reloads them whenever the change feed says an agent was
    /// created or revoked (by this server, the CLI or another instance).
    pub async fn load(store: Arc<dyn Store>) -> Result<Arc<AgentCache>, StoreError> {
        let mut seen = store.feed_head(Some("agent")).await?;
        let cache = Arc::new(AgentCache { by_digest: RwLock::new(active(store.as_ref()).await?) });
        let weak = Arc::downgrade(&cache);
        let mut wake = store.wake();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = tokio::time::sleep(crate::book::FEED_EVERY) => {}
                    _ = crate::store::woken(&mut wake) => {}
                }
                let Some(cache) = weak.upgrade() else { return };
                let head = match store.feed_head(Some("agent")).await {
                    Ok(head) if head == seen => continue,
                    Ok(head) => head,
                    Err(e) => {
                        tracing::warn!(error = %e, "reading the change feed failed; keeping the agents");
                        continue;
                    }
                };
                match active(store.as_ref()).await {
                    Ok(fresh) => {
                        *cache.by_digest.write().unwrap_or_else(|e| e.into_inner()) = fresh;
                        seen = head;
                    }
                    Err(e) => tracing::warn!(error = %e, "reloading agents failed; keeping the last list"),
                }
            }
        });
        Ok(cache)
    }

    /// Reloads the agents now (after the admin API created or revoked one).
    pub async fn reload(&self, store: &dyn Store) -> Result<(), StoreError> {
        let fresh = active(store).await?;
        *self.by_digest.write().unwrap_or_else(|e| e.into_inner()) = fresh;
        Ok(())
    }

    /// True while `agent` (the same id) is active and an admin.
    pub fn is_active_admin(&self, agent: &Agent) -> bool {
        self.by_digest.read().unwrap_or_else(|e| e.into_inner()).values().any(|a| a.id == agent.id && a.admin)
    }

    pub(crate) fn find(&self, key: &str) -> Option<Agent> {
        let d = digest(&SecretString::from(key.to_string()));
        self.by_digest.read().unwrap_or_else(|e| e.into_inner()).get(&d).cloned()
    }
}

async fn active(store: &dyn Store) -> Result<HashMap<String, Agent>, StoreError> {
    Ok(store.active_agents().await?.into_iter().collect())
}

/// The agent key: `Authorization: Bearer rk_…` or `x-api-key: rk_…`.
pub(crate) fn presented_key(headers: &HeaderMap) -> Option<&str> {
    let bearer = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer ").or_else(|| v.strip_prefix("bearer ")));
    bearer.or_else(|| headers.get("x-api-key").and_then(|v| v.to_str().ok())).map(str::trim).filter(|k| !k.is_empty())
}

async fn authenticate(state: &AppState, api: Api, headers: &HeaderMap, request_id: &str) -> Result<Agent, Response> {
    let Some(key) = presented_key(headers) else {
        return Err(refuse(
            api,
            401,
            "missing agent key: send `Authorization: Bearer rk_…` or `x-api-key: rk_…`",
            request_id,
        ));
    };
    match state.agents.find(key) {
        Some(agent) => Ok(agent),
        None => Err(refuse(api, 401, "invalid or revoked agent key", request_id)),
    }
}

async fn handle(api: Api, State(state): State<AppState>, headers: HeaderMap, body: Body) -> Response {
    let request_id = uuid::Uuid::new_v4().to_string();
    let agent = match authenticate(&state, api, &headers, &request_id).await {
        Ok(a) => a,
        Err(resp) => return resp,
    };
    let settings = state.engine.settings();
    let limit = settings.config.limits.max_body_bytes;
    let bytes = match axum::body::to_bytes(body, limit).await {
        Ok(b) => b,
        Err(e) if crate::server::BodyTimeout::caused(&e).is_some() => {
            return refuse(api, 408, &e.to_string(), &request_id);
        }
        Err(_) => {
            return refuse(
                api,
                413,
                &format!("request body larger than {limit} bytes (limits.max_body_bytes)"),
                &request_id,
            );
        }
    };
    let body: serde_json::Map<String, Value> = match serde_json::from_slice::<Value>(&bytes) {
        Ok(Value::Object(m)) => m,
        Ok(_) => return refuse(api, 400, "the request body must be a JSON object", &request_id),
        Err(e) => return refuse(api, 400, &format!("invalid JSON: {e}"), &request_id),
    };
    if body.get("model").is_some_and(|m| !m.is_string()) {
        return refuse(api, 400, "`model` must be a string", &request_id);
    }
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).map(str::trim).filter(|v| !v.is_empty());
    let pin = match header("x-rota-profile").map(str::parse::<ProfileId>) {
        None => None,
        Some(Ok(p)) => Some(p),
        Some(Err(e)) => return refuse(api, 400, &format!("x-rota-profile: {e}"), &request_id),
    };
    let session = header("x-rota-session").map(str::to_string).or_else(|| api.body_session(&body));
    let incoming = Incoming {
        settings,
        api,
        stream: body.get("stream").and_then(Value::as_bool).unwrap_or(false),
        agent,
        body,
        session,
        pin,
        fallbacks: header("x-rota-fallbacks").map(FallbackOverride::parse).unwrap_or_default(),
        headers,
        request_id,
    };
    state.engine.clone().serve(incoming).await
}

/// The models and virtual models this agent may name, in the OpenAI list format.
async fn models(State(state): State<AppState>, headers: HeaderMap) -> Response {
    let request_id = uuid::Uuid::new_v4().to_string();
    if let Err(resp) = authenticate(&state, Api::Chat, &headers, &request_id).await {
        return resp;
    }
    let settings = state.engine.settings();
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
