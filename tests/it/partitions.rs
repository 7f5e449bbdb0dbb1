//! The audit trail partitioned by day on PostgreSQL (docs/audit.md, "Partitions on
//! PostgreSQL"): a database that already holds audit rows is partitioned by `rota migrate` and
//! answers every query of docs/audit.md as before; retention drops a day's partitions, rolled
//! up into `usage_daily` exactly as the row-by-row delete of the same rows is.

use crate::audit::{queries, render_pg};
use crate::support;
use rota::store::DatabaseTarget;
use sqlx::PgPool;
use std::time::Instant;

/// 2026-11-01T00:00:00Z.
const DAY0: i64 = 1_793_491_200_000;
const DAY: i64 = 86_400_000;

/// A database on the schema before the audit trail was partitioned (the migrations before
/// 0017), as an existing deployment's is.
async fn unpartitioned() -> (String, PgPool) {
    let url = support::postgres_database().await;
    let pool = PgPool::connect(&url).await.unwrap();
    let mut migrator =
        sqlx::migrate::Migrator::new(std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/migrations/postgres")))
            .await
            .unwrap();
    migrator.migrations = migrator.migrations.iter().filter(|m| m.version < 17).cloned().collect::<Vec<_>>().into();
    migrator.run(&pool).await.unwrap();
    (url, pool)
}

/// `per_day` requests of one to three attempts each, on each of `days` days from `DAY0`, with
/// agents, providers, profiles, outcomes, reasons, tokens and costs that vary, and their hours
/// in `usage_hourly`, `usage_profile_daily` and `failure_windows` as the audit writer keeps them.
async fn fill(pool: &PgPool, days: i64, per_day: i64) {
    let step = DAY / per_day;
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "INSERT INTO requests (id, agent, api, requested_model, served_model, served_profile, status, attempts,
             started_at, duration_ms, stream, tokens_in, tokens_out, cost, error)
         SELECT 'r' || i, 'agent-' || (i % 3), 'chat', 'openai/gpt-4.1',
             CASE WHEN i % 7 = 0 THEN NULL ELSE 'openai/gpt-4.1' END,
             CASE WHEN i % 7 = 0 THEN NULL ELSE 'openai:k' || (i % 4) END,
             CASE WHEN i % 7 = 0 THEN 429 ELSE 200 END, 1 + i % 3, {DAY0} + i * {step}, 20 + i % 50,
             i % 2 = 0, 10 + i % 5, 3, CASE WHEN i % 7 = 0 THEN NULL ELSE 0.00002 END,
             CASE WHEN i % 7 = 0 THEN 'every profile is cooling' END
         FROM generate_series(0, {n} - 1) i;
         INSERT INTO attempts (request_id, seq, kind, agent, provider, model, profile_id, started_at, duration_ms,
             ttfb_ms, http_status, outcome, reason, retry_after_ms, cooldown_until, error, tokens_in, tokens_out, cost)
         SELECT 'r' || i, s, CASE WHEN s = 1 THEN 'primary' ELSE 'rotate' END, 'agent-' || (i % 3),
             CASE WHEN i % 11 = 0 THEN 'anthropic' ELSE 'openai' END, 'gpt-4.1', 'openai:k' || ((i + s) % 4),
             {DAY0} + i * {step} + s, 10, 5, CASE WHEN s < 1 + i % 3 THEN 429 ELSE 200 END,
             CASE WHEN s < 1 + i % 3 THEN 'failure' ELSE 'success' END,
             CASE WHEN s < 1 + i % 3 THEN (ARRAY['rate_limit', 'overloaded', 'billing'])[1 + i % 3] END,
             NULL, CASE WHEN s < 1 + i % 3 THEN {DAY0} + i * {step} + s + 60000 END, NULL, 10 + i % 5, 3, 0.00001
         FROM generate_series(0, {n} - 1) i, generate_series(1, 3) s WHERE s <= 1 + i % 3;
         INSERT INTO usage_hourly (hour, profile_id, attempts, successes, failures, tokens_in, tokens_out)
         SELECT started_at - started_at % 3600000, profile_id, count(*),
             sum(CASE WHEN outcome = 'success' THEN 1 ELSE 0 END), sum(CASE WHEN outcome = 'failure' THEN 1 ELSE 0 END),
             sum(tokens_in), sum(tokens_out)
         FROM attempts GROUP BY 1, 2;
         -- Where the schema has it (an older one gets it from its migration).
         DO $$ BEGIN IF to_regclass('usage_profile_daily') IS NOT NULL THEN
             INSERT INTO usage_profile_daily (day, profile_id, attempts, successes, failures, tokens_in, tokens_out)
             SELECT hour - hour % 86400000, profile_id, sum(attempts), sum(successes), sum(failures),
                 sum(tokens_in), sum(tokens_out)
             FROM usage_hourly GROUP BY 1, 2;
         END IF;
         IF to_regclass('failure_windows') IS NOT NULL THEN
             INSERT INTO failure_windows (request_id, seq, profile_id, started_at, duration_ms, reason,
                 cooldown_until, next_success)
             SELECT w.request_id, w.seq, w.profile_id, w.started_at, w.duration_ms, w.reason, w.cooldown_until,
                 (SELECT min(s.started_at) FROM attempts s WHERE s.profile_id = w.profile_id
                  AND s.started_at > w.started_at AND s.started_at < w.cooldown_until AND s.outcome = 'success')
             FROM attempts w WHERE w.outcome = 'failure';
         END IF; END $$;",
        n = days * per_day,
    )))
    .execute(pool)
    .await
    .unwrap();
}

/// Every query of docs/audit.md, and every audit row, as text (each answer's rows sorted: a
/// query without `ORDER BY` may give them in another order from partitions).
async fn answers(pool: &PgPool) -> Vec<Vec<Vec<String>>> {
    let mut all = queries();
    all.push("SELECT * FROM requests ORDER BY id".into());
    all.push("SELECT * FROM attempts ORDER BY request_id, seq".into());
    all.push("SELECT * FROM usage_hourly ORDER BY hour, profile_id".into());
    let mut out = Vec::new();
    for sql in all {
        let rows = sqlx::raw_sql(sqlx::AssertSqlSafe(sql.clone())).fetch_all(pool).await.unwrap();
        let mut rows: Vec<Vec<String>> = rows.iter().map(render_pg).collect();
        rows.sort();
        out.push(rows);
    }
    out
}

async fn partitioned(pool: &PgPool) -> bool {
    sqlx::query_scalar("SELECT rota_audit_partitioned()").fetch_one(pool).await.unwrap()
}

#[tokio::test]
async fn rota_migrate_partitions_an_existing_trail_and_every_audit_query_answers_the_same() {
    let (url, pool) = unpartitioned().await;
    fill(&pool, 4, 500).await;
    // The server's migrations leave a trail with rows as it is.
    rota::store::open(&DatabaseTarget::Postgres(url.clone())).await.unwrap().close().await;
    assert!(!partitioned(&pool).await);
    let before = answers(&pool).await;
    assert!(before[before.len() - 2].len() > 2_000, "the trail has rows");

    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("rota.toml"), format!("[database]\nurl = \"{url}\"\n")).unwrap();
    let migrate = || {
        std::process::Command::new(env!("CARGO_BIN_EXE_rota"))
            .args(["--config", "rota.toml", "migrate"])
            .current_dir(dir.path())
            .env("ROTA_LOG", "warn")
            .output()
            .unwrap()
    };
    let out = migrate();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    let rows: i64 = sqlx::query_scalar(
        "SELECT (SELECT count(*) FROM requests) + (SELECT count(*) FROM attempts) + (SELECT count(*) FROM usage_hourly)",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert!(stdout.contains(&format!("partitioned by day now: {rows} row(s) copied")), "{stdout}");
    assert!(partitioned(&pool).await);
    let days: Vec<String> = sqlx::query_scalar(
        "SELECT c.relname::text FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
         WHERE i.inhparent = 'attempts'::regclass AND c.relname ~ '^attempts_p2026110' ORDER BY 1",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(days, ["attempts_p20261101", "attempts_p20261102", "attempts_p20261103", "attempts_p20261104"]);
    let empty: i64 = sqlx::query_scalar("SELECT count(*) FROM attempts_default").fetch_one(&pool).await.unwrap();
    assert_eq!(empty, 0, "every row in its day's partition");
    for (i, (after, before)) in answers(&pool).await.iter().zip(&before).enumerate() {
        assert!(after == before, "query {} of docs/audit.md (or the rows) answers otherwise after", i + 1);
    }

    let again = migrate();
    assert!(again.status.success());
    assert!(!String::from_utf8_lossy(&again.stdout).contains("partitioned"), "once is enough");
}

/// The same rows on two databases, partitioned and not: retention's day drop and its
/// row-by-row delete leave the same rows and the same daily roll-up. The times are printed
/// (`--nocapture`; `ROTA_RETENTION_REQUESTS` requests a day, 20,000 unless set) for
/// docs/audit.md's comparison, not asserted.
#[tokio::test]
async fn a_day_past_the_retention_drops_its_partitions_and_rolls_up_as_the_row_delete_does() {
    let per_day = std::env::var("ROTA_RETENTION_REQUESTS").ok().and_then(|n| n.parse().ok()).unwrap_or(20_000);
    let (rows_url, rows) = unpartitioned().await;
    fill(&rows, 2, per_day).await;
    let by_rows = rota::store::open(&DatabaseTarget::Postgres(rows_url)).await.unwrap();
    let days_url = support::postgres_database().await;
    let by_days = rota::store::open(&DatabaseTarget::Postgres(days_url.clone())).await.unwrap();
    let days = PgPool::connect(&days_url).await.unwrap();
    assert!(partitioned(&days).await, "a new database is partitioned from the start");
    fill(&days, 2, per_day).await;
    assert_eq!(
        by_days.audit_upkeep(DAY0).await.unwrap(),
        3 * 9,
        "the day before DAY0 to a week after it, three tables"
    );
    let waiting: i64 = sqlx::query_scalar("SELECT count(*) FROM attempts_default").fetch_one(&days).await.unwrap();
    assert_eq!(waiting, 0, "the rows waiting in the default partitions moved into their days'");

    let before = DAY0 + DAY; // the first day goes
    let t = Instant::now();
    let dropped = by_days.drop_audit_days(before).await.unwrap();
    let dropping = t.elapsed();
    assert_eq!(
        dropped,
        3 + 3,
        "the days before the first: none; the first day's three partitions, and the day before's"
    );
    let t = Instant::now();
    let mut deleted = 0;
    loop {
        let p = by_rows.prune_audit(before, 5_000).await.unwrap();
        deleted += p.attempts + p.requests;
        if !p.more {
            break;
        }
    }
    let deleting = t.elapsed();
    eprintln!(
        "one day of {per_day} requests and {deleted} rows: dropped in {dropping:?}, deleted row by row in {deleting:?}"
    );
    let after = |pool: PgPool| async move {
        let mut out = Vec::new();
        for sql in [
            "SELECT * FROM usage_daily ORDER BY day, agent, provider, model, profile_id",
            "SELECT count(*), min(started_at) FROM attempts",
            "SELECT count(*), min(started_at) FROM requests",
            "SELECT count(*), min(hour) FROM usage_hourly",
            "SELECT * FROM usage_profile_daily ORDER BY day, profile_id",
            "SELECT count(*), min(started_at), count(next_success), sum(next_success) FROM failure_windows",
        ] {
            let got = sqlx::raw_sql(sqlx::AssertSqlSafe(sql)).fetch_all(&pool).await.unwrap();
            out.push(got.iter().map(render_pg).collect::<Vec<_>>());
        }
        out
    };
    let (a, b) = (after(days).await, after(rows).await);
    assert_eq!(a, b, "the same roll-up and the same rows left");
    assert!(a[1][0][1].parse::<i64>().unwrap() >= DAY0 + DAY && !a[0].is_empty(), "{a:?}");
    assert!(a[4].len() == 4, "the second day's sums of the four profiles are left: {:?}", a[4]);
    let windows: Vec<i64> = a[5][0][..3].iter().map(|n| n.parse().unwrap()).collect();
    assert!(
        windows[0] > windows[2] && windows[2] > 0 && windows[1] >= DAY0 + DAY,
        "the second day's windows: {windows:?}"
    );
}
