//! What deserializing cannot check: names that must exist, chains that must resolve, secrets
//! that must be set, numbers that must be in range. Every message names the key at fault.

use super::Config;
use crate::engine::ProfileType;
use crate::engine::chain::{self, ChainRequest};
use crate::engine::profile::valid_provider_name;
use secrecy::ExposeSecret;
use std::path::Path;

impl Config {
    /// Everything wrong with a parsed configuration, each naming its key. Empty when sound.
    pub fn problems(&self) -> Vec<String> {
        let mut out = Vec::new();
        if self.server.max_connections == 0 {
            out.push("server.max_connections: must be at least 1".into());
        }
        if let Some(why) = listen_problem(&self.server.listen) {
            out.push(format!("server.listen = \"{}\": {why}", self.server.listen));
        }
        if self.audit.queue == 0 {
            out.push("audit.queue: must be at least 1".into());
        }
        if !(self.leases.claim_share > 0.0 && self.leases.claim_share <= 1.0) || self.leases.claim_window.is_zero() {
            out.push(
                "leases.claim_share: must be above 0 and at most 1, and leases.claim_window longer than 0s".into(),
            );
        }
        if !(1..=1 << 20).contains(&self.limits.bodies_in_flight_mb) {
            out.push("limits.bodies_in_flight_mb: must be 1 to 1048576".into());
        }
        if !(1..=100).contains(&self.limits.max_attempts) {
            out.push("limits.max_attempts: must be 1 to 100".into());
        }
        if self.audit.prune_every.is_zero() || self.database.checkpoint_every.is_zero() {
            out.push("audit.prune_every and database.checkpoint_every: must be longer than 0s".into());
        }
        for (name, p) in &self.providers {
            if !valid_provider_name(name) {
                out.push(format!("providers.{name}: provider names may only hold a-z, 0-9, `-` and `_`"));
            }
            if !(p.base_url.starts_with("http://") || p.base_url.starts_with("https://")) {
                out.push(format!("providers.{name}.base_url: `{}` is not an http(s) URL", p.base_url));
            }
        }
        for (id, p) in &self.auth.profiles {
            let key = format!("auth.profiles.\"{id}\"");
            if p.provider != id.provider() {
                out.push(format!(
                    "{key}.provider: `{}` does not match the id's provider `{}`",
                    p.provider,
                    id.provider()
                ));
            }
            if !self.has_provider(&p.provider) {
                out.push(format!(
                    "{key}.provider: unknown provider `{}` (configure [providers.{}])",
                    p.provider, p.provider
                ));
            }
            let (field, var) = match p.kind {
                ProfileType::ApiKey => ("api_key_env", &p.api_key_env),
                ProfileType::Token => ("token_env", &p.token_env),
                ProfileType::OAuth => {
                    out.push(format!(
                        "{key}.type: oauth profiles are created by logging in (`rota login {}`), not declared",
                        p.provider
                    ));
                    continue;
                }
                kind @ (ProfileType::ClientCredentials | ProfileType::ServiceAccount) => {
                    out.push(format!(
                        "{key}.type: {kind} profiles are added with `rota profiles add {} --type {kind}` (the \
                         secret is sealed in the database), not declared",
                        p.provider
                    ));
                    continue;
                }
            };
            match var {
                None => {
                    out.push(format!("{key}.{field}: missing; name the environment variable that holds the secret"))
                }
                Some(v) if p.secret().is_none() => {
                    out.push(format!("{key}.{field}: environment variable `{v}` is unset or empty"));
                }
                Some(v) => {
                    if let Some(bad) = p.secret().and_then(|s| crate::secrets::invisible(s.expose_secret())) {
                        out.push(format!(
                            "{key}.{field}: environment variable `{v}` holds {bad} (a secret is visible ASCII)"
                        ));
                    }
                }
            }
        }
        for (provider, ids) in &self.auth.order {
            if !self.has_provider(provider) {
                out.push(format!("auth.order.{provider}: unknown provider `{provider}`"));
            }
            for id in ids.iter().filter(|id| id.provider() != provider) {
                out.push(format!("auth.order.{provider}: `{id}` belongs to another provider"));
            }
        }
        let c = &self.cooldown;
        if c.factor == 0 {
            out.push("cooldown.factor: must be at least 1".into());
        }
        if c.base.is_zero() || c.max < c.base {
            out.push("cooldown: `base` must be positive and no longer than `max`".into());
        }
        if self.billing.base.is_zero() || self.billing.max < self.billing.base {
            out.push("billing: `base` must be positive and no longer than `max`".into());
        }
        if self.server.session_idle.is_zero() {
            out.push("server.session_idle: must be positive".into());
        }
        if let Some(file) = &self.server.metrics_token_file
            && let Err(why) = read_token_file(file)
        {
            out.push(format!("server.metrics_token_file: {why}"));
        }
        for (name, a) in &self.agents {
            out.extend(a.limits().problems(&format!("agents.{name}.")));
        }
        if let Some(sso) = &self.console.sso {
            out.extend(sso_problems(sso));
        }
        out.extend(alert_problems(&self.alerts));
        if let Some(url) = self.telemetry.traces_url()
            && !matches!(url::Url::parse(&url), Ok(u) if (u.scheme() == "http" || u.scheme() == "https") && u.host().is_some())
        {
            out.push("telemetry.otlp_endpoint: not an http(s) URL (e.g. http://127.0.0.1:4318)".into());
        }
        self.routing_problems(&mut out);
        out
    }

    fn routing_problems(&self, out: &mut Vec<String>) {
        let resolve = |model: &str, fallbacks: Option<&[String]>| {
            let req =
                ChainRequest { model: Some(model), agent_fallbacks: fallbacks, failover: true, ..Default::default() };
            self.chain(&req)
        };
        let none: &[String] = &[];
        if let Some(primary) = &self.models.primary
            && let Err(e) = resolve(primary, Some(none))
        {
            out.push(format!("models.primary: {e}"));
        }
        for (i, f) in self.models.fallbacks.iter().enumerate() {
            if let Err(e) = resolve(f, Some(none)) {
                out.push(format!("models.fallbacks[{i}]: {e}"));
            }
        }
        for (name, target) in &self.aliases {
            if let Err(e) = resolve(target, Some(none)) {
                out.push(format!("aliases.{name}: {e}"));
            }
        }
        let mut vms: Vec<&String> = self.virtual_models.keys().collect();
        vms.sort();
        for name in vms {
            if let Err(e) = resolve(name, Some(none)) {
                out.push(format!("virtual_models.\"{name}\": {e}"));
            }
        }
        for key in self.models.context_fallbacks.keys() {
            let at = format!("models.context_fallbacks.\"{key}\"");
            match chain::split_model_ref(key) {
                Some((provider, model)) if self.has_provider(provider) => {
                    let cand = chain::Candidate { provider: provider.into(), model: model.into() };
                    if let Err(e) = self.context_chain(&cand, 0) {
                        out.push(format!("{at}: {e}"));
                    }
                }
                Some((provider, _)) => {
                    out.push(format!("{at}: names unknown provider `{provider}` (configure [providers.{provider}])"))
                }
                None => out.push(format!("{at}: expected `provider/model`, the model that overflows")),
            }
        }
        for (agent, a) in &self.agents {
            for (i, f) in a.fallbacks.iter().flatten().enumerate() {
                if let Err(e) = resolve(f, Some(none)) {
                    out.push(format!("agents.{agent}.fallbacks[{i}]: {e}"));
                }
            }
            if let Some(models) = &a.models {
                out.extend(self.models_problems(models).into_iter().map(|e| format!("agents.{agent}.models: {e}")));
            }
        }
    }
}

/// The token in `file` (trimmed): an error that says why when it cannot be read or is empty.
/// The error never holds the file's content.
pub fn read_token_file(file: &Path) -> Result<String, String> {
    let text = std::fs::read_to_string(file).map_err(|e| format!("cannot read {}: {e}", file.display()))?;
    let token = text.trim();
    if token.is_empty() {
        return Err(format!("{} is empty", file.display()));
    }
    Ok(token.to_string())
}

/// What makes an `[[alerts]]` rule unusable: no name or a repeated one, no event, not exactly one
/// of `url` and `url_env`, a URL that is not http(s), a `json` rule without its signing key.
/// Why `rota serve` could not listen on `listen`, if it could not: it takes `HOST:PORT` (an IP
/// address, `[IPv6]` or a host name, and a port; 0 takes any free one).
fn listen_problem(listen: &str) -> Option<&'static str> {
    let Some((host, port)) = listen.rsplit_once(':') else {
        return Some("give HOST:PORT, e.g. \"127.0.0.1:8080\"");
    };
    if host.is_empty() {
        return Some("give the host too, e.g. \"127.0.0.1:8080\" (or \"0.0.0.0:8080\" for every address)");
    }
    if port.parse::<u16>().is_err() {
        return Some("the port must be a number up to 65535");
    }
    None
}

fn alert_problems(rules: &[super::AlertRule]) -> Vec<String> {
    use super::AlertFormat;
    let mut out = Vec::new();
    let mut names = std::collections::HashSet::new();
    for (i, r) in rules.iter().enumerate() {
        let key = format!("alerts[{i}]");
        if r.name.trim().is_empty() || r.name.len() > 64 {
            out.push(format!("{key}.name: give the rule a name of 1 to 64 characters"));
        } else if !names.insert(r.name.as_str()) {
            out.push(format!("{key}.name: `{}` names another rule too", r.name));
        }
        if r.on.is_empty() {
            out.push(format!("{key}.on: name at least one event"));
        }
        match (&r.url, &r.url_env) {
            (Some(_), Some(_)) | (None, None) => out.push(format!("{key}: give exactly one of `url` and `url_env`")),
            _ => match r.url() {
                None => out.push(format!(
                    "{key}.url_env: environment variable `{}` is unset or empty",
                    r.url_env.as_deref().unwrap_or_default()
                )),
                Some(url) if !matches!(url::Url::parse(&url), Ok(u) if u.scheme() == "http" || u.scheme() == "https") => {
                    out.push(format!("{key}: the webhook's URL is not an http(s) URL"))
                }
                Some(_) => {}
            },
        }
        match (r.format, &r.secret_env) {
            (AlertFormat::Json, None) => out.push(format!(
                "{key}.secret_env: a json webhook's bodies are signed; name the variable holding the key"
            )),
            (AlertFormat::Json, Some(var)) if r.secret().is_none() => {
                out.push(format!("{key}.secret_env: environment variable `{var}` is unset or empty"))
            }
            (AlertFormat::Slack, Some(_)) => {
                out.push(format!("{key}.secret_env: a Slack webhook is not signed (its URL is the secret); remove it"))
            }
            _ => {}
        }
        if r.cap == 0 {
            out.push(format!("{key}.cap: must be at least 1"));
        }
        if r.min_interval < std::time::Duration::from_secs(1) {
            out.push(format!("{key}.min_interval: must be at least 1s"));
        }
        if !(r.budget_share > 0.0 && r.budget_share <= 10.0) {
            out.push(format!("{key}.budget_share: must be above 0 and at most 10 (a share of the limit)"));
        }
    }
    out
}

/// What makes `[console.sso]` unusable: an issuer that is not https (loopback http aside), or no
/// way for anyone to get a role.
fn sso_problems(sso: &super::Sso) -> Vec<String> {
    let mut out = Vec::new();
    match url::Url::parse(&sso.issuer) {
        Ok(u) if u.scheme() == "https" => {}
        Ok(u) if u.scheme() == "http" && matches!(u.host_str(), Some("127.0.0.1" | "localhost" | "[::1]")) => {}
        _ => out.push(format!("console.sso.issuer: `{}` must be an https URL (http only on loopback)", sso.issuer)),
    }
    let listed = [&sso.roles.admin, &sso.roles.operator, &sso.roles.viewer].iter().any(|l| !l.is_empty());
    if sso.role_claim.is_none() && !listed {
        out.push("console.sso: give `role_claim` or `roles` lists: nobody would have a role".into());
    }
    if !sso.scopes.iter().any(|s| s == "openid") {
        out.push("console.sso.scopes: must include `openid`".into());
    }
    out
}
