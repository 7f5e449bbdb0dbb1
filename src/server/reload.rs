//! Config reload (docs/config.md, "Reload"): a changed config file applies to the next request
//! once it has stopped changing; a broken edit is rejected and logged, and the last good config
//! stays in force.

use crate::config::Config;
use crate::settings::Settings;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// How often the file is looked at.
pub const EVERY: Duration = Duration::from_millis(250);

/// How long a changed file must stay unchanged before it is read: a file written in place
/// (truncated, then filled) is read only once its writer is done (docs/config.md, "Reload").
pub const SETTLE: Duration = Duration::from_secs(1);

/// What tells one version of the file from another without reading it: its inode (a rename
/// over it is a new file), its modification time and its length.
type Stamp = Option<(u64, SystemTime, u64)>;

fn stamp(path: &Path) -> Stamp {
    let m = std::fs::metadata(path).ok()?;
    #[cfg(unix)]
    let ino = std::os::unix::fs::MetadataExt::ino(&m);
    #[cfg(not(unix))]
    let ino = 0;
    Some((ino, m.modified().ok()?, m.len()))
}

/// The file as last seen, and since when it has looked so.
struct Seen {
    stamp: Stamp,
    since: Instant,
}

/// Watches `path` until `tasks` is cancelled, and puts each good change in force once the file
/// has settled (`SETTLE`): `settings` sends it to every reader, the book among them.
pub fn watch(path: PathBuf, settings: watch::Sender<Arc<Settings>>, tasks: CancellationToken) {
    tokio::spawn(tasks.run_until_cancelled_owned(async move {
        let mut read = stamp(&path);
        let mut seen = Seen { stamp: read, since: Instant::now() };
        loop {
            tokio::time::sleep(EVERY).await;
            let now = stamp(&path);
            if now != seen.stamp {
                seen = Seen { stamp: now, since: Instant::now() };
                continue;
            }
            if now == read || seen.since.elapsed() < SETTLE {
                continue;
            }
            let current = settings.borrow().clone();
            let loaded = load(&path, &current.config);
            if stamp(&path) != now {
                continue; // written again while it was read: wait for it to settle again
            }
            read = now;
            match loaded {
                Ok(config) => {
                    settings.send_replace(Arc::new(Settings::new(config)));
                    tracing::info!(file = %path.display(), "config reloaded; it applies to the next request");
                }
                Err(why) => {
                    tracing::error!(file = %path.display(), "config change rejected, the last good config stays: {why}")
                }
            }
        }
    }));
}

fn load(path: &Path, current: &Config) -> Result<Config, String> {
    let (config, _) = Config::load(Some(path)).map_err(|e| e.to_string())?;
    let problems = config.problems();
    if !problems.is_empty() {
        return Err(problems.join("; "));
    }
    if config.providers.is_empty() && !current.providers.is_empty() && !config.server.allow_empty_reload {
        return Err("it configures no provider, so no model could be served \
                    (server.allow_empty_reload = true in the file applies such a change)"
            .into());
    }
    // These are read once at start; say so instead of pretending they changed. A profile's
    // `paid` applies at once (the `paid` alert).
    let profiles = |c: &Config| {
        let mut profiles = c.auth.profiles.clone();
        profiles.values_mut().for_each(|p| p.paid = false);
        format!("{profiles:?}")
    };
    let at_start = [
        ("server.listen", config.server.listen != current.server.listen),
        ("database.url", config.database.url != current.database.url),
        ("auth.profiles", profiles(&config) != profiles(current)),
        ("timeouts.connect", config.timeouts.connect != current.timeouts.connect),
        ("limits.bodies_in_flight_mb", config.limits.bodies_in_flight_mb != current.limits.bodies_in_flight_mb),
        ("telemetry", config.telemetry.otlp_endpoint != current.telemetry.otlp_endpoint),
    ];
    for (key, changed) in at_start {
        if changed {
            tracing::warn!(file = %path.display(), "{key} changed: it applies at the next start");
        }
    }
    Ok(config)
}
