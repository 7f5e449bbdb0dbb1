//! `/api/v1/providers`: each provider's profiles and its order (set or reset).

use crate::api::{ApiError, ApiState, Body, Operator, Viewer};
use crate::book::Roster;
use crate::config::{Config, Preset, Provider};
use crate::engine::Millis;
use crate::profiles::{self as rules, Rotation};
use axum::Json;
use axum::extract::{Path, State};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

pub fn routes() -> OpenApiRouter<ApiState> {
    OpenApiRouter::new().routes(routes!(list_providers)).routes(routes!(set_order, reset_order))
}

#[derive(Serialize, ToSchema)]
pub struct ProviderInfo {
    pub name: String,
    /// Wire format: `openai` or `anthropic`.
    pub api: String,
    pub base_url: String,
    /// Accounts log in with OAuth (the login flows need it).
    pub oauth: bool,
    /// Whether it takes `client_credentials` profiles (it has a token endpoint for them).
    pub client_credentials: bool,
    /// The catalog entry it was made from (docs/providers.md), if any.
    pub preset: Option<String>,
    /// The ways to add an account to it, in the order the console offers them.
    pub sign_ins: Vec<SignIn>,
    pub profiles: Vec<String>,
    /// Where the order in force comes from: `stored` (API, CLI, web page), `config` or `round_robin`.
    pub order_source: String,
    /// The explicit order in force (empty for round robin).
    pub order: Vec<String>,
    /// Every profile of the provider in the order the next request would try them now (no
    /// session, no pin): the usable ones first, then the cooling or disabled ones (soonest end
    /// first), then the ones rotation never uses (disabled by an admin, no secret, an expired
    /// token, left out of an explicit order), sorted by id.
    pub rotation: Vec<String>,
    /// The profile the next request would use: the first usable one of `rotation`; `null`
    /// when none is usable.
    pub next: Option<String>,
    /// The model `rotation` is for (`provider/model`): the provider's first model in the
    /// default chain; `null` when that chain does not reach the provider (then only windows
    /// covering every model count).
    pub rotation_model: Option<String>,
}

/// A way to add an account (docs/console.md, "Adding accounts").
#[derive(Clone, Debug, PartialEq, Eq, Serialize, ToSchema)]
pub struct SignIn {
    /// `browser` (authorization code through the browser, or the pasted address when the
    /// provider redirects elsewhere), `device`, `paste`, `api_key`, `token`,
    /// `client_credentials` (a client id and secret) or `service_account` (a key file).
    pub kind: &'static str,
    pub label: String,
}

/// What the provider's preset and sections allow: the sign-ins its OAuth section makes
/// possible, named after the identity provider a preset knows, then the credentials pasted.
fn sign_ins(p: &Provider) -> Vec<SignIn> {
    let mut out = Vec::new();
    let mut add = |kind, label: &str| out.push(SignIn { kind, label: label.to_string() });
    let who = match p.preset {
        Some(Preset::AzureOpenai) => Some("Microsoft"),
        Some(Preset::Vertex) => Some("Google"),
        Some(Preset::Codex) => Some("ChatGPT"),
        _ => None,
    };
    if let Some(o) = &p.oauth {
        let browser = who.map(|w| format!("Sign in with {w}")).unwrap_or_else(|| "Add account".into());
        add("browser", &browser);
        if o.device_url.is_some() {
            add(
                "device",
                &format!(
                    "{} with a device code",
                    who.map(|w| format!("Sign in with {w}")).unwrap_or_else(|| "Log in".into())
                ),
            );
        }
        if o.redirect_uri.is_none() {
            add("paste", "Paste URL");
        }
    }
    if p.client_credentials.is_some() {
        match p.preset {
            Some(Preset::Vertex) => add("service_account", "Upload a service-account key"),
            Some(_) => add("client_credentials", "Paste a client secret"),
            None => {
                add("client_credentials", "Paste a client secret");
                add("service_account", "Upload a service-account key");
            }
        }
    }
    // A ChatGPT plan has no API keys.
    if p.preset != Some(Preset::Codex) {
        add("api_key", "Paste an API key");
    }
    add("token", "Add a token");
    out
}

pub(super) fn provider_info(config: &Config, roster: &Roster, name: &str, now: Millis) -> Option<ProviderInfo> {
    let p = config.providers.get(name)?;
    let mut profiles: Vec<String> =
        roster.views.keys().filter(|id| id.provider() == name).map(ToString::to_string).collect();
    profiles.sort();
    let (source, order) = rules::order_in_force(config, roster, name);
    let rotation = Rotation::of(config, roster, name, now);
    Some(ProviderInfo {
        name: name.to_string(),
        api: p.api.as_str().into(),
        base_url: p.base_url.clone(),
        oauth: p.oauth.is_some(),
        client_credentials: p.client_credentials.is_some(),
        preset: p.preset.map(|p| p.as_str().to_string()),
        sign_ins: sign_ins(p),
        profiles,
        order_source: source.into(),
        order: order.iter().map(ToString::to_string).collect(),
        rotation: rotation.order.iter().map(ToString::to_string).collect(),
        next: rotation.next.map(|id| id.to_string()),
        rotation_model: rotation.model,
    })
}

/// List providers
#[utoipa::path(get, path = "/api/v1/providers", tag = "admin",
    responses((status = 200, body = Vec<ProviderInfo>), (status = 401, body = crate::api::ErrorBody), (status = 403, body = crate::api::ErrorBody)))]
async fn list_providers(State(state): State<ApiState>, _: Viewer) -> Json<Vec<ProviderInfo>> {
    let settings = state.runtime.settings();
    let roster = state.runtime.book.roster();
    let now = state.runtime.clock.now();
    Json(settings.config.providers.keys().filter_map(|p| provider_info(&settings.config, &roster, p, now)).collect())
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct OrderRequest {
    /// Profile ids of this provider, in the order to try them.
    pub profiles: Vec<String>,
}

/// Set a provider's explicit order
#[utoipa::path(put, path = "/api/v1/providers/{provider}/order", tag = "admin", params(("provider" = String, Path)),
    request_body = OrderRequest,
    responses((status = 200, body = ProviderInfo), (status = 400, body = crate::api::ErrorBody), (status = 404, body = crate::api::ErrorBody)))]
async fn set_order(
    State(state): State<ApiState>,
    Operator(actor): Operator,
    Path(provider): Path<String>,
    Body(req): Body<OrderRequest>,
) -> Result<Json<ProviderInfo>, ApiError> {
    let settings = state.runtime.settings();
    rules::known_provider(&settings.config, &provider).map_err(ApiError::NotFound)?;
    let roster = state.runtime.book.roster();
    let before = order_of(&provider_info(&settings.config, &roster, &provider, state.runtime.clock.now()));
    let ids = rules::check_order(&settings.config, &roster, &provider, &req.profiles).map_err(ApiError::BadRequest)?;
    super::profiles::changes(&state).set_order(&provider, Some(ids)).await?;
    let after = provider_info(&settings.config, &state.runtime.book.roster(), &provider, state.runtime.clock.now());
    state.record(&actor, "provider.order", Some(&provider), (Some(before), Some(order_of(&after)))).await?;
    Ok(Json(after.expect("known provider")))
}

/// What an admin action records of a provider's order: where it comes from and the order.
fn order_of(info: &Option<ProviderInfo>) -> serde_json::Value {
    info.as_ref().map_or(serde_json::Value::Null, |p| serde_json::json!({"source": p.order_source, "order": p.order}))
}

/// Remove a provider's stored order
///
/// The config file's order, or round robin, applies again.
#[utoipa::path(delete, path = "/api/v1/providers/{provider}/order", tag = "admin", params(("provider" = String, Path)),
    responses((status = 200, body = ProviderInfo), (status = 404, body = crate::api::ErrorBody)))]
async fn reset_order(
    State(state): State<ApiState>,
    Operator(actor): Operator,
    Path(provider): Path<String>,
) -> Result<Json<ProviderInfo>, ApiError> {
    let settings = state.runtime.settings();
    rules::known_provider(&settings.config, &provider).map_err(ApiError::NotFound)?;
    let now = state.runtime.clock.now();
    let before = order_of(&provider_info(&settings.config, &state.runtime.book.roster(), &provider, now));
    super::profiles::changes(&state).set_order(&provider, None).await?;
    let after = provider_info(&settings.config, &state.runtime.book.roster(), &provider, now);
    state.record(&actor, "provider.order_reset", Some(&provider), (Some(before), Some(order_of(&after)))).await?;
    Ok(Json(after.expect("known provider")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sign_ins_follow_the_catalog_entry_and_the_sections() {
        let config = Config::from_toml(
            r#"
[providers.azure]
preset = "azure-openai"
resource = "contoso"
oauth = { client_id = "app" }
[providers.azure_keys]
preset = "azure-openai"
resource = "contoso"
[providers.vertex]
preset = "vertex"
project = "p"
location = "global"
oauth = { client_id = "g" }
[providers.chatgpt]
preset = "codex"
[providers.groq]
preset = "groq"
[providers.corp]
api = "openai"
base_url = "https://llm.example.com/v1"
oauth = { authorize_url = "https://idp/a", token_url = "https://idp/t", device_url = "https://idp/d", client_id = "c" }
client_credentials = { token_url = "https://idp/t" }
"#,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let offered = |name: &str| -> Vec<String> {
            sign_ins(&config.providers[name]).iter().map(|s| format!("{}: {}", s.kind, s.label)).collect()
        };
        assert_eq!(
            offered("azure"),
            [
                "browser: Sign in with Microsoft",
                "device: Sign in with Microsoft with a device code",
                "paste: Paste URL",
                "client_credentials: Paste a client secret",
                "api_key: Paste an API key",
                "token: Add a token"
            ]
        );
        assert_eq!(
            offered("azure_keys"),
            ["client_credentials: Paste a client secret", "api_key: Paste an API key", "token: Add a token"],
            "no sign-in without the operator's app"
        );
        assert_eq!(
            offered("vertex"),
            [
                "browser: Sign in with Google",
                "paste: Paste URL",
                "service_account: Upload a service-account key",
                "api_key: Paste an API key",
                "token: Add a token"
            ],
            "Google's device flow does not grant cloud-platform"
        );
        assert_eq!(
            offered("chatgpt"),
            ["browser: Sign in with ChatGPT", "device: Sign in with ChatGPT with a device code", "token: Add a token"],
            "the paste flow (its redirect is the Codex CLI's), no API keys"
        );
        assert_eq!(offered("groq"), ["api_key: Paste an API key", "token: Add a token"]);
        assert_eq!(
            offered("corp"),
            [
                "browser: Add account",
                "device: Log in with a device code",
                "paste: Paste URL",
                "client_credentials: Paste a client secret",
                "service_account: Upload a service-account key",
                "api_key: Paste an API key",
                "token: Add a token"
            ]
        );
    }
}
