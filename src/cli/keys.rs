//! `rota rotate-key` and `rota login`.

use super::open_store as open;
use crate::config::Config;
use crate::engine::{Change, ProfileType};
use crate::oauth;
use crate::secrets::{
    KeyOrigin, SecretField, check_key, find_key, key_file_for, new_key, pending_key_file, resolve_key, write_key_file,
};
use crate::store::StoredProfile;
use anyhow::{Context, Result, anyhow, bail};
use std::io::{BufRead, IsTerminal};

/// Re-encrypts every secret under a new key, in one transaction. The new key is written to
/// `rota.key.new` first and moved over the key file after the commit, so a crash leaves a key
/// that opens the secrets either way (`resolve_key` adopts the pending one).
pub async fn rotate_key(config: &Config) -> Result<()> {
    let db = crate::store::key_anchor(config)?;
    let store = super::open_existing(config).await?;
    let ids = store.secret_key_ids().await?;
    let (keyring, _) = crate::keyring::open(config.secrets.keyring, &db).map_err(|e| anyhow!(e))?;
    let (old, origin) = find_key(&db, keyring.as_ref())?.ok_or_else(|| {
        anyhow!("no master key found (ROTA_MASTER_KEY, the keyring or {})", key_file_for(&db).display())
    })?;
    check_key(&old, &origin, &ids)?;
    let snapshot = store.snapshot().await?;
    let (new, text) = new_key();
    let mut rows = Vec::new();
    for (id, sealed) in &snapshot.secrets {
        for s in sealed {
            let plain = old.open(id, s).with_context(|| format!("opening {id} {}", s.field.as_str()))?;
            rows.push((id.clone(), new.seal(id, s.field, &plain)));
        }
    }
    // Where the new key goes: over the key file, or (for the keyring and the environment) a
    // file that guards the rotation until the new key is in place.
    let target = match &origin {
        KeyOrigin::File(f) | KeyOrigin::NewFile(f) => f.clone(),
        KeyOrigin::Keyring(_) | KeyOrigin::NewKeyring(_) => key_file_for(&db),
        KeyOrigin::Env => db.with_extension("key.rotated"),
    };
    let pending = pending_key_file(&target);
    if pending.exists() {
        bail!(
            "{} exists: an earlier rotation was interrupted; move it away after checking which key opens the secrets",
            pending.display()
        );
    }
    write_key_file(&pending, &text)?;
    if let Err(e) = store.reseal_all(&rows).await {
        let _ = std::fs::remove_file(&pending);
        return Err(e).context("re-encrypting the secrets (nothing was changed)");
    }
    if let (KeyOrigin::Keyring(_) | KeyOrigin::NewKeyring(_), Some(k)) = (&origin, &keyring) {
        k.set(&text)
            .map_err(|e| anyhow!("{e}: the new key is in {}; put it in the keyring by hand", pending.display()))?;
        std::fs::remove_file(&pending).with_context(|| format!("removing {}", pending.display()))?;
    } else {
        std::fs::rename(&pending, &target)
            .with_context(|| format!("moving {} to {}", pending.display(), target.display()))?;
    }
    let was =
        (Some(serde_json::json!({"key": old.id()})), Some(serde_json::json!({"key": new.id(), "secrets": rows.len()})));
    super::record(store.as_ref(), "key.rotate", "secrets", was).await?;
    println!("re-encrypted {} secret(s): key {} replaced by key {}", rows.len(), old.id(), new.id());
    match origin {
        KeyOrigin::Keyring(s) | KeyOrigin::NewKeyring(s) => {
            println!("new key in the {s} keyring; the old key no longer opens anything")
        }
        KeyOrigin::Env => println!(
            "the key came from ROTA_MASTER_KEY: set it to the content of {} (0600) before the next start, then delete the file",
            target.display()
        ),
        _ => println!("new key in {}; the old key no longer opens anything", target.display()),
    }
    Ok(())
}

/// `rota login <provider> [--device]`: an OAuth login from the terminal. The device flow prints
/// a code to enter elsewhere; the browser flow needs the provider's `redirect_uri` and reads
/// the address the browser ended on from stdin.
pub async fn login(config: &Config, provider: &str, device: bool) -> Result<()> {
    let cfg = config
        .providers
        .get(provider)
        .ok_or_else(|| anyhow!("unknown provider `{provider}`"))?
        .oauth
        .as_ref()
        .ok_or_else(|| anyhow!("provider {provider} has no [providers.{provider}.oauth] section"))?;
    let http = oauth::Http::default();
    let now = || chrono::Utc::now().timestamp_millis();
    let granted = if device {
        let d = oauth::device(&http, provider, cfg, now).await?;
        let link = d.verification_uri_complete.unwrap_or(d.verification_uri);
        eprintln!("Open {link}\nand enter the code {}\nWaiting for the login…", d.user_code);
        d.finish.await?
    } else {
        let redirect = cfg.redirect_uri.as_deref().ok_or_else(|| {
            anyhow!("[providers.{provider}.oauth] has no redirect_uri: use `rota login {provider} --device` or the web console")
        })?;
        let (url, pending) = oauth::authorize(provider, cfg, redirect, now())?;
        eprintln!("Open this address, sign in, then paste the address the browser ends on ({redirect}?code=…):\n{url}");
        if std::io::stdin().is_terminal() {
            eprint!("> ");
        }
        let mut line = String::new();
        std::io::stdin().lock().read_line(&mut line).context("reading the pasted address")?;
        let code = oauth::code_from_pasted(&line, &pending.state).map_err(|e| anyhow!(e))?;
        oauth::exchange(&http, cfg, pending, &code, now()).await?
    };
    let account = oauth::account(&http, cfg, &granted).await;
    let store = open(config).await?;
    let id = crate::api::oauth::login_target(store.as_ref(), provider, &account).await?;
    let (key, _) =
        resolve_key(&crate::store::key_anchor(config)?, &store.secret_key_ids().await?, config.secrets.keyring)?;
    let mut sealed = vec![key.seal(&id, SecretField::AccessToken, &granted.access)];
    if let Some(r) = &granted.refresh {
        sealed.push(key.seal(&id, SecretField::RefreshToken, r));
    }
    let mut profile = StoredProfile::stored(id.clone(), ProfileType::OAuth, granted.expires_at, now());
    profile.email = account.email;
    profile.oauth_subject = account.subject;
    let added = store.save_login(&profile, &sealed).await?;
    // A new login ends "needs re-login" and any cooldown.
    store.apply(&[(id.clone(), vec![Change::Cleared(now())])], &[], &[], &config.cooldown_policy()).await?;
    let after = serde_json::json!({"type": "oauth", "added": added, "expires_at": granted.expires_at});
    super::record(store.as_ref(), "profile.login", id.as_str(), (None, Some(after))).await?;
    println!(
        "{} {id}{}",
        if added { "added" } else { "updated" },
        if granted.refresh.is_none() {
            " (no refresh token: it will need a new login when the access token expires)"
        } else {
            ""
        }
    );
    Ok(())
}
