//! REST under `/api/v1` (docs/api.md): leases for agents that call providers themselves, and the
//! admin API. Every route is registered through `OpenApiRouter`, so the OpenAPI document at
//! `/api/v1/openapi.json` lists exactly the routes served.

pub mod admin;
pub mod leases;
pub mod oauth;
pub mod roles;
pub mod session;
pub mod setup;
pub mod sso;

pub use roles::{Actor, Admin, Operator, Role, Viewer};

use oauth::Logins;
use session::{Session, Sessions};

use crate::access::{AgentCache, presented_key};
use crate::agents::Agent;
use crate::gateway::upstream::Upstream;
use crate::leases::Leases;
use crate::secrets::MasterKey;
use crate::store::{Store, StoreError};
use crate::walk::Runtime;
use axum::extract::rejection::{JsonRejection, QueryRejection};
use axum::extract::{FromRequest, FromRequestParts};
use axum::http::request::Parts;
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde::Serialize;
use std::sync::Arc;
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
        (name = "admin", description = "Profiles, agents, providers, models, usage, the audit log and the admin actions (by role: a viewer reads, an operator runs the accounts, an admin manages agents; admin agent keys are admins)"),
        (name = "console", description = "Console sign-in and OAuth logins (an operator's)"),
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

/// What the API's handlers and the console share; cheap to clone.
#[derive(Clone)]
pub struct ApiState {
    pub runtime: Arc<Runtime>,
    pub upstream: Upstream,
    pub agents: Arc<AgentCache>,
    pub leases: Arc<Leases>,
    pub store: Arc<dyn Store>,
    pub key: Arc<MasterKey>,
    pub sessions: Arc<Sessions>,
    pub logins: Arc<Logins>,
    pub sso: Arc<sso::SsoLogins>,
}

impl ApiState {
    /// Records a change `actor` made (docs/operations.md, "Admin actions"): the value before
    /// (`None`: it did not exist) and after (`None`: it no longer exists).
    pub async fn record(
        &self,
        actor: &Actor,
        action: &str,
        target: Option<&str>,
        (before, after): (Option<serde_json::Value>, Option<serde_json::Value>),
    ) -> Result<(), ApiError> {
        let a = crate::store::AdminAction {
            at: self.runtime.clock.now(),
            actor: actor.name.clone(),
            actor_email: actor.email.clone(),
            actor_kind: actor.kind().into(),
            role: actor.role.as_str().into(),
            action: action.into(),
            target: target.map(str::to_string),
            before,
            after,
        };
        self.store.record_action(&a).await.map_err(ApiError::internal)
    }

    /// The request's console session, if it is live and its agent is still an active admin, or
    /// its person still has a role under the config in force (which the session then carries).
    pub fn session(&self, headers: &axum::http::HeaderMap) -> Option<Session> {
        let settings = self.runtime.settings();
        let sso = settings.config.console.sso.as_ref();
        let role = |p: &roles::Person| sso.and_then(|sso| roles::role_of(sso, p));
        self.sessions.find(headers, self.runtime.clock.now(), |a| self.agents.is_active_admin(a), role)
    }
}

/// The `/api/v1` routes and the OpenAPI document describing them, the console page and the
/// OAuth callback.
pub fn router() -> Router<ApiState> {
    let (router, doc) = OpenApiRouter::with_openapi(Doc::openapi())
        .routes(utoipa_axum::routes!(openapi))
        .merge(leases::routes())
        .merge(admin::routes())
        .merge(session::routes())
        .merge(oauth::routes())
        .split_for_parts();
    let _ = DOCUMENT.set(serde_json::to_value(&doc).expect("the OpenAPI document serializes"));
    // The browser's pages that need a session or a login: outside `/api/v1` and its document.
    let pages = Router::new()
        .route("/ui/", get(session::console))
        .route("/ui/sso", get(sso::start))
        .route("/oauth/callback", get(oauth::callback))
        .route("/oauth/go", get(oauth::go))
        .layer(axum::middleware::map_response(crate::web::default_csp));
    router.merge(pages)
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

/// An error answer of `/api/v1`: each variant is one stable `type` with its status, and a
/// message that says what to do.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// 400 `bad_request`: a malformed body, field or query.
    #[error("{0}")]
    BadRequest(String),
    /// 401 `unauthorized`: no agent key, an unknown or revoked one, or no console session.
    #[error("{0}")]
    Unauthorized(String),
    /// 403 `forbidden`: the caller may not do this (not an admin, another agent's lease).
    #[error("{0}")]
    Forbidden(String),
    /// 403 `csrf`: a console session's change without its `x-csrf-token`.
    #[error("{0}")]
    Csrf(&'static str),
    /// 403 `model_not_allowed`: a model the agent's key may not use (`[agents.NAME] models`).
    #[error("{0}")]
    ModelNotAllowed(String),
    /// 404 `not_found`.
    #[error("{0}")]
    NotFound(String),
    /// 404 (named) or 400 (no model and no primary) `unknown_model`.
    #[error("{message}")]
    UnknownModel { named: bool, message: String },
    /// 409 `conflict`: it exists already, or is declared in the config file.
    #[error("{0}")]
    Conflict(String),
    /// 409 `lease_reported`.
    #[error("{0}")]
    LeaseReported(String),
    /// 410 `lease_expired`.
    #[error("{0}")]
    LeaseExpired(String),
    /// 429 or 503 `too_many_leases`: the agent's or the server's limit of outstanding leases.
    #[error("{message}")]
    TooManyLeases { status: u16, message: String },
    /// 429 `too_many_failure_reports` or `too_many_success_reports`, with `Retry-After`.
    #[error("{message}")]
    TooManyReports { success: bool, message: String, retry_after: u64 },
    /// 429 `over_limit`: the agent is over `requests_per_minute`, `tokens_per_day` or
    /// `cost_per_day`, with `Retry-After` to the end of the limit's window.
    #[error("{message}")]
    OverLimit { message: String, retry_after: u64 },
    /// The walk's status (429 with `Retry-After`, 502, 503…) `all_models_failed`.
    #[error("{message}")]
    AllModelsFailed { status: u16, message: String, retry_after: Option<u64> },
    /// The provider's status, or 502, `not_retryable`: a failure that ends the walk.
    #[error("{message}")]
    NotRetryable { status: u16, message: String, reason: Option<String> },
    /// 502 `provider_unreachable`: the OAuth provider did not answer.
    #[error("{0}")]
    ProviderUnreachable(String),
    /// 400 `login_refused`: the OAuth provider refused the login.
    #[error("{0}")]
    LoginRefused(String),
    /// 500 `oauth_config`: the provider's `[oauth]` section cannot work.
    #[error("{0}")]
    OAuthConfig(String),
    /// 503 `database_unwritable`: the database could not take the change (its files, a disk
    /// full, a read-only server); nothing was changed.
    #[error("{0}")]
    DatabaseUnwritable(String),
    /// 500 `internal`; what happened is logged, not answered.
    #[error("internal error; the server log has the details")]
    Internal,
}

impl ApiError {
    pub fn status_code(&self) -> StatusCode {
        let code = match self {
            ApiError::BadRequest(_) | ApiError::LoginRefused(_) => 400,
            ApiError::Unauthorized(_) => 401,
            ApiError::Forbidden(_) | ApiError::Csrf(_) | ApiError::ModelNotAllowed(_) => 403,
            ApiError::NotFound(_) => 404,
            ApiError::UnknownModel { named, .. } => {
                if *named {
                    404
                } else {
                    400
                }
            }
            ApiError::Conflict(_) | ApiError::LeaseReported(_) => 409,
            ApiError::LeaseExpired(_) => 410,
            ApiError::TooManyReports { .. } | ApiError::OverLimit { .. } => 429,
            ApiError::TooManyLeases { status, .. }
            | ApiError::AllModelsFailed { status, .. }
            | ApiError::NotRetryable { status, .. } => *status,
            ApiError::ProviderUnreachable(_) => 502,
            ApiError::DatabaseUnwritable(_) => 503,
            ApiError::OAuthConfig(_) | ApiError::Internal => 500,
        };
        StatusCode::from_u16(code).unwrap_or(StatusCode::BAD_GATEWAY)
    }

    /// The stable `type` of the error body.
    pub fn kind(&self) -> &'static str {
        match self {
            ApiError::BadRequest(_) => "bad_request",
            ApiError::Unauthorized(_) => "unauthorized",
            ApiError::Forbidden(_) => "forbidden",
            ApiError::Csrf(_) => "csrf",
            ApiError::ModelNotAllowed(_) => "model_not_allowed",
            ApiError::NotFound(_) => "not_found",
            ApiError::UnknownModel { .. } => "unknown_model",
            ApiError::Conflict(_) => "conflict",
            ApiError::LeaseReported(_) => "lease_reported",
            ApiError::LeaseExpired(_) => "lease_expired",
            ApiError::TooManyLeases { .. } => "too_many_leases",
            ApiError::TooManyReports { success: false, .. } => "too_many_failure_reports",
            ApiError::TooManyReports { success: true, .. } => "too_many_success_reports",
            ApiError::OverLimit { .. } => "over_limit",
            ApiError::AllModelsFailed { .. } => "all_models_failed",
            ApiError::NotRetryable { .. } => "not_retryable",
            ApiError::ProviderUnreachable(_) => "provider_unreachable",
            ApiError::LoginRefused(_) => "login_refused",
            ApiError::OAuthConfig(_) => "oauth_config",
            ApiError::DatabaseUnwritable(_) => "database_unwritable",
            ApiError::Internal => "internal",
        }
    }

    pub fn retry_after(&self) -> Option<u64> {
        match self {
            ApiError::TooManyReports { retry_after, .. } | ApiError::OverLimit { retry_after, .. } => {
                Some(*retry_after)
            }
            ApiError::AllModelsFailed { retry_after, .. } => *retry_after,
            _ => None,
        }
    }

    /// An error the caller cannot act on: logged here, answered as `internal`.
    pub fn internal(e: impl std::fmt::Display) -> ApiError {
        tracing::error!(error = %e, "admin API: internal error");
        ApiError::Internal
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> ApiError {
        match e {
            StoreError::NotFound(id) => ApiError::NotFound(format!("profile {id} does not exist")),
            StoreError::Duplicate(id) => ApiError::Conflict(format!("profile {id} already exists")),
            StoreError::AgentExists(name) => ApiError::Conflict(format!("agent {name} already exists and is active")),
            StoreError::NoAgent(name) => ApiError::NotFound(format!("no active agent named {name}")),
            other if other.is_unwritable() => {
                tracing::error!(error = %other, "admin API: the database could not take a change");
                ApiError::DatabaseUnwritable(format!(
                    "the database could not take the change, so nothing was changed ({other}); \
                     GET /healthz says what is wrong with its files"
                ))
            }
            other => ApiError::internal(other),
        }
    }
}

impl From<QueryRejection> for ApiError {
    fn from(e: QueryRejection) -> ApiError {
        ApiError::BadRequest(format!("invalid query: {}", e.body_text()))
    }
}

impl From<JsonRejection> for ApiError {
    fn from(e: JsonRejection) -> ApiError {
        ApiError::BadRequest(format!("invalid request body: {}", e.body_text()))
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let reason = match &self {
            ApiError::NotRetryable { reason, .. } => reason.clone(),
            _ => None,
        };
        let (status, retry_after) = (self.status_code(), self.retry_after());
        let body = ErrorBody { error: ErrorDetail { kind: self.kind().into(), message: self.to_string(), reason } };
        let mut resp = (status, Json(body)).into_response();
        if let Some(secs) = retry_after {
            resp.headers_mut().insert("retry-after", HeaderValue::from(secs));
        }
        resp
    }
}

/// The agent that sent the request (any active agent key).
pub struct Caller(pub Agent);

impl FromRequestParts<ApiState> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &ApiState) -> Result<Self, Self::Rejection> {
        let key = presented_key(&parts.headers).ok_or_else(|| {
            ApiError::Unauthorized("missing agent key: send `Authorization: Bearer rk_…` or `x-api-key: rk_…`".into())
        })?;
        state
            .agents
            .find(key)
            .await
            .map(Caller)
            .ok_or_else(|| ApiError::Unauthorized("invalid or revoked agent key".into()))
    }
}

/// A JSON request body whose errors are answered in the API's error format.
#[derive(FromRequest)]
#[from_request(via(Json), rejection(ApiError))]
pub struct Body<T>(pub T);
