//! `rota-mock`: the tiny upstream the benchmark (`scripts/bench.sh`) drives, so that the mock is
//! never the bottleneck. OpenAI chat and Anthropic messages, streaming and not, answered from
//! pre-built bytes. Scripted by the request itself:
//!
//! - an API key containing `limited` gets 429 (`rate_limit`), every time;
//! - the model `slow` streams 10 events 100 ms apart, the first at once (for the open-streams
//!   scenario).
//!
//! `rota-mock [--listen 127.0.0.1:0]` prints `listening on http://ADDR` once ready.

use axum::Router;
use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use std::time::Duration;

const CHAT: &str = r#"{"id":"chatcmpl-bench","object":"chat.completion","created":0,"model":"bench","choices":[{"index":0,"message":{"role":"assistant","content":"Hello from the benchmark mock."},"finish_reason":"stop"}],"usage":{"prompt_tokens":12,"completion_tokens":7,"total_tokens":19}}"#;
const MESSAGE: &str = r#"{"id":"msg_bench","type":"message","role":"assistant","model":"bench","content":[{"type":"text","text":"Hello from the benchmark mock."}],"stop_reason":"end_turn","usage":{"input_tokens":12,"output_tokens":7}}"#;
const LIMITED: &str =
    r#"{"error":{"message":"Rate limit reached for requests","type":"rate_limit_error","code":"rate_limit_exceeded"}}"#;
const CHUNK: &str = "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"tok \"}}]}\n\n";
const CHAT_END: &str = "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}],\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":8}}\n\ndata: [DONE]\n\n";
const ANTHROPIC_START: &str =
    "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":12}}}\n\n";
const ANTHROPIC_DELTA: &str = "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"tok \"}}\n\n";
const ANTHROPIC_END: &str = "event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":8}}\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n";
const EVENTS: usize = 8;

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

async fn answer(anthropic: bool, headers: HeaderMap, body: Bytes) -> Response {
    let key = headers
        .get(header::AUTHORIZATION)
        .or_else(|| headers.get("x-api-key"))
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if key.contains("limited") {
        return (StatusCode::TOO_MANY_REQUESTS, [(header::CONTENT_TYPE, "application/json")], LIMITED).into_response();
    }
    let stream = contains(&body, b"\"stream\":true") || contains(&body, b"\"stream\": true");
    if !stream {
        let json = if anthropic { MESSAGE } else { CHAT };
        return ([(header::CONTENT_TYPE, "application/json")], json).into_response();
    }
    let slow = contains(&body, b"\"model\":\"slow\"");
    let (events, gap) = if slow { (10, Duration::from_millis(100)) } else { (EVENTS, Duration::ZERO) };
    let (start, delta, end) =
        if anthropic { (ANTHROPIC_START, ANTHROPIC_DELTA, ANTHROPIC_END) } else { ("", CHUNK, CHAT_END) };
    let body = if gap.is_zero() {
        Body::from([start, &delta.repeat(events), end].concat())
    } else {
        // The first content event goes with the headers, and the others follow 100 ms apart:
        // a client's time to the first byte is its time to the first token, through rota (which
        // holds the answer's headers until the first content event) as directly.
        let parts = std::iter::once(format!("{start}{delta}"))
            .chain(std::iter::repeat_n(delta.to_string(), events - 1))
            .chain(std::iter::once(end.to_string()));
        let stream = futures_util::stream::unfold((parts, true), move |(mut parts, first)| async move {
            if !first {
                tokio::time::sleep(gap).await;
            }
            parts.next().map(|p| (Ok::<_, std::io::Error>(Bytes::from(p)), (parts, false)))
        });
        Body::from_stream(stream)
    };
    ([(header::CONTENT_TYPE, "text/event-stream")], body).into_response()
}

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let listen = args.windows(2).find(|w| w[0] == "--listen").map_or("127.0.0.1:0", |w| w[1].as_str()).to_string();
    let app = Router::new()
        .route("/v1/chat/completions", post(|h, b| answer(false, h, b)))
        .route("/v1/messages", post(|h, b| answer(true, h, b)));
    let listener = tokio::net::TcpListener::bind(&listen).await?;
    println!("listening on http://{}", listener.local_addr()?);
    let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
        let _ = tcp.set_nodelay(true);
    });
    axum::serve(listener, app).await
}
