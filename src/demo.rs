//! `rota demo`: the gateway in front of simulated upstreams, so a newcomer sees rotation,
//! cooldowns and fallback with curl and no real keys. Everything listens on loopback.
//!
//! The simulated providers: `alpha` (OpenAI wire) with three keys — `steady`, `flaky` (every
//! third call answers 429 with `Retry-After: 20`) and `down` (always 503) — `gamma` whose only
//! key is down, and `beta` (OpenAI wire) and `claude` (Anthropic wire) with one steady key each.
//! The virtual model `smart` tries `gamma` first, so it shows the fallback to `beta`.

use crate::config::Config;
use crate::engine::{ProfileId, ProfileType};
use crate::secrets::{SecretField, resolve_key};
use crate::server::App;
use crate::store::{SqliteStore, Store, StoredProfile};
use anyhow::{Context, Result};
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use secrecy::{ExposeSecret, SecretString};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

const PROFILES: [(&str, &str); 6] = [
    ("alpha:steady", "sim-alpha-steady"),
    ("alpha:flaky", "sim-alpha-flaky"),
    ("alpha:down", "sim-alpha-down"),
    ("gamma:only", "sim-gamma-down"),
    ("beta:steady", "sim-beta-steady"),
    ("claude:steady", "sim-claude-steady"),
];

pub async fn run(listen: &str, db: &Path) -> Result<()> {
    let upstream = start_simulator().await?;
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", db.display()));
    }
    let config = Config::from_toml(&format!(
        r#"
[database]
url = "sqlite://{db}"
[providers.alpha]
api = "openai"
base_url = "{upstream}/v1"
[providers.beta]
api = "openai"
base_url = "{upstream}/v1"
[providers.gamma]
api = "openai"
base_url = "{upstream}/v1"
[providers.claude]
api = "anthropic"
base_url = "{upstream}"
[virtual_models.smart]
targets = ["gamma/sim-xl", "beta/sim-small"]
[models]
primary = "alpha/sim-large"
fallbacks = ["beta/sim-small"]
[aliases]
fast = "beta/sim-small"
"#,
        db = db.display()
    ))?;
    let store = SqliteStore::open(db).await.with_context(|| format!("opening {}", db.display()))?;
    let (key, _) = resolve_key(db, &store.secret_key_ids().await?, crate::secrets::Choice::Off)?;
    for (i, (id, secret)) in PROFILES.iter().enumerate() {
        let pid: ProfileId = id.parse()?;
        let sealed = key.seal(&pid, SecretField::ApiKey, &SecretString::from(*secret));
        let row = StoredProfile::stored(pid, ProfileType::ApiKey, None, i as i64);
        store.add_profile(&row, &[sealed]).await?;
    }
    let agent_key = crate::agents::new_key();
    store.create_agent("demo", &crate::agents::digest(&agent_key), true, chrono::Utc::now().timestamp_millis()).await?;
    store.close().await;

    let app = App::build(config, None).await?;
    let listener = tokio::net::TcpListener::bind(listen).await.with_context(|| format!("cannot listen on {listen}"))?;
    let url = format!("http://{}", listener.local_addr()?);
    let k = agent_key.expose_secret();
    println!("rota demo listening on {url} (simulated upstreams at {upstream}, database {})", db.display());
    println!("providers: alpha (keys steady, flaky: 429 every 3rd call, down: always 503), gamma (down), beta, claude");
    println!(
        "models: alpha/sim-large (default chain: then beta/sim-small), smart = gamma/sim-xl then beta/sim-small\n"
    );
    println!("try (repeat to watch rotation in the x-rota-* headers; use \"smart\" to watch a fallback):");
    println!(
        "  curl -s {url}/v1/chat/completions -H 'authorization: Bearer {k}' -H 'content-type: application/json' \\"
    );
    println!(
        "       -d '{{\"model\":\"alpha/sim-large\",\"messages\":[{{\"role\":\"user\",\"content\":\"hi\"}}]}}' -D - "
    );
    println!("  sqlite3 {} 'SELECT kind, provider, profile_id, outcome, reason FROM attempts'", db.display());
    println!("\ndemo agent key:\n{k}");
    app.serve(listener, crate::server::shutdown_signal()).await
}

#[derive(Clone, Default)]
struct Sim(Arc<Mutex<HashMap<String, u64>>>);

async fn start_simulator() -> Result<String> {
    let app = axum::Router::new()
        .route("/v1/chat/completions", axum::routing::post(simulate))
        .route("/v1/messages", axum::routing::post(simulate))
        .with_state(Sim::default());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!(error = %e, "the demo's simulated upstream stopped");
        }
    });
    Ok(format!("http://{addr}"))
}

async fn simulate(State(sim): State<Sim>, uri: Uri, headers: HeaderMap, body: Bytes) -> Response {
    let key = headers
        .get("x-api-key")
        .or_else(|| headers.get("authorization"))
        .and_then(|v| v.to_str().ok())
        .map(|v| v.trim_start_matches("Bearer ").to_string())
        .unwrap_or_default();
    let calls = {
        let mut m = sim.0.lock().unwrap_or_else(|e| e.into_inner());
        let n = m.entry(key.clone()).or_default();
        *n += 1;
        *n
    };
    if key.ends_with("-down") {
        let body = json!({"error": {"message": "The server is overloaded, try later", "type": "server_error"}});
        return (StatusCode::SERVICE_UNAVAILABLE, axum::Json(body)).into_response();
    }
    if key.ends_with("-flaky") && calls % 3 == 0 {
        let body = json!({"error": {"message": "Rate limit reached for requests", "type": "rate_limit_error"}});
        return (StatusCode::TOO_MANY_REQUESTS, [("retry-after", "20")], axum::Json(body)).into_response();
    }
    let req: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let model = req["model"].as_str().unwrap_or("sim").to_string();
    let text = format!("Hello from the simulated {model}.");
    let anthropic = uri.path() == "/v1/messages";
    if req["stream"].as_bool() == Some(true) {
        // A whole answer in one write, as a fast server sends a short one.
        let events = if anthropic {
            let start = json!({"type": "message_start", "message": {"id": "msg_sim", "type": "message", "role": "assistant",
                "model": model, "content": [], "stop_reason": null, "stop_sequence": null,
                "usage": {"input_tokens": 5, "output_tokens": 1}}});
            let block =
                json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}});
            let delta =
                json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text}});
            let end = json!({"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": null},
                "usage": {"output_tokens": 7}});
            format!(
                "event: message_start\ndata: {start}\n\nevent: content_block_start\ndata: {block}\n\n\
                 event: content_block_delta\ndata: {delta}\n\n\
                 event: content_block_stop\ndata: {{\"type\":\"content_block_stop\",\"index\":0}}\n\n\
                 event: message_delta\ndata: {end}\n\nevent: message_stop\ndata: {{\"type\":\"message_stop\"}}\n\n"
            )
        } else {
            let chunk = |delta: Value, finish: Value| {
                json!({"id": "chatcmpl-sim", "object": "chat.completion.chunk", "created": 0, "model": model,
                       "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
            };
            let usage = json!({"id": "chatcmpl-sim", "object": "chat.completion.chunk", "created": 0, "model": model,
                               "choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12}});
            format!(
                "data: {}\n\ndata: {}\n\ndata: {}\n\ndata: {usage}\n\ndata: [DONE]\n\n",
                chunk(json!({"role": "assistant", "content": ""}), Value::Null),
                chunk(json!({"content": text}), Value::Null),
                chunk(json!({}), json!("stop")),
            )
        };
        return ([("content-type", "text/event-stream")], Body::from(events)).into_response();
    }
    let answer = if anthropic {
        json!({"id": "msg_sim", "type": "message", "role": "assistant", "model": model,
               "content": [{"type": "text", "text": text}], "stop_reason": "end_turn",
               "usage": {"input_tokens": 5, "output_tokens": 7}})
    } else {
        json!({"id": "chatcmpl-sim", "object": "chat.completion", "model": model,
               "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
               "usage": {"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12}})
    };
    axum::Json(answer).into_response()
}
