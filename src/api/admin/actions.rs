//! `/api/v1/admin-actions`: the changes made through the admin API and the console, with who
//! made them (docs/operations.md, "Admin actions").

use super::Params;
use crate::api::{ApiError, ApiState, Viewer};
use crate::status::time;
use axum::Json;
use axum::extract::State;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

pub fn routes() -> OpenApiRouter<ApiState> {
    OpenApiRouter::new().routes(routes!(list_actions))
}

#[derive(Serialize, ToSchema)]
pub struct ActionInfo {
    /// RFC 3339.
    pub at: String,
    /// The agent's name, the person's verified subject (`issuer sub`) or the CLI's OS user.
    pub actor: String,
    /// A person's verified email.
    pub actor_email: Option<String>,
    /// `agent`, `person` or `cli`.
    pub actor_kind: String,
    /// `viewer`, `operator` or `admin`.
    pub role: String,
    /// `profile.add`, `profile.enable`, `agent.create`, …
    pub action: String,
    pub target: Option<String>,
    /// The value before (`null`: it did not exist) and after (`null`: it no longer exists).
    #[schema(value_type = Object)]
    pub before: Option<serde_json::Value>,
    #[schema(value_type = Object)]
    pub after: Option<serde_json::Value>,
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ActionsQuery {
    /// How many, newest first: 1 to 1,000 (default 100).
    pub limit: Option<i64>,
}

/// The changes made through the admin API and the console, newest first
#[utoipa::path(get, path = "/api/v1/admin-actions", tag = "admin", params(ActionsQuery),
    responses((status = 200, body = Vec<ActionInfo>), (status = 400, body = crate::api::ErrorBody),
        (status = 401, body = crate::api::ErrorBody), (status = 403, body = crate::api::ErrorBody)))]
async fn list_actions(
    State(state): State<ApiState>,
    _: Viewer,
    Params(q): Params<ActionsQuery>,
) -> Result<Json<Vec<ActionInfo>>, ApiError> {
    let limit = q.limit.unwrap_or(100);
    if !(1..=1000).contains(&limit) {
        return Err(ApiError::BadRequest(format!("limit = {limit}: give 1 to 1000")));
    }
    let actions = state.store.admin_actions(limit).await.map_err(ApiError::from)?;
    Ok(Json(
        actions
            .into_iter()
            .map(|a| ActionInfo {
                at: time(a.at),
                actor: a.actor,
                actor_email: a.actor_email,
                actor_kind: a.actor_kind,
                role: a.role,
                action: a.action,
                target: a.target,
                before: a.before,
                after: a.after,
            })
            .collect(),
    ))
}
