//! `/api/v1/agents`: list (with each agent's limits and its use of them), create (the key is
//! shown once), change the limits of, revoke agent keys, and each agent's setup lines.

use super::Params;
use crate::agents::{Agent, Limits};
use crate::api::setup;
use crate::api::{Admin, ApiError, ApiState, Body, Viewer};
use crate::config::Config;
use crate::status::time;
use crate::store::{AgentUsage, LimitsPatch};
use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use serde::{Deserialize, Deserializer, Serialize};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

pub fn routes() -> OpenApiRouter<ApiState> {
    OpenApiRouter::new()
        .routes(routes!(list_agents, create_agent))
        .routes(routes!(revoke_agent, change_limits))
        .routes(routes!(agent_setup))
}

#[derive(Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct SetupQuery {
    /// The address agents reach rota at (an `http(s)` origin); default `server.public_url`,
    /// else the listen address.
    pub base: Option<String>,
}

#[derive(Serialize, ToSchema)]
pub struct AgentSetup {
    pub agent: String,
    pub base: String,
    /// The model the lines name: the first the agent may ask for, else the default chain's
    /// primary; `null` when neither is set (the lines then say `PROVIDER/MODEL`).
    pub model: Option<String>,
    /// The variable the lines read the agent's key from.
    pub key_var: &'static str,
    pub clients: Vec<setup::Setup>,
}

/// The lines that point an agent's clients at rota
#[utoipa::path(get, path = "/api/v1/agents/{name}/setup", tag = "admin", params(("name" = String, Path), SetupQuery),
    responses((status = 200, body = AgentSetup), (status = 400, body = crate::api::ErrorBody), (status = 404, body = crate::api::ErrorBody)))]
async fn agent_setup(
    State(state): State<ApiState>,
    _: Viewer,
    Path(name): Path<String>,
    Params(q): Params<SetupQuery>,
) -> Result<Json<AgentSetup>, ApiError> {
    let settings = state.runtime.settings();
    let base = setup::base_or(&settings.config, q.base.as_deref()).map_err(ApiError::BadRequest)?;
    let agents = state.store.agents().await?;
    let Some(agent) = agents.into_iter().find(|a| a.name == name && a.revoked_at.is_none()) else {
        return Err(ApiError::NotFound(format!("no active agent is named `{}`", name.escape_default())));
    };
    let model = setup::model(&settings.config, &agent);
    let clients = setup::lines(&base, model.as_deref());
    Ok(Json(AgentSetup { agent: agent.name, base, model, key_var: setup::KEY_VAR, clients }))
}

#[derive(Serialize, ToSchema)]
pub struct AgentInfo {
    pub name: String,
    pub admin: bool,
    pub created_at: String,
    pub revoked_at: Option<String>,
    /// The limits in force: each key of the config file's `[agents.NAME]`, else the stored value.
    pub limits: Limits,
    /// The limits the config file sets (they win over the stored ones, which `PATCH` changes).
    pub limits_from_config: Vec<String>,
    /// The models, aliases and virtual models it may ask for (`null`: any): the config file's
    /// `[agents.NAME] models`, else the stored list.
    pub models: Option<Vec<String>>,
    /// Whether `models` comes from the config file (then `PATCH` changes only the stored list).
    pub models_from_config: bool,
    /// This minute's admitted requests (counted only while `requests_per_minute` is set) and
    /// today's (UTC) tokens and cost, shared by every server on the database.
    pub usage: AgentUsage,
}

impl AgentInfo {
    fn new(a: Agent, config: &Config, usage: AgentUsage) -> AgentInfo {
        let limits = config.agent_limits(&a);
        let from_config = config.agents.get(&a.name).map(|s| s.limits().keys()).unwrap_or_default();
        AgentInfo {
            models: config.agent_models(&a).map(<[String]>::to_vec),
            models_from_config: config.agents.get(&a.name).is_some_and(|s| s.models.is_some()),
            limits,
            limits_from_config: from_config.into_iter().map(str::to_string).collect(),
            usage,
            name: a.name,
            admin: a.admin,
            created_at: time(a.created_at),
            revoked_at: a.revoked_at.map(time),
        }
    }
}

/// What an admin action records of an agent: its role, limits and models (never its key).
fn summary(a: &AgentInfo) -> serde_json::Value {
    serde_json::json!({"admin": a.admin, "limits": a.limits, "models": a.models})
}

/// The agents' use of their limits now.
async fn usage(
    state: &ApiState,
    agent: Option<&str>,
) -> Result<std::collections::HashMap<String, AgentUsage>, ApiError> {
    let now = state.runtime.clock.now();
    let (minute, day) = (crate::agents::minute_start(now), crate::agents::day_start(now));
    state.store.agent_usage(agent, minute, day).await.map_err(ApiError::from)
}

/// List agents (never their keys), with their limits and use
#[utoipa::path(get, path = "/api/v1/agents", tag = "admin",
    responses((status = 200, body = Vec<AgentInfo>), (status = 401, body = crate::api::ErrorBody), (status = 403, body = crate::api::ErrorBody)))]
async fn list_agents(State(state): State<ApiState>, _: Viewer) -> Result<Json<Vec<AgentInfo>>, ApiError> {
    let agents = state.store.agents().await.map_err(ApiError::from)?;
    let mut used = usage(&state, None).await?;
    let settings = state.runtime.settings();
    Ok(Json(
        agents
            .into_iter()
            .map(|a| {
                let u = used.remove(&a.name).unwrap_or_default();
                AgentInfo::new(a, &settings.config, u)
            })
            .collect(),
    ))
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewAgentRequest {
    pub name: String,
    #[serde(default)]
    pub admin: bool,
    /// Requests per clock-aligned minute, at least 1.
    pub requests_per_minute: Option<i64>,
    /// Input plus output tokens per UTC day, at least 1.
    pub tokens_per_day: Option<i64>,
    /// USD per UTC day, above 0.
    pub cost_per_day: Option<f64>,
    /// The models, aliases and virtual models it may ask for; left out: any.
    pub models: Option<Vec<String>>,
}

#[derive(Serialize, ToSchema)]
pub struct NewAgent {
    pub agent: AgentInfo,
    /// The agent's key, shown this once: only its digest is stored.
    pub key: String,
}

/// Every limit out of range and every model the config does not serve, as one bad request.
fn checked(limits: Limits, models: Option<&[String]>, config: &Config) -> Result<Limits, ApiError> {
    let mut problems = limits.problems("");
    if let Some(models) = models {
        problems.extend(config.models_problems(models).into_iter().map(|e| format!("models: {e}")));
    }
    if problems.is_empty() { Ok(limits) } else { Err(ApiError::BadRequest(problems.join("; "))) }
}

/// Create an agent and its key
#[utoipa::path(post, path = "/api/v1/agents", tag = "admin", request_body = NewAgentRequest,
    responses((status = 201, body = NewAgent), (status = 400, body = crate::api::ErrorBody), (status = 409, body = crate::api::ErrorBody)))]
async fn create_agent(
    State(state): State<ApiState>,
    Admin(actor): Admin,
    Body(req): Body<NewAgentRequest>,
) -> Result<(StatusCode, Json<NewAgent>), ApiError> {
    if !crate::agents::valid_name(&req.name) {
        return Err(ApiError::BadRequest(format!(
            "agent name `{}` is invalid: use a-z, 0-9, `-` and `_`, at most 64 characters",
            req.name
        )));
    }
    let limits = Limits {
        requests_per_minute: req.requests_per_minute,
        tokens_per_day: req.tokens_per_day,
        cost_per_day: req.cost_per_day,
    };
    let limits = checked(limits, req.models.as_deref(), &state.runtime.settings().config)?;
    let key = crate::agents::new_key();
    let now = state.runtime.clock.now();
    let agent = state
        .store
        .create_agent(&req.name, &crate::agents::digest(&key), req.admin, (&limits, req.models.as_deref()), now)
        .await
        .map_err(ApiError::from)?;
    state.agents.reload(state.store.as_ref()).await.map_err(ApiError::internal)?;
    tracing::info!(agent = %agent.name, admin = agent.admin, "agent created through the admin API");
    let key = secrecy::ExposeSecret::expose_secret(&key).to_string();
    let used = usage(&state, Some(&agent.name)).await?.remove(&agent.name).unwrap_or_default();
    let agent = AgentInfo::new(agent, &state.runtime.settings().config, used);
    state.record(&actor, "agent.create", Some(&agent.name), (None, Some(summary(&agent)))).await?;
    Ok((StatusCode::CREATED, Json(NewAgent { agent, key })))
}

/// A field that may be absent (`None`), `null` (`Some(None)`) or a value.
fn present<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Option<Option<T>>, D::Error> {
    Option::<T>::deserialize(d).map(Some)
}

/// The stored limits to change: a field left out stays as it is, `null` removes the limit.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct LimitsChange {
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<i64>)]
    pub requests_per_minute: Option<Option<i64>>,
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<i64>)]
    pub tokens_per_day: Option<Option<i64>>,
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<f64>)]
    pub cost_per_day: Option<Option<f64>>,
    /// The models it may ask for; `null`: any.
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<Vec<String>>)]
    pub models: Option<Option<Vec<String>>>,
}

/// Change an agent's stored limits
///
/// A limit the config file's `[agents.NAME]` sets stays in force over the stored one
/// (`limits_from_config` lists them). Every server applies the change within a second.
#[utoipa::path(patch, path = "/api/v1/agents/{name}", tag = "admin", params(("name" = String, Path)), request_body = LimitsChange,
    responses((status = 200, body = AgentInfo), (status = 400, body = crate::api::ErrorBody), (status = 404, body = crate::api::ErrorBody)))]
async fn change_limits(
    State(state): State<ApiState>,
    Admin(actor): Admin,
    Path(name): Path<String>,
    Body(req): Body<LimitsChange>,
) -> Result<Json<AgentInfo>, ApiError> {
    let limits = Limits {
        requests_per_minute: req.requests_per_minute.flatten(),
        tokens_per_day: req.tokens_per_day.flatten(),
        cost_per_day: req.cost_per_day.flatten(),
    };
    checked(limits, req.models.as_ref().and_then(Option::as_deref), &state.runtime.settings().config)?;
    let patch = LimitsPatch {
        requests_per_minute: req.requests_per_minute,
        tokens_per_day: req.tokens_per_day,
        cost_per_day: req.cost_per_day,
        models: req.models,
    };
    let config = &state.runtime.settings().config;
    let before = state.store.agents().await.map_err(ApiError::from)?.into_iter().find(|a| a.name == name);
    let before = before.map(|a| summary(&AgentInfo::new(a, config, AgentUsage::default())));
    let agent = state.store.set_agent_limits(&name, &patch).await.map_err(ApiError::from)?;
    state.agents.reload(state.store.as_ref()).await.map_err(ApiError::internal)?;
    tracing::info!(agent = %agent.name, "agent's limits changed through the admin API");
    let used = usage(&state, Some(&agent.name)).await?.remove(&agent.name).unwrap_or_default();
    let after = AgentInfo::new(agent, config, used);
    state.record(&actor, "agent.limits", Some(&after.name), (before, Some(summary(&after)))).await?;
    Ok(Json(after))
}

/// Revoke an agent's key
#[utoipa::path(delete, path = "/api/v1/agents/{name}", tag = "admin", params(("name" = String, Path)),
    responses((status = 204, description = "Revoked"), (status = 404, body = crate::api::ErrorBody)))]
async fn revoke_agent(
    State(state): State<ApiState>,
    Admin(actor): Admin,
    Path(name): Path<String>,
) -> Result<StatusCode, ApiError> {
    state.store.revoke_agent(&name, state.runtime.clock.now()).await.map_err(ApiError::from)?;
    let revoked = (Some(serde_json::json!({"revoked": false})), Some(serde_json::json!({"revoked": true})));
    state.record(&actor, "agent.revoke", Some(&name), revoked).await?;
    state.agents.reload(state.store.as_ref()).await.map_err(ApiError::internal)?;
    state.sessions.end_agent(&name);
    tracing::info!(agent = %name, "agent revoked through the admin API");
    Ok(StatusCode::NO_CONTENT)
}
