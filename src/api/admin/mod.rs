//! The admin API (docs/api.md): profiles, order, providers, models, agents, usage, the audit log,
//! the admin actions, alerts and backups.
//! Every change is written to the store and applied to the running book at once. Secrets are
//! write-only: no answer here carries one (a new agent's key is shown once, when created).

mod actions;
mod agents;
mod alerts;
mod audit;
mod backup;
mod models;
mod profiles;
mod providers;
mod series;

use super::{ApiError, ApiState};
use crate::engine::ProfileId;
use axum::extract::{FromRequestParts, Query};
use utoipa_axum::router::OpenApiRouter;

/// Every admin route, each resource's from its own module.
pub fn routes() -> OpenApiRouter<ApiState> {
    OpenApiRouter::new()
        .merge(profiles::routes())
        .merge(providers::routes())
        .merge(models::routes())
        .merge(agents::routes())
        .merge(audit::routes())
        .merge(series::routes())
        .merge(actions::routes())
        .merge(backup::routes())
        .merge(alerts::routes())
}

/// Query parameters whose errors are answered in the API's error format.
#[derive(FromRequestParts)]
#[from_request(via(Query), rejection(ApiError))]
pub struct Params<T>(pub T);

fn profile_id(raw: &str) -> Result<ProfileId, ApiError> {
    raw.parse().map_err(|e| ApiError::BadRequest(format!("{e}")))
}
