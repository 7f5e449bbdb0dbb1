//! `/api/v1/agents`: list, create (the key is shown once) and revoke agent keys.

use crate::api::{Admin, ApiError, ApiState, Body};
use crate::status::time;
use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

pub fn routes() -> OpenApiRouter<ApiState> {
    OpenApiRouter::new().routes(routes!(list_agents, create_agent)).routes(routes!(revoke_agent))
}

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
    responses((status = 200, body = Vec<AgentInfo>), (status = 401, body = crate::api::ErrorBody), (status = 403, body = crate::api::ErrorBody)))]
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
    responses((status = 201, body = NewAgent), (status = 400, body = crate::api::ErrorBody), (status = 409, body = crate::api::ErrorBody)))]
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
        .create_agent(&req.name, &crate::agents::digest(&key), req.admin, &Default::default(), now)
        .await
        .map_err(ApiError::from)?;
    state.agents.reload(state.store.as_ref()).await.map_err(ApiError::internal)?;
    tracing::info!(agent = %agent.name, admin = agent.admin, "agent created through the admin API");
    let key = secrecy::ExposeSecret::expose_secret(&key).to_string();
    Ok((StatusCode::CREATED, Json(NewAgent { agent: agent.into(), key })))
}

/// Revoke an agent's key
#[utoipa::path(delete, path = "/api/v1/agents/{name}", tag = "admin", params(("name" = String, Path)),
    responses((status = 204, description = "Revoked"), (status = 404, body = crate::api::ErrorBody)))]
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
