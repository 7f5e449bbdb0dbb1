//! `rota import openclaw FILE` and `rota export openclaw --output FILE`.

use super::open_store as open;
use crate::cli::openclaw::{self, File};
use crate::config::Config;
use crate::secrets::{check_key, find_key_with, resolve_key};
use crate::store::StoreError;
use anyhow::{Context, Result, anyhow};
use std::io::Write;
use std::path::Path;

pub async fn import(config: &Config, path: &Path) -> Result<()> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let file: File = serde_json::from_str(&text)
        .with_context(|| format!("{} is not an OpenClaw auth-profiles.json", path.display()))?;
    let store = open(config).await?;
    let (key, _) =
        resolve_key(&crate::store::key_anchor(config)?, &store.secret_key_ids().await?, config.secrets.keyring)?;
    let now = chrono::Utc::now().timestamp_millis();
    let (profiles, orders) = openclaw::import(&file, &key, |p| config.has_provider(p), now)
        .map_err(|e| anyhow!("{}: {e}; nothing was imported", path.display()))?;
    let rows: Vec<_> = profiles.into_iter().map(|i| (i.profile, i.secrets, i.stats)).collect();
    store.import(&rows, &orders).await.map_err(|e| match e {
        StoreError::Duplicate(id) => anyhow!("profile {id} already exists; nothing was imported"),
        other => other.into(),
    })?;
    for (profile, ..) in &rows {
        let after = serde_json::json!({"type": profile.kind.to_string(), "from": "openclaw"});
        super::record(store.as_ref(), "profile.add", profile.id.as_str(), (None, Some(after))).await?;
    }
    println!("imported {} profile(s) and {} order(s) from {}", rows.len(), orders.len(), path.display());
    Ok(())
}

/// Writes the file with mode 0600: it holds every stored secret in the clear.
pub async fn export(config: &Config, output: &Path) -> Result<()> {
    let db = crate::store::key_anchor(config)?;
    let store = super::open_existing(config).await?;
    let ids = store.secret_key_ids().await?;
    let (key, origin) = find_key_with(&db, config.secrets.keyring)?
        .ok_or_else(|| anyhow!("no key can open the stored secrets: set ROTA_MASTER_KEY"))?;
    check_key(&key, &origin, &ids)?;
    let file = openclaw::export(&store.snapshot().await?, &key).map_err(|e| anyhow!(e))?;
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut opts, 0o600);
    let mut out =
        opts.open(output).with_context(|| format!("creating {} (it must not exist yet)", output.display()))?;
    out.write_all(serde_json::to_string_pretty(&file)?.as_bytes())?;
    println!("exported {} profile(s) to {} (mode 0600: it holds the secrets)", file.profiles.len(), output.display());
    Ok(())
}
