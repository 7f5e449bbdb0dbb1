//! Test support: a fault-injecting upstream that answers per API key (`Mock`), the base config,
//! API keys and request the tests start from (`config`, `KEYS`, `chat`), and rota started
//! in-process on a real SQLite file or a real PostgreSQL database (`spawn`).

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use bytes::Bytes;
use parking_lot::Mutex;
use rota::config::Config;
use rota::engine::{ProfileId, ProfileType};
use rota::secrets::{SecretField, resolve_key};
use rota::server::App;
use rota::store::{Store, StoredProfile};
use secrecy::SecretString;
use serde_json::{Value, json};
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

/// How the mock writes a stream's bytes: as real servers do, never only one event per read.
#[derive(Clone, Copy, Debug)]
pub enum Writes {
    /// The whole body in one write (a short answer from a fast server).
    Whole,
    /// One write per event, flushed.
    PerEvent,
    /// `n` bytes per write (events split anywhere).
    Bytes(usize),
}

/// What the mock answers to one call.
#[derive(Clone, Debug)]
pub enum Reply {
    Ok,
    Status(u16, Vec<(&'static str, String)>, String),
    /// A 200 stream of `n` text deltas, the whole answer in one write (as a fast server sends a
    /// short one: several events in one read).
    Stream(usize),
    /// These bytes as a 200 event stream (a recorded or a cut one), written as said, then closed.
    Raw(String, Writes),
    /// A 200 stream whose first event comes after `first` and whose end comes after `total`.
    SlowStream {
        first: Duration,
        total: Duration,
    },
    /// This status (JSON error body) after this long.
    SlowStatus(Duration, u16),
    /// This status with this JSON error body, `{model}` replaced by the requested model and
    /// `{extra}` by the first field of the request a chat completion does not have (an
    /// upstream that echoes the client's text).
    Echo(u16, &'static str),
    /// That reply, after this long.
    After(Duration, Box<Reply>),
    /// A 200 stream whose first event is an error (Anthropic: after `message_start` and a
    /// `ping`, as Anthropic sends `overloaded_error`).
    StreamErrorFirst,
    /// A 200 stream that sends one content event, then drops the connection.
    StreamBreakAfterFirst,
    /// A 200 stream that sends one content event, then an error event.
    StreamErrorAfterFirst,
    /// A 200 stream that sends one content event, then nothing.
    StreamStallAfterFirst,
    /// No answer for this long.
    Delay(Duration),
    /// That reply with these headers too (a provider's rate-limit headers on a stream, say).
    Headed(Vec<(&'static str, String)>, Box<Reply>),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Seen {
    pub key: String,
    /// The header the key came in: `x-api-key`, `api-key` or `authorization`.
    pub header: &'static str,
    /// The `chatgpt-account-id` header, when sent.
    pub account: Option<String>,
    pub path: String,
    pub model: String,
}

#[derive(Default)]
struct MockState {
    script: HashMap<String, VecDeque<Reply>>,
    seen: Vec<Seen>,
    /// The body of each call, in the order of `seen`.
    bodies: Vec<Value>,
    /// Streams whose reader (rota) went away before the stream ended.
    aborted: usize,
    /// Calls to the OAuth token endpoint (`/oauth/token`), which refuses a refresh token that
    /// starts with `revoked` (`invalid_grant`).
    token_calls: usize,
    /// The lifetime of the access tokens it grants (default one hour), and how long it takes.
    token_lifetime: Option<u64>,
    token_delay: Duration,
}

#[derive(Clone, Default)]
pub struct Mock(Arc<Mutex<MockState>>);

impl Mock {
    /// Queues replies for calls made with `key` (then 200s).
    pub fn script(&self, key: &str, replies: Vec<Reply>) {
        self.0.lock().script.entry(key.to_string()).or_default().extend(replies);
    }

    /// Grants access tokens valid for `secs`, each after `delay`.
    pub fn token_endpoint(&self, secs: u64, delay: Duration) {
        let mut st = self.0.lock();
        (st.token_lifetime, st.token_delay) = (Some(secs), delay);
    }

    /// Drops the replies still queued (calls then get 200s).
    pub fn unscript(&self) {
        self.0.lock().script.clear();
    }

    /// The request bodies the mock received, in order.
    pub fn bodies(&self) -> Vec<Value> {
        self.0.lock().bodies.clone()
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.0.lock().seen.clone()
    }

    pub fn token_calls(&self) -> usize {
        self.0.lock().token_calls
    }

    pub fn aborted(&self) -> usize {
        self.0.lock().aborted
    }

    pub fn keys(&self) -> Vec<String> {
        self.seen().into_iter().map(|s| s.key).collect()
    }

    /// A new mock, serving on loopback: it and its URL.
    pub async fn started() -> (Mock, String) {
        let mock = Mock::default();
        let url = mock.start().await;
        (mock, url)
    }

    async fn start(&self) -> String {
        let app = axum::Router::new()
            .route("/v1/chat/completions", post(answer))
            .route("/v1/messages", post(answer))
            .route("/v1/messages/count_tokens", post(answer))
            .route("/v1/responses", post(answer))
            // Claude on Vertex AI: `…/models/MODEL:rawPredict` (or `:streamRawPredict`).
            .route("/v1/projects/{project}/locations/{location}/publishers/anthropic/models/{call}", post(answer))
            // rota's confirming call (`GET base_url/models`), answered from the same script.
            .route("/v1/models", axum::routing::get(answer))
            .route("/oauth/token", post(token))
            .layer(axum::extract::DefaultBodyLimit::max(64 << 20))
            .with_state(self.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        format!("http://{addr}")
    }
}

async fn answer(State(mock): State<Mock>, uri: axum::http::Uri, headers: HeaderMap, body: Bytes) -> Response {
    let (header, key) = ["x-api-key", "api-key", "authorization"]
        .into_iter()
        .find_map(|h| Some((h, headers.get(h)?.to_str().ok()?.trim_start_matches("Bearer ").to_string())))
        .unwrap_or(("", String::new()));
    let req: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let vertex = uri.path().split_once("/publishers/anthropic/models/").map(|(_, call)| call.split(':').next());
    let model = match vertex {
        Some(in_url) => in_url.unwrap_or("").to_string(),
        None => req["model"].as_str().unwrap_or("").to_string(),
    };
    let anthropic = uri.path() == "/v1/messages" || vertex.is_some();
    let stream = req["stream"].as_bool().unwrap_or(false);
    let reply = {
        let mut st = mock.0.lock();
        let account = headers.get("chatgpt-account-id").and_then(|v| v.to_str().ok()).map(str::to_string);
        st.seen.push(Seen { key: key.clone(), header, account, path: uri.path().to_string(), model: model.clone() });
        st.bodies.push(req.clone());
        st.script.get_mut(&key).and_then(VecDeque::pop_front).unwrap_or(if stream {
            Reply::Stream(3)
        } else {
            Reply::Ok
        })
    };
    let reply = match reply {
        Reply::After(d, then) => {
            tokio::time::sleep(d).await;
            *then
        }
        other => other,
    };
    let (reply, extra) = match reply {
        Reply::Headed(headers, reply) => (*reply, headers),
        other => (other, Vec::new()),
    };
    let mut response = match reply {
        Reply::Ok if anthropic => axum::Json(json!({
            "id": "msg_1", "type": "message", "role": "assistant", "model": model,
            "content": [{"type": "text", "text": "served"}], "stop_reason": "end_turn",
            "usage": {"input_tokens": 11, "output_tokens": 4}
        }))
        .into_response(),
        Reply::Ok => axum::Json(json!({
            "id": "chatcmpl-1", "object": "chat.completion", "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "served"}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
        }))
        .into_response(),
        Reply::Status(code, hdrs, body) => {
            let mut r = (StatusCode::from_u16(code).unwrap(), body).into_response();
            r.headers_mut().insert("content-type", "application/json".parse().unwrap());
            for (k, v) in hdrs {
                r.headers_mut().insert(k, v.parse().unwrap());
            }
            r
        }
        Reply::Delay(d) => {
            tokio::time::sleep(d).await;
            axum::Json(json!({"late": true})).into_response()
        }
        Reply::Echo(code, template) => {
            const KNOWN: [&str; 8] =
                ["model", "messages", "stream", "max_tokens", "temperature", "tools", "user", "metadata"];
            let extra = req.as_object().and_then(|o| o.keys().find(|k| !KNOWN.contains(&k.as_str()))).cloned();
            let escaped = serde_json::to_string(&extra.unwrap_or_default()).unwrap();
            let body = template.replace("{model}", &model).replace("{extra}", &escaped[1..escaped.len() - 1]);
            let mut r = (StatusCode::from_u16(code).unwrap(), body).into_response();
            r.headers_mut().insert("content-type", "application/json".parse().unwrap());
            r
        }
        Reply::SlowStatus(d, code) => {
            tokio::time::sleep(d).await;
            let body = json!({"error": {"message": format!("upstream failed after {d:?}"), "type": "server_error"}});
            (StatusCode::from_u16(code).unwrap(), axum::Json(body)).into_response()
        }
        stream => sse(stream, anthropic, mock.clone()),
    };
    for (k, v) in extra {
        response.headers_mut().insert(k, v.parse().unwrap());
    }
    response
}

/// The events of a realistic stream of `n` text deltas (`t0`, `t1`, …), in order: a keep-alive,
/// the preamble (Anthropic: `message_start`), the content, the usage and the terminal event.
pub fn stream_events(anthropic: bool, n: usize) -> Vec<String> {
    let mut evs = vec![": keep-alive\n\n".to_string()];
    evs.extend(first_content(anthropic));
    for i in 1..n {
        evs.push(delta(anthropic, i));
    }
    if anthropic {
        evs.push("event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n".into());
        evs.push("event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":4}}\n\n".into());
        evs.push("event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n".into());
    } else {
        evs.push("data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n".into());
        evs.push(
            "data: {\"id\":\"c\",\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":2}}\n\n".into(),
        );
        evs.push("data: [DONE]\n\n".into());
    }
    evs
}

fn delta(anthropic: bool, i: usize) -> String {
    if anthropic {
        format!(
            "event: content_block_delta\ndata: {{\"type\":\"content_block_delta\",\"index\":0,\"delta\":{{\"type\":\"text_delta\",\"text\":\"t{i}\"}}}}\n\n"
        )
    } else {
        format!(
            "data: {{\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"t{i}\"}}}}]}}\n\n"
        )
    }
}

/// The events up to and including the first content event (`t0`).
fn first_content(anthropic: bool) -> Vec<String> {
    if anthropic {
        vec![
            "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"m\",\"content\":[],\"usage\":{\"input_tokens\":11,\"output_tokens\":1}}}\n\n".into(),
            "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n".into(),
            delta(true, 0),
        ]
    } else {
        vec![delta(false, 0)]
    }
}

/// A recorded stream from `tests/fixtures/streams/`.
pub fn recorded(name: &str) -> String {
    let path = format!("{}/tests/fixtures/streams/{name}.sse", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// Cuts `body` (its events) into the writes `how` says.
fn writes(body: &[String], how: Writes) -> Vec<Bytes> {
    match how {
        Writes::Whole => vec![Bytes::from(body.concat())],
        Writes::PerEvent => body.iter().map(|e| Bytes::from(e.clone())).collect(),
        Writes::Bytes(n) => Bytes::from(body.concat()).chunks(n).map(Bytes::copy_from_slice).collect(),
    }
}

/// An OAuth token endpoint that grants every refresh: access `at-new-000N`, refresh `rt-new-000N`.
/// An authorization code (`grant_type=authorization_code`) is granted too, with an id_token
/// whose claims the code itself names: `code_for(sub, email)` (issuer `https://idp.test`).
async fn token(State(mock): State<Mock>, body: Bytes) -> Response {
    let (n, lifetime, delay) = {
        let mut st = mock.0.lock();
        st.token_calls += 1;
        (st.token_calls, st.token_lifetime.unwrap_or(3600), st.token_delay)
    };
    tokio::time::sleep(delay).await;
    let form: HashMap<String, String> = url::form_urlencoded::parse(&body).into_owned().collect();
    if form.get("refresh_token").is_some_and(|t| t.starts_with("revoked")) {
        let refused = json!({"error": "invalid_grant", "error_description": "refresh token revoked"});
        return (StatusCode::BAD_REQUEST, axum::Json(refused)).into_response();
    }
    let mut answer = json!({
        "access_token": format!("at-new-{n:04}"), "token_type": "Bearer", "expires_in": lifetime,
        "refresh_token": format!("rt-new-{n:04}"),
    });
    if form.get("grant_type").map(String::as_str) == Some("authorization_code") {
        use base64::Engine as _;
        let claims = form.get("code").and_then(|c| base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(c).ok());
        let Some(claims) = claims else {
            return (StatusCode::BAD_REQUEST, axum::Json(json!({"error": "invalid_grant"}))).into_response();
        };
        let enc = |b: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b);
        answer["id_token"] = json!(format!("{}.{}.sig", enc(br#"{"alg":"none"}"#), enc(&claims)));
    }
    axum::Json(answer).into_response()
}

/// An authorization code that the mock's token endpoint exchanges for tokens with an id_token
/// naming this account (`sub`, and `email` when given).
pub fn code_for(sub: &str, email: Option<&str>) -> String {
    use base64::Engine as _;
    let mut claims = json!({"iss": "https://idp.test", "sub": sub, "aud": "rota-test"});
    if let Some(e) = email {
        claims["email"] = json!(e);
    }
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(claims.to_string())
}

fn sse(reply: Reply, anthropic: bool, mock: Mock) -> Response {
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(8);
    tokio::spawn(async move {
        let send = |s: String| {
            let tx = tx.clone();
            async move { tx.send(Ok(Bytes::from(s))).await.is_ok() }
        };
        let write_all = |parts: Vec<Bytes>, how: Writes| {
            let tx = tx.clone();
            async move {
                for p in parts {
                    if tx.send(Ok(p)).await.is_err() {
                        return;
                    }
                    // Let each write leave on its own before the next; a few bytes at a time
                    // only give the writer its turn, or a stream would take seconds.
                    match how {
                        Writes::Bytes(_) => tokio::task::yield_now().await,
                        _ => tokio::time::sleep(Duration::from_millis(1)).await,
                    }
                }
            }
        };
        match reply {
            Reply::Stream(n) => write_all(writes(&stream_events(anthropic, n), Writes::Whole), Writes::Whole).await,
            Reply::Raw(body, how) => {
                let mut split = rota::gateway::translate::sse::Splitter::default();
                let mut evs: Vec<String> =
                    split.push(body.as_bytes()).into_iter().map(|e| String::from_utf8(e.raw).unwrap()).collect();
                evs.push(String::from_utf8(split.rest().to_vec()).unwrap());
                evs.retain(|e| !e.is_empty());
                write_all(writes(&evs, how), how).await
            }
            Reply::SlowStream { first, total } => {
                // The first event at `first`, the last (the terminal one) at `total`.
                let evs = stream_events(anthropic, 3);
                let pause = total.saturating_sub(first) / (evs.len() as u32 - 1);
                tokio::time::sleep(first).await;
                for (i, e) in evs.into_iter().enumerate() {
                    if i > 0 {
                        tokio::time::sleep(pause).await;
                    }
                    if !send(e).await {
                        return;
                    }
                }
            }
            Reply::StreamErrorFirst => {
                let ev = if anthropic {
                    let mut evs = vec![first_content(true)[0].clone()];
                    evs.push("event: ping\ndata: {\"type\":\"ping\"}\n\n".into());
                    evs.push("event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n".into());
                    evs.concat()
                } else {
                    "data: {\"error\":{\"message\":\"Rate limit reached\",\"type\":\"rate_limit_error\"}}\n\n".into()
                };
                send(ev).await;
            }
            Reply::StreamBreakAfterFirst => {
                send(first_content(anthropic).concat()).await;
                tokio::time::sleep(Duration::from_millis(50)).await;
                let _ = tx.send(Err(std::io::Error::other("upstream connection reset"))).await;
            }
            Reply::StreamErrorAfterFirst => {
                send(first_content(anthropic).concat()).await;
                send("event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n".into()).await;
            }
            Reply::StreamStallAfterFirst => {
                send(first_content(anthropic).concat()).await;
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_secs(30)) => {}
                    _ = tx.closed() => mock.0.lock().aborted += 1,
                }
            }
            _ => unreachable!(),
        }
    });
    let mut rx = rx;
    let body = Body::from_stream(futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx)));
    let mut r = Response::new(body);
    r.headers_mut().insert("content-type", "text/event-stream".parse().unwrap());
    r
}

/// The config every in-process test starts from: the provider `openai` at the mock (`base`)
/// and `openai/gpt-4.1` as the primary model. It ends inside `[models]`, so a variation may add
/// model keys right after it, then its own tables.
pub fn config(base: &str) -> String {
    format!("[providers.openai]\napi = \"openai\"\nbase_url = \"{base}/v1\"\n[models]\nprimary = \"openai/gpt-4.1\"\n")
}

/// The base config with the fallback most tests walk to: `backup/gpt-4.1-mini`, on a second
/// OpenAI-API provider `backup` at the same mock. It ends after a table of its own.
pub fn config_with_backup(base: &str) -> String {
    format!(
        "{}fallbacks = [\"backup/gpt-4.1-mini\"]\n[providers.backup]\napi = \"openai\"\nbase_url = \"{base}/v1\"\n",
        config(base)
    )
}

/// The provider `anthropic` (Anthropic's API) at the mock, a table to add to a config.
pub fn anthropic_provider(base: &str) -> String {
    format!("[providers.anthropic]\napi = \"anthropic\"\nbase_url = \"{base}\"\n")
}

/// The API keys the tests give rota: three `openai` profiles and one `backup` profile, each
/// with the secret the mock sees.
pub const KEYS: [(&str, &str); 4] = [
    ("openai:k1", "sk-test-key-one-0001"),
    ("openai:k2", "sk-test-key-two-0002"),
    ("openai:k3", "sk-test-key-three-0003"),
    ("backup:b1", "sk-test-backup-0004"),
];

/// The API key of an `anthropic` profile.
pub const ANTHROPIC_KEY: (&str, &str) = ("anthropic:main", "sk-ant-test-0005");

/// The request most tests send: `openai/gpt-4.1`, one user message.
pub fn chat() -> Value {
    json!({"model": "openai/gpt-4.1", "messages": [{"role": "user", "content": "hi"}]})
}

/// A provider `corp` in front of the mock at `base`, with OAuth settings whose token endpoint
/// is the mock's (`Mock::token_endpoint`), and `corp/m` as the primary model.
pub fn oauth_provider(base: &str) -> String {
    format!(
        r#"
[providers.corp]
api = "openai"
base_url = "{base}/v1"
[providers.corp.oauth]
authorize_url = "{base}/oauth/authorize"
token_url = "{base}/oauth/token"
client_id = "rota-test"
[models]
primary = "corp/m"
"#
    )
}

/// The `rota` binary, with `ROTA_LOG=warn` and none of the caller's other `ROTA_*` variables.
pub fn rota_command() -> std::process::Command {
    rota_command_of(env!("CARGO_BIN_EXE_rota").as_ref())
}

/// `rota_command` for another build of the binary (the fault suite's `ROTA_FAULTS_BIN`).
pub fn rota_command_of(bin: &std::ffi::OsStr) -> std::process::Command {
    let mut c = std::process::Command::new(bin);
    c.env("ROTA_LOG", "warn");
    for (k, _) in std::env::vars() {
        if k.starts_with("ROTA_") && k != "ROTA_LOG" {
            c.env_remove(k);
        }
    }
    c
}

/// A fresh, empty database on the throwaway PostgreSQL server that `scripts/test.sh` starts
/// (`ROTA_TEST_PG`: a URL of that server's maintenance database).
pub async fn postgres_database() -> String {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let admin = std::env::var("ROTA_TEST_PG").expect(
        "ROTA_TEST_PG is not set: the PostgreSQL tests need the server that scripts/test.sh starts \
         (or `eval $(scripts/postgres.sh start DIR)`)",
    );
    let name = format!(
        "rota_{}_{}_{}",
        std::process::id(),
        NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        fastrand::u32(..)
    );
    let mut conn = <sqlx::PgConnection as sqlx::Connection>::connect(&admin).await.unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}"))).execute(&mut conn).await.unwrap();
    let mut url = url::Url::parse(&admin).unwrap();
    url.set_path(&name);
    url.to_string()
}

/// One `attempts` row as the tests compare it.
#[derive(Clone, Debug, PartialEq, Eq, sqlx::FromRow)]
pub struct AttemptRow {
    pub kind: String,
    /// `provider/model`.
    pub model: String,
    pub profile: Option<String>,
    pub outcome: String,
    pub reason: Option<String>,
    /// The upstream's HTTP status.
    pub status: Option<i64>,
}

/// The `AttemptRow` the test expects.
pub fn row(
    kind: &str,
    model: &str,
    profile: Option<&str>,
    outcome: &str,
    reason: Option<&str>,
    status: Option<i64>,
) -> AttemptRow {
    AttemptRow {
        kind: kind.into(),
        model: model.into(),
        profile: profile.map(str::to_string),
        outcome: outcome.into(),
        reason: reason.map(str::to_string),
        status,
    }
}

/// What a test starts rota with (`spawn`).
#[derive(Default)]
pub struct Scenario<'a> {
    /// TOML without `[database]`.
    pub config: &'a str,
    /// API-key profiles, `(id, secret)`, in priority order.
    pub keys: &'a [(&'a str, &'a str)],
    /// OAuth profiles, `(id, access token, refresh token)`, the access token valid for a day.
    pub oauth: &'a [(&'a str, &'a str, &'a str)],
    pub db: Db,
    /// The clock rota runs on (the system's when `None`).
    pub clock: Option<Arc<Skewed>>,
    /// The real `rota serve` binary in a process of its own, instead of rota in-process: what a
    /// black-box suite talks to (`Rota::flush` then restarts it).
    pub binary: bool,
}

/// The system clock, moved on by the test (`advance`): a window that ends a minute from now
/// ends without waiting a minute.
#[derive(Default)]
pub struct Skewed(std::sync::atomic::AtomicI64);

impl Skewed {
    pub fn advance(&self, by: Duration) {
        self.0.fetch_add(by.as_millis() as i64, std::sync::atomic::Ordering::SeqCst);
    }
}

impl rota::engine::Clock for Skewed {
    fn now(&self) -> rota::engine::Millis {
        chrono::Utc::now().timestamp_millis() + self.0.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// rota as the scenario says (in-process unless `binary`), with an agent `tester` and an admin
/// agent `admin`.
pub async fn spawn(scenario: Scenario<'_>) -> Rota {
    Rota::start(scenario).await
}

/// Where a test's rota keeps its state.
#[derive(Default)]
pub enum Db {
    /// `rota.db` in the instance's temporary folder.
    #[default]
    Sqlite,
    /// A PostgreSQL URL.
    Postgres(String),
}

/// The fault cases (`faults`) load both cores for seconds at a time, as they did in a test binary
/// of their own: while one runs, no other test's rota does. Every `Rota` and every CLI test's
/// directory holds a `Share`; a fault case waits, `Alone`, until none is held, and a new share
/// waits for the case to end. A test that holds a share never waits for another.
static GATE: (Mutex<(usize, bool)>, parking_lot::Condvar) = (Mutex::new((0, false)), parking_lot::Condvar::new());

/// A test's part of the process, taken from the fault cases (`GATE`).
pub struct Share(());

impl Share {
    pub fn take() -> Share {
        let mut st = GATE.0.lock();
        GATE.1.wait_while(&mut st, |(_, alone)| *alone);
        st.0 += 1;
        Share(())
    }
}

impl Drop for Share {
    fn drop(&mut self) {
        GATE.0.lock().0 -= 1;
        GATE.1.notify_all();
    }
}

/// The whole process, for one fault case (`GATE`).
pub struct Alone(());

impl Alone {
    pub fn take() -> Alone {
        let mut st = GATE.0.lock();
        GATE.1.wait_while(&mut st, |(shares, alone)| *shares > 0 || *alone);
        st.1 = true;
        Alone(())
    }
}

impl Drop for Alone {
    fn drop(&mut self) {
        GATE.0.lock().1 = false;
        GATE.1.notify_all();
    }
}

/// rota on a real SQLite file in a temporary folder (or a PostgreSQL database): in-process, or
/// the real binary (`Scenario::binary`).
pub struct Rota {
    pub url: String,
    pub agent_key: String,
    /// An admin agent's key (`admin`).
    pub admin_key: String,
    pub store: Arc<dyn Store>,
    /// The SQLite file's pool, for tests that read it with SQL (`None` on PostgreSQL).
    sqlite: Option<sqlx::SqlitePool>,
    /// The in-process instance's book and audit writer (`None` for the binary).
    app_flush: Option<(Arc<rota::book::Book>, rota::audit::Audit)>,
    /// The binary's process (`Scenario::binary`).
    process: Option<Process>,
    /// Shared by the instances of one database (`another`).
    pub dir: Arc<tempfile::TempDir>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    done: Option<tokio::task::JoinHandle<()>>,
    /// The clock the instance runs on, when the test moves it (`Scenario::clock`); another
    /// instance of the same database runs on it too.
    pub clock: Option<Arc<Skewed>>,
    _share: Share,
}

impl Rota {
    async fn start(Scenario { config, keys: profiles, oauth, db, clock, binary }: Scenario<'_>) -> Rota {
        let dir = tempfile::tempdir().unwrap();
        let text = match db {
            Db::Sqlite => format!("[database]\nurl = \"sqlite://{}\"\n{config}", dir.path().join("rota.db").display()),
            // Every instance of the fleet reads the one key file, as if given the same key.
            Db::Postgres(url) => {
                let key_file = format!("key_file = \"{}\"\n", dir.path().join("rota.key").display());
                let header = "[secrets]\n";
                let config = match config.find(header).map(|at| at + header.len()) {
                    Some(end) => format!("{}{key_file}{}", &config[..end], &config[end..]),
                    None => format!("{config}\n{header}{key_file}"),
                };
                format!("[database]\nurl = \"{url}\"\n{config}")
            }
        };
        let file = dir.path().join("rota.toml");
        std::fs::write(&file, &text).unwrap();
        let (loaded, _) = Config::load(Some(&file)).unwrap_or_else(|e| panic!("{e}"));
        let store = rota::store::open(&rota::store::DatabaseTarget::of(&loaded).unwrap()).await.unwrap();
        let (key, _) =
            resolve_key(&rota::store::key_anchor(&loaded).unwrap(), &[], rota::secrets::Choice::Off).unwrap();
        for (i, (id, secret)) in profiles.iter().enumerate() {
            let pid: ProfileId = id.parse().unwrap();
            let sealed = key.seal(&pid, SecretField::ApiKey, &SecretString::from(secret.to_string()));
            let row = StoredProfile::stored(pid, ProfileType::ApiKey, None, 1 + i as i64);
            store.add_profile(&row, &[sealed]).await.unwrap();
        }
        let day_later = chrono::Utc::now().timestamp_millis() + 86_400_000;
        for (id, access, refresh) in oauth {
            let pid: ProfileId = id.parse().unwrap();
            let sealed = [
                key.seal(&pid, SecretField::AccessToken, &SecretString::from(access.to_string())),
                key.seal(&pid, SecretField::RefreshToken, &SecretString::from(refresh.to_string())),
            ];
            store
                .save_login(&StoredProfile::stored(pid, ProfileType::OAuth, Some(day_later), 1), &sealed)
                .await
                .unwrap();
        }
        let agent_key = rota::agents::new_key();
        store
            .create_agent("tester", &rota::agents::digest(&agent_key), false, (&Default::default(), None), 0)
            .await
            .unwrap();
        let admin_key = rota::agents::new_key();
        store
            .create_agent("admin", &rota::agents::digest(&admin_key), true, (&Default::default(), None), 0)
            .await
            .unwrap();
        let keys = (
            secrecy::ExposeSecret::expose_secret(&agent_key).to_string(),
            secrecy::ExposeSecret::expose_secret(&admin_key).to_string(),
        );
        if binary {
            assert!(clock.is_none(), "the binary runs on its own clock");
            return Self::run_binary(Arc::new(dir), keys, store).await;
        }
        Self::serve(Arc::new(dir), keys, store, clock).await
    }

    /// The real `rota serve` on the `rota.toml` in `dir`, in a process of its own.
    async fn run_binary(
        dir: Arc<tempfile::TempDir>,
        (agent_key, admin_key): (String, String),
        store: Arc<dyn Store>,
    ) -> Rota {
        let share = Share::take();
        let (config, _) = Config::load(Some(&dir.path().join("rota.toml"))).unwrap();
        let sqlite = sqlite_pool(&config).await;
        let process = Process::start(dir.clone(), "127.0.0.1:0".into()).await;
        Rota {
            url: format!("http://{}", process.listen),
            agent_key,
            admin_key,
            store,
            sqlite,
            app_flush: None,
            process: Some(process),
            dir,
            stop: None,
            done: None,
            clock: None,
            _share: share,
        }
    }

    /// The in-process instance's book and audit writer.
    pub fn app(&self) -> &(Arc<rota::book::Book>, rota::audit::Audit) {
        self.app_flush.as_ref().expect("an in-process instance")
    }

    /// A second instance on the same database and config file, as a load balancer's second
    /// backend runs it.
    pub async fn another(&self) -> Rota {
        let (config, _) = Config::load(Some(&self.dir.path().join("rota.toml"))).unwrap();
        let store = rota::store::open(&rota::store::DatabaseTarget::of(&config).unwrap()).await.unwrap();
        Self::serve(self.dir.clone(), (self.agent_key.clone(), self.admin_key.clone()), store, self.clock.clone()).await
    }

    /// rota serving the `rota.toml` in `dir` (its database already set up), with these agent
    /// and admin keys.
    pub async fn on_config(dir: tempfile::TempDir, keys: (String, String)) -> Rota {
        let (config, _) = Config::load(Some(&dir.path().join("rota.toml"))).unwrap();
        let store = rota::store::open(&rota::store::DatabaseTarget::of(&config).unwrap()).await.unwrap();
        Self::serve(Arc::new(dir), keys, store, None).await
    }

    async fn serve(
        dir: Arc<tempfile::TempDir>,
        (agent_key, admin_key): (String, String),
        store: Arc<dyn Store>,
        clock: Option<Arc<Skewed>>,
    ) -> Rota {
        let share = Share::take();
        let file = dir.path().join("rota.toml");
        let (config, _) = Config::load(Some(&file)).unwrap_or_else(|e| panic!("{e}"));
        let sqlite = sqlite_pool(&config).await;
        let on: Arc<dyn rota::engine::Clock> = match &clock {
            Some(c) => c.clone(),
            None => Arc::new(rota::engine::SystemClock),
        };
        let app = App::build_on(config, Some(file), on).await.unwrap();
        let app_flush = (app.book.clone(), app.audit.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let (stop, rx) = tokio::sync::oneshot::channel::<()>();
        let done = tokio::spawn(async move {
            app.serve(listener, async move {
                let _ = rx.await;
            })
            .await
            .unwrap()
        });
        Rota {
            url,
            agent_key,
            admin_key,
            store,
            sqlite,
            app_flush: Some(app_flush),
            process: None,
            dir,
            stop: Some(stop),
            done: Some(done),
            clock,
            _share: share,
        }
    }

    /// The SQLite file's pool (tests that read the database with SQLite's SQL).
    pub fn pool(&self) -> &sqlx::SqlitePool {
        self.sqlite.as_ref().expect("an SQLite instance")
    }

    /// Everything rota has to write is written. The binary is stopped with SIGTERM (which writes
    /// it all) and started again on the same address: what it knows then is what it reads back
    /// from the database, so a lease issued before is gone.
    pub async fn flush(&self) {
        match (&self.app_flush, &self.process) {
            (Some((book, audit)), _) => {
                book.flush().await;
                audit.flush().await;
            }
            (None, Some(process)) => process.restart().await,
            (None, None) => unreachable!("an instance is in-process or a process"),
        }
    }

    /// Stops the server the way SIGTERM does and waits for it to drain.
    pub async fn shutdown(&mut self) {
        if let Some(process) = &self.process {
            process.stop().await;
        }
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(d) = self.done.take() {
            d.await.unwrap();
        }
    }

    pub fn client() -> reqwest::Client {
        let _ = rustls::crypto::ring::default_provider().install_default();
        reqwest::Client::builder().timeout(Duration::from_secs(20)).build().unwrap()
    }

    pub async fn chat(&self, body: Value, headers: &[(&str, &str)]) -> reqwest::Response {
        let mut req =
            Self::client().post(format!("{}/v1/chat/completions", self.url)).bearer_auth(&self.agent_key).json(&body);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        req.send().await.unwrap()
    }

    pub async fn messages(&self, body: Value) -> reqwest::Response {
        Self::client()
            .post(format!("{}/v1/messages", self.url))
            .header("x-api-key", &self.agent_key)
            .header("anthropic-version", "2023-06-01")
            .json(&body)
            .send()
            .await
            .unwrap()
    }

    /// The `attempts` rows, in the order they were made.
    pub async fn attempts(&self) -> Vec<AttemptRow> {
        self.flush().await;
        sqlx::query_as(
            "SELECT kind, provider || '/' || model AS model, profile_id AS profile, outcome, reason, http_status AS status
             FROM attempts ORDER BY started_at, request_id, seq",
        )
        .fetch_all(self.pool())
        .await
        .unwrap()
    }

    /// Calls `/api/v1` with `key`: the status and the JSON answer (`Null` for an empty body).
    pub async fn api(&self, method: &str, path: &str, key: Option<&str>, body: Option<Value>) -> (u16, Value) {
        let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
        let mut req = Self::client().request(method, format!("{}{path}", self.url));
        if let Some(k) = key {
            req = req.bearer_auth(k);
        }
        if let Some(b) = body {
            req = req.json(&b);
        }
        let r = req.send().await.unwrap();
        let status = r.status().as_u16();
        let text = r.text().await.unwrap();
        (status, if text.is_empty() { Value::Null } else { serde_json::from_str(&text).unwrap_or(Value::String(text)) })
    }

    pub async fn scalar(&self, sql: &'static str) -> Option<i64> {
        self.flush().await;
        sqlx::query_scalar(sql).fetch_one(self.pool()).await.unwrap()
    }
}

/// A pool on the config's SQLite file, for tests that read it with SQL (`None` on PostgreSQL).
async fn sqlite_pool(config: &Config) -> Option<sqlx::SqlitePool> {
    match rota::store::DatabaseTarget::of(config).unwrap() {
        rota::store::DatabaseTarget::Sqlite(path) => {
            let opts = sqlx::sqlite::SqliteConnectOptions::new().filename(path).busy_timeout(Duration::from_secs(10));
            Some(sqlx::SqlitePool::connect_with(opts).await.unwrap())
        }
        rota::store::DatabaseTarget::Postgres(_) => None,
    }
}

/// A `rota serve` process on the `rota.toml` in its folder, listening where it first did.
struct Process {
    dir: Arc<tempfile::TempDir>,
    listen: String,
    child: Mutex<Option<std::process::Child>>,
}

impl Process {
    async fn start(dir: Arc<tempfile::TempDir>, listen: String) -> Process {
        let (child, listen) = {
            let dir = dir.clone();
            tokio::task::spawn_blocking(move || Self::spawn(dir.path(), &listen)).await.unwrap()
        };
        Process { dir, listen, child: Mutex::new(Some(child)) }
    }

    /// Starts the binary (blocking until it listens): it and its address.
    fn spawn(dir: &std::path::Path, listen: &str) -> (std::process::Child, String) {
        use std::io::BufRead;
        let mut child = rota_command()
            .args(["serve", "--listen", listen])
            .current_dir(dir)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        let addr = line.trim().strip_prefix("rota listening on http://").unwrap_or_else(|| panic!("{line:?}"));
        // Whatever else it prints is read, so that it never writes to a closed pipe.
        std::thread::spawn(move || std::io::copy(&mut out, &mut std::io::sink()));
        (child, addr.to_string())
    }

    /// SIGTERM, and its exit awaited: it must exit 0 (all written).
    async fn stop(&self) {
        let child = self.child.lock().take();
        if let Some(child) = child {
            let status = tokio::task::spawn_blocking(move || stop(child)).await.unwrap();
            assert!(status.success(), "rota exited with {status} on SIGTERM");
        }
    }

    async fn restart(&self) {
        self.stop().await;
        let (dir, listen) = (self.dir.clone(), self.listen.clone());
        let (child, _) = tokio::task::spawn_blocking(move || Self::spawn(dir.path(), &listen)).await.unwrap();
        *self.child.lock() = Some(child);
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.lock().take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// SIGTERM to a child rota process, then its exit status (killed after 10 s).
pub fn stop(mut child: std::process::Child) -> std::process::ExitStatus {
    std::process::Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if std::time::Instant::now() > deadline {
            child.kill().unwrap();
            panic!("rota did not stop on SIGTERM");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}
