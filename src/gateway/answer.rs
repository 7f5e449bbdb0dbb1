//! What the client gets besides the upstream's own answer: rota's errors in the client's API
//! format, and the `x-request-id` / `x-rota-*` headers (docs/audit.md).

use super::wire::Api;
use crate::engine::ProfileId;
use crate::engine::chain::Candidate;
use crate::walk::Trail;
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;

/// Why rota answers a client with an error of its own, in the client's API format.
#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    /// 401: no agent key in the request.
    #[error("missing agent key: send `Authorization: Bearer rk_…` or `x-api-key: rk_…`")]
    MissingKey,
    /// 401: a key no active agent holds.
    #[error("invalid or revoked agent key")]
    InvalidKey,
    /// 408: the body did not arrive within `server.body_timeout`.
    #[error("{0}")]
    BodyTimeout(String),
    /// 413: the body is over `limits.max_body_bytes`.
    #[error("request body larger than {0} bytes (limits.max_body_bytes)")]
    BodyTooLarge(usize),
    /// 400: bad input (not a JSON object, a malformed pin, a request the chain cannot serve).
    #[error("{0}")]
    BadRequest(String),
    /// 404: a model no provider, alias or virtual model names.
    #[error("{0}")]
    UnknownModel(String),
    /// 403: a model the agent's key may not use (`[agents.NAME] models`).
    #[error("{0}")]
    ModelNotAllowed(String),
    /// The walk ended without an answer: every candidate failed or is cooling (429 with
    /// `Retry-After`, 502, 503…), or the upstream's last failure (its status). `tried`: the
    /// `x-rota-tried` value of the calls and skips it made.
    #[error("{message}")]
    Failed { status: u16, message: String, retry_after: Option<u64>, tried: Option<String> },
    /// 504: the request's deadline (`timeouts.total`) passed.
    #[error("{0}")]
    TimedOut(String),
    /// 429: the agent is over one of its limits (`requests_per_minute`, `tokens_per_day`,
    /// `cost_per_day`), with `Retry-After` to the end of the limit's window.
    #[error("{message}")]
    OverLimit { message: String, retry_after: u64 },
}

impl GatewayError {
    /// A chain that cannot be made: a model the agent may not use (403), an unknown model (404)
    /// or, with no model named, a configuration without a primary (400).
    pub fn of_chain(e: crate::engine::chain::ChainError, named: bool) -> GatewayError {
        match e {
            crate::engine::chain::ChainError::NotAllowed { .. } => GatewayError::ModelNotAllowed(e.to_string()),
            e if named => GatewayError::UnknownModel(e.to_string()),
            e => GatewayError::BadRequest(e.to_string()),
        }
    }

    pub fn status_code(&self) -> StatusCode {
        match self {
            GatewayError::MissingKey | GatewayError::InvalidKey => StatusCode::UNAUTHORIZED,
            GatewayError::BodyTimeout(_) => StatusCode::REQUEST_TIMEOUT,
            GatewayError::BodyTooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            GatewayError::BadRequest(_) => StatusCode::BAD_REQUEST,
            GatewayError::UnknownModel(_) => StatusCode::NOT_FOUND,
            GatewayError::ModelNotAllowed(_) => StatusCode::FORBIDDEN,
            GatewayError::Failed { status, .. } => StatusCode::from_u16(*status).unwrap_or(StatusCode::BAD_GATEWAY),
            GatewayError::TimedOut(_) => StatusCode::GATEWAY_TIMEOUT,
            GatewayError::OverLimit { .. } => StatusCode::TOO_MANY_REQUESTS,
        }
    }

    /// Seconds until a cooling candidate can serve again, or the agent's limit resets, for
    /// `Retry-After`.
    pub fn retry_after(&self) -> Option<u64> {
        match self {
            GatewayError::Failed { retry_after, .. } => *retry_after,
            GatewayError::OverLimit { retry_after, .. } => Some(*retry_after),
            _ => None,
        }
    }

    /// The answer: this error in `api`'s format, with the request id, `Retry-After` and what
    /// the walk tried (`x-rota-tried`).
    pub fn answer(&self, api: Api, request_id: &str) -> Response {
        let code = self.status_code();
        let mut resp = (code, axum::Json(api.error_body(code.as_u16(), &self.to_string()))).into_response();
        let h = resp.headers_mut();
        h.insert("x-request-id", HeaderValue::from_str(request_id).expect("uuid is a valid header"));
        if let Some(secs) = self.retry_after() {
            h.insert("retry-after", HeaderValue::from(secs));
        }
        if let GatewayError::Failed { tried: Some(tried), .. } = self
            && let Ok(tried) = HeaderValue::from_str(tried)
        {
            h.insert(HeaderName::from_static("x-rota-tried"), tried);
        }
        resp
    }
}

/// The upstream's own answer (redacted), passed on as it came.
pub fn upstream_answer(status: u16, body: Bytes) -> Response {
    let code = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY);
    (code, [("content-type", "application/json")], body).into_response()
}

/// Which provider, model and profile served, and how many attempts it took.
/// `dropped`: what the translation of the request dropped (`x-rota-dropped`, docs/translation.md).
pub fn with_rota_headers(
    mut resp: Response,
    trail: &Trail,
    cand: &Candidate,
    pid: &ProfileId,
    dropped: Option<HeaderValue>,
) -> Response {
    const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");
    const PROVIDER: HeaderName = HeaderName::from_static("x-rota-provider");
    const MODEL: HeaderName = HeaderName::from_static("x-rota-model");
    const PROFILE: HeaderName = HeaderName::from_static("x-rota-profile");
    const ATTEMPTS: HeaderName = HeaderName::from_static("x-rota-attempts");
    let h = resp.headers_mut();
    let set = |h: &mut HeaderMap, k: HeaderName, v: &str| {
        if let Ok(v) = HeaderValue::from_str(v) {
            h.insert(k, v);
        }
    };
    set(h, REQUEST_ID, &trail.request_id);
    set(h, PROVIDER, &cand.provider);
    set(h, MODEL, &cand.model);
    set(h, PROFILE, pid.as_str());
    h.insert(ATTEMPTS, HeaderValue::from(trail.seq));
    if let Some(tried) = trail.passed().and_then(|t| HeaderValue::from_str(&t).ok()) {
        h.insert(HeaderName::from_static("x-rota-tried"), tried);
    }
    if let Some(dropped) = dropped {
        h.insert(HeaderName::from_static("x-rota-dropped"), dropped);
    }
    resp
}
