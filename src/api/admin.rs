//! The admin API (SPEC §8): profiles, order, providers, models, agents, usage and the audit log.
//! Every change is written to the store and applied to the running book at once. Secrets are
//! write-only: no answer here carries one (a new agent's key is shown once, when created).

use super::ApiState;
use super::{Admin, ApiError, Body};
use crate::book::{Credential, Roster};
use crate::config::Config;
use crate::engine::chain::{ChainRequest, FallbackOverride, Strategy};
use crate::engine::{Millis, ProfileId, ProfileType, Reason, UsageStats};
use crate::profiles as rules;
use crate::status::{Status, time};
use crate::store::{AttemptRecord, AuditQuery, Origin, ProfileUsage, RequestRecord, StoredProfile};
use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{FromRequestParts, Path, Query, State};
use axum::http::StatusCode;
use axum::http::request::Parts;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

pub fn routes() -> OpenApiRouter<ApiState> {
    OpenApiRouter::new()
        .routes(routes!(list_profiles, add_profile))
        .routes(routes!(get_profile, remove_profile))
        .routes(routes!(enable_profile))
        .routes(routes!(disable_profile))
        .routes(routes!(clear_profile))
        .routes(routes!(list_providers))
        .routes(routes!(set_order, reset_order))
        .routes(routes!(list_models))
        .routes(routes!(clear_model))
        .routes(routes!(list_agents, create_agent))
        .routes(routes!(revoke_agent))
        .routes(routes!(usage))
        .routes(routes!(list_attempts))
        .routes(routes!(list_requests))
}

/// Query parameters whose errors are answered in the API's error format.
pub struct Params<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequestParts<S> for Params<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        Query::<T>::from_request_parts(parts, state)
            .await
            .map(|Query(v)| Params(v))
            .map_err(|e: QueryRejection| ApiError::BadRequest(format!("invalid query: {}", e.body_text())))
    }
}

fn profile_id(raw: &str) -> Result<ProfileId, ApiError> {
    raw.parse().map_err(|e| ApiError::BadRequest(format!("{e}")))
}

// ---------------------------------------------------------------------------------------------
// Profiles

/// A profile as the admin sees it: never its secret.
#[derive(Serialize, ToSchema)]
pub struct ProfileInfo {
    pub id: String,
    pub provider: String,
    pub name: String,
    /// `api_key`, `token` or `oauth`.
    #[serde(rename = "type")]
    pub kind: String,
    /// `stored` (added through the API, CLI, web page or an import) or `config` (declared in the config file).
    pub source: String,
    /// `false` after an admin disabled it.
    pub enabled: bool,
    /// The account's email (OAuth profiles).
    pub email: Option<String>,
    /// When a static token stops working, or an OAuth access token expires (RFC 3339).
    pub expires_at: Option<String>,
    /// The state now: `{"state": "usable"}`, `{"state": "cooling", "until", "reason", "model"}`,
    /// `{"state": "disabled", "until", "reason"}` or `{"state": "unusable", "why"}` (times in Unix ms).
    #[schema(value_type = Object)]
    pub status: Status,
    /// The state in words.
    pub status_text: String,
    /// usageStats (docs/schema.md, `usage_stats`).
    #[schema(value_type = Object)]
    pub usage_stats: UsageStats,
}

fn info(config: &Config, roster: &Roster, id: &ProfileId, now: Millis) -> Option<ProfileInfo> {
    let v = roster.views.get(id)?;
    let status = Status::of(v, now);
    Some(ProfileInfo {
        id: id.to_string(),
        provider: id.provider().to_string(),
        name: id.name().to_string(),
        kind: v.kind.to_string(),
        source: if config.auth.profiles.contains_key(id) { Origin::Config } else { Origin::Stored }.as_str().into(),
        enabled: v.enabled,
        email: roster.emails.get(id).cloned(),
        expires_at: v.expires_at.map(time),
        status_text: match &status {
            Status::Disabled { reason: Reason::AuthPermanent, .. } if v.kind == ProfileType::OAuth => {
                "needs re-login: the provider refused its tokens (log in again)".into()
            }
            other => other.display(now),
        },
        status,
        usage_stats: v.stats.clone(),
    })
}

fn one(state: &ApiState, id: &ProfileId) -> Result<Json<ProfileInfo>, ApiError> {
    let config = state.runtime.settings();
    let roster = state.runtime.book.roster();
    info(&config.config, &roster, id, state.runtime.clock.now())
        .map(Json)
        .ok_or_else(|| ApiError::NotFound(format!("profile {id} does not exist")))
}

#[derive(Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ProfileFilter {
    /// Only this provider's profiles.
    pub provider: Option<String>,
}

/// List profiles
#[utoipa::path(get, path = "/api/v1/profiles", tag = "admin", params(ProfileFilter),
    responses((status = 200, body = Vec<ProfileInfo>), (status = 401, body = super::ErrorBody), (status = 403, body = super::ErrorBody)))]
async fn list_profiles(
    State(state): State<ApiState>,
    _: Admin,
    Params(f): Params<ProfileFilter>,
) -> Json<Vec<ProfileInfo>> {
    let settings = state.runtime.settings();
    let roster = state.runtime.book.roster();
    let now = state.runtime.clock.now();
    let mut ids: Vec<&ProfileId> =
        roster.views.keys().filter(|id| f.provider.as_deref().is_none_or(|p| id.provider() == p)).collect();
    ids.sort();
    Json(ids.into_iter().filter_map(|id| info(&settings.config, &roster, id, now)).collect())
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewProfileRequest {
    pub provider: String,
    /// The label: the profile id becomes `provider:name`.
    pub name: String,
    /// `api_key` (default) or `token`.
    #[serde(rename = "type")]
    pub kind: Option<String>,
    /// The API key or token. Write-only: no answer ever returns it.
    pub secret: String,
    /// When a static token stops working (RFC 3339); tokens only.
    pub expires_at: Option<String>,
}

/// Add an API key or token
#[utoipa::path(post, path = "/api/v1/profiles", tag = "admin", request_body = NewProfileRequest,
    responses((status = 201, body = ProfileInfo), (status = 400, body = super::ErrorBody), (status = 401, body = super::ErrorBody),
        (status = 403, body = super::ErrorBody), (status = 409, body = super::ErrorBody)))]
async fn add_profile(
    State(state): State<ApiState>,
    _: Admin,
    Body(req): Body<NewProfileRequest>,
) -> Result<(StatusCode, Json<ProfileInfo>), ApiError> {
    let settings = state.runtime.settings();
    let now = state.runtime.clock.now();
    let kind = req.kind.as_deref().unwrap_or("api_key");
    let new = rules::check_new(&settings.config, &req.provider, &req.name, kind, req.expires_at.as_deref(), now)
        .map_err(ApiError::BadRequest)?;
    let secret = rules::check_secret(&req.secret, new.kind).map_err(ApiError::BadRequest)?;
    let sealed = state.key.seal(&new.id, new.field, &secret);
    let profile = StoredProfile::stored(new.id.clone(), new.kind, new.expires_at, now);
    state.store.add_profile(&profile, &[sealed]).await.map_err(ApiError::from)?;
    let credential =
        if new.kind == ProfileType::Token { Credential::Token(secret) } else { Credential::ApiKey(secret) };
    state.runtime.book.add_profile(&profile, credential);
    tracing::info!(profile = %new.id, "profile added through the admin API");
    Ok((StatusCode::CREATED, Json(one(&state, &new.id)?.0)))
}

/// One profile
#[utoipa::path(get, path = "/api/v1/profiles/{id}", tag = "admin", params(("id" = String, Path, description = "provider:name")),
    responses((status = 200, body = ProfileInfo), (status = 400, body = super::ErrorBody), (status = 404, body = super::ErrorBody)))]
async fn get_profile(
    State(state): State<ApiState>,
    _: Admin,
    Path(id): Path<String>,
) -> Result<Json<ProfileInfo>, ApiError> {
    one(&state, &profile_id(&id)?)
}

/// Remove a stored profile and its secret
#[utoipa::path(delete, path = "/api/v1/profiles/{id}", tag = "admin", params(("id" = String, Path, description = "provider:name")),
    responses((status = 204, description = "Removed"), (status = 400, body = super::ErrorBody), (status = 404, body = super::ErrorBody),
        (status = 409, description = "Declared in the config file", body = super::ErrorBody)))]
async fn remove_profile(
    State(state): State<ApiState>,
    _: Admin,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    let id = profile_id(&id)?;
    let settings = state.runtime.settings();
    if settings.config.auth.profiles.contains_key(&id) {
        return Err(ApiError::Conflict(format!("profile {id} is declared in the config file; remove it there")));
    }
    let book = &state.runtime.book;
    let roster = book.roster();
    if !roster.views.contains_key(&id) {
        return Err(ApiError::NotFound(format!("profile {id} does not exist")));
    }
    // Out of rotation first, then wait for its pending stats writes, then delete the rows.
    book.remove_profile(&id);
    book.flush().await;
    if let Some(order) = roster.orders.get(id.provider()).filter(|o| o.contains(&id)) {
        let rest: Vec<ProfileId> = order.iter().filter(|p| **p != id).cloned().collect();
        state
            .store
            .set_order(id.provider(), (!rest.is_empty()).then_some(rest.as_slice()))
            .await
            .map_err(ApiError::from)?;
    }
    state.store.remove_profile(&id).await.map_err(ApiError::from)?;
    tracing::info!(profile = %id, "profile removed through the admin API");
    Ok(StatusCode::NO_CONTENT)
}

async fn set_enabled(state: ApiState, raw: &str, enabled: bool) -> Result<Json<ProfileInfo>, ApiError> {
    let id = profile_id(raw)?;
    if !state.runtime.book.roster().views.contains_key(&id) {
        return Err(ApiError::NotFound(format!("profile {id} does not exist")));
    }
    state.store.set_enabled(&id, enabled).await.map_err(ApiError::from)?;
    state.runtime.book.set_enabled(&id, enabled);
    one(&state, &id)
}

/// Let rotation use the profile again
#[utoipa::path(post, path = "/api/v1/profiles/{id}/enable", tag = "admin", params(("id" = String, Path, description = "provider:name")),
    responses((status = 200, body = ProfileInfo), (status = 400, body = super::ErrorBody), (status = 404, body = super::ErrorBody)))]
async fn enable_profile(
    State(state): State<ApiState>,
    _: Admin,
    Path(id): Path<String>,
) -> Result<Json<ProfileInfo>, ApiError> {
    set_enabled(state, &id, true).await
}

/// Keep rotation from using the profile
#[utoipa::path(post, path = "/api/v1/profiles/{id}/disable", tag = "admin", params(("id" = String, Path, description = "provider:name")),
    responses((status = 200, body = ProfileInfo), (status = 400, body = super::ErrorBody), (status = 404, body = super::ErrorBody)))]
async fn disable_profile(
    State(state): State<ApiState>,
    _: Admin,
    Path(id): Path<String>,
) -> Result<Json<ProfileInfo>, ApiError> {
    set_enabled(state, &id, false).await
}

/// Clear the profile's cooldown and disabled state
#[utoipa::path(post, path = "/api/v1/profiles/{id}/clear", tag = "admin", params(("id" = String, Path, description = "provider:name")),
    responses((status = 200, body = ProfileInfo), (status = 400, body = super::ErrorBody), (status = 404, body = super::ErrorBody)))]
async fn clear_profile(
    State(state): State<ApiState>,
    _: Admin,
    Path(id): Path<String>,
) -> Result<Json<ProfileInfo>, ApiError> {
    let id = profile_id(&id)?;
    if !state.runtime.book.clear(&id, state.runtime.clock.now()) {
        return Err(ApiError::NotFound(format!("profile {id} does not exist")));
    }
    state.runtime.book.flush().await;
    one(&state, &id)
}

// ---------------------------------------------------------------------------------------------
// Providers and order

#[derive(Serialize, ToSchema)]
pub struct ProviderInfo {
    pub name: String,
    /// Wire format: `openai` or `anthropic`.
    pub api: String,
    pub base_url: String,
    /// Accounts log in with OAuth (the login flows need it).
    pub oauth: bool,
    pub profiles: Vec<String>,
    /// Where the order in force comes from: `stored` (API, CLI, web page), `config` or `round_robin`.
    pub order_source: String,
    /// The explicit order in force (empty for round robin).
    pub order: Vec<String>,
}

fn provider_info(config: &Config, roster: &Roster, name: &str) -> Option<ProviderInfo> {
    let p = config.providers.get(name)?;
    let mut profiles: Vec<String> =
        roster.views.keys().filter(|id| id.provider() == name).map(ToString::to_string).collect();
    profiles.sort();
    let (source, order) = rules::order_in_force(config, roster, name);
    Some(ProviderInfo {
        name: name.to_string(),
        api: match p.api {
            crate::config::Api::Openai => "openai".into(),
            crate::config::Api::Anthropic => "anthropic".into(),
        },
        base_url: p.base_url.clone(),
        oauth: p.oauth.is_some(),
        profiles,
        order_source: source.into(),
        order: order.iter().map(ToString::to_string).collect(),
    })
}

/// List providers
#[utoipa::path(get, path = "/api/v1/providers", tag = "admin",
    responses((status = 200, body = Vec<ProviderInfo>), (status = 401, body = super::ErrorBody), (status = 403, body = super::ErrorBody)))]
async fn list_providers(State(state): State<ApiState>, _: Admin) -> Json<Vec<ProviderInfo>> {
    let settings = state.runtime.settings();
    let roster = state.runtime.book.roster();
    Json(settings.config.providers.keys().filter_map(|p| provider_info(&settings.config, &roster, p)).collect())
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct OrderRequest {
    /// Profile ids of this provider, in the order to try them.
    pub profiles: Vec<String>,
}

/// Set a provider's explicit order
#[utoipa::path(put, path = "/api/v1/providers/{provider}/order", tag = "admin", params(("provider" = String, Path)),
    request_body = OrderRequest,
    responses((status = 200, body = ProviderInfo), (status = 400, body = super::ErrorBody), (status = 404, body = super::ErrorBody)))]
async fn set_order(
    State(state): State<ApiState>,
    _: Admin,
    Path(provider): Path<String>,
    Body(req): Body<OrderRequest>,
) -> Result<Json<ProviderInfo>, ApiError> {
    let settings = state.runtime.settings();
    rules::known_provider(&settings.config, &provider).map_err(ApiError::NotFound)?;
    let roster = state.runtime.book.roster();
    let ids = rules::check_order(&settings.config, &roster, &provider, &req.profiles).map_err(ApiError::BadRequest)?;
    state.store.set_order(&provider, Some(&ids)).await.map_err(ApiError::from)?;
    state.runtime.book.set_order(&provider, Some(ids));
    Ok(Json(provider_info(&settings.config, &state.runtime.book.roster(), &provider).expect("known provider")))
}

/// Remove a provider's stored order
///
/// The config file's order, or round robin, applies again.
#[utoipa::path(delete, path = "/api/v1/providers/{provider}/order", tag = "admin", params(("provider" = String, Path)),
    responses((status = 200, body = ProviderInfo), (status = 404, body = super::ErrorBody)))]
async fn reset_order(
    State(state): State<ApiState>,
    _: Admin,
    Path(provider): Path<String>,
) -> Result<Json<ProviderInfo>, ApiError> {
    let settings = state.runtime.settings();
    rules::known_provider(&settings.config, &provider).map_err(ApiError::NotFound)?;
    state.store.set_order(&provider, None).await.map_err(ApiError::from)?;
    state.runtime.book.set_order(&provider, None);
    Ok(Json(provider_info(&settings.config, &state.runtime.book.roster(), &provider).expect("known provider")))
}

// ---------------------------------------------------------------------------------------------
// Models

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

fn resolved(config: &Config, model: Option<&str>, agent: Option<&str>) -> Result<Vec<String>, String> {
    let req = ChainRequest {
        model,
        agent_fallbacks: agent.and_then(|a| config.agents.get(a)).and_then(|a| a.fallbacks.as_deref()),
        fallback_override: FallbackOverride::Inherit,
        roll: 0,
        failover: config.failover.enabled,
    };
    config.chain(&req).map(|c| c.iter().map(|c| c.label()).collect()).map_err(|e| e.to_string())
}

/// Models, aliases and virtual models with their resolved chains
#[utoipa::path(get, path = "/api/v1/models", tag = "admin",
    responses((status = 200, body = ModelsInfo), (status = 401, body = super::ErrorBody), (status = 403, body = super::ErrorBody)))]
async fn list_models(State(state): State<ApiState>, _: Admin) -> Json<ModelsInfo> {
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
    responses((status = 200, body = ClearedModel), (status = 400, body = super::ErrorBody), (status = 404, body = super::ErrorBody)))]
async fn clear_model(
    State(state): State<ApiState>,
    _: Admin,
    Body(req): Body<ClearModelRequest>,
) -> Result<Json<ClearedModel>, ApiError> {
    let (provider, model) = crate::engine::chain::split_model_ref(&req.model)
        .ok_or_else(|| ApiError::BadRequest(format!("`{}` is not a provider/model reference", req.model)))?;
    if !state.runtime.settings().config.providers.contains_key(provider) {
        return Err(ApiError::NotFound(format!("provider {provider} is not configured")));
    }
    let cleared = state.runtime.book.end_model_cooldown(provider, model, state.runtime.clock.now());
    state.runtime.book.flush().await;
    Ok(Json(ClearedModel { model: req.model, cleared }))
}

// ---------------------------------------------------------------------------------------------
// Agents

#[derive(Serialize, ToSchema)]
pub struct AgentInfo {
    pub name: String,
    pub admin: bool,
    pub created_at: String,
    pub revoked_at: Option<String>,
}

impl From<crate::agents::Agent> for AgentInfo {
    fn from(a: crate::agents::Agent) -> AgentInfo {
        AgentInfo { name: a.name, admin: a.admin, created_at: time(a.created_at), revoked_at: a.revoked_at.map(time) }
    }
}

/// List agents (never their keys)
#[utoipa::path(get, path = "/api/v1/agents", tag = "admin",
    responses((status = 200, body = Vec<AgentInfo>), (status = 401, body = super::ErrorBody), (status = 403, body = super::ErrorBody)))]
async fn list_agents(State(state): State<ApiState>, _: Admin) -> Result<Json<Vec<AgentInfo>>, ApiError> {
    let agents = state.store.agents().await.map_err(ApiError::from)?;
    Ok(Json(agents.into_iter().map(AgentInfo::from).collect()))
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewAgentRequest {
    pub name: String,
    #[serde(default)]
    pub admin: bool,
}

#[derive(Serialize, ToSchema)]
pub struct NewAgent {
    pub agent: AgentInfo,
    /// The agent's key, shown this once: only its digest is stored.
    pub key: String,
}

/// Create an agent and its key
#[utoipa::path(post, path = "/api/v1/agents", tag = "admin", request_body = NewAgentRequest,
    responses((status = 201, body = NewAgent), (status = 400, body = super::ErrorBody), (status = 409, body = super::ErrorBody)))]
async fn create_agent(
    State(state): State<ApiState>,
    _: Admin,
    Body(req): Body<NewAgentRequest>,
) -> Result<(StatusCode, Json<NewAgent>), ApiError> {
    if !crate::agents::valid_name(&req.name) {
        return Err(ApiError::BadRequest(format!(
            "agent name `{}` is invalid: use a-z, 0-9, `-` and `_`, at most 64 characters",
            req.name
        )));
    }
    let key = crate::agents::new_key();
    let now = state.runtime.clock.now();
    let agent = state
        .store
        .create_agent(&req.name, &crate::agents::digest(&key), req.admin, now)
        .await
        .map_err(ApiError::from)?;
    state.agents.reload(state.store.as_ref()).await.map_err(ApiError::internal)?;
    tracing::info!(agent = %agent.name, admin = agent.admin, "agent created through the admin API");
    let key = secrecy::ExposeSecret::expose_secret(&key).to_string();
    Ok((StatusCode::CREATED, Json(NewAgent { agent: agent.into(), key })))
}

/// Revoke an agent's key
#[utoipa::path(delete, path = "/api/v1/agents/{name}", tag = "admin", params(("name" = String, Path)),
    responses((status = 204, description = "Revoked"), (status = 404, body = super::ErrorBody)))]
async fn revoke_agent(
    State(state): State<ApiState>,
    _: Admin,
    Path(name): Path<String>,
) -> Result<StatusCode, ApiError> {
    state.store.revoke_agent(&name, state.runtime.clock.now()).await.map_err(ApiError::from)?;
    state.agents.reload(state.store.as_ref()).await.map_err(ApiError::internal)?;
    state.sessions.end_agent(&name);
    tracing::info!(agent = %name, "agent revoked through the admin API");
    Ok(StatusCode::NO_CONTENT)
}

// ---------------------------------------------------------------------------------------------
// Usage and the audit log

/// A time: RFC 3339 or Unix milliseconds.
fn parse_time(raw: &str, what: &str) -> Result<Millis, ApiError> {
    if let Ok(ms) = raw.parse::<Millis>() {
        return Ok(ms);
    }
    chrono::DateTime::parse_from_rfc3339(raw)
        .map(|t| t.timestamp_millis())
        .map_err(|_| ApiError::BadRequest(format!("{what} `{raw}` is neither RFC 3339 nor Unix milliseconds")))
}

#[derive(Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct UsageParams {
    /// Start of the range (RFC 3339 or Unix ms); default 24 hours before `until`.
    pub since: Option<String>,
    /// End of the range, exclusive; default now.
    pub until: Option<String>,
}

#[derive(Serialize, ToSchema)]
pub struct UsageInfo {
    pub since: String,
    pub until: String,
    pub profiles: Vec<ProfileUsageInfo>,
}

#[derive(Serialize, ToSchema)]
pub struct ProfileUsageInfo {
    /// Attempts, successes, failures and tokens in the range, from the audit log.
    #[serde(flatten)]
    pub counts: ProfileUsage,
    /// The state now (absent for a profile removed since).
    pub status_text: Option<String>,
    /// usageStats now (absent for a profile removed since).
    #[schema(value_type = Option<Object>)]
    pub usage_stats: Option<UsageStats>,
}

/// Usage per profile
#[utoipa::path(get, path = "/api/v1/usage", tag = "admin", params(UsageParams),
    responses((status = 200, body = UsageInfo), (status = 400, body = super::ErrorBody)))]
async fn usage(
    State(state): State<ApiState>,
    _: Admin,
    Params(p): Params<UsageParams>,
) -> Result<Json<UsageInfo>, ApiError> {
    let now = state.runtime.clock.now();
    let until = p.until.as_deref().map(|u| parse_time(u, "until")).transpose()?.unwrap_or(now);
    let since = p.since.as_deref().map(|s| parse_time(s, "since")).transpose()?.unwrap_or(until - 86_400_000);
    if since >= until {
        return Err(ApiError::BadRequest("since must be before until".into()));
    }
    let counted = state.store.usage(since, until).await.map_err(ApiError::from)?;
    let roster = state.runtime.book.roster();
    let mut rows: BTreeMap<String, ProfileUsageInfo> = roster
        .views
        .iter()
        .map(|(id, v)| {
            let counts = ProfileUsage { profile_id: id.to_string(), ..Default::default() };
            let info = ProfileUsageInfo {
                counts,
                status_text: Some(Status::of(v, now).display(now)),
                usage_stats: Some(v.stats.clone()),
            };
            (id.to_string(), info)
        })
        .collect();
    for counts in counted {
        let removed = || ProfileUsageInfo { counts: ProfileUsage::default(), status_text: None, usage_stats: None };
        let id = counts.profile_id.clone();
        rows.entry(id).or_insert_with(removed).counts = counts;
    }
    Ok(Json(UsageInfo { since: time(since), until: time(until), profiles: rows.into_values().collect() }))
}

#[derive(Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct AuditParams {
    pub agent: Option<String>,
    pub request_id: Option<String>,
    /// A profile id (`provider:name`).
    pub profile: Option<String>,
    pub provider: Option<String>,
    /// The model as the provider knows it (`gpt-4.1`), or `provider/model`.
    pub model: Option<String>,
    /// A failure reason (SPEC §4), e.g. `rate_limit`.
    pub reason: Option<String>,
    /// `success`, `failure` or `skipped`.
    pub outcome: Option<String>,
    /// `started_at >= since` (RFC 3339 or Unix ms).
    pub since: Option<String>,
    /// `started_at < until` (RFC 3339 or Unix ms).
    pub until: Option<String>,
    /// Page size, 1 to 1000 (default 100).
    pub limit: Option<u32>,
    /// `next_cursor` of the previous page.
    pub cursor: Option<String>,
}

impl AuditParams {
    fn query(self) -> Result<AuditQuery, ApiError> {
        let limit = self.limit.unwrap_or(100);
        if !(1..=1000).contains(&limit) {
            return Err(ApiError::BadRequest(format!("limit {limit} is out of range (1 to 1000)")));
        }
        if let Some(p) = &self.profile {
            profile_id(p)?;
        }
        if let Some(r) = &self.reason {
            r.parse::<Reason>().map_err(|e| ApiError::BadRequest(e.to_string()))?;
        }
        if let Some(o) = self.outcome.as_deref().filter(|o| !matches!(*o, "success" | "failure" | "skipped")) {
            return Err(ApiError::BadRequest(format!("outcome `{o}` is not success, failure or skipped")));
        }
        let (mut provider, mut model) = (self.provider, self.model);
        if let Some((p, m)) = model.as_deref().and_then(crate::engine::chain::split_model_ref) {
            if provider.as_deref().is_some_and(|given| given != p) {
                return Err(ApiError::BadRequest(format!("model {p}/{m} contradicts provider {}", provider.unwrap())));
            }
            (provider, model) = (Some(p.to_string()), Some(m.to_string()));
        }
        let after = self
            .cursor
            .as_deref()
            .map(|c| {
                let mut parts = c.splitn(3, '.');
                let bad = || ApiError::BadRequest(format!("cursor `{c}` is not a next_cursor of this API"));
                let at = parts.next().and_then(|p| p.parse::<Millis>().ok()).ok_or_else(bad)?;
                let seq = parts.next().and_then(|p| p.parse::<i64>().ok()).ok_or_else(bad)?;
                let id = parts.next().filter(|p| !p.is_empty()).ok_or_else(bad)?;
                Ok::<_, ApiError>((at, id.to_string(), seq))
            })
            .transpose()?;
        Ok(AuditQuery {
            agent: self.agent,
            request_id: self.request_id,
            profile: self.profile,
            provider,
            model,
            reason: self.reason,
            outcome: self.outcome,
            since: self.since.as_deref().map(|s| parse_time(s, "since")).transpose()?,
            until: self.until.as_deref().map(|u| parse_time(u, "until")).transpose()?,
            after,
            // One more than asked, to tell whether a next page exists.
            limit: limit + 1,
        })
    }
}

#[derive(Serialize, ToSchema)]
pub struct AttemptPage {
    pub items: Vec<AttemptRecord>,
    /// Pass as `cursor` for the next (older) page; absent on the last page.
    pub next_cursor: Option<String>,
}

#[derive(Serialize, ToSchema)]
pub struct RequestPage {
    pub items: Vec<RequestRecord>,
    /// Pass as `cursor` for the next (older) page; absent on the last page.
    pub next_cursor: Option<String>,
}

fn page<T>(mut rows: Vec<T>, limit: u32, key: impl Fn(&T) -> String) -> (Vec<T>, Option<String>) {
    if rows.len() as u32 > limit - 1 {
        rows.truncate(limit as usize - 1);
        let cursor = rows.last().map(key);
        return (rows, cursor);
    }
    (rows, None)
}

/// The attempts log, newest first
#[utoipa::path(get, path = "/api/v1/attempts", tag = "admin", params(AuditParams),
    responses((status = 200, body = AttemptPage), (status = 400, body = super::ErrorBody)))]
async fn list_attempts(
    State(state): State<ApiState>,
    _: Admin,
    Params(p): Params<AuditParams>,
) -> Result<Json<AttemptPage>, ApiError> {
    let q = p.query()?;
    state.runtime.audit.flush_within(std::time::Duration::from_secs(2)).await;
    let rows = state.store.attempts(&q).await.map_err(ApiError::from)?;
    let (items, next_cursor) = page(rows, q.limit, |r| format!("{}.{}.{}", r.started_at, r.seq, r.request_id));
    Ok(Json(AttemptPage { items, next_cursor }))
}

/// The requests log, newest first
///
/// The profile, provider, model, reason and outcome filters select requests with at least one
/// matching attempt.
#[utoipa::path(get, path = "/api/v1/requests", tag = "admin", params(AuditParams),
    responses((status = 200, body = RequestPage), (status = 400, body = super::ErrorBody)))]
async fn list_requests(
    State(state): State<ApiState>,
    _: Admin,
    Params(p): Params<AuditParams>,
) -> Result<Json<RequestPage>, ApiError> {
    let q = p.query()?;
    state.runtime.audit.flush_within(std::time::Duration::from_secs(2)).await;
    let rows = state.store.requests(&q).await.map_err(ApiError::from)?;
    let (items, next_cursor) = page(rows, q.limit, |r| format!("{}.0.{}", r.started_at, r.id));
    Ok(Json(RequestPage { items, next_cursor }))
}
