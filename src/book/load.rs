//! The book's first read of the store, and what a snapshot's sealed secrets open to.

use super::state::{Inner, Roster};
use super::sync::{GATHER, Stats, read_feed};
use super::{Book, Credential, Exchange, Shared};
use crate::behind::{self, Writer};
use crate::config::Config;
use crate::engine::{Millis, ProfileId, ProfileType, ProfileView, UsageStats, Views};
use crate::secrets::{MasterKey, OpenError, Sealed, SecretField};
use crate::settings::Live;
use crate::store::{Origin, Snapshot, Store, StoreError, StoredProfile};
use parking_lot::Mutex;
use secrecy::SecretString;
use std::collections::HashMap;
use std::sync::Arc;

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Open(#[from] OpenError),
}

impl Book {
    /// Loads every profile, decrypting stored secrets, and starts the writer and the feed.
    pub async fn load(store: Arc<dyn Store>, live: Live, key: Arc<MasterKey>, now: Millis) -> Result<Book, LoadError> {
        let settings = live.get();
        let config = &settings.config;
        store.sync_config_profiles(&config_rows(config, now)).await?;
        let snapshot = store.snapshot().await?;
        let unsealed = unseal(&snapshot, config, &key)?;
        let inner = Inner::new(settings.clone(), live, unsealed, snapshot.model_cooldowns, snapshot.head);
        let shared = Arc::new(Shared { inner: Mutex::new(inner), key, writer: Writer::new() });
        tokio::spawn(read_feed(Arc::downgrade(&shared), store.clone()));
        let sink = Stats { shared: shared.clone(), batch: store.stats_batch() };
        behind::spawn(shared.writer.clone(), store, sink, GATHER);
        Ok(Book { shared })
    }
}

/// What a snapshot's secrets unseal to: the roster, the credentials and the refresh-token
/// versions.
pub(super) type Unsealed = (Roster, HashMap<ProfileId, Credential>, HashMap<ProfileId, Vec<u8>>);

/// Builds the profile views ordering works on, from what is stored plus the config file.
/// A stored profile has a usable secret when the right sealed field exists (decryption is
/// checked at load); a declared one when its environment variable is set.
pub fn views(snapshot: &Snapshot, config: &Config) -> Views {
    let mut out = Views::default();
    for p in &snapshot.profiles {
        let declared = config.auth.profiles.get(&p.id);
        if p.origin == Origin::Config && declared.is_none() {
            continue; // removed from the config file: its row stays for the audit trail only
        }
        let has_secret = match declared {
            Some(d) => d.secret().is_some(),
            None => stored_secret_usable(p.kind, snapshot.secrets.get(&p.id).map(Vec::as_slice).unwrap_or(&[])),
        };
        let view = ProfileView {
            id: p.id.clone(),
            kind: declared.map_or(p.kind, |d| d.kind),
            enabled: p.enabled,
            has_secret,
            expires_at: declared.map_or(p.expires_at, |d| d.expires.map(|e| e.timestamp_millis())),
            stats: snapshot.stats.get(&p.id).cloned().unwrap_or_default(),
        };
        out.insert(p.id.clone(), view);
    }
    for (id, d) in &config.auth.profiles {
        out.entry(id.clone()).or_insert_with(|| ProfileView {
            id: id.clone(),
            kind: d.kind,
            enabled: true,
            has_secret: d.secret().is_some(),
            expires_at: d.expires.map(|e| e.timestamp_millis()),
            stats: UsageStats::default(),
        });
    }
    out
}

fn stored_secret_usable(kind: ProfileType, sealed: &[crate::secrets::Sealed]) -> bool {
    let has = |f| sealed.iter().any(|s| s.field == f);
    match kind {
        ProfileType::ApiKey => has(SecretField::ApiKey),
        ProfileType::Token => has(SecretField::Token),
        // An OAuth profile with only a refresh token is kept: it will be refreshed.
        ProfileType::OAuth => has(SecretField::AccessToken) || has(SecretField::RefreshToken),
        ProfileType::ClientCredentials => has(SecretField::ClientSecret),
        ProfileType::ServiceAccount => has(SecretField::ServiceAccountKey),
    }
}

/// The profiles the config file declares, as rows for the store.
pub fn config_rows(config: &Config, now: Millis) -> Vec<StoredProfile> {
    config
        .auth
        .profiles
        .iter()
        .map(|(id, p)| StoredProfile {
            id: id.clone(),
            kind: p.kind,
            origin: Origin::Config,
            enabled: true,
            paid: false, // the file's `paid` is read from the config in force
            email: None,
            expires_at: p.expires.map(|e| e.timestamp_millis()),
            created_at: now,
            oauth_subject: None,
        })
        .collect()
}

/// Stored secrets opened on the calling thread at most; more are opened in two halves on two
/// threads: each is an XChaCha20-Poly1305 decryption (about 9,000 instructions), most of a
/// load's work with thousands of profiles (docs/performance.md, "What profiling changed").
const OPEN_ON_ONE_THREAD: usize = 256;

/// Each profile's sealed secrets, opened, by field.
type Opened<'a> = Vec<(&'a ProfileId, HashMap<SecretField, SecretString>)>;

fn open_all<'a>(stored: &[(&'a ProfileId, &'a Vec<Sealed>)], key: &MasterKey) -> Result<Opened<'a>, OpenError> {
    let open = |part: &[(&'a ProfileId, &'a Vec<Sealed>)]| -> Result<Opened<'a>, OpenError> {
        part.iter()
            .map(|&(id, sealed)| {
                Ok((id, sealed.iter().map(|s| Ok((s.field, key.open(id, s)?))).collect::<Result<_, _>>()?))
            })
            .collect()
    };
    if stored.len() <= OPEN_ON_ONE_THREAD {
        return open(stored);
    }
    let (first, second) = stored.split_at(stored.len() / 2);
    std::thread::scope(|scope| {
        let other = scope.spawn(|| open(second));
        let mut opened = open(first)?;
        opened.extend(other.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic))?);
        Ok(opened)
    })
}

/// The stored roster, credentials and refresh-token versions of a snapshot.
pub(super) fn unseal(snapshot: &Snapshot, config: &Config, key: &MasterKey) -> Result<Unsealed, OpenError> {
    let roster = Roster::new(snapshot, config);
    let mut credentials = HashMap::new();
    for (id, p) in config.auth.profiles.iter() {
        if let Some(secret) = p.secret() {
            let c = if p.kind == ProfileType::Token { Credential::Token(secret) } else { Credential::ApiKey(secret) };
            credentials.insert(id.clone(), c);
        }
    }
    let stored: Vec<(&ProfileId, &Vec<Sealed>)> =
        snapshot.secrets.iter().filter(|(id, _)| !config.auth.profiles.contains_key(*id)).collect();
    for (id, mut fields) in open_all(&stored, key)? {
        let c = match roster.views.get(id).map(|v| v.kind) {
            Some(ProfileType::ApiKey) => fields.remove(&SecretField::ApiKey).map(Credential::ApiKey),
            Some(ProfileType::Token) => fields.remove(&SecretField::Token).map(Credential::Token),
            Some(ProfileType::OAuth) => Some(Credential::OAuth {
                access: fields.remove(&SecretField::AccessToken),
                refresh: fields.remove(&SecretField::RefreshToken),
            }),
            Some(kind @ (ProfileType::ClientCredentials | ProfileType::ServiceAccount)) => {
                let how =
                    if kind == ProfileType::ServiceAccount { Exchange::ServiceAccount } else { Exchange::ClientSecret };
                fields.remove(&how.field()).map(|secret| Credential::Client {
                    access: fields.remove(&SecretField::AccessToken),
                    secret,
                    how,
                })
            }
            None => None,
        };
        if let Some(c) = c {
            credentials.insert(id.clone(), c);
        }
    }
    let token_versions = snapshot
        .secrets
        .iter()
        .filter_map(|(id, s)| Some((id.clone(), s.iter().find(|s| s.field.versions_tokens())?.nonce.clone())))
        .collect();
    Ok((roster, credentials, token_versions))
}

#[cfg(test)]
mod tests {
    use super::*;
    use secrecy::ExposeSecret;

    fn sealed(key: &MasterKey, n: usize) -> Vec<(ProfileId, Vec<Sealed>)> {
        (0..n)
            .map(|i| {
                let id: ProfileId = format!("many:k{i:04}").parse().unwrap();
                let secret = SecretString::from(format!("sk-{i}"));
                let s = key.seal(&id, SecretField::ApiKey, &secret);
                (id, vec![s])
            })
            .collect()
    }

    #[test]
    fn many_secrets_open_on_two_threads_each_to_its_own_profile() {
        let key = MasterKey::from_bytes(&[7; 32]);
        for n in [3, OPEN_ON_ONE_THREAD + 1, 2001] {
            let rows = sealed(&key, n);
            let stored: Vec<(&ProfileId, &Vec<Sealed>)> = rows.iter().map(|(id, s)| (id, s)).collect();
            let opened = open_all(&stored, &key).unwrap();
            assert_eq!(opened.len(), n);
            for (i, (id, fields)) in opened.iter().enumerate() {
                assert_eq!(id.to_string(), format!("many:k{i:04}"));
                assert_eq!(fields[&SecretField::ApiKey].expose_secret(), format!("sk-{i}"));
            }
        }
    }

    #[test]
    fn a_secret_that_does_not_open_in_either_half_fails_the_load_naming_its_profile() {
        let key = MasterKey::from_bytes(&[7; 32]);
        for bad in [10, 1500] {
            let mut rows = sealed(&key, 2001);
            rows[bad].1[0].ciphertext[0] ^= 1;
            let stored: Vec<(&ProfileId, &Vec<Sealed>)> = rows.iter().map(|(id, s)| (id, s)).collect();
            let e = open_all(&stored, &key).unwrap_err();
            assert_eq!(e.profile, format!("many:k{bad:04}"));
        }
    }
}
