//! What a store operation can fail with, and the failures told in words an operator can act on.

use crate::engine::ProfileId;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("profile {0} already exists")]
    Duplicate(ProfileId),
    /// A login would overwrite the profile of another account (another OpenID subject).
    #[error("profile {0} belongs to another account (a different OpenID subject)")]
    OtherAccount(ProfileId),
    #[error("profile {0} does not exist")]
    NotFound(ProfileId),
    #[error("agent {0} already exists")]
    AgentExists(String),
    #[error("agent {0} does not exist")]
    NoAgent(String),
    #[error("database error: {0}")]
    Db(#[from] sqlx::Error),
    #[error("database migration failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error("corrupt row in {table}: {detail}")]
    Corrupt { table: &'static str, detail: String },
    /// What this engine leaves to its own tools (a PostgreSQL backup is `pg_dump`'s).
    #[error("{0}")]
    Unsupported(String),
    /// The database cannot be served as it is: a server too old, a role without the privileges
    /// rota needs, a schema a newer rota migrated (docs/deploy.md).
    #[error("{0}")]
    Setup(String),
}

/// A migration that failed, in words an operator can act on: a database a newer rota migrated
/// (this binary cannot serve it), or a role that may not create rota's tables.
pub(crate) fn migration_failed(e: sqlx::migrate::MigrateError, role: Option<&str>) -> StoreError {
    use sqlx::migrate::MigrateError;
    let denied = |e: &sqlx::Error| matches!(e, sqlx::Error::Database(d) if d.code().as_deref() == Some("42501"));
    match (&e, role) {
        (MigrateError::VersionMissing(v), _) => StoreError::Setup(format!(
            "the database was migrated by a newer rota (its migration {v} is not in this binary), which this \
             one cannot serve: run the newer binary, or restore the backup taken before the upgrade \
             (docs/deploy.md, \"Upgrades\")"
        )),
        (MigrateError::Execute(inner) | MigrateError::ExecuteMigration(inner, _), Some(role)) if denied(inner) => {
            StoreError::Setup(format!(
                "the role `{role}` may not create rota's tables ({inner}): as the database's owner, run \
                 `GRANT USAGE, CREATE ON SCHEMA public TO {role};` (docs/deploy.md, \"PostgreSQL\")"
            ))
        }
        _ => StoreError::Migrate(e),
    }
}

impl StoreError {
    /// The database could not take a write for its files or its server's state, not for what
    /// was written: SQLite's `READONLY`, `IOERR`, `CANTOPEN`, `FULL`; PostgreSQL's read-only
    /// transaction (25006) and disk full (53100); the files checked and found unwritable.
    pub fn is_unwritable(&self) -> bool {
        match self {
            StoreError::Setup(_) => true,
            StoreError::Db(sqlx::Error::Database(e)) => match e.code().as_deref() {
                Some("25006" | "53100") => true,
                Some(code) => code.parse::<i64>().is_ok_and(|c| matches!(c & 0xff, 8 | 10 | 13 | 14)),
                None => false,
            },
            _ => false,
        }
    }

    /// Another connection held a lock for longer than the busy timeout: waiting helps.
    pub fn is_busy(&self) -> bool {
        match self {
            StoreError::Db(sqlx::Error::Database(e)) => {
                e.code().and_then(|c| c.parse::<i64>().ok()).is_some_and(|c| matches!(c & 0xff, 5 | 6))
            }
            StoreError::Db(sqlx::Error::PoolTimedOut) => true,
            _ => false,
        }
    }

    /// The database refused what was written, not the write: a value out of its type's range
    /// or a failed check (PostgreSQL's classes 22, data exception, and 23, integrity
    /// constraint violation; SQLite's `SQLITE_CONSTRAINT`, `SQLITE_MISMATCH`, `SQLITE_TOOBIG`).
    /// Writing it again cannot help.
    pub fn is_content(&self) -> bool {
        let StoreError::Db(sqlx::Error::Database(e)) = self else { return false };
        let Some(code) = e.code() else { return false };
        // PostgreSQL's SQLSTATE is five characters; SQLite's (extended) result codes have fewer.
        if code.len() == 5 {
            return code.starts_with("22") || code.starts_with("23");
        }
        code.parse::<i64>().is_ok_and(|sqlite| matches!(sqlite & 0xff, 18..=20))
    }

    /// The disk is full: SQLite's `SQLITE_FULL` (13), PostgreSQL's `disk_full` (53100), or
    /// the operating system's "no space left on device".
    pub fn is_full(&self) -> bool {
        match self {
            StoreError::Db(sqlx::Error::Database(e)) => matches!(e.code().as_deref(), Some("13" | "53100")),
            StoreError::Db(sqlx::Error::Io(e)) => e.kind() == std::io::ErrorKind::StorageFull,
            _ => false,
        }
    }
}
