//! The PostgreSQL store, for a fleet of instances sharing one state (docs/scale.md).

use super::StoreError;
use super::sql::{Backend, Texts};
use crate::engine::Millis;
use sqlx::Postgres;
use sqlx::migrate::Migrator;
use sqlx::postgres::{PgConnectOptions, PgListener, PgPool, PgPoolOptions, PgSslMode};
use std::str::FromStr;
use std::sync::{LazyLock, OnceLock};
use std::time::Duration;
use tokio::sync::watch;

static MIGRATOR: Migrator = sqlx::migrate!("./migrations/postgres");

/// PostgreSQL's `statement_timeout` unless the URL's `options` give one: a statement (or a lock
/// it waits for) that takes longer is cancelled by the server, so a stuck one frees its
/// connection. Generous: audit listings and roll-ups over large tables stay well under it.
const STATEMENT_TIMEOUT: &str = "30s";

/// A day, in milliseconds.
const DAY: Millis = 86_400_000;

/// The channel the change feed's trigger notifies (migrations/postgres).
const CHANNEL: &str = "rota_changes";

#[derive(Clone, Debug)]
pub struct PgStore {
    pool: PgPool,
    description: String,
    wake: std::sync::Arc<OnceLock<watch::Receiver<u64>>>,
}

/// The TLS mode when the URL names none: libpq's `prefer` (TLS when the server offers it, else
/// plaintext) only for a server on this machine (a loopback address, `localhost` or a socket);
/// for any other, `require`: credentials and traffic never cross a network in plaintext unless
/// the URL says `sslmode=disable` or `prefer` itself. `None` when the URL names a mode.
fn default_ssl_mode(url: &str) -> Option<PgSslMode> {
    let parsed = url::Url::parse(url).ok()?;
    if parsed.query_pairs().any(|(k, _)| k == "sslmode") {
        return None;
    }
    let socket = parsed.query_pairs().any(|(k, v)| k == "host" && v.starts_with('/'));
    let local = match parsed.host() {
        None => true,
        // A `postgres:` URL is not one of the schemes whose host the URL standard parses as an
        // address: it comes as a name.
        Some(url::Host::Domain(d)) => {
            let ip = d.trim_start_matches('[').trim_end_matches(']').parse::<std::net::IpAddr>();
            d.is_empty() || d.eq_ignore_ascii_case("localhost") || ip.is_ok_and(|ip| ip.is_loopback())
        }
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
    };
    Some(if local || socket { PgSslMode::Prefer } else { PgSslMode::Require })
}

impl PgStore {
    /// Connects and applies pending migrations (sqlx holds an advisory lock meanwhile, so
    /// instances that start together migrate once).
    pub async fn open(url: &str) -> Result<PgStore, StoreError> {
        let mut opts = PgConnectOptions::from_str(url)?.application_name("rota");
        if !opts.get_options().is_some_and(|o| o.contains("statement_timeout")) {
            opts = opts.options([("statement_timeout", STATEMENT_TIMEOUT)]);
        }
        if let Some(mode) = default_ssl_mode(url) {
            opts = opts.ssl_mode(mode);
        }
        let pool = PgPoolOptions::new()
            .max_connections(8)
            .acquire_timeout(super::TIMEOUT)
            .before_acquire(|conn, _| Box::pin(async move { Ok(super::sql::usable(conn)) }))
            .connect_with(opts)
            .await?;
        let (version, role): (i32, String) =
            sqlx::query_as("SELECT current_setting('server_version_num')::int, current_user::text")
                .fetch_one(&pool)
                .await?;
        check_version(version)?;
        MIGRATOR.run(&pool).await.map_err(|e| super::migration_failed(e, Some(&role)))?;
        Ok(PgStore { pool, description: crate::store::redacted_url(url), wake: Default::default() })
    }

    pub fn pool(&self) -> &PgPool {
        &self.pool
    }
}

/// PostgreSQL 11 is the oldest whose SQL rota's migrations use (`EXECUTE FUNCTION` triggers,
/// partitioned tables with their indexes); 15 is the version the tests run on.
fn check_version(num: i32) -> Result<(), StoreError> {
    let major = num / 10_000;
    match major {
        ..11 => Err(StoreError::Setup(format!(
            "PostgreSQL {major} is too old: rota needs 11 or later, and is tested on 15 (docs/deploy.md, \"PostgreSQL\")"
        ))),
        11..15 => {
            tracing::warn!(version = major, "PostgreSQL {major} is older than 15, the version rota is tested on");
            Ok(())
        }
        _ => Ok(()),
    }
}

async fn listen(pool: &PgPool, tx: &watch::Sender<u64>) -> Result<(), sqlx::Error> {
    let mut listener = PgListener::connect_with(pool).await?;
    listener.listen(CHANNEL).await?;
    loop {
        // `None`: the connection was lost (and is re-established by the next call); wake the
        // reader so that it catches up on what it may have missed.
        let _ = listener.try_recv().await?;
        tx.send_modify(|n| *n += 1);
        if tx.is_closed() {
            return Ok(());
        }
    }
}

/// The statements of PostgreSQL's own text: the audit's INSERTs take `$N` parameters,
/// `json_array_elements_text` turns the JSON array of ids bound as `$1` into rows (`load_many`)
/// and `json_to_recordset` a JSON array of objects (`write_stats`); the usage series' reads
/// answer rows, and the audit writer keeps `usage_profile_daily` (a trigger per row would lock
/// the days' rows out of their keys' order, which two servers' batches can deadlock on) and
/// `failure_windows`.
static TEXTS: LazyLock<Texts> = LazyLock::new(|| {
    Texts::new(
        true,
        "SELECT json_array_elements_text($1::json)",
        |cols| {
            let cols: Vec<String> = cols.iter().map(|(n, t)| format!("{n} {t}")).collect();
            format!("json_to_recordset($1::json) AS r({})", cols.join(", "))
        },
        None,
        true,
    )
});

impl Backend for PgStore {
    type Db = Postgres;
    /// The audit writer does not wait for it, but every server's stats writer does (the feed's
    /// counter): a server that writes 256 profiles a turn fell behind with 10,000 profiles at
    /// 4 servers (docs/scale.md, "Capacity on PostgreSQL"), while a whole batch of 4,096 is a
    /// few statements of some 50 ms.
    const STATS_BATCH: usize = 4096;

    fn pool(&self) -> &PgPool {
        &self.pool
    }

    async fn close(&self) {
        self.pool.close().await;
    }

    fn description(&self) -> &str {
        &self.description
    }

    fn migrator() -> &'static Migrator {
        &MIGRATOR
    }

    fn texts() -> &'static Texts {
        &TEXTS
    }

    /// A transaction that may change the shared state. It takes the change feed's counter row
    /// first, as every writer's trigger would at its first write: taking it up front orders
    /// the writers before any of them holds another row, so two never wait on each other
    /// (the deadlock of A holding a stats row and waiting for the counter while B holds the
    /// counter and waits for that row).
    async fn write_tx(&self) -> Result<sqlx::Transaction<'static, Postgres>, StoreError> {
        let mut tx = self.pool.begin().await?;
        sqlx::query("SELECT n FROM change_seq WHERE id = 1 FOR UPDATE").execute(&mut *tx).await?;
        Ok(tx)
    }

    /// Reads that see one committed state (PostgreSQL's default, read committed, gives each
    /// statement its own).
    async fn read_tx(&self) -> Result<sqlx::Transaction<'static, Postgres>, StoreError> {
        Ok(self.pool.begin_with("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY").await?)
    }

    /// Audit rows touch no shared state: instances append them concurrently.
    async fn audit_tx(&self) -> Result<sqlx::Transaction<'static, Postgres>, StoreError> {
        Ok(self.pool.begin().await?)
    }

    /// A broken PostgreSQL connection fails its next use and is replaced by the pool.
    fn write_error(&self, _: &StoreError) {}

    /// PostgreSQL keeps its own write-ahead log in check.
    async fn checkpoint_wal(&self, _truncate: bool) -> Result<bool, StoreError> {
        Ok(true)
    }

    fn wal_size(&self) -> Option<u64> {
        None
    }

    fn unwritable(&self) -> Option<String> {
        None
    }

    /// Instances and the two writers of one instance write side by side: the feed's counter
    /// row serializes only what must be.
    async fn turn(&self) -> Option<tokio::sync::OwnedMutexGuard<()>> {
        None
    }

    /// The database is elsewhere: its disk is its server's to watch.
    fn free_space(&self) -> Option<u64> {
        None
    }

    async fn copy_to(&self, _to: &std::path::Path) -> Result<(), StoreError> {
        Err(StoreError::Unsupported(
            "a PostgreSQL database is backed up with pg_dump (docs/operations.md, \"Backups\")".into(),
        ))
    }

    /// PostgreSQL checkpoints by itself.
    fn longest_hold(&self) -> Option<Duration> {
        None
    }

    /// Without the statement timeout, since moving a copied trail out of the default partitions
    /// takes as long as it is large; but waiting at most 2 s for a lock (a long query on a
    /// default partition holds the one an attach needs), so the audit writers never queue long
    /// behind it: the next upkeep tries again. When it made partitions, the default ones are
    /// vacuumed: rows moved out of them leave dead entries in their indices that every query
    /// not bounded in time reads until autovacuum comes (a request's attempts after a copy of 5
    /// million: 291 ms at p95, 10.9 ms vacuumed).
    async fn audit_upkeep(&self, now: Millis) -> Result<u64, StoreError> {
        let mut tx = self.pool.begin().await?;
        sqlx::query("SET LOCAL statement_timeout = 0").execute(&mut *tx).await?;
        sqlx::query("SET LOCAL lock_timeout = '2s'").execute(&mut *tx).await?;
        let made: i32 = sqlx::query_scalar("SELECT rota_audit_upkeep($1)").bind(now).fetch_one(&mut *tx).await?;
        tx.commit().await?;
        if made > 0 {
            let mut conn = self.pool.acquire().await?;
            sqlx::query("SET statement_timeout = 0").execute(&mut *conn).await?;
            let vacuum = sqlx::query("VACUUM (ANALYZE) requests_default, attempts_default, usage_hourly_default")
                .execute(&mut *conn)
                .await;
            sqlx::query("RESET statement_timeout").execute(&mut *conn).await?;
            vacuum?;
        }
        Ok(made as u64)
    }

    /// Each partition of a day that ended by `before`, in a transaction of its own that gives
    /// up after 2 s waiting for its lock (a long reader of the table), since the audit writers
    /// would queue behind the waiting drop; the next upkeep tries again.
    async fn drop_audit_days(&self, before: Millis) -> Result<u64, StoreError> {
        let parts: Vec<(String, String)> = sqlx::query_as(
            "SELECT p.relname::text, c.relname::text FROM pg_inherits i
             JOIN pg_class p ON p.oid = i.inhparent JOIN pg_class c ON c.oid = i.inhrelid
             WHERE p.relname IN ('requests', 'attempts', 'usage_hourly')
               AND p.relnamespace = to_regnamespace(current_schema()) AND c.relname ~ '_p[0-9]{8}$'
             ORDER BY c.relname",
        )
        .fetch_all(&self.pool)
        .await?;
        let mut dropped = 0;
        for (table, part) in parts {
            let Some(day) =
                part.rsplit_once("_p").and_then(|(_, d)| chrono::NaiveDate::parse_from_str(d, "%Y%m%d").ok())
            else {
                continue;
            };
            let start = day.and_hms_opt(0, 0, 0).expect("midnight").and_utc().timestamp_millis();
            if start + DAY > before {
                continue;
            }
            let mut tx = self.pool.begin().await?;
            sqlx::query("SET LOCAL lock_timeout = '2s'").execute(&mut *tx).await?;
            if table == "attempts" {
                sqlx::query("DELETE FROM failure_windows WHERE started_at >= $1 AND started_at < $2")
                    .bind(start)
                    .bind(start + DAY)
                    .execute(&mut *tx)
                    .await?;
                sqlx::query(sqlx::AssertSqlSafe(format!(
                    "INSERT INTO usage_daily (day, agent, provider, model, profile_id, attempts, successes, failures,
                         tokens_in, tokens_out)
                     SELECT $1, coalesce(agent, ''), provider, model, coalesce(profile_id, ''), count(*),
                         sum(CASE WHEN outcome = 'success' THEN 1 ELSE 0 END),
                         sum(CASE WHEN outcome = 'failure' THEN 1 ELSE 0 END),
                         coalesce(sum(tokens_in), 0), coalesce(sum(tokens_out), 0)
                     FROM \"{part}\" GROUP BY 2, 3, 4, 5
                     ON CONFLICT (day, agent, provider, model, profile_id) DO UPDATE SET
                         attempts = usage_daily.attempts + excluded.attempts,
                         successes = usage_daily.successes + excluded.successes,
                         failures = usage_daily.failures + excluded.failures,
                         tokens_in = usage_daily.tokens_in + excluded.tokens_in,
                         tokens_out = usage_daily.tokens_out + excluded.tokens_out"
                )))
                .bind(day.format("%Y-%m-%d").to_string())
                .execute(&mut *tx)
                .await?;
            }
            if table == "usage_hourly" {
                // The day's sums go with its hours.
                sqlx::query("DELETE FROM usage_profile_daily WHERE day = $1").bind(start).execute(&mut *tx).await?;
            }
            sqlx::query(sqlx::AssertSqlSafe(format!("DROP TABLE \"{part}\""))).execute(&mut *tx).await?;
            tx.commit().await?;
            dropped += 1;
        }
        Ok(dropped)
    }

    /// Without the statement timeout: the copy takes as long as the trail is large.
    async fn partition_audit(&self) -> Result<Option<u64>, StoreError> {
        let mut tx = self.pool.begin().await?;
        sqlx::query("SET LOCAL statement_timeout = 0").execute(&mut *tx).await?;
        let copied: i64 = sqlx::query_scalar("SELECT rota_partition_audit()").fetch_one(&mut *tx).await?;
        tx.commit().await?;
        Ok(u64::try_from(copied).ok())
    }

    /// A receiver bumped on every `NOTIFY rota_changes`, listened to by one task per store
    /// (started on first use). The listener reconnects by itself; a notification lost while it
    /// does is caught up by the feed's poll.
    fn wake_channel(&self) -> Option<watch::Receiver<u64>> {
        let rx = self.wake.get_or_init(|| {
            let (tx, rx) = watch::channel(0u64);
            let pool = self.pool.clone();
            tokio::spawn(async move {
                loop {
                    if let Err(e) = listen(&pool, &tx).await {
                        if tx.is_closed() || pool.is_closed() {
                            return;
                        }
                        tracing::warn!(error = %e, "listening to the change feed failed; retrying in 1 s");
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                }
            });
            rx
        });
        Some(rx.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plaintext_is_a_default_only_on_this_machine() {
        let mode = |url: &str| format!("{:?}", default_ssl_mode(url));
        assert_eq!(mode("postgres://rota@127.0.0.1:5432/rota"), "Some(Prefer)");
        assert_eq!(mode("postgres://rota@localhost/rota"), "Some(Prefer)");
        assert_eq!(mode("postgres://rota@[::1]/rota"), "Some(Prefer)");
        assert_eq!(mode("postgres:///rota?host=/var/run/postgresql"), "Some(Prefer)");
        assert_eq!(mode("postgres://rota@db.internal:5432/rota"), "Some(Require)");
        assert_eq!(mode("postgres://rota@10.1.2.3/rota"), "Some(Require)");
        assert_eq!(mode("postgres://rota@db.internal/rota?sslmode=disable"), "None", "said explicitly");
        assert_eq!(mode("postgres://rota@db.internal/rota?sslmode=verify-full"), "None");
    }

    #[test]
    fn a_server_older_than_11_is_refused_naming_its_version() {
        let err = check_version(100_023).unwrap_err().to_string();
        assert!(err.starts_with("PostgreSQL 10 is too old: rota needs 11 or later"), "{err}");
        assert!(check_version(110_000).is_ok() && check_version(150_013).is_ok() && check_version(170_002).is_ok());
    }
}
