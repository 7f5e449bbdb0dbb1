//! REST under `/api/v1` (SPEC §8): leases for agents that call providers themselves, and the
//! admin API. Every route is registered through `OpenApiRouter`, so the OpenAPI document at
//! `/api/v1/openapi.json` lists exactly the routes served.

pub mod admin;
pub mod leases;
pub mod oauth;
pub mod session;

use crate::agents::Agent;
use crate::server::AppState;
use axum::extract::rejection::JsonRejection;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Json, Router};
use serde::Serialize;
use serde::de::DeserializeOwned;
use utoipa::openapi::security::{ApiKey, ApiKeyValue, HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi, ToSchema};
use utoipa_axum::router::OpenApiRouter;

#[derive(OpenApi)]
#[openapi(
    info(title = "rota", description = "Leases and administration of an auth-profile rotation gateway."),
    modifiers(&Security),
    security(("bearer" = []), ("x-api-key" = [])),
    tags(
        (name = "leases", description = "A credential for agents that call providers themselves"),
        (name = "admin", description = "Profiles, agents, providers, models, usage and the audit log (admin agents only)"),
        (name = "console", description = "Console sign-in and OAuth logins (admin)"),
        (name = "meta", description = "This document"),
    )
)]
struct Doc;

struct Security;

impl Modify for Security {
    fn modify(&self, api: &mut utoipa::openapi::OpenApi) {
        let c = api.components.get_or_insert_with(Default::default);
        c.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
        c.add_security_scheme("x-api-key", SecurityScheme::ApiKey(ApiKey::Header(ApiKeyValue::new("x-api-key"))));
    }
}

/// The `/api/v1` routes and the OpenAPI document describing them.
pub fn router() -> Router<AppState> {
    let (router, doc) = OpenApiRouter::with_openapi(Doc::openapi())
        .routes(utoipa_axum::routes!(openapi))
        .merge(leases::routes())
        .merge(admin::routes())
        .merge(session::routes())
        .merge(oauth::routes())
        .split_for_parts();
    let _ = DOCUMENT.set(serde_json::to_value(&doc).expect("the OpenAPI document serializes"));
    router
}

static DOCUMENT: std::sync::OnceLock<serde_json::Value> = std::sync::OnceLock::new();

/// This OpenAPI document
#[utoipa::path(get, path = "/api/v1/openapi.json", tag = "meta", security(()),
    responses((status = 200, description = "The OpenAPI 3.1 document of /api/v1", content_type = "application/json", body = Object)))]
async fn openapi() -> Json<serde_json::Value> {
    Json(DOCUMENT.get().cloned().unwrap_or_default())
}

/// The body of every error answer of `/api/v1`.
#[derive(Serialize, ToSchema)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Serialize, ToSchema)]
pub struct ErrorDetail {
    /// A stable code: `unauthorized`, `forbidden`, `bad_request`, `not_found`, `conflict`,
    /// `lease_expired`, `lease_reported`, `all_models_failed`, `not_retryable`, …
    #[serde(rename = "type")]
    pub kind: String,
    pub message: String,
    /// The failure reason when the error comes from a provider.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// An error answer: status, stable code and a message that says what to do.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub kind: &'static str,
    pub message: String,
    pub reason: Option<String>,
    pub retry_after: Option<u64>,
}

impl ApiError {
    pub fn new(status: u16, kind: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            kind,
            message: message.into(),
            reason: None,
            retry_after: None,
        }
    }
    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(400, "bad_request", message)
    }
    pub fn not_found(message: impl Into<String>) -> ApiError {
        ApiError::new(404, "not_found", message)
    }
    pub fn conflict(message: impl Into<String>) -> ApiError {
        ApiError::new(409, "conflict", message)
    }
    pub fn internal(e: impl std::fmt::Display) -> ApiError {
        tracing::error!(error = %e, "admin API: internal error");
        ApiError::new(500, "internal", "internal error; the server log has the details")
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body =
            ErrorBody { error: ErrorDetail { kind: self.kind.into(), message: self.message, reason: self.reason } };
        let mut resp = (self.status, Json(body)).into_response();
        if let Some(secs) = self.retry_after {
            resp.headers_mut().insert("retry-after", HeaderValue::from(secs));
        }
        resp
    }
}

/// The agent that sent the request (any active agent key).
pub struct Caller(pub Agent);

impl FromRequestParts<AppState> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Self::Rejection> {
        let Some(key) = crate::gateway::presented_key(&parts.headers) else {
            return Err(ApiError::new(
                401,
                "unauthorized",
                "missing agent key: send `Authorization: Bearer rk_…` or `x-api-key: rk_…`",
            ));
        };
        state
            .agents
            .find(key)
            .map(Caller)
            .ok_or_else(|| ApiError::new(401, "unauthorized", "invalid or revoked agent key"))
    }
}

/// An admin: an admin agent's key (`rota agents create NAME --admin`), or a console session;
/// a session's POST, PUT and DELETE requests must carry its CSRF token in `x-csrf-token`.
pub struct Admin(pub Agent);

impl FromRequestParts<AppState> for Admin {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Self::Rejection> {
        if crate::gateway::presented_key(&parts.headers).is_none()
            && let Some(session) = state.session(&parts.headers)
        {
            let safe = matches!(parts.method, axum::http::Method::GET | axum::http::Method::HEAD);
            let presented = parts.headers.get("x-csrf-token").and_then(|v| v.to_str().ok());
            if !safe && !session.csrf_ok(presented) {
                return Err(ApiError::new(
                    403,
                    "csrf",
                    "missing or wrong x-csrf-token: a console session's changes carry the token GET /api/v1/session gives",
                ));
            }
            return Ok(Admin(session.agent));
        }
        let Caller(agent) = Caller::from_request_parts(parts, state).await?;
        if !agent.admin {
            return Err(ApiError::new(
                403,
                "forbidden",
                format!(
                    "agent {} is not an admin; the admin API needs a key from `rota agents create NAME --admin`",
                    agent.name
                ),
            ));
        }
        Ok(Admin(agent))
    }
}

/// A JSON request body whose errors are answered in the API's error format.
pub struct Body<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for Body<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        match Json::<T>::from_request(req, state).await {
            Ok(Json(v)) => Ok(Body(v)),
            Err(JsonRejection::JsonDataError(e)) => {
                Err(ApiError::bad_request(format!("invalid request body: {}", e.body_text())))
            }
            Err(e) => Err(ApiError::bad_request(format!("invalid request body: {}", e.body_text()))),
        }
    }
}
