//! The PostgreSQL store, for a fleet of instances sharing one state (docs/scale.md).

use super::StoreError;
use super::sql::{Backend, Texts};
use sqlx::Postgres;
use sqlx::migrate::Migrator;
use sqlx::postgres::{PgConnectOptions, PgListener, PgPool, PgPoolOptions, PgSslMode};
use std::str::FromStr;
use std::sync::{LazyLock, OnceLock};
use std::time::Duration;
use tokio::sync::watch;

static MIGRATOR: Migrator = sqlx::migrate!("./migrations/postgres");

/// PostgreSQL's `statement_timeout`: a statement (or a lock it waits for) that takes longer is
/// cancelled by the server, so a stuck one frees its connection. Generous: audit listings and
/// roll-ups over large tables stay well under it.
const STATEMENT_TIMEOUT: &str = "30s";

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
        let mut opts = PgConnectOptions::from_str(url)?
            .application_name("rota")
            .options([("statement_timeout", STATEMENT_TIMEOUT)]);
        if let Some(mode) = default_ssl_mode(url) {
            opts = opts.ssl_mode(mode);
        }
        let pool = PgPoolOptions::new()
            .max_connections(8)
            .acquire_timeout(super::TIMEOUT)
            .before_acquire(|conn, _| Box::pin(async move { Ok(super::sql::usable(conn)) }))
            .connect_with(opts)
            .await?;
        MIGRATOR.run(&pool).await?;
        Ok(PgStore { pool, description: crate::store::redacted_url(url), wake: Default::default() })
    }

    pub fn pool(&self) -> &PgPool {
        &self.pool
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

/// The statements of PostgreSQL's own text: the audit's INSERTs take `$N` parameters, and
/// `json_array_elements_text` turns the JSON array of ids bound as `$1` into rows (`load_many`).
static TEXTS: LazyLock<Texts> = LazyLock::new(|| Texts::new(true, "SELECT json_array_elements_text($1::json)"));

impl Backend for PgStore {
    type Db = Postgres;

    fn pool(&self) -> &PgPool {
        &self.pool
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

    /// Instances and the two writers of one instance write side by side: the feed's counter
    /// row serializes only what must be.
    async fn turn(&self) -> Option<tokio::sync::OwnedMutexGuard<()>> {
        None
    }

    /// The database is elsewhere: its disk is its server's to watch.
    fn free_space(&self) -> Option<u64> {
        None
    }

    /// PostgreSQL checkpoints by itself.
    fn longest_hold(&self) -> Option<Duration> {
        None
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
}
