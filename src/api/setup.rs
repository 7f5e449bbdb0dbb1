//! The lines that set an agent's clients up (docs/gateway.md, "Setting up an agent"): Claude
//! Code, Codex, and the OpenAI and Anthropic SDKs, each pointed at rota with the agent's key (in
//! `$ROTA_AGENT_KEY`: the key itself is shown only when it is created) and its model.

use crate::config::{Config, check_public_url};
use serde::Serialize;
use utoipa::ToSchema;

/// The variable the lines read the agent's key from.
pub const KEY_VAR: &str = "ROTA_AGENT_KEY";

/// One client's setup.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, ToSchema)]
pub struct Setup {
    /// `claude-code`, `codex`, `openai-sdk` or `anthropic-sdk`.
    pub client: &'static str,
    /// What the text is and where it goes.
    pub title: &'static str,
    pub text: String,
}

/// The address agents reach rota at: `server.public_url`, else the listen address (a wildcard
/// one as loopback).
pub fn base(config: &Config) -> String {
    if let Some(url) = &config.server.public_url {
        return url.clone();
    }
    let listen = &config.server.listen;
    let local = match listen.rsplit_once(':') {
        Some(("0.0.0.0" | "[::]", port)) => format!("127.0.0.1:{port}"),
        _ => listen.clone(),
    };
    format!("http://{local}")
}

/// `base` as given (an `http(s)` origin, as `server.public_url` takes), else rota's own.
pub fn base_or(config: &Config, given: Option<&str>) -> Result<String, String> {
    match given {
        Some(text) => check_public_url(text),
        None => Ok(base(config)),
    }
}

/// The model the lines name: the first the agent may ask for (`Config::agent_models`), else the
/// default chain's primary.
pub fn model(config: &Config, agent: &crate::agents::Agent) -> Option<String> {
    config.agent_models(agent).and_then(|m| m.first().cloned()).or_else(|| config.models.primary.clone())
}

/// The setup of each client, for rota at `base` and `model` (`None`: a placeholder to fill).
pub fn lines(base: &str, model: Option<&str>) -> Vec<Setup> {
    let model = model.unwrap_or("PROVIDER/MODEL");
    let sh = shell_word(model);
    // A JSON string is a TOML basic string and a Python literal as well: the same escapes.
    let quoted = serde_json::Value::String(model.to_string()).to_string();
    let (toml, py) = (&quoted, &quoted);
    let openai = shell_word(&format!(
        "import openai; print(openai.OpenAI().responses.create(model={py}, input=\"hi\").output_text)"
    ));
    let anthropic = shell_word(&format!(
        "import anthropic; print(anthropic.Anthropic().messages.create(model={py}, max_tokens=256, \
         messages=[{{\"role\": \"user\", \"content\": \"hi\"}}]).content[0].text)"
    ));
    vec![
        Setup {
            client: "claude-code",
            title: "Claude Code: in the shell that runs `claude`",
            text: format!(
                "export ANTHROPIC_BASE_URL={base} ANTHROPIC_AUTH_TOKEN=\"${KEY_VAR}\"\n\
                 export ANTHROPIC_MODEL={sh} ANTHROPIC_SMALL_FAST_MODEL={sh}\nclaude"
            ),
        },
        Setup {
            client: "codex",
            title: "Codex: ~/.codex/config.toml (the key stays in the environment)",
            text: format!(
                "model = {toml}\nmodel_provider = \"rota\"\n\n[model_providers.rota]\nname = \"rota\"\n\
                 base_url = \"{base}/v1\"\nenv_key = \"{KEY_VAR}\"\nwire_api = \"responses\""
            ),
        },
        Setup {
            client: "openai-sdk",
            title: "OpenAI SDKs (Python, Node) and the Agents SDK",
            text: format!("export OPENAI_BASE_URL={base}/v1 OPENAI_API_KEY=\"${KEY_VAR}\"\npython3 -c {openai}"),
        },
        Setup {
            client: "anthropic-sdk",
            title: "Anthropic SDKs (Python, TypeScript)",
            text: format!("export ANTHROPIC_BASE_URL={base} ANTHROPIC_API_KEY=\"${KEY_VAR}\"\npython3 -c {anthropic}"),
        },
    ]
}

/// `word` as one shell word: bare when it holds only characters no shell treats specially,
/// else single-quoted.
fn shell_word(word: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "/._:-@+,=".contains(c);
    match !word.is_empty() && word.chars().all(plain) {
        true => word.to_string(),
        false => format!("'{}'", word.replace('\'', r"'\''")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_base_is_the_public_url_else_the_listen_address_with_a_wildcard_as_loopback() {
        let mut config = Config::default();
        config.server.listen = "0.0.0.0:9090".into();
        assert_eq!(base(&config), "http://127.0.0.1:9090");
        config.server.listen = "10.0.0.5:8080".into();
        assert_eq!(base(&config), "http://10.0.0.5:8080");
        config.server.public_url = Some("https://rota.example.com".into());
        assert_eq!(base(&config), "https://rota.example.com");
        assert_eq!(base_or(&config, Some("http://127.0.0.1:7")).unwrap(), "http://127.0.0.1:7");
        assert!(base_or(&config, Some("javascript:alert(1)")).is_err());
    }

    #[test]
    fn a_model_is_quoted_for_each_language_it_lands_in() {
        assert_eq!(shell_word("claude/sim-sonnet"), "claude/sim-sonnet");
        assert_eq!(shell_word("a b'c"), r"'a b'\''c'");
        let lines = lines("http://127.0.0.1:8080", Some("odd \"name\""));
        let codex = &lines.iter().find(|s| s.client == "codex").unwrap().text;
        let parsed: toml::Value = toml::from_str(codex).unwrap();
        assert_eq!(parsed["model"].as_str(), Some("odd \"name\""));
        assert_eq!(parsed["model_providers"]["rota"]["base_url"].as_str(), Some("http://127.0.0.1:8080/v1"));
    }
}
