//! The layers every request passes (`app::router` stacks them): the request id (always rota's
//! own), the request's tracing span, and the body deadline, which fails a body read once
//! `server.body_timeout` has passed (the gateway and the API answer 408).

use crate::settings::Live;
use axum::extract::{FromRequestParts, Request, State};
use axum::http::HeaderName;
use axum::http::request::Parts;
use std::time::Duration;

const X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// A request body that has not arrived whole within `server.body_timeout` (a client that
/// trickles it, holding the connection) fails to read with `BodyTimeout`.
pub async fn body_deadline(
    State(settings): State<Live>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use futures_util::StreamExt;
    if req.method() == http::Method::GET || req.method() == http::Method::HEAD {
        return next.run(req).await;
    }
    let limit = settings.get().config.server.body_timeout;
    let deadline = tokio::time::Instant::now() + limit;
    let (parts, body) = req.into_parts();
    let timed = futures_util::stream::unfold(Some(body.into_data_stream()), move |stream| async move {
        let mut stream = stream?;
        match tokio::time::timeout_at(deadline, stream.next()).await {
            Ok(Some(chunk)) => Some((chunk, Some(stream))),
            Ok(None) => None,
            Err(_) => Some((Err(axum::Error::new(BodyTimeout(limit))), None)),
        }
    });
    next.run(axum::extract::Request::from_parts(parts, axum::body::Body::from_stream(timed))).await
}

/// The request body did not arrive within `server.body_timeout`.
#[derive(Debug, thiserror::Error)]
#[error("the request body did not arrive within {}s (server.body_timeout)", .0.as_secs_f64())]
pub struct BodyTimeout(pub Duration);

impl BodyTimeout {
    /// Whether reading a body failed because of its deadline.
    pub fn caused<'a>(e: &'a (dyn std::error::Error + 'static)) -> Option<&'a BodyTimeout> {
        let mut cur = Some(e);
        while let Some(e) = cur {
            if let Some(t) = e.downcast_ref::<BodyTimeout>() {
                return Some(t);
            }
            cur = e.source();
        }
        None
    }
}

/// The request's id: made here for every request (a client's `x-request-id` is not taken, so
/// that audit ids stay rota's own), carried by the request span, the `requests`/`attempts`
/// rows and the gateway's `x-request-id` answer header.
pub struct RequestId(pub String);

impl<S: Send + Sync> FromRequestParts<S> for RequestId {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        let id = parts.extensions.get::<tower_http::request_id::RequestId>();
        let id = id.and_then(|id| id.header_value().to_str().ok()).map(str::to_string);
        Ok(RequestId(id.unwrap_or_else(|| uuid::Uuid::now_v7().to_string())))
    }
}

/// Request ids are UUIDv7: they begin with the time, so each new `requests` and `attempts`
/// row lands at the end of its primary key's index instead of on a random page of it. With
/// random (v4) ids every row of a batch dirtied a page of its own in both indices, which made
/// much of what the audit writer wrote to the write-ahead log (docs/performance.md, "SQLite
/// writes at saturation"). After the time come a counter (the ids of one process stay in order
/// within a millisecond) and random bits, so ids stay unguessable.
#[derive(Clone, Copy, Debug, Default)]
pub struct MakeRequestV7;

impl tower_http::request_id::MakeRequestId for MakeRequestV7 {
    fn make_request_id<B>(&mut self, _: &axum::http::Request<B>) -> Option<tower_http::request_id::RequestId> {
        let id = axum::http::HeaderValue::from_str(&uuid::Uuid::now_v7().to_string()).ok()?;
        Some(tower_http::request_id::RequestId::new(id))
    }
}

/// Drops a client's `x-request-id`: the id `SetRequestIdLayer` then sets is always rota's.
pub async fn forget_client_request_id(mut req: Request) -> Request {
    req.headers_mut().remove(X_REQUEST_ID);
    req
}

/// Every request's span: its method, path (never the query) and id; the gateway's serve loop,
/// upstream calls and store writes log inside it. Exported as a trace, it is a child of the
/// client's `traceparent` and gets the agent and status (crate::telemetry).
pub fn request_span(req: &axum::http::Request<axum::body::Body>) -> tracing::Span {
    let id = req.headers().get(X_REQUEST_ID).and_then(|v| v.to_str().ok()).unwrap_or("");
    let span = tracing::info_span!(
        "request",
        method = %req.method(),
        path = %req.uri().path(),
        request_id = %id,
        agent = tracing::field::Empty,
        status = tracing::field::Empty,
        otel.status_code = tracing::field::Empty,
    );
    crate::telemetry::adopt(&span, req.headers());
    span
}

/// The client's address of a request's connection: a request extension the server adds.
#[derive(Clone, Copy, Debug)]
pub struct Peer(pub std::net::SocketAddr);
