//! The master key in the OS keyring (docs/gateway.md, "Secrets"), through keyring-core 1.x with
//! explicitly chosen stores, each built only for its platform:
//!
//! - macOS: the Keychain (`apple-native-keyring-store`);
//! - Windows: the Credential Manager (`windows-native-keyring-store`);
//! - Linux: the Secret Service (persistent; needs a DBus session) and the kernel keyutils store
//!   (no DBus needed, but its keys do not survive a reboot, so it is only used when chosen
//!   explicitly).
//!
//! `auto` uses the platform's persistent store when it answers, else nothing (the key file),
//! and says why.

use keyring_core::{Entry, Error};
use serde::Deserialize;
use std::path::Path;
use std::sync::Arc;

/// `[secrets] keyring`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Choice {
    /// The platform's persistent store (macOS: the Keychain; Windows: the Credential Manager;
    /// Linux: the Secret Service when a DBus session offers one), else the key file.
    #[default]
    Auto,
    /// Linux: the Secret Service (GNOME Keyring, KWallet, …) over DBus.
    SecretService,
    /// Linux: the kernel keyutils store: no DBus needed, lost at reboot (keep a copy of the key).
    Keyutils,
    /// macOS: the login Keychain.
    Keychain,
    /// Windows: the Credential Manager.
    CredentialManager,
    /// Never the keyring: `ROTA_MASTER_KEY` or the key file.
    Off,
}

impl Choice {
    pub fn as_str(self) -> &'static str {
        match self {
            Choice::Auto => "auto",
            Choice::SecretService => "secret-service",
            Choice::Keyutils => "keyutils",
            Choice::Keychain => "keychain",
            Choice::CredentialManager => "credential-manager",
            Choice::Off => "off",
        }
    }
}

/// What an operator can do about a store that refuses access.
fn hint(store: &str, e: &Error) -> &'static str {
    match (store, e) {
        ("keyutils", Error::NoStorageAccess(_) | Error::PlatformFailure(_)) => {
            " (the kernel refused the keyctl calls; containers often forbid them: use ROTA_MASTER_KEY or [secrets] keyring = \"off\")"
        }
        ("secret-service", Error::NoStorageAccess(_)) => " (is the login keyring unlocked?)",
        ("keychain", Error::NoStorageAccess(_)) => " (is the login keychain unlocked?)",
        _ => "",
    }
}

/// The keyring entry holding one database's master key.
pub struct Keyring {
    pub store: &'static str,
    entry: Entry,
}

impl std::fmt::Debug for Keyring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Keyring({})", self.store)
    }
}

/// Runs keyring calls on a plain thread: some stores block on their own executor, which must
/// not happen on an async runtime's worker.
fn off_runtime<T: Send>(f: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|s| s.spawn(f).join().expect("keyring thread"))
}

fn entry(store: Arc<keyring_core::CredentialStore>, db: &Path) -> Result<Entry, Error> {
    let user = std::fs::canonicalize(db.parent().unwrap_or(Path::new(".")))
        .map(|d| d.join(db.file_name().unwrap_or_default()))
        .unwrap_or_else(|_| db.to_path_buf());
    store.build("rota master key", &user.display().to_string(), None)
}

/// Opens the chosen store. `Ok(None)` with the reason when `auto` finds no persistent store;
/// an error when an explicitly chosen store is unavailable.
pub fn open(choice: Choice, db: &Path) -> Result<(Option<Keyring>, Option<String>), String> {
    off_runtime(|| open_here(choice, db))
}

/// The keyring entry in `store`, or why not (`what` names the store in the message).
fn keyring(
    name: &'static str,
    what: &str,
    store: Result<Arc<keyring_core::CredentialStore>, Error>,
    db: &Path,
) -> Result<Keyring, String> {
    let store = store.map_err(|e| format!("{what}: {e}{}", hint(name, &e)))?;
    let entry = entry(store, db).map_err(|e| format!("{what}: {e}{}", hint(name, &e)))?;
    Ok(Keyring { store: name, entry })
}

fn unavailable(choice: Choice) -> String {
    format!("[secrets] keyring = \"{}\" is not available on this platform", choice.as_str())
}

#[cfg(target_os = "linux")]
fn open_here(choice: Choice, db: &Path) -> Result<(Option<Keyring>, Option<String>), String> {
    let secret_service = || -> Result<Keyring, String> {
        if std::env::var_os("DBUS_SESSION_BUS_ADDRESS").is_none() {
            return Err(
                "no DBus session (DBUS_SESSION_BUS_ADDRESS is not set), so the Secret Service is unreachable".into()
            );
        }
        let store = zbus_secret_service_keyring_store::Store::new().map(|s| s as Arc<keyring_core::CredentialStore>);
        keyring("secret-service", "the Secret Service", store, db)
    };
    match choice {
        Choice::Off => Ok((None, None)),
        Choice::SecretService => secret_service().map(|k| (Some(k), None)),
        Choice::Keyutils => {
            let store = linux_keyutils_keyring_store::Store::new().map(|s| s as Arc<keyring_core::CredentialStore>);
            keyring("keyutils", "the keyutils store", store, db).map(|k| (Some(k), None))
        }
        Choice::Auto => match secret_service() {
            Ok(k) => Ok((Some(k), None)),
            Err(why) => Ok((
                None,
                Some(format!(
                    "{why}; the kernel keyutils store does not survive a reboot, so it is not used unless chosen ([secrets] keyring = \"keyutils\")"
                )),
            )),
        },
        Choice::Keychain | Choice::CredentialManager => Err(unavailable(choice)),
    }
}

#[cfg(target_os = "macos")]
fn open_here(choice: Choice, db: &Path) -> Result<(Option<Keyring>, Option<String>), String> {
    let keychain = || {
        let store = apple_native_keyring_store::keychain::Store::new().map(|s| s as Arc<keyring_core::CredentialStore>);
        keyring("keychain", "the macOS Keychain", store, db)
    };
    match choice {
        Choice::Off => Ok((None, None)),
        Choice::Keychain => keychain().map(|k| (Some(k), None)),
        Choice::Auto => match keychain() {
            Ok(k) => Ok((Some(k), None)),
            Err(why) => Ok((None, Some(why))),
        },
        Choice::SecretService | Choice::Keyutils | Choice::CredentialManager => Err(unavailable(choice)),
    }
}

#[cfg(target_os = "windows")]
fn open_here(choice: Choice, db: &Path) -> Result<(Option<Keyring>, Option<String>), String> {
    let manager = || {
        let store = windows_native_keyring_store::Store::new().map(|s| s as Arc<keyring_core::CredentialStore>);
        keyring("credential-manager", "the Windows Credential Manager", store, db)
    };
    match choice {
        Choice::Off => Ok((None, None)),
        Choice::CredentialManager => manager().map(|k| (Some(k), None)),
        Choice::Auto => match manager() {
            Ok(k) => Ok((Some(k), None)),
            Err(why) => Ok((None, Some(why))),
        },
        Choice::SecretService | Choice::Keyutils | Choice::Keychain => Err(unavailable(choice)),
    }
}

#[cfg(not(any(target_os = "linux", target_os = "macos", target_os = "windows")))]
fn open_here(choice: Choice, _db: &Path) -> Result<(Option<Keyring>, Option<String>), String> {
    match choice {
        Choice::Off => Ok((None, None)),
        Choice::Auto => Ok((None, Some("no keyring store is built in for this platform".into()))),
        other => Err(unavailable(other)),
    }
}

impl Keyring {
    /// The key's text, if the entry holds one.
    pub fn get(&self) -> Result<Option<String>, String> {
        off_runtime(|| match self.entry.get_password() {
            Ok(t) => Ok(Some(t)),
            Err(Error::NoEntry) => Ok(None),
            Err(e) => {
                Err(format!("reading the master key from the {} keyring: {e}{}", self.store, hint(self.store, &e)))
            }
        })
    }

    pub fn set(&self, text: &str) -> Result<(), String> {
        off_runtime(|| self.entry.set_password(text))
            .map_err(|e| format!("writing the master key to the {} keyring: {e}{}", self.store, hint(self.store, &e)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_choice_parses_and_off_opens_nothing() {
        #[derive(Deserialize)]
        struct S {
            keyring: Choice,
        }
        for c in [
            Choice::Auto,
            Choice::SecretService,
            Choice::Keyutils,
            Choice::Keychain,
            Choice::CredentialManager,
            Choice::Off,
        ] {
            let s: S = toml_like(c.as_str());
            assert_eq!(s.keyring, c);
        }
        let (k, why) = open(Choice::Off, Path::new("rota.db")).unwrap();
        assert!(k.is_none() && why.is_none());

        fn toml_like<T: serde::de::DeserializeOwned>(v: &str) -> T {
            serde_json::from_value(serde_json::json!({ "keyring": v })).unwrap()
        }
    }

    #[test]
    fn another_platforms_store_is_refused_with_the_reason() {
        #[cfg(target_os = "linux")]
        let others = [Choice::Keychain, Choice::CredentialManager];
        #[cfg(target_os = "macos")]
        let others = [Choice::SecretService, Choice::CredentialManager];
        #[cfg(target_os = "windows")]
        let others = [Choice::Keychain, Choice::Keyutils];
        #[cfg(any(target_os = "linux", target_os = "macos", target_os = "windows"))]
        for c in others {
            let err = open(c, Path::new("rota.db")).unwrap_err();
            assert!(err.contains(c.as_str()) && err.contains("not available on this platform"), "{err}");
        }
    }
}
