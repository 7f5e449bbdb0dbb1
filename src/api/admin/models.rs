//! `/api/v1/models`: the chains agents get, and ending a model's cooldown.

use crate::api::{ApiError, ApiState, Body, Operator, Viewer};
use crate::config::Config;
use crate::engine::chain::{ChainRequest, FallbackOverride, Strategy};
use axum::Json;
use axum::extract::State;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

pub fn routes() -> OpenApiRouter<ApiState> {
    OpenApiRouter::new().routes(routes!(list_models)).routes(routes!(clear_model))
}

#[derive(Serialize, ToSchema)]
pub struct ModelsInfo {
    /// `models.primary`: what a request without `model` gets.
    pub primary: Option<String>,
    pub fallbacks: Vec<String>,
    pub aliases: BTreeMap<String, String>,
    pub virtual_models: Vec<VirtualModelInfo>,
    /// Each agent's chain for a request without `model` (`(default)`: agents without a section).
    pub chains: Vec<AgentChain>,
}

#[derive(Serialize, ToSchema)]
pub struct VirtualModelInfo {
    pub name: String,
    /// `failover` or `weighted` (the first target is drawn by weight per request).
    pub strategy: String,
    pub targets: Vec<String>,
    /// The chain a request for it walks (for `weighted`, with the first target drawn first).
    pub chain: Vec<String>,
}

#[derive(Serialize, ToSchema)]
pub struct AgentChain {
    pub agent: String,
    pub chain: Vec<String>,
    /// Why the chain cannot be resolved, if it cannot.
    pub error: Option<String>,
}

pub(super) fn resolved(config: &Config, model: Option<&str>, agent: Option<&str>) -> Result<Vec<String>, String> {
    let req = ChainRequest {
        model,
        agent_fallbacks: agent.and_then(|a| config.agents.get(a)).and_then(|a| a.fallbacks.as_deref()),
        fallback_override: FallbackOverride::Inherit,
        roll: 0,
        failover: config.failover.enabled,
        allowed: agent.and_then(|a| config.agents.get(a)).and_then(|a| a.models.as_deref()),
    };
    config.chain(&req).map(|c| c.iter().map(|c| c.label()).collect()).map_err(|e| e.to_string())
}

/// Models, aliases and virtual models with their resolved chains
#[utoipa::path(get, path = "/api/v1/models", tag = "admin",
    responses((status = 200, body = ModelsInfo), (status = 401, body = crate::api::ErrorBody), (status = 403, body = crate::api::ErrorBody)))]
async fn list_models(State(state): State<ApiState>, _: Viewer) -> Json<ModelsInfo> {
    let settings = state.runtime.settings();
    let c = &settings.config;
    let mut virtual_models: Vec<VirtualModelInfo> = c
        .virtual_models
        .iter()
        .map(|(name, v)| VirtualModelInfo {
            name: name.clone(),
            strategy: match v.strategy {
                Strategy::Failover => "failover".into(),
                Strategy::Weighted => "weighted".into(),
            },
            targets: v.targets.iter().map(|t| t.model().to_string()).collect(),
            chain: resolved(c, Some(name), None).unwrap_or_default(),
        })
        .collect();
    virtual_models.sort_by(|a, b| a.name.cmp(&b.name));
    let mut agents: Vec<Option<&str>> = vec![None];
    agents.extend(c.agents.keys().map(|a| Some(a.as_str())));
    let chains = agents
        .into_iter()
        .map(|a| {
            let (chain, error) = match resolved(c, None, a) {
                Ok(chain) => (chain, None),
                Err(e) => (vec![], Some(e)),
            };
            AgentChain { agent: a.unwrap_or("(default)").to_string(), chain, error }
        })
        .collect();
    Json(ModelsInfo {
        primary: c.models.primary.clone(),
        fallbacks: c.models.fallbacks.clone(),
        aliases: c.aliases.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
        virtual_models,
        chains,
    })
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ClearModelRequest {
    /// `provider/model`: the model whose cooldown (after a `model_not_found`) ends now.
    pub model: String,
}

#[derive(Serialize, ToSchema)]
pub struct ClearedModel {
    pub model: String,
    /// Whether a cooldown was active (false: there was nothing to clear).
    pub cleared: bool,
}

/// Clear a model's cooldown
///
/// A `model_not_found` cools the model on its provider for every profile; this ends it now.
#[utoipa::path(post, path = "/api/v1/models/clear", tag = "admin", request_body = ClearModelRequest,
    responses((status = 200, body = ClearedModel), (status = 400, body = crate::api::ErrorBody), (status = 404, body = crate::api::ErrorBody)))]
async fn clear_model(
    State(state): State<ApiState>,
    Operator(actor): Operator,
    Body(req): Body<ClearModelRequest>,
) -> Result<Json<ClearedModel>, ApiError> {
    use crate::engine::chain::{FallbackOverride, check_names, split_model_ref};
    check_names(Some(&req.model), &FallbackOverride::Inherit).map_err(ApiError::BadRequest)?;
    let (provider, model) = split_model_ref(&req.model)
        .ok_or_else(|| ApiError::BadRequest(format!("`{}` is not a provider/model reference", req.model)))?;
    if !state.runtime.settings().config.providers.contains_key(provider) {
        return Err(ApiError::NotFound(format!("provider {provider} is not configured")));
    }
    let cleared = state.runtime.book.end_model_cooldown(provider, model, state.runtime.clock.now());
    state.runtime.book.flush().await;
    let was = (Some(serde_json::json!({"cooling": cleared})), Some(serde_json::json!({"cooling": false})));
    state.record(&actor, "model.clear", Some(&req.model), was).await?;
    Ok(Json(ClearedModel { model: req.model, cleared }))
}
