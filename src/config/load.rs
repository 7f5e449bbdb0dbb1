//! Reading the configuration: the file, then `ROTA_*` variables and `DATABASE_URL` over it, each
//! key deserialized into the schema and every key at fault reported at once.

use super::Config;
use super::diagnose::{ConfigError, describe, describe_at};
use figment::Figment;
use figment::providers::{Env, Format, Toml};
use serde::Deserialize;
use std::path::{Path, PathBuf};

pub const DEFAULT_FILE: &str = "rota.toml";

/// The config file `rota demo` writes beside its database at each start: what the demo serves,
/// and what `rota --config rota-demo.toml …` reads to reach the demo's database.
pub const DEMO_FILE: &str = "rota-demo.toml";

/// When a demo's config is in the working directory and is not the config that was read
/// (`config_read`): how to reach the demo's database instead.
pub fn demo_hint(config_read: Option<&Path>) -> Option<String> {
    let demo = Path::new(DEMO_FILE);
    if !demo.is_file() {
        return None;
    }
    let canonical = |p: &Path| std::fs::canonicalize(p).ok();
    if config_read.is_some_and(|f| canonical(f).is_some_and(|f| Some(f) == canonical(demo))) {
        return None;
    }
    Some(format!("{DEMO_FILE} is here: `rota --config {DEMO_FILE} …` reaches the demo's database"))
}

/// The top-level sections a `ROTA_` variable may override (`ROTA_SECTION__KEY`). Other `ROTA_`
/// variables (`ROTA_CONFIG`, `ROTA_MASTER_KEY`, `ROTA_LOG`, an operator's own) are not config.
const SECTIONS: [&str; 21] = [
    "server",
    "console",
    "audit",
    "database",
    "providers",
    "auth",
    "models",
    "aliases",
    "virtual_models",
    "agents",
    "cooldown",
    "billing",
    "rotation",
    "failover",
    "classification",
    "timeouts",
    "limits",
    "leases",
    "refresh",
    "secrets",
    "prices",
];

/// Where the configuration came from.
#[derive(Clone, Debug)]
pub struct Source {
    /// The file, when one was read.
    pub file: Option<PathBuf>,
}

impl Config {
    /// Reads `path` (or `ROTA_CONFIG`, or `./rota.toml` when it exists), then the `ROTA_*`
    /// environment (`__` nests: `ROTA_SERVER__LISTEN`), then `DATABASE_URL`.
    pub fn load(path: Option<&Path>) -> Result<(Config, Source), ConfigError> {
        let explicit = path.map(Path::to_path_buf).or_else(|| std::env::var_os("ROTA_CONFIG").map(PathBuf::from));
        let file = match explicit {
            Some(p) if !p.is_file() => {
                return Err(ConfigError(vec![format!("config file {} not found", p.display())]));
            }
            Some(p) => Some(p),
            None => Some(PathBuf::from(DEFAULT_FILE)).filter(|p| p.is_file()),
        };
        let mut fig = Figment::new();
        if let Some(f) = &file {
            fig = fig.merge(Toml::file_exact(f));
        }
        fig = fig
            .merge(
                Env::prefixed("ROTA_")
                    .filter(|k| {
                        k == "failover_enabled"
                            || k.as_str()
                                .to_ascii_lowercase()
                                .split_once("__")
                                .is_some_and(|(s, _)| SECTIONS.contains(&s))
                    })
                    .map(|k| if k == "failover_enabled" { "failover.enabled".into() } else { k.into() })
                    .split("__"),
            )
            .merge(Env::raw().only(&["database_url"]).map(|_| "database.url".into()));
        let config = extract(&fig)?;
        Ok((config, Source { file }))
    }

    pub fn from_toml(text: &str) -> Result<Config, ConfigError> {
        extract(&Figment::new().merge(Toml::string(text)))
    }

    /// The file at `path` alone: no `ROTA_*` variable, no `DATABASE_URL` (what `rota demo`
    /// writes and then serves).
    pub fn from_file(path: &Path) -> Result<Config, ConfigError> {
        extract(&Figment::new().merge(Toml::file_exact(path)))
    }
}

/// Errors reported at most from one load; past them, the message says there are more.
const MAX_ERRORS: usize = 64;

/// Deserializes the merged configuration and reports every key at fault, not only the first:
/// after each error the key at fault is set aside and the rest deserialized again.
fn extract(fig: &Figment) -> Result<Config, ConfigError> {
    // A file that is not TOML at all stops here, with the parser's line and column.
    let mut tree = fig.find_value("").map_err(|e| ConfigError(describe(e)))?;
    let mut errors = Vec::new();
    let mut set_aside: Vec<Vec<String>> = Vec::new();
    loop {
        let e = match Config::deserialize(&tree) {
            Ok(config) if errors.is_empty() => return Ok(config),
            // What is left past the keys at fault is checked too, so that one run reports
            // every problem: a typo in a provider and the model that names it, together.
            Ok(rest) => {
                errors.extend(rest.problems());
                break;
            }
            Err(e) => e,
        };
        // A required key whose value was refused (and set aside) is not also reported missing.
        // (A provider's are messages: a preset may fill them, `presets::missing`.)
        let missing = match &e.kind {
            figment::error::Kind::MissingField(f) => Some(f.as_ref()),
            figment::error::Kind::Message(m) => {
                m.strip_prefix("missing `").and_then(|m| m.split_once('`')).map(|(f, _)| f)
            }
            _ => None,
        };
        let follows = missing.is_some_and(|f| {
            set_aside.iter().any(|p| p.split_last().is_some_and(|(last, parent)| last == f && parent == e.path))
        });
        if !follows {
            errors.push(describe_at(fig, &tree, &e));
        }
        if errors.len() >= MAX_ERRORS {
            errors.push(format!("(stopped after {MAX_ERRORS} errors)"));
            break;
        }
        match set_aside_key(&mut tree, &e.path) {
            Some(p) => set_aside.push(p),
            None => break,
        }
    }
    Err(ConfigError(errors))
}

/// Removes the deepest table key on `path` (an error inside an array removes the array), so the
/// next pass goes past it. Its path, or `None` when the path names nothing left to remove.
fn set_aside_key(tree: &mut figment::value::Value, path: &[String]) -> Option<Vec<String>> {
    use figment::value::Value;
    let mut depth = 0;
    let mut at: &Value = tree;
    while let (Value::Dict(_, d), Some(seg)) = (at, path.get(depth)) {
        match d.get(seg) {
            Some(v) => (at, depth) = (v, depth + 1),
            None => break,
        }
    }
    if depth == 0 {
        return None;
    }
    let mut dict = tree;
    for seg in &path[..depth - 1] {
        dict = match dict {
            Value::Dict(_, d) => d.get_mut(seg)?,
            _ => return None,
        };
    }
    match dict {
        Value::Dict(_, d) => d.remove(&path[depth - 1]).map(|_| path[..depth].to_vec()),
        _ => None,
    }
}
