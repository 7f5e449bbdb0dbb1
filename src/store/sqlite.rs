//! The embedded SQLite store (WAL, busy timeout, migrations applied at open).

use super::StoreError;
use super::sql::{Backend, Texts};
use sqlx::migrate::Migrator;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{Sqlite, SqlitePool};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::Duration;

static MIGRATOR: Migrator = sqlx::migrate!("./migrations/sqlite");

#[derive(Clone, Debug)]
pub struct SqliteStore {
    pool: SqlitePool,
    /// The one connection every write transaction of this process runs on (`write_tx`,
    /// `audit_tx`): SQLite has one writer at a time, and the writes' statements (with their
    /// triggers' programs) are prepared once, not once on each of the pool's connections.
    writer: SqlitePool,
    description: String,
    failures: Arc<Failures>,
    /// This process's writers take turns here (`Store::write_turn`), in order.
    turn: Arc<tokio::sync::Mutex<()>>,
    /// The longest a checkpoint held the turn (µs).
    hold: Arc<AtomicU64>,
    /// Why the files could not be written when last checked (the watchdog checks them every
    /// 250 ms): no write transaction begins meanwhile, since a commit writes the mapped `-shm`.
    unwritable: Arc<parking_lot::Mutex<Option<String>>>,
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

/// What the write-ahead log is cut back to when a writer starts it over. The checkpoints start
/// it over every `database.checkpoint_every` under load, so it holds about a second of writes
/// (about 10 MB at the saturated rate of this machine, docs/performance.md); what is kept is
/// reused rather than grown again.
const JOURNAL_SIZE_LIMIT: u64 = 16 << 20;

/// How long the checkpoint's restart of the log waits for a reader to leave it, holding the
/// writers' turn: a reader still in the log after that keeps it from starting over until the
/// next checkpoint, rather than holding the writers up.
const RESTART_WAIT: Duration = Duration::from_millis(10);

/// How long a statement waits for another connection's lock.
const BUSY_TIMEOUT: Duration = Duration::from_secs(10);

impl SqliteStore {
    /// Opens (creating if needed) the database file and applies pending migrations.
    pub async fn open(path: &Path) -> Result<SqliteStore, StoreError> {
        Self::open_with(path, true).await
    }

    /// `open`, leaving the files' modes as they are when `owner_only` is false (`rota doctor`
    /// reports them and changes nothing).
    pub async fn open_with(path: &Path, owner_only: bool) -> Result<SqliteStore, StoreError> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| StoreError::Db(sqlx::Error::Io(e)))?;
        }
        if let Some(why) = super::files::unwritable(path) {
            return Err(StoreError::Setup(why));
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
            .pragma("wal_autocheckpoint", "0")
            // 16 MB of pages per connection (SQLite's default 2 MB), taken as they are read: the
            // usage series over a day searches 6,500 failures' next success in an index of 5
            // million attempts, 50 ms from the file's pages against 24 ms kept here
            // (docs/performance.md, "Audit at scale").
            .pragma("cache_size", "-16384")
            // The rows a statement answers cross from the connection's thread to the task in
            // one channel: at sqlx's 50 the thread stops and is woken every 50 rows (the usage
            // series over a day reads 6,000 to 15,000; docs/performance.md, "Audit at scale").
            .row_buffer_size(1024);
        let failures = Arc::new(Failures { opened: std::time::Instant::now(), last: AtomicU64::new(0) });
        let seen = failures.clone();
        let pool_of = |connections: u32, wait: Duration| {
            let seen = seen.clone();
            SqlitePoolOptions::new().max_connections(connections).acquire_timeout(wait).before_acquire(
                move |conn, meta| {
                    let fresh = !seen.outlived(meta.age);
                    Box::pin(async move { Ok(fresh && super::sql::usable(conn)) })
                },
            )
        };
        let pool = pool_of(4, super::TIMEOUT).connect_with(opts.clone()).await?;
        if owner_only {
            super::files::owner_only(path)?;
        }
        MIGRATOR.run(&pool).await.map_err(|e| super::migration_failed(e, None))?;
        // A write waits for the writer's connection as long as it would for another
        // connection's lock.
        let writer = pool_of(1, BUSY_TIMEOUT).connect_with(opts).await?;
        Ok(SqliteStore {
            pool,
            writer,
            description: path.display().to_string(),
            failures,
            turn: Arc::new(tokio::sync::Mutex::new(())),
            hold: Arc::new(AtomicU64::new(0)),
            unwritable: Arc::default(),
        })
    }

    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }
}

/// The statements of SQLite's own text. The audit's INSERTs take `?` parameters: SQLite looks a
/// numbered one up by walking the statement's list of names, so binding a 64-row INSERT's 1,152
/// `$N` parameters took over half a million instructions. `json_each` turns the JSON array of
/// ids bound as `$1` into rows (`load_many`), and `jsonb_each` with `json_extract` a JSON array
/// of objects (`write_stats`, the roll-ups): `jsonb_each` hands each object on in SQLite's
/// binary form, where `json_each` wrote it out as text for every column read from it, which
/// `json_extract` parsed again (docs/performance.md, "Performance near the floor"). The
/// usage series' reads answer one JSON text (`json_group_array`), and triggers keep
/// `usage_profile_daily`.
static TEXTS: LazyLock<Texts> = LazyLock::new(|| {
    Texts::new(
        false,
        "SELECT value FROM json_each($1)",
        |cols| {
            let cols: Vec<String> = cols.iter().map(|(n, _)| format!("json_extract(value, '$.{n}') AS {n}")).collect();
            format!("(SELECT {} FROM jsonb_each($1)) AS r", cols.join(", "))
        },
        Some(|cols| format!("json_group_array(json_array({cols}))")),
        false,
    )
});

impl Backend for SqliteStore {
    type Db = Sqlite;
    /// About 20 ms of the database's time under load (a batch of 2,000 took 148 ms), so the
    /// audit writer's turn (SQLite has one writer) is never long in coming.
    const STATS_BATCH: usize = 256;

    fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    fn description(&self) -> &str {
        &self.description
    }

    async fn close(&self) {
        self.writer.close().await;
        self.pool.close().await;
    }

    fn migrator() -> &'static Migrator {
        &MIGRATOR
    }

    fn texts() -> &'static Texts {
        &TEXTS
    }

    /// A write transaction that holds the write lock from its start (`BEGIN IMMEDIATE`): one
    /// that reads before it writes cannot fail on another connection's commit in between
    /// (SQLITE_BUSY_SNAPSHOT, which the busy timeout does not wait out), and the rows it reads
    /// are the ones it replaces.
    async fn write_tx(&self) -> Result<sqlx::Transaction<'static, Sqlite>, StoreError> {
        if let Some(why) = self.unwritable.lock().clone() {
            return Err(StoreError::Setup(why));
        }
        Ok(self.writer.begin_with("BEGIN IMMEDIATE").await?)
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

    /// Copies the log into the database beside the writers (`PASSIVE`). When that copied every
    /// frame, the log is started over at once: `RESTART` (or with `truncate`, for a log grown
    /// past its limit, `TRUNCATE`, which also gives its space back), in this process's writers'
    /// turn, so it waits for no writer of its own and holds them up only while it copies the
    /// frames written during the `PASSIVE` (a few ms). Without the restart a log under constant
    /// writes never starts over: a `PASSIVE` never catches the writers with nothing left to copy,
    /// so the log grew by every write (670 MB a minute at saturation), and the `TRUNCATE` at its
    /// limit then held both writers up for over a second. Whether the log was started over.
    async fn checkpoint_wal(&self, truncate: bool) -> Result<bool, StoreError> {
        let (_, log, copied): (i64, i64, i64) =
            sqlx::query_as("PRAGMA wal_checkpoint(PASSIVE)").fetch_one(&self.pool).await?;
        if log != copied {
            return Ok(false); // a reader still needs frames the database does not have yet
        }
        if log <= 0 && !truncate {
            return Ok(true);
        }
        // The turn first, then a connection, as every writer takes them: a connection held
        // while waiting for the turn could be the one the turn's holder waits for.
        let turn = self.turn.lock().await;
        let taken = std::time::Instant::now();
        let done = self.restart_wal(truncate).await;
        drop(turn);
        let held = taken.elapsed();
        self.hold.fetch_max(held.as_micros() as u64, Ordering::Relaxed);
        if held > Duration::from_millis(50) {
            tracing::warn!(?held, "starting the write-ahead log over held the writers up");
        } else {
            tracing::debug!(?held, "the write-ahead log was started over");
        }
        match done {
            Ok(busy) => Ok(busy == 0),
            Err(e) if e.is_busy() => Ok(false),
            Err(e) => Err(e),
        }
    }

    fn longest_hold(&self) -> Option<Duration> {
        Some(Duration::from_micros(self.hold.load(Ordering::Relaxed)))
    }

    /// SQLite's audit trail is one table per kind: retention deletes its rows in batches.
    async fn audit_upkeep(&self, _now: crate::engine::Millis) -> Result<u64, StoreError> {
        Ok(0)
    }

    async fn drop_audit_days(&self, _before: crate::engine::Millis) -> Result<u64, StoreError> {
        Ok(0)
    }

    async fn partition_audit(&self) -> Result<Option<u64>, StoreError> {
        Ok(None)
    }

    async fn turn(&self) -> Option<tokio::sync::OwnedMutexGuard<()>> {
        Some(self.turn.clone().lock_owned().await)
    }

    /// `VACUUM INTO`: one read transaction's snapshot, written page by page to a new file
    /// (made empty and owner-only first), while the writers go on in the write-ahead log.
    async fn copy_to(&self, to: &Path) -> Result<(), StoreError> {
        let refused = |why: String| StoreError::Unsupported(format!("{}: {why}", to.display()));
        let target = to.to_str().ok_or_else(|| refused("not a UTF-8 path".into()))?;
        let mut file = std::fs::OpenOptions::new();
        file.write(true).create_new(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut file, 0o600);
        file.open(to).map_err(|e| refused(e.to_string()))?;
        if let Err(e) = sqlx::query("VACUUM INTO $1").bind(target).execute(&self.pool).await {
            let _ = std::fs::remove_file(to);
            return Err(e.into());
        }
        Ok(())
    }

    fn free_space(&self) -> Option<u64> {
        #[cfg(target_os = "linux")]
        {
            let dir = Path::new(&self.description).parent().filter(|d| !d.as_os_str().is_empty());
            let st = nix::sys::statvfs::statvfs(dir.unwrap_or(Path::new("."))).ok()?;
            Some(st.blocks_available() as u64 * st.fragment_size() as u64)
        }
        #[cfg(not(target_os = "linux"))]
        None
    }

    fn unwritable(&self) -> Option<String> {
        let found = super::files::unwritable(Path::new(&self.description));
        self.unwritable.lock().clone_from(&found);
        found
    }

    fn wal_size(&self) -> Option<u64> {
        std::fs::metadata(format!("{}-wal", self.description)).ok().map(|m| m.len())
    }
}

impl SqliteStore {
    /// `RESTART` (or `TRUNCATE`) on a connection of its own, waiting `RESTART_WAIT` at most for
    /// readers; the checkpoint's outcome (busy: 0 when the log was started over).
    async fn restart_wal(&self, truncate: bool) -> Result<i64, StoreError> {
        let mut conn = self.pool.acquire().await?;
        sqlx::query(sqlx::AssertSqlSafe(format!("PRAGMA busy_timeout = {}", RESTART_WAIT.as_millis())))
            .execute(&mut *conn)
            .await?;
        let sql = if truncate { "PRAGMA wal_checkpoint(TRUNCATE)" } else { "PRAGMA wal_checkpoint(RESTART)" };
        let done = sqlx::query_scalar::<_, i64>(sql).fetch_one(&mut *conn).await;
        sqlx::query(sqlx::AssertSqlSafe(format!("PRAGMA busy_timeout = {}", BUSY_TIMEOUT.as_millis())))
            .execute(&mut *conn)
            .await?;
        Ok(done?)
    }
}
