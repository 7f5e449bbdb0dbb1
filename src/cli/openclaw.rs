//! OpenClaw interop: `auth-profiles.json` in and out (profiles, order and usageStats), so teams
//! can move to rota and back.
//!
//! The file holds `{version, profiles, order?, lastGood?, usageStats?}`; a profile is
//! `{type: "api_key", provider, key}`, `{type: "token", provider, token, expires?}` or
//! `{type: "oauth", provider, access, refresh, expires}`, each with an optional `email`.

use crate::engine::{Cooldown, Disabled, Millis, ProfileId, ProfileType, Reason, UsageStats};
use crate::secrets::{MasterKey, Sealed, SecretField};
use crate::store::{Origin, Snapshot, StoredProfile};
use secrecy::{ExposeSecret, SecretString};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

#[derive(Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct File {
    #[serde(default = "one")]
    pub version: u32,
    pub profiles: BTreeMap<String, Credential>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub order: BTreeMap<String, Vec<String>>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub usage_stats: BTreeMap<String, Stats>,
}

fn one() -> u32 {
    1
}

#[derive(Debug, Deserialize, Serialize, PartialEq)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Credential {
    ApiKey {
        provider: String,
        key: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        email: Option<String>,
    },
    Token {
        provider: String,
        token: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        expires: Option<Millis>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        email: Option<String>,
    },
    #[serde(rename = "oauth")]
    OAuth {
        provider: String,
        access: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        refresh: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        expires: Option<Millis>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        email: Option<String>,
    },
}

#[derive(Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Stats {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_used: Option<Millis>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cooldown_until: Option<Millis>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disabled_until: Option<Millis>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disabled_reason: Option<String>,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub error_count: u32,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub failure_counts: BTreeMap<String, u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_failure_at: Option<Millis>,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// OpenClaw reason names that differ from rota's.
fn reason(name: &str) -> Reason {
    match name {
        "auth_permanent" | "auth-permanent" => Reason::AuthPermanent,
        "model_not_found" => Reason::ModelNotFound,
        other => other.parse().unwrap_or(Reason::Unknown),
    }
}

/// Explicit orders by provider.
pub type Orders = BTreeMap<String, Vec<ProfileId>>;

/// One profile ready to store.
pub struct Imported {
    pub profile: StoredProfile,
    pub secrets: Vec<Sealed>,
    pub stats: UsageStats,
}

/// Checks and converts a file: every id well-formed and of a configured provider, matching its
/// `provider` field. Nothing is written here; the caller stores all or nothing.
pub fn import(
    file: &File,
    key: &MasterKey,
    known_provider: impl Fn(&str) -> bool,
    now: Millis,
) -> Result<(Vec<Imported>, Orders), String> {
    let mut out = Vec::new();
    for (raw, cred) in &file.profiles {
        let id: ProfileId = raw.parse().map_err(|e| format!("profiles.\"{raw}\": {e}"))?;
        let (provider, kind, fields, expires, email) = match cred {
            Credential::ApiKey { provider, key, email } => {
                (provider, ProfileType::ApiKey, vec![(SecretField::ApiKey, key)], None::<Millis>, email)
            }
            Credential::Token { provider, token, expires, email } => {
                (provider, ProfileType::Token, vec![(SecretField::Token, token)], *expires, email)
            }
            Credential::OAuth { provider, access, refresh, expires, email } => {
                let mut f = vec![(SecretField::AccessToken, access)];
                f.extend(refresh.iter().map(|r| (SecretField::RefreshToken, r)));
                (provider, ProfileType::OAuth, f, *expires, email)
            }
        };
        if provider != id.provider() {
            return Err(format!("profiles.\"{raw}\": provider `{provider}` does not match the id"));
        }
        if !known_provider(provider) {
            return Err(format!(
                "profiles.\"{raw}\": unknown provider `{provider}` (configure [providers.{provider}] first)"
            ));
        }
        if fields.iter().any(|(_, s)| s.trim().is_empty()) {
            return Err(format!("profiles.\"{raw}\": empty secret"));
        }
        if let Some(bad) = fields.iter().find_map(|(_, s)| crate::secrets::invisible(s)) {
            return Err(format!("profiles.\"{raw}\": the secret contains {bad} (a secret is visible ASCII)"));
        }
        let secrets = fields.iter().map(|(f, s)| key.seal(&id, *f, &SecretString::from(s.to_string()))).collect();
        let stats = file.usage_stats.get(raw).map(to_stats).unwrap_or_default();
        let profile = StoredProfile { email: email.clone(), ..StoredProfile::stored(id, kind, expires, now) };
        out.push(Imported { profile, secrets, stats });
    }
    let mut order = BTreeMap::new();
    for (provider, ids) in &file.order {
        let ids: Vec<ProfileId> = ids
            .iter()
            .map(|i| i.parse().map_err(|e| format!("order.{provider}: {e}")))
            .collect::<Result<_, String>>()?;
        order.insert(provider.clone(), ids);
    }
    Ok((out, order))
}

fn to_stats(s: &Stats) -> UsageStats {
    let failure_counts: BTreeMap<Reason, u32> = s.failure_counts.iter().map(|(k, v)| (reason(k), *v)).collect();
    // OpenClaw keeps no cooldown reason: the most counted failure stands for it.
    let dominant = failure_counts.iter().max_by_key(|(_, n)| **n).map_or(Reason::RateLimit, |(r, _)| *r);
    UsageStats {
        last_used: s.last_used,
        // OpenClaw's ladder step is its errorCount.
        cooldowns: Vec::from_iter(s.cooldown_until.map(|until| Cooldown {
            until,
            reason: dominant,
            model: None,
            step: s.error_count.clamp(1, 4),
            opened_at: s.last_failure_at.unwrap_or(until),
        })),
        disabled: s.disabled_reason.as_deref().map(|r| Disabled { until: s.disabled_until, reason: reason(r) }),
        error_count: s.error_count,
        failure_counts,
        last_failure_at: s.last_failure_at,
        ..Default::default()
    }
}

/// The stored profiles (not the config file's, whose secrets live in the environment) as an
/// OpenClaw file, secrets decrypted.
pub fn export(snapshot: &Snapshot, key: &MasterKey) -> Result<File, String> {
    let mut file = File { version: 1, ..Default::default() };
    for p in snapshot.profiles.iter().filter(|p| p.origin == Origin::Stored) {
        let secret = |field: SecretField| -> Result<Option<String>, String> {
            let sealed = snapshot.secrets.get(&p.id).and_then(|v| v.iter().find(|s| s.field == field));
            sealed
                .map(|s| key.open(&p.id, s).map(|v| v.expose_secret().to_string()).map_err(|e| e.to_string()))
                .transpose()
        };
        let provider = p.id.provider().to_string();
        let email = p.email.clone();
        let cred = match p.kind {
            ProfileType::ApiKey => {
                Credential::ApiKey { provider, key: secret(SecretField::ApiKey)?.unwrap_or_default(), email }
            }
            ProfileType::Token => Credential::Token {
                provider,
                token: secret(SecretField::Token)?.unwrap_or_default(),
                expires: p.expires_at,
                email,
            },
            ProfileType::OAuth => Credential::OAuth {
                provider,
                access: secret(SecretField::AccessToken)?.unwrap_or_default(),
                refresh: secret(SecretField::RefreshToken)?,
                expires: p.expires_at,
                email,
            },
            // OpenClaw has no service identities: rota keeps them.
            ProfileType::ClientCredentials | ProfileType::ServiceAccount => continue,
        };
        file.profiles.insert(p.id.to_string(), cred);
        if let Some(s) = snapshot.stats.get(&p.id).filter(|s| **s != UsageStats::default()) {
            file.usage_stats.insert(p.id.to_string(), from_stats(s));
        }
    }
    for (provider, ids) in &snapshot.orders {
        file.order.insert(provider.clone(), ids.iter().map(ProfileId::to_string).collect());
    }
    Ok(file)
}

fn from_stats(s: &UsageStats) -> Stats {
    Stats {
        last_used: s.last_used,
        cooldown_until: s.cooldowns.iter().map(|c| c.until).max(),
        disabled_until: s.disabled.as_ref().and_then(|d| d.until),
        disabled_reason: s.disabled.as_ref().map(|d| d.reason.to_string()),
        error_count: s.error_count,
        failure_counts: s.failure_counts.iter().map(|(r, n)| (r.to_string(), *n)).collect(),
        last_failure_at: s.last_failure_at,
    }
}
