//! Every query of docs/audit.md, run in order against a database filled by real gateway traffic,
//! returns the rows the traffic implies, on SQLite and on PostgreSQL alike.

use crate::support::{self, ANTHROPIC_KEY, Db, Mock, Reply, Rota, Scenario, spawn};
use serde_json::{Value, json};
use sqlx::Row;

/// Two `openai` profiles, the `backup` one and an `anthropic` one.
const KEYS: [(&str, &str); 4] = [support::KEYS[0], support::KEYS[1], support::KEYS[3], ANTHROPIC_KEY];

fn queries() -> Vec<String> {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/audit.md")).unwrap();
    doc.split("```sql\n").skip(1).map(|b| b.split("\n```").next().unwrap().to_string()).collect()
}

/// A row as text: integers and reals as written by SQLite, NULL as `NULL`.
fn render(row: &sqlx::sqlite::SqliteRow) -> Vec<String> {
    (0..row.columns().len())
        .map(|i| {
            if let Ok(v) = row.try_get::<Option<i64>, _>(i) {
                return v.map_or("NULL".into(), |v| v.to_string());
            }
            if let Ok(v) = row.try_get::<Option<f64>, _>(i) {
                return v.map_or("NULL".into(), |v| v.to_string());
            }
            row.try_get::<Option<String>, _>(i).unwrap().unwrap_or_else(|| "NULL".into())
        })
        .collect()
}

/// A PostgreSQL row read through the simple query protocol (every value as text), written as
/// `render` writes SQLite's: a decimal like `2.00` as the number it is (`2`).
fn render_pg(row: &sqlx::postgres::PgRow) -> Vec<String> {
    (0..row.columns().len())
        .map(|i| match row.try_get_unchecked::<Option<String>, _>(i).unwrap() {
            None => "NULL".into(),
            Some(v) if v.contains('.') => v.parse::<f64>().map_or(v, |f| f.to_string()),
            Some(v) => v,
        })
        .collect()
}

fn rows(expected: &[&[&str]]) -> Vec<Vec<String>> {
    expected.iter().map(|r| r.iter().map(|c| c.to_string()).collect()).collect()
}

#[tokio::test]
async fn every_query_in_the_audit_guide_returns_the_rows_of_the_traffic() {
    let rota = traffic(Db::Sqlite).await;
    for (i, sql) in queries().iter().enumerate() {
        let got: Vec<Vec<String>> = sqlx::query(sqlx::AssertSqlSafe(sql.clone()))
            .fetch_all(rota.pool())
            .await
            .unwrap_or_else(|e| panic!("query {} failed: {e}\n{sql}", i + 1))
            .iter()
            .map(render)
            .collect();
        assert_eq!(got, expected()[i], "query {} of docs/audit.md:\n{sql}", i + 1);
    }
}

#[tokio::test]
async fn every_query_in_the_audit_guide_returns_the_same_rows_on_postgres() {
    let url = crate::support::postgres_database().await;
    let _rota = traffic(Db::Postgres(url.clone())).await;
    let pool = sqlx::PgPool::connect(&url).await.unwrap();
    for (i, sql) in queries().iter().enumerate() {
        let got: Vec<Vec<String>> = sqlx::raw_sql(sqlx::AssertSqlSafe(sql.clone()))
            .fetch_all(&pool)
            .await
            .unwrap_or_else(|e| panic!("query {} failed: {e}\n{sql}", i + 1))
            .iter()
            .map(render_pg)
            .collect();
        assert_eq!(got, expected()[i], "query {} of docs/audit.md:\n{sql}", i + 1);
    }
}

/// Five requests through rota on `db`, flushed to the database: R1 is served by k1; R2 by k1
/// after k2's 429; R3 by the fallback model after k1 is overloaded three times; R4 by the
/// fallback after k2 says gpt-9 does not exist; R5 fails: the Anthropic key has no credits; R6
/// names a model nothing serves.
async fn traffic(db: Db) -> Rota {
    let (mock, base) = Mock::started().await;
    let config = format!("{}{}", support::config_with_backup(&base), support::anthropic_provider(&base));
    let rota = spawn(Scenario { config: &config, keys: &KEYS, db, ..Scenario::default() }).await;
    let chat = |model: &str| json!({"model": model, "messages": [{"role": "user", "content": "hi"}]});
    let status = |code: u16, body: &str| Reply::Status(code, vec![], body.to_string());
    let limited =
        Reply::Status(429, vec![("retry-after", "30".into())], r#"{"error":{"message":"Rate limit reached"}}"#.into());
    let busy = status(503, r#"{"error":{"message":"The engine is currently overloaded"}}"#);
    let gone = status(404, r#"{"error":{"message":"The model `gpt-9` does not exist","code":"model_not_found"}}"#);
    mock.script(KEYS[1].1, vec![limited, gone]);
    mock.script(KEYS[0].1, vec![Reply::Ok, Reply::Ok, busy.clone(), busy.clone(), busy]);
    mock.script(
        KEYS[3].1,
        vec![status(
            402,
            r#"{"type":"error","error":{"type":"billing_error","message":"Your credit balance is too low"}}"#,
        )],
    );

    // R1: k1 serves. R2: k2 answers 429, k1 serves. R3: k1 is overloaded three times (two
    // same-profile retries), k2 is cooling, the fallback model serves. R4: k2 says gpt-9 does not
    // exist, the fallback serves. R5: the Anthropic key has no credits and there is no fallback.
    for model in ["openai/gpt-4.1", "openai/gpt-4.1", "openai/gpt-4.1", "openai/gpt-9"] {
        assert_eq!(rota.chat(chat(model), &[]).await.status(), 200, "{model}");
    }
    let r5 = Rota::client()
        .post(format!("{}/v1/messages", rota.url))
        .header("x-api-key", &rota.agent_key)
        .header("x-rota-fallbacks", "none")
        .json(&json!({"model": "anthropic/claude-sonnet-4-5", "max_tokens": 5, "messages": []}))
        .send()
        .await
        .unwrap();
    assert_eq!(r5.status(), 402);
    // R6: a model nothing names, refused with no attempt.
    assert_eq!(rota.chat(chat("nope"), &[]).await.status(), 404);
    rota.flush().await;
    assert_eq!(queries().len(), expected().len(), "docs/audit.md's queries and this test's expected rows");
    rota
}

/// The rows each query of docs/audit.md returns for `traffic`, in order.
fn expected() -> Vec<Vec<Vec<String>>> {
    vec![
        rows(&[&["tester", "200", "4"], &["tester", "402", "1"], &["tester", "404", "1"]]),
        rows(&[&["backup:b1", "backup/gpt-4.1-mini", "2"], &["openai:k1", "openai/gpt-4.1", "2"]]),
        rows(&[
            &["billing", "anthropic", "1", "0"],
            &["model_not_found", "openai", "1", "0"],
            &["overloaded", "openai", "3", "0"],
            &["rate_limit", "openai", "1", "0"],
        ]),
        rows(&[
            &["openai/gpt-4.1", "backup/gpt-4.1-mini", "backup:b1", "4"],
            &["openai/gpt-9", "backup/gpt-4.1-mini", "backup:b1", "2"],
        ]),
        rows(&[
            &["anthropic:main", "1", "0", "1", "0", "0"],
            &["backup:b1", "2", "2", "0", "6", "4"],
            &["openai:k1", "5", "2", "3", "6", "4"],
            &["openai:k2", "2", "0", "2", "0", "0"],
        ]),
        rows(&[
            &["anthropic:main", "disabled", "billing", "(all models)"],
            &["openai:k1", "cooling", "overloaded", "gpt-4.1"],
            &["openai:k2", "cooling", "rate_limit", "gpt-4.1"],
        ]),
        rows(&[&["6", "10", "1.67"]]),
        rows(&[
            &["anthropic:main", "0", "1", "1"],
            &["backup:b1", "2", "0", "0"],
            &["openai:k1", "2", "3", "3"],
            &["openai:k2", "0", "2", "2"],
        ]),
        rows(&[&["backup", "6", "4"], &["openai", "6", "4"]]),
        rows(&[&["openai:k1", "overloaded", "2"]]),
        rows(&[
            &["anthropic:main", "billing", "1"],
            &["openai:k1", "overloaded", "3"],
            &["openai:k2", "model_not_found", "1"],
            &["openai:k2", "rate_limit", "1"],
        ]),
        rows(&[&["1", "primary", "anthropic/claude-sonnet-4-5", "anthropic:main", "failure", "billing", "402"]]),
        rows(&[
            &["anthropic", "stored", "1", "1", "1"],
            &["backup", "stored", "1", "1", "1"],
            &["openai", "stored", "2", "2", "2"],
        ]),
        rows(&[&["openai/gpt-9", "1", "1"]]),
        rows(&[
            &["402", "1", "anthropic/claude-sonnet-4-5", "Your credit balance is too low"],
            &["404", "0", "nope", "unknown model `nope`: not an alias, a virtual model or `provider/model`"],
        ]),
    ]
}

/// The snapshot's parts that must survive a copy, in a comparable order.
fn state(s: rota::store::Snapshot) -> impl PartialEq + std::fmt::Debug {
    let mut secrets: Vec<_> = s
        .secrets
        .into_iter()
        .flat_map(|(id, sealed)| {
            sealed.into_iter().map(move |x| (id.to_string(), x.field.as_str(), x.nonce, x.ciphertext))
        })
        .collect();
    secrets.sort();
    let mut stats: Vec<_> = s.stats.into_iter().map(|(id, st)| (id.to_string(), format!("{st:?}"))).collect();
    stats.sort();
    let mut models: Vec<_> = s.model_cooldowns.into_iter().map(|(k, m)| (k, format!("{m:?}"))).collect();
    models.sort();
    (s.profiles, secrets, stats, s.orders, models)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_sqlite_deployment_copied_into_postgres_keeps_its_state_its_audit_log_and_its_keys() {
    let old = traffic(Db::Sqlite).await;
    // The PostgreSQL deployment: the same config, another database, the same master key file.
    let text = std::fs::read_to_string(old.dir.path().join("rota.toml")).unwrap();
    let (first, rest) = text.split_once("\nurl = ").unwrap();
    let (sqlite_url, rest) = rest.split_once('\n').unwrap();
    let pg = crate::support::postgres_database().await;
    let key_file = old.dir.path().join("rota.key");
    let new = tempfile::tempdir().unwrap();
    let config = new.path().join("rota.toml");
    let pg_text = format!("{first}\nurl = \"{pg}\"\n{rest}\n[secrets]\nkey_file = \"{}\"\n", key_file.display());
    std::fs::write(&config, pg_text).unwrap();
    let migrate = || {
        std::process::Command::new(env!("CARGO_BIN_EXE_rota"))
            .arg("--config")
            .arg(&config)
            .args(["migrate", "--from", sqlite_url.trim_matches('"')])
            .env("ROTA_LOG", "warn")
            .env_remove("ROTA_MASTER_KEY")
            .output()
            .unwrap()
    };
    let out = migrate();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        stdout.contains("4 profile(s), 0 order(s), 1 model cooldown(s), 2 agent(s), 6 request(s), 10 attempt(s)"),
        "{stdout}"
    );
    let again = migrate();
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("already holds profiles"), "a second copy is refused");

    let target = rota::store::open(&rota::config::DatabaseTarget::Postgres(pg.clone())).await.unwrap();
    assert_eq!(state(target.snapshot().await.unwrap()), state(old.store.snapshot().await.unwrap()));
    let pool = sqlx::PgPool::connect(&pg).await.unwrap();
    for (i, sql) in queries().iter().enumerate() {
        let got: Vec<Vec<String>> = sqlx::raw_sql(sqlx::AssertSqlSafe(sql.clone()))
            .fetch_all(&pool)
            .await
            .unwrap()
            .iter()
            .map(render_pg)
            .collect();
        assert_eq!(got, expected()[i], "query {} of docs/audit.md on the copy:\n{sql}", i + 1);
    }

    // A server on the copy opens the sealed secrets (it would not start otherwise), knows the
    // agents, and keeps the cooldowns.
    let moved = Rota::on_config(new, (old.agent_key.clone(), old.admin_key.clone())).await;
    let now = chrono::Utc::now().timestamp_millis();
    let k1: rota::engine::ProfileId = "openai:k1".parse().unwrap();
    assert!(moved.app_flush.0.stats(&k1).unwrap().blocked_until("gpt-4.1", now).is_some(), "k1 still cooling");
    let r = moved.chat(support::chat(), &[]).await;
    assert_eq!(r.status(), 200);
}

/// `audit.retention`: rota's own background task deletes rows older than the setting after
/// one `audit.prune_every`, keeping their daily roll-up and every newer row.
#[tokio::test]
async fn rows_past_the_retention_are_rolled_up_and_gone_after_one_prune_cycle() {
    let (_mock, base) = Mock::started().await;
    let config = format!("{}[audit]\nretention = \"7d\"\nprune_every = \"1s\"\n", support::config(&base));
    let rota = spawn(Scenario { config: &config, keys: &KEYS[..1], ..Scenario::default() }).await;
    let old = chrono::Utc::now().timestamp_millis() - 8 * 86_400_000;
    sqlx::query(
        "INSERT INTO requests (id, agent, api, status, attempts, started_at, duration_ms, stream)
         VALUES ('old-1', 'planner', 'chat', 200, 1, $1, 5, 0)",
    )
    .bind(old)
    .execute(rota.pool())
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO attempts (request_id, seq, kind, agent, provider, model, profile_id, started_at, outcome, tokens_in, tokens_out)
         VALUES ('old-1', 1, 'primary', 'planner', 'openai', 'gpt-4.1', 'openai:k1', $1, 'success', 12, 3)",
    )
    .bind(old)
    .execute(rota.pool())
    .await
    .unwrap();
    let served = rota.chat(support::chat(), &[]).await;
    assert_eq!(served.status(), 200);
    rota.flush().await;

    let t = std::time::Instant::now();
    while rota.scalar("SELECT count(*) FROM requests WHERE id = 'old-1'").await != Some(0) {
        assert!(t.elapsed() < std::time::Duration::from_secs(5), "the old row outlived a prune cycle");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(rota.scalar("SELECT count(*) FROM attempts WHERE request_id = 'old-1'").await, Some(0));
    assert_eq!(rota.scalar("SELECT count(*) FROM requests").await, Some(1), "the new request stays");
    let rolled: (String, i64, i64, i64) =
        sqlx::query_as("SELECT profile_id, attempts, successes, tokens_in FROM usage_daily")
            .fetch_one(rota.pool())
            .await
            .unwrap();
    assert_eq!(rolled, ("openai:k1".to_string(), 1, 1, 12));
}

#[tokio::test]
async fn refused_and_failed_requests_are_in_the_requests_log_on_sqlite() {
    refused_and_failed_requests_are_in_the_requests_log(Db::Sqlite).await;
}

#[tokio::test]
async fn refused_and_failed_requests_are_in_the_requests_log_on_postgres() {
    refused_and_failed_requests_are_in_the_requests_log(Db::Postgres(support::postgres_database().await)).await;
}

/// Every request of an authenticated agent has its `requests` row, refused ones included (no
/// attempt, the status and rota's message in `error`); an exhausted walk keeps its aggregated
/// message; a request that rotated and fell back is one row with its attempts in order.
async fn refused_and_failed_requests_are_in_the_requests_log(db: Db) {
    let (mock, base) = Mock::started().await;
    let rota =
        spawn(Scenario { config: &support::config_with_backup(&base), keys: &KEYS[..3], db, ..Scenario::default() })
            .await;
    let admin = Some(rota.admin_key.as_str());
    let chat = |model: &str| json!({"model": model, "messages": [{"role": "user", "content": "hi"}]});
    let id = |r: &reqwest::Response| r.headers()["x-request-id"].to_str().unwrap().to_string();
    let limited = || {
        Reply::Status(429, vec![("retry-after", "600".into())], r#"{"error":{"message":"Rate limit reached"}}"#.into())
    };

    // 1. An unknown model: 404.
    let unknown = rota.chat(chat("nope"), &[]).await;
    assert_eq!(unknown.status(), 404);
    let unknown = id(&unknown);
    // 2. A body that is not JSON: 400.
    let bad = Rota::client()
        .post(format!("{}/v1/chat/completions", rota.url))
        .bearer_auth(&rota.agent_key)
        .header("content-type", "application/json")
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), 400);
    let bad = id(&bad);
    // 3. A pin to a profile that does not exist: 400 (Step::Refuse).
    let pinned = rota.chat(chat("openai/gpt-4.1"), &[("x-rota-profile", "openai:ghost")]).await;
    assert_eq!(pinned.status(), 400);
    let pinned = id(&pinned);
    // 4. k1 and k2 answer 429, the fallback serves: one request, three attempts.
    mock.script(KEYS[0].1, vec![limited()]);
    mock.script(KEYS[1].1, vec![limited()]);
    let moved = rota.chat(chat("openai/gpt-4.1"), &[]).await;
    assert_eq!((moved.status().as_u16(), moved.headers()["x-rota-profile"].to_str().unwrap()), (200, "backup:b1"));
    let moved = id(&moved);
    // 5. openai is cooling (skipped) and the fallback fails: the aggregated error.
    let broken = r#"{"error":{"message":"upstream exploded"}}"#;
    mock.script(KEYS[2].1, vec![Reply::Status(500, vec![], broken.into()), Reply::Status(500, vec![], broken.into())]);
    let failed = rota.chat(chat("openai/gpt-4.1"), &[]).await;
    let failed_status = failed.status().as_u16();
    assert!(failed_status >= 500, "{failed_status}");
    let failed = id(&failed);
    // A key rota does not know leaves no row.
    let stranger = Rota::client()
        .post(format!("{}/v1/chat/completions", rota.url))
        .bearer_auth("rk_not-a-key-of-anyone")
        .json(&chat("nope"))
        .send()
        .await
        .unwrap();
    assert_eq!(stranger.status(), 401);

    let (code, page) = rota.api("GET", "/api/v1/requests", admin, None).await;
    assert_eq!(code, 200);
    let items = page["items"].as_array().unwrap();
    let ids: Vec<&str> = items.iter().map(|r| r["id"].as_str().unwrap()).collect();
    assert_eq!(ids, [&failed, &moved, &pinned, &bad, &unknown], "newest first, no row for the stranger");
    let row = |i: usize| &items[i];
    let fields = |i: usize| {
        let r = row(i);
        (
            r["status"].as_i64().unwrap(),
            r["attempts"].as_i64().unwrap(),
            r["requested_model"].as_str(),
            r["agent"].as_str(),
        )
    };
    assert_eq!(fields(4), (404, 0, Some("nope"), Some("tester")));
    assert!(row(4)["error"].as_str().unwrap().starts_with("unknown model `nope`"), "{}", row(4));
    assert_eq!(fields(3), (400, 0, None, Some("tester")));
    assert!(row(3)["error"].as_str().unwrap().starts_with("invalid JSON"), "{}", row(3));
    assert_eq!(fields(2), (400, 0, Some("openai/gpt-4.1"), Some("tester")));
    assert_eq!(row(2)["error"], "pinned profile `openai:ghost` does not exist");
    assert_eq!(fields(1), (200, 3, Some("openai/gpt-4.1"), Some("tester")));
    assert_eq!((row(1)["error"].clone(), row(1)["served_profile"].as_str()), (Value::Null, Some("backup:b1")));
    assert_eq!(fields(0).0, i64::from(failed_status));
    let message = row(0)["error"].as_str().unwrap();
    assert!(message.starts_with("All models failed (2): openai/gpt-4.1: every profile is cooling"), "{message}");
    assert!(message.contains("backup/gpt-4.1-mini: upstream exploded"), "{message}");
    assert!(!message.contains("sk-"), "{message}");

    // The agent filter finds them all; an attempt filter only those with a matching attempt.
    let (_, mine) = rota.api("GET", "/api/v1/requests?agent=tester", admin, None).await;
    assert_eq!(mine["items"].as_array().unwrap().len(), 5);
    let (_, theirs) = rota.api("GET", "/api/v1/requests?agent=admin", admin, None).await;
    assert_eq!(theirs["items"], json!([]));
    let (_, limited_rows) = rota.api("GET", "/api/v1/requests?reason=rate_limit", admin, None).await;
    let limited_ids: Vec<&str> =
        limited_rows["items"].as_array().unwrap().iter().map(|r| r["id"].as_str().unwrap()).collect();
    assert_eq!(limited_ids, [&failed, &moved], "the skip of a cooling provider says rate_limit too");

    // The attempts of the request that moved on, newest first: the fallback, the rotation, the first.
    let (code, attempts) = rota.api("GET", &format!("/api/v1/attempts?request_id={moved}"), admin, None).await;
    assert_eq!(code, 200);
    let steps: Vec<(i64, &str, &str, &str)> = attempts["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            (
                a["seq"].as_i64().unwrap(),
                a["kind"].as_str().unwrap(),
                a["profile_id"].as_str().unwrap(),
                a["outcome"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        steps,
        [
            (3, "fallback", "backup:b1", "success"),
            (2, "rotate", "openai:k2", "failure"),
            (1, "primary", "openai:k1", "failure"),
        ]
    );
    assert!(attempts["items"].as_array().unwrap()[1..].iter().all(|a| a["reason"] == "rate_limit"));
}
