//! The configuration file (`rota.toml`), `ROTA_*` environment overrides and `.env`
//! (docs/config.md): its types and defaults (`schema`), reading it (`load`), what parsing cannot
//! check (`check`) and the messages of a config that does not load (`diagnose`).

mod check;
mod diagnose;
mod load;
mod presets;
mod schema;

pub use check::read_token_file;
pub use diagnose::{ConfigError, did_you_mean};
pub use load::{DEFAULT_FILE, DEMO_FILE, Source, demo_hint};
pub use presets::Preset;
pub use schema::*;

use crate::engine::CooldownPolicy;
use crate::engine::ProfileId;
use crate::engine::chain::{self, ChainRequest, Routing};
use std::collections::HashMap;

/// The models the config names, by provider (`Config::named_models`).
pub type NamedModels = HashMap<String, std::collections::HashSet<String>>;

impl Config {
    /// Every concrete model the config names (the primary, fallbacks, context fallbacks,
    /// aliases, virtual models' targets, agents' fallbacks), by provider: the models whose
    /// names rota may use as metric labels, where any other is `other` (a client may name
    /// models without end).
    pub fn named_models(&self) -> NamedModels {
        let m = &self.models;
        let refs = m
            .primary
            .iter()
            .chain(&m.fallbacks)
            .chain(m.context_fallbacks.iter().flat_map(|(k, v)| std::iter::once(k).chain(v)))
            .chain(self.aliases.values())
            .chain(self.agents.values().flat_map(|a| a.fallbacks.iter().flatten()))
            .map(String::as_str)
            .chain(self.virtual_models.values().flat_map(|v| v.targets.iter().map(|t| t.model())));
        let mut named = NamedModels::new();
        for (provider, model) in refs.filter_map(crate::engine::chain::split_model_ref) {
            named.entry(provider.to_string()).or_default().insert(model.to_string());
        }
        named
    }

    /// `[cooldown]` and `[billing]` as the engine takes them.
    pub fn cooldown_policy(&self) -> CooldownPolicy {
        CooldownPolicy { cooldown: self.cooldown.clone(), billing: self.billing.clone() }
    }

    /// Profiles declared in the file for `provider`, sorted by id.
    pub fn configured_profiles(&self, provider: &str) -> Vec<ProfileId> {
        self.auth.profiles.keys().filter(|id| id.provider() == provider).cloned().collect()
    }

    pub fn has_provider(&self, name: &str) -> bool {
        self.providers.contains_key(name)
    }

    /// Resolves a chain with this configuration's routing. An unprefixed model that exactly one
    /// provider could serve (the one provider whose models the config names it among, else the
    /// only provider) is refused with `provider/model` suggested.
    pub fn chain(&self, req: &ChainRequest<'_>) -> Result<Vec<chain::Candidate>, chain::ChainError> {
        self.routing(|routing| chain::resolve(routing, req)).map_err(|e| match e {
            chain::ChainError::UnknownModel(model) => match self.serving_provider(&model) {
                Some(p) => chain::ChainError::UnknownModelSuggested { suggestion: format!("{p}/{model}"), model },
                None => chain::ChainError::UnknownModel(model),
            },
            e => e,
        })
    }

    /// The one provider that could serve `model`, if there is one.
    fn serving_provider(&self, model: &str) -> Option<&str> {
        let named = self.named_models();
        let mut naming = named.iter().filter(|(_, models)| models.contains(model)).map(|(p, _)| p.as_str());
        match (naming.next(), naming.next()) {
            (Some(p), None) => self.providers.get_key_value(p).map(|(k, _)| k.as_str()),
            (Some(_), Some(_)) => None,
            (None, _) if self.providers.len() == 1 => self.providers.keys().next().map(String::as_str),
            (None, _) => None,
        }
    }

    fn routing<R>(&self, with: impl FnOnce(&Routing<'_>) -> R) -> R {
        let known = |p: &str| self.has_provider(p);
        with(&Routing {
            providers: &known,
            aliases: &self.aliases,
            virtual_models: &self.virtual_models,
            primary: self.models.primary.as_deref(),
            fallbacks: &self.models.fallbacks,
        })
    }

    /// The models to try after `overflowed` answered `context_overflow` (`models.context_fallbacks`).
    pub fn context_chain(
        &self,
        overflowed: &chain::Candidate,
        roll: u64,
    ) -> Result<Vec<chain::Candidate>, chain::ChainError> {
        self.routing(|routing| chain::context_chain(routing, &self.models.context_fallbacks, overflowed, roll))
    }

    /// The limits in force for `agent`: each key of its `[agents.NAME]` section, else the
    /// stored value.
    pub fn agent_limits(&self, agent: &crate::agents::Agent) -> crate::agents::Limits {
        match self.agents.get(&agent.name) {
            Some(section) => agent.limits.over(&section.limits()),
            None => agent.limits,
        }
    }

    /// The models the agent may ask for: `[agents.NAME] models`, else its stored list; `None`:
    /// any.
    pub fn agent_models<'a>(&'a self, agent: &'a crate::agents::Agent) -> Option<&'a [String]> {
        self.agents.get(&agent.name).and_then(|a| a.models.as_deref()).or(agent.models.as_deref())
    }

    /// What is wrong with a list of models an agent may use: each must be a model, alias or
    /// virtual model this config serves; at least one, at most `chain::FALLBACKS_MAX` × 4.
    pub fn models_problems(&self, models: &[String]) -> Vec<String> {
        const MAX: usize = 64;
        if models.is_empty() {
            return vec!["lists no model (leave it out to allow any)".into()];
        }
        if models.len() > MAX {
            return vec![format!("lists {} models: at most {MAX}", models.len())];
        }
        let none: &[String] = &[];
        models
            .iter()
            .filter_map(|m| {
                let req = crate::engine::chain::ChainRequest {
                    model: Some(m),
                    agent_fallbacks: Some(none),
                    failover: true,
                    ..Default::default()
                };
                self.chain(&req).err().map(|e| e.to_string())
            })
            .collect()
    }
}

#[cfg(test)]
mod tests;
