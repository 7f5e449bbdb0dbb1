use super::*;
use crate::engine::CooldownPolicy;
use crate::engine::order::Rotation;
use std::time::Duration;

fn parse(text: &str) -> Config {
    Config::from_toml(text).unwrap_or_else(|e| panic!("{e}"))
}

const BASE: &str = r#"
[providers.openai]
api = "openai"
base_url = "https://api.openai.com/v1"
[providers.anthropic]
api = "anthropic"
base_url = "https://api.anthropic.com"
"#;

#[test]
fn one_run_reports_schema_and_semantic_problems_together() {
    let text = "[providers.openai]\napi = \"openai\"\nbase_url = \"https://api.openai.com/v1\"\nbsae_url = \"x\"\n\
                [models]\nprimary = \"openai/gpt-4.1\"\nfallbacks = [\"nowhere/x\"]\n";
    let err = Config::from_toml(text).unwrap_err().to_string();
    assert!(err.contains("bsae_url"), "the typo: {err}");
    assert!(err.contains("nowhere"), "and the unknown provider of a fallback, in the same run: {err}");
}

#[test]
fn empty_config_has_spec_defaults() {
    let c = parse("");
    assert_eq!(c.server.listen, "127.0.0.1:8080");
    assert_eq!(c.database.url, "sqlite://rota.db");
    assert_eq!(c.cooldown_policy(), CooldownPolicy::default());
    assert!(c.failover.enabled);
    assert_eq!(c.rotation.order, Rotation::Lru);
    assert!(c.problems().is_empty());
}

#[test]
fn durations_accept_text_and_seconds() {
    let c = parse("[cooldown]\nbase = \"30s\"\nmax = 7200\nfailure_window = \"1h30m\"");
    assert_eq!(c.cooldown.base, Duration::from_secs(30));
    assert_eq!(c.cooldown.max, Duration::from_secs(7200));
    assert_eq!(c.cooldown.failure_window, Duration::from_secs(5400));
}

#[test]
fn invalid_duration_names_the_key() {
    let err = Config::from_toml("[cooldown]\nbase = \"soon\"").unwrap_err().to_string();
    assert!(err.contains("cooldown.base") && err.contains("invalid duration `soon`"), "{err}");
}

#[test]
fn unknown_key_is_refused_naming_it() {
    let err = Config::from_toml("[server]\nlisten = \"x\"\nport = 1").unwrap_err().to_string();
    assert!(err.contains("port"), "{err}");
}

#[test]
fn every_error_is_reported_at_once_with_its_path_and_a_suggestion() {
    let text = r#"
[server]
listn = "127.0.0.1:9"
[cooldown]
base = "soon"
[providers.openai]
api = "opnai"
base_ur = "https://api.openai.com/v1"
[providers.ok]
api = "openai"
base_url = "https://x.test/v1"
[modles]
primary = "ok/m"
[auth.profiles."ok:w"]
provider = "ok"
expires = "tomorrow"
"#;
    let err = Config::from_toml(text).unwrap_err();
    let lines = err.0.clone();
    let want = [
        "key `auth.profiles.\"ok:w\".expires`: ",
        "key `cooldown.base`: invalid duration `soon`",
        "key `modles`: unknown key; did you mean `models`?",
        "key `providers.openai.api`: unknown value `opnai`; did you mean `openai`?",
        "key `providers.openai.base_ur`: unknown key; did you mean `base_url`?",
        "key `server.listn`: unknown key; did you mean `listen`?",
    ];
    assert_eq!(lines.len(), want.len() + 1, "{lines:#?}");
    for (line, want) in lines.iter().zip(want) {
        assert!(line.starts_with(&format!("TOML source string: {want}")), "{line}\nwanted: {want}");
    }
    // And, in the same run, the problems of what is left: the profile names no secret.
    assert!(lines[want.len()].starts_with("auth.profiles.\"ok:w\".api_key_env: missing"), "{lines:#?}");
    assert!(!err.to_string().contains("``") && !err.to_string().contains("`one of"), "{err}");
    assert!(
        lines[..want.len()].iter().all(|l| !l.contains("missing")),
        "a refused required key is not also missing: {err}"
    );
}

#[test]
fn an_unknown_key_far_from_every_name_lists_the_valid_ones() {
    let err_of = |text: &str| {
        let e = Config::from_toml(text).unwrap_err().to_string();
        e.strip_prefix("TOML source string: ").unwrap_or(&e).to_string()
    };
    let err = err_of("[failover]\nwhatever = true");
    assert_eq!(err, "key `failover.whatever`: unknown key; expected `enabled`");
    let err = err_of("[providers.x]\napi = \"grpc\"\nbase_url = \"http://h\"");
    assert_eq!(
        err,
        "key `providers.x.api`: unknown value `grpc`; expected one of `openai`, `openai-chat`, `openai-responses` or `anthropic`"
    );
    let err = err_of("[providers.x]\napi = \"openai\"");
    assert_eq!(
        err,
        "key `providers.x`: missing `base_url`, which is required without a `preset` that sets it (docs/providers.md)"
    );
    let err = err_of("[models]\nfallbacks = [\"a/b\", 3]");
    assert!(err.starts_with("key `models.fallbacks[1]`: expected a string, found"), "{err}");
}

#[test]
fn did_you_mean_takes_only_likely_typos() {
    let names = ["base_url", "api", "oauth", "confirm_path"];
    assert_eq!(did_you_mean("base_ur", &names), Some("base_url"));
    assert_eq!(did_you_mean("BaseUrl", &names), Some("base_url"));
    assert_eq!(did_you_mean("baseurl", &names), Some("base_url"));
    assert_eq!(did_you_mean("apu", &names), Some("api"));
    assert_eq!(did_you_mean("oatuh", &names), Some("oauth"));
    assert_eq!(did_you_mean("model", &names), None);
}

#[test]
fn prices_are_checked_at_load_each_with_its_key() {
    let text = r#"
[prices]
"gpt-4.1" = { input = -1, output = 8 }
"openai/o3" = { input = 2, output = nan }
"local" = { input = 0, output = 0 }
[prices.mine]
input = 1
output = inf
cached_inpt = 0.1
[prices.half]
input = 1
"#;
    let err = Config::from_toml(text).unwrap_err();
    let lines: Vec<&str> = err.0.iter().map(|l| l.strip_prefix("TOML source string: ").unwrap_or(l)).collect();
    let invalid = "a price is USD per million tokens, a finite number of 0 or more";
    assert_eq!(lines.len(), 5, "{lines:#?}");
    for (key, says) in [
        ("prices.\"gpt-4.1\".input", "invalid price `-1`"),
        ("prices.\"openai/o3\".output", "invalid price `NaN`"),
        ("prices.mine.output", "invalid price `inf`"),
        ("prices.mine.cached_inpt", "unknown key; did you mean `cached_input`?"),
        ("prices.half", "missing `output`, which is required"),
    ] {
        let line = format!("key `{key}`: {says}");
        assert!(lines.iter().any(|l| l.starts_with(&line)), "{line}\nnot in {lines:#?}");
    }
    assert!(lines.iter().filter(|l| l.contains("invalid price")).all(|l| l.ends_with(invalid)), "{lines:#?}");
    let c = parse(
        "[prices]\n\"anthropic/claude-sonnet-4-5\" = { input = 3, output = 15, cached_input = 0.3, cache_write = 3.75 }",
    );
    assert_eq!(c.prices["anthropic/claude-sonnet-4-5"].cache_write, Some(3.75));
    assert!(c.problems().is_empty());
}

#[test]
fn malformed_profile_id_in_order_is_refused() {
    let err = Config::from_toml("[auth.order]\nopenai = [\"work\"]").unwrap_err().to_string();
    assert!(err.contains("malformed profile id `work`"), "{err}");
}

#[test]
fn unset_api_key_env_is_a_problem_naming_the_variable() {
    let c = parse(&format!(
        "{BASE}\n[auth.profiles.\"openai:work\"]\nprovider = \"openai\"\ntype = \"api_key\"\napi_key_env = \"ROTA_TEST_SURELY_UNSET_VAR\""
    ));
    assert_eq!(
        c.problems(),
        [
            "auth.profiles.\"openai:work\".api_key_env: environment variable `ROTA_TEST_SURELY_UNSET_VAR` is unset or empty"
        ]
    );
}

#[test]
fn context_fallbacks_are_checked_at_load() {
    for (entry, problem) in [
        ("\"gpt-4.1\" = [\"openai/o3\"]", "models.context_fallbacks.\"gpt-4.1\": expected `provider/model`"),
        ("\"nope/x\" = [\"openai/o3\"]", "models.context_fallbacks.\"nope/x\": names unknown provider `nope`"),
        (
            "\"openai/gpt-4.1\" = [\"nope/x\"]",
            "models.context_fallbacks.\"openai/gpt-4.1\": `nope/x` names unknown provider `nope`",
        ),
    ] {
        let c = parse(&format!("{BASE}\n[models.context_fallbacks]\n{entry}"));
        assert!(c.problems().iter().any(|p| p.starts_with(problem)), "{entry}: {:?}", c.problems());
    }
    let c = parse(&format!(
        "{BASE}\n[models.context_fallbacks]\n\"openai/gpt-4.1-mini\" = [\"anthropic/claude-sonnet-4-5\"]"
    ));
    assert_eq!(c.problems(), Vec::<String>::new());
}

#[test]
fn profile_provider_must_match_its_id_and_exist() {
    let c = parse(&format!("{BASE}\n[auth.profiles.\"openai:x\"]\nprovider = \"azure\"\napi_key_env = \"PATH\""));
    let p = c.problems();
    assert!(p.iter().any(|m| m.contains("does not match")), "{p:?}");
    assert!(p.iter().any(|m| m.contains("unknown provider `azure`")), "{p:?}");
}

#[test]
fn fallback_naming_unknown_provider_is_a_problem() {
    let c = parse(&format!("{BASE}\n[models]\nprimary = \"openai/gpt-4.1\"\nfallbacks = [\"mystery/m\"]"));
    assert_eq!(
        c.problems(),
        ["models.fallbacks[0]: `mystery/m` names unknown provider `mystery` (configure [providers.mystery])"]
    );
}

#[test]
fn virtual_model_cycle_is_a_problem() {
    let c = parse(&format!("{BASE}\n[virtual_models.a]\ntargets = [\"b\"]\n[virtual_models.b]\ntargets = [\"a\"]"));
    let p = c.problems();
    assert_eq!(p.len(), 2, "{p:?}");
    assert!(p[0].starts_with("virtual_models.\"a\": virtual model or alias cycle: a → b → a"), "{p:?}");
}

#[test]
fn agent_fallbacks_are_checked() {
    let c = parse(&format!("{BASE}\n[agents.planner]\nfallbacks = [\"nope/x\"]"));
    assert_eq!(c.problems().len(), 1);
    assert!(c.problems()[0].starts_with("agents.planner.fallbacks[0]"));
}

#[test]
fn agent_models_are_checked() {
    let c = parse(&format!(
        "{BASE}\n[agents.planner]\nmodels = [\"nope/x\", \"openai/gpt-4.1\"]\n[agents.none]\nmodels = []"
    ));
    assert_eq!(
        c.problems(),
        [
            "agents.none.models: lists no model (leave it out to allow any)",
            "agents.planner.models: `nope/x` names unknown provider `nope` (configure [providers.nope])"
        ]
    );
}

#[test]
fn agent_limits_are_checked_all_at_once() {
    let c = parse(&format!(
        "{BASE}\n[agents.planner]\nrequests_per_minute = 0\ntokens_per_day = -5\ncost_per_day = 0.0\n\
         [agents.ok]\nrequests_per_minute = 5\ntokens_per_day = 1000\ncost_per_day = 2.5"
    ));
    assert_eq!(
        c.problems(),
        [
            "agents.planner.requests_per_minute: must be an integer of at least 1",
            "agents.planner.tokens_per_day: must be an integer of at least 1",
            "agents.planner.cost_per_day: must be a number of USD above 0",
        ]
    );
    assert_eq!(c.agents["ok"].limits().requests_per_minute, Some(5));
    let wrong = Config::from_toml("[agents.planner]\nrequests_per_minute = \"five\"").unwrap_err().to_string();
    assert!(wrong.contains("requests_per_minute"), "{wrong}");
}

#[test]
fn a_limit_in_the_config_file_wins_over_the_stored_one_key_by_key() {
    let c = parse(&format!("{BASE}\n[agents.planner]\nrequests_per_minute = 5"));
    let stored = crate::agents::Limits { requests_per_minute: Some(50), tokens_per_day: Some(9), cost_per_day: None };
    let agent = crate::agents::Agent {
        id: "1".into(),
        name: "planner".into(),
        admin: false,
        created_at: 0,
        revoked_at: None,
        limits: stored,
        models: None,
    };
    let l = c.agent_limits(&agent);
    assert_eq!((l.requests_per_minute, l.tokens_per_day, l.cost_per_day), (Some(5), Some(9), None));
    let other = crate::agents::Agent { name: "other".into(), ..agent };
    assert_eq!(c.agent_limits(&other), stored);
}

#[test]
fn spec_example_config_parses() {
    let c = parse(include_str!("../../rota.example.toml"));
    assert!(c.has_provider("corp"));
    assert_eq!(c.virtual_models["smart"].targets.len(), 2);
    assert_eq!(c.agents["planner"].fallbacks, Some(vec![]));
}

/// Per preset (docs/providers.md): the wire format, base URL, key header, confirming call and
/// quota families it resolves to, with the keys it filled.
#[test]
fn each_preset_resolves_its_url_header_and_quota_family() {
    use super::Preset;
    /// The preset, the keys it needs, then what it resolves to.
    type Case = (&'static str, &'static str, WireFormat, &'static str, KeyHeader, &'static [QuotaFamily]);
    let cases: [Case; 13] = [
        ("openai", "", WireFormat::Openai, "https://api.openai.com/v1", KeyHeader::Bearer, &[QuotaFamily::Openai]),
        (
            "anthropic",
            "",
            WireFormat::Anthropic,
            "https://api.anthropic.com",
            KeyHeader::XApiKey,
            &[QuotaFamily::Anthropic],
        ),
        (
            "azure-openai",
            "resource = \"contoso-eu\"",
            WireFormat::Openai,
            "https://contoso-eu.openai.azure.com/openai/v1",
            KeyHeader::ApiKey,
            &[QuotaFamily::Openai],
        ),
        (
            "vertex",
            "project = \"acme-ml\"\nlocation = \"europe-west4\"",
            WireFormat::OpenaiChat,
            "https://europe-west4-aiplatform.googleapis.com/v1/projects/acme-ml/locations/europe-west4/endpoints/openapi",
            KeyHeader::Bearer,
            &[],
        ),
        (
            "gemini",
            "",
            WireFormat::OpenaiChat,
            "https://generativelanguage.googleapis.com/v1beta/openai",
            KeyHeader::Bearer,
            &[],
        ),
        (
            "openrouter",
            "",
            WireFormat::OpenaiChat,
            "https://openrouter.ai/api/v1",
            KeyHeader::Bearer,
            &[QuotaFamily::Openai],
        ),
        (
            "groq",
            "",
            WireFormat::OpenaiChat,
            "https://api.groq.com/openai/v1",
            KeyHeader::Bearer,
            &[QuotaFamily::Openai],
        ),
        ("mistral", "", WireFormat::OpenaiChat, "https://api.mistral.ai/v1", KeyHeader::Bearer, &[]),
        ("deepseek", "", WireFormat::OpenaiChat, "https://api.deepseek.com", KeyHeader::Bearer, &[]),
        ("xai", "", WireFormat::Openai, "https://api.x.ai/v1", KeyHeader::Bearer, &[]),
        ("together", "", WireFormat::OpenaiChat, "https://api.together.xyz/v1", KeyHeader::Bearer, &[]),
        ("ollama", "", WireFormat::OpenaiChat, "http://127.0.0.1:11434/v1", KeyHeader::Bearer, &[]),
        (
            "codex",
            "",
            WireFormat::OpenaiResponses,
            "https://chatgpt.com/backend-api/codex",
            KeyHeader::Bearer,
            &[QuotaFamily::Codex],
        ),
    ];
    assert_eq!(cases.map(|c| c.0), Preset::ALL.map(Preset::as_str), "every preset has its case");
    for (preset, keys, api, base_url, header, quota) in cases {
        let c = parse(&format!("[providers.p]\npreset = \"{preset}\"\n{keys}\n"));
        let p = &c.providers["p"];
        assert_eq!(p.preset.map(Preset::as_str), Some(preset));
        assert_eq!(
            (p.api, p.base_url.as_str(), p.key_header, p.quota.as_slice()),
            (api, base_url, header, quota),
            "{preset}"
        );
        assert!(p.confirm_path.starts_with('/'), "{preset}");
        for key in ["api", "base_url", "key_header", "confirm_path", "quota"] {
            assert!(p.filled.contains(&key), "{preset} filled {key}: {:?}", p.filled);
        }
        assert!(c.problems().is_empty(), "{preset}: {:?}", c.problems());
    }
    // `global` has no regional host; Claude models answer at the Anthropic publisher's URL.
    let c = parse("[providers.v]\npreset = \"vertex\"\nproject = \"p1\"\nlocation = \"global\"");
    let v = &c.providers["v"];
    assert_eq!(v.base_url, "https://aiplatform.googleapis.com/v1/projects/p1/locations/global/endpoints/openapi");
    assert_eq!(
        v.claude_base_url.as_deref(),
        Some("https://aiplatform.googleapis.com/v1/projects/p1/locations/global/publishers/anthropic/models")
    );
    assert_eq!(
        (v.api_for("claude-sonnet-4-5@20250929"), v.api_for("google/gemini-2.5-pro")),
        (WireFormat::Anthropic, WireFormat::OpenaiChat)
    );
    assert!(v.filled.contains(&"claude_base_url"));
    assert!(c.providers.values().all(|p| p.preset.is_none() || p.claude_base_url.is_some()));
}

#[test]
fn keys_beside_a_preset_override_what_it_fills() {
    let c = parse(
        "[providers.az]\npreset = \"azure-openai\"\nresource = \"r\"\nbase_url = \"http://127.0.0.1:9/openai/v1\"\n\
         key_header = \"bearer\"\nquota = []\napi = \"openai-chat\"\nconfirm_path = \"/ping\"",
    );
    let p = &c.providers["az"];
    assert_eq!(
        (p.api, p.base_url.as_str(), p.key_header),
        (WireFormat::OpenaiChat, "http://127.0.0.1:9/openai/v1", KeyHeader::Bearer)
    );
    assert_eq!((p.quota.as_slice(), p.confirm_path.as_str()), (&[][..], "/ping"));
    assert_eq!(p.filled, ["client_credentials"], "the one key left to the preset");
    let cc = p.client_credentials.as_ref().unwrap();
    assert_eq!(cc.token_url, "https://login.microsoftonline.com/organizations/oauth2/v2.0/token");
    assert_eq!(cc.scopes, ["https://cognitiveservices.azure.com/.default"]);
    // Without a preset, the wire format decides as before.
    let c = parse(BASE);
    assert_eq!(
        (c.providers["anthropic"].key_header, c.providers["anthropic"].confirm_path.as_str()),
        (KeyHeader::XApiKey, "/v1/models")
    );
    assert_eq!(c.providers["openai"].quota, [QuotaFamily::Openai]);
    assert!(c.providers["openai"].preset.is_none() && c.providers["openai"].filled.is_empty());
}

#[test]
fn a_preset_sign_in_needs_a_client_id_and_fills_the_endpoints() {
    // Azure: no sign-in until the operator gives the app's client id; then Entra's endpoints.
    let c = parse("[providers.az]\npreset = \"azure-openai\"\nresource = \"r\"\ntenant = \"contoso.onmicrosoft.com\"");
    assert!(c.providers["az"].oauth.is_none());
    let c = parse(
        "[providers.az]\npreset = \"azure-openai\"\nresource = \"r\"\ntenant = \"contoso.onmicrosoft.com\"\n\
         [providers.az.oauth]\nclient_id = \"11111111-2222-3333-4444-555555555555\"",
    );
    let o = c.providers["az"].oauth.as_ref().unwrap();
    assert_eq!(o.token_url, "https://login.microsoftonline.com/contoso.onmicrosoft.com/oauth2/v2.0/token");
    assert_eq!(
        o.device_url.as_deref(),
        Some("https://login.microsoftonline.com/contoso.onmicrosoft.com/oauth2/v2.0/devicecode")
    );
    assert_eq!(o.scopes, ["https://cognitiveservices.azure.com/.default", "offline_access", "openid", "profile"]);
    assert!(c.providers["az"].filled.contains(&"oauth") && !o.chatgpt);
    // Google: the operator's client; no device flow (it does not grant cloud-platform).
    let c = parse(
        "[providers.v]\npreset = \"vertex\"\nproject = \"p\"\nlocation = \"global\"\n[providers.v.oauth]\nclient_id = \"g\"",
    );
    let o = c.providers["v"].oauth.as_ref().unwrap();
    assert_eq!((o.token_url.as_str(), o.device_url.as_deref()), ("https://oauth2.googleapis.com/token", None));
    assert_eq!(o.scopes, ["https://www.googleapis.com/auth/cloud-platform", "openid", "email"]);
    assert_eq!(o.extra_params["access_type"], "offline");
    // Codex brings the Codex CLI's own client, its registered redirect (the paste flow) and
    // ChatGPT's device flow.
    let c = parse("[providers.chatgpt]\npreset = \"codex\"");
    let o = c.providers["chatgpt"].oauth.as_ref().unwrap();
    assert_eq!(
        (o.client_id.as_str(), o.redirect_uri.as_deref()),
        ("app_EMoamEEZ73f0CkXaXp7hrann", Some("http://localhost:1455/auth/callback"))
    );
    assert_eq!(o.authorize_url, "https://auth.openai.com/oauth/authorize");
    assert_eq!(o.device_url.as_deref(), Some("https://auth.openai.com/api/accounts/deviceauth/usercode"));
    assert!(o.chatgpt);
}

#[test]
fn a_preset_names_the_keys_it_lacks_and_refuses_what_cannot_go_in_a_host_name() {
    let err = |text: &str| Config::from_toml(text).unwrap_err().to_string();
    let e = err("[providers.az]\npreset = \"azure-openai\"");
    assert!(e.contains("providers.az") && e.contains("preset `azure-openai` needs `resource`"), "{e}");
    let e = err("[providers.v]\npreset = \"vertex\"\nproject = \"p\"");
    assert!(e.contains("needs `location`"), "{e}");
    let e = err("[providers.az]\npreset = \"azure-openai\"\nresource = \"evil.example/x?\"");
    assert!(e.contains("`resource` = `evil.example/x?` may only hold letters, digits, `-` and `.`"), "{e}");
    let e = err("[providers.az]\npreset = \"azure-openai\"\nresource = \"r\"\ntenant = \"a/b\"");
    assert!(e.contains("`tenant`"), "{e}");
    let e = err("[providers.x]\npreset = \"bedrock\"");
    assert!(e.contains("unknown value `bedrock`") && e.contains("`azure-openai`"), "{e}");
    let e = err("[providers.x]\npreset = \"openai\"\nresourse = \"r\"");
    assert!(e.contains("did you mean `resource`?"), "{e}");
}

#[test]
fn alert_rules_are_checked_all_at_once_and_never_echo_a_url() {
    // PATH is set in every test process; ROTA_TEST_UNSET_VAR is not.
    let c = parse(&format!(
        "{BASE}\n\
         [[alerts]]\nname = \"ops\"\non = [\"paid\"]\nurl = \"https://hooks.example.com/s3cret\"\nsecret_env = \"PATH\"\n\
         [[alerts]]\nname = \"ops\"\non = []\nurl = \"ftp://hooks.example.com/s3cret\"\nurl_env = \"PATH\"\nsecret_env = \"PATH\"\n\
         [[alerts]]\nname = \"\"\non = [\"budget\"]\nurl_env = \"ROTA_TEST_UNSET_VAR\"\nmin_interval = \"0s\"\nbudget_share = 0.0\n\
         [[alerts]]\nname = \"chat\"\non = [\"fallback\"]\nurl = \"gopher://x\"\nformat = \"slack\"\nsecret_env = \"PATH\""
    ));
    let problems = c.problems();
    assert_eq!(
        problems,
        [
            "alerts[1].name: `ops` names another rule too",
            "alerts[1].on: name at least one event",
            "alerts[1]: give exactly one of `url` and `url_env`",
            "alerts[2].name: give the rule a name of 1 to 64 characters",
            "alerts[2].url_env: environment variable `ROTA_TEST_UNSET_VAR` is unset or empty",
            "alerts[2].secret_env: a json webhook's bodies are signed; name the variable holding the key",
            "alerts[2].min_interval: must be at least 1s",
            "alerts[2].budget_share: must be above 0 and at most 10 (a share of the limit)",
            "alerts[3]: the webhook's URL is not an http(s) URL",
            "alerts[3].secret_env: a Slack webhook is not signed (its URL is the secret); remove it",
        ]
    );
    assert!(problems.iter().all(|p| !p.contains("s3cret") && !p.contains("gopher")), "{problems:?}");
    let wrong = Config::from_toml("[[alerts]]\nname = \"x\"\non = [\"relogin\"]").unwrap_err().to_string();
    assert!(wrong.contains("relogin"), "an unknown event is named: {wrong}");
}

#[test]
fn traces_go_to_the_endpoints_v1_traces_and_a_bad_endpoint_is_a_problem() {
    let url = |endpoint: &str| Telemetry { otlp_endpoint: Some(endpoint.into()) }.traces_url();
    assert_eq!(url("http://127.0.0.1:4318"), Some("http://127.0.0.1:4318/v1/traces".into()));
    assert_eq!(url("http://c:4318/"), Some("http://c:4318/v1/traces".into()));
    assert_eq!(url("https://otlp.example.com/v1/traces"), Some("https://otlp.example.com/v1/traces".into()));
    assert_eq!(Telemetry::default().traces_url(), None, "off by default");
    let c = parse("[telemetry]\notlp_endpoint = \"127.0.0.1:4318\"");
    assert_eq!(c.problems(), ["telemetry.otlp_endpoint: not an http(s) URL (e.g. http://127.0.0.1:4318)"]);
}
