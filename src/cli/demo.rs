//! `rota demo`: the gateway in front of simulated upstreams, so a newcomer sees rotation,
//! cooldowns and fallback with curl and no real keys. Everything listens on loopback.
//!
//! The simulated providers: `alpha` (OpenAI wire: chat and Responses) with three keys —
//! `steady`, `flaky` (every third call answers 429 with `Retry-After: 20`) and `down` (always
//! 503) — `gamma` whose only key is down, `beta` (chat completions only, so a Responses client
//! such as Codex is translated) and `claude` (Anthropic wire) with one steady key each. Every
//! key may make 10 requests a minute, and its successful answers say how many are left. The
//! virtual model `smart` tries `gamma` first, so it shows the fallback to `beta`. The simulator
//! answers chat completions, messages and Responses requests, streamed or not, and calls a tool
//! when asked to read an absolute path (`reply`), so agents can be tried against the demo.
//!
//! Its config is a file, `rota-demo.toml` beside the database, written at each start and then
//! served, so that `rota --config rota-demo.toml …` reaches the demo's database. The demo binds
//! its port before it deletes or writes anything.

use crate::config::Config;
use crate::engine::{ProfileId, ProfileType};
use crate::gateway::translate::{self, StreamTranslator, sse::Splitter};
use crate::gateway::wire::Api;
use crate::secrets::{SecretField, resolve_key};
use crate::server::App;
use crate::store::{SqliteStore, Store, StoredProfile};
use anyhow::{Context, Result};
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use parking_lot::Mutex;
use secrecy::{ExposeSecret, SecretString};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

const PROFILES: [(&str, &str); 6] = [
    ("alpha:steady", "sim-alpha-steady"),
    ("alpha:flaky", "sim-alpha-flaky"),
    ("alpha:down", "sim-alpha-down"),
    ("gamma:only", "sim-gamma-down"),
    ("beta:steady", "sim-beta-steady"),
    ("claude:steady", "sim-claude-steady"),
];

/// The demo's config file (see `crate::config::DEMO_FILE`).
pub use crate::config::DEMO_FILE as CONFIG_FILE;

/// A TOML basic string holding `text`.
fn toml_string(text: &str) -> String {
    let mut out = String::from("\"");
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => out.push_str(&format!("\\u{:04X}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// The demo's configuration: the database `db` (an absolute path, so the file works from any
/// directory) and the simulated providers at `upstream`.
fn config_text(db: &Path, upstream: &str) -> String {
    format!(
        r#"# Written by `rota demo` at each start (and overwritten by the next): the config the demo
# serves. `rota --config {CONFIG_FILE} doctor | profiles list | agents create NAME --admin`
# reach the demo's database with it.

[database]
url = {url}

[secrets]
# The demo's master key is the file beside its database.
keyring = "off"

[providers.alpha]
api = "openai"
base_url = "{upstream}/v1"
[providers.beta]
api = "openai-chat"
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
        url = toml_string(&format!("sqlite://{}", db.display())),
    )
}

pub async fn run(listen: &str, db: &Path) -> Result<()> {
    // The port first: when it is taken, nothing has been deleted or written yet.
    let listener = crate::server::bind(listen, "").await?;
    let Some(name) = db.file_name().filter(|n| *n != CONFIG_FILE) else {
        anyhow::bail!("--database {}: name a file, e.g. rota-demo.db", db.display());
    };
    let dir = db.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let absolute = std::fs::canonicalize(dir).with_context(|| format!("reading {}", dir.display()))?.join(name);
    let config_file = if dir == Path::new(".") { PathBuf::from(CONFIG_FILE) } else { dir.join(CONFIG_FILE) };
    // Held while this demo serves: a second demo in the folder would delete this one's database
    // and overwrite its config.
    let _only_demo_here = lock(dir)?;
    let upstream = start_simulator().await?;
    let (config, admin_key) = fresh_demo(&absolute, &config_file, &upstream).await?;
    let app = App::build(config, None, false).await?;
    let url = format!("http://{}", listener.local_addr()?);
    let signal = crate::server::shutdown_signal();
    print_welcome(&url, &upstream, db, &config_file, &admin_key);
    app.serve(listener, signal).await
}

/// The folder's demo lock (`rota-demo.lock`, an exclusive `flock`), or why another demo has it.
fn lock(dir: &Path) -> Result<nix::fcntl::Flock<std::fs::File>> {
    let path = dir.join("rota-demo.lock");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .with_context(|| format!("opening {}", path.display()))?;
    nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock).map_err(|_| {
        anyhow::anyhow!(
            "another `rota demo` serves from {} (it holds {}): stop it first, or start this one in \
             another folder (--database OTHER/rota-demo.db); nothing was changed",
            dir.display(),
            path.display()
        )
    })
}

/// Starts the demo afresh: the database deleted, the config file written, the simulated
/// profiles and an admin agent stored. Returns the config and the admin agent's key.
async fn fresh_demo(absolute: &Path, config_file: &Path, upstream: &str) -> Result<(Config, SecretString)> {
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", absolute.display()));
    }
    std::fs::write(config_file, config_text(absolute, upstream))
        .with_context(|| format!("writing {}", config_file.display()))?;
    // What the CLI reads with `--config rota-demo.toml` is what the demo serves (the file alone:
    // a DATABASE_URL or ROTA_* variable set for another rota does not move the demo).
    let config = Config::from_file(config_file).map_err(|e| anyhow::anyhow!("{}: {e}", config_file.display()))?;
    let store = SqliteStore::open(absolute).await.with_context(|| format!("opening {}", absolute.display()))?;
    let (key, _) =
        resolve_key(&crate::store::key_anchor(&config)?, &store.secret_key_ids().await?, crate::secrets::Choice::Off)?;
    for (i, (id, secret)) in PROFILES.iter().enumerate() {
        let pid: ProfileId = id.parse()?;
        let sealed = key.seal(&pid, SecretField::ApiKey, &SecretString::from(*secret));
        let row = StoredProfile::stored(pid, ProfileType::ApiKey, None, i as i64);
        store.add_profile(&row, &[sealed]).await?;
    }
    let admin_key = crate::agents::new_key();
    store
        .create_agent(
            "demo",
            &crate::agents::digest(&admin_key),
            true,
            (&Default::default(), None),
            chrono::Utc::now().timestamp_millis(),
        )
        .await?;
    store.close().await;
    Ok((config, admin_key))
}

/// What the demo serves and how to try it: the console, the admin key (shown only now), curl
/// commands for rotation and fallback, and the CLI against the demo's database.
fn print_welcome(url: &str, upstream: &str, db: &Path, config_file: &Path, admin_key: &SecretString) {
    let cfg = config_file.display();
    let chat = |model: &str| {
        format!(
            "  curl -s {url}/v1/chat/completions -H \"authorization: Bearer $ROTA_DEMO_KEY\" -H 'content-type: application/json' \\\n       \
             -d '{{\"model\":\"{model}\",\"messages\":[{{\"role\":\"user\",\"content\":\"hi\"}}]}}' -D -"
        )
    };
    println!("rota demo listening on {url} (simulated upstreams at {upstream}, database {})", db.display());
    println!(
        "providers: alpha (keys steady, flaky: 429 every 3rd call, down: always 503), gamma (down), beta (chat completions only), claude (Anthropic's format); each key 10 requests a minute, its answers say how many are left"
    );
    println!("models: alpha/sim-large (default chain: then beta/sim-small), smart = gamma/sim-xl then beta/sim-small");
    println!();
    println!("console: {url}/ui/");
    println!("admin key: {}", admin_key.expose_secret());
    println!("(shown only now: it signs in to the console, and is the agent key of the requests below)");
    println!();
    println!(
        "try, with the admin key in ROTA_DEMO_KEY (export ROTA_DEMO_KEY=…); repeat to watch rotation in the x-rota-* headers:"
    );
    println!("{}", chat("alpha/sim-large"));
    println!("the virtual model smart, to watch a fallback (gamma is down, beta answers; see x-rota-model):");
    println!("{}", chat("smart"));
    println!(
        "agents (Claude Code, Codex, the OpenAI SDKs) work on every model: README.md, \"Agents against the demo\""
    );
    println!("every attempt is in the audit trail:");
    println!("  sqlite3 {} 'SELECT kind, provider, profile_id, outcome, reason FROM attempts'", db.display());
    println!("the CLI reaches this demo's database with its config, {cfg}:");
    println!("  rota --config {cfg} doctor");
    println!("  rota --config {cfg} profiles list");
    println!("  rota --config {cfg} agents create NAME --admin");
    // The CLI applies the environment on top of the file; the demo does not.
    if let Some(var) = ["DATABASE_URL", "ROTA_DATABASE__URL"].into_iter().find(|v| std::env::var_os(v).is_some()) {
        println!("  (with {var} unset: it is set here, and would send these commands to another database)");
    }
}

#[derive(Clone, Default)]
struct Sim(Arc<Mutex<HashMap<String, Calls>>>);

/// The requests a simulated key may make per minute, as a provider's rate limit counts them: its
/// successful answers say how many are left (`x-ratelimit-*`, `anthropic-ratelimit-*`), so rota rotates away
/// from a key that has none left before it would answer 429; past them it answers 429 until the
/// minute is over, as a provider does.
const PER_MINUTE: u64 = 10;

/// One simulated key's calls: all of them, and those of the current minute.
#[derive(Default)]
struct Calls {
    total: u64,
    minute: i64,
    in_minute: u64,
}

async fn start_simulator() -> Result<String> {
    let app = axum::Router::new()
        .route("/v1/chat/completions", axum::routing::post(simulate))
        .route("/v1/messages", axum::routing::post(simulate))
        .route("/v1/responses", axum::routing::post(simulate))
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
    let now = chrono::Utc::now().timestamp_millis();
    let (calls, left, over) = {
        let mut m = sim.0.lock();
        let c = m.entry(key.clone()).or_default();
        if c.minute != now / 60_000 {
            (c.minute, c.in_minute) = (now / 60_000, 0);
        }
        c.total += 1;
        c.in_minute += 1;
        (c.total, PER_MINUTE.saturating_sub(c.in_minute), c.in_minute > PER_MINUTE)
    };
    let api = match uri.path() {
        "/v1/messages" => Api::Messages,
        "/v1/responses" => Api::Responses,
        _ => Api::Chat,
    };
    let anthropic = api == Api::Messages;
    let reset_at = (now / 60_000 + 1) * 60_000;
    if over {
        let wait = ((reset_at - now) as u64).div_ceil(1000).to_string();
        let error = api.error_body(429, &format!("Rate limit reached: {PER_MINUTE} requests a minute"));
        return (StatusCode::TOO_MANY_REQUESTS, [("retry-after", wait)], axum::Json(error)).into_response();
    }
    let mut response = answer(&key, calls, api, &body);
    if !response.status().is_success() {
        return response;
    }
    let limits = if anthropic {
        let reset = crate::status::time(reset_at);
        [
            ("anthropic-ratelimit-requests-limit", PER_MINUTE.to_string()),
            ("anthropic-ratelimit-requests-remaining", left.to_string()),
            ("anthropic-ratelimit-requests-reset", reset),
        ]
    } else {
        [
            ("x-ratelimit-limit-requests", PER_MINUTE.to_string()),
            ("x-ratelimit-remaining-requests", left.to_string()),
            ("x-ratelimit-reset-requests", format!("{}ms", reset_at - now)),
        ]
    };
    for (name, value) in limits {
        if let Ok(value) = value.parse() {
            response.headers_mut().insert(name, value);
        }
    }
    response
}

/// The simulated provider's answer to one call: a 503 from a `-down` key, a 429 from a `-flaky`
/// key every third call, else the model's answer in the format called (streamed when asked).
fn answer(key: &str, calls: u64, api: Api, body: &[u8]) -> Response {
    if key.ends_with("-down") {
        let body = json!({"error": {"message": "The server is overloaded, try later", "type": "server_error"}});
        return (StatusCode::SERVICE_UNAVAILABLE, axum::Json(body)).into_response();
    }
    if key.ends_with("-flaky") && calls.is_multiple_of(3) {
        let body = json!({"error": {"message": "Rate limit reached for requests", "type": "rate_limit_error"}});
        return (StatusCode::TOO_MANY_REQUESTS, [("retry-after", "20")], axum::Json(body)).into_response();
    }
    // The simulator thinks in chat completions: a request in another format is read as chat,
    // and the answer written back in the format called, by rota's own translators.
    let Ok(Value::Object(req)) = serde_json::from_slice::<Value>(body) else {
        let error = api.error_body(400, "the body is not a JSON object");
        return (StatusCode::BAD_REQUEST, axum::Json(error)).into_response();
    };
    let chat = match api {
        Api::Chat => Ok(req.clone()),
        Api::Messages => translate::messages_to_chat(&req).map(|t| t.body),
        Api::Responses => translate::responses_to_chat(&req).map(|t| t.body),
    };
    let chat = match chat {
        Ok(chat) => chat,
        Err(e) => return (StatusCode::BAD_REQUEST, axum::Json(api.error_body(400, &e.to_string()))).into_response(),
    };
    let model = req.get("model").and_then(Value::as_str).unwrap_or("sim").to_string();
    let message = reply(&chat, &model);
    let tool = message.get("tool_calls").is_some();
    if req.get("stream").and_then(Value::as_bool) == Some(true) {
        return streamed(api, &model, &message, tool);
    }
    let answer = json!({"id": "chatcmpl-sim", "object": "chat.completion", "created": 0, "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": if tool { "tool_calls" } else { "stop" }}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12}});
    let answer = match api {
        Api::Chat => answer,
        Api::Messages => translate::chat_response_to_messages(&answer),
        Api::Responses => translate::chat_answer_to_responses(&answer),
    };
    axum::Json(answer).into_response()
}

/// The simulator's answer streamed: chat completion chunks (the message whole in one), written
/// in the format called.
fn streamed(api: Api, model: &str, message: &Value, tool: bool) -> Response {
    let chunk = |delta: Value, finish: Value| {
        json!({"id": "chatcmpl-sim", "object": "chat.completion.chunk", "created": 0, "model": model,
               "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
    };
    let mut delta = message.clone();
    if let Some(calls) = delta.get_mut("tool_calls").and_then(Value::as_array_mut) {
        calls.iter_mut().enumerate().for_each(|(i, c)| c["index"] = json!(i));
    }
    let usage = json!({"id": "chatcmpl-sim", "object": "chat.completion.chunk", "created": 0, "model": model,
                       "choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12}});
    let events = format!(
        "data: {}\n\ndata: {}\n\ndata: {}\n\ndata: {usage}\n\ndata: [DONE]\n\n",
        chunk(json!({"role": "assistant", "content": ""}), Value::Null),
        chunk(delta, Value::Null),
        chunk(json!({}), json!(if tool { "tool_calls" } else { "stop" })),
    );
    let translator = match api {
        Api::Chat => None,
        Api::Messages => Some(StreamTranslator::chat_to_anthropic()),
        Api::Responses => Some(StreamTranslator::chat_to_responses()),
    };
    let bytes = match translator {
        None => events.into_bytes(),
        Some(mut t) => Splitter::default().push(events.as_bytes()).iter().flat_map(|e| t.push(e)).collect(),
    };
    // A whole answer in one write, as a fast server sends a short one.
    ([("content-type", "text/event-stream")], Body::from(bytes)).into_response()
}

/// What the simulated model says to a chat request: asked to `read` an absolute path and
/// offered a tool that reads (Claude Code's `Read`, Codex's `exec_command` or `shell`, a
/// function with one string parameter), it calls the tool; given the tool's result, it quotes
/// the last line with text (a tool's output ends with what it read); else it greets.
fn reply(chat: &serde_json::Map<String, Value>, model: &str) -> Value {
    let messages = chat.get("messages").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
    let last = messages.iter().rev().find(|m| m["role"] != "system" && m["role"] != "developer");
    if let Some(result) = last.filter(|m| m["role"] == "tool") {
        let text = result["content"].as_str().map(str::to_string).unwrap_or_else(|| result["content"].to_string());
        // A numbered line (`cat -n`, Claude Code's Read) counts for its text.
        let unnumbered = |l: &str| {
            let t = l.trim_start();
            t.trim_start_matches(|c: char| c.is_ascii_digit()).strip_prefix('\t').unwrap_or(l).trim().to_string()
        };
        let last = text.lines().map(unnumbered).rfind(|l| !l.is_empty()).unwrap_or_default();
        return json!({"role": "assistant", "content": format!("The tool said: {last}")});
    }
    let asked = last.map(|m| crate::gateway::translate::request::text_of(&m["content"])).unwrap_or_default();
    // The last "read /path" of the turn: an agent puts its context (git status with its recent
    // commit messages, reminders) in the same message, before what the user asked.
    let words: Vec<&str> = asked.split_whitespace().collect();
    let path =
        words.windows(2).rev().find(|w| w[0].eq_ignore_ascii_case("read") && w[1].starts_with('/')).map(|w| w[1]);
    let tools = chat.get("tools").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
    if let Some(path) = path {
        let path = path.trim_end_matches(['.', ',', '"', '\'']);
        let call = tools.iter().find_map(|t| {
            let f = &t["function"];
            let name = f["name"].as_str()?;
            let args = match name {
                "Read" => json!({"file_path": path}),
                "exec_command" => json!({"cmd": format!("cat {path}")}),
                "shell" => json!({"command": ["cat", path]}),
                _ => {
                    let props = f["parameters"]["properties"].as_object()?;
                    let (param, _) = props.iter().find(|(_, p)| p["type"] == "string").filter(|_| props.len() == 1)?;
                    json!({ param: path })
                }
            };
            Some(json!({"id": "call_sim_1", "type": "function", "function": {"name": name, "arguments": args.to_string()}}))
        });
        if let Some(call) = call {
            return json!({"role": "assistant", "content": null, "tool_calls": [call]});
        }
    }
    json!({"role": "assistant", "content": format!("Hello from the simulated {model}.")})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_simulated_key_refuses_past_its_stated_limit_until_the_minute_is_over() {
        let sim = Sim::default();
        let mut headers = HeaderMap::new();
        headers.insert("authorization", "Bearer sim-steady".parse().unwrap());
        let body = Bytes::from_static(br#"{"model":"sim","messages":[{"role":"user","content":"hi"}]}"#);
        let call =
            || simulate(State(sim.clone()), "/v1/chat/completions".parse().unwrap(), headers.clone(), body.clone());
        for left in (0..PER_MINUTE).rev() {
            let r = call().await;
            assert_eq!(r.status(), StatusCode::OK, "a call with {left} left");
            // More when a new minute began meanwhile.
            let said: u64 = r.headers()["x-ratelimit-remaining-requests"].to_str().unwrap().parse().unwrap();
            assert!(said >= left, "says {said} left, {left} expected");
        }
        let r = call().await;
        if r.headers().contains_key("x-ratelimit-remaining-requests") {
            return; // a new minute began during the calls: its count is not spent
        }
        assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS, "the eleventh call of the minute");
        let wait: u64 = r.headers()["retry-after"].to_str().unwrap().parse().unwrap();
        assert!((1..=60).contains(&wait));
    }

    #[test]
    fn the_simulated_model_reads_the_path_it_was_last_asked_to_read() {
        let tools = json!([{"type": "function", "function": {"name": "Read", "parameters": {}}}]);
        let asked = "Recent commits: abc tests: read the bindings with a helper\n\nread /repo/README.md";
        let chat = json!({"messages": [{"role": "user", "content": asked}], "tools": tools});
        let answer = reply(chat.as_object().unwrap(), "sim-small");
        let args = answer["tool_calls"][0]["function"]["arguments"].as_str().unwrap();
        assert_eq!(serde_json::from_str::<Value>(args).unwrap(), json!({"file_path": "/repo/README.md"}));
        let chat = json!({"messages": [{"role": "user", "content": "read the bindings"}], "tools": tools});
        assert_eq!(reply(chat.as_object().unwrap(), "sim-small")["content"], "Hello from the simulated sim-small.");
    }
}
