//! `POST /api/v1/backup`: a consistent copy of the live SQLite database, beside it
//! (docs/operations.md, "Backups").

use crate::api::{Admin, ApiError, ApiState};
use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use serde::Serialize;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

pub fn routes() -> OpenApiRouter<ApiState> {
    OpenApiRouter::new().routes(routes!(backup))
}

#[derive(Serialize, ToSchema)]
pub struct Backup {
    /// The copy: `rota-backup-<UTC time>.db` in the database's folder, mode 0600.
    pub file: String,
}

/// Back up the SQLite database
///
/// Writes a consistent copy of the live database beside it while rota serves; its secrets stay
/// sealed with the same master key. On PostgreSQL, 400: use `pg_dump`.
#[utoipa::path(post, path = "/api/v1/backup", tag = "admin",
    responses((status = 201, body = Backup), (status = 400, body = crate::api::ErrorBody),
        (status = 401, body = crate::api::ErrorBody), (status = 403, body = crate::api::ErrorBody)))]
async fn backup(State(state): State<ApiState>, Admin(actor): Admin) -> Result<(StatusCode, Json<Backup>), ApiError> {
    let settings = state.runtime.settings();
    let target = crate::store::DatabaseTarget::of(&settings.config).map_err(|e| ApiError::internal(e.0.join("; ")))?;
    let crate::store::DatabaseTarget::Sqlite(db) = target else {
        return Err(ApiError::BadRequest(
            "a PostgreSQL database is backed up with pg_dump (docs/operations.md, \"Backups\")".into(),
        ));
    };
    let at = chrono::DateTime::from_timestamp_millis(state.runtime.clock.now()).unwrap_or_default();
    let name = format!("rota-backup-{}.db", at.format("%Y%m%dT%H%M%S%3fZ"));
    let file = db.parent().unwrap_or(std::path::Path::new(".")).join(name);
    state.store.backup(&file).await.map_err(|e| match e {
        crate::store::StoreError::Unsupported(why) => ApiError::BadRequest(why),
        other => ApiError::from(other),
    })?;
    let file = file.display().to_string();
    tracing::info!(%file, "database backed up through the admin API");
    state.record(&actor, "database.backup", Some(&file), (None, Some(serde_json::json!({"file": file})))).await?;
    Ok((StatusCode::CREATED, Json(Backup { file })))
}
