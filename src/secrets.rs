//! Secrets at rest: the key-encryption key and the sealing of each secret (docs/gateway.md, "Secrets").
//!
//! Each secret is sealed with XChaCha20-Poly1305 under the master key; the associated data is
//! `rota/v1|<profile id>|<field>|<key id>`, so a ciphertext moved to another profile or field,
//! or opened with another key, fails to decrypt instead of yielding the wrong secret.

use crate::engine::ProfileId;
pub use crate::keyring::Choice;
use crate::keyring::Keyring;
use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use chacha20poly1305::aead::{Aead, AeadCore, KeyInit, OsRng, Payload};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};
use secrecy::{ExposeSecret, SecretString};
use sha2::{Digest, Sha256};
use std::fmt;
use std::io::Write;
use std::path::{Path, PathBuf};

pub const MASTER_KEY_ENV: &str = "ROTA_MASTER_KEY";

/// Which secret of a profile a ciphertext holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SecretField {
    ApiKey,
    Token,
    AccessToken,
    RefreshToken,
    /// A `client_credentials` profile's OAuth client secret.
    ClientSecret,
    /// A `service_account` profile's JSON key.
    ServiceAccountKey,
}

impl SecretField {
    pub fn as_str(self) -> &'static str {
        match self {
            SecretField::ApiKey => "api_key",
            SecretField::Token => "token",
            SecretField::AccessToken => "access_token",
            SecretField::RefreshToken => "refresh_token",
            SecretField::ClientSecret => "client_secret",
            SecretField::ServiceAccountKey => "service_account_key",
        }
    }

    /// Whether this field's nonce is the version of a profile's tokens, compared before a
    /// refresh stores new ones: the refresh token (rotated by each refresh), or a client's secret
    /// or service account key (each sealed again with each access token).
    pub fn versions_tokens(self) -> bool {
        matches!(self, SecretField::RefreshToken | SecretField::ClientSecret | SecretField::ServiceAccountKey)
    }

    pub fn parse(s: &str) -> Option<SecretField> {
        [
            SecretField::ApiKey,
            SecretField::Token,
            SecretField::AccessToken,
            SecretField::RefreshToken,
            SecretField::ClientSecret,
            SecretField::ServiceAccountKey,
        ]
        .into_iter()
        .find(|f| f.as_str() == s)
    }
}

/// A secret as stored: only ciphertext.
#[derive(Clone, PartialEq, Eq)]
pub struct Sealed {
    pub field: SecretField,
    pub key_id: String,
    pub nonce: Vec<u8>,
    pub ciphertext: Vec<u8>,
}

impl fmt::Debug for Sealed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Sealed({}, key {})", self.field.as_str(), self.key_id)
    }
}

/// The key-encryption key. Its `Debug` shows only the key id.
pub struct MasterKey {
    id: String,
    cipher: XChaCha20Poly1305,
}

impl fmt::Debug for MasterKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "MasterKey({})", self.id)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error(
        "{MASTER_KEY_ENV} is not a valid key: expected 32 bytes in base64 (make one with `head -c 32 /dev/urandom | base64`)"
    )]
    BadEnv,
    #[error("key file {0} is not a valid key: expected 32 bytes in base64")]
    BadFile(PathBuf),
    #[error("cannot {action} key file {path}: {source}")]
    Io { action: &'static str, path: PathBuf, source: std::io::Error },
    #[error(
        "the database holds encrypted secrets (key id {ids}) but no key is available: set {MASTER_KEY_ENV} to the key that sealed them, or put its key file back at {file}. rota will not create a new key, because the stored secrets could then never be read."
    )]
    Missing { ids: String, file: PathBuf },
    #[error(
        "the database's secrets were sealed with key id {stored}, but the key from {origin} has id {found}: set {MASTER_KEY_ENV} to the key that sealed them (or restore that key file)"
    )]
    Mismatch { stored: String, found: String, origin: String },
    #[error("{0}")]
    Keyring(String),
    #[error("the {0} keyring holds something that is not a valid key")]
    BadKeyring(&'static str),
}

#[derive(Debug, thiserror::Error)]
#[error("cannot decrypt the {field} of profile {profile}: the ciphertext does not match this profile, field and key")]
pub struct OpenError {
    pub profile: String,
    pub field: &'static str,
}

/// Where the master key came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeyOrigin {
    Env,
    /// The OS keyring (its store's name).
    Keyring(&'static str),
    /// A key created at this start in the OS keyring.
    NewKeyring(&'static str),
    File(PathBuf),
    /// A key file created at this start.
    NewFile(PathBuf),
}

impl fmt::Display for KeyOrigin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeyOrigin::Env => write!(f, "{MASTER_KEY_ENV}"),
            KeyOrigin::Keyring(s) => write!(f, "the {s} keyring"),
            KeyOrigin::NewKeyring(s) => write!(f, "a new key in the {s} keyring"),
            KeyOrigin::File(p) => write!(f, "key file {}", p.display()),
            KeyOrigin::NewFile(p) => write!(f, "new key file {}", p.display()),
        }
    }
}

impl MasterKey {
    pub fn from_bytes(bytes: &[u8; 32]) -> MasterKey {
        let digest = Sha256::new().chain_update(b"rota key id\0").chain_update(bytes).finalize();
        let id = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
        MasterKey { id, cipher: XChaCha20Poly1305::new(bytes.into()) }
    }

    fn decode(text: &str) -> Option<MasterKey> {
        let t = text.trim();
        let bytes = STANDARD.decode(t).or_else(|_| URL_SAFE_NO_PAD.decode(t.trim_end_matches('='))).ok()?;
        let arr: [u8; 32] = bytes.try_into().ok()?;
        Some(MasterKey::from_bytes(&arr))
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    fn aad(&self, profile: &ProfileId, field: SecretField) -> Vec<u8> {
        format!("rota/v1|{profile}|{}|{}", field.as_str(), self.id).into_bytes()
    }

    pub fn seal(&self, profile: &ProfileId, field: SecretField, secret: &SecretString) -> Sealed {
        let nonce = XChaCha20Poly1305::generate_nonce(&mut OsRng);
        let aad = self.aad(profile, field);
        let ciphertext = self
            .cipher
            .encrypt(&nonce, Payload { msg: secret.expose_secret().as_bytes(), aad: &aad })
            .expect("XChaCha20-Poly1305 encryption cannot fail for in-memory buffers");
        Sealed { field, key_id: self.id.clone(), nonce: nonce.to_vec(), ciphertext }
    }

    pub fn open(&self, profile: &ProfileId, sealed: &Sealed) -> Result<SecretString, OpenError> {
        let err = || OpenError { profile: profile.to_string(), field: sealed.field.as_str() };
        if sealed.key_id != self.id || sealed.nonce.len() != 24 {
            return Err(err());
        }
        let aad = self.aad(profile, sealed.field);
        let plain = self
            .cipher
            .decrypt(XNonce::from_slice(&sealed.nonce), Payload { msg: &sealed.ciphertext, aad: &aad })
            .map_err(|_| err())?;
        String::from_utf8(plain).map(SecretString::from).map_err(|_| err())
    }
}

/// The key file that belongs to a database file: `rota.db` → `rota.key`, same folder.
pub fn key_file_for(db_path: &Path) -> PathBuf {
    db_path.with_extension("key")
}

/// The master key from `ROTA_MASTER_KEY`, the keyring or the key file beside the database, in
/// that order, if any is there. Creates nothing.
pub fn find_key(db_path: &Path, keyring: Option<&Keyring>) -> Result<Option<(MasterKey, KeyOrigin)>, KeyError> {
    if let Ok(v) = std::env::var(MASTER_KEY_ENV).map(|v| v.trim().to_string())
        && !v.is_empty()
    {
        return Ok(Some((MasterKey::decode(&v).ok_or(KeyError::BadEnv)?, KeyOrigin::Env)));
    }
    if let Some(k) = keyring
        && let Some(text) = k.get().map_err(KeyError::Keyring)?
    {
        return Ok(Some((MasterKey::decode(&text).ok_or(KeyError::BadKeyring(k.store))?, KeyOrigin::Keyring(k.store))));
    }
    let file = key_file_for(db_path);
    if !file.exists() {
        return Ok(None);
    }
    let text =
        std::fs::read_to_string(&file).map_err(|source| KeyError::Io { action: "read", path: file.clone(), source })?;
    let key = MasterKey::decode(&text).ok_or_else(|| KeyError::BadFile(file.clone()))?;
    owner_only(&file);
    Ok(Some((key, KeyOrigin::File(file))))
}

/// Makes a key file readable by its owner only when it is more open than that (one copied with
/// a loose umask, or made by hand), and says so.
fn owner_only(file: &Path) {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let Ok(meta) = std::fs::metadata(file) else { return };
        let mode = meta.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            match std::fs::set_permissions(file, std::fs::Permissions::from_mode(0o600)) {
                Ok(()) => tracing::warn!(file = %file.display(), "the key file was mode {mode:o}; it is now 0600"),
                Err(e) => {
                    tracing::warn!(file = %file.display(), error = %e, "the key file is mode {mode:o} and could not be made 0600")
                }
            }
        }
    }
    #[cfg(not(unix))]
    let _ = file;
}

/// `find_key` with the keyring `choice` opens (creates nothing).
pub fn find_key_with(db_path: &Path, choice: Choice) -> Result<Option<(MasterKey, KeyOrigin)>, KeyError> {
    let (keyring, _) = crate::keyring::open(choice, db_path).map_err(KeyError::Keyring)?;
    find_key(db_path, keyring.as_ref())
}

/// Checks that `key` sealed every stored secret.
pub fn check_key(key: &MasterKey, origin: &KeyOrigin, stored_key_ids: &[String]) -> Result<(), KeyError> {
    match stored_key_ids.iter().find(|id| *id != key.id()) {
        Some(other) => {
            Err(KeyError::Mismatch { stored: other.clone(), found: key.id().to_string(), origin: origin.to_string() })
        }
        None => Ok(()),
    }
}

/// The file a rotation writes its new key to before it re-seals: `rota.key` → `rota.key.new`.
pub fn pending_key_file(key_file: &Path) -> PathBuf {
    let mut s = key_file.as_os_str().to_owned();
    s.push(".new");
    PathBuf::from(s)
}

/// A new random key, and its text form for a key file or `ROTA_MASTER_KEY`.
pub fn new_key() -> (MasterKey, String) {
    let bytes: [u8; 32] = XChaCha20Poly1305::generate_key(&mut OsRng).into();
    (MasterKey::from_bytes(&bytes), STANDARD.encode(bytes))
}

/// Writes a key to a new `0600` file (it must not exist), synced to disk.
pub fn write_key_file(path: &Path, text: &str) -> Result<(), KeyError> {
    let io = |action, source| KeyError::Io { action, path: path.to_path_buf(), source };
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut opts, 0o600);
    let mut f = opts.open(path).map_err(|e| io("create", e))?;
    f.write_all(format!("{text}\n").as_bytes()).map_err(|e| io("write", e))?;
    f.sync_all().map_err(|e| io("write", e))
}

/// Finds the master key: `ROTA_MASTER_KEY`, else the OS keyring (per `[secrets] keyring`), else
/// the key file beside the database; else makes a new one, in the keyring when one is in use,
/// else in a new `0600` key file — but never a new key while the database holds secrets sealed
/// by another. A rotation interrupted after it re-sealed leaves the new key in `rota.key.new`:
/// it is adopted when it is the key the secrets need.
pub fn resolve_key(
    db_path: &Path,
    stored_key_ids: &[String],
    choice: Choice,
) -> Result<(MasterKey, KeyOrigin), KeyError> {
    let (keyring, why_not) = crate::keyring::open(choice, db_path).map_err(KeyError::Keyring)?;
    match (&keyring, &why_not) {
        (Some(k), _) => {
            tracing::info!(keyring = choice.as_str(), store = k.store, "the OS keyring is in use for the master key")
        }
        (None, Some(why)) => tracing::info!(
            keyring = choice.as_str(),
            "no OS keyring for the master key, so {MASTER_KEY_ENV} or the key file: {why}"
        ),
        (None, None) => tracing::debug!(keyring = choice.as_str(), "the OS keyring is off"),
    }
    let file = key_file_for(db_path);
    let pending = pending_key_file(&file);
    if pending.exists()
        && std::env::var(MASTER_KEY_ENV).is_err()
        && let Ok(text) = std::fs::read_to_string(&pending)
        && let Some(key) = MasterKey::decode(&text)
        && !stored_key_ids.is_empty()
        && stored_key_ids.iter().all(|id| id == key.id())
    {
        let failed = |source| KeyError::Io { action: "adopt", path: pending.clone(), source };
        match &keyring {
            Some(k) if k.get().map_err(KeyError::Keyring)?.is_some() => {
                k.set(text.trim()).map_err(KeyError::Keyring)?;
                std::fs::remove_file(&pending).map_err(failed)?;
            }
            _ => std::fs::rename(&pending, &file).map_err(failed)?,
        }
        tracing::warn!("adopted the key of an interrupted `rota rotate-key`");
    }
    let (key, origin) = match find_key(db_path, keyring.as_ref())? {
        Some(found) => found,
        None if !stored_key_ids.is_empty() => {
            return Err(KeyError::Missing { ids: stored_key_ids.join(", "), file: key_file_for(db_path) });
        }
        None => match &keyring {
            Some(k) => {
                let (key, text) = new_key();
                k.set(&text).map_err(KeyError::Keyring)?;
                (key, KeyOrigin::NewKeyring(k.store))
            }
            None => (create_key_file(&file)?, KeyOrigin::NewFile(file)),
        },
    };
    check_key(&key, &origin, stored_key_ids)?;
    Ok((key, origin))
}

fn create_key_file(path: &Path) -> Result<MasterKey, KeyError> {
    let (key, text) = new_key();
    write_key_file(path, &text)?;
    Ok(key)
}

/// What in `secret` is not visible ASCII, described without echoing the secret.
pub fn invisible(secret: &str) -> Option<&'static str> {
    let c = secret.chars().find(|c| !('!'..='~').contains(c))?;
    Some(if c.is_whitespace() {
        "whitespace"
    } else if c.is_control() {
        "a control character"
    } else {
        "a non-ASCII character"
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(b: u8) -> MasterKey {
        MasterKey::from_bytes(&[b; 32])
    }

    fn id(s: &str) -> ProfileId {
        s.parse().unwrap()
    }

    #[test]
    fn sealed_secret_opens_with_the_same_profile_field_and_key() {
        let k = key(1);
        let s = k.seal(&id("openai:work"), SecretField::ApiKey, &SecretString::from("sk-live-123"));
        assert!(!s.ciphertext.windows(11).any(|w| w == b"sk-live-123"));
        assert_eq!(k.open(&id("openai:work"), &s).unwrap().expose_secret(), "sk-live-123");
    }

    #[test]
    fn ciphertext_is_bound_to_profile_field_and_key() {
        let k = key(1);
        let s = k.seal(&id("openai:work"), SecretField::ApiKey, &SecretString::from("sk-live-123"));
        assert!(k.open(&id("openai:other"), &s).is_err(), "another profile");
        assert!(
            k.open(&id("openai:work"), &Sealed { field: SecretField::Token, ..s.clone() }).is_err(),
            "another field"
        );
        assert!(
            key(2).open(&id("openai:work"), &Sealed { key_id: key(2).id().into(), ..s.clone() }).is_err(),
            "another key"
        );
    }

    #[test]
    fn debug_output_never_shows_key_material() {
        let k = key(7);
        assert_eq!(format!("{k:?}"), format!("MasterKey({})", k.id()));
        let s = k.seal(&id("a:b"), SecretField::ApiKey, &SecretString::from("hunter2"));
        assert!(!format!("{s:?}").contains("hunter2"));
        assert!(!format!("{:?}", SecretString::from("hunter2")).contains("hunter2"));
    }

    #[test]
    fn key_id_is_stable_and_distinct() {
        assert_eq!(key(1).id(), key(1).id());
        assert_ne!(key(1).id(), key(2).id());
        assert_eq!(key(1).id().len(), 16);
    }

    #[cfg(unix)]
    #[test]
    fn a_key_file_found_more_open_than_0600_is_made_0600() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("rota.db");
        let file = key_file_for(&db);
        write_key_file(&file, &new_key().1).unwrap();
        let mode = || std::fs::metadata(&file).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(), 0o600, "created 0600");
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(find_key(&db, None).unwrap().is_some());
        assert_eq!(mode(), 0o600, "found 0644, left 0600");
    }

    #[test]
    fn key_file_sits_beside_the_database() {
        assert_eq!(key_file_for(Path::new("/var/lib/rota/rota.db")), PathBuf::from("/var/lib/rota/rota.key"));
    }
}
