//! The provider catalog (docs/providers.md): `providers.NAME.preset = "…"` fills a provider's
//! wire format, base URL, how a key is sent, the confirming call, the quota headers it reads and
//! its sign-in endpoints; every key written beside the preset overrides what it fills.

use super::schema::{ClientCredentials, KeyHeader, OAuth, Provider, QuotaFamily, WireFormat};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// A provider rota knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Preset {
    Openai,
    Anthropic,
    AzureOpenai,
    Vertex,
    Gemini,
    Openrouter,
    Groq,
    Mistral,
    Deepseek,
    Xai,
    Together,
    Ollama,
    Codex,
}

impl Preset {
    pub const ALL: [Preset; 13] = [
        Preset::Openai,
        Preset::Anthropic,
        Preset::AzureOpenai,
        Preset::Vertex,
        Preset::Gemini,
        Preset::Openrouter,
        Preset::Groq,
        Preset::Mistral,
        Preset::Deepseek,
        Preset::Xai,
        Preset::Together,
        Preset::Ollama,
        Preset::Codex,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Preset::Openai => "openai",
            Preset::Anthropic => "anthropic",
            Preset::AzureOpenai => "azure-openai",
            Preset::Vertex => "vertex",
            Preset::Gemini => "gemini",
            Preset::Openrouter => "openrouter",
            Preset::Groq => "groq",
            Preset::Mistral => "mistral",
            Preset::Deepseek => "deepseek",
            Preset::Xai => "xai",
            Preset::Together => "together",
            Preset::Ollama => "ollama",
            Preset::Codex => "codex",
        }
    }
}

/// OAuth settings as written in the file: a preset fills what is left out.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OAuthFile {
    pub authorize_url: Option<String>,
    pub token_url: Option<String>,
    pub device_url: Option<String>,
    pub userinfo_url: Option<String>,
    pub client_id: Option<String>,
    pub client_secret_env: Option<String>,
    pub scopes: Option<Vec<String>>,
    pub extra_params: Option<BTreeMap<String, String>>,
    pub redirect_uri: Option<String>,
}

/// `[providers.NAME.client_credentials]` as written in the file: a preset fills what is left out.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClientCredentialsFile {
    pub token_url: Option<String>,
    pub scopes: Option<Vec<String>>,
    pub allow_token_uri: Option<String>,
}

/// `[providers.NAME]` as written in the file.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProviderFile {
    pub preset: Option<Preset>,
    pub api: Option<WireFormat>,
    pub base_url: Option<String>,
    pub key_header: Option<KeyHeader>,
    pub quota: Option<Vec<QuotaFamily>>,
    pub oauth: Option<OAuthFile>,
    pub client_credentials: Option<ClientCredentialsFile>,
    pub confirm_path: Option<String>,
    pub claude_base_url: Option<String>,
    /// The Azure OpenAI resource name (`https://RESOURCE.openai.azure.com`).
    pub resource: Option<String>,
    /// The Entra ID tenant (a GUID or a domain); `organizations` when unset.
    pub tenant: Option<String>,
    /// The Google Cloud project id.
    pub project: Option<String>,
    /// The Vertex AI location (`us-central1`, `europe-west4`, `global`).
    pub location: Option<String>,
}

/// What one preset sets.
struct Fill {
    api: WireFormat,
    base_url: String,
    claude_base_url: Option<String>,
    key_header: KeyHeader,
    confirm_path: &'static str,
    quota: &'static [QuotaFamily],
    /// The sign-in endpoints; the client id only where the provider publishes one for tools.
    oauth: Option<OAuthFile>,
    client_credentials: Option<ClientCredentials>,
}

const OPENAI_HEADERS: &[QuotaFamily] = &[QuotaFamily::Openai];

/// The value of `key` that `preset` needs, or the message that says so.
fn needed<'a>(value: &'a Option<String>, preset: Preset, key: &str, what: &str) -> Result<&'a str, String> {
    match value.as_deref().map(str::trim) {
        Some(v) if !v.is_empty() && v.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.') => Ok(v),
        Some(v) if !v.is_empty() => Err(format!("`{key}` = `{v}` may only hold letters, digits, `-` and `.`")),
        _ => Err(format!("preset `{}` needs `{key}` ({what})", preset.as_str())),
    }
}

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| s.to_string()).collect()
}

impl Preset {
    fn fill(self, place: &ProviderFile) -> Result<Fill, String> {
        let plain = |base_url: &str, confirm_path, quota| Fill {
            api: WireFormat::OpenaiChat,
            base_url: base_url.to_string(),
            claude_base_url: None,
            key_header: KeyHeader::Bearer,
            confirm_path,
            quota,
            oauth: None,
            client_credentials: None,
        };
        Ok(match self {
            Preset::Openai => {
                Fill { api: WireFormat::Openai, ..plain("https://api.openai.com/v1", "/models", OPENAI_HEADERS) }
            }
            Preset::Anthropic => Fill {
                api: WireFormat::Anthropic,
                key_header: KeyHeader::XApiKey,
                ..plain("https://api.anthropic.com", "/v1/models", &[QuotaFamily::Anthropic])
            },
            Preset::AzureOpenai => {
                let resource = needed(&place.resource, self, "resource", "the Azure OpenAI resource name")?;
                let tenant = match place.tenant {
                    Some(_) => needed(&place.tenant, self, "tenant", "the Entra ID tenant")?,
                    None => "organizations",
                };
                let entra = format!("https://login.microsoftonline.com/{tenant}/oauth2/v2.0");
                Fill {
                    api: WireFormat::Openai,
                    key_header: KeyHeader::ApiKey,
                    oauth: Some(OAuthFile {
                        authorize_url: Some(format!("{entra}/authorize")),
                        token_url: Some(format!("{entra}/token")),
                        device_url: Some(format!("{entra}/devicecode")),
                        scopes: Some(strings(&[
                            "https://cognitiveservices.azure.com/.default",
                            "offline_access",
                            "openid",
                            "profile",
                        ])),
                        ..OAuthFile::default()
                    }),
                    client_credentials: Some(ClientCredentials {
                        token_url: format!("{entra}/token"),
                        scopes: strings(&["https://cognitiveservices.azure.com/.default"]),
                        allow_token_uri: None,
                    }),
                    ..plain(&format!("https://{resource}.openai.azure.com/openai/v1"), "/models", OPENAI_HEADERS)
                }
            }
            Preset::Vertex => {
                let project = needed(&place.project, self, "project", "the Google Cloud project id")?;
                let location = needed(&place.location, self, "location", "the Vertex AI location, e.g. us-central1")?;
                let host = match location {
                    "global" => "aiplatform.googleapis.com".to_string(),
                    region => format!("{region}-aiplatform.googleapis.com"),
                };
                let root = format!("https://{host}/v1/projects/{project}/locations/{location}");
                Fill {
                    claude_base_url: Some(format!("{root}/publishers/anthropic/models")),
                    // Service accounts exchange at their key's token_uri; these are the scopes.
                    client_credentials: Some(ClientCredentials {
                        token_url: "https://oauth2.googleapis.com/token".into(),
                        scopes: strings(&["https://www.googleapis.com/auth/cloud-platform"]),
                        allow_token_uri: None,
                    }),
                    oauth: Some(OAuthFile {
                        authorize_url: Some("https://accounts.google.com/o/oauth2/v2/auth".into()),
                        token_url: Some("https://oauth2.googleapis.com/token".into()),
                        // No device flow: Google's does not grant the cloud-platform scope.
                        scopes: Some(strings(&["https://www.googleapis.com/auth/cloud-platform", "openid", "email"])),
                        extra_params: Some(BTreeMap::from([
                            ("access_type".to_string(), "offline".to_string()),
                            ("prompt".to_string(), "consent".to_string()),
                        ])),
                        ..OAuthFile::default()
                    }),
                    ..plain(&format!("{root}/endpoints/openapi"), "/models", &[])
                }
            }
            Preset::Gemini => plain("https://generativelanguage.googleapis.com/v1beta/openai", "/models", &[]),
            Preset::Openrouter => plain("https://openrouter.ai/api/v1", "/key", OPENAI_HEADERS),
            Preset::Groq => plain("https://api.groq.com/openai/v1", "/models", OPENAI_HEADERS),
            Preset::Mistral => plain("https://api.mistral.ai/v1", "/models", &[]),
            Preset::Deepseek => plain("https://api.deepseek.com", "/models", &[]),
            Preset::Xai => Fill { api: WireFormat::Openai, ..plain("https://api.x.ai/v1", "/models", &[]) },
            Preset::Together => plain("https://api.together.xyz/v1", "/models", &[]),
            Preset::Ollama => plain("http://127.0.0.1:11434/v1", "/models", &[]),
            Preset::Codex => Fill {
                api: WireFormat::OpenaiResponses,
                oauth: Some(OAuthFile {
                    authorize_url: Some("https://auth.openai.com/oauth/authorize".into()),
                    token_url: Some("https://auth.openai.com/oauth/token".into()),
                    device_url: Some("https://auth.openai.com/api/accounts/deviceauth/usercode".into()),
                    client_id: Some("app_EMoamEEZ73f0CkXaXp7hrann".into()),
                    scopes: Some(strings(&["openid", "profile", "email", "offline_access"])),
                    extra_params: Some(BTreeMap::from([
                        ("id_token_add_organizations".to_string(), "true".to_string()),
                        ("codex_cli_simplified_flow".to_string(), "true".to_string()),
                        ("originator".to_string(), "codex_cli_rs".to_string()),
                    ])),
                    // The redirect the Codex CLI registered: the console asks for the final URL
                    // to be pasted (docs/providers.md).
                    redirect_uri: Some("http://localhost:1455/auth/callback".into()),
                    ..OAuthFile::default()
                }),
                ..plain("https://chatgpt.com/backend-api/codex", "/models", &[QuotaFamily::Codex])
            },
        })
    }
}

/// A key neither the file nor its preset gives.
fn missing(key: &str) -> String {
    format!("missing `{key}`, which is required without a `preset` that sets it (docs/providers.md)")
}

/// The default confirming call of a wire format without a preset.
fn default_confirm(api: WireFormat) -> &'static str {
    match api {
        WireFormat::Anthropic => "/v1/models",
        _ => "/models",
    }
}

impl TryFrom<ProviderFile> for Provider {
    type Error = String;

    fn try_from(file: ProviderFile) -> Result<Provider, String> {
        let mut fill = file.preset.map(|p| p.fill(&file)).transpose()?;
        let preset_oauth = fill.as_mut().and_then(|f| f.oauth.take());
        let mut filled = Vec::new();
        let mut take = |key: &'static str, given: bool| {
            if !given && fill.is_some() {
                filled.push(key);
            }
        };
        take("api", file.api.is_some());
        take("base_url", file.base_url.is_some());
        take("key_header", file.key_header.is_some());
        take("confirm_path", file.confirm_path.is_some());
        take("quota", file.quota.is_some());
        if file.claude_base_url.is_none() && fill.as_ref().is_some_and(|f| f.claude_base_url.is_some()) {
            filled.push("claude_base_url");
        }
        let claude_base_url =
            file.claude_base_url.clone().or_else(|| fill.as_ref().and_then(|f| f.claude_base_url.clone()));
        let api = match (file.api, &fill) {
            (Some(api), _) => api,
            (None, Some(f)) => f.api,
            (None, None) => return Err(missing("api")),
        };
        let base_url = match (file.base_url, &fill) {
            (Some(url), _) => url,
            (None, Some(f)) => f.base_url.clone(),
            (None, None) => return Err(missing("base_url")),
        };
        let key_header = file.key_header.or(fill.as_ref().map(|f| f.key_header)).unwrap_or(match api {
            WireFormat::Anthropic => KeyHeader::XApiKey,
            _ => KeyHeader::Bearer,
        });
        let confirm_path = file
            .confirm_path
            .or(fill.as_ref().map(|f| f.confirm_path.to_string()))
            .unwrap_or_else(|| default_confirm(api).to_string());
        let quota = file.quota.or(fill.as_ref().map(|f| f.quota.to_vec())).unwrap_or_else(|| match api {
            WireFormat::Anthropic => vec![QuotaFamily::Anthropic],
            _ => vec![QuotaFamily::Openai],
        });
        // A preset's sign-in needs a client id: its own (Codex) or the operator's.
        let from_preset = preset_oauth.is_some();
        let oauth = match (file.oauth, preset_oauth) {
            (None, Some(p)) if p.client_id.is_none() => None,
            (None, p) => p,
            (Some(o), None) => Some(o),
            (Some(o), Some(p)) => Some(merge(o, p)),
        };
        if oauth.is_some() && from_preset {
            filled.push("oauth");
        }
        let chatgpt = file.preset == Some(Preset::Codex);
        let oauth = oauth.map(|o| o.resolve(chatgpt)).transpose()?;
        let preset_cc = fill.as_mut().and_then(|f| f.client_credentials.take());
        if file.client_credentials.is_none() && preset_cc.is_some() {
            filled.push("client_credentials");
        }
        let client_credentials = match (file.client_credentials, preset_cc) {
            (None, p) => p,
            (Some(f), p) => Some(ClientCredentials {
                token_url: f
                    .token_url
                    .or(p.as_ref().map(|p| p.token_url.clone()))
                    .ok_or_else(|| missing("client_credentials.token_url"))?,
                scopes: f.scopes.or(p.map(|p| p.scopes)).unwrap_or_default(),
                allow_token_uri: f.allow_token_uri,
            }),
        };
        Ok(Provider {
            preset: file.preset,
            api,
            base_url,
            key_header,
            quota,
            oauth,
            client_credentials,
            confirm_path,
            claude_base_url,
            filled,
        })
    }
}

/// The file's OAuth keys over the preset's.
fn merge(file: OAuthFile, preset: OAuthFile) -> OAuthFile {
    OAuthFile {
        authorize_url: file.authorize_url.or(preset.authorize_url),
        token_url: file.token_url.or(preset.token_url),
        device_url: file.device_url.or(preset.device_url),
        userinfo_url: file.userinfo_url.or(preset.userinfo_url),
        client_id: file.client_id.or(preset.client_id),
        client_secret_env: file.client_secret_env.or(preset.client_secret_env),
        scopes: file.scopes.or(preset.scopes),
        extra_params: file.extra_params.or(preset.extra_params),
        redirect_uri: file.redirect_uri.or(preset.redirect_uri),
    }
}

impl OAuthFile {
    fn resolve(self, chatgpt: bool) -> Result<OAuth, String> {
        let missing = |key: &str| missing(&format!("oauth.{key}"));
        Ok(OAuth {
            authorize_url: self.authorize_url.ok_or_else(|| missing("authorize_url"))?,
            token_url: self.token_url.ok_or_else(|| missing("token_url"))?,
            device_url: self.device_url,
            userinfo_url: self.userinfo_url,
            client_id: self.client_id.ok_or_else(|| missing("client_id"))?,
            client_secret_env: self.client_secret_env,
            scopes: self.scopes.unwrap_or_default(),
            extra_params: self.extra_params.unwrap_or_default(),
            redirect_uri: self.redirect_uri,
            chatgpt,
        })
    }
}
