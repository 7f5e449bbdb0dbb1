//! Config reload (SPEC §8): a changed config file applies to the next request; a broken edit is
//! rejected and logged, and the last good config stays in force.

use crate::book::Book;
use crate::config::Config;
use crate::settings::Settings;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// How often the file is checked.
pub const EVERY: Duration = Duration::from_secs(1);

type Stamp = Option<(SystemTime, u64)>;

fn stamp(path: &Path) -> Stamp {
    let m = std::fs::metadata(path).ok()?;
    Some((m.modified().ok()?, m.len()))
}

/// Watches `path` until `tasks` is cancelled, and puts each good change in force: the book
/// takes its profiles and orders, then `settings` sends it to every reader.
pub fn watch(path: PathBuf, settings: watch::Sender<Arc<Settings>>, book: Arc<Book>, tasks: CancellationToken) {
    tokio::spawn(tasks.run_until_cancelled_owned(async move {
        let mut last = stamp(&path);
        loop {
            tokio::time::sleep(EVERY).await;
            let now = stamp(&path);
            if now == last {
                continue;
            }
            last = now;
            let current = settings.borrow().clone();
            match load(&path, &current.config) {
                Ok(config) => {
                    book.set_config(&config);
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
