//! Budgets and limits per agent (docs/config.md, `[agents.NAME]`): `requests_per_minute`,
//! `tokens_per_day`, `cost_per_day`, checked before the first attempt against counters every
//! instance shares in the database; over a limit, 429 with `Retry-After` and a message naming
//! it, in the client's API format, and a `requests` row without attempts. The clock is the
//! test's (`Skewed`), so windows end when the test says.

use crate::support::{self, Db, KEYS, Mock, Rota, Scenario, Skewed, chat, spawn};
use rota::store::RequestRecord;
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Duration;

const MINUTE: i64 = 60_000;
const DAY: i64 = 86_400_000;

/// The system's clock moved on to read `at` now (a time ahead).
fn clock_at(at: i64) -> Arc<Skewed> {
    let clock = Arc::new(Skewed::default());
    clock.advance(Duration::from_millis((at - chrono::Utc::now().timestamp_millis()) as u64));
    clock
}

/// Five seconds into the next clock minute, so a test's requests all fall in one minute.
fn early_in_a_minute() -> i64 {
    (chrono::Utc::now().timestamp_millis() / MINUTE + 1) * MINUTE + 5_000
}

/// One request to `path` with `key`: status, `Retry-After` and the JSON answer.
async fn send(rota: &Rota, key: &str, path: &str, body: Value) -> (u16, Option<u64>, Value) {
    let r = Rota::client()
        .post(format!("{}{path}", rota.url))
        .bearer_auth(key)
        .header("anthropic-version", "2023-06-01")
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let retry = r.headers().get("retry-after").map(|v| v.to_str().unwrap().parse().unwrap());
    (status, retry, r.json().await.unwrap_or(Value::Null))
}

async fn chat_as(rota: &Rota, key: &str) -> (u16, Option<u64>, Value) {
    send(rota, key, "/v1/chat/completions", chat()).await
}

/// The refused requests' rows: status, attempts, error.
async fn refused_rows(rota: &Rota) -> Vec<(i64, i64, Option<String>)> {
    rota.flush().await;
    sqlx::query_as("SELECT status, attempts, error FROM requests WHERE status = 429 ORDER BY started_at")
        .fetch_all(rota.pool())
        .await
        .unwrap()
}

async fn start(limits: &str, clock: Arc<Skewed>) -> (Mock, Rota) {
    let (mock, base) = Mock::started().await;
    let config = format!("{}[agents.tester]\n{limits}\n", support::config(&base));
    let rota = spawn(Scenario { config: &config, keys: &KEYS[..1], clock: Some(clock), ..Scenario::default() }).await;
    (mock, rota)
}

#[tokio::test]
async fn the_sixth_request_in_a_minute_is_refused_with_retry_after_and_another_agent_is_not() {
    let clock = clock_at(early_in_a_minute());
    let (mock, rota) = start("requests_per_minute = 5", clock.clone()).await;
    for n in 1..=5 {
        assert_eq!(chat_as(&rota, &rota.agent_key).await.0, 200, "request {n}");
    }
    let (status, retry, body) = chat_as(&rota, &rota.agent_key).await;
    assert_eq!(status, 429);
    let retry = retry.expect("Retry-After");
    assert!((45..=55).contains(&retry), "Retry-After {retry}: the seconds left in the minute");
    let message = body["error"]["message"].as_str().unwrap().to_string();
    assert_eq!(message, format!("agent tester is over its limit requests_per_minute = 5 (resets in {retry} s)"));
    assert_eq!(body["error"]["type"], "rate_limit_error", "{body}");
    // The same refusal in Anthropic's format.
    let body = json!({"model": "openai/gpt-4.1", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]});
    let (status, retry, answer) = send(&rota, &rota.agent_key, "/v1/messages", body).await;
    assert_eq!((status, answer["type"].as_str()), (429, Some("error")), "{answer}");
    assert!(retry.is_some() && answer["error"]["message"].as_str().unwrap().contains("requests_per_minute = 5"));
    // The upstream saw five calls; another agent is served.
    assert_eq!(mock.seen().len(), 5);
    assert_eq!(chat_as(&rota, &rota.admin_key).await.0, 200);
    let rows = refused_rows(&rota).await;
    assert_eq!(rows.len(), 2, "{rows:?}");
    assert_eq!(rows[0], (429, 0, Some(message)));
    // The next minute lets the agent through again.
    clock.advance(Duration::from_secs(60));
    assert_eq!(chat_as(&rota, &rota.agent_key).await.0, 200);
}

/// Two instances on one database: requests alternate between them, and the sixth of the
/// minute is refused on either; then twelve at once over both admit exactly five.
async fn two_instances_share_requests_per_minute(db: Db) {
    let clock = clock_at(early_in_a_minute());
    let (_mock, base) = Mock::started().await;
    let config = format!("{}[agents.tester]\nrequests_per_minute = 5\n", support::config(&base));
    let first =
        spawn(Scenario { config: &config, keys: &KEYS[..1], db, clock: Some(clock.clone()), ..Scenario::default() })
            .await;
    let fleet = [first.another().await, first];
    for n in 0..5 {
        assert_eq!(chat_as(&fleet[n % 2], &fleet[0].agent_key).await.0, 200, "request {}", n + 1);
    }
    for rota in &fleet {
        let (status, retry, body) = chat_as(rota, &rota.agent_key).await;
        assert_eq!((status, retry.is_some()), (429, true), "{body}");
        assert!(body["error"]["message"].as_str().unwrap().contains("over its limit requests_per_minute = 5"));
        assert_eq!(chat_as(rota, &rota.admin_key).await.0, 200, "another agent is unaffected");
    }
    clock.advance(Duration::from_secs(60));
    let fleet = &fleet;
    let answers = futures_util::future::join_all(
        (0..12).map(|n| async move { chat_as(&fleet[n % 2], &fleet[0].agent_key).await.0 }),
    )
    .await;
    assert_eq!(answers.iter().filter(|&&s| s == 200).count(), 5, "{answers:?}");
    assert_eq!(answers.iter().filter(|&&s| s == 429).count(), 7, "{answers:?}");
    // A limit set through one instance's admin API is in force on the other within a second.
    let limit = Some(json!({"requests_per_minute": 1}));
    assert_eq!(fleet[0].api("PATCH", "/api/v1/agents/admin", Some(&fleet[0].admin_key), limit).await.0, 200);
    let since = std::time::Instant::now();
    while chat_as(&fleet[1], &fleet[1].admin_key).await.0 != 429 {
        assert!(since.elapsed() < std::time::Duration::from_secs(1), "the other instance ignores the new limit");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn two_instances_on_postgres_share_requests_per_minute() {
    two_instances_share_requests_per_minute(Db::Postgres(support::postgres_database().await)).await;
}

#[tokio::test]
async fn two_instances_on_one_sqlite_file_share_requests_per_minute() {
    two_instances_share_requests_per_minute(Db::Sqlite).await;
}

#[tokio::test]
async fn tokens_per_day_refuses_until_midnight_utc() {
    // 23:59:00 UTC tomorrow: the refusal's Retry-After is the minute left in the day.
    let now = chrono::Utc::now().timestamp_millis();
    let clock = clock_at((now / DAY + 2) * DAY - MINUTE);
    let (_mock, rota) = start("tokens_per_day = 12", clock.clone()).await;
    // Each answer reports 5 tokens; the audit writer adds them to the day.
    for n in 1..=3 {
        assert_eq!(chat_as(&rota, &rota.agent_key).await.0, 200, "request {n}");
        rota.flush().await;
    }
    let (status, retry, body) = chat_as(&rota, &rota.agent_key).await;
    assert_eq!(status, 429, "{body}");
    let retry = retry.unwrap();
    assert!((50..=60).contains(&retry), "Retry-After {retry}");
    assert_eq!(
        body["error"]["message"],
        format!("agent tester is over its limit tokens_per_day = 12 (15 used today; resets in {retry} s)")
    );
    assert_eq!(chat_as(&rota, &rota.admin_key).await.0, 200, "another agent is unaffected");
    clock.advance(Duration::from_secs(60));
    assert_eq!(chat_as(&rota, &rota.agent_key).await.0, 200, "a new day");
}

/// A served request whose cost the audit writer adds to its agent's day.
fn costly(agent: &str, at: i64, cost: f64) -> RequestRecord {
    RequestRecord {
        id: uuid::Uuid::new_v4().to_string(),
        agent: Some(agent.into()),
        api: "chat".into(),
        requested_model: Some("openai/gpt-4.1".into()),
        served_model: Some("openai/gpt-4.1".into()),
        served_profile: Some("openai:k1".into()),
        status: Some(200),
        attempts: 1,
        started_at: at,
        duration_ms: Some(9),
        stream: false,
        tokens_in: Some(100),
        tokens_out: Some(20),
        error: None,
        cost: Some(cost),
        usage_suspect: false,
    }
}

#[tokio::test]
async fn cost_per_day_refuses_the_gateway_and_the_lease_api() {
    let clock = clock_at(early_in_a_minute());
    let (_mock, rota) = start("cost_per_day = 0.5", clock.clone()).await;
    assert_eq!(chat_as(&rota, &rota.agent_key).await.0, 200);
    let (status, _, lease) = send(&rota, &rota.agent_key, "/api/v1/leases", json!({"model": "openai/gpt-4.1"})).await;
    assert_eq!(status, 201, "{lease}");
    let now = rota::engine::Clock::now(clock.as_ref());
    // A retried batch whose first commit landed adds nothing twice.
    let spent = [costly("tester", now, 0.25), costly("tester", now, 0.5), costly("admin", now, 9.0)];
    rota.store.insert_audit(&spent, &[]).await.unwrap();
    rota.store.insert_audit(&spent, &[]).await.unwrap();
    // What another writer spent counts within `limits::FRESH`.
    tokio::time::sleep(rota::limits::FRESH).await;
    let (status, retry, body) = chat_as(&rota, &rota.agent_key).await;
    assert_eq!((status, retry.is_some()), (429, true), "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.starts_with("agent tester is over its limit cost_per_day = 0.5 USD (0.75"), "{message}");
    let (status, retry, body) =
        send(&rota, &rota.agent_key, "/api/v1/leases", json!({"model": "openai/gpt-4.1"})).await;
    assert_eq!((status, retry.is_some()), (429, true), "{body}");
    assert_eq!(body["error"]["type"], "over_limit");
    assert!(body["error"]["message"].as_str().unwrap().contains("cost_per_day = 0.5 USD"));
    rota.flush().await;
    let lease_row: (i64, i64, Option<String>) =
        sqlx::query_as("SELECT status, attempts, error FROM requests WHERE api = 'lease' AND status = 429")
            .fetch_one(rota.pool())
            .await
            .unwrap();
    assert_eq!((lease_row.0, lease_row.1), (429, 0));
    assert!(lease_row.2.unwrap().contains("cost_per_day"));
    // The admin API shows the use against the limits; the admin agent (no limit) is served.
    let (_, agents) = rota.api("GET", "/api/v1/agents", Some(&rota.admin_key), None).await;
    let tester = agents.as_array().unwrap().iter().find(|a| a["name"] == "tester").unwrap();
    assert_eq!(tester["limits"], json!({"requests_per_minute": null, "tokens_per_day": null, "cost_per_day": 0.5}));
    assert_eq!(tester["limits_from_config"], json!(["cost_per_day"]));
    // 0.75, and the list price of the first chat's five tokens.
    let cost = tester["usage"]["cost_today"].as_f64().unwrap();
    assert!((0.75..0.751).contains(&cost), "{cost}");
    assert_eq!(tester["usage"]["tokens_today"], 5 + 240);
    assert_eq!(chat_as(&rota, &rota.admin_key).await.0, 200);
}

#[tokio::test]
async fn cost_per_day_follows_the_priced_answers() {
    // 5 tokens an answer at 100 000 USD per million: 0.50 USD a request.
    let clock = clock_at(early_in_a_minute());
    let (_mock, base) = Mock::started().await;
    let config = format!(
        "{}[prices]\n\"openai/gpt-4.1\" = {{ input = 100000, output = 100000 }}\n[agents.tester]\ncost_per_day = 1.0\n",
        support::config(&base)
    );
    let rota = spawn(Scenario { config: &config, keys: &KEYS[..1], clock: Some(clock), ..Scenario::default() }).await;
    for n in 1..=2 {
        assert_eq!(chat_as(&rota, &rota.agent_key).await.0, 200, "request {n}");
        rota.flush().await;
    }
    let (status, retry, body) = chat_as(&rota, &rota.agent_key).await;
    assert_eq!((status, retry.is_some()), (429, true), "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.starts_with("agent tester is over its limit cost_per_day = 1 USD (1 used today; "), "{message}");
}

#[tokio::test]
async fn limits_are_created_and_changed_through_the_admin_api_and_the_config_file_wins() {
    let clock = clock_at(early_in_a_minute());
    let (_mock, rota) = start("requests_per_minute = 5", clock.clone()).await;
    let admin = Some(rota.admin_key.as_str());
    let (status, bad) =
        rota.api("POST", "/api/v1/agents", admin, Some(json!({"name": "p", "tokens_per_day": 0}))).await;
    assert_eq!(status, 400);
    assert_eq!(bad["error"]["message"], "tokens_per_day: must be an integer of at least 1");
    let (status, made) = rota
        .api(
            "POST",
            "/api/v1/agents",
            admin,
            Some(json!({"name": "planner", "requests_per_minute": 2, "cost_per_day": 3.5})),
        )
        .await;
    assert_eq!(status, 201, "{made}");
    assert_eq!(made["agent"]["limits"], json!({"requests_per_minute": 2, "tokens_per_day": null, "cost_per_day": 3.5}));
    let key = made["key"].as_str().unwrap().to_string();
    assert_eq!(chat_as(&rota, &key).await.0, 200);
    assert_eq!(chat_as(&rota, &key).await.0, 200);
    let (status, _, body) = chat_as(&rota, &key).await;
    assert_eq!(status, 429);
    assert!(
        body["error"]["message"].as_str().unwrap().contains("agent planner is over its limit requests_per_minute = 2")
    );
    let (_, agents) = rota.api("GET", "/api/v1/agents", admin, None).await;
    let planner = agents.as_array().unwrap().iter().find(|a| a["name"] == "planner").unwrap().clone();
    assert_eq!(planner["usage"]["requests_this_minute"], 2);
    // PATCH: a value sets, null clears, a field left out stays.
    let path = "/api/v1/agents/planner";
    let (status, changed) = rota.api("PATCH", path, admin, Some(json!({"requests_per_minute": 3}))).await;
    assert_eq!(status, 200, "{changed}");
    assert_eq!(changed["limits"], json!({"requests_per_minute": 3, "tokens_per_day": null, "cost_per_day": 3.5}));
    assert_eq!(chat_as(&rota, &key).await.0, 200, "the third of three");
    assert_eq!(chat_as(&rota, &key).await.0, 429);
    let (_, changed) = rota.api("PATCH", path, admin, Some(json!({"requests_per_minute": null}))).await;
    assert_eq!(changed["limits"], json!({"requests_per_minute": null, "tokens_per_day": null, "cost_per_day": 3.5}));
    assert_eq!(chat_as(&rota, &key).await.0, 200, "no limit any more");
    let (status, _) = rota.api("PATCH", path, admin, Some(json!({"cost_per_day": -1}))).await;
    assert_eq!(status, 400);
    let (status, _) = rota.api("PATCH", path, admin, Some(json!({"per_hour": 1}))).await;
    assert_eq!(status, 400);
    let (status, _) = rota.api("PATCH", "/api/v1/agents/nobody", admin, Some(json!({"tokens_per_day": 9}))).await;
    assert_eq!(status, 404);
    // The config file's key wins over the stored one.
    let (_, tester) = rota.api("PATCH", "/api/v1/agents/tester", admin, Some(json!({"requests_per_minute": 1}))).await;
    assert_eq!(tester["limits"]["requests_per_minute"], 5);
    assert_eq!(tester["limits_from_config"], json!(["requests_per_minute"]));
    assert_eq!(chat_as(&rota, &rota.agent_key).await.0, 200);
    assert_eq!(chat_as(&rota, &rota.agent_key).await.0, 200);
}

/// The store's counters: a minute's claims never pass its limit, however many ask at once and
/// whatever they ask for; a day sums its requests' tokens and cost; old minutes and days are
/// pruned.
async fn counters_count_exactly_and_old_ones_go(target: rota::store::DatabaseTarget) {
    let store = rota::store::open(&target).await.unwrap();
    let minute = 1_764_633_600_000;
    let asks = (0..20).map(|_| store.claim_requests("planner", minute, 1, 7));
    let counted: Vec<Option<i64>> =
        futures_util::future::join_all(asks).await.into_iter().map(Result::unwrap).collect();
    let mut admitted: Vec<i64> = counted.iter().flatten().copied().collect();
    admitted.sort();
    assert_eq!(admitted, (1..=7).collect::<Vec<_>>(), "{counted:?}");
    assert_eq!(store.claim_requests("planner", minute + MINUTE, 1, 7).await.unwrap(), Some(1), "a new minute");
    // Chunks: claimed whole while they fit, never past the limit (a new minute's row takes one).
    let other = minute + 2 * MINUTE;
    assert_eq!(store.claim_requests("planner", other, 4, 10).await.unwrap(), Some(4));
    assert_eq!(store.claim_requests("planner", other, 4, 10).await.unwrap(), Some(8));
    assert_eq!(store.claim_requests("planner", other, 4, 10).await.unwrap(), None, "12 would pass 10");
    assert_eq!(store.claim_requests("planner", other, 2, 10).await.unwrap(), Some(10));
    assert_eq!(store.claim_requests("planner", other, 1, 10).await.unwrap(), None);
    let asks = (0..20).map(|i| store.claim_requests("planner", minute + 3 * MINUTE, 1 + i % 3, 9));
    let counted: Vec<Option<i64>> =
        futures_util::future::join_all(asks).await.into_iter().map(Result::unwrap).collect();
    assert!(counted.iter().flatten().all(|&c| c <= 9), "{counted:?}");
    store.insert_audit(&[costly("planner", minute + 5, 0.1), costly("planner", minute - 5, 0.2)], &[]).await.unwrap();
    let used = store.agent_usage(None, minute, minute).await.unwrap();
    let planner = used["planner"];
    assert_eq!((planner.requests_this_minute, planner.tokens_today), (7, 120));
    assert!((planner.cost_today - 0.1).abs() < 1e-9, "{planner:?}");
    assert_eq!(store.agent_usage(Some("planner"), minute, minute - DAY).await.unwrap()["planner"].tokens_today, 120);
    // Minutes before the second one, and the day before, go.
    assert_eq!(store.prune_agent_usage(minute + MINUTE, Some(minute)).await.unwrap(), 2);
    let left = store.agent_usage(None, minute + MINUTE, minute).await.unwrap();
    assert_eq!((left["planner"].requests_this_minute, left["planner"].tokens_today), (1, 120));
}

#[tokio::test]
async fn counters_in_sqlite_count_exactly_and_old_ones_go() {
    let dir = tempfile::tempdir().unwrap();
    counters_count_exactly_and_old_ones_go(rota::store::DatabaseTarget::Sqlite(dir.path().join("rota.db"))).await;
}

#[tokio::test]
async fn counters_in_postgres_count_exactly_and_old_ones_go() {
    let url = support::postgres_database().await;
    counters_count_exactly_and_old_ones_go(rota::store::DatabaseTarget::Postgres(url)).await;
}

/// A PostgreSQL server of the test's own (`scripts/postgres.sh`), which it may freeze: the
/// others' tests share `ROTA_TEST_PG`. Thawed and stopped when dropped.
struct OwnPostgres {
    dir: tempfile::TempDir,
    url: String,
}

impl OwnPostgres {
    fn start() -> OwnPostgres {
        let dir = tempfile::tempdir().unwrap();
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/postgres.sh");
        let out = std::process::Command::new(script).arg("start").arg(dir.path()).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let url = String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .find_map(|l| l.strip_prefix("export ROTA_TEST_PG=").map(str::to_string))
            .unwrap();
        OwnPostgres { dir, url }
    }

    /// SIGSTOP (or SIGCONT) to the server and every backend it started.
    fn signal(&self, sig: &str) {
        let pid = std::fs::read_to_string(self.dir.path().join("data/postmaster.pid")).unwrap();
        let pid = pid.lines().next().unwrap().trim().to_string();
        std::process::Command::new("pkill").args([sig, "-P", &pid]).status().unwrap();
        assert!(std::process::Command::new("kill").args([sig, &pid]).status().unwrap().success());
    }
}

impl Drop for OwnPostgres {
    fn drop(&mut self) {
        self.signal("-CONT");
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/postgres.sh");
        let _ = std::process::Command::new(script).arg("stop").arg(self.dir.path()).output();
    }
}

async fn healthz(rota: &Rota) -> Value {
    Rota::client().get(format!("{}/healthz", rota.url)).send().await.unwrap().json().await.unwrap()
}

/// A frozen database (SIGSTOP to PostgreSQL) holds no request of a limited agent longer than
/// `store::TIMEOUT`: each is admitted once the database has not answered in time, and
/// `/healthz` says `degraded` within that timeout (plus a probe's period). Thawed, the limits
/// count again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_database_holds_no_request_longer_than_the_timeout_and_healthz_says_so() {
    let pg = OwnPostgres::start();
    let (_mock, base) = Mock::started().await;
    let config =
        format!("{}[agents.tester]\nrequests_per_minute = 5\ntokens_per_day = 1000000\n", support::config(&base));
    let rota =
        spawn(Scenario { config: &config, keys: &KEYS[..1], db: Db::Postgres(pg.url.clone()), ..Scenario::default() })
            .await;
    assert_eq!(chat_as(&rota, &rota.agent_key).await.0, 200);
    assert_eq!(healthz(&rota).await["status"], "ok");

    pg.signal("-STOP");
    let frozen = std::time::Instant::now();
    let limit = rota::store::TIMEOUT + Duration::from_millis(500);
    let mut waits = Vec::new();
    for i in 0..8 {
        let t = std::time::Instant::now();
        let (status, _, body) = chat_as(&rota, &rota.agent_key).await;
        waits.push(t.elapsed());
        assert_eq!(status, 200, "request {i} while the database is frozen: {body}");
        assert!(t.elapsed() <= limit, "request {i} was held {:?} by a frozen database", t.elapsed());
    }
    let health = loop {
        let h = healthz(&rota).await;
        if h["status"] == "degraded" {
            break h;
        }
        assert!(frozen.elapsed() <= limit, "/healthz still says ok {:?} after the freeze: {h}", frozen.elapsed());
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let said = frozen.elapsed();
    assert_eq!(health["database"]["answering"], false, "{health}");
    eprintln!("frozen database: requests held {waits:?}; /healthz degraded after {said:?}");

    pg.signal("-CONT");
    let thawed = std::time::Instant::now();
    while healthz(&rota).await["status"] != "ok" {
        assert!(thawed.elapsed() < Duration::from_secs(10), "/healthz never recovered");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Counting again: the minute's limit refuses once five are counted.
    let mut answers = Vec::new();
    for _ in 0..6 {
        answers.push(chat_as(&rota, &rota.agent_key).await.0);
    }
    assert_eq!(answers.last(), Some(&429), "the limit counts again after the thaw: {answers:?}");
}

/// Scoped agent keys (docs/config.md, `[agents.NAME] models`): an agent held to `fast` is
/// refused `smart` with 403 naming its list (audited, no attempt; a lease too), and its
/// requests never reach a model outside the list, not even as the configured fallback. A list
/// stored through the API holds another agent the same way, on every instance.
async fn an_agent_is_served_only_within_its_models(db: Db) {
    let (mock, base) = Mock::started().await;
    let config = format!(
        "{}[aliases]\nfast = \"openai/gpt-4.1-mini\"\nsmart = \"openai/gpt-4.1\"\n[agents.tester]\nmodels = [\"fast\"]\n",
        support::config_with_backup(&base)
    );
    let rota = spawn(Scenario { config: &config, keys: &KEYS, db, ..Scenario::default() }).await;
    let ask = |model: &str| json!({"model": model, "messages": [{"role": "user", "content": "hi"}]});

    let (status, _, body) = send(&rota, &rota.agent_key, "/v1/chat/completions", ask("smart")).await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(body["error"]["message"], "this agent may not use `smart`; it may use: fast");
    let (status, _, body) = send(&rota, &rota.agent_key, "/v1/messages", ask("openai/gpt-4.1")).await;
    assert_eq!((status, body["type"].as_str()), (403, Some("error")), "{body}");
    let (code, lease) =
        rota.api("POST", "/api/v1/leases", Some(&rota.agent_key), Some(json!({"model": "smart"}))).await;
    assert_eq!((code, lease["error"]["type"].as_str()), (403, Some("model_not_allowed")), "{lease}");
    assert_eq!(send(&rota, &rota.agent_key, "/v1/chat/completions", ask("fast")).await.0, 200);

    // Every openai profile fails: the backup fallback is outside the list and never called.
    let failing =
        || (0..4).map(|_| support::Reply::Status(500, vec![], r#"{"error":{"message":"boom"}}"#.into())).collect();
    for (id, secret) in &KEYS[..3] {
        assert!(id.starts_with("openai:"));
        mock.script(secret, failing());
    }
    let before = mock.seen().len();
    let (status, _, body) = send(&rota, &rota.agent_key, "/v1/chat/completions", ask("fast")).await;
    assert_eq!(status, 500, "{body}");
    let seen = mock.seen().split_off(before);
    assert!(!seen.is_empty() && seen.iter().all(|s| s.model == "gpt-4.1-mini" && s.key != KEYS[3].1), "{seen:?}");

    // The admin agent may ask for anything until a list is stored for it; then, on another
    // instance too, only for that.
    assert_eq!(send(&rota, &rota.admin_key, "/v1/chat/completions", ask("backup/gpt-4.1-mini")).await.0, 200);
    let admin = Some(rota.admin_key.as_str());
    let (code, bad) = rota.api("PATCH", "/api/v1/agents/admin", admin, Some(json!({"models": ["nope"]}))).await;
    assert_eq!(code, 400, "{bad}");
    assert!(bad["error"]["message"].as_str().unwrap().contains("models: unknown model `nope`"), "{bad}");
    let (code, info) = rota.api("PATCH", "/api/v1/agents/admin", admin, Some(json!({"models": ["smart"]}))).await;
    assert_eq!((code, &info["models"]), (200, &json!(["smart"])), "{info}");
    let other = rota.another().await;
    let (status, _, body) = send(&other, &other.admin_key, "/v1/chat/completions", ask("fast")).await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(body["error"]["message"], "this agent may not use `fast`; it may use: smart");
    let (_, agents) = rota.api("GET", "/api/v1/agents", admin, None).await;
    let tester = agents.as_array().unwrap().iter().find(|a| a["name"] == "tester").unwrap();
    assert_eq!((&tester["models"], &tester["models_from_config"]), (&json!(["fast"]), &json!(true)));
    let (code, _) = rota.api("PATCH", "/api/v1/agents/admin", admin, Some(json!({"models": null}))).await;
    assert_eq!(code, 200);

    rota.flush().await;
    other.flush().await; // its refusal's row is written by its own audit writer
    let (_, requests) = rota.api("GET", "/api/v1/requests?limit=100", admin, None).await;
    let refused: Vec<(i64, i64)> = requests["items"]
        .as_array()
        .unwrap_or_else(|| panic!("{requests}"))
        .iter()
        .filter(|r| r["status"] == 403)
        .map(|r| (r["status"].as_i64().unwrap(), r["attempts"].as_i64().unwrap()))
        .collect();
    assert_eq!(
        refused,
        [(403, 0); 4],
        "each refusal (chat, messages, lease, the other instance's) is a row without attempts"
    );
}

#[tokio::test]
async fn an_agent_is_served_only_within_its_models_on_sqlite() {
    an_agent_is_served_only_within_its_models(Db::Sqlite).await;
}

#[tokio::test]
async fn an_agent_is_served_only_within_its_models_on_postgres() {
    an_agent_is_served_only_within_its_models(Db::Postgres(support::postgres_database().await)).await;
}
