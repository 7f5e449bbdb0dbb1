//! The SQLite database's files (the database, its `-wal` and `-shm`) and who may write them:
//! made owner-only at open, and checked before every open and by the watchdog, so that a file
//! rota cannot write is named with what to do, rather than met as SQLite's "unable to open
//! database file", or as a SIGBUS when a mapped `-shm` turns immutable under a running server.

use super::StoreError;
use std::path::{Path, PathBuf};

/// The database file and the two SQLite keeps beside it.
fn files(path: &Path) -> [PathBuf; 3] {
    let with = |suffix: &str| {
        let mut file = path.as_os_str().to_owned();
        file.push(suffix);
        PathBuf::from(file)
    };
    [path.to_path_buf(), with("-wal"), with("-shm")]
}

/// Makes the database's files readable by their owner only (they hold the audit log, emails
/// and key digests); a file that already is, is left alone. SQLite creates the `-wal` and
/// `-shm` files with the database file's mode.
#[cfg(unix)]
pub(super) fn owner_only(path: &Path) -> Result<(), StoreError> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    for file in files(path) {
        let Ok(meta) = std::fs::metadata(&file) else { continue };
        if meta.mode() & 0o077 == 0 {
            continue;
        }
        if let Err(e) = std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)) {
            return Err(StoreError::Setup(format!(
                "{} is readable by others (mode {:04o}) and rota cannot make it owner-only ({e}): as its owner \
                 {}, run `chmod 600 {0}`",
                file.display(),
                meta.mode() & 0o7777,
                user(meta.uid()),
            )));
        }
    }
    Ok(())
}

#[cfg(not(unix))]
pub(super) fn owner_only(_: &Path) -> Result<(), StoreError> {
    Ok(())
}

/// The database's files that others may read, each with its mode (`rota doctor`'s note).
#[cfg(unix)]
pub fn too_open(path: &Path) -> Vec<String> {
    use std::os::unix::fs::MetadataExt;
    files(path)
        .iter()
        .filter_map(|f| Some((f, std::fs::metadata(f).ok()?.mode())))
        .filter(|(_, mode)| mode & 0o077 != 0)
        .map(|(f, mode)| {
            format!("{} is readable by others (mode {:04o}): rota serve makes it 0600", f.display(), mode & 0o7777)
        })
        .collect()
}

/// Why rota cannot write the database's files, in words that say what to do; `None` when it
/// can. Each file that exists is asked with `access(2)`, never opened: closing a descriptor of
/// a file drops every POSIX lock the process holds on it, SQLite's included. Refused for its
/// permissions, the answer names its owner and mode and the `chown`/`chmod` to run; refused
/// although the permissions allow it (`chattr +i`, a read-only mount), it names `lsattr`. A
/// folder where the `-wal` and `-shm` cannot be made is named too.
#[cfg(unix)]
pub fn unwritable(path: &Path) -> Option<String> {
    use nix::errno::Errno;
    use nix::unistd::AccessFlags;
    for file in files(path) {
        match nix::unistd::access(&file, AccessFlags::R_OK | AccessFlags::W_OK) {
            Ok(()) | Err(Errno::ENOENT) => {}
            Err(Errno::EACCES) => return Some(denied(&file, &std::io::Error::from(Errno::EACCES))),
            Err(errno) => {
                let e = std::io::Error::from(errno);
                return Some(format!(
                    "{} cannot be written ({e}): is it immutable or append-only (`lsattr {0}`; `chattr -i {0}` \
                     as root), or on a read-only mount?",
                    file.display()
                ));
            }
        }
    }
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let makes = files(path)[1..].iter().any(|f| !f.exists());
    if makes && path.exists() && nix::unistd::access(dir, AccessFlags::W_OK | AccessFlags::X_OK).is_err() {
        return Some(format!(
            "{}: rota cannot create the database's -wal and -shm files in this folder (no write permission for {}): \
             give the folder to the user rota runs as, or run rota as the folder's owner",
            dir.display(),
            user(nix::unistd::getuid().as_raw())
        ));
    }
    None
}

#[cfg(not(unix))]
pub fn unwritable(_: &Path) -> Option<String> {
    None
}

/// A file this user may not open for writing, for its permissions.
#[cfg(unix)]
fn denied(file: &Path, e: &std::io::Error) -> String {
    use std::os::unix::fs::MetadataExt;
    let me = nix::unistd::getuid().as_raw();
    match std::fs::metadata(file) {
        Ok(meta) if meta.uid() == me => format!(
            "{} cannot be written ({e}): its mode is {:04o}; as its owner {}, run `chmod 600 {0}`",
            file.display(),
            meta.mode() & 0o7777,
            user(me)
        ),
        Ok(meta) => format!(
            "{} cannot be written by {} ({e}): it belongs to {} with mode {:04o}. Run rota as its owner \
             (`sudo -u {} rota …`), or give the database to this user: `chown {} {0} {0}-wal {0}-shm`",
            file.display(),
            user(me),
            user(meta.uid()),
            meta.mode() & 0o7777,
            name(meta.uid()),
            name(me),
        ),
        Err(_) => format!("{} cannot be written by {} ({e})", file.display(), user(me)),
    }
}

#[cfg(not(unix))]
fn denied(file: &Path, e: &std::io::Error) -> String {
    format!("{} cannot be written ({e})", file.display())
}

/// A user as `sudo -u` and `chown` take it: the name, else `#uid`.
#[cfg(unix)]
fn name(uid: u32) -> String {
    match nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid)) {
        Ok(Some(u)) => u.name,
        _ => format!("#{uid}"),
    }
}

/// A user in words: the name and uid.
#[cfg(unix)]
fn user(uid: u32) -> String {
    format!("{} (uid {uid})", name(uid))
}
