//! Config reload (SPEC §8): a changed config file applies to the next request; a broken edit is
//! rejected and logged, and the last good config stays in force.

use crate::config::Config;
use crate::gateway::failover::{Engine, Settings};
use std::path::{Path, PathBuf};
use std::sync::Weak;
use std::time::{Duration, SystemTime};

/// How often the file is checked.
pub const EVERY: Duration = Duration::from_secs(1);

type Stamp = Option<(SystemTime, u64)>;

fn stamp(path: &Path) -> Stamp {
    let m = std::fs::metadata(path).ok()?;
    Some((m.modified().ok()?, m.len()))
}

/// Watches `path` until the engine is gone.
pub fn watch(path: PathBuf, engine: Weak<Engine>) {
    tokio::spawn(async move {
        let mut last = stamp(&path);
        loop {
            tokio::time::sleep(EVERY).await;
            let Some(engine) = engine.upgrade() else { return };
            let now = stamp(&path);
            if now == last {
                continue;
            }
            last = now;
            match load(&path, &engine.settings().config) {
                Ok(config) => {
                    engine.replace_settings(Settings::new(config));
                    tracing::info!(file = %path.display(), "config reloaded; it applies to the next request");
                }
                Err(why) => {
                    tracing::error!(file = %path.display(), "config change rejected, the last good config stays: {why}")
                }
            }
        }
    });
}

fn load(path: &Path, current: &Config) -> Result<Config, String> {
    let (config, _) = Config::load(Some(path)).map_err(|e| e.to_string())?;
    let problems = config.problems();
    if !problems.is_empty() {
        return Err(problems.join("; "));
    }
    // These are read once at start; say so instead of pretending they changed.
    let at_start = [
        ("server.listen", config.server.listen != current.server.listen),
        ("database.url", config.database.url != current.database.url),
        ("auth.profiles", format!("{:?}", config.auth.profiles) != format!("{:?}", current.auth.profiles)),
        ("timeouts.connect", config.timeouts.connect != current.timeouts.connect),
    ];
    for (key, changed) in at_start {
        if changed {
            tracing::warn!(file = %path.display(), "{key} changed: it applies at the next start");
        }
    }
    Ok(config)
}
