//! Persistence behind one seam: the embedded SQLite store and the PostgreSQL store run the same
//! SQL (`sql/`) on the same schema (`migrations/sqlite`, `migrations/postgres`).

mod copy;
mod error;
pub mod files;
mod postgres;
mod records;
mod sql;
mod sqlite;
mod target;

pub use copy::{Copied, CopyError, copy};
pub use error::StoreError;
pub(crate) use error::migration_failed;
pub use postgres::PgStore;
pub use records::{AttemptRecord, AttemptRow, Kind, Outcome, RequestRecord, RequestRow};
pub use sqlite::SqliteStore;
pub use target::{DatabaseTarget, key_anchor, redacted_url};

use std::sync::Arc;

/// Resolves when `wake` (from `Store::wake`) says another writer changed something; never
/// when there is no such signal.
pub async fn woken(wake: &mut Option<tokio::sync::watch::Receiver<u64>>) {
    match wake {
        Some(rx) => {
            if rx.changed().await.is_err() {
                *wake = None;
            }
        }
        None => std::future::pending().await,
    }
}

/// Opens the configured database (creating an SQLite file if needed) and applies pending
/// migrations.
pub async fn open(target: &DatabaseTarget) -> Result<Arc<dyn Store>, StoreError> {
    Ok(match target {
        DatabaseTarget::Sqlite(path) => Arc::new(SqliteStore::open(path).await?),
        DatabaseTarget::Postgres(url) => Arc::new(PgStore::open(url).await?),
    })
}

/// `open`, for a report: an SQLite file's mode is left as it is (`files::too_open` tells it).
pub async fn open_as_is(target: &DatabaseTarget) -> Result<Arc<dyn Store>, StoreError> {
    Ok(match target {
        DatabaseTarget::Sqlite(path) => Arc::new(SqliteStore::open_with(path, false).await?),
        DatabaseTarget::Postgres(url) => Arc::new(PgStore::open(url).await?),
    })
}

use crate::agents::{Agent, Limits};
use crate::engine::{Change, CooldownPolicy, Millis, ModelChange, ModelCooldown, ProfileId, ProfileType, UsageStats};
use crate::secrets::Sealed;
use async_trait::async_trait;
use std::collections::{BTreeMap, HashMap};

/// Where a profile was defined.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    /// Added through the CLI, API, web page or a login; its secret is sealed in the database.
    Stored,
    /// Declared in the config file; its secret comes from the environment.
    Config,
}

impl Origin {
    pub fn as_str(self) -> &'static str {
        match self {
            Origin::Stored => "stored",
            Origin::Config => "config",
        }
    }
}

/// A profile's switches an admin sets (docs/schema.md, `profiles`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProfileFlag {
    /// Rotation may use it.
    Enabled,
    /// Each call costs money.
    Paid,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredProfile {
    pub id: ProfileId,
    pub kind: ProfileType,
    pub origin: Origin,
    pub enabled: bool,
    /// Marked as costing money per call (`profiles.paid`): serving a request raises the `paid` alert.
    pub paid: bool,
    pub email: Option<String>,
    pub expires_at: Option<Millis>,
    pub created_at: Millis,
    /// An OAuth profile's account: `<issuer> <sub>` (`oauth::Account::subject`), what a login
    /// is matched by. `None` for other profiles and for logins without an OpenID subject.
    pub oauth_subject: Option<String>,
}

impl StoredProfile {
    /// A profile added through the CLI, API or an import: enabled, its secret sealed in the database.
    pub fn stored(id: ProfileId, kind: ProfileType, expires_at: Option<Millis>, created_at: Millis) -> StoredProfile {
        StoredProfile {
            id,
            kind,
            origin: Origin::Stored,
            enabled: true,
            paid: false,
            email: None,
            expires_at,
            created_at,
            oauth_subject: None,
        }
    }
}

/// Everything the gateway keeps in memory, as stored.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    /// The change feed's position the snapshot is as of.
    pub head: i64,
    pub profiles: Vec<StoredProfile>,
    pub secrets: HashMap<ProfileId, Vec<Sealed>>,
    pub stats: HashMap<ProfileId, UsageStats>,
    pub orders: BTreeMap<String, Vec<ProfileId>>,
    pub model_cooldowns: HashMap<(String, String), ModelCooldown>,
}

/// What `Store::apply` wrote: the rows as they now are, and the change feed's head before and
/// after the transaction (the entries in between are this write's own).
#[derive(Clone, Debug, Default)]
pub struct Applied {
    pub stats: Vec<(ProfileId, UsageStats)>,
    pub models: Vec<((String, String), ModelCooldown)>,
    pub feed: (i64, i64),
}

/// A change made through the admin API or the console (docs/operations.md, "Admin actions").
#[derive(Clone, Debug, PartialEq)]
pub struct AdminAction {
    pub at: Millis,
    /// The agent's name, the person's verified subject (`issuer sub`) or the CLI's OS user.
    pub actor: String,
    /// A person's verified email.
    pub actor_email: Option<String>,
    /// `agent`, `person` or `cli`.
    pub actor_kind: String,
    /// `viewer`, `operator` or `admin`.
    pub role: String,
    /// What was done: `profile.enable`, `agent.create`, …
    pub action: String,
    pub target: Option<String>,
    /// The value before (`None`: it did not exist) and after (`None`: it no longer exists).
    pub before: Option<serde_json::Value>,
    pub after: Option<serde_json::Value>,
}

/// An alert raised, for the outbox (docs/operations.md, "Alerts").
#[derive(Clone, Debug, PartialEq)]
pub struct NewAlert {
    pub id: String,
    pub rule: String,
    pub kind: String,
    pub subject: String,
    /// The bytes to post.
    pub body: String,
    pub raised_at: Millis,
}

/// An alert of the outbox claimed for sending.
#[derive(Clone, Debug, PartialEq)]
pub struct OutboxAlert {
    pub id: String,
    pub rule: String,
    pub body: String,
    pub raised_at: Millis,
    /// The attempts made before this one.
    pub attempts: i64,
}

/// One attempt to deliver an alert (numbered by the store, after those before it).
#[derive(Clone, Debug, PartialEq)]
pub struct AlertDelivery {
    pub alert_id: String,
    pub instance: String,
    pub at: Millis,
    pub duration_ms: i64,
    /// The receiver's HTTP status; none when it did not answer.
    pub status: Option<i64>,
    /// Why it failed; none when delivered.
    pub error: Option<String>,
}

/// An alert of the outbox as the console shows it (`GET /api/v1/alerts`).
#[derive(Clone, Debug, PartialEq)]
pub struct AlertRecord {
    pub id: String,
    pub rule: String,
    pub kind: String,
    pub subject: String,
    /// The bytes posted.
    pub body: String,
    pub raised_at: Millis,
    /// `pending`, `delivered` or `failed`.
    pub state: String,
    pub attempts: i64,
    pub delivered_at: Option<Millis>,
    pub deliveries: Vec<AlertDelivery>,
}

/// What becomes of an alert after a delivery attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AlertNext {
    Delivered,
    /// Tried again from then on.
    Retry(Millis),
    /// Given up: tried for too long.
    Failed,
}

/// One entry of the change feed: an entity some writer changed (docs/scale.md).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FeedEntry {
    /// `profile` (its row or secrets), `order`, `agent`, `stats` (usage stats and cooldown
    /// windows), `model` (a model's cooldown on a provider), `session` (a session's binding).
    pub kind: String,
    /// The profile id, provider, agent name, `provider/model`, or a binding's
    /// `<profile id> <bound_at> <session>` (`SessionBinding::of_feed`).
    pub key: String,
    pub seq: i64,
}

/// The profile a session sticks to on the profile's provider, shared by the fleet
/// (`session_bindings`, docs/scale.md "Sessions").
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionBinding {
    /// The session id as kept: as sent, or `sha256:<hex>` when long.
    pub session: String,
    pub profile: ProfileId,
    /// When the session landed on the profile: of two bindings, the later one wins.
    pub bound_at: Millis,
    /// Its last use, as written.
    pub seen_at: Millis,
}

impl SessionBinding {
    /// The binding a feed entry of kind `session` carries (its last use: when it was bound).
    pub fn of_feed(key: &str) -> Option<SessionBinding> {
        let (profile, rest) = key.split_once(' ')?;
        let (bound_at, session) = rest.split_once(' ')?;
        let bound_at = bound_at.parse().ok()?;
        Some(SessionBinding {
            session: session.to_string(),
            profile: profile.parse().ok()?,
            bound_at,
            seen_at: bound_at,
        })
    }
}

/// An agent's use of its limits (`agent_usage`): the requests admitted in one minute (counted
/// only while the agent has `requests_per_minute`), and the tokens and cost of one UTC day.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize, utoipa::ToSchema)]
pub struct AgentUsage {
    pub requests_this_minute: i64,
    pub tokens_today: i64,
    /// USD.
    pub cost_today: f64,
}

/// A change of an agent's stored limits: `None` leaves a limit as it is, `Some(None)` clears it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LimitsPatch {
    pub requests_per_minute: Option<Option<i64>>,
    pub tokens_per_day: Option<Option<i64>>,
    pub cost_per_day: Option<Option<f64>>,
    /// The models it may ask for: `Some(None)` lifts the restriction.
    pub models: Option<Option<Vec<String>>>,
}

/// Filters of the audit log listings; each is optional, all must hold.
#[derive(Clone, Debug, Default)]
pub struct AuditQuery {
    pub agent: Option<String>,
    pub request_id: Option<String>,
    pub profile: Option<String>,
    pub provider: Option<String>,
    /// A bare model name as the provider knows it.
    pub model: Option<String>,
    pub reason: Option<String>,
    pub outcome: Option<String>,
    /// `started_at >= since` (Unix ms).
    pub since: Option<Millis>,
    /// `started_at < until` (Unix ms).
    pub until: Option<Millis>,
    /// Rows strictly after this one in the listing order (newest first).
    pub after: Option<(Millis, String, i64)>,
    pub limit: u32,
}

/// What one `prune_audit` batch deleted; `more`: rows that old are left.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Pruned {
    pub attempts: u64,
    pub requests: u64,
    pub more: bool,
}

/// What one profile did in a time range, from the audit log.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct ProfileUsage {
    pub profile_id: String,
    pub attempts: i64,
    pub successes: i64,
    pub failures: i64,
    pub tokens_in: i64,
    pub tokens_out: i64,
}

/// The audit log counted per time bucket (`GET /api/v1/usage/series`): bucket `n` holds the
/// rows with `since + n * step <= started_at < since + (n + 1) * step`, and each series holds
/// a count for every bucket of the range.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SeriesRows {
    /// Attempts by provider, outcome and reason (None on a success), in that order.
    pub attempts: Vec<(String, String, Option<String>, Vec<i64>)>,
    /// Requests by outcome, in its order: `served` (a 2xx), `refused` (no attempt), `failed`.
    pub requests: Vec<(String, Vec<i64>)>,
}

/// A window a failure put a profile in (`attempts.cooldown_until`, or an `auth_permanent`
/// failure's open end), with the profile's first success after the failure, if one came
/// before the window's end.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FailureWindow {
    pub profile_id: String,
    pub started_at: i64,
    pub duration_ms: Option<i64>,
    pub reason: Option<String>,
    pub cooldown_until: Option<i64>,
    pub next_success: Option<i64>,
}

/// How long a request may wait on the database (docs/gateway.md, "Audit, health and
/// shutdown"): the pools' acquire timeout, the per-agent limits' claims, and how long the
/// database may stay silent before `/healthz` says so (crate::watchdog).
pub const TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

#[async_trait]
pub trait Store: Send + Sync {
    /// The database, as an operator names it (a file, or a URL without its password).
    fn describe(&self) -> String;
    /// How many migrations this build knows for this engine.
    fn known_migrations(&self) -> usize;
    /// How many migrations the database has applied.
    async fn applied_migrations(&self) -> Result<i64, StoreError>;
    async fn close(&self);
    /// A receiver whose value changes when another writer may have changed the shared state
    /// (PostgreSQL's `LISTEN rota_changes`), where the engine can say so; `None` where the
    /// feed is polled only.
    fn wake(&self) -> Option<tokio::sync::watch::Receiver<u64>>;
    /// Claims the refresh of a profile's OAuth tokens for `holder` until `until`: true when no
    /// other holder has an unexpired claim (docs/scale.md: one refresh per token, fleet-wide).
    async fn claim_refresh(&self, id: &ProfileId, holder: &str, now: Millis, until: Millis)
    -> Result<bool, StoreError>;
    /// Gives up `holder`'s claim, if it still has it.
    async fn release_refresh(&self, id: &ProfileId, holder: &str) -> Result<(), StoreError>;
    async fn snapshot(&self) -> Result<Snapshot, StoreError>;
    /// The ids of the keys that sealed the stored secrets.
    async fn secret_key_ids(&self) -> Result<Vec<String>, StoreError>;
    /// Adds a profile with its sealed secrets and empty stats, atomically.
    async fn add_profile(&self, profile: &StoredProfile, secrets: &[Sealed]) -> Result<(), StoreError>;
    /// Records the profiles declared in the config file (their rows carry stats and audit joins).
    async fn sync_config_profiles(&self, profiles: &[StoredProfile]) -> Result<(), StoreError>;
    async fn remove_profile(&self, id: &ProfileId) -> Result<(), StoreError>;
    /// Sets one of a profile's switches (`profiles.enabled` or `profiles.paid`).
    async fn set_flag(&self, id: &ProfileId, flag: ProfileFlag, on: bool) -> Result<(), StoreError>;
    /// Overwrites stats rows, in one transaction, in the given order. Whatever another writer
    /// changed meanwhile is lost: for a database no server writes to (a copy, a test's seed);
    /// servers and the CLI write through `apply`.
    async fn save_stats(&self, batch: &[(ProfileId, UsageStats)]) -> Result<(), StoreError>;
    /// Overwrites model cooldown rows; the same caveat as `save_stats`.
    async fn save_model_cooldowns(&self, batch: &[((String, String), ModelCooldown)]) -> Result<(), StoreError>;
    /// Replays changes on the stored rows, in order, in one write transaction, and returns the
    /// rows as they now are (profiles that are gone are left out). Because every writer replays
    /// its changes on the row as stored, concurrent writers lose nothing of each other's. The
    /// session bindings are written in the same transaction (the later binding wins).
    async fn apply(
        &self,
        stats: &[(ProfileId, Vec<Change>)],
        models: &[((String, String), Vec<ModelChange>)],
        sessions: &[SessionBinding],
        policy: &CooldownPolicy,
    ) -> Result<Applied, StoreError>;
    /// The audit trail's day partitions on PostgreSQL: made ahead of `now`, and for rows that
    /// wait in a default partition; how many were made (docs/audit.md).
    async fn audit_upkeep(&self, now: Millis) -> Result<u64, StoreError>;
    /// Drops the audit trail's whole days before `before` on PostgreSQL, their attempts rolled
    /// up into `usage_daily` first; how many partitions went.
    async fn drop_audit_days(&self, before: Millis) -> Result<u64, StoreError>;
    /// Partitions an audit trail that is not (PostgreSQL): the rows copied, `None` when there
    /// was nothing to do.
    async fn partition_audit(&self) -> Result<Option<u64>, StoreError>;
    /// A session's bindings, on every provider, used since `since`.
    async fn session_bindings(&self, session: &str, since: Millis) -> Result<Vec<SessionBinding>, StoreError>;
    /// Deletes up to `batch` bindings last used before `idle_before`, or the oldest beyond
    /// `keep`; how many.
    async fn prune_sessions(&self, idle_before: Millis, keep: usize, batch: usize) -> Result<u64, StoreError>;
    /// The change feed: the entities changed after position `seq`, oldest first.
    async fn changes_after(&self, seq: i64) -> Result<Vec<FeedEntry>, StoreError>;
    /// The feed's newest position, of one kind or of all.
    async fn feed_head(&self, kind: Option<&str>) -> Result<i64, StoreError>;
    /// These profiles' stats as stored (`None`: the profile is gone), with the feed's position
    /// they are as of (read together).
    async fn stats_of(&self, ids: &[ProfileId]) -> Result<(i64, Vec<(ProfileId, Option<UsageStats>)>), StoreError>;
    /// Every model cooldown as stored, with the feed's position they are as of.
    async fn model_cooldowns(&self) -> Result<(i64, HashMap<(String, String), ModelCooldown>), StoreError>;
    /// Sets (or with `None` removes) the stored explicit order of a provider.
    async fn set_order(&self, provider: &str, ids: Option<&[ProfileId]>) -> Result<(), StoreError>;
    /// Creates an agent with the digest of its key. A revoked agent of the same name gets the
    /// new key and becomes active again (its audit rows keep their name); an active one is a
    /// conflict.
    async fn create_agent(
        &self,
        name: &str,
        key_digest: &str,
        admin: bool,
        (limits, models): (&Limits, Option<&[String]>),
        now: Millis,
    ) -> Result<Agent, StoreError>;
    /// Changes an active agent's stored limits; the agent as it now is (`NoAgent` when there is
    /// no active agent of that name).
    async fn set_agent_limits(&self, name: &str, patch: &LimitsPatch) -> Result<Agent, StoreError>;
    /// Records a change made through the admin API or the console.
    async fn record_action(&self, action: &AdminAction) -> Result<(), StoreError>;
    /// The newest `limit` recorded changes, newest first.
    async fn admin_actions(&self, limit: i64) -> Result<Vec<AdminAction>, StoreError>;
    /// Puts `alert` in the outbox unless its rule raised one for its subject after
    /// `gate_after` (the gate of every server sharing the database); whether it did.
    async fn raise_alert(&self, alert: &NewAlert, gate_after: Millis) -> Result<bool, StoreError>;
    /// Claims up to `limit` pending alerts due at `now` that no other server holds a claim on,
    /// for this `instance` until `until`.
    async fn claim_alerts(
        &self,
        instance: &str,
        now: Millis,
        until: Millis,
        limit: i64,
    ) -> Result<Vec<OutboxAlert>, StoreError>;
    /// Records a delivery attempt and what becomes of the alert, which gives up its claim.
    async fn alert_attempted(&self, delivery: &AlertDelivery, next: AlertNext) -> Result<(), StoreError>;
    /// The newest `limit` alerts, newest first, with their delivery attempts.
    async fn recent_alerts(&self, limit: i64) -> Result<Vec<AlertRecord>, StoreError>;
    /// Deletes the delivered and given-up alerts raised before `before` (their deliveries go
    /// with them) and the gates last moved before `gates_before`; how many alerts went.
    async fn prune_alerts(&self, before: Millis, gates_before: Millis) -> Result<u64, StoreError>;
    /// Claims `slots` requests of `agent` in the minute that starts at `minute`, if the count
    /// stays at or under `limit` with them: the count with them, or `None` (nothing claimed).
    /// One atomic statement, so the servers sharing the database claim at most `limit`
    /// together (crate::limits admits from what its server claimed). `slots` is at most `limit`.
    async fn claim_requests(
        &self,
        agent: &str,
        minute: Millis,
        slots: i64,
        limit: i64,
    ) -> Result<Option<i64>, StoreError>;
    /// Each agent's use (of `agent` alone, when given) in the minute that starts at `minute`
    /// and the UTC day that starts at `day`; agents with no row are left out.
    async fn agent_usage(
        &self,
        agent: Option<&str>,
        minute: Millis,
        day: Millis,
    ) -> Result<HashMap<String, AgentUsage>, StoreError>;
    /// Deletes the minute counters started before `minutes_before` and, when given, the day
    /// counters started before `days_before`; how many went.
    async fn prune_agent_usage(&self, minutes_before: Millis, days_before: Option<Millis>) -> Result<u64, StoreError>;
    async fn agents(&self) -> Result<Vec<Agent>, StoreError>;
    /// Every active agent with the digest of its key.
    async fn active_agents(&self) -> Result<Vec<(String, Agent)>, StoreError>;
    async fn revoke_agent(&self, name: &str, now: Millis) -> Result<(), StoreError>;
    /// Adds profiles with their secrets and stats, and sets explicit orders, all or nothing
    /// (an existing id refuses the whole batch).
    async fn import(
        &self,
        profiles: &[(StoredProfile, Vec<Sealed>, UsageStats)],
        orders: &BTreeMap<String, Vec<ProfileId>>,
    ) -> Result<(), StoreError>;
    /// The profile of `provider` whose OAuth account is `subject`, if any.
    async fn login_profile(&self, provider: &str, subject: &str) -> Result<Option<ProfileId>, StoreError>;
    /// Records an OAuth login: adds the profile, or updates the one of the same account
    /// (email, expiry, enabled) and replaces its tokens. True when it was added. The account is
    /// `profile.oauth_subject`: an existing profile with another subject (or any subject, when
    /// the login has none), or another profile with this subject, is `OtherAccount` and nothing
    /// is written; a profile without a subject yet (logged in before subjects were kept) takes
    /// this one.
    async fn save_login(&self, profile: &StoredProfile, secrets: &[Sealed]) -> Result<bool, StoreError>;
    /// Replaces a profile's OAuth tokens if its refresh token (a client's secret, for
    /// `client_credentials`) is still the one sealed with `expected` (its nonce): compare-and-swap
    /// against a sibling instance that refreshed first. False, and nothing written, when it was not.
    async fn swap_tokens(
        &self,
        id: &ProfileId,
        expected: Option<&[u8]>,
        secrets: &[Sealed],
        expires_at: Option<Millis>,
    ) -> Result<bool, StoreError>;
    /// Re-seals every stored secret in one transaction (`rota rotate-key`): `rows` must hold
    /// exactly the secrets stored now, each re-sealed; otherwise nothing is written.
    async fn reseal_all(&self, rows: &[(ProfileId, Sealed)]) -> Result<(), StoreError>;
    /// A profile's sealed secrets and expiry as stored now.
    async fn profile_secrets(&self, id: &ProfileId) -> Result<(Vec<Sealed>, Option<Millis>), StoreError>;
    /// Attempts matching `q`, newest first.
    async fn attempts(&self, q: &AuditQuery) -> Result<Vec<AttemptRecord>, StoreError>;
    /// Requests with an attempt matching `q`'s profile, provider, model, reason and outcome
    /// filters (when given) and matching its agent and time range, newest first.
    async fn requests(&self, q: &AuditQuery) -> Result<Vec<RequestRecord>, StoreError>;
    /// Attempts and tokens per profile with `since <= started_at < until`.
    async fn usage(&self, since: Millis, until: Millis) -> Result<Vec<ProfileUsage>, StoreError>;
    /// Attempts and requests with `since <= started_at < until`, counted per bucket of `step`
    /// milliseconds from `since` (`since`, `until` and `step` whole minutes: the counts are
    /// read from `audit_minutely`, or `audit_hourly` when all three are whole hours).
    async fn usage_series(&self, since: Millis, until: Millis, step: Millis) -> Result<SeriesRows, StoreError>;
    /// The windows failures set on profiles that last past `since`: those of every failure
    /// started in `[near, until)` whose `cooldown_until` is after `since` (or an
    /// `auth_permanent` one without an end), and those of `billing` and `auth_permanent`
    /// failures started in `[far, near)` (the disabled lane outlasts the cooldown lane's
    /// longest window); each with the profile's first success after the failure and before
    /// `min(its end, until)`. In no order.
    async fn failure_windows(
        &self,
        far_near: (Millis, Millis),
        since: Millis,
        until: Millis,
    ) -> Result<Vec<FailureWindow>, StoreError>;
    /// Appends audit rows in one transaction.
    async fn insert_audit(&self, requests: &[RequestRecord], attempts: &[AttemptRecord]) -> Result<(), StoreError>;
    /// Deletes up to about `batch` of the oldest attempts started before `before`, and the
    /// requests as old, in one transaction, adding the attempts to the `usage_daily` roll-up.
    async fn prune_audit(&self, before: Millis, batch: usize) -> Result<Pruned, StoreError>;
    /// One trivial round trip: whether the database answers.
    async fn ping(&self) -> Result<(), StoreError>;
    /// When the newest request of the audit log started, if there is one.
    async fn newest_audit(&self) -> Result<Option<Millis>, StoreError>;
    /// Copies the write-ahead log into the database (SQLite) and, when all of it was copied,
    /// starts it over (with `truncate` also empties its file); whether it was started over.
    /// Nothing to do elsewhere.
    async fn checkpoint(&self, truncate: bool) -> Result<bool, StoreError>;
    /// The write-ahead log's size in bytes, where there is one.
    fn wal_bytes(&self) -> Option<u64>;
    /// Why this process cannot write the database's files, where it has files
    /// (`files::unwritable`).
    fn files_problem(&self) -> Option<String>;
    /// Writes a consistent copy of the live database to `to`, a file that must not exist yet
    /// (SQLite's `VACUUM INTO`, while every writer goes on; secrets stay sealed); mode 0600.
    /// PostgreSQL: `Unsupported` (its backup is `pg_dump`'s, docs/operations.md "Backups").
    async fn backup(&self, to: &std::path::Path) -> Result<(), StoreError>;
    /// The most profiles one write of a server's stats writer takes.
    fn stats_batch(&self) -> usize;
    /// A write failed with `e`: after anything but another writer's lock, the connections
    /// open now are replaced before their next use (a writer calls this before retrying).
    fn write_failed(&self, e: &StoreError);
    /// The turn of one of this process's writers (the audit and stats write-behinds, the
    /// checkpoint's restart of the log), held until its transaction ends, where the engine has
    /// one writer at a time (SQLite): the writers then queue in order instead of polling the
    /// file lock, which lets whoever polls at the right moment in and can starve the other
    /// one for a second. `None` where writers run side by side (PostgreSQL).
    async fn write_turn(&self) -> Option<tokio::sync::OwnedMutexGuard<()>>;
    /// Bytes free on the file system that holds the database, where it is a local file.
    fn free_bytes(&self) -> Option<u64>;
    /// The longest a checkpoint held this process's writers up (its restart of the log, in
    /// their turn) since start, where checkpoints do (SQLite).
    fn checkpoint_hold(&self) -> Option<std::time::Duration>;
    /// Every agent, revoked ones too, with the digest of its key (`rota migrate --from`).
    async fn all_agents(&self) -> Result<Vec<(String, Agent)>, StoreError>;
    /// Writes agents as they were elsewhere (`rota migrate --from`), ids and times kept.
    async fn copy_agents(&self, agents: &[(String, Agent)]) -> Result<(), StoreError>;
}
