//! The embedded SQLite store (WAL, busy timeout, migrations applied at open).

use super::sql::{
    AGENT_COLUMNS, Hourly, SELECTIVE, STATS_UPDATE, STATS_UPSERT, Shapes, agent_days, attempt_filters, corrupt,
    count_attempt, now, shaped, sql_store, stats_of, whole_hours,
};
use super::{
    AgentUsage, Applied, AttemptRecord, AuditQuery, FailureWindow, FeedEntry, LimitsPatch, Origin, ProfileUsage,
    Pruned, RequestRecord, SeriesRows, Snapshot, Store, StoreError, StoredProfile,
};
use crate::agents::{Agent, Limits};
use crate::engine::quota::{Quota, Window};
use crate::engine::{
    Change, Cooldown, CooldownPolicy, Disabled, Millis, ModelChange, ModelCooldown, ProfileId, Reason, UsageStats,
};
use crate::secrets::{Sealed, SecretField};
use async_trait::async_trait;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteConnection, SqliteJournalMode, SqlitePoolOptions, SqliteRow, SqliteSynchronous,
};
use sqlx::{Row, Sqlite, SqlitePool};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations/sqlite");

#[derive(Clone, Debug)]
pub struct SqliteStore {
    pool: SqlitePool,
    description: String,
    failures: Arc<Failures>,
}

/// When a write last failed for another reason than a lock (an I/O error, a read-only file):
/// connections opened before then are closed when next taken from the pool, and new ones
/// opened. A connection keeps what went wrong: one opened while the file was unwritable stays
/// read-only after the disk recovers, one whose commit failed may keep a transaction open.
#[derive(Debug)]
struct Failures {
    opened: std::time::Instant,
    /// Milliseconds after `opened`; 0: none.
    last: AtomicU64,
}

impl Failures {
    /// Whether a connection `age` old predates the last failure.
    fn outlived(&self, age: Duration) -> bool {
        let last = self.last.load(Ordering::Relaxed);
        last > 0 && self.opened.elapsed().saturating_sub(age) <= Duration::from_millis(last)
    }
}

/// Makes the database file readable by its owner only (it holds the audit log, emails and key
/// digests). SQLite creates the `-wal` and `-shm` files with the database file's mode; ones left
/// by an earlier run are set too.
fn owner_only(path: &Path) -> Result<(), StoreError> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        for suffix in ["", "-wal", "-shm"] {
            let mut file = path.as_os_str().to_owned();
            file.push(suffix);
            match std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(StoreError::Db(sqlx::Error::Io(e))),
                _ => {}
            }
        }
    }
    Ok(())
}

/// What the write-ahead log is cut back to when a writer starts it over.
const JOURNAL_SIZE_LIMIT: u64 = 64 << 20;

/// How long a statement waits for another connection's lock.
const BUSY_TIMEOUT: Duration = Duration::from_secs(10);

impl SqliteStore {
    /// Opens (creating if needed) the database file and applies pending migrations.
    pub async fn open(path: &Path) -> Result<SqliteStore, StoreError> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| StoreError::Db(sqlx::Error::Io(e)))?;
        }
        let opts = SqliteConnectOptions::new()
            .filename(path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(BUSY_TIMEOUT)
            .foreign_keys(true)
            .pragma("journal_size_limit", JOURNAL_SIZE_LIMIT.to_string())
            // Checkpoints run beside the writers (`rota serve`'s upkeep, and the last connection
            // of any process as it closes), never inside a writer's commit.
            .pragma("wal_autocheckpoint", "0");
        let failures = Arc::new(Failures { opened: std::time::Instant::now(), last: AtomicU64::new(0) });
        let seen = failures.clone();
        let pool = SqlitePoolOptions::new()
            .max_connections(4)
            .before_acquire(move |conn, meta| {
                let fresh = !seen.outlived(meta.age);
                Box::pin(async move { Ok(fresh && super::sql::usable(conn)) })
            })
            .connect_with(opts)
            .await?;
        owner_only(path)?;
        MIGRATOR.run(&pool).await?;
        Ok(SqliteStore { pool, description: path.display().to_string(), failures })
    }

    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    /// A write transaction that holds the write lock from its start (`BEGIN IMMEDIATE`): one
    /// that reads before it writes cannot fail on another connection's commit in between
    /// (SQLITE_BUSY_SNAPSHOT, which the busy timeout does not wait out), and the rows it reads
    /// are the ones it replaces.
    async fn write_tx(&self) -> Result<sqlx::Transaction<'static, Sqlite>, StoreError> {
        Ok(self.pool.begin_with("BEGIN IMMEDIATE").await?)
    }

    /// Reads that see one committed state: in WAL mode a read transaction keeps the snapshot
    /// its first read took.
    async fn read_tx(&self) -> Result<sqlx::Transaction<'static, Sqlite>, StoreError> {
        Ok(self.pool.begin().await?)
    }

    /// SQLite has one writer at a time whatever is written.
    async fn audit_tx(&self) -> Result<sqlx::Transaction<'static, Sqlite>, StoreError> {
        self.write_tx().await
    }

    /// A write failed: unless another connection's lock was all, every connection open now is
    /// replaced before its next use.
    fn write_error(&self, e: &StoreError) {
        if !e.is_busy() {
            let ms = self.failures.opened.elapsed().as_millis().max(1) as u64;
            self.failures.last.store(ms, Ordering::Relaxed);
        }
    }

    /// The feed is polled: SQLite cannot tell another process's commit.
    fn wake_channel(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        None
    }

    /// `truncate` false: `PRAGMA wal_checkpoint(PASSIVE)`, which copies the log into the
    /// database beside the writers (the next writer then starts the log over, cut back to
    /// `journal_size_limit`); whether every frame was copied. `truncate` true, for a log grown
    /// past its limit: `TRUNCATE`, which holds up writers while it runs, so it waits for a
    /// reader or writer 250 ms at most; whether the log is empty now.
    async fn checkpoint_wal(&self, truncate: bool) -> Result<bool, StoreError> {
        let mut conn = self.pool.acquire().await?;
        if !truncate {
            let (_, log, copied): (i64, i64, i64) =
                sqlx::query_as("PRAGMA wal_checkpoint(PASSIVE)").fetch_one(&mut *conn).await?;
            return Ok(log == copied);
        }
        sqlx::query("PRAGMA busy_timeout = 250").execute(&mut *conn).await?;
        let done = sqlx::query_scalar::<_, i64>("PRAGMA wal_checkpoint(TRUNCATE)").fetch_one(&mut *conn).await;
        sqlx::query(sqlx::AssertSqlSafe(format!("PRAGMA busy_timeout = {}", BUSY_TIMEOUT.as_millis())))
            .execute(&mut *conn)
            .await?;
        match done.map_err(StoreError::from) {
            Ok(busy) => Ok(busy == 0),
            Err(e) if e.is_busy() => Ok(false),
            Err(e) => Err(e),
        }
    }

    fn wal_size(&self) -> Option<u64> {
        std::fs::metadata(format!("{}-wal", self.description)).ok().map(|m| m.len())
    }
}

/// The audit's INSERTs, with `?` parameters: SQLite looks a numbered one up by walking the
/// statement's list of names, so binding a 64-row INSERT's 1,152 `$N` parameters took over half a
/// million instructions.
static ATTEMPTS: std::sync::LazyLock<Shapes> = std::sync::LazyLock::new(|| Shapes::attempts(false));
static REQUESTS: std::sync::LazyLock<Shapes> = std::sync::LazyLock::new(|| Shapes::requests(false));

/// The ids of a JSON array bound as `$1`, as rows (`load_many`).
static OF: std::sync::LazyLock<[String; 3]> = std::sync::LazyLock::new(|| stats_of("SELECT value FROM json_each($1)"));
static STATS_OF: std::sync::LazyLock<&str> = std::sync::LazyLock::new(|| &OF[0]);
static COOLDOWNS_OF: std::sync::LazyLock<&str> = std::sync::LazyLock::new(|| &OF[1]);
static QUOTAS_OF: std::sync::LazyLock<&str> = std::sync::LazyLock::new(|| &OF[2]);

sql_store!(SqliteStore, Sqlite, SqliteRow, SqliteConnection);
