//! Stage 2: the ordered list of models a request may be served by (docs/rotation.md).

use serde::Deserialize;
use std::collections::{BTreeMap, HashMap, HashSet};

/// How deep aliases and virtual models may nest.
pub const MAX_DEPTH: usize = 8;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Strategy {
    /// Targets in priority order.
    #[default]
    Failover,
    /// The first target is drawn by weight; the others follow in listed order.
    Weighted,
}

/// A virtual model's target: `"provider/model"` or `{ model = "…", weight = 3 }`.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum Target {
    Name(String),
    Weighted {
        model: String,
        #[serde(default = "one")]
        weight: u32,
    },
}

fn one() -> u32 {
    1
}

impl Target {
    pub fn model(&self) -> &str {
        match self {
            Target::Name(m) | Target::Weighted { model: m, .. } => m,
        }
    }
    fn weight(&self) -> u32 {
        match self {
            Target::Name(_) => 1,
            Target::Weighted { weight, .. } => *weight,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VirtualModel {
    pub targets: Vec<Target>,
    #[serde(default)]
    pub strategy: Strategy,
    /// `false`: only the chosen target is tried (the request's fallback list still applies).
    #[serde(default = "yes")]
    pub failover: bool,
}

fn yes() -> bool {
    true
}

/// The routing part of the configuration, borrowed.
#[derive(Clone, Copy)]
pub struct Routing<'a> {
    pub providers: &'a dyn Fn(&str) -> bool,
    pub aliases: &'a HashMap<String, String>,
    pub virtual_models: &'a HashMap<String, VirtualModel>,
    pub primary: Option<&'a str>,
    pub fallbacks: &'a [String],
}

/// `x-rota-fallbacks`: replace the fallback list for one request.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum FallbackOverride {
    #[default]
    Inherit,
    /// `none`
    NoFallback,
    List(Vec<String>),
}

/// The longest model name a request may give (docs/gateway.md, "Bounds at the door"): a longer
/// one is refused before anything is kept of it.
pub const MODEL_NAME_MAX: usize = 256;

/// The most models a request's own fallback list may name (`x-rota-fallbacks`, a lease's
/// `fallbacks`): each one may cost an upstream call per profile.
pub const FALLBACKS_MAX: usize = 16;

/// Checks the names a request gives (its model and its own fallbacks) against those bounds;
/// the error says which one it passes.
pub fn check_names(model: Option<&str>, fallbacks: &FallbackOverride) -> Result<(), String> {
    let long = |m: &str| m.len() > MODEL_NAME_MAX;
    if model.is_some_and(long) {
        return Err(format!("the model name is longer than {MODEL_NAME_MAX} bytes"));
    }
    if let FallbackOverride::List(list) = fallbacks {
        if list.len() > FALLBACKS_MAX {
            return Err(format!("{} fallbacks given: at most {FALLBACKS_MAX}", list.len()));
        }
        if list.iter().any(|m| long(m)) {
            return Err(format!("a fallback's model name is longer than {MODEL_NAME_MAX} bytes"));
        }
    }
    Ok(())
}

/// At most `MODEL_NAME_MAX` bytes of a name a client gave (cut on a character boundary): what
/// rota keeps of a refused request's model.
pub fn bounded(name: &str) -> &str {
    let mut end = name.len().min(MODEL_NAME_MAX);
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    &name[..end]
}

impl FallbackOverride {
    /// Parses the header value: `a/b,c/d` or `none`.
    pub fn parse(header: &str) -> FallbackOverride {
        let v = header.trim();
        if v.eq_ignore_ascii_case("none") || v.is_empty() {
            return FallbackOverride::NoFallback;
        }
        FallbackOverride::List(v.split(',').map(|s| s.trim().to_string()).filter(|s| !s.is_empty()).collect())
    }
}

#[derive(Clone, Debug, Default)]
pub struct ChainRequest<'a> {
    /// The request's `model`; `None` means the configured primary.
    pub model: Option<&'a str>,
    /// The agent's own fallbacks (`[agents.NAME] fallbacks`), which replace the global list.
    pub agent_fallbacks: Option<&'a [String]>,
    pub fallback_override: FallbackOverride,
    /// A random draw for weighted virtual models (injected so the engine stays pure).
    pub roll: u64,
    /// `failover.enabled`: `false` serves the first choice only.
    pub failover: bool,
    /// The names the agent may ask for (`[agents.NAME] models`): the model must be one of them,
    /// and only the models they resolve to are tried. `None`: any.
    pub allowed: Option<&'a [String]>,
}

/// One concrete model of the chain.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Candidate {
    pub provider: String,
    pub model: String,
}

impl Candidate {
    pub fn label(&self) -> String {
        format!("{}/{}", self.provider, self.model)
    }
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ChainError {
    #[error("no model requested and no `models.primary` configured")]
    NoModel,
    #[error("unknown model `{0}`: not an alias, a virtual model or `provider/model`")]
    UnknownModel(String),
    /// An unknown model that one configured provider could serve: said, never routed by guess.
    #[error("unknown model `{model}`: not an alias, a virtual model or `provider/model`; did you mean `{suggestion}`?")]
    UnknownModelSuggested { model: String, suggestion: String },
    #[error("`{model}` names unknown provider `{provider}` (configure [providers.{provider}])")]
    UnknownProvider { model: String, provider: String },
    #[error("virtual model or alias cycle: {}", .0.join(" → "))]
    Cycle(Vec<String>),
    #[error("aliases and virtual models nest deeper than {MAX_DEPTH}: {}", .0.join(" → "))]
    TooDeep(Vec<String>),
    #[error("virtual model `{0}` has no targets")]
    Empty(String),
    #[error("this agent may not use `{model}`; it may use: {}", .allowed.join(", "))]
    NotAllowed { model: String, allowed: Vec<String> },
}

/// Splits `provider/model` at the first `/` (model ids may hold more slashes).
pub fn split_model_ref(s: &str) -> Option<(&str, &str)> {
    s.split_once('/').filter(|(p, m)| !p.is_empty() && !m.is_empty())
}

/// Resolves the chain of one request.
pub fn resolve(routing: &Routing<'_>, req: &ChainRequest<'_>) -> Result<Vec<Candidate>, ChainError> {
    let name = req.model.or(routing.primary).ok_or(ChainError::NoModel)?;
    if let Some(allowed) = req.allowed
        && !allowed.iter().any(|a| a == name)
    {
        return Err(ChainError::NotAllowed { model: bounded(name).to_string(), allowed: allowed.to_vec() });
    }
    let mut out = Vec::new();
    expand(routing, name, &mut Vec::new(), req.roll, &mut out)?;
    let fallbacks: &[String] = match &req.fallback_override {
        FallbackOverride::List(l) => l,
        FallbackOverride::NoFallback => &[],
        FallbackOverride::Inherit => req.agent_fallbacks.unwrap_or(routing.fallbacks),
    };
    for f in fallbacks {
        expand(routing, f, &mut Vec::new(), req.roll, &mut out)?;
    }
    let mut seen = HashSet::new();
    out.retain(|c| seen.insert(c.clone()));
    if let Some(allowed) = req.allowed {
        let mut permitted = HashSet::new();
        for a in allowed {
            members(routing, a, 0, &mut permitted);
        }
        out.retain(|c| permitted.contains(c));
    }
    if !req.failover {
        out.truncate(1);
    }
    Ok(out)
}

/// Every model `name` may resolve to: an alias's target, each target of a virtual model
/// (whatever its strategy or draw), or `provider/model` itself.
fn members(r: &Routing<'_>, name: &str, depth: usize, out: &mut HashSet<Candidate>) {
    if depth > MAX_DEPTH {
        return;
    }
    if let Some(target) = r.aliases.get(name) {
        return members(r, target, depth + 1, out);
    }
    if let Some(vm) = r.virtual_models.get(name) {
        for t in &vm.targets {
            // A virtual model that shadows `provider/model` may list that model itself.
            match t.model() == name {
                true => out.extend(candidate(name)),
                false => members(r, t.model(), depth + 1, out),
            }
        }
        return;
    }
    out.extend(candidate(name));
}

fn candidate(name: &str) -> Option<Candidate> {
    let (provider, model) = split_model_ref(name)?;
    Some(Candidate { provider: provider.to_string(), model: model.to_string() })
}

/// docs/rotation.md `context_fallbacks`: the models to try, in order, when `overflowed` answered that
/// the request does not fit its context window; the lists are keyed by `provider/model`. Each
/// entry resolves like a fallback (an alias, a virtual model or `provider/model`). Empty when
/// none is configured for it.
pub fn context_chain(
    routing: &Routing<'_>,
    lists: &BTreeMap<String, Vec<String>>,
    overflowed: &Candidate,
    roll: u64,
) -> Result<Vec<Candidate>, ChainError> {
    let mut out = Vec::new();
    for name in lists.get(&overflowed.label()).into_iter().flatten() {
        expand(routing, name, &mut Vec::new(), roll, &mut out)?;
    }
    let mut seen = HashSet::new();
    out.retain(|c| c != overflowed && seen.insert(c.clone()));
    Ok(out)
}

fn expand(
    r: &Routing<'_>,
    name: &str,
    stack: &mut Vec<String>,
    roll: u64,
    out: &mut Vec<Candidate>,
) -> Result<(), ChainError> {
    let nested = r.aliases.contains_key(name) || r.virtual_models.contains_key(name);
    if nested && stack.iter().any(|s| s == name) {
        let mut path = stack.clone();
        path.push(name.to_string());
        return Err(ChainError::Cycle(path));
    }
    if nested && stack.len() >= MAX_DEPTH {
        let mut path = stack.clone();
        path.push(name.to_string());
        return Err(ChainError::TooDeep(path));
    }
    if let Some(target) = r.aliases.get(name) {
        stack.push(name.to_string());
        let res = expand(r, target, stack, roll, out);
        stack.pop();
        return res;
    }
    if let Some(vm) = r.virtual_models.get(name) {
        if vm.targets.is_empty() {
            return Err(ChainError::Empty(name.to_string()));
        }
        let mut targets: Vec<&Target> = vm.targets.iter().collect();
        if vm.strategy == Strategy::Weighted {
            let first = weighted_pick(&targets, roll);
            let chosen = targets.remove(first);
            targets.insert(0, chosen);
        }
        if !vm.failover {
            targets.truncate(1);
        }
        stack.push(name.to_string());
        for t in targets {
            // A virtual model that shadows `provider/model` may list that model itself.
            let res = if t.model() == name { concrete(r, name, out) } else { expand(r, t.model(), stack, roll, out) };
            if res.is_err() {
                stack.pop();
                return res;
            }
        }
        stack.pop();
        return Ok(());
    }
    concrete(r, name, out)
}

fn concrete(r: &Routing<'_>, name: &str, out: &mut Vec<Candidate>) -> Result<(), ChainError> {
    let (provider, model) = split_model_ref(name).ok_or_else(|| ChainError::UnknownModel(name.to_string()))?;
    if !(r.providers)(provider) {
        return Err(ChainError::UnknownProvider { model: name.to_string(), provider: provider.to_string() });
    }
    out.push(Candidate { provider: provider.to_string(), model: model.to_string() });
    Ok(())
}

fn weighted_pick(targets: &[&Target], roll: u64) -> usize {
    let total: u64 = targets.iter().map(|t| t.weight() as u64).sum();
    if total == 0 {
        return 0;
    }
    let mut point = roll % total;
    for (i, t) in targets.iter().enumerate() {
        let w = t.weight() as u64;
        if point < w {
            return i;
        }
        point -= w;
    }
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_past_their_bounds_are_refused_saying_which() {
        let none = FallbackOverride::Inherit;
        let long = "m".repeat(MODEL_NAME_MAX + 1);
        assert_eq!(check_names(Some(&"m".repeat(MODEL_NAME_MAX)), &none), Ok(()));
        assert_eq!(check_names(Some(&long), &none), Err("the model name is longer than 256 bytes".into()));
        let many = FallbackOverride::parse(&vec!["p/m"; FALLBACKS_MAX + 1].join(","));
        assert_eq!(check_names(None, &many), Err("17 fallbacks given: at most 16".into()));
        let one_long = FallbackOverride::List(vec![long.clone()]);
        assert!(check_names(None, &one_long).unwrap_err().contains("fallback's model name"));
        assert_eq!(bounded(&long).len(), MODEL_NAME_MAX);
        assert_eq!(bounded(&"é".repeat(200)).len(), 256, "cut on a character boundary");
        assert_eq!(bounded(&format!("{}é", "m".repeat(255))), "m".repeat(255));
    }

    struct Fixture {
        aliases: HashMap<String, String>,
        vms: HashMap<String, VirtualModel>,
        primary: Option<String>,
        fallbacks: Vec<String>,
    }

    fn known(p: &str) -> bool {
        ["openai", "anthropic", "gemini", "openrouter", "ollama"].contains(&p)
    }

    impl Fixture {
        fn new() -> Self {
            Fixture {
                aliases: HashMap::new(),
                vms: HashMap::new(),
                primary: Some("anthropic/claude-sonnet-4-5".into()),
                fallbacks: vec!["openai/gpt-4.1-mini".into()],
            }
        }
        fn vm(mut self, name: &str, targets: &[&str], strategy: Strategy, failover: bool) -> Self {
            let targets = targets.iter().map(|t| Target::Name(t.to_string())).collect();
            self.vms.insert(name.into(), VirtualModel { targets, strategy, failover });
            self
        }
        fn alias(mut self, from: &str, to: &str) -> Self {
            self.aliases.insert(from.into(), to.into());
            self
        }
        fn routing(&self) -> Routing<'_> {
            Routing {
                providers: &known,
                aliases: &self.aliases,
                virtual_models: &self.vms,
                primary: self.primary.as_deref(),
                fallbacks: &self.fallbacks,
            }
        }
        fn chain(&self, req: ChainRequest<'_>) -> Result<Vec<String>, ChainError> {
            resolve(&self.routing(), &req).map(|c| c.iter().map(Candidate::label).collect())
        }
        fn context(&self, lists: &[(&str, &[&str])], overflowed: &str) -> Result<Vec<String>, ChainError> {
            let lists = lists.iter().map(|(k, v)| (k.to_string(), v.iter().map(|s| s.to_string()).collect())).collect();
            let (provider, model) = split_model_ref(overflowed).unwrap();
            let cand = Candidate { provider: provider.into(), model: model.into() };
            context_chain(&self.routing(), &lists, &cand, 0).map(|c| c.iter().map(Candidate::label).collect())
        }
    }

    #[test]
    fn context_fallbacks_are_the_overflowed_models_own_list_resolved() {
        let f = Fixture::new().alias("big", "gemini/gemini-2.5-pro");
        let lists: &[(&str, &[&str])] = &[
            ("openai/gpt-4.1-mini", &["openai/gpt-4.1", "big", "openai/gpt-4.1", "openai/gpt-4.1-mini"]),
            ("openai/gpt-4.1", &["big"]),
        ];
        assert_eq!(
            f.context(lists, "openai/gpt-4.1-mini").unwrap(),
            ["openai/gpt-4.1", "gemini/gemini-2.5-pro"],
            "aliases resolved; duplicates and the overflowed model itself dropped"
        );
        assert_eq!(f.context(lists, "anthropic/claude-sonnet-4-5").unwrap(), Vec::<String>::new(), "none configured");
        assert_eq!(
            f.context(&[("openai/gpt-4.1", &["nope/x"])], "openai/gpt-4.1"),
            Err(ChainError::UnknownProvider { model: "nope/x".into(), provider: "nope".into() })
        );
    }

    fn req(model: Option<&str>) -> ChainRequest<'_> {
        ChainRequest { model, failover: true, ..Default::default() }
    }

    #[test]
    fn missing_model_means_the_primary_then_fallbacks() {
        assert_eq!(Fixture::new().chain(req(None)).unwrap(), ["anthropic/claude-sonnet-4-5", "openai/gpt-4.1-mini"]);
    }

    #[test]
    fn no_model_and_no_primary_is_an_error() {
        let mut f = Fixture::new();
        f.primary = None;
        assert_eq!(f.chain(req(None)), Err(ChainError::NoModel));
    }

    #[test]
    fn model_ref_splits_at_the_first_slash() {
        let f = Fixture::new();
        assert_eq!(
            f.chain(req(Some("openrouter/meta-llama/llama-3.3-70b"))).unwrap()[0],
            "openrouter/meta-llama/llama-3.3-70b"
        );
        assert_eq!(
            split_model_ref("openrouter/meta-llama/llama-3.3-70b"),
            Some(("openrouter", "meta-llama/llama-3.3-70b"))
        );
        assert_eq!(split_model_ref("gpt-4"), None);
        assert_eq!(split_model_ref("/gpt-4"), None);
    }

    #[test]
    fn alias_resolves_before_the_chain() {
        let f = Fixture::new().alias("fast", "openai/gpt-4.1-mini");
        assert_eq!(
            f.chain(req(Some("fast"))).unwrap(),
            ["openai/gpt-4.1-mini"],
            "the fallback duplicates the primary and is dropped"
        );
    }

    #[test]
    fn unknown_model_and_unknown_provider_are_errors() {
        let f = Fixture::new();
        assert_eq!(f.chain(req(Some("gpt-4"))), Err(ChainError::UnknownModel("gpt-4".into())));
        assert_eq!(
            f.chain(req(Some("nope/x"))),
            Err(ChainError::UnknownProvider { model: "nope/x".into(), provider: "nope".into() })
        );
    }

    #[test]
    fn fallback_naming_unknown_provider_is_an_error() {
        let mut f = Fixture::new();
        f.fallbacks = vec!["mystery/model".into()];
        assert!(matches!(f.chain(req(None)), Err(ChainError::UnknownProvider { .. })));
    }

    #[test]
    fn failover_virtual_model_lists_targets_in_priority_order() {
        let f =
            Fixture::new().vm("smart", &["anthropic/claude-sonnet-4-5", "openai/gpt-4.1"], Strategy::Failover, true);
        assert_eq!(
            f.chain(req(Some("smart"))).unwrap(),
            ["anthropic/claude-sonnet-4-5", "openai/gpt-4.1", "openai/gpt-4.1-mini"]
        );
    }

    #[test]
    fn weighted_virtual_model_draws_the_first_target_by_weight() {
        let mut f = Fixture::new();
        f.fallbacks.clear();
        f.vms.insert(
            "mix".into(),
            VirtualModel {
                targets: vec![
                    Target::Weighted { model: "openai/a".into(), weight: 1 },
                    Target::Weighted { model: "openai/b".into(), weight: 3 },
                    Target::Name("openai/c".into()),
                ],
                strategy: Strategy::Weighted,
                failover: true,
            },
        );
        let pick = |roll| f.chain(ChainRequest { roll, ..req(Some("mix")) }).unwrap();
        assert_eq!(pick(0), ["openai/a", "openai/b", "openai/c"]);
        assert_eq!(pick(1), ["openai/b", "openai/a", "openai/c"]);
        assert_eq!(pick(3), ["openai/b", "openai/a", "openai/c"]);
        assert_eq!(pick(4), ["openai/c", "openai/a", "openai/b"]);
        assert_eq!(pick(5), ["openai/a", "openai/b", "openai/c"]);
    }

    #[test]
    fn virtual_model_without_failover_contributes_only_its_first_target() {
        let f = Fixture::new().vm("one", &["openai/a", "openai/b"], Strategy::Failover, false);
        assert_eq!(f.chain(req(Some("one"))).unwrap(), ["openai/a", "openai/gpt-4.1-mini"]);
    }

    #[test]
    fn virtual_models_chain_through_other_virtual_models() {
        let f = Fixture::new().vm("inner", &["openai/a", "openai/b"], Strategy::Failover, true).vm(
            "outer",
            &["anthropic/x", "inner"],
            Strategy::Failover,
            true,
        );
        assert_eq!(
            f.chain(req(Some("outer"))).unwrap(),
            ["anthropic/x", "openai/a", "openai/b", "openai/gpt-4.1-mini"]
        );
    }

    #[test]
    fn virtual_model_cycle_is_detected() {
        let f = Fixture::new().vm("a", &["b"], Strategy::Failover, true).vm("b", &["a"], Strategy::Failover, true);
        assert_eq!(f.chain(req(Some("a"))), Err(ChainError::Cycle(vec!["a".into(), "b".into(), "a".into()])));
        let f = Fixture::new().alias("x", "y").alias("y", "x");
        assert!(matches!(f.chain(req(Some("x"))), Err(ChainError::Cycle(_))));
    }

    #[test]
    fn nesting_deeper_than_eight_is_refused() {
        let mut f = Fixture::new();
        for i in 0..8 {
            f = f.vm(&format!("v{i}"), &[&format!("v{}", i + 1)], Strategy::Failover, true);
        }
        f = f.vm("v8", &["openai/a"], Strategy::Failover, true);
        assert!(matches!(f.chain(req(Some("v0"))), Err(ChainError::TooDeep(p)) if p.len() == 9), "nine levels");
        assert_eq!(f.chain(req(Some("v1"))).unwrap()[0], "openai/a", "depth 8 is allowed");
    }

    #[test]
    fn concrete_model_gets_the_chain_of_a_virtual_model_that_shadows_it() {
        let f = Fixture::new().vm(
            "openai/gpt-4.1",
            &["openai/gpt-4.1", "openrouter/openai/gpt-4.1"],
            Strategy::Failover,
            true,
        );
        assert_eq!(
            f.chain(req(Some("openai/gpt-4.1"))).unwrap(),
            ["openai/gpt-4.1", "openrouter/openai/gpt-4.1", "openai/gpt-4.1-mini"]
        );
    }

    #[test]
    fn agent_fallbacks_replace_the_global_list() {
        let f = Fixture::new();
        let mine = vec!["gemini/gemini-2.5-flash".to_string()];
        let got = f.chain(ChainRequest { agent_fallbacks: Some(&mine), ..req(None) }).unwrap();
        assert_eq!(got, ["anthropic/claude-sonnet-4-5", "gemini/gemini-2.5-flash"]);
        let none: Vec<String> = vec![];
        let got = f.chain(ChainRequest { agent_fallbacks: Some(&none), ..req(None) }).unwrap();
        assert_eq!(got, ["anthropic/claude-sonnet-4-5"], "[] means no fallback");
    }

    #[test]
    fn per_request_override_beats_agent_fallbacks() {
        let f = Fixture::new();
        let mine = vec!["gemini/gemini-2.5-flash".to_string()];
        let over = FallbackOverride::parse("ollama/qwen3:8b, openai/gpt-4.1");
        let got = f.chain(ChainRequest { agent_fallbacks: Some(&mine), fallback_override: over, ..req(None) }).unwrap();
        assert_eq!(got, ["anthropic/claude-sonnet-4-5", "ollama/qwen3:8b", "openai/gpt-4.1"]);
        let got = f.chain(ChainRequest { fallback_override: FallbackOverride::parse("none"), ..req(None) }).unwrap();
        assert_eq!(got, ["anthropic/claude-sonnet-4-5"]);
    }

    #[test]
    fn an_agent_asks_only_for_its_models_and_falls_back_only_within_them() {
        let f = Fixture::new()
            .vm("fast", &["openai/gpt-4.1-mini", "gemini/gemini-2.5-flash"], Strategy::Weighted, false)
            .vm("smart", &["anthropic/claude-opus-4-1", "openai/gpt-4.1"], Strategy::Failover, true)
            .alias("quick", "fast");
        let fast = vec!["fast".to_string()];
        let only = |model, over: &str| ChainRequest {
            allowed: Some(&fast),
            fallback_override: FallbackOverride::parse(over),
            ..req(model)
        };
        assert_eq!(
            f.chain(only(Some("smart"), "")),
            Err(ChainError::NotAllowed { model: "smart".into(), allowed: fast.clone() })
        );
        assert_eq!(
            f.chain(only(Some("smart"), "")).unwrap_err().to_string(),
            "this agent may not use `smart`; it may use: fast"
        );
        assert!(matches!(f.chain(only(None, "")), Err(ChainError::NotAllowed { .. })), "nor the primary");
        assert!(matches!(f.chain(only(Some("quick"), "")), Err(ChainError::NotAllowed { .. })), "the name as asked");
        assert!(matches!(f.chain(only(Some("openai/gpt-4.1-mini"), "")), Err(ChainError::NotAllowed { .. })));
        // Its one draw, then the global fallback (gpt-4.1-mini is one of fast's targets); a
        // fallback outside the list is never tried, whoever names it.
        let got = f.chain(only(Some("fast"), "anthropic/claude-sonnet-4-5, smart, gemini/gemini-2.5-flash")).unwrap();
        assert!(got.iter().all(|m| m == "openai/gpt-4.1-mini" || m == "gemini/gemini-2.5-flash"), "{got:?}");
        assert_eq!(got.len(), 2, "{got:?}");
        let global = f.chain(ChainRequest { allowed: Some(&fast), roll: 1, ..req(Some("fast")) }).unwrap();
        assert_eq!(global, ["gemini/gemini-2.5-flash", "openai/gpt-4.1-mini"], "the global fallback is one of fast's");
        let direct = vec!["openai/gpt-4.1".to_string(), "smart".to_string()];
        let got = f.chain(ChainRequest { allowed: Some(&direct), ..req(Some("openai/gpt-4.1")) }).unwrap();
        assert_eq!(got, ["openai/gpt-4.1"], "gpt-4.1-mini (the global fallback) is outside the list");
        assert_eq!(
            f.chain(ChainRequest { allowed: Some(&direct), ..req(Some("smart")) }).unwrap(),
            ["anthropic/claude-opus-4-1", "openai/gpt-4.1"]
        );
    }

    #[test]
    fn candidates_are_deduplicated_keeping_the_first() {
        let mut f = Fixture::new();
        f.fallbacks = vec!["openai/x".into(), "anthropic/claude-sonnet-4-5".into(), "openai/x".into()];
        assert_eq!(f.chain(req(None)).unwrap(), ["anthropic/claude-sonnet-4-5", "openai/x"]);
    }

    #[test]
    fn failover_disabled_serves_the_first_choice_only() {
        let f = Fixture::new().vm("smart", &["anthropic/a", "openai/b"], Strategy::Failover, true);
        assert_eq!(f.chain(ChainRequest { failover: false, ..req(Some("smart")) }).unwrap(), ["anthropic/a"]);
    }

    #[test]
    fn weighted_targets_parse_from_toml() {
        let vm: VirtualModel =
            toml::from_str("strategy = \"weighted\"\ntargets = [\"openai/a\", { model = \"openai/b\", weight = 3 }]")
                .unwrap();
        assert_eq!(vm.targets[1], Target::Weighted { model: "openai/b".into(), weight: 3 });
        assert!(vm.failover);
    }
}
