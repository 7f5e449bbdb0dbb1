//! `rota-floor`: the physical floor the benchmark (`scripts/bench.sh`) measures rota against. A
//! bare pass-through proxy on the same stack (axum in, reqwest out): the request body read
//! whole and sent on with its `authorization` header, the answer's status, content type and
//! body streamed back. No agent keys, no rotation, no audit, no translation.
//!
//! `rota-floor --upstream http://127.0.0.1:PORT [--listen 127.0.0.1:0]` prints
//! `listening on http://ADDR` once ready, and ends on SIGTERM.

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;

#[derive(Clone)]
struct Floor {
    client: reqwest::Client,
    upstream: String,
}

async fn pass(State(floor): State<Floor>, uri: Uri, headers: HeaderMap, body: Bytes) -> Response {
    let mut req = floor.client.post(format!("{}{}", floor.upstream, uri.path())).body(body);
    for name in [header::AUTHORIZATION, header::CONTENT_TYPE] {
        if let Some(v) = headers.get(&name) {
            req = req.header(name, v);
        }
    }
    match req.send().await {
        Ok(answer) => {
            let status = StatusCode::from_u16(answer.status().as_u16()).unwrap_or(StatusCode::BAD_GATEWAY);
            let kind = answer.headers().get(header::CONTENT_TYPE).cloned();
            let mut resp = (status, Body::from_stream(answer.bytes_stream())).into_response();
            if let Some(kind) = kind {
                resp.headers_mut().insert(header::CONTENT_TYPE, kind);
            }
            resp
        }
        Err(e) => (StatusCode::BAD_GATEWAY, e.to_string()).into_response(),
    }
}

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let arg = |name: &str| args.windows(2).find(|w| w[0] == name).map(|w| w[1].clone());
    let Some(upstream) = arg("--upstream") else {
        eprintln!("usage: rota-floor --upstream http://127.0.0.1:PORT [--listen 127.0.0.1:0]");
        return Err(std::io::Error::other("--upstream is required"));
    };
    // reqwest is built with rustls but no crypto provider (as rota is): the process names one.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let floor = Floor { client: reqwest::Client::new(), upstream: upstream.trim_end_matches('/').to_string() };
    let app =
        Router::new().route("/v1/chat/completions", post(pass)).route("/v1/messages", post(pass)).with_state(floor);
    let listener = tokio::net::TcpListener::bind(arg("--listen").as_deref().unwrap_or("127.0.0.1:0")).await?;
    println!("listening on http://{}", listener.local_addr()?);
    let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
        let _ = tcp.set_nodelay(true);
    });
    // SIGTERM ends it cleanly, so that valgrind writes its counts (`scripts/bench.sh --callgrind`).
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    axum::serve(listener, app).with_graceful_shutdown(async move { term.recv().await.unwrap_or_default() }).await
}
