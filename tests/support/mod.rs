//! Test support: a fault-injecting upstream that answers per API key, and rota started
//! in-process on a real SQLite file.
#![allow(dead_code)]

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use bytes::Bytes;
use rota::config::Config;
use rota::engine::{ProfileId, ProfileType};
use rota::secrets::{SecretField, resolve_key};
use rota::server::App;
use rota::store::{SqliteStore, Store, StoredProfile};
use secrecy::SecretString;
use serde_json::{Value, json};
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What the mock answers to one call.
#[derive(Clone, Debug)]
pub enum Reply {
    Ok,
    Status(u16, Vec<(&'static str, String)>, String),
    /// A 200 stream of `n` content events.
    Stream(usize),
    /// A 200 stream whose first event is an error.
    StreamErrorFirst,
    /// A 200 stream that sends one content event, then drops the connection.
    StreamBreakAfterFirst,
    /// A 200 stream that sends one content event, then an error event.
    StreamErrorAfterFirst,
    /// A 200 stream that sends one content event, then nothing.
    StreamStallAfterFirst,
    /// No answer for this long.
    Delay(Duration),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Seen {
    pub key: String,
    pub path: String,
    pub model: String,
}

#[derive(Default)]
struct MockState {
    script: HashMap<String, VecDeque<Reply>>,
    seen: Vec<Seen>,
    /// Streams whose reader (rota) went away before the stream ended.
    aborted: usize,
}

#[derive(Clone, Default)]
pub struct Mock(Arc<Mutex<MockState>>);

impl Mock {
    /// Queues replies for calls made with `key` (then 200s).
    pub fn script(&self, key: &str, replies: Vec<Reply>) {
        self.0.lock().unwrap().script.entry(key.to_string()).or_default().extend(replies);
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.0.lock().unwrap().seen.clone()
    }

    pub fn aborted(&self) -> usize {
        self.0.lock().unwrap().aborted
    }

    pub fn keys(&self) -> Vec<String> {
        self.seen().into_iter().map(|s| s.key).collect()
    }

    pub async fn start(&self) -> String {
        let app = axum::Router::new()
            .route("/v1/chat/completions", post(answer))
            .route("/v1/messages", post(answer))
            .route("/v1/responses", post(answer))
            .with_state(self.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        format!("http://{addr}")
    }
}

async fn answer(State(mock): State<Mock>, uri: axum::http::Uri, headers: HeaderMap, body: Bytes) -> Response {
    let key = headers
        .get("x-api-key")
        .or_else(|| headers.get("authorization"))
        .and_then(|v| v.to_str().ok())
        .map(|v| v.trim_start_matches("Bearer ").to_string())
        .unwrap_or_default();
    let req: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let model = req["model"].as_str().unwrap_or("").to_string();
    let anthropic = uri.path() == "/v1/messages";
    let stream = req["stream"].as_bool().unwrap_or(false);
    let reply = {
        let mut st = mock.0.lock().unwrap();
        st.seen.push(Seen { key: key.clone(), path: uri.path().to_string(), model: model.clone() });
        st.script.get_mut(&key).and_then(VecDeque::pop_front).unwrap_or(if stream {
            Reply::Stream(3)
        } else {
            Reply::Ok
        })
    };
    match reply {
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
        stream => sse(stream, anthropic, mock.clone()),
    }
}

fn content_event(anthropic: bool, i: usize) -> String {
    if anthropic {
        if i == 0 {
            "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":11}}}\n\n"
                .into()
        } else {
            format!(
                "event: content_block_delta\ndata: {{\"type\":\"content_block_delta\",\"index\":0,\"delta\":{{\"type\":\"text_delta\",\"text\":\"t{i}\"}}}}\n\n"
            )
        }
    } else {
        format!(
            "data: {{\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"t{i}\"}}}}]}}\n\n"
        )
    }
}

fn sse(reply: Reply, anthropic: bool, mock: Mock) -> Response {
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(8);
    tokio::spawn(async move {
        let send = |s: String| {
            let tx = tx.clone();
            async move { tx.send(Ok(Bytes::from(s))).await.is_ok() }
        };
        match reply {
            Reply::Stream(n) => {
                send(": keep-alive\n\n".into()).await;
                for i in 0..n {
                    send(content_event(anthropic, i)).await;
                }
                let end = if anthropic {
                    "event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":4}}\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n".to_string()
                } else {
                    "data: {\"id\":\"c\",\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":2}}\n\ndata: [DONE]\n\n".to_string()
                };
                send(end).await;
            }
            Reply::StreamErrorFirst => {
                let ev = if anthropic {
                    "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n"
                } else {
                    "data: {\"error\":{\"message\":\"Rate limit reached\",\"type\":\"rate_limit_error\"}}\n\n"
                };
                send(ev.into()).await;
            }
            Reply::StreamBreakAfterFirst => {
                send(content_event(anthropic, 0)).await;
                tokio::time::sleep(Duration::from_millis(50)).await;
                let _ = tx.send(Err(std::io::Error::other("upstream connection reset"))).await;
            }
            Reply::StreamErrorAfterFirst => {
                send(content_event(anthropic, 0)).await;
                send("event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n".into()).await;
            }
            Reply::StreamStallAfterFirst => {
                send(content_event(anthropic, 0)).await;
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_secs(30)) => {}
                    _ = tx.closed() => mock.0.lock().unwrap().aborted += 1,
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

/// rota, in-process, on a real SQLite file in a temporary folder.
pub struct Rota {
    pub url: String,
    pub agent_key: String,
    /// An admin agent's key (`admin`).
    pub admin_key: String,
    pub store: SqliteStore,
    pub app_flush: (Arc<rota::book::Book>, rota::audit::Audit),
    pub dir: tempfile::TempDir,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    done: Option<tokio::task::JoinHandle<()>>,
}

impl Rota {
    /// `config` is TOML without `[database]`; `profiles` are `(id, secret)` API keys.
    pub async fn start(config: &str, profiles: &[(&str, &str)]) -> Rota {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("rota.db");
        let text = format!("[database]\nurl = \"sqlite://{}\"\n{config}", db.display());
        let file = dir.path().join("rota.toml");
        std::fs::write(&file, &text).unwrap();
        let (config, _) = Config::load(Some(&file)).unwrap_or_else(|e| panic!("{e}"));
        let store = SqliteStore::open(&db).await.unwrap();
        let (key, _) = resolve_key(&db, &[], rota::secrets::Choice::Off).unwrap();
        for (i, (id, secret)) in profiles.iter().enumerate() {
            let pid: ProfileId = id.parse().unwrap();
            let sealed = key.seal(&pid, SecretField::ApiKey, &SecretString::from(secret.to_string()));
            let row = StoredProfile::stored(pid, ProfileType::ApiKey, None, 1 + i as i64);
            store.add_profile(&row, &[sealed]).await.unwrap();
        }
        let agent_key = rota::agents::new_key();
        store.create_agent("tester", &rota::agents::digest(&agent_key), false, 0).await.unwrap();
        let admin_key = rota::agents::new_key();
        store.create_agent("admin", &rota::agents::digest(&admin_key), true, 0).await.unwrap();
        let app = App::build(config, Some(file)).await.unwrap();
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
            agent_key: secrecy::ExposeSecret::expose_secret(&agent_key).to_string(),
            admin_key: secrecy::ExposeSecret::expose_secret(&admin_key).to_string(),
            store,
            app_flush,
            dir,
            stop: Some(stop),
            done: Some(done),
        }
    }

    pub async fn flush(&self) {
        self.app_flush.0.flush().await;
        self.app_flush.1.flush().await;
    }

    /// Stops the server the way SIGTERM does and waits for it to drain.
    pub async fn shutdown(&mut self) {
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

    /// `attempts` rows as `(kind, provider/model, profile, outcome, reason, http_status)`.
    pub async fn attempts(&self) -> Vec<(String, String, Option<String>, String, Option<String>, Option<i64>)> {
        self.flush().await;
        sqlx::query_as(
            "SELECT kind, provider || '/' || model, profile_id, outcome, reason, http_status FROM attempts ORDER BY started_at, request_id, seq",
        )
        .fetch_all(self.store.pool())
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
        sqlx::query_scalar(sql).fetch_one(self.store.pool()).await.unwrap()
    }
}
