//! `rota profiles list|add|remove|enable|disable|paid|clear|order`.

use super::open_existing as existing;
use super::open_store as open;
use crate::book::{Credential, Roster};
use crate::config::Config;
use crate::engine::{ModelChange, ProfileId};
use crate::profiles::{self as rules, Changes, Rotation};
use crate::secrets::resolve_key;
use crate::status::{Status, time};
use crate::store::{Origin, StoreError, StoredProfile};
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
    /// Add an API key, a static token, an OAuth client (`client_credentials`: named by its
    /// client id, `--client-id` or `--name`) or a Google service account (named by its key's
    /// `client_email` unless `--name` is given); the secret is read from stdin, never from
    /// arguments.
    Add {
        provider: String,
        #[arg(long, value_name = "LABEL")]
        name: Option<String>,
        /// A `client_credentials` profile's client id (its name).
        #[arg(long, value_name = "ID")]
        client_id: Option<String>,
        #[arg(
            long = "type",
            default_value = "api_key",
            value_name = "api_key|token|client_credentials|service_account"
        )]
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
    /// Mark the profile as costing money per call (`on`: a request it serves raises the `paid`
    /// alert), or not (`off`).
    Paid {
        id: String,
        #[arg(value_parser = ["on", "off"])]
        state: String,
    },
    /// Clear the profile's cooldown and disabled state, or (`--model provider/model`) a model's
    /// cooldown after a `model_not_found`.
    Clear {
        #[arg(required_unless_present = "model", conflicts_with = "model")]
        id: Option<String>,
        #[arg(long)]
        model: Option<String>,
    },
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
        ProfilesCommand::Add { provider, name, client_id, kind, expires } => {
            add(config, &provider, (name, client_id), &kind, expires.as_deref()).await
        }
        ProfilesCommand::Remove { id } => {
            let id = parse_id(&id)?;
            if config.auth.profiles.contains_key(&id) {
                bail!("profile {id} is declared in the config file; remove it there");
            }
            let store = existing(config).await?;
            Changes::new(store.as_ref(), None).remove(&id).await.map_err(not_found)?;
            super::record(store.as_ref(), "profile.delete", id.as_str(), (Some(json!({"exists": true})), None)).await?;
            println!("removed {id}");
            Ok(())
        }
        ProfilesCommand::Enable { id } => set_enabled(config, &id, true).await,
        ProfilesCommand::Disable { id } => set_enabled(config, &id, false).await,
        ProfilesCommand::Paid { id, state } => set_paid(config, &id, state == "on").await,
        ProfilesCommand::Clear { model: Some(model), .. } => clear_model(config, &model).await,
        ProfilesCommand::Clear { id, .. } => {
            let id = parse_id(&id.expect("clap requires an id without --model"))?;
            let store = existing(config).await?;
            let now = chrono::Utc::now().timestamp_millis();
            Changes::new(store.as_ref(), None).clear(config, &id, now).await.map_err(not_found)?;
            super::record(store.as_ref(), "profile.clear", id.as_str(), (None, Some(json!({"cleared": true})))).await?;
            println!("cleared cooldown and disabled state of {id}");
            Ok(())
        }
        ProfilesCommand::Order { provider, ids, reset } => order(config, &provider, ids, reset).await,
    }
}

async fn clear_model(config: &Config, model_ref: &str) -> Result<()> {
    let Some((provider, model)) = crate::engine::chain::split_model_ref(model_ref) else {
        bail!("`{model_ref}` is not a provider/model reference");
    };
    let store = existing(config).await?;
    let now = chrono::Utc::now().timestamp_millis();
    let key = (provider.to_string(), model.to_string());
    let active = store.snapshot().await?.model_cooldowns.get(&key).is_some_and(|m| now < m.until);
    if active {
        store.apply(&[], &[(key, vec![ModelChange::Ended(now)])], &[], &config.cooldown_policy()).await?;
        let was = (Some(json!({"cooling": true})), Some(json!({"cooling": false})));
        super::record(store.as_ref(), "model.clear", model_ref, was).await?;
        println!("cleared the cooldown of {model_ref}");
    } else {
        println!("{model_ref} has no active cooldown");
    }
    Ok(())
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

async fn add(
    config: &Config,
    provider: &str,
    (name, client_id): (Option<String>, Option<String>),
    kind: &str,
    expires: Option<&str>,
) -> Result<()> {
    let now = chrono::Utc::now().timestamp_millis();
    let (name, raw) = match (kind, name, client_id) {
        ("client_credentials", Some(n), Some(c)) if n != c => {
            bail!("--name `{n}` and --client-id `{c}` differ: a client_credentials profile is named by its client id")
        }
        (_, Some(n), _) => (n, None),
        ("client_credentials", None, Some(c)) => (c, None),
        (_, None, Some(_)) => bail!("--client-id is for --type client_credentials; give --name LABEL"),
        ("service_account", None, None) => {
            // Named after the key's account: the key is read first.
            let raw = read_secret(kind)?;
            let key = crate::oauth::service_account::Key::parse(secrecy::ExposeSecret::expose_secret(&raw))
                .map_err(|e| anyhow::anyhow!("{e}: nothing was added (read from stdin)"))?;
            (key.client_email, Some(raw))
        }
        ("client_credentials", None, None) => bail!("give the client id: --client-id ID"),
        (_, None, None) => bail!("give the profile's name: --name LABEL (its id is PROVIDER:LABEL)"),
    };
    let new = rules::check_new(config, provider, &name, kind, expires, now).map_err(anyhow::Error::msg)?;
    let raw = match raw {
        Some(raw) => raw,
        None => read_secret(kind)?,
    };
    let cc = config.providers.get(provider).and_then(|p| p.client_credentials.as_ref());
    let allow = cc.and_then(|c| c.allow_token_uri.as_deref());
    let secret = rules::check_secret(secrecy::ExposeSecret::expose_secret(&raw), new.kind, new.id.name(), allow)
        .map_err(|e| anyhow::anyhow!("{e} (read from stdin)"))?;
    let store = open(config).await?;
    let (key, origin) =
        resolve_key(&crate::store::key_anchor(config)?, &store.secret_key_ids().await?, config.secrets.keyring)?;
    let sealed = key.seal(&new.id, new.field, &secret);
    let profile = StoredProfile::stored(new.id.clone(), new.kind, new.expires_at, now);
    let credential = Credential::new(new.kind, secret);
    Changes::new(store.as_ref(), None).add(&profile, &[sealed], credential).await.map_err(|e| match e {
        StoreError::Duplicate(id) => {
            anyhow::anyhow!("profile {id} already exists; remove it first or choose another --name")
        }
        other => other.into(),
    })?;
    let added = json!({"type": new.kind.to_string(), "enabled": true, "expires_at": new.expires_at});
    super::record(store.as_ref(), "profile.add", new.id.as_str(), (None, Some(added))).await?;
    println!("added {} ({}); secret sealed with key {} from {origin}", new.id, new.kind, key.id());
    Ok(())
}

/// Reads the secret of a profile of `kind` from stdin, unchecked (see `rules::check_secret`).
fn read_secret(kind: &str) -> Result<SecretString> {
    let mut stdin = std::io::stdin();
    if stdin.is_terminal() {
        let what = match kind {
            "token" => "token",
            "client_credentials" => "client secret",
            "service_account" => "service account key (its JSON)",
            _ => "API key",
        };
        eprintln!(
            "Paste the {what}, then press Enter and Ctrl-D (or pipe it: `printf %s \"$KEY\" | rota profiles add …`):"
        );
    }
    let mut raw = String::new();
    stdin.read_to_string(&mut raw).context("reading the secret from stdin")?;
    Ok(SecretString::from(raw))
}

async fn set_enabled(config: &Config, id: &str, enabled: bool) -> Result<()> {
    let id = parse_id(id)?;
    let store = existing(config).await?;
    Changes::new(store.as_ref(), None).set_enabled(&id, enabled).await.map_err(not_found)?;
    let (action, was) = match enabled {
        true => ("profile.enable", (Some(json!({"enabled": false})), Some(json!({"enabled": true})))),
        false => ("profile.disable", (Some(json!({"enabled": true})), Some(json!({"enabled": false})))),
    };
    super::record(store.as_ref(), action, id.as_str(), was).await?;
    println!("{} {id}", if enabled { "enabled" } else { "disabled" });
    Ok(())
}

async fn set_paid(config: &Config, id: &str, paid: bool) -> Result<()> {
    let id = parse_id(id)?;
    if !paid && config.auth.profiles.get(&id).is_some_and(|p| p.paid) {
        bail!("profile {id} is declared `paid = true` in the config file; change it there");
    }
    let store = existing(config).await?;
    Changes::new(store.as_ref(), None).set_paid(&id, paid).await.map_err(not_found)?;
    super::record(
        store.as_ref(),
        "profile.paid",
        id.as_str(),
        (Some(json!({"paid": !paid})), Some(json!({"paid": paid}))),
    )
    .await?;
    println!("{id} is {}", if paid { "paid: a request it serves raises the `paid` alert" } else { "no longer paid" });
    Ok(())
}

async fn list(config: &Config, as_json: bool, provider: Option<String>) -> Result<()> {
    let store = existing(config).await?;
    let snap = store.snapshot().await?;
    let roster = Roster::new(&snap, config);
    let now = chrono::Utc::now().timestamp_millis();
    let origin = |id: &ProfileId| if config.auth.profiles.contains_key(id) { Origin::Config } else { Origin::Stored };
    // Provider by provider, each in the order rotation tries them now (as GET /api/v1/providers
    // says), with its place in that order and the one the next request gets.
    let mut providers: Vec<&str> = roster.views.keys().map(ProfileId::provider).collect();
    providers.sort_unstable();
    providers.dedup();
    let mut rows: Vec<(ProfileId, usize, bool)> = Vec::new();
    for name in providers.into_iter().filter(|p| provider.as_deref().is_none_or(|want| *p == want)) {
        let rotation = Rotation::of(config, &roster, name, now);
        let next = rotation.next.clone();
        rows.extend(rotation.order.into_iter().enumerate().map(|(i, id)| {
            let is_next = next.as_ref() == Some(&id);
            (id, i + 1, is_next)
        }));
    }
    if as_json {
        let out: Vec<_> = rows
            .iter()
            .map(|(id, place, next)| {
                let v = &roster.views[id];
                json!({
                    "id": id, "provider": id.provider(), "type": v.kind, "source": origin(id).as_str(),
                    "enabled": v.enabled, "paid": roster.is_paid(config, id), "status": Status::of(v, now), "expires_at": v.expires_at,
                    "usage_stats": v.stats, "position": place, "next": next,
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
        "{:>3}  {:<32} {:<8} {:<7} {:<20} {:>6} {:>8} {:>8}  STATE",
        "#", "ID", "TYPE", "SOURCE", "LAST USED", "ERRORS", "SUCCESS", "FAILURES"
    );
    for (id, place, next) in &rows {
        let v = &roster.views[id];
        let last = v.stats.last_used.map(time).unwrap_or_else(|| "never".into());
        println!(
            "{:>3}  {:<32} {:<8} {:<7} {:<20} {:>6} {:>8} {:>8}  {}",
            place,
            id.as_str(),
            v.kind.as_str(),
            origin(id).as_str(),
            last,
            v.stats.error_count,
            v.stats.success_count,
            v.stats.failure_total,
            Status::of(v, now).display(now)
                + if roster.is_paid(config, id) { " (paid)" } else { "" }
                + if *next { " (the next request's)" } else { "" }
        );
    }
    Ok(())
}

async fn order(config: &Config, provider: &str, raw_ids: Vec<String>, reset: bool) -> Result<()> {
    rules::known_provider(config, provider).map_err(anyhow::Error::msg)?;
    let store = existing(config).await?;
    if reset {
        Changes::new(store.as_ref(), None).set_order(provider, None).await?;
        super::record(store.as_ref(), "provider.order_reset", provider, (None, Some(json!({"order": null})))).await?;
        println!("removed the stored order of {provider}");
        return Ok(());
    }
    let snap = store.snapshot().await?;
    let roster = Roster::new(&snap, config);
    if raw_ids.is_empty() {
        let source = match rules::order_in_force(config, &roster, provider) {
            ("stored", ids) => ("stored order", ids),
            ("config", ids) => ("config file order", ids),
            (_, ids) => ("round robin (least recently used first)", ids),
        };
        println!("{provider}: {}", source.0);
        for id in source.1 {
            println!("  {id}");
        }
        return Ok(());
    }
    let ids = rules::check_order(config, &roster, provider, &raw_ids).map_err(anyhow::Error::msg)?;
    Changes::new(store.as_ref(), None).set_order(provider, Some(ids.clone())).await?;
    let order: Vec<&str> = ids.iter().map(ProfileId::as_str).collect();
    super::record(store.as_ref(), "provider.order", provider, (None, Some(json!({"order": order})))).await?;
    println!("{provider}: {}", ids.iter().map(ProfileId::as_str).collect::<Vec<_>>().join(" → "));
    Ok(())
}
