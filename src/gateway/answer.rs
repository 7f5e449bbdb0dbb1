//! What the client gets besides the upstream's own answer: rota's errors in the client's API
//! format, and the `x-request-id` / `x-rota-*` headers (SPEC §7).

use super::walk::Trail;
use super::wire::Api;
use crate::engine::ProfileId;
use crate::engine::chain::Candidate;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;

/// An error in the client's API format.
pub fn error(api: Api, status: u16, message: &str, retry_after: Option<u64>, request_id: &str) -> Response {
    let code = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY);
    let mut resp = (code, axum::Json(api.error_body(status, message))).into_response();
    let h = resp.headers_mut();
    h.insert("x-request-id", HeaderValue::from_str(request_id).expect("uuid is a valid header"));
    if let Some(secs) = retry_after {
        h.insert("retry-after", HeaderValue::from(secs));
    }
    resp
}

/// An error answered before any upstream call (bad input, unknown model, bad pin).
pub fn refuse(api: Api, status: u16, message: &str, request_id: &str) -> Response {
    error(api, status, message, None, request_id)
}

/// The upstream's own error answer (redacted), passed on as it came.
pub fn upstream_error(status: u16, body: Bytes) -> Response {
    let code = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY);
    (code, [("content-type", "application/json")], body).into_response()
}

/// Which provider, model and profile served, and how many attempts it took.
pub fn with_rota_headers(mut resp: Response, trail: &Trail, cand: &Candidate, pid: &ProfileId) -> Response {
    let h = resp.headers_mut();
    let set = |h: &mut HeaderMap, k: &'static str, v: &str| {
        if let Ok(v) = HeaderValue::from_str(v) {
            h.insert(k, v);
        }
    };
    set(h, "x-request-id", &trail.request_id);
    set(h, "x-rota-provider", &cand.provider);
    set(h, "x-rota-model", &cand.model);
    set(h, "x-rota-profile", pid.as_str());
    set(h, "x-rota-attempts", &trail.seq.to_string());
    resp
}
