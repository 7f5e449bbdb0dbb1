//! The SQL both stores run. SQLite and PostgreSQL read the same statements (numbered `$N`
//! parameters, `coalesce`, `IS DISTINCT FROM`, `CASE` sums cast to `BIGINT`), so one text keeps
//! the two from drifting apart; what differs (opening, the write lock, the change feed's wake-up)
//! is a `Backend`, in `sqlite.rs` and `postgres.rs`, and `Store` is implemented once for both.
//!
//! The text is ordinary functions generic over the sqlx driver, one file per area, rather than
//! a macro instantiated for each driver: rustfmt formats them and the compiler checks them as
//! written, where a macro's body is neither formatted nor type-checked until it is expanded.
//! Their price is the `where` clause on each area's `impl` block that names what the SQL needs
//! of a driver: Rust does not carry bounds on other types than `Self` over from a trait.

mod actions;
mod agents;
mod alerts;
mod audit;
mod feed;
mod listings;
mod oauth;
mod profiles;
mod secrets;
mod sessions;
mod stats;

use super::{
    AdminAction, AgentUsage, AlertDelivery, AlertNext, AlertRecord, Applied, AttemptRecord, AuditQuery, FailureWindow,
    FeedEntry, LimitsPatch, NewAlert, OutboxAlert, ProfileFlag, ProfileUsage, Pruned, RequestRecord, SeriesRows,
    SessionBinding, Snapshot, Store, StoreError, StoredProfile,
};
use crate::agents::{Agent, Limits};
use crate::engine::{Change, CooldownPolicy, Millis, ModelChange, ModelCooldown, ProfileId, UsageStats};
use crate::secrets::Sealed;
use async_trait::async_trait;
use sqlx::database::HasStatementCache;
use sqlx::migrate::Migrator;
use sqlx::postgres::PgQueryResult;
use sqlx::sqlite::SqliteQueryResult;
use sqlx::{ColumnIndex, Database, Decode, Encode, Executor, IntoArguments, Pool, Postgres, Sqlite, Transaction, Type};
use std::collections::{BTreeMap, HashMap};
use std::time::Duration;
use tokio::sync::{OwnedMutexGuard, watch};

use audit::Shapes;

/// An hour, in milliseconds.
const HOUR: Millis = 3_600_000;
/// A minute, in milliseconds.
const MINUTE: Millis = 60_000;
/// A day, in milliseconds.
const DAY: Millis = 86_400_000;

pub(super) fn now() -> Millis {
    chrono::Utc::now().timestamp_millis()
}

pub(super) fn corrupt(table: &'static str, detail: impl ToString) -> StoreError {
    StoreError::Corrupt { table, detail: detail.to_string() }
}

/// Whether a pooled connection may be handed out: one left inside a transaction (its commit
/// failed on an I/O error, and so did the rollback) would refuse every later `BEGIN` and keep
/// the write lock, so it is closed and a fresh connection opened instead.
pub(super) fn usable<C: sqlx::Connection>(conn: &C) -> bool {
    let ok = !conn.is_in_transaction();
    if !ok {
        tracing::warn!("a database connection was left inside a failed transaction; reconnecting");
    }
    ok
}

/// What the SQL needs of an sqlx driver (SQLite's, PostgreSQL's) besides the types it binds and
/// reads, which the `where` clauses name.
pub(super) trait Driver:
    Database<QueryResult: Affected, Arguments: IntoArguments<Self>> + HasStatementCache
{
}

impl Driver for Sqlite {}

impl Driver for Postgres {}

/// How many rows a statement changed, which each driver's result tells in a method of its own.
pub(super) trait Affected {
    fn rows_affected(&self) -> u64;
}

impl Affected for SqliteQueryResult {
    fn rows_affected(&self) -> u64 {
        SqliteQueryResult::rows_affected(self)
    }
}

impl Affected for PgQueryResult {
    fn rows_affected(&self) -> u64 {
        PgQueryResult::rows_affected(self)
    }
}

/// A Rust type the SQL binds and reads as a column of driver `DB`.
pub(super) trait Value<DB: Database>: Type<DB> + for<'q> Encode<'q, DB> + for<'r> Decode<'r, DB> {}

impl<DB: Database, T> Value<DB> for T where T: Type<DB> + for<'q> Encode<'q, DB> + for<'r> Decode<'r, DB> {}

/// The statements whose text differs between the engines, built once for each.
pub(super) struct Texts {
    /// The audit's INSERTs (`insert_audit`).
    attempts: Shapes,
    requests: Shapes,
    /// The stats, cooldown windows and quotas of the profiles in a JSON array bound as `$1`
    /// (`load_many`).
    stats_of: [String; 3],
    /// The batch writes of stats rows, cooldown windows and quotas (`write_stats`).
    writes: stats::Writes,
    /// Adds an audit batch's sums to `usage_hourly` (`add_usage`).
    add_hours: String,
    /// Adds them to `usage_profile_daily` (`add_to_profile_days`): on PostgreSQL; SQLite's
    /// triggers on `usage_hourly` keep it (migration 0026).
    add_profile_days: Option<String>,
    /// Keeps `failure_windows` (`keep_windows`): on PostgreSQL, where the usage series'
    /// timeline reads it; SQLite's reads search `attempts` for each failure's next success.
    windows: Option<audit::WindowTexts>,
    /// Adds an audit batch's counts to `audit_minutely` and `audit_hourly` (`add_to_minutes`,
    /// `add_to_audit_hours`).
    add_minutes: String,
    add_audit_hours: String,
    /// The usage series' reads (`usage_series`, `failure_windows`), each answering its rows as
    /// one JSON array of arrays.
    series: listings::SeriesTexts,
    /// Every profile's `usage_stats` row (`snapshot`), and where `json_rows` is given, the same
    /// as one JSON text: sqlx copies each value of a row out of SQLite and frees it, and a
    /// start-up with 2,000 profiles read 28,000 of them here (docs/performance.md, "What
    /// profiling changed").
    all_stats: String,
    all_stats_json: Option<String>,
}

impl Texts {
    /// `numbered`: the audit's INSERTs take `$N` parameters, else `?`; `ids`: the SQL that turns
    /// the JSON array of ids in `$1` into rows; `rows`: the SQL (a `FROM` item named `r`) that
    /// turns the JSON array of objects in `$1` into rows of the given columns and types;
    /// `json_rows`: the aggregate that makes a text of one JSON array of the given columns' rows,
    /// for the usage series' reads (none: they read rows); `writer_keeps`: whether the audit
    /// writer keeps `usage_profile_daily` and `failure_windows` itself.
    pub(super) fn new(
        numbered: bool,
        ids: &str,
        rows: impl Fn(&[(&str, &str)]) -> String,
        json_rows: Option<fn(&str) -> String>,
        writer_keeps: bool,
    ) -> Texts {
        Texts {
            attempts: Shapes::attempts(numbered),
            requests: Shapes::requests(numbered),
            stats_of: stats::statements(ids),
            writes: stats::Writes::new(&rows, ids),
            add_hours: audit::add_usage(&rows, "usage_hourly", "hour"),
            add_profile_days: writer_keeps.then(|| audit::add_usage(&rows, "usage_profile_daily", "day")),
            windows: writer_keeps.then(|| audit::WindowTexts::new(ids, &rows)),
            add_minutes: audit::add_counts(&rows, "audit_minutely", "minute"),
            add_audit_hours: audit::add_counts(&rows, "audit_hourly", "hour"),
            series: listings::SeriesTexts::new(json_rows, writer_keeps),
            all_stats: format!("SELECT {} FROM usage_stats", stats::STATS_COLUMNS),
            all_stats_json: json_rows.map(|json| format!("SELECT {} FROM usage_stats", json(stats::STATS_COLUMNS))),
        }
    }
}

/// A store on one engine: its pool, how it begins transactions, the texts that differ, and the
/// upkeep only some engines have (the `Store` methods of the same meaning say what each does).
pub(super) trait Backend: Send + Sync + Sized {
    type Db: Driver;
    /// The most profiles one write of the stats writer takes (`Store::stats_batch`).
    const STATS_BATCH: usize;

    fn pool(&self) -> &Pool<Self::Db>;
    /// Closes every connection.
    fn close(&self) -> impl Future<Output = ()> + Send;
    /// The database, as an operator names it.
    fn description(&self) -> &str;
    /// This build's migrations for the engine.
    fn migrator() -> &'static Migrator;
    fn texts() -> &'static Texts;
    /// A transaction that may change the shared state, serialized with every other such writer.
    fn write_tx(&self) -> impl Future<Output = Result<Transaction<'static, Self::Db>, StoreError>> + Send;
    /// A transaction that only appends audit rows.
    fn audit_tx(&self) -> impl Future<Output = Result<Transaction<'static, Self::Db>, StoreError>> + Send;
    /// Reads that must see one committed state, not a write landing between two of them.
    fn read_tx(&self) -> impl Future<Output = Result<Transaction<'static, Self::Db>, StoreError>> + Send;
    fn write_error(&self, e: &StoreError);
    fn wake_channel(&self) -> Option<watch::Receiver<u64>>;
    fn checkpoint_wal(&self, truncate: bool) -> impl Future<Output = Result<bool, StoreError>> + Send;
    fn wal_size(&self) -> Option<u64>;
    /// `Store::files_problem`.
    fn unwritable(&self) -> Option<String>;
    /// `Store::backup`.
    fn copy_to(&self, to: &std::path::Path) -> impl Future<Output = Result<(), StoreError>> + Send;
    fn turn(&self) -> impl Future<Output = Option<OwnedMutexGuard<()>>> + Send;
    fn free_space(&self) -> Option<u64>;
    fn longest_hold(&self) -> Option<Duration>;
    /// The audit trail's day partitions, where the engine has them (docs/audit.md, "Partitions
    /// on PostgreSQL"): made from yesterday to a week ahead of `now`, and for the days of rows
    /// waiting in a default partition; how many were made.
    fn audit_upkeep(&self, now: Millis) -> impl Future<Output = Result<u64, StoreError>> + Send;
    /// Drops the audit trail's whole days before `before`, each day's attempts rolled up into
    /// `usage_daily` first; how many partitions went.
    fn drop_audit_days(&self, before: Millis) -> impl Future<Output = Result<u64, StoreError>> + Send;
    /// Partitions an audit trail that is not; the rows it copied, `None` when there was nothing
    /// to do.
    fn partition_audit(&self) -> impl Future<Output = Result<Option<u64>, StoreError>> + Send;

    fn sql(&self) -> Sql<'_, Self> {
        Sql { store: self }
    }
}

/// The SQL run on `store`: its methods are in this module's files, one per area, each `impl`
/// block under the bounds of `impl Store` below.
pub(super) struct Sql<'a, S> {
    store: &'a S,
}

#[async_trait]
impl<S, DB> Store for S
where
    S: Backend<Db = DB>,
    DB: Driver,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    for<'n> &'n str: ColumnIndex<DB::Row> + Encode<'n, DB> + Type<DB>,
    for<'n> Option<&'n str>: Encode<'n, DB>,
    usize: ColumnIndex<DB::Row>,
    bool: Value<DB>,
    i64: Value<DB>,
    f64: Value<DB>,
    String: Value<DB>,
    Vec<u8>: Value<DB>,
    Option<i64>: Value<DB>,
    Option<f64>: Value<DB>,
    Option<String>: Value<DB>,
{
    fn describe(&self) -> String {
        self.description().to_string()
    }

    fn known_migrations(&self) -> usize {
        S::migrator().iter().count()
    }

    async fn applied_migrations(&self) -> Result<i64, StoreError> {
        Ok(sqlx::query_scalar("SELECT COUNT(*) FROM _sqlx_migrations WHERE success").fetch_one(self.pool()).await?)
    }

    async fn close(&self) {
        Backend::close(self).await;
    }

    fn wake(&self) -> Option<watch::Receiver<u64>> {
        self.wake_channel()
    }

    async fn claim_refresh(
        &self,
        id: &ProfileId,
        holder: &str,
        now: Millis,
        until: Millis,
    ) -> Result<bool, StoreError> {
        self.sql().claim_refresh(id, holder, now, until).await
    }

    async fn release_refresh(&self, id: &ProfileId, holder: &str) -> Result<(), StoreError> {
        self.sql().release_refresh(id, holder).await
    }

    async fn snapshot(&self) -> Result<Snapshot, StoreError> {
        self.sql().snapshot().await
    }

    async fn secret_key_ids(&self) -> Result<Vec<String>, StoreError> {
        self.sql().secret_key_ids().await
    }

    async fn add_profile(&self, p: &StoredProfile, secrets: &[Sealed]) -> Result<(), StoreError> {
        self.sql().add_profile(p, secrets).await
    }

    async fn sync_config_profiles(&self, profiles: &[StoredProfile]) -> Result<(), StoreError> {
        self.sql().sync_config_profiles(profiles).await
    }

    async fn remove_profile(&self, id: &ProfileId) -> Result<(), StoreError> {
        self.sql().remove_profile(id).await
    }

    async fn set_flag(&self, id: &ProfileId, flag: ProfileFlag, on: bool) -> Result<(), StoreError> {
        self.sql().set_flag(id, flag, on).await
    }

    #[tracing::instrument(skip_all, level = "debug", fields(profiles = batch.len()))]
    async fn save_stats(&self, batch: &[(ProfileId, UsageStats)]) -> Result<(), StoreError> {
        self.sql().save_stats(batch).await
    }

    async fn save_model_cooldowns(&self, batch: &[((String, String), ModelCooldown)]) -> Result<(), StoreError> {
        self.sql().save_model_cooldowns(batch).await
    }

    #[tracing::instrument(skip_all, level = "debug", fields(profiles = stats.len(), models = models.len()))]
    async fn apply(
        &self,
        stats: &[(ProfileId, Vec<Change>)],
        models: &[((String, String), Vec<ModelChange>)],
        sessions: &[SessionBinding],
        policy: &CooldownPolicy,
    ) -> Result<Applied, StoreError> {
        self.sql().apply(stats, models, sessions, policy).await
    }

    async fn session_bindings(&self, session: &str, since: Millis) -> Result<Vec<SessionBinding>, StoreError> {
        self.sql().session_bindings(session, since).await
    }

    async fn audit_upkeep(&self, now: Millis) -> Result<u64, StoreError> {
        Backend::audit_upkeep(self, now).await
    }

    async fn drop_audit_days(&self, before: Millis) -> Result<u64, StoreError> {
        Backend::drop_audit_days(self, before).await
    }

    async fn partition_audit(&self) -> Result<Option<u64>, StoreError> {
        Backend::partition_audit(self).await
    }

    async fn prune_sessions(&self, idle_before: Millis, keep: usize, batch: usize) -> Result<u64, StoreError> {
        self.sql().prune_sessions(idle_before, keep, batch).await
    }

    async fn changes_after(&self, seq: i64) -> Result<Vec<FeedEntry>, StoreError> {
        self.sql().changes_after(seq).await
    }

    async fn feed_head(&self, kind: Option<&str>) -> Result<i64, StoreError> {
        self.sql().feed_head(kind).await
    }

    async fn stats_of(&self, ids: &[ProfileId]) -> Result<(i64, Vec<(ProfileId, Option<UsageStats>)>), StoreError> {
        self.sql().stats_of(ids).await
    }

    async fn model_cooldowns(&self) -> Result<(i64, HashMap<(String, String), ModelCooldown>), StoreError> {
        self.sql().model_cooldowns().await
    }

    async fn set_order(&self, provider: &str, ids: Option<&[ProfileId]>) -> Result<(), StoreError> {
        self.sql().set_order(provider, ids).await
    }

    async fn create_agent(
        &self,
        name: &str,
        key_digest: &str,
        admin: bool,
        allowed: (&Limits, Option<&[String]>),
        now: Millis,
    ) -> Result<Agent, StoreError> {
        self.sql().create_agent(name, key_digest, admin, allowed, now).await
    }

    async fn set_agent_limits(&self, name: &str, patch: &LimitsPatch) -> Result<Agent, StoreError> {
        self.sql().set_agent_limits(name, patch).await
    }

    async fn record_action(&self, action: &AdminAction) -> Result<(), StoreError> {
        self.sql().record_action(action).await
    }

    async fn admin_actions(&self, limit: i64) -> Result<Vec<AdminAction>, StoreError> {
        self.sql().admin_actions(limit).await
    }

    async fn raise_alert(&self, alert: &NewAlert, gate_after: Millis) -> Result<bool, StoreError> {
        self.sql().raise_alert(alert, gate_after).await
    }

    async fn claim_alerts(
        &self,
        instance: &str,
        now: Millis,
        until: Millis,
        limit: i64,
    ) -> Result<Vec<OutboxAlert>, StoreError> {
        self.sql().claim_alerts(instance, now, until, limit).await
    }

    async fn recent_alerts(&self, limit: i64) -> Result<Vec<AlertRecord>, StoreError> {
        self.sql().recent_alerts(limit).await
    }

    async fn alert_attempted(&self, delivery: &AlertDelivery, next: AlertNext) -> Result<(), StoreError> {
        self.sql().alert_attempted(delivery, next).await
    }

    async fn prune_alerts(&self, before: Millis, gates_before: Millis) -> Result<u64, StoreError> {
        self.sql().prune_alerts(before, gates_before).await
    }

    async fn claim_requests(
        &self,
        agent: &str,
        minute: Millis,
        slots: i64,
        limit: i64,
    ) -> Result<Option<i64>, StoreError> {
        self.sql().claim_requests(agent, minute, slots, limit).await
    }

    async fn agent_usage(
        &self,
        agent: Option<&str>,
        minute: Millis,
        day: Millis,
    ) -> Result<HashMap<String, AgentUsage>, StoreError> {
        self.sql().agent_usage(agent, minute, day).await
    }

    async fn prune_agent_usage(&self, minutes_before: Millis, days_before: Option<Millis>) -> Result<u64, StoreError> {
        self.sql().prune_agent_usage(minutes_before, days_before).await
    }

    async fn agents(&self) -> Result<Vec<Agent>, StoreError> {
        self.sql().agents().await
    }

    async fn active_agents(&self) -> Result<Vec<(String, Agent)>, StoreError> {
        self.sql().active_agents().await
    }

    async fn revoke_agent(&self, name: &str, now: Millis) -> Result<(), StoreError> {
        self.sql().revoke_agent(name, now).await
    }

    async fn import(
        &self,
        profiles: &[(StoredProfile, Vec<Sealed>, UsageStats)],
        orders: &BTreeMap<String, Vec<ProfileId>>,
    ) -> Result<(), StoreError> {
        self.sql().import(profiles, orders).await
    }

    async fn login_profile(&self, provider: &str, subject: &str) -> Result<Option<ProfileId>, StoreError> {
        self.sql().login_profile(provider, subject).await
    }

    async fn save_login(&self, p: &StoredProfile, secrets: &[Sealed]) -> Result<bool, StoreError> {
        self.sql().save_login(p, secrets).await
    }

    async fn swap_tokens(
        &self,
        id: &ProfileId,
        expected: Option<&[u8]>,
        secrets: &[Sealed],
        expires_at: Option<Millis>,
    ) -> Result<bool, StoreError> {
        self.sql().swap_tokens(id, expected, secrets, expires_at).await
    }

    async fn reseal_all(&self, rows: &[(ProfileId, Sealed)]) -> Result<(), StoreError> {
        self.sql().reseal_all(rows).await
    }

    async fn profile_secrets(&self, id: &ProfileId) -> Result<(Vec<Sealed>, Option<Millis>), StoreError> {
        self.sql().profile_secrets(id).await
    }

    async fn attempts(&self, q: &AuditQuery) -> Result<Vec<AttemptRecord>, StoreError> {
        self.sql().attempts(q).await
    }

    async fn requests(&self, q: &AuditQuery) -> Result<Vec<RequestRecord>, StoreError> {
        self.sql().requests(q).await
    }

    async fn usage(&self, since: Millis, until: Millis) -> Result<Vec<ProfileUsage>, StoreError> {
        self.sql().usage(since, until).await
    }

    async fn usage_series(&self, since: Millis, until: Millis, step: Millis) -> Result<SeriesRows, StoreError> {
        self.sql().usage_series(since, until, step).await
    }

    async fn failure_windows(
        &self,
        far_near: (Millis, Millis),
        since: Millis,
        until: Millis,
    ) -> Result<Vec<FailureWindow>, StoreError> {
        self.sql().failure_windows(far_near, since, until).await
    }

    #[tracing::instrument(skip_all, level = "debug", fields(requests = requests.len(), attempts = attempts.len()))]
    async fn insert_audit(&self, requests: &[RequestRecord], attempts: &[AttemptRecord]) -> Result<(), StoreError> {
        self.sql().insert_audit(requests, attempts).await
    }

    async fn prune_audit(&self, before: Millis, batch: usize) -> Result<Pruned, StoreError> {
        self.sql().prune_audit(before, batch).await
    }

    async fn ping(&self) -> Result<(), StoreError> {
        let mut conn = self.pool().acquire().await?;
        sqlx::query("SELECT 1").execute(&mut *conn).await?;
        Ok(())
    }

    async fn newest_audit(&self) -> Result<Option<Millis>, StoreError> {
        self.sql().newest_audit().await
    }

    async fn checkpoint(&self, truncate: bool) -> Result<bool, StoreError> {
        self.checkpoint_wal(truncate).await
    }

    fn wal_bytes(&self) -> Option<u64> {
        self.wal_size()
    }

    fn files_problem(&self) -> Option<String> {
        self.unwritable()
    }

    async fn backup(&self, to: &std::path::Path) -> Result<(), StoreError> {
        self.copy_to(to).await
    }

    fn write_failed(&self, e: &StoreError) {
        self.write_error(e)
    }

    async fn write_turn(&self) -> Option<OwnedMutexGuard<()>> {
        self.turn().await
    }

    fn free_bytes(&self) -> Option<u64> {
        self.free_space()
    }

    fn stats_batch(&self) -> usize {
        S::STATS_BATCH
    }

    fn checkpoint_hold(&self) -> Option<Duration> {
        self.longest_hold()
    }

    async fn all_agents(&self) -> Result<Vec<(String, Agent)>, StoreError> {
        self.sql().all_agents().await
    }

    async fn copy_agents(&self, agents: &[(String, Agent)]) -> Result<(), StoreError> {
        self.sql().copy_agents(agents).await
    }
}
