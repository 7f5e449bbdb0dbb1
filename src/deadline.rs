//! A request body's deadline: the middleware that fails a body read once `server.body_timeout`
//! has passed, and the error the read fails with (the gateway and the API answer 408).

use crate::settings::Live;
use axum::extract::State;
use std::time::Duration;

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
