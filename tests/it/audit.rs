//! Every query of docs/audit.md, run in order against a database filled by real gateway traffic,
//! returns the rows the traffic implies, on SQLite and on PostgreSQL alike.

use crate::support::{self, ANTHROPIC_KEY, Db, Mock, Reply, Rota, Scenario, spawn};
use serde_json::{Value, json};
use sqlx::Row;

/// Two `openai` profiles, the `backup` one and an `anthropic` one.
const KEYS: [(&str, &str); 4] = [support::KEYS[0], support::KEYS[1], support::KEYS[3], ANTHROPIC_KEY];

pub(crate) fn queries() -> Vec<String> {
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
/// `render` writes SQLite's: a decimal like `2.00` or `8e-06` as the number it is (`2`,
/// `0.000008`).
pub(crate) fn render_pg(row: &sqlx::postgres::PgRow) -> Vec<String> {
    (0..row.columns().len())
        .map(|i| match row.try_get_unchecked::<Option<String>, _>(i).unwrap() {
            None => "NULL".into(),
            Some(v) if v.contains(['.', 'e']) => v.parse::<f64>().map_or(v, |f| f.to_string()),
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

/// Every other SQL block of docs/ (the operators' guide, the schema's examples: SQLite's SQL,
/// their PostgreSQL forms said in the text) runs against the same traffic's database, and the
/// ones that look at the audit trail find its rows.
#[tokio::test]
async fn every_sql_block_of_the_other_docs_runs() {
    let rota = traffic(Db::Sqlite).await;
    let (code, _) =
        rota.api("POST", "/api/v1/models/clear", Some(&rota.admin_key), Some(json!({"model": "openai/gpt-9"}))).await;
    assert_eq!(code, 200, "an admin action for the guide's query to find");
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/docs");
    let mut ran = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "md") || path.ends_with("audit.md") {
            continue;
        }
        let doc = std::fs::read_to_string(&path).unwrap();
        for sql in doc.split("```sql\n").skip(1).map(|b| b.split("\n```").next().unwrap()) {
            let rows = sqlx::query(sqlx::AssertSqlSafe(sql.to_string()))
                .fetch_all(rota.pool())
                .await
                .unwrap_or_else(|e| panic!("{}: failed: {e}\n{sql}", path.display()));
            if sql.contains("FROM admin_actions") || sql.contains("FROM audit_minutely") {
                assert!(!rows.is_empty(), "{}: no rows from the traffic:\n{sql}", path.display());
            }
            ran += 1;
        }
    }
    assert!(ran >= 5, "the blocks of operations.md and schema.md: {ran}");
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
/// fallback after k2 says gpt-9 does not exist; R5 fails: the Anthropic key has no credits. They
/// are moved to yesterday. R6, today, names a model nothing serves.
async fn traffic(db: Db) -> Rota {
    let pg = match &db {
        Db::Postgres(url) => Some(url.clone()),
        Db::Sqlite => None,
    };
    let (mock, base) = Mock::started().await;
    // gpt-9 is named by the config (an alias of a model being retired): its 404 cools it.
    let config = format!(
        "{}{}[aliases]\nlegacy = \"openai/gpt-9\"\n",
        support::config_with_backup(&base),
        support::anthropic_provider(&base)
    );
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
    // R1–R5 were yesterday's: their rows move a day back, as if the guide were read the day after.
    rota.flush().await;
    for table in ["requests", "attempts"] {
        let shift = format!("UPDATE {table} SET started_at = started_at - 86400000");
        match &pg {
            Some(url) => {
                let pool = sqlx::PgPool::connect(url).await.unwrap();
                sqlx::query(sqlx::AssertSqlSafe(shift)).execute(&pool).await.unwrap();
            }
            None => {
                sqlx::query(sqlx::AssertSqlSafe(shift)).execute(rota.pool()).await.unwrap();
            }
        }
    }
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
        // R1 and R2 on gpt-4.1: 3 × $2 + 2 × $8 per million, 22 micro-dollars each; R3 and R4 on
        // gpt-4.1-mini: 3 × $0.40 + 2 × $1.60 = 4.4, so 4; R5 failed (NULL). R6 is today's.
        rows(&[&["tester", "5", "0.000052"]]),
        rows(&[
            &["openai", "openai:k1", "5", "0.000044"],
            &["backup", "backup:b1", "2", "0.000008"],
            &["anthropic", "anthropic:main", "1", "NULL"],
            &["openai", "openai:k2", "2", "NULL"],
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
    // The copy ends by moving the rows of days without a partition out of the default ones,
    // which takes as long as the trail is large: it must not run under the statement timeout.
    // Here every day's partition of `attempts` is gone and the move out of `attempts_default`
    // sleeps a second, beside a timeout of 500 ms given in the URL.
    drop(rota::store::open(&rota::store::DatabaseTarget::Postgres(pg.clone())).await.unwrap());
    let pool = sqlx::PgPool::connect(&pg).await.unwrap();
    let days: Vec<String> = sqlx::query_scalar(
        "SELECT c.relname::text FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
         WHERE i.inhparent = 'attempts'::regclass AND c.relname <> 'attempts_default'",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert!(!days.is_empty());
    for day in days {
        sqlx::query(sqlx::AssertSqlSafe(format!("DROP TABLE {day}"))).execute(&pool).await.unwrap();
    }
    sqlx::raw_sql(
        "CREATE FUNCTION slow_move() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_sleep(1); RETURN NULL; END $$;
         CREATE TRIGGER slow_move BEFORE DELETE ON attempts_default FOR EACH STATEMENT EXECUTE FUNCTION slow_move();",
    )
    .execute(&pool)
    .await
    .unwrap();
    let mut short = url::Url::parse(&pg).unwrap();
    short.query_pairs_mut().append_pair("options", "-c statement_timeout=500ms");
    let key_file = old.dir.path().join("rota.key");
    let new = tempfile::tempdir().unwrap();
    let config = new.path().join("rota.toml");
    let pg_text = format!("{first}\nurl = \"{short}\"\n{rest}\n[secrets]\nkey_file = \"{}\"\n", key_file.display());
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

    let target = rota::store::open(&rota::store::DatabaseTarget::Postgres(pg.clone())).await.unwrap();
    assert_eq!(state(target.snapshot().await.unwrap()), state(old.store.snapshot().await.unwrap()));
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM attempts_default").fetch_one(&pool).await.unwrap();
    assert_eq!(left, 0, "the copied days have partitions of their own");
    let vacuumed: bool = sqlx::query_scalar(
        "SELECT last_vacuum IS NOT NULL FROM pg_stat_user_tables WHERE relname = 'attempts_default'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert!(vacuumed, "the rows moved out of the default partition leave no dead entries behind");
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
    assert!(moved.app().0.stats(&k1).unwrap().blocked_until("gpt-4.1", now).is_some(), "k1 still cooling");
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

    // A lease for an unknown model is refused the same way: a row of its own, no attempt.
    let agent = Some(rota.agent_key.as_str());
    let (code, _) = rota.api("POST", "/api/v1/leases", agent, Some(json!({"model": "nope"}))).await;
    assert_eq!(code, 404);
    let (_, newest) = rota.api("GET", "/api/v1/requests?limit=1", admin, None).await;
    let lease = &newest["items"][0];
    assert_eq!(
        (lease["api"].as_str(), lease["status"].as_i64(), lease["attempts"].as_i64()),
        (Some("lease"), Some(404), Some(0))
    );
    assert_eq!(lease["requested_model"], "nope");
    assert!(lease["error"].as_str().unwrap().starts_with("unknown model `nope`"), "{lease}");
}

#[tokio::test]
async fn usage_series_counts_match_the_tables_on_sqlite() {
    usage_series_counts_match_the_tables(Db::Sqlite).await;
}

#[tokio::test]
async fn usage_series_counts_match_the_tables_on_postgres() {
    usage_series_counts_match_the_tables(Db::Postgres(support::postgres_database().await)).await;
}

/// SQL for either engine, with `$N` parameters.
enum Sql {
    Lite(sqlx::SqlitePool),
    Pg(sqlx::PgPool),
}

#[derive(Clone)]
enum Arg {
    I(i64),
    S(String),
}

impl Sql {
    /// The row of numbers a query returns (NULL read as 0).
    async fn numbers(&self, sql: &'static str, args: &[Arg]) -> Vec<i64> {
        macro_rules! run {
            ($pool:expr, $row:ty) => {{
                let mut q = sqlx::query(sql);
                for a in args {
                    q = match a {
                        Arg::I(v) => q.bind(*v),
                        Arg::S(v) => q.bind(v.clone()),
                    };
                }
                let row: $row = q.fetch_one($pool).await.unwrap();
                (0..row.columns().len()).map(|i| row.try_get::<Option<i64>, _>(i).unwrap().unwrap_or(0)).collect()
            }};
        }
        match self {
            Sql::Lite(pool) => run!(pool, sqlx::sqlite::SqliteRow),
            Sql::Pg(pool) => run!(pool, sqlx::postgres::PgRow),
        }
    }

    async fn count(&self, sql: &'static str, args: &[Arg]) -> i64 {
        self.numbers(sql, args).await[0]
    }
}

/// An attempt of the generated traffic.
#[allow(clippy::too_many_arguments)]
fn attempt_at(
    request: &str,
    seq: i64,
    provider: &str,
    profile: Option<&str>,
    at: i64,
    duration: i64,
    outcome: &str,
    reason: Option<&str>,
    cooldown_until: Option<i64>,
) -> rota::store::AttemptRecord {
    rota::store::AttemptRecord {
        request_id: request.into(),
        seq,
        kind: if outcome == "skipped" { "skipped" } else { "primary" }.into(),
        agent: Some("tester".into()),
        provider: provider.into(),
        model: "gpt-4.1".into(),
        profile_id: profile.map(str::to_string),
        started_at: at,
        duration_ms: Some(duration),
        ttfb_ms: None,
        http_status: None,
        outcome: outcome.into(),
        reason: reason.map(str::to_string),
        retry_after_ms: None,
        cooldown_until,
        error: None,
        tokens_in: None,
        tokens_out: None,
        cost: None,
        usage_suspect: false,
    }
}

/// Every number of `GET /api/v1/usage/series` is the count SQL gives for its bucket, on rows
/// written at known times (random traffic two days ago, around a one-hour window), and the
/// timeline shows the windows the failures set (ended early by a success, merged, clipped,
/// disabled for billing) and the state a profile is in now.
async fn usage_series_counts_match_the_tables(db: Db) {
    let (mock, base) = Mock::started().await;
    let pg = match &db {
        Db::Postgres(url) => Some(url.clone()),
        Db::Sqlite => None,
    };
    let rota =
        spawn(Scenario { config: &support::config_with_backup(&base), keys: &KEYS[..3], db, ..Scenario::default() })
            .await;
    let sql = match pg {
        Some(url) => Sql::Pg(sqlx::PgPool::connect(&url).await.unwrap()),
        None => Sql::Lite(rota.pool().clone()),
    };
    let admin = Some(rota.admin_key.as_str());
    let now = chrono::Utc::now().timestamp_millis();
    let t0 = (now / 3_600_000 - 48) * 3_600_000;
    const MIN: i64 = 60_000;

    // Random traffic from 30 minutes before the hour to 30 after it, on k2, b1 and a profile
    // removed since; none of it sets a window.
    let mut rng = fastrand::Rng::with_seed(17);
    let (mut requests, mut attempts) = (Vec::new(), Vec::new());
    for i in 0..600 {
        let at = t0 - 30 * MIN + rng.i64(0..120 * MIN);
        let id = format!("r{i:04}");
        let n = rng.i64(0..4);
        let served = n > 0 && rng.bool();
        for seq in 1..=n {
            let last = seq == n;
            let (provider, profile) =
                [("openai", Some("openai:k2")), ("openai", Some("openai:old")), ("backup", None)][rng.usize(0..3)];
            let (outcome, reason) = match (profile, last && served) {
                (None, _) => ("skipped", Some("rate_limit")),
                (Some(_), true) => ("success", None),
                (Some(_), false) => ("failure", Some(["rate_limit", "overloaded", "timeout"][rng.usize(0..3)])),
            };
            attempts.push(attempt_at(&id, seq, provider, profile, at + seq, 5, outcome, reason, None));
        }
        let status = if n == 0 {
            [400, 404][rng.usize(0..2)]
        } else if served {
            200
        } else {
            [429, 502][rng.usize(0..2)]
        };
        requests.push(rota::store::RequestRecord {
            id,
            agent: Some("tester".into()),
            api: "chat".into(),
            requested_model: Some("openai/gpt-4.1".into()),
            served_model: None,
            served_profile: None,
            status: Some(status),
            attempts: n,
            started_at: at,
            duration_ms: Some(5),
            stream: false,
            tokens_in: None,
            tokens_out: None,
            error: None,
            cost: None,
            usage_suspect: false,
        });
    }
    // The windows: k1 cools from before the hour into it (timeout), then twice (rate_limit,
    // overlapping) until a success ends them; b1 is disabled for billing from five hours
    // before into the hour, and again past the hour's end;
    // b1's model_not_found cools the model, not the profile.
    let k1 = Some("openai:k1");
    let b1 = Some("backup:b1");
    attempts.extend([
        attempt_at("w1", 1, "openai", k1, t0 - 10 * MIN, 0, "failure", Some("timeout"), Some(t0 + 2 * MIN)),
        attempt_at("w2", 1, "openai", k1, t0 + 10 * MIN, 100, "failure", Some("rate_limit"), Some(t0 + 15 * MIN)),
        attempt_at("w3", 1, "openai", k1, t0 + 11 * MIN, 0, "failure", Some("rate_limit"), Some(t0 + 20 * MIN)),
        attempt_at("w4", 1, "openai", k1, t0 + 16 * MIN, 30, "success", None, None),
        attempt_at("w5", 1, "backup", b1, t0 + 5 * MIN, 0, "failure", Some("model_not_found"), Some(t0 + 6 * MIN)),
        attempt_at("w6", 1, "backup", b1, t0 + 30 * MIN, 50, "failure", Some("billing"), Some(t0 + 150 * MIN)),
        attempt_at("w7", 1, "backup", b1, t0 - 300 * MIN, 0, "failure", Some("billing"), Some(t0 + 3 * MIN)),
    ]);
    rota.store.insert_audit(&requests, &attempts).await.unwrap();
    // On PostgreSQL these days wait in the default partitions until an upkeep (the first a
    // second after start) moves them into their own; a count taken while it does can miss
    // them, so the moves are done first: an upkeep that makes nothing finds them all made.
    let mut made = None;
    for _ in 0..20 {
        made = rota.store.audit_upkeep(now).await.ok();
        if made == Some(0) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(made, Some(0), "the audit partitions are made");

    // Per 5 minutes, per minute, and per hour over three days (its counts from `audit_hourly`,
    // its timeline over the last day and hour only).
    let hours = 60 * MIN;
    for (since, until, step) in
        [(t0, t0 + 60 * MIN, 300), (t0 - 7 * MIN - 5, t0 + 42 * MIN + 1, 60), (t0 - 72 * hours, t0 + 23 * hours, 3600)]
    {
        let (code, s) = rota
            .api("GET", &format!("/api/v1/usage/series?since={since}&until={until}&step={step}"), admin, None)
            .await;
        assert_eq!(code, 200, "{s}");
        let step_ms = step * 1000;
        let (since, until) = (since.div_euclid(step_ms) * step_ms, (until + step_ms - 1).div_euclid(step_ms) * step_ms);
        assert_eq!(
            (s["since"].as_i64(), s["until"].as_i64(), s["step_ms"].as_i64()),
            (Some(since), Some(until), Some(step_ms))
        );
        let buckets: Vec<i64> = (since..until).step_by(step_ms as usize).collect();
        assert_eq!(s["buckets"], json!(buckets));
        let counts =
            |v: &Value| -> Vec<i64> { v["counts"].as_array().unwrap().iter().map(|c| c.as_i64().unwrap()).collect() };
        let window = |b: i64| [Arg::I(b), Arg::I(b + step_ms)];

        let mut listed = 0;
        for series in s["attempts"].as_array().unwrap() {
            let (provider, outcome) = (series["provider"].as_str().unwrap(), series["outcome"].as_str().unwrap());
            let mut want = Vec::new();
            for &b in &buckets {
                let [from, to] = window(b);
                want.push(
                    sql.count(
                        "SELECT count(*) FROM attempts WHERE provider = $1 AND outcome = $2 AND started_at >= $3 AND started_at < $4",
                        &[Arg::S(provider.into()), Arg::S(outcome.into()), from, to],
                    )
                    .await,
                );
            }
            assert_eq!(counts(series), want, "{provider} {outcome}");
            listed += want.iter().sum::<i64>();
        }
        let all = "SELECT count(*) FROM attempts WHERE started_at >= $1 AND started_at < $2";
        assert_eq!(listed, sql.count(all, &[Arg::I(since), Arg::I(until)]).await, "every attempt is in a series");
        assert!(listed > 100, "the window holds traffic: {listed}");

        let outcomes: Vec<&str> =
            s["requests"].as_array().unwrap().iter().map(|r| r["outcome"].as_str().unwrap()).collect();
        assert_eq!(outcomes, ["served", "failed", "refused"]);
        for series in s["requests"].as_array().unwrap() {
            let mut want = Vec::new();
            for &b in &buckets {
                let [from, to] = window(b);
                let args = [from, to];
                want.push(match series["outcome"].as_str().unwrap() {
                    "served" => sql.count("SELECT count(*) FROM requests WHERE started_at >= $1 AND started_at < $2 AND attempts > 0 AND status BETWEEN 200 AND 299", &args).await,
                    "refused" => sql.count("SELECT count(*) FROM requests WHERE started_at >= $1 AND started_at < $2 AND attempts = 0", &args).await,
                    _ => sql.count("SELECT count(*) FROM requests WHERE started_at >= $1 AND started_at < $2 AND attempts > 0 AND NOT (status BETWEEN 200 AND 299)", &args).await,
                });
            }
            assert_eq!(counts(series), want, "{}", series["outcome"]);
        }

        let mut totals = Vec::new();
        for series in s["reasons"].as_array().unwrap() {
            let reason = series["reason"].as_str().unwrap();
            let mut want = Vec::new();
            for &b in &buckets {
                let [from, to] = window(b);
                want.push(
                    sql.count(
                        "SELECT count(*) FROM attempts WHERE outcome = 'failure' AND reason = $1 AND started_at >= $2 AND started_at < $3",
                        &[Arg::S(reason.into()), from, to],
                    )
                    .await,
                );
            }
            assert_eq!(counts(series), want, "{reason}");
            assert_eq!(series["total"].as_i64(), Some(want.iter().sum()), "{reason}");
            totals.push(series["total"].as_i64().unwrap());
        }
        assert!(totals.windows(2).all(|w| w[0] >= w[1]), "most first: {totals:?}");
        let failures =
            "SELECT count(*) FROM attempts WHERE outcome = 'failure' AND started_at >= $1 AND started_at < $2";
        assert_eq!(totals.iter().sum::<i64>(), sql.count(failures, &[Arg::I(since), Arg::I(until)]).await);

        let mut shared = 0;
        for p in s["profiles"].as_array().unwrap() {
            let want = sql
                .numbers(
                    "SELECT count(*), sum(CASE WHEN outcome = 'success' THEN 1 ELSE 0 END), sum(CASE WHEN outcome = 'failure' THEN 1 ELSE 0 END)
                     FROM attempts WHERE profile_id = $1 AND started_at >= $2 AND started_at < $3",
                    &[Arg::S(p["profile"].as_str().unwrap().into()), Arg::I(since), Arg::I(until)],
                )
                .await;
            let got = [&p["attempts"], &p["successes"], &p["failures"]].map(|v| v.as_i64().unwrap());
            assert_eq!(got.to_vec(), want, "{p}");
            shared += got[0];
        }
        let with_profile =
            "SELECT count(*) FROM attempts WHERE profile_id IS NOT NULL AND started_at >= $1 AND started_at < $2";
        assert_eq!(shared, sql.count(with_profile, &[Arg::I(since), Arg::I(until)]).await);
        assert!(
            s["profiles"].as_array().unwrap().iter().any(|p| p["profile"] == "openai:old"),
            "a removed profile's share"
        );

        let seg = |from: i64, to: i64, state: &str, reason: &str| json!({"from": from, "until": to, "state": state, "reason": reason});
        if step == 3600 {
            // The timeline from a day and an hour before the end: two hours before t0, inside
            // b1's first billing window.
            assert_eq!(s["timeline_since"].as_i64(), Some(t0 - 2 * hours));
            assert_eq!(
                s["timeline"],
                json!([
                    {"profile": "backup:b1", "segments": [
                        seg(t0 - 2 * hours, t0 + 3 * MIN, "disabled", "billing"),
                        seg(t0 + 30 * MIN + 50, t0 + 150 * MIN, "disabled", "billing"),
                    ]},
                    {"profile": "openai:k1", "segments": [
                        seg(t0 - 10 * MIN, t0 + 2 * MIN, "cooling", "timeout"),
                        seg(t0 + 10 * MIN + 100, t0 + 16 * MIN, "cooling", "rate_limit"),
                    ]},
                    {"profile": "openai:k2", "segments": []},
                ])
            );
        } else {
            assert_eq!(s["timeline_since"].as_i64(), Some(since));
        }
        if step == 300 {
            assert_eq!(
                s["timeline"],
                json!([
                    {"profile": "backup:b1", "segments": [
                        seg(t0, t0 + 3 * MIN, "disabled", "billing"),
                        seg(t0 + 30 * MIN + 50, t0 + 60 * MIN, "disabled", "billing"),
                    ]},
                    {"profile": "openai:k1", "segments": [
                        seg(t0, t0 + 2 * MIN, "cooling", "timeout"),
                        seg(t0 + 10 * MIN + 100, t0 + 16 * MIN, "cooling", "rate_limit"),
                    ]},
                    {"profile": "openai:k2", "segments": []},
                ])
            );
        }
    }

    // The state now: k1 answers 402 (disabled for billing), k2 serves. The last hour's
    // timeline shows k1 disabled from that failure to the range's end.
    mock.script(
        support::KEYS[0].1,
        vec![Reply::Status(402, vec![], r#"{"error":{"message":"insufficient credits","type":"billing"}}"#.into())],
    );
    let r = rota.chat(support::chat(), &[]).await;
    assert_eq!((r.status().as_u16(), r.headers()["x-rota-profile"].to_str().unwrap()), (200, "openai:k2"));
    let (code, s) = rota.api("GET", "/api/v1/usage/series", admin, None).await;
    assert_eq!(code, 200, "{s}");
    // An hour back from now, rounded out to whole minutes: 61 buckets (60 on a minute's edge).
    assert_eq!(s["step_ms"].as_i64(), Some(60_000));
    assert!((60..=61).contains(&s["buckets"].as_array().unwrap().len()), "{}", s["buckets"]);
    let k1 = s["timeline"].as_array().unwrap().iter().find(|p| p["profile"] == "openai:k1").unwrap();
    let segs = k1["segments"].as_array().unwrap();
    assert_eq!(segs.len(), 1, "{k1}");
    assert_eq!((segs[0]["state"].as_str(), segs[0]["reason"].as_str()), (Some("disabled"), Some("billing")));
    assert!(segs[0]["from"].as_i64().unwrap() >= now - 1000 && segs[0]["until"] == s["until"], "{k1}");
    let served = s["requests"].as_array().unwrap().iter().find(|r| r["outcome"] == "served").unwrap();
    assert_eq!(counts_sum(served), 1);
    assert_eq!(s["reasons"][0]["reason"], "billing");

    // Bad parameters.
    for (query, says) in [
        ("step=59", "60 to 86400"),
        ("step=86401", "60 to 86400"),
        ("step=1m", "whole number"),
        ("step=90", "multiple of 60"),
        ("since=2000&until=1000", "before"),
        ("since=0&until=86460000", "1441 buckets"),
        ("since=yesterday", "RFC 3339"),
        ("width=5", "width"),
    ] {
        let (code, v) = rota.api("GET", &format!("/api/v1/usage/series?{query}"), admin, None).await;
        assert_eq!(code, 400, "{query}: {v}");
        assert!(v["error"]["message"].as_str().unwrap().contains(says), "{query}: {v}");
    }
    let (code, _) = rota.api("GET", "/api/v1/usage/series", Some(&rota.agent_key), None).await;
    assert_eq!(code, 403);
    let (_, doc) = rota.api("GET", "/api/v1/openapi.json", None, None).await;
    let path = &doc["paths"]["/api/v1/usage/series"]["get"];
    let params: Vec<&str> =
        path["parameters"].as_array().unwrap().iter().map(|p| p["name"].as_str().unwrap()).collect();
    assert_eq!(params, ["since", "until", "step"], "{path}");
}

fn counts_sum(series: &Value) -> i64 {
    series["counts"].as_array().unwrap().iter().map(|c| c.as_i64().unwrap()).sum()
}

/// A `requests` row of `api`, as the writer's tests queue it.
fn request_row(id: &str, api: &'static str) -> rota::store::RequestRow {
    rota::store::RequestRow {
        id: id.into(),
        agent: Some("tester".into()),
        api,
        requested_model: None,
        served_model: None,
        served_profile: None,
        status: 200,
        attempts: 0,
        started_at: 1,
        duration_ms: 1,
        stream: false,
        tokens_in: None,
        tokens_out: None,
        error: None,
        cost: None,
        usage_suspect: false,
    }
}

/// Shutdown that gives up waiting for the database sheds the rows still queued and counts
/// them with the others (`dropped_*`, `rota_audit_dropped_total`): never only a log line. The
/// batch under way may still land, so it is not counted.
#[tokio::test]
async fn rows_that_shutdown_gives_up_on_are_counted_as_shed() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rota.db");
    let store = rota::store::SqliteStore::open(&path).await.unwrap();
    let audit = rota::audit::Audit::start(std::sync::Arc::new(store), 2000);
    // An auditor holds the write lock: nothing is written meanwhile.
    let mut auditor =
        sqlx::ConnectOptions::connect(&sqlx::sqlite::SqliteConnectOptions::new().filename(&path)).await.unwrap();
    sqlx::query("BEGIN IMMEDIATE").execute(&mut auditor).await.unwrap();
    // More than one batch (1,024 rows): the writer takes one and waits for the lock.
    for i in 0..1500 {
        audit.request(request_row(&format!("r{i}"), "chat"));
    }
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let h = audit.give_up();
    assert!(h.dropped_requests > 0, "{h:?}");
    assert_eq!(h.dropped_requests + h.queued as u64, 1500, "shed and counted, or in the batch under way: {h:?}");
    sqlx::query("ROLLBACK").execute(&mut auditor).await.unwrap();
}

/// Rows that arrive faster than a small queue (`audit.queue`) fills in one gather are written
/// once half the queue waits: none is shed while the database keeps up.
#[tokio::test]
async fn a_small_queue_is_written_before_the_gather_fills_it() {
    let dir = tempfile::tempdir().unwrap();
    let store = rota::store::SqliteStore::open(&dir.path().join("rota.db")).await.unwrap();
    let store: std::sync::Arc<dyn rota::store::Store> = std::sync::Arc::new(store);
    let audit = rota::audit::Audit::start(store.clone(), 8);
    // A row every 5 ms: ten in one 50 ms gather, more than the queue holds.
    for i in 0..40 {
        audit.request(request_row(&format!("r{i}"), "chat"));
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    assert!(audit.flush_within(std::time::Duration::from_secs(10)).await);
    let h = audit.health();
    assert_eq!((h.dropped_requests, h.queued), (0, 0), "{h:?}");
    let everything = rota::store::AuditQuery { limit: 100, ..Default::default() };
    assert_eq!(store.requests(&everything).await.unwrap().len(), 40);
}

/// A row the database refuses for its content (here a failed check: an `api` no request has)
/// is set aside after the batch's third try, logged and counted, and the rows behind it are
/// written: it never holds up the audit log.
async fn a_row_the_database_refuses_is_set_aside(target: rota::store::DatabaseTarget) {
    let store = rota::store::open(&target).await.unwrap();
    let audit = rota::audit::Audit::start(store.clone(), 100);
    audit.request(request_row("before", "chat"));
    audit.request(request_row("refused", "bogus"));
    audit.request(request_row("after", "lease"));
    assert!(audit.flush_within(std::time::Duration::from_secs(10)).await, "the log moved on");
    let h = audit.health();
    assert_eq!((h.invalid_requests, h.dropped_requests, h.queued), (1, 0, 0), "{h:?}");
    let everything = rota::store::AuditQuery { limit: 10, ..Default::default() };
    let mut ids: Vec<String> = store.requests(&everything).await.unwrap().into_iter().map(|r| r.id).collect();
    ids.sort();
    assert_eq!(ids, ["after", "before"]);
    // The next rows go in at once.
    audit.request(request_row("later", "chat"));
    assert!(audit.flush_within(std::time::Duration::from_secs(2)).await);
}

#[tokio::test]
async fn a_row_sqlite_refuses_is_set_aside_and_the_rows_behind_it_are_written() {
    let dir = tempfile::tempdir().unwrap();
    a_row_the_database_refuses_is_set_aside(rota::store::DatabaseTarget::Sqlite(dir.path().join("rota.db"))).await;
}

#[tokio::test]
async fn a_row_postgres_refuses_is_set_aside_and_the_rows_behind_it_are_written() {
    let url = support::postgres_database().await;
    a_row_the_database_refuses_is_set_aside(rota::store::DatabaseTarget::Postgres(url)).await;
}
