//! `rota doctor`: is the configuration sound, can the key open the secrets, and what would
//! each agent's chain do right now, profile by profile. Creates no database and no key
//! (opening an existing database applies pending migrations).

use crate::agents::{Agent, Limits};
use crate::book::Roster;
use crate::config::Config;
use crate::engine::Millis;
use crate::engine::chain::{Candidate, ChainError, ChainRequest, FallbackOverride};
use crate::secrets::{check_key, find_key_with, key_file_for};
use crate::status::{QuotaInfo, Status};
use crate::store::DatabaseTarget;
use crate::store::Snapshot;
use anyhow::Result;
use serde::Serialize;
use std::path::Path;
use std::process::ExitCode;

/// What a chain without a model lacks, and how to give it one.
const NO_MODEL: &str =
    "no model configured: set [models] primary = \"provider/model\" (the model of requests that name none)";

#[derive(Serialize, Default)]
struct Report {
    config_file: Option<String>,
    database: Option<String>,
    key: Option<String>,
    providers: Vec<ProviderLine>,
    agents: Vec<AgentChain>,
    /// Worth knowing, not wrong (the exit code ignores them).
    notes: Vec<String>,
    problems: Vec<String>,
}

/// A provider as rota will call it, and what its preset filled in (docs/providers.md).
#[derive(Serialize)]
struct ProviderLine {
    name: String,
    preset: Option<&'static str>,
    api: &'static str,
    base_url: String,
    key_header: &'static str,
    quota: Vec<&'static str>,
    confirm_path: String,
    /// Where its Claude models answer in Anthropic's format (Vertex AI).
    claude_base_url: Option<String>,
    /// Whether the console can sign accounts in (an `oauth` block, the preset's or the file's).
    sign_in: bool,
    /// The keys the preset set because the file left them out.
    filled: Vec<&'static str>,
}

impl ProviderLine {
    fn of(name: &str, p: &crate::config::Provider) -> ProviderLine {
        ProviderLine {
            name: name.to_string(),
            preset: p.preset.map(crate::config::Preset::as_str),
            api: p.api.as_str(),
            base_url: p.base_url.clone(),
            key_header: p.key_header.as_str(),
            quota: p.quota.iter().map(|f| f.as_str()).collect(),
            confirm_path: p.confirm_path.clone(),
            claude_base_url: p.claude_base_url.clone(),
            sign_in: p.oauth.is_some(),
            filled: p.filled.clone(),
        }
    }
}

#[derive(Serialize)]
struct AgentChain {
    agent: String,
    /// The limits in force (`[agents.NAME]` over those stored with the agent); absent: none.
    #[serde(skip_serializing_if = "Option::is_none")]
    limits: Option<Limits>,
    chain: Vec<ChainStep>,
    error: Option<String>,
}

#[derive(Serialize)]
struct ChainStep {
    model: String,
    profiles: Vec<ProfileLine>,
}

#[derive(Serialize)]
struct ProfileLine {
    id: String,
    #[serde(rename = "type")]
    kind: String,
    status: Status,
    display: String,
    /// What the provider last reported of the profile's quota for this model.
    quota: Option<QuotaInfo>,
}

pub async fn run(config_path: Option<&Path>, as_json: bool) -> Result<ExitCode> {
    let report = match Config::load(config_path) {
        Ok((config, source)) => build(&config, source.file.as_deref()).await,
        Err(e) => Report { problems: e.0, ..Default::default() },
    };
    if as_json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_text(&report);
    }
    Ok(if report.problems.is_empty() { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

async fn build(config: &Config, file: Option<&Path>) -> Report {
    let mut report = Report {
        config_file: Some(file.map_or_else(|| "none (defaults and environment)".into(), |f| f.display().to_string())),
        problems: config.problems(),
        ..Default::default()
    };
    report.providers = config.providers.iter().map(|(name, p)| ProviderLine::of(name, p)).collect();
    let listen = &config.server.listen;
    let host = listen.rsplit_once(':').map_or(listen.as_str(), |(h, _)| h).trim_matches(['[', ']']);
    let loopback = host == "localhost" || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback());
    if !loopback && config.server.metrics_token_file.is_none() {
        report.notes.push(format!(
            "server.listen = \"{listen}\" is not a loopback address and server.metrics_token_file is unset: \
             /metrics answers only over loopback; give scrapers a token (docs/gateway.md, \"Metrics\")"
        ));
    }
    let (snapshot, stored_agents) = read_database(config, file, &mut report).await;
    let roster = Roster::new(&snapshot, config);
    let now = chrono::Utc::now().timestamp_millis();
    let mut agents: Vec<String> = config.agents.keys().cloned().collect();
    agents.insert(0, "(default)".into());
    for agent in agents {
        let entry = agent_chain(config, &roster, &stored_agents, agent, now, &mut report);
        report.agents.push(entry);
    }
    report
}

/// The database's profiles and agents; none when there is no database yet (with a note) or it
/// cannot be read (with the problem).
async fn read_database(config: &Config, file: Option<&Path>, report: &mut Report) -> (Snapshot, Vec<Agent>) {
    match crate::store::DatabaseTarget::of(config) {
        Err(e) => {
            report.problems.extend(e.0);
            (Snapshot::default(), Vec::new())
        }
        Ok(target) if !target.exists() => {
            report.database =
                Some(format!("{target}: no database there yet (`rota serve` or `rota migrate` creates it)"));
            if let Some(hint) = crate::config::demo_hint(file) {
                report.notes.push(hint);
            }
            (Snapshot::default(), Vec::new())
        }
        Ok(target) => match inspect_database(&target, config, report).await {
            Ok(read) => read,
            Err(e) => {
                report.problems.push(format!("database {target}: {e:#}"));
                (Snapshot::default(), Vec::new())
            }
        },
    }
}

/// One agent's chain, profile by profile, with its limits; a chain that cannot be resolved is
/// a problem, said once.
fn agent_chain(
    config: &Config,
    roster: &Roster,
    stored_agents: &[Agent],
    agent: String,
    now: Millis,
    report: &mut Report,
) -> AgentChain {
    let fallbacks = config.agents.get(&agent).and_then(|a| a.fallbacks.as_deref());
    let stored = stored_agents.iter().find(|a| a.name == agent && a.revoked_at.is_none());
    let limits = match (stored, config.agents.get(&agent)) {
        (Some(a), _) => config.agent_limits(a),
        (None, Some(section)) => section.limits(),
        (None, None) => Limits::default(),
    };
    let limits = limits.describe().is_some().then_some(limits);
    // An agent held to a list of models: the chain of the first one.
    let models = match stored {
        Some(a) => config.agent_models(a),
        None => config.agents.get(&agent).and_then(|a| a.models.as_deref()),
    };
    let req = ChainRequest {
        model: models.and_then(|m| m.first()).map(String::as_str),
        agent_fallbacks: fallbacks,
        fallback_override: FallbackOverride::Inherit,
        roll: 0,
        failover: config.failover.enabled,
        allowed: models,
    };
    match config.chain(&req) {
        Ok(chain) => {
            let formats: Vec<String> = chain
                .iter()
                .map(|c| (c, config.providers[&c.provider].api_for(&c.model)))
                .filter(|(_, api)| *api != crate::config::WireFormat::Openai)
                .map(|(c, api)| format!("{} ({})", c.label(), api.as_str()))
                .collect();
            if !formats.is_empty() {
                report.notes.push(format!(
                    "agent {agent}: {}: requests in another format are translated for them (docs/translation.md)",
                    formats.join(", ")
                ));
            }
            let usable = |c: &Candidate| {
                let order = roster.order(config, &c.provider, &c.model, None, None, now);
                order.is_ok_and(|o| o.slots.iter().any(|s| roster.views[&s.id].unusable(now).is_none()))
            };
            if !chain.iter().any(usable) {
                let models: Vec<String> = chain.iter().map(Candidate::label).collect();
                report.notes.push(format!(
                    "agent {agent}: no model of its chain ({}) has a usable profile: its requests will fail until \
                     one is added (`rota profiles add PROVIDER`) or enabled",
                    models.join(", ")
                ));
            }
            let steps = chain.iter().map(|c| chain_step(config, roster, c, now)).collect();
            AgentChain { agent, limits, chain: steps, error: None }
        }
        Err(e) => {
            let no_model = matches!(e, ChainError::NoModel);
            let error = if no_model { NO_MODEL.to_string() } else { e.to_string() };
            // Once, and not again when the config's own check already said it.
            if !report.problems.iter().any(|p| p.contains(&error)) {
                report.problems.push(if no_model {
                    error.clone()
                } else {
                    format!("agent {agent}: the chain cannot be resolved: {error}")
                });
            }
            AgentChain { agent, limits, chain: vec![], error: Some(error) }
        }
    }
}

/// One model of a chain: its provider's profiles in the order rotation tries them now, then
/// those the order leaves out, each with why.
fn chain_step(config: &Config, roster: &Roster, c: &Candidate, now: Millis) -> ChainStep {
    let slots = roster.order(config, &c.provider, &c.model, None, None, now).map(|o| o.slots).unwrap_or_default();
    let line = |id: &crate::engine::ProfileId, note: &str| {
        let v = &roster.views[id];
        let status = Status::for_model(v, &c.model, now);
        let quota = QuotaInfo::of(&v.stats, config.rotation.floor(), now);
        ProfileLine {
            id: id.to_string(),
            kind: v.kind.to_string(),
            display: format!("{}{note}", status.display(now)),
            status,
            quota: quota.into_iter().find(|q| q.model == c.model),
        }
    };
    let mut profiles: Vec<ProfileLine> = slots.iter().map(|s| line(&s.id, "")).collect();
    // Profiles of the provider that the order leaves out, so nobody wonders why.
    let mut left_out: Vec<_> =
        roster.views.keys().filter(|id| id.provider() == c.provider && !slots.iter().any(|s| &s.id == *id)).collect();
    left_out.sort();
    let explicit = roster.orders.get(&c.provider).or(config.auth.order.get(&c.provider)).is_some_and(|o| !o.is_empty());
    let configured = config.configured_profiles(&c.provider);
    profiles.extend(left_out.into_iter().map(|id| {
        let why = if roster.views[id].unusable(now).is_some() {
            ""
        } else if explicit {
            " — not in rotation: auth.order does not name it"
        } else if !configured.is_empty() && !configured.contains(id) {
            " — not in rotation: the config file declares this provider's profiles"
        } else {
            " — not in rotation"
        };
        line(id, why)
    }));
    ChainStep { model: c.label(), profiles }
}

/// Opens the existing database (applying pending migrations), and checks the key against its
/// secrets.
async fn inspect_database(
    target: &DatabaseTarget,
    config: &Config,
    report: &mut Report,
) -> Result<(Snapshot, Vec<Agent>)> {
    let keyring = config.secrets.keyring;
    let store = crate::store::open_as_is(target).await?;
    if let DatabaseTarget::Sqlite(path) = target {
        report.notes.extend(crate::store::files::too_open(path));
    }
    let applied = store.applied_migrations().await?;
    report.database = Some(format!("{target} ({applied} migration(s) applied)"));
    let path = &crate::store::key_anchor(config)?;
    let ids = store.secret_key_ids().await?;
    report.key = Some(match find_key_with(path, keyring) {
        Err(e) => {
            report.problems.push(e.to_string());
            "invalid".into()
        }
        Ok(None) if ids.is_empty() => {
            format!("none yet (created at {} on the first stored secret)", key_file_for(path).display())
        }
        Ok(None) => {
            report
                .problems
                .push(crate::secrets::KeyError::Missing { ids: ids.join(", "), file: key_file_for(path) }.to_string());
            "missing".into()
        }
        Ok(Some((key, origin))) => match check_key(&key, &origin, &ids) {
            Ok(()) => format!("{origin}, id {}", key.id()),
            Err(e) => {
                report.problems.push(e.to_string());
                format!("{origin}, id {} (does not match the database)", key.id())
            }
        },
    });
    let snapshot = store.snapshot().await?;
    let agents = store.agents().await?;
    store.close().await;
    Ok((snapshot, agents))
}

fn print_text(r: &Report) {
    let now = chrono::Utc::now().timestamp_millis();
    if let Some(f) = &r.config_file {
        println!("config:   {f}");
    }
    if let Some(d) = &r.database {
        println!("database: {d}");
    }
    if let Some(k) = &r.key {
        println!("key:      {k}");
    }
    for p in &r.providers {
        let preset = match p.preset {
            Some(preset) if p.filled.is_empty() => format!(" (preset {preset}, every key overridden)"),
            Some(preset) => format!(" (preset {preset} filled {})", p.filled.join(", ")),
            None => String::new(),
        };
        let quota = if p.quota.is_empty() { "none".to_string() } else { p.quota.join(", ") };
        let sign_in = if p.sign_in { ", sign-in" } else { "" };
        println!("\nprovider {}{preset}:", p.name);
        println!("  {} at {}, key in {}, quota headers {quota}{sign_in}", p.api, p.base_url, p.key_header);
        if let Some(claude) = &p.claude_base_url {
            println!("  claude… models: anthropic at {claude}/MODEL:rawPredict");
        }
    }
    for a in &r.agents {
        match a.limits.as_ref().and_then(Limits::describe) {
            Some(limits) => println!("\nagent {} (limits: {limits}):", a.agent),
            None => println!("\nagent {}:", a.agent),
        }
        if let Some(e) = &a.error {
            println!("  no chain: {e}");
        }
        for (i, step) in a.chain.iter().enumerate() {
            println!("  {}. {}", i + 1, step.model);
            if step.profiles.is_empty() {
                println!(
                    "       (no usable profile: add one with `rota profiles add {}`)",
                    step.model.split('/').next().unwrap_or("")
                );
            }
            for p in &step.profiles {
                println!("       {:<32} {:<8} {}", p.id, p.kind, p.display);
                if let Some(q) = &p.quota {
                    println!("       {:<32} {:<8} quota {}", "", "", q.display(now));
                }
            }
        }
    }
    for n in &r.notes {
        println!("\nnote: {n}");
    }
    if r.problems.is_empty() {
        println!("\nno problems found");
    } else {
        println!("\n{} problem(s):", r.problems.len());
        for p in &r.problems {
            println!("  - {p}");
        }
    }
}
