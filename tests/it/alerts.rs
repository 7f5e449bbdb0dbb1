//! Alerts (docs/operations.md, "Alerts") against a webhook receiver that checks each body's
//! HMAC-SHA256 signature: every event kind is raised by what really causes it (an upstream's
//! 402 and 429, a refresh token refused, a request served by a fallback and by a paid profile,
//! an agent's tokens, a database locked past its busy timeout and the audit rows it sheds), each
//! once per rule, subject and interval; a receiver down for 30 s gets every alert afterwards,
//! once, from a two-instance fleet on PostgreSQL; the delivery rows say so.

use crate::support::{self, Db, KEYS, Mock, Reply, Rota, Scenario, Skewed, spawn};
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, Uri};
use parking_lot::Mutex;
use serde_json::{Value, json};
use sqlx::Connection;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The signing key's variable: cargo sets it for the test process, and rota reads it there.
const SECRET_ENV: &str = "CARGO_PKG_VERSION";
const SECRET: &str = env!("CARGO_PKG_VERSION");

/// Two texts, an attempt count, and a delivery's status and error, as the tests read them.
type DeliveryRow = (String, String, i64, Option<i64>, Option<String>);

/// One post the receiver took.
#[derive(Clone, Debug)]
struct Got {
    path: String,
    id: String,
    body: Value,
}

/// A webhook receiver: `/hook` takes a JSON alert only with its right signature (else 401, and
/// counts it), `/slack` any Slack body.
#[derive(Clone, Default)]
struct Receiver {
    got: Arc<Mutex<Vec<Got>>>,
    refused: Arc<Mutex<usize>>,
}

impl Receiver {
    /// Serves on `listener` until the test ends.
    fn serve(&self, listener: tokio::net::TcpListener) {
        let app = axum::Router::new()
            .route("/hook", axum::routing::post(take))
            .route("/slack", axum::routing::post(take))
            .route("/slack/{*path}", axum::routing::post(take))
            .with_state(self.clone());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    }

    fn got(&self) -> Vec<Got> {
        self.got.lock().clone()
    }

    /// The JSON alerts taken, by kind and subject.
    fn by_kind(&self) -> BTreeMap<(String, String), usize> {
        let mut out = BTreeMap::new();
        for g in self.got().iter().filter(|g| g.path == "/hook") {
            let key = (g.body["kind"].as_str().unwrap().to_string(), g.body["subject"].as_str().unwrap().to_string());
            *out.entry(key).or_default() += 1;
        }
        out
    }

    /// Waits until `done` holds of what was taken, for `limit` at most.
    async fn wait(&self, limit: Duration, what: &str, done: impl Fn(&Receiver) -> bool) {
        let t = Instant::now();
        while !done(self) {
            assert!(t.elapsed() < limit, "{what}: not within {limit:?}; taken: {:#?}", self.by_kind());
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

async fn take(State(r): State<Receiver>, uri: Uri, headers: HeaderMap, body: Bytes) -> StatusCode {
    let path = uri.path().to_string();
    if path == "/hook" {
        let signature = headers.get("x-rota-signature").and_then(|v| v.to_str().ok()).unwrap_or_default();
        let tag = signature.strip_prefix("sha256=").and_then(hex).unwrap_or_default();
        let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, SECRET.as_bytes());
        if ring::hmac::verify(&key, &body, &tag).is_err() {
            *r.refused.lock() += 1;
            return StatusCode::UNAUTHORIZED;
        }
    }
    let id = headers.get("x-rota-alert-id").and_then(|v| v.to_str().ok()).unwrap_or_default().to_string();
    r.got.lock().push(Got { path, id, body: serde_json::from_slice(&body).unwrap() });
    StatusCode::NO_CONTENT
}

fn hex(text: &str) -> Option<Vec<u8>> {
    (0..text.len()).step_by(2).map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok()).collect()
}

/// A receiver listening now, and its URL.
async fn receiver() -> (Receiver, String) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let r = Receiver::default();
    r.serve(listener);
    (r, url)
}

const KINDS: &str = r#"["needs_relogin", "disabled", "provider_cooling", "fallback", "paid", "budget", "audit_shed", "database_failing"]"#;

/// `openai` (the test's keys), `backup` (the paid profile `backup:paid`, declared in the file) as
/// the fallback, `corp` (an OAuth account); rule `ops` sends every kind to `/hook`, rule `chat`
/// the fallbacks to `/slack`.
fn config(base: &str, hook: &str, audit_queue: usize) -> String {
    format!(
        r#"[providers.openai]
api = "openai"
base_url = "{base}/v1"
[providers.backup]
api = "openai"
base_url = "{base}/v1"
[providers.corp]
api = "openai"
base_url = "{base}/v1"
[providers.corp.oauth]
authorize_url = "{base}/oauth/authorize"
token_url = "{base}/oauth/token"
client_id = "rota-test"
[models]
primary = "openai/gpt-4.1"
fallbacks = ["backup/gpt-4.1-mini"]
[audit]
queue = {audit_queue}
[auth.profiles."backup:paid"]
provider = "backup"
api_key_env = "CARGO_PKG_NAME"
paid = true
[agents.tester]
tokens_per_day = 1000
[[alerts]]
name = "ops"
on = {KINDS}
url = "{hook}/hook"
secret_env = "{SECRET_ENV}"
min_interval = "10m"
budget_share = 0.05
[[alerts]]
name = "chat"
on = ["fallback"]
url = "{hook}/slack"
format = "slack"
min_interval = "10m"
"#
    )
}

async fn served(rota: &Rota, model: &str) {
    let r = rota.chat(json!({"model": model, "messages": [{"role": "user", "content": "hi"}]}), &[]).await;
    assert_eq!(r.status(), 200, "{model}: {}", r.text().await.unwrap());
}

/// Models a client makes up are no subjects: however many invented names fail over, each rule
/// sends one `fallback` alert an interval, its subject the provider's `other`, and Slack shows the
/// text as text.
#[tokio::test]
async fn invented_model_names_raise_one_fallback_alert_per_rule_and_interval() {
    let (receiver, hook) = receiver().await;
    let (mock, base) = Mock::started().await;
    let config = format!(
        r#"{}
[[alerts]]
name = "ops"
on = ["fallback"]
url = "{hook}/hook"
secret_env = "{SECRET_ENV}"
min_interval = "10m"
[[alerts]]
name = "chat <!channel>"
on = ["fallback"]
url = "{hook}/slack"
format = "slack"
min_interval = "10m"
"#,
        support::config_with_backup(&base)
    );
    let rota = spawn(Scenario { config: &config, keys: &[KEYS[0], KEYS[3]], ..Scenario::default() }).await;
    let limited = Reply::Status(429, vec![], r#"{"error":{"message":"Rate limit reached"}}"#.into());
    mock.script(KEYS[0].1, vec![limited; 1_100]);
    for i in 0..1_000 {
        served(&rota, &format!("openai/invented-{i}")).await;
    }
    receiver.wait(Duration::from_secs(20), "the fallback alerts", |r| r.got().len() >= 2).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let got = receiver.got();
    assert_eq!(got.len(), 2, "one post per rule: {got:#?}");
    assert_eq!(receiver.by_kind(), BTreeMap::from([(("fallback".to_string(), "openai/other".to_string()), 1)]));
    let slack = got.iter().find(|g| g.path == "/slack").unwrap();
    let text = slack.body["text"].as_str().unwrap();
    assert_eq!(
        text,
        "rota · chat &lt;!channel&gt;: openai/other failed over: a request was served by backup/gpt-4.1-mini"
    );
}

#[tokio::test]
async fn each_event_kind_reaches_a_signed_webhook_once_per_interval_and_every_delivery_is_recorded() {
    let (receiver, hook) = receiver().await;
    let (mock, base) = Mock::started().await;
    let clock = Arc::new(Skewed::default());
    let rota = spawn(Scenario {
        config: &config(&base, &hook, 24),
        keys: &KEYS[..2],
        oauth: &[("corp:alice", "at-alice", "revoked-rt-alice")],
        clock: Some(clock.clone()),
        ..Scenario::default()
    })
    .await;

    // k1 is out of credit (the disabled lane), k2 is rate limited (each time it is tried again,
    // last): every openai account cools or is disabled, and the requests are served by the
    // fallback, on the paid profile.
    mock.script(KEYS[0].1, vec![Reply::Status(402, vec![], r#"{"error":{"message":"Insufficient credits"}}"#.into())]);
    let limited = Reply::Status(429, vec![], r#"{"error":{"message":"Rate limit reached"}}"#.into());
    mock.script(KEYS[1].1, vec![limited; 40]);
    served(&rota, "openai/gpt-4.1").await;
    // The OAuth account's token is refused and so is its refresh token: it needs a re-login.
    mock.script("at-alice", vec![Reply::Status(401, vec![], r#"{"error":{"message":"invalid token"}}"#.into())]);
    served(&rota, "corp/m").await;
    // More of the same within the interval, and tokens past 5% of the agent's 1000 a day.
    for _ in 0..10 {
        served(&rota, "openai/gpt-4.1").await;
    }
    let first = [
        ("budget", "tester/tokens_per_day"),
        ("disabled", "openai:k1"),
        ("fallback", "corp/other"),
        ("fallback", "openai/gpt-4.1"),
        ("needs_relogin", "corp:alice"),
        ("paid", "backup:paid"),
        ("provider_cooling", "openai"),
    ];
    let has = |want: &[(&str, &str)]| {
        let want: BTreeMap<(String, String), usize> =
            want.iter().map(|(k, s)| ((k.to_string(), s.to_string()), 1)).collect();
        move |r: &Receiver| r.by_kind() == want
    };
    receiver.wait(Duration::from_secs(20), "the first alerts", has(&first)).await;

    // A writer blocked past SQLite's busy timeout: the database write fails; the audit rows of
    // the requests meanwhile overflow the queue of 24 and are shed. Both alerts wait in memory
    // until the database takes them again.
    let mut blocker =
        sqlx::SqliteConnection::connect(&format!("sqlite://{}", rota.dir.path().join("rota.db").display()))
            .await
            .unwrap();
    sqlx::query("BEGIN EXCLUSIVE").execute(&mut blocker).await.unwrap();
    let locked = Instant::now();
    let writes = tokio::spawn({
        let (url, key) = (rota.url.clone(), rota.agent_key.clone());
        async move {
            let body = json!({"model": "openai/gpt-4.1", "messages": [{"role": "user", "content": "hi"}]});
            Rota::client().post(format!("{url}/v1/chat/completions")).bearer_auth(key).json(&body).send().await
        }
    });
    let health = |rota: &Rota| {
        let url = format!("{}/healthz", rota.url);
        async move { Rota::client().get(url).send().await.unwrap().json::<Value>().await.unwrap() }
    };
    while health(&rota).await["audit"]["failing"] != true {
        assert!(locked.elapsed() < Duration::from_secs(30), "the audit writer never failed");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    futures_util::future::join_all((0..12).map(|_| served(&rota, "openai/gpt-4.1"))).await;
    assert_eq!(writes.await.unwrap().unwrap().status(), 200);
    let shed = health(&rota).await["audit"]["dropped_attempts"].as_u64().unwrap();
    assert!(shed > 0, "nothing was shed");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(receiver.by_kind().len(), first.len(), "no alert leaves while the database refuses them");
    sqlx::query("ROLLBACK").execute(&mut blocker).await.unwrap();
    let all: Vec<(&str, &str)> =
        first.iter().copied().chain([("audit_shed", "audit"), ("database_failing", "database")]).collect();
    receiver.wait(Duration::from_secs(30), "the database's alerts", has(&all)).await;

    // The Slack rule's bodies are its text; every JSON body names its rule, kind and subject.
    let got = receiver.got();
    let slack: Vec<&Got> = got.iter().filter(|g| g.path == "/slack").collect();
    assert_eq!(slack.len(), 2, "{slack:?}");
    assert!(slack.iter().all(|g| g.body["text"].as_str().unwrap().starts_with("rota · chat: ")), "{slack:?}");
    for g in got.iter().filter(|g| g.path == "/hook") {
        assert_eq!((g.body["rule"].as_str(), g.body["id"].as_str()), (Some("ops"), Some(g.id.as_str())), "{g:?}");
    }
    let paid = got.iter().find(|g| g.body["kind"] == "paid").unwrap();
    assert_eq!(paid.body["details"]["served_profile"], "backup:paid");
    assert_eq!(*receiver.refused.lock(), 0, "every signature was right");

    // After the interval, the same events alert again, once. The writer first writes what
    // waited in the queue of 24: a request's rows shed after the interval would be a new
    // `audit_shed`, rightly raised again.
    while health(&rota).await["audit"]["queued"] != 0 {
        assert!(locked.elapsed() < Duration::from_secs(60), "the audit queue never drained");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    clock.advance(Duration::from_secs(601));
    served(&rota, "corp/m").await;
    served(&rota, "corp/m").await;
    let again = |r: &Receiver| {
        let k = r.by_kind();
        let n = |kind: &str, subject: &str| k.get(&(kind.to_string(), subject.to_string())).copied();
        (n("paid", "backup:paid"), n("fallback", "corp/other"), n("budget", "tester/tokens_per_day"))
            == (Some(2), Some(2), Some(2))
    };
    receiver.wait(Duration::from_secs(20), "the alerts after the interval", again).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let k = receiver.by_kind();
    assert_eq!(k.values().sum::<usize>(), all.len() + 3, "{k:#?}");

    // The outbox and the delivery rows say the same: each alert delivered at its first attempt.
    let rows: Vec<DeliveryRow> = sqlx::query_as(
        "SELECT o.state, o.kind, o.attempts, d.status, d.error FROM alert_outbox o
         JOIN alert_deliveries d ON d.alert_id = o.id ORDER BY o.raised_at",
    )
    .fetch_all(rota.pool())
    .await
    .unwrap();
    assert_eq!(rows.len(), receiver.got().len(), "one delivery row per alert: {rows:?}");
    assert!(
        rows.iter().all(|(state, _, n, status, error)| state == "delivered"
            && *n == 1
            && *status == Some(204)
            && error.is_none()),
        "{rows:?}"
    );
}

/// Two instances on one PostgreSQL database raise the same events; the receiver is down for
/// 30 s, then up: every alert arrives once, none twice.
#[tokio::test]
async fn a_receiver_down_for_30_s_gets_every_alert_once_from_a_two_instance_fleet() {
    let url = support::postgres_database().await;
    // The receiver's port, closed for now: rota's posts are refused.
    let port = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap().local_addr().unwrap().port();
    let hook = format!("http://127.0.0.1:{port}");
    let (mock, base) = Mock::started().await;
    let one = spawn(Scenario {
        config: &config(&base, &hook, 10_000),
        keys: &KEYS[..1],
        db: Db::Postgres(url.clone()),
        ..Scenario::default()
    })
    .await;
    let two = one.another().await;
    let down = Instant::now();
    // Out of credit, whichever instance asks it (the second may try it before it hears).
    let broke = Reply::Status(402, vec![], r#"{"error":{"message":"Insufficient credits"}}"#.into());
    mock.script(KEYS[0].1, vec![broke; 10]);
    served(&one, "openai/gpt-4.1").await;
    for rota in [&one, &two, &one, &two] {
        served(rota, "openai/gpt-4.1").await;
        served(rota, "openai/gpt-4.1-nano").await;
    }
    let mut pg = sqlx::PgConnection::connect(&url).await.unwrap();
    let outbox = || "SELECT kind, subject, state FROM alert_outbox ORDER BY kind, subject";
    // disabled, fallback ×2 (two first choices), paid; and the fallbacks to Slack (45 tokens:
    // under the budget's share).
    let expected = 6;
    let t = Instant::now();
    let raised: Vec<(String, String, String)> = loop {
        let rows: Vec<(String, String, String)> = sqlx::query_as(outbox()).fetch_all(&mut pg).await.unwrap();
        if rows.len() >= expected || t.elapsed() > Duration::from_secs(15) {
            break rows;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(raised.len(), expected, "each alert raised once by the fleet: {raised:?}");
    assert!(raised.iter().all(|(_, _, state)| state == "pending"), "{raised:?}");

    tokio::time::sleep(Duration::from_secs(30).saturating_sub(down.elapsed())).await;
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_reuseaddr(true).unwrap();
    socket.bind(format!("127.0.0.1:{port}").parse().unwrap()).unwrap();
    let receiver = Receiver::default();
    receiver.serve(socket.listen(64).unwrap());
    let up = Instant::now();
    receiver
        .wait(Duration::from_secs(45), "every alert after the receiver came back", |r| r.got().len() >= expected)
        .await;
    let caught_up = up.elapsed();
    tokio::time::sleep(Duration::from_secs(3)).await;

    let got = receiver.got();
    let mut ids: HashMap<&str, usize> = HashMap::new();
    for g in &got {
        *ids.entry(g.id.as_str()).or_default() += 1;
    }
    assert_eq!(got.len(), expected, "none lost, none twice: {got:#?}");
    assert!(ids.values().all(|n| *n == 1), "an alert arrived twice: {ids:?}");
    assert_eq!(*receiver.refused.lock(), 0);
    let rows: Vec<DeliveryRow> = sqlx::query_as(
        "SELECT d.alert_id, o.state, d.attempt, d.status, d.error FROM alert_deliveries d
         JOIN alert_outbox o ON o.id = d.alert_id ORDER BY d.alert_id, d.attempt",
    )
    .fetch_all(&mut pg)
    .await
    .unwrap();
    let mut by_alert: BTreeMap<&str, Vec<&DeliveryRow>> = BTreeMap::new();
    for r in &rows {
        by_alert.entry(r.0.as_str()).or_default().push(r);
    }
    assert_eq!(by_alert.len(), expected);
    for (id, attempts) in &by_alert {
        let (last, before) = attempts.split_last().unwrap();
        assert!(last.1 == "delivered" && last.3 == Some(204) && last.4.is_none(), "{id}: {attempts:?}");
        assert!(before.len() >= 3, "{id}: tried while the receiver was down: {attempts:?}");
        assert!(
            before.iter().all(|a| a.3.is_none() && a.4.as_deref().is_some_and(|e| e.starts_with("no answer"))),
            "{attempts:?}"
        );
        assert!(attempts.iter().enumerate().all(|(i, a)| a.2 == i as i64 + 1), "numbered in order: {attempts:?}");
    }
    eprintln!(
        "receiver down 30 s: {expected} alerts, {} attempts, all delivered {caught_up:?} after it came back",
        rows.len()
    );
}

/// The store's outbox: a gate lets one alert per rule and subject through after its moment; a
/// claimed alert is not claimed again until its claim ends; only the server holding the claim
/// schedules a retry; old delivered and given-up alerts and unneeded gates are pruned, pending
/// ones kept.
async fn the_outbox_gates_claims_and_prunes(target: rota::store::DatabaseTarget) {
    use rota::store::{AlertDelivery, AlertNext, NewAlert};
    let store = rota::store::open(&target).await.unwrap();
    let t = 1_764_633_600_000;
    let alert = |id: &str, subject: &str, at: i64| NewAlert {
        id: id.into(),
        rule: "ops".into(),
        kind: "paid".into(),
        subject: subject.into(),
        body: format!("{{\"id\":\"{id}\"}}"),
        raised_at: at,
    };
    assert!(store.raise_alert(&alert("a1", "p", t), t - 1).await.unwrap());
    assert!(!store.raise_alert(&alert("a2", "p", t + 10), t - 1).await.unwrap(), "the gate moved at t");
    assert!(store.raise_alert(&alert("a3", "q", t + 10), t - 1).await.unwrap(), "another subject");
    assert!(store.raise_alert(&alert("a4", "p", t + 20), t).await.unwrap(), "past the interval");
    let first = store.claim_alerts("one", t + 30, t + 60_030, 2).await.unwrap();
    let ids: Vec<&str> = first.iter().map(|a| a.id.as_str()).collect();
    assert_eq!(ids, ["a1", "a3"]);
    let second = store.claim_alerts("two", t + 31, t + 60_031, 16).await.unwrap();
    assert_eq!(second.iter().map(|a| a.id.as_str()).collect::<Vec<_>>(), ["a4"], "claimed ones are not");
    let tried = |id: &str, instance: &str, at: i64, ok: bool| AlertDelivery {
        alert_id: id.into(),
        instance: instance.into(),
        at,
        duration_ms: 3,
        status: ok.then_some(204),
        error: (!ok).then(|| "no answer".into()),
    };
    // `two` has no claim on a1: its retry changes nothing; `one`'s does.
    store.alert_attempted(&tried("a1", "two", t + 40, false), AlertNext::Retry(t + 1_000)).await.unwrap();
    assert!(store.claim_alerts("two", t + 50, t + 60_050, 16).await.unwrap().is_empty(), "a1 is still one's");
    store.alert_attempted(&tried("a1", "one", t + 41, false), AlertNext::Retry(t + 2_000)).await.unwrap();
    assert!(store.claim_alerts("two", t + 1_999, t + 61_999, 16).await.unwrap().is_empty(), "not due yet");
    let again = store.claim_alerts("two", t + 2_000, t + 62_000, 16).await.unwrap();
    assert_eq!((again[0].id.as_str(), again[0].attempts), ("a1", 1));
    store.alert_attempted(&tried("a1", "two", t + 2_001, true), AlertNext::Delivered).await.unwrap();
    store.alert_attempted(&tried("a3", "one", t + 2_002, false), AlertNext::Failed).await.unwrap();
    // The console's list: newest first, each with its attempts in order, the limit kept.
    let recent = store.recent_alerts(2).await.unwrap();
    let listed: Vec<(&str, &str, Vec<Option<i64>>)> = recent
        .iter()
        .map(|a| (a.id.as_str(), a.state.as_str(), a.deliveries.iter().map(|d| d.status).collect()))
        .collect();
    assert_eq!(listed, [("a4", "pending", vec![]), ("a3", "failed", vec![None])]);
    let all = store.recent_alerts(50).await.unwrap();
    let a1 = all.iter().find(|a| a.id == "a1").unwrap();
    assert_eq!(
        a1.deliveries.iter().map(|d| (d.instance.as_str(), d.status)).collect::<Vec<_>>(),
        [("two", None), ("one", None), ("two", Some(204))]
    );
    assert_eq!(
        (a1.delivered_at, a1.attempts),
        (Some(t + 2_001), 2),
        "two's attempt without the claim counts no attempt"
    );
    // a4 stays pending; its claim ran out, so anyone may take it again.
    let retaken = store.claim_alerts("one", t + 70_000, t + 130_000, 16).await.unwrap();
    assert_eq!(retaken.iter().map(|a| a.id.as_str()).collect::<Vec<_>>(), ["a4"]);
    assert_eq!(store.prune_alerts(t + 100_000, t + 15).await.unwrap(), 2, "a1 delivered, a3 given up");
    let (left, deliveries, gates) = outbox_rows(&target).await;
    assert_eq!(left, ["a4"]);
    assert_eq!(deliveries, 0, "a1's and a3's deliveries went with them");
    assert_eq!(gates, [("p".to_string(), t + 20)], "q's gate (t + 10) was not needed");
}

/// The outbox's ids, the number of delivery rows, and the gates.
async fn outbox_rows(target: &rota::store::DatabaseTarget) -> (Vec<String>, i64, Vec<(String, i64)>) {
    macro_rules! read {
        ($pool:expr) => {{
            let pool = $pool;
            (
                sqlx::query_scalar("SELECT id FROM alert_outbox ORDER BY id").fetch_all(&pool).await.unwrap(),
                sqlx::query_scalar("SELECT count(*) FROM alert_deliveries").fetch_one(&pool).await.unwrap(),
                sqlx::query_as("SELECT subject, fired_at FROM alert_gates ORDER BY subject")
                    .fetch_all(&pool)
                    .await
                    .unwrap(),
            )
        }};
    }
    match target {
        rota::store::DatabaseTarget::Sqlite(path) => {
            read!(sqlx::SqlitePool::connect(&format!("sqlite://{}", path.display())).await.unwrap())
        }
        rota::store::DatabaseTarget::Postgres(url) => read!(sqlx::PgPool::connect(url).await.unwrap()),
    }
}

#[tokio::test]
async fn the_outbox_in_sqlite_gates_claims_and_prunes() {
    let dir = tempfile::tempdir().unwrap();
    the_outbox_gates_claims_and_prunes(rota::store::DatabaseTarget::Sqlite(dir.path().join("rota.db"))).await;
}

#[tokio::test]
async fn the_outbox_in_postgres_gates_claims_and_prunes() {
    let url = support::postgres_database().await;
    the_outbox_gates_claims_and_prunes(rota::store::DatabaseTarget::Postgres(url)).await;
}

/// `paid` set through the admin API on a stored profile: its `GET` says so, the next request it
/// serves raises the `paid` alert, and the change is an admin action; a config profile declared
/// paid cannot be unmarked there. The Alerts view's API lists the rules without their URLs'
/// paths or queries, and a test send through each is delivered, listed with its delivery and
/// recorded; only an admin may send one.
#[tokio::test]
async fn paid_set_through_the_api_raises_the_paid_alert_and_the_alerts_api_lists_rules_alerts_and_test_sends() {
    let (receiver, hook) = receiver().await;
    let (_mock, base) = Mock::started().await;
    let config = format!(
        r#"{}[auth.profiles."backup:paid"]
provider = "backup"
api_key_env = "CARGO_PKG_NAME"
paid = true
[[alerts]]
name = "ops"
on = ["paid"]
url = "{hook}/hook?token=s3cret-query"
secret_env = "{SECRET_ENV}"
[[alerts]]
name = "chat"
on = ["fallback"]
url = "{hook}/slack/T0/B0/s3cret-path"
format = "slack"
"#,
        support::config_with_backup(&base)
    );
    let rota = spawn(Scenario { config: &config, keys: &KEYS[..1], ..Scenario::default() }).await;
    let admin = Some(rota.admin_key.as_str());
    let k1 = "/api/v1/profiles/openai:k1";
    assert_eq!(rota.api("GET", k1, admin, None).await.1["paid"], false);
    served(&rota, "openai/gpt-4.1").await;

    let (status, body) = rota.api("PATCH", k1, Some(rota.agent_key.as_str()), Some(json!({"paid": true}))).await;
    assert_eq!(status, 403, "an agent key marks nothing: {body}");
    let (status, body) = rota.api("PATCH", k1, admin, Some(json!({"paid": "yes"}))).await;
    assert_eq!(status, 400, "{body}");
    let (status, body) = rota.api("PATCH", k1, admin, Some(json!({"paid": true}))).await;
    assert_eq!((status, &body["paid"]), (200, &json!(true)), "{body}");
    assert_eq!(rota.api("GET", k1, admin, None).await.1["paid"], true);
    let (status, body) = rota.api("PATCH", "/api/v1/profiles/backup:paid", admin, Some(json!({"paid": false}))).await;
    assert_eq!(status, 409, "declared paid in the file: {body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("config file"), "{body}");
    served(&rota, "openai/gpt-4.1").await;
    receiver.wait(Duration::from_secs(10), "the paid alert", |r| !r.got().is_empty()).await;
    assert_eq!(receiver.by_kind(), BTreeMap::from([(("paid".to_string(), "openai:k1".to_string()), 1)]));
    let (_, actions) = rota.api("GET", "/api/v1/admin-actions", admin, None).await;
    let paid = actions.as_array().unwrap().iter().find(|a| a["action"] == "profile.paid").expect("recorded");
    assert_eq!(
        (&paid["target"], &paid["before"]["paid"], &paid["after"]["paid"]),
        (&json!("openai:k1"), &json!(false), &json!(true))
    );

    let (status, view) = rota.api("GET", "/api/v1/alerts", admin, None).await;
    assert_eq!(status, 200, "{view}");
    let text = view.to_string();
    assert!(!text.contains("s3cret"), "no URL path or query is shown: {text}");
    assert_eq!(view["rules"][0]["destination"], hook, "{view}");
    assert_eq!((&view["rules"][0]["signed"], &view["rules"][1]["signed"]), (&json!(true), &json!(false)));
    assert_eq!(view["alerts"][0]["kind"], "paid");

    let (status, body) = rota.api("POST", "/api/v1/alerts/chat/test", Some(rota.agent_key.as_str()), None).await;
    assert_eq!(status, 403, "{body}");
    let (status, body) = rota.api("POST", "/api/v1/alerts/nobody/test", admin, None).await;
    assert_eq!(status, 404, "{body}");
    for rule in ["ops", "chat"] {
        let (status, body) = rota.api("POST", &format!("/api/v1/alerts/{rule}/test"), admin, None).await;
        assert_eq!(status, 202, "{body}");
    }
    receiver.wait(Duration::from_secs(10), "both tests", |r| r.got().len() == 3).await;
    let got = receiver.got();
    let json_test = got.iter().find(|g| g.path == "/hook" && g.body["kind"] == "test").expect("signed and taken");
    assert_eq!(json_test.body["rule"], "ops");
    let slack = got.iter().find(|g| g.path == "/slack/T0/B0/s3cret-path").unwrap();
    assert_eq!(slack.body["text"], "rota · chat: a test of the alert rule chat, sent by admin");
    let t = Instant::now();
    let view = loop {
        let (_, view) = rota.api("GET", "/api/v1/alerts", admin, None).await;
        let tests: Vec<&Value> = view["alerts"].as_array().unwrap().iter().filter(|a| a["kind"] == "test").collect();
        if tests.len() == 2 && tests.iter().all(|a| a["state"] == "delivered") {
            break view;
        }
        assert!(t.elapsed() < Duration::from_secs(10), "the tests are listed as delivered: {view:#}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let test = view["alerts"].as_array().unwrap().iter().find(|a| a["kind"] == "test").unwrap();
    assert_eq!((&test["deliveries"][0]["status"], &test["deliveries"][0]["error"]), (&json!(204), &Value::Null));
    let (_, actions) = rota.api("GET", "/api/v1/admin-actions", admin, None).await;
    let tested: Vec<&Value> =
        actions.as_array().unwrap().iter().filter(|a| a["action"] == "alert.test").map(|a| &a["target"]).collect();
    assert_eq!(tested, [&json!("chat"), &json!("ops")], "newest first");
}
