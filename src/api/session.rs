//! Console sign-in: an admin key buys a session cookie and a CSRF token.

use super::{ApiError, Body};
use crate::server::AppState;
use crate::web::{self, COOKIE};
use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(sign_in, current, sign_out))
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SignIn {
    /// An admin agent's key (`rota agents create NAME --admin`).
    pub key: String,
}

#[derive(Serialize, ToSchema)]
pub struct SessionInfo {
    pub agent: String,
    /// Send it as `x-csrf-token` with every POST, PUT and DELETE of this session.
    pub csrf: String,
}

/// Sign in to the console
///
/// Sets the session cookie (`HttpOnly; SameSite=Strict`, and `Secure` when `server.public_url`
/// is https). The session ends after `server.session_idle` unused, 12 hours at most.
#[utoipa::path(post, path = "/api/v1/session", tag = "console", security(()), request_body = SignIn,
    responses((status = 200, body = SessionInfo), (status = 400, body = super::ErrorBody),
        (status = 401, body = super::ErrorBody), (status = 403, body = super::ErrorBody)))]
async fn sign_in(State(state): State<AppState>, Body(req): Body<SignIn>) -> Result<Response, ApiError> {
    let agent = state
        .agents
        .find(req.key.trim())
        .ok_or_else(|| ApiError::new(401, "unauthorized", "invalid or revoked agent key"))?;
    if !agent.admin {
        return Err(ApiError::new(403, "forbidden", format!("agent {} is not an admin", agent.name)));
    }
    let settings = state.engine.settings();
    let server = &settings.config.server;
    let (token, session) = state.sessions.create(agent, state.engine.clock.now(), server.session_idle);
    tracing::info!(agent = %session.agent.name, "console sign-in");
    let body = SessionInfo { agent: session.agent.name, csrf: session.csrf };
    Ok(([(header::SET_COOKIE, web::set_cookie(Some(&token), server.secure_cookies()))], Json(body)).into_response())
}

/// The current console session
#[utoipa::path(get, path = "/api/v1/session", tag = "console", security(()),
    responses((status = 200, body = SessionInfo), (status = 401, body = super::ErrorBody)))]
async fn current(State(state): State<AppState>, headers: HeaderMap) -> Result<Json<SessionInfo>, ApiError> {
    let s = state
        .session(&headers)
        .ok_or_else(|| ApiError::new(401, "unauthorized", format!("no console session (cookie {COOKIE})")))?;
    Ok(Json(SessionInfo { agent: s.agent.name, csrf: s.csrf }))
}

/// Sign out
#[utoipa::path(delete, path = "/api/v1/session", tag = "console", security(()),
    responses((status = 204, description = "Signed out"), (status = 401, body = super::ErrorBody), (status = 403, body = super::ErrorBody)))]
async fn sign_out(State(state): State<AppState>, headers: HeaderMap) -> Result<Response, ApiError> {
    let s = state.session(&headers).ok_or_else(|| ApiError::new(401, "unauthorized", "no console session"))?;
    if !s.csrf_ok(headers.get("x-csrf-token").and_then(|v| v.to_str().ok())) {
        return Err(ApiError::new(403, "csrf", "missing or wrong x-csrf-token"));
    }
    state.sessions.end(&s.id);
    let secure = state.engine.settings().config.server.secure_cookies();
    Ok((StatusCode::NO_CONTENT, [(header::SET_COOKIE, web::set_cookie(None, secure))]).into_response())
}
