//! `rota profiles list|add|remove|enable|disable|clear|order`.

use crate::book::Roster;
use crate::config::Config;
use crate::engine::{ProfileId, ProfileType};
use crate::secrets::{SecretField, resolve_key};
use crate::status::{Status, time};
use crate::store::{Origin, SqliteStore, Store, StoreError, StoredProfile};
use anyhow::{Context, Result, bail};
use clap::Subcommand;
use secrecy::SecretString;
use serde_json::json;
use std::io::{IsTerminal, Read};

#[derive(Subcommand, Debug)]
pub enum ProfilesCommand {
    /// List profiles with their state (never their secrets).
    List {
        #[arg(long)]
        json: bool,
        /// Only this provider's profiles.
        #[arg(long)]
        provider: Option<String>,
    },
    /// Add an API key or static token; the secret is read from stdin, never from arguments.
    Add {
        provider: String,
        #[arg(long, value_name = "LABEL")]
        name: String,
        #[arg(long = "type", default_value = "api_key", value_name = "api_key|token")]
        kind: String,
        /// When a static token stops working (RFC 3339).
        #[arg(long, value_name = "RFC3339")]
        expires: Option<String>,
    },
    /// Remove a stored profile and its secret.
    Remove { id: String },
    /// Let rotation use the profile again.
    Enable { id: String },
    /// Keep rotation from using the profile.
    Disable { id: String },
    /// Clear the profile's cooldown and disabled state.
    Clear { id: String },
    /// Show, set or reset a provider's explicit order.
    Order {
        provider: String,
        /// Profile ids in the order to try them. None: show the order in force.
        ids: Vec<String>,
        /// Remove the stored order (the config file's or round robin applies again).
        #[arg(long, conflicts_with = "ids")]
        reset: bool,
    },
}

pub async fn run(config: &Config, cmd: ProfilesCommand) -> Result<()> {
    match cmd {
        ProfilesCommand::List { json, provider } => list(config, json, provider).await,
        ProfilesCommand::Add { provider, name, kind, expires } => {
            add(config, &provider, &name, &kind, expires.as_deref()).await
        }
        ProfilesCommand::Remove { id } => {
            let id = parse_id(&id)?;
            if config.auth.profiles.contains_key(&id) {
                bail!("profile {id} is declared in the config file; remove it there");
            }
            open(config).await?.remove_profile(&id).await.map_err(not_found)?;
            println!("removed {id}");
            Ok(())
        }
        ProfilesCommand::Enable { id } => set_enabled(config, &id, true).await,
        ProfilesCommand::Disable { id } => set_enabled(config, &id, false).await,
        ProfilesCommand::Clear { id } => {
            let id = parse_id(&id)?;
            let store = open(config).await?;
            let snap = store.snapshot().await?;
            let mut stats = snap.stats.get(&id).cloned().ok_or_else(|| not_found(StoreError::NotFound(id.clone())))?;
            stats.clear_errors();
            store.save_stats(&[(id.clone(), stats)]).await?;
            println!("cleared cooldown and disabled state of {id}");
            Ok(())
        }
        ProfilesCommand::Order { provider, ids, reset } => order(config, &provider, ids, reset).await,
    }
}

async fn open(config: &Config) -> Result<SqliteStore> {
    let path = config.database_path()?;
    SqliteStore::open(&path).await.with_context(|| format!("opening database {}", path.display()))
}

fn parse_id(raw: &str) -> Result<ProfileId> {
    Ok(raw.parse::<ProfileId>()?)
}

fn not_found(e: StoreError) -> anyhow::Error {
    match e {
        StoreError::NotFound(id) => anyhow::anyhow!("profile {id} does not exist (see `rota profiles list`)"),
        other => other.into(),
    }
}

fn known_provider(config: &Config, provider: &str) -> Result<()> {
    if !config.has_provider(provider) {
        let known: Vec<&str> = config.providers.keys().map(String::as_str).collect();
        bail!(
            "unknown provider `{provider}`: configure [providers.{provider}] first (configured: {})",
            if known.is_empty() { "none".to_string() } else { known.join(", ") }
        );
    }
    Ok(())
}

async fn add(config: &Config, provider: &str, name: &str, kind: &str, expires: Option<&str>) -> Result<()> {
    known_provider(config, provider)?;
    let id = ProfileId::new(provider, name)?;
    let kind: ProfileType = kind.parse().map_err(anyhow::Error::msg)?;
    let field = match kind {
        ProfileType::ApiKey => SecretField::ApiKey,
        ProfileType::Token => SecretField::Token,
        ProfileType::OAuth => bail!("OAuth profiles are added by logging in (`rota login {provider}`)"),
    };
    let now = chrono::Utc::now();
    let expires_at = match expires {
        None => None,
        Some(_) if kind != ProfileType::Token => bail!("--expires applies to --type token only"),
        Some(raw) => {
            let at = chrono::DateTime::parse_from_rfc3339(raw)
                .with_context(|| format!("--expires `{raw}` is not an RFC 3339 time (e.g. 2026-12-31T23:59:59Z)"))?;
            if at <= now {
                bail!("--expires {raw} is in the past: the token would never be used");
            }
            Some(at.timestamp_millis())
        }
    };
    if config.auth.profiles.contains_key(&id) {
        bail!("profile {id} is declared in the config file; choose another --name");
    }
    let secret = read_secret(kind)?;

    let store = open(config).await?;
    let (key, origin) = resolve_key(&config.database_path()?, &store.secret_key_ids().await?)?;
    let sealed = key.seal(&id, field, &secret);
    let profile = StoredProfile::stored(id.clone(), kind, expires_at, now.timestamp_millis());
    store.add_profile(&profile, &[sealed]).await.map_err(|e| match e {
        StoreError::Duplicate(id) => {
            anyhow::anyhow!("profile {id} already exists; remove it first or choose another --name")
        }
        other => other.into(),
    })?;
    println!("added {id} ({kind}); secret sealed with key {} from {origin}", key.id());
    Ok(())
}

/// Reads the secret from stdin: surrounding whitespace is trimmed; inner whitespace or control
/// characters mean a paste went wrong.
fn read_secret(kind: ProfileType) -> Result<SecretString> {
    let what = if kind == ProfileType::Token { "token" } else { "API key" };
    let mut stdin = std::io::stdin();
    if stdin.is_terminal() {
        eprintln!(
            "Paste the {what}, then press Enter and Ctrl-D (or pipe it: `printf %s \"$KEY\" | rota profiles add …`):"
        );
    }
    let mut raw = String::new();
    stdin.read_to_string(&mut raw).context("reading the secret from stdin")?;
    let raw = SecretString::from(raw);
    let trimmed = secrecy::ExposeSecret::expose_secret(&raw).trim();
    if trimmed.is_empty() {
        bail!("empty {what} on stdin: nothing was added");
    }
    if trimmed.chars().any(|c| c.is_whitespace() || c.is_control()) {
        bail!("the {what} on stdin contains whitespace or control characters: nothing was added");
    }
    Ok(SecretString::from(trimmed.to_string()))
}

async fn set_enabled(config: &Config, id: &str, enabled: bool) -> Result<()> {
    let id = parse_id(id)?;
    open(config).await?.set_enabled(&id, enabled).await.map_err(not_found)?;
    println!("{} {id}", if enabled { "enabled" } else { "disabled" });
    Ok(())
}

async fn list(config: &Config, as_json: bool, provider: Option<String>) -> Result<()> {
    let store = open(config).await?;
    let snap = store.snapshot().await?;
    let roster = Roster::new(&snap, config);
    let now = chrono::Utc::now().timestamp_millis();
    let origin = |id: &ProfileId| if config.auth.profiles.contains_key(id) { Origin::Config } else { Origin::Stored };
    let mut rows: Vec<&ProfileId> =
        roster.views.keys().filter(|id| provider.as_deref().is_none_or(|want| id.provider() == want)).collect();
    rows.sort();
    if as_json {
        let out: Vec<_> = rows
            .iter()
            .map(|id| {
                let v = &roster.views[*id];
                json!({
                    "id": id, "provider": id.provider(), "type": v.kind, "source": origin(id).as_str(),
                    "enabled": v.enabled, "status": Status::of(v, now), "expires_at": v.expires_at,
                    "usage_stats": v.stats,
                })
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    if rows.is_empty() {
        println!("no profiles (add one with `rota profiles add <provider> --name <label>`)");
        return Ok(());
    }
    println!(
        "{:<32} {:<8} {:<7} {:<20} {:>6} {:>8} {:>8}  STATE",
        "ID", "TYPE", "SOURCE", "LAST USED", "ERRORS", "SUCCESS", "FAILURES"
    );
    for id in rows {
        let v = &roster.views[id];
        let last = v.stats.last_used.map(time).unwrap_or_else(|| "never".into());
        println!(
            "{:<32} {:<8} {:<7} {:<20} {:>6} {:>8} {:>8}  {}",
            id.as_str(),
            v.kind.as_str(),
            origin(id).as_str(),
            last,
            v.stats.error_count,
            v.stats.success_count,
            v.stats.failure_total,
            Status::of(v, now).display(now)
        );
    }
    Ok(())
}

async fn order(config: &Config, provider: &str, raw_ids: Vec<String>, reset: bool) -> Result<()> {
    known_provider(config, provider)?;
    let store = open(config).await?;
    if reset {
        store.set_order(provider, None).await?;
        println!("removed the stored order of {provider}");
        return Ok(());
    }
    let snap = store.snapshot().await?;
    let roster = Roster::new(&snap, config);
    if raw_ids.is_empty() {
        let (source, ids) = match (snap.orders.get(provider), config.auth.order.get(provider)) {
            (Some(o), _) if !o.is_empty() => ("stored order", o.clone()),
            (_, Some(o)) if !o.is_empty() => ("config file order", o.clone()),
            _ => ("round robin (least recently used first)", vec![]),
        };
        println!("{provider}: {source}");
        for id in ids {
            println!("  {id}");
        }
        return Ok(());
    }
    let mut ids = Vec::with_capacity(raw_ids.len());
    for raw in &raw_ids {
        let id = parse_id(raw)?;
        if id.provider() != provider {
            bail!("{id} belongs to provider {}, not {provider}", id.provider());
        }
        if !roster.views.contains_key(&id) {
            bail!("profile {id} does not exist (see `rota profiles list`)");
        }
        if ids.contains(&id) {
            bail!("{id} is listed twice");
        }
        ids.push(id);
    }
    store.set_order(provider, Some(&ids)).await?;
    println!("{provider}: {}", ids.iter().map(ProfileId::as_str).collect::<Vec<_>>().join(" → "));
    Ok(())
}
