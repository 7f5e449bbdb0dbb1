//! The command line (README.md). Every command takes `--config`.

mod agents;
mod demo;
mod doctor;
mod interop;
mod keys;
mod openclaw;
mod profiles;

use crate::config::Config;
use crate::store::Store;
use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

#[derive(Parser, Debug)]
#[command(name = "rota", version, about = "Auth-profile rotation gateway for LLM providers")]
pub struct Cli {
    /// Config file (default: $ROTA_CONFIG, else ./rota.toml when present).
    #[arg(long, global = true, value_name = "PATH")]
    pub config: Option<PathBuf>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run the gateway.
    Serve {
        /// Address to listen on (overrides server.listen).
        #[arg(long, value_name = "ADDR")]
        listen: Option<String>,
        /// Take the system clock as right even when it is far from the newest stored row
        /// (docs/rotation.md, "Time").
        #[arg(long)]
        trust_clock: bool,
    },
    /// Run the gateway in front of simulated upstreams (no real keys needed).
    ///
    /// It writes its config, rota-demo.toml, beside its database and serves it: `rota --config
    /// rota-demo.toml …` reaches the demo's database.
    Demo {
        #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8080")]
        listen: String,
        /// The demo's database (recreated at each start).
        #[arg(long, value_name = "PATH", default_value = "rota-demo.db")]
        database: PathBuf,
        /// Refused: the demo writes its own config. Declared here, hidden, so that the global
        /// `--config` is not listed in the demo's help.
        #[arg(long, hide = true, value_name = "PATH")]
        config: Option<PathBuf>,
    },
    /// Write a consistent copy of the live SQLite database to FILE (a new file), while rota
    /// serves; its secrets stay sealed with the same master key (docs/operations.md, "Backups").
    Backup {
        /// The copy: a file that does not exist yet.
        file: PathBuf,
    },
    /// Apply pending database migrations and exit (on PostgreSQL, partitioning an audit trail
    /// that is not yet); with --from, then copy everything another database holds into this one
    /// (which must be empty), e.g. an SQLite file into PostgreSQL.
    Migrate {
        /// The database to copy from, in `database.url`'s forms (`sqlite://rota.db`, `postgres://…`).
        #[arg(long, value_name = "URL")]
        from: Option<String>,
    },
    /// Check the configuration and show every agent's chain with each profile's state.
    Doctor {
        #[arg(long)]
        json: bool,
    },
    /// Manage auth profiles.
    #[command(subcommand)]
    Profiles(profiles::ProfilesCommand),
    /// Import profiles, order and usageStats from another tool.
    #[command(subcommand)]
    Import(ImportCommand),
    /// Export profiles, order and usageStats for another tool.
    #[command(subcommand)]
    Export(ExportCommand),
    /// Log in an OAuth account of a provider (the profile is named provider:<email>).
    Login {
        provider: String,
        /// Use the device flow: print a code to enter on any device.
        #[arg(long)]
        device: bool,
    },
    /// Re-encrypt every stored secret under a new master key, in one transaction (stop `rota serve` first).
    RotateKey,
    /// Manage agent keys (the credentials clients present to rota).
    #[command(subcommand)]
    Agents(agents::AgentsCommand),
}

#[derive(Subcommand, Debug)]
pub enum ImportCommand {
    /// An OpenClaw auth-profiles.json (all or nothing).
    Openclaw { file: PathBuf },
}

#[derive(Subcommand, Debug)]
pub enum ExportCommand {
    /// The stored profiles as an OpenClaw auth-profiles.json (a new 0600 file).
    Openclaw {
        #[arg(long, value_name = "FILE")]
        output: PathBuf,
    },
}

/// Loads a `.env` file, if there is one at `path` (never a parent directory's: a `.env` further
/// up belongs to another project). Variables already set win.
fn load_dotenv(path: &Path) {
    match dotenvy::from_path(path) {
        Err(dotenvy::Error::Io(e)) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => eprintln!("warning: {}: {e}", path.display()),
        Ok(()) => {}
    }
}

/// Parses the command line, runs the command and returns the process exit code. `on_idle` runs
/// on a worker thread that goes idle, at most once a second each: the binary's allocator gives
/// back what the thread freed (src/main.rs).
pub fn main(on_idle: fn()) -> ExitCode {
    load_dotenv(Path::new(".env"));
    let cli = Cli::parse();
    if let Some(dir) = cli.config.as_deref().and_then(Path::parent).filter(|d| !d.as_os_str().is_empty()) {
        load_dotenv(&dir.join(".env"));
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .on_thread_park(move || now_and_then(on_idle))
        .build()
        .expect("tokio runtime");
    let traces = match init_logging(traces_url(&cli), runtime.handle()) {
        Ok(traces) => traces,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let code = match runtime.block_on(run(cli)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    };
    // The runtime still runs: the last batch of spans is posted on it.
    if let Some(traces) = traces {
        traces.shutdown();
    }
    code
}

/// Where `rota serve` exports its traces, when its config says (`[telemetry]`, read once at
/// start); a config that does not load is reported by the command itself.
fn traces_url(cli: &Cli) -> Option<String> {
    if !matches!(cli.command, Command::Serve { .. }) {
        return None;
    }
    Config::load(cli.config.as_deref()).ok()?.0.telemetry.traces_url()
}

/// Runs `f` unless this thread ran it less than a second ago.
fn now_and_then(f: fn()) {
    thread_local! {
        static LAST: std::cell::Cell<Option<std::time::Instant>> = const { std::cell::Cell::new(None) };
    }
    let now = std::time::Instant::now();
    if LAST.get().is_none_or(|at| now.duration_since(at) >= std::time::Duration::from_secs(1)) {
        LAST.set(Some(now));
        f();
    }
}

/// The log on stderr (`ROTA_LOG`) and, with `traces` (a collector's `/v1/traces`), the traces'
/// exporter, posting on `runtime`.
fn init_logging(
    traces: Option<String>,
    runtime: &tokio::runtime::Handle,
) -> Result<Option<crate::telemetry::Traces>, String> {
    use tracing_subscriber::Layer as _;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let filter = tracing_subscriber::EnvFilter::try_from_env("ROTA_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,sqlx=warn"));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    // A log line that cannot be written (stderr is a file on a full disk) is lost, never
    // reported with `eprintln!`: that panics when stderr fails too, and took down the task
    // that logged, a database writer among them (the full-disk case of tests/it/faults.rs).
    let Some(url) = traces else {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_ansi(ansi)
            .with_writer(std::io::stderr)
            .log_internal_errors(false)
            .try_init();
        return Ok(None);
    };
    // The filter is the log's alone: the exported spans are enabled whatever `ROTA_LOG` says.
    let log = tracing_subscriber::fmt::layer()
        .with_ansi(ansi)
        .with_writer(std::io::stderr)
        .log_internal_errors(false)
        .with_filter(filter);
    let (exported, traces) = crate::telemetry::layer(&url, runtime.clone())?;
    let _ = tracing_subscriber::registry().with(log).with(exported).try_init();
    Ok(Some(traces))
}

/// `rota migrate --from URL`: copies the database at `from` into `to` (the configured one).
async fn copy_from(from: &str, config: &Config, to: &dyn Store) -> Result<()> {
    let source = crate::store::DatabaseTarget::parse(from)?;
    if source == crate::store::DatabaseTarget::of(config)? {
        bail!("--from names the configured database itself");
    }
    if !source.exists() {
        bail!("database {source} does not exist");
    }
    let from = crate::store::open(&source).await.with_context(|| format!("opening database {source}"))?;
    let c = crate::store::copy(from.as_ref(), to).await.with_context(|| format!("copying {source}"))?;
    println!(
        "copied from {source}: {} profile(s), {} order(s), {} model cooldown(s), {} agent(s), {} request(s), {} attempt(s)",
        c.profiles, c.orders, c.model_cooldowns, c.agents, c.requests, c.attempts
    );
    if !c.key_ids.is_empty() {
        println!(
            "the secrets are sealed with master key {}: give every server on {} that key (ROTA_MASTER_KEY, the keyring or secrets.key_file)",
            c.key_ids.join(", "),
            to.describe()
        );
    }
    Ok(())
}

/// Opens the configured database, applying pending migrations; an SQLite file is created when
/// missing (for the commands whose work is to store something: `profiles add`, `agents create`,
/// `login`, `import`, `migrate`).
pub(crate) async fn open_store(config: &Config) -> Result<Arc<dyn Store>> {
    let target = crate::store::DatabaseTarget::of(config)?;
    crate::store::open(&target).await.with_context(|| format!("opening database {target}"))
}

/// Records a change made with the CLI in `admin_actions` (docs/operations.md, "Admin actions"):
/// `actor_kind` `cli`, the OS user who ran it as `actor`, the `admin` role (the CLI holds the
/// database and the key).
pub(crate) async fn record(
    store: &dyn crate::store::Store,
    action: &str,
    target: &str,
    (before, after): (Option<serde_json::Value>, Option<serde_json::Value>),
) -> Result<()> {
    let action = crate::store::AdminAction {
        at: chrono::Utc::now().timestamp_millis(),
        actor: os_user(),
        actor_email: None,
        actor_kind: "cli".into(),
        role: "admin".into(),
        action: action.into(),
        target: Some(target.into()),
        before,
        after,
    };
    store.record_action(&action).await.context("recording the change in admin_actions")
}

/// The OS user running the CLI: their account's name, else `uid N`.
fn os_user() -> String {
    let uid = nix::unistd::getuid();
    match nix::unistd::User::from_uid(uid) {
        Ok(Some(user)) => user.name,
        _ => format!("uid {uid}"),
    }
}

/// Opens the configured database only if it exists: a command that reads or changes what is
/// stored never leaves an empty `rota.db` behind (run in the wrong directory, or without the
/// `--config` that names the real database).
pub(crate) async fn open_existing(config: &Config) -> Result<Arc<dyn Store>> {
    let target = crate::store::DatabaseTarget::of(config)?;
    if !target.exists() {
        bail!("{}", no_database(&target, config_file().as_deref()));
    }
    open_store(config).await
}

/// There is no database at `target`: why that may be (which config was read) and what to do.
pub(crate) fn no_database(target: &crate::store::DatabaseTarget, file: Option<&Path>) -> String {
    let from = match file {
        Some(f) => format!("the database.url of {}", f.display()),
        None => "the default database.url: no config file was read".into(),
    };
    let next = match crate::config::demo_hint(file) {
        Some(hint) => hint,
        None => "pass --config with the file that names your database, or create this one with \
                 `rota profiles add`, `rota agents create` or `rota migrate`"
            .into(),
    };
    format!("no database at {target} ({from}); {next}")
}

/// The config file this command read, if any (for messages).
fn config_file() -> Option<PathBuf> {
    CONFIG_FILE.get().cloned().flatten()
}

static CONFIG_FILE: std::sync::OnceLock<Option<PathBuf>> = std::sync::OnceLock::new();

async fn run(cli: Cli) -> Result<ExitCode> {
    match cli.command {
        Command::Doctor { json } => crate::cli::doctor::run(cli.config.as_deref(), json).await,
        Command::Serve { listen, trust_clock } => {
            let (config, file) = load_sound(cli.config.as_deref())?;
            crate::server::run(config, file, listen, trust_clock).await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Demo { listen, database, config } => {
            if config.is_some() || cli.config.is_some() {
                bail!(
                    "rota demo takes no --config: it writes its own, {} beside its database (--database), and serves it; \
                     `rota serve --config PATH` runs the gateway with yours",
                    crate::cli::demo::CONFIG_FILE
                );
            }
            crate::cli::demo::run(&listen, &database).await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Backup { file } => {
            let config = load(cli.config.as_deref())?;
            let store = open_existing(&config).await?;
            store.backup(&file).await.with_context(|| format!("backing up to {}", file.display()))?;
            let target = file.display().to_string();
            record(store.as_ref(), "database.backup", &target, (None, Some(serde_json::json!({"file": target}))))
                .await?;
            println!("backed up {} to {target} (its secrets sealed with the same master key)", store.describe());
            Ok(ExitCode::SUCCESS)
        }
        Command::Migrate { from } => {
            let config = load(cli.config.as_deref())?;
            let store = open_store(&config).await?;
            let n = store.applied_migrations().await?;
            println!("{}: {n} migration(s) applied, schema up to date", store.describe());
            if let Some(copied) = store.partition_audit().await? {
                println!("the audit trail is partitioned by day now: {copied} row(s) copied into the partitions");
            }
            if let Some(from) = from {
                copy_from(&from, &config, store.as_ref()).await?;
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Import(ImportCommand::Openclaw { file }) => {
            interop::import(&load(cli.config.as_deref())?, &file).await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Export(ExportCommand::Openclaw { output }) => {
            interop::export(&load(cli.config.as_deref())?, &output).await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Login { provider, device } => {
            keys::login(&load(cli.config.as_deref())?, &provider, device).await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::RotateKey => {
            keys::rotate_key(&load(cli.config.as_deref())?).await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Agents(cmd) => {
            let config = load(cli.config.as_deref())?;
            agents::run(&config, cmd).await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Profiles(cmd) => {
            let config = load(cli.config.as_deref())?;
            profiles::run(&config, cmd).await?;
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// Parses the configuration; parse errors name the file and key.
pub fn load(path: Option<&Path>) -> Result<Config> {
    let (config, source) = Config::load(path).map_err(|e| anyhow::anyhow!("invalid configuration:\n{e}"))?;
    let _ = CONFIG_FILE.set(source.file);
    Ok(config)
}

/// Parses the configuration and refuses one with problems (the gateway starts only when sound);
/// also returns the file it came from, if any.
fn load_sound(path: Option<&Path>) -> Result<(Config, Option<PathBuf>)> {
    let (config, source) = Config::load(path).map_err(|e| anyhow::anyhow!("invalid configuration:\n{e}"))?;
    let problems = config.problems();
    if !problems.is_empty() {
        bail!("invalid configuration (run `rota doctor` for details):\n  {}", problems.join("\n  "));
    }
    Ok((config, source.file))
}
