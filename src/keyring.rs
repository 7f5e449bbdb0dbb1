//! The master key in the OS keyring (SPEC §8, Secrets), through keyring-core with explicitly
//! chosen stores. On Linux: the Secret Service (persistent; needs a DBus session) and the
//! kernel keyutils store (no DBus needed, but its keys do not survive a reboot, so it is only
//! used when chosen explicitly). `auto` uses the Secret Service when one answers, else nothing
//! (the key file), and says why.

use keyring_core::{Entry, Error};
use serde::Deserialize;
use std::path::Path;
use std::sync::Arc;

/// `[secrets] keyring`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Choice {
    /// The Secret Service when a DBus session offers one, else the key file.
    #[default]
    Auto,
    SecretService,
    /// The kernel keyutils store: no DBus needed, lost at reboot (keep a copy of the key).
    Keyutils,
    /// Never the keyring: `ROTA_MASTER_KEY` or the key file.
    Off,
}

/// What an operator can do about a store that refuses access.
fn hint(store: &str, e: &Error) -> &'static str {
    match (store, e) {
        ("keyutils", Error::NoStorageAccess(_) | Error::PlatformFailure(_)) => {
            " (the kernel refused the keyctl calls; containers often forbid them: use ROTA_MASTER_KEY or [secrets] keyring = \"off\")"
        }
        ("secret-service", Error::NoStorageAccess(_)) => " (is the login keyring unlocked?)",
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

#[cfg(target_os = "linux")]
fn open_here(choice: Choice, db: &Path) -> Result<(Option<Keyring>, Option<String>), String> {
    let secret_service = || -> Result<Keyring, String> {
        if std::env::var_os("DBUS_SESSION_BUS_ADDRESS").is_none() {
            return Err(
                "no DBus session (DBUS_SESSION_BUS_ADDRESS is not set), so the Secret Service is unreachable".into()
            );
        }
        let store = zbus_secret_service_keyring_store::Store::new().map_err(|e| format!("the Secret Service: {e}"))?;
        let entry = entry(store, db).map_err(|e| format!("the Secret Service: {e}"))?;
        Ok(Keyring { store: "secret-service", entry })
    };
    match choice {
        Choice::Off => Ok((None, None)),
        Choice::SecretService => secret_service().map(|k| (Some(k), None)),
        Choice::Keyutils => {
            let store = linux_keyutils_keyring_store::Store::new().map_err(|e| format!("the keyutils store: {e}"))?;
            let entry = entry(store, db).map_err(|e| format!("the keyutils store: {e}"))?;
            Ok((Some(Keyring { store: "keyutils", entry }), None))
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
    }
}

#[cfg(not(target_os = "linux"))]
fn open_here(choice: Choice, _db: &Path) -> Result<(Option<Keyring>, Option<String>), String> {
    match choice {
        Choice::Off | Choice::Auto => Ok((None, Some("no keyring store is built in for this platform".into()))),
        other => Err(format!("keyring {other:?} is not available on this platform")),
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
