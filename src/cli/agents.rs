//! `rota agents create|list|revoke|setup`.

use crate::agents::{Limits, digest, new_key, valid_name};
use crate::api::setup;
use crate::config::Config;
use crate::status::time;
use crate::store::StoreError;
use anyhow::{Result, bail};
use clap::Subcommand;
use secrecy::ExposeSecret;

#[derive(Subcommand, Debug)]
pub enum AgentsCommand {
    /// Create an agent and print its key once, alone on the last line of stdout.
    Create {
        name: String,
        /// The agent may use the admin API.
        #[arg(long)]
        admin: bool,
        /// Requests it may make per clock-aligned minute, across every server (docs/config.md).
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(i64).range(1..))]
        requests_per_minute: Option<i64>,
        /// Input plus output tokens it may use per UTC day.
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(i64).range(1..))]
        tokens_per_day: Option<i64>,
        /// USD it may spend per UTC day.
        #[arg(long, value_name = "USD", value_parser = usd_above_zero)]
        cost_per_day: Option<f64>,
        /// The models, aliases and virtual models it may ask for (comma-separated); anything
        /// else is refused with 403. Left out: any.
        #[arg(long, value_name = "MODEL,…", value_delimiter = ',')]
        models: Option<Vec<String>>,
    },
    /// List agents (never their keys).
    List {
        #[arg(long)]
        json: bool,
    },
    /// Revoke an agent's key: its requests are refused from then on.
    Revoke { name: String },
    /// Print the lines that point Claude Code, Codex and the OpenAI and Anthropic SDKs at rota
    /// as this agent, with its model (the key is read from $ROTA_AGENT_KEY).
    Setup {
        name: String,
        /// The address agents reach rota at; default `server.public_url`, else the listen address.
        #[arg(long, value_name = "URL")]
        base: Option<String>,
    },
}

/// `--cost-per-day`: USD, a finite number above 0.
fn usd_above_zero(raw: &str) -> Result<f64, String> {
    match raw.parse::<f64>() {
        Ok(usd) if usd.is_finite() && usd > 0.0 => Ok(usd),
        _ => Err(format!("`{raw}` is not a number of USD above 0")),
    }
}

pub async fn run(config: &Config, cmd: AgentsCommand) -> Result<()> {
    let open = || super::open_store(config);
    let existing = || super::open_existing(config);
    let now = chrono::Utc::now().timestamp_millis();
    match cmd {
        AgentsCommand::Create { name, admin, requests_per_minute, tokens_per_day, cost_per_day, models } => {
            if !valid_name(&name) {
                bail!("invalid agent name `{name}`: use a-z, 0-9, `-` and `_` (at most 64)");
            }
            let models: Option<Vec<String>> =
                models.map(|m| m.into_iter().map(|s| s.trim().to_string()).filter(|s| !s.is_empty()).collect());
            if let Some(m) = &models {
                let problems = config.models_problems(m);
                if !problems.is_empty() {
                    bail!("--models: {}", problems.join("; "));
                }
            }
            let limits = Limits { requests_per_minute, tokens_per_day, cost_per_day };
            let key = new_key();
            let taken = |e| match e {
                StoreError::AgentExists(n) => {
                    anyhow::anyhow!("agent {n} already exists; revoke it first to issue a new key")
                }
                other => anyhow::Error::from(other),
            };
            let store = open().await?;
            let agent = store
                .create_agent(&name, &digest(&key), admin, (&limits, models.as_deref()), now)
                .await
                .map_err(taken)?;
            let after = serde_json::json!({"admin": admin, "models": models});
            super::record(store.as_ref(), "agent.create", &agent.name, (None, Some(after))).await?;
            println!("created agent {}{}; its key is shown only now:", agent.name, if admin { " (admin)" } else { "" });
            println!("{}", key.expose_secret());
        }
        AgentsCommand::List { json } => {
            let agents = existing().await?.agents().await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&agents)?);
            } else if agents.is_empty() {
                println!("no agents (create one with `rota agents create <name>`)");
            } else {
                println!("{:<24} {:<6} {:<20} {:<24} LIMITS", "NAME", "ADMIN", "CREATED", "STATE");
                for a in agents {
                    let state = a.revoked_at.map_or("active".to_string(), |t| format!("revoked {}", time(t)));
                    let mut limits = config.agent_limits(&a).describe().unwrap_or_else(|| "none".into());
                    if let Some(models) = config.agent_models(&a) {
                        limits.push_str(&format!("; models: {}", models.join(", ")));
                    }
                    println!(
                        "{:<24} {:<6} {:<20} {state:<24} {limits}",
                        a.name,
                        if a.admin { "yes" } else { "no" },
                        time(a.created_at)
                    );
                }
            }
        }
        AgentsCommand::Setup { name, base } => {
            let base = setup::base_or(config, base.as_deref()).map_err(|e| anyhow::anyhow!("--base: {e}"))?;
            let agents = existing().await?.agents().await?;
            let Some(agent) = agents.into_iter().find(|a| a.name == name && a.revoked_at.is_none()) else {
                bail!("no active agent named {name} (see `rota agents list`)");
            };
            let model = setup::model(config, &agent);
            println!(
                "# The agent {name}'s key goes in ${KEY_VAR} (it was shown once, when the agent was created):\n\
                 # export {KEY_VAR}=rk_…",
                KEY_VAR = setup::KEY_VAR
            );
            for s in setup::lines(&base, model.as_deref()) {
                println!("\n# {}\n{}", s.title, s.text);
            }
        }
        AgentsCommand::Revoke { name } => {
            let store = existing().await?;
            store.revoke_agent(&name, now).await.map_err(|e| match e {
                StoreError::NoAgent(n) => anyhow::anyhow!("no active agent named {n} (see `rota agents list`)"),
                other => other.into(),
            })?;
            let revoked = (Some(serde_json::json!({"revoked": false})), Some(serde_json::json!({"revoked": true})));
            super::record(store.as_ref(), "agent.revoke", &name, revoked).await?;
            println!("revoked agent {name}");
        }
    }
    Ok(())
}
