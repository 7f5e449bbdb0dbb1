//! Where rota keeps its state: `database.url` read as an SQLite file or a PostgreSQL server.

use crate::config::{Config, ConfigError};
use std::path::PathBuf;

/// Where rota keeps its state (`database.url`).
#[derive(Clone, PartialEq, Eq)]
pub enum DatabaseTarget {
    Sqlite(PathBuf),
    /// A PostgreSQL connection URL as written; shown only through `Display`, which hides its
    /// password.
    Postgres(String),
}

impl DatabaseTarget {
    /// The database the config's `database.url` names.
    pub fn of(config: &Config) -> Result<DatabaseTarget, ConfigError> {
        DatabaseTarget::parse(&config.database.url)
    }

    /// `url` in one of the forms `database.url` takes: an SQLite file (`sqlite://rota.db`,
    /// `sqlite:rota.db`, a path) or a PostgreSQL server (`postgres://…`, `postgresql://…`).
    pub fn parse(url: &str) -> Result<DatabaseTarget, ConfigError> {
        let url = url.trim();
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            return Ok(DatabaseTarget::Postgres(url.to_string()));
        }
        let rest = url.strip_prefix("sqlite://").or_else(|| url.strip_prefix("sqlite:")).unwrap_or(url);
        let rest = rest.split('?').next().unwrap_or("");
        if url.contains("://") && !url.starts_with("sqlite://") {
            let scheme = url.split("://").next().unwrap_or("");
            return Err(ConfigError(vec![format!(
                "database.url: the scheme `{scheme}://` is not supported; use sqlite://PATH or postgres://USER@HOST/DB"
            )]));
        }
        if rest.is_empty() || rest.contains(":memory:") {
            return Err(ConfigError(vec![format!("database.url: `{url}` does not name a database file")]));
        }
        Ok(DatabaseTarget::Sqlite(PathBuf::from(rest)))
    }

    /// The path the master key's file and keyring entry are named after: the SQLite file
    /// (`rota.db` → `rota.key` beside it); with PostgreSQL, `rota.db` in the working directory
    /// (so `rota.key` there). A fleet gives every instance the same `ROTA_MASTER_KEY` instead.
    pub fn key_anchor(&self) -> PathBuf {
        match self {
            DatabaseTarget::Sqlite(path) => path.clone(),
            DatabaseTarget::Postgres(_) => PathBuf::from("rota.db"),
        }
    }

    /// False only for an SQLite file not created yet.
    pub fn exists(&self) -> bool {
        match self {
            DatabaseTarget::Sqlite(path) => path.exists(),
            DatabaseTarget::Postgres(_) => true,
        }
    }
}

impl std::fmt::Display for DatabaseTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DatabaseTarget::Sqlite(path) => write!(f, "{}", path.display()),
            DatabaseTarget::Postgres(url) => f.write_str(&redacted_url(url)),
        }
    }
}

impl std::fmt::Debug for DatabaseTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DatabaseTarget({self})")
    }
}

/// A database URL without its password: the one after the user, and any query parameter
/// whose name holds `password` (`?password=…`, `sslpassword`).
pub fn redacted_url(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut u) => {
            if u.password().is_some() {
                let _ = u.set_password(Some("***"));
            }
            let secret = |k: &str| k.to_ascii_lowercase().contains("password");
            if u.query_pairs().any(|(k, _)| secret(&k)) {
                let pairs: Vec<(String, String)> = u
                    .query_pairs()
                    .map(|(k, v)| (k.to_string(), if secret(&k) { "***".to_string() } else { v.to_string() }))
                    .collect();
                u.query_pairs_mut().clear().extend_pairs(pairs);
            }
            u.to_string()
        }
        Err(_) => "(a database URL that does not parse)".into(),
    }
}

/// The path the master key's file (`key_file_for`) and keyring entry are named after:
/// `secrets.key_file`, else the database's own anchor (`DatabaseTarget::key_anchor`).
pub fn key_anchor(config: &Config) -> Result<PathBuf, ConfigError> {
    match &config.secrets.key_file {
        Some(file) if file.extension().is_some_and(|e| e == "key") => Ok(file.clone()),
        Some(file) => Err(ConfigError(vec![format!(
            "secrets.key_file: `{}` must end in `.key` (its rotation writes `.key.new` beside it)",
            file.display()
        )])),
        None => Ok(DatabaseTarget::of(config)?.key_anchor()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Database;

    #[test]
    fn a_database_url_is_shown_without_any_password() {
        let shown = redacted_url(
            "postgres://rota:hunter2@db.example:5432/rota?sslmode=require&password=s3cret&sslpassword=k3y",
        );
        assert_eq!(shown, "postgres://rota:***@db.example:5432/rota?sslmode=require&password=***&sslpassword=***");
        assert!(!shown.contains("hunter2") && !shown.contains("s3cret") && !shown.contains("k3y"));
        assert_eq!(redacted_url("postgres://rota@localhost/rota"), "postgres://rota@localhost/rota");
    }

    #[test]
    fn database_url_forms() {
        let with = |u: &str| {
            let config = Config { database: Database { url: u.into(), ..Default::default() }, ..Default::default() };
            DatabaseTarget::of(&config)
        };
        let file = |p: &str| DatabaseTarget::Sqlite(PathBuf::from(p));
        assert_eq!(with("sqlite://rota.db").unwrap(), file("rota.db"));
        assert_eq!(with("sqlite:///var/lib/rota.db?mode=rwc").unwrap(), file("/var/lib/rota.db"));
        assert_eq!(with("data/x.db").unwrap(), file("data/x.db"));
        assert!(with("sqlite::memory:").is_err());
        let pg = with("postgres://rota:hunter2@db.internal:5432/rota").unwrap();
        assert_eq!(pg, DatabaseTarget::Postgres("postgres://rota:hunter2@db.internal:5432/rota".into()));
        assert_eq!(pg.to_string(), "postgres://rota:***@db.internal:5432/rota");
        assert!(!format!("{pg:?}").contains("hunter2"));
        assert!(with("postgresql://h/db").is_ok());
        let refused = with("mysql://root:hunter2@h/db").unwrap_err().to_string();
        assert!(refused.contains("mysql://") && !refused.contains("hunter2"), "{refused}");
    }
}
