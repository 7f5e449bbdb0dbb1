//! The configuration's types, each with its defaults written once: in its `impl Default`,
//! which `#[serde(default)]` fills every key left out from (docs/config.md).

use crate::engine::chain::VirtualModel;
use crate::engine::classify::Rule;
use crate::engine::duration::deserialize as duration;
use crate::engine::order::Rotation;
use crate::engine::{BillingLane, CooldownLane, Millis, ProfileId, ProfileType, RefreshWindow};
use crate::prices::Price;
use secrecy::SecretString;
use serde::{Deserialize, Deserializer};
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::time::Duration;

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    pub server: Server,
    pub console: ConsoleConfig,
    pub database: Database,
    pub audit: AuditConfig,
    pub providers: BTreeMap<String, Provider>,
    pub auth: Auth,
    pub models: Models,
    pub aliases: HashMap<String, String>,
    pub virtual_models: HashMap<String, VirtualModel>,
    pub agents: BTreeMap<String, AgentConfig>,
    /// The cooldown and billing lanes: the engine's types, whose defaults are
    /// `CooldownPolicy::default()`'s.
    pub cooldown: CooldownLane,
    pub billing: BillingLane,
    pub rotation: RotationConfig,
    pub failover: Failover,
    pub classification: Classification,
    pub timeouts: Timeouts,
    pub limits: LimitsConfig,
    pub leases: LeasesConfig,
    pub refresh: Refresh,
    pub secrets: Secrets,
    /// Prices by `"provider/model"` or `"model"`, over the shipped table (`src/prices.toml`).
    pub prices: BTreeMap<String, Price>,
    /// `[[alerts]]`: who is told of which events (docs/operations.md, "Alerts").
    pub alerts: Vec<AlertRule>,
    pub telemetry: Telemetry,
}

/// `[telemetry]`: traces over OTLP (docs/operations.md, "Traces"). Read once at start.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Telemetry {
    /// The collector's OTLP/HTTP address (`http://host:4318`); spans go to its `/v1/traces`.
    /// None: no traces.
    pub otlp_endpoint: Option<String>,
}

impl Telemetry {
    /// Where spans are posted: the endpoint's `/v1/traces`, unless it names that path itself.
    pub fn traces_url(&self) -> Option<String> {
        let base = self.otlp_endpoint.as_deref()?.trim().trim_end_matches('/');
        Some(match base.ends_with("/v1/traces") {
            true => base.to_string(),
            false => format!("{base}/v1/traces"),
        })
    }
}

/// One `[[alerts]]` rule: the events it sends, where, and how often at most per subject.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AlertRule {
    pub name: String,
    pub on: Vec<AlertKind>,
    /// The webhook's URL, or the variable holding it (a Slack URL is itself a secret).
    pub url: Option<String>,
    pub url_env: Option<String>,
    #[serde(default)]
    pub format: AlertFormat,
    /// The variable holding the HMAC-SHA256 key that signs a `json` webhook's bodies.
    pub secret_env: Option<String>,
    /// At most one alert of this rule per subject in this interval, across the fleet.
    #[serde(default = "alert_interval", deserialize_with = "duration")]
    pub min_interval: Duration,
    /// `budget`: the share of an agent's daily limit that raises it.
    #[serde(default = "budget_share")]
    pub budget_share: f64,
    /// At most this many alerts of this rule per `min_interval` from one server, whatever
    /// their subjects.
    #[serde(default = "alert_cap")]
    pub cap: u32,
}

fn alert_cap() -> u32 {
    100
}

fn alert_interval() -> Duration {
    Duration::from_secs(15 * 60)
}

fn budget_share() -> f64 {
    0.8
}

impl AlertRule {
    /// The webhook's URL, read from its variable now when it is given by one.
    pub fn url(&self) -> Option<String> {
        match (&self.url, &self.url_env) {
            (Some(url), _) => Some(url.clone()),
            (None, Some(var)) => std::env::var(var).ok().map(|v| v.trim().to_string()).filter(|v| !v.is_empty()),
            (None, None) => None,
        }
    }

    /// The signing key, read from its variable now.
    pub fn secret(&self) -> Option<SecretString> {
        let value = std::env::var(self.secret_env.as_deref()?).ok()?;
        (!value.trim().is_empty()).then(|| SecretString::from(value.trim().to_string()))
    }
}

/// What an alert is about (docs/operations.md, "Alerts").
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum AlertKind {
    /// An OAuth account's tokens were refused: someone must sign in again.
    NeedsRelogin,
    /// An account entered the disabled lane (billing, a refused key).
    Disabled,
    /// Every enabled account of a provider is cooling or disabled.
    ProviderCooling,
    /// A request was served by a later model of its chain than the first.
    Fallback,
    /// A request was served by a profile marked `paid = true`.
    Paid,
    /// An agent passed `budget_share` of a daily limit.
    Budget,
    /// The audit queue was full and rows were shed.
    AuditShed,
    /// A write to the database is failing.
    DatabaseFailing,
    /// An admin asked for a test of the rule (`POST /api/v1/alerts/{rule}/test`); no rule
    /// listens for it.
    #[serde(skip_deserializing)]
    Test,
}

impl AlertKind {
    pub fn as_str(self) -> &'static str {
        match self {
            AlertKind::NeedsRelogin => "needs_relogin",
            AlertKind::Disabled => "disabled",
            AlertKind::ProviderCooling => "provider_cooling",
            AlertKind::Fallback => "fallback",
            AlertKind::Paid => "paid",
            AlertKind::Budget => "budget",
            AlertKind::AuditShed => "audit_shed",
            AlertKind::DatabaseFailing => "database_failing",
            AlertKind::Test => "test",
        }
    }
}

/// How an alert's body is written: rota's JSON, signed, or a Slack incoming webhook's `text`.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum AlertFormat {
    #[default]
    Json,
    Slack,
}

/// Where the master key lives (docs/gateway.md, "Secrets").
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Secrets {
    /// `auto` (the Secret Service when a DBus session offers one), `secret-service`, `keyutils`
    /// (survives no reboot) or `off`. `ROTA_MASTER_KEY` always comes first.
    pub keyring: crate::keyring::Choice,
    /// The master key's file (its name ends in `.key`). Default: beside the SQLite file
    /// (`rota.db` → `rota.key`); with PostgreSQL, `rota.key` in the working directory.
    pub key_file: Option<PathBuf>,
}

/// Upstream timeouts (docs/gateway.md).
#[derive(Clone, Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Timeouts {
    #[serde(deserialize_with = "duration")]
    pub connect: Duration,
    /// Until the upstream's answer (non-streaming) or first content event (streaming).
    #[serde(deserialize_with = "duration")]
    pub first_byte: Duration,
    /// A stream that sends nothing for this long has stalled (keep-alive comments do not count).
    #[serde(deserialize_with = "duration")]
    pub idle: Duration,
    /// Ceiling for a whole request, every attempt included.
    #[serde(deserialize_with = "duration")]
    pub total: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            connect: Duration::from_secs(10),
            first_byte: Duration::from_secs(120),
            idle: Duration::from_secs(60),
            total: Duration::from_secs(600),
        }
    }
}

/// OAuth token refresh (docs/api.md).
#[derive(Clone, Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Refresh {
    /// Access tokens are refreshed this long before they expire.
    #[serde(deserialize_with = "duration")]
    pub lead: Duration,
}

impl Default for Refresh {
    fn default() -> Self {
        Refresh { lead: Duration::from_secs(300) }
    }
}

impl Refresh {
    /// The refresh window of an access token that expires at `expires_at`.
    pub fn window(&self, expires_at: Millis) -> RefreshWindow {
        RefreshWindow { expires_at, lead: self.lead.as_millis() as Millis }
    }
}

/// The lease API (docs/api.md).
#[derive(Clone, Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LeasesConfig {
    /// How long a lease waits for its report; past it, the lease expires without changing stats.
    #[serde(deserialize_with = "duration")]
    pub ttl: Duration,
    /// Outstanding leases one agent may hold; past it, its new leases get 429.
    pub max_live_per_agent: usize,
    /// Failure reports one agent may make per minute; past it, its reports get 429.
    pub failure_reports_per_minute: u32,
    /// Success reports one agent may make per minute (each may carry quota headers that order
    /// a profile last); past it, its reports get 429.
    pub success_reports_per_minute: u32,
    /// The share of a provider's profiles one untrusted agent's reports may cool or order last
    /// in `claim_window` (at least one profile).
    pub claim_share: f64,
    /// The window `claim_share` counts in; a success report orders a profile last at most once in it.
    #[serde(deserialize_with = "duration")]
    pub claim_window: Duration,
}

impl Default for LeasesConfig {
    fn default() -> Self {
        LeasesConfig {
            ttl: Duration::from_secs(600),
            max_live_per_agent: 1000,
            failure_reports_per_minute: 600,
            success_reports_per_minute: 6000,
            claim_share: 0.5,
            claim_window: Duration::from_secs(3600),
        }
    }
}

/// Request limits.
#[derive(Clone, Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LimitsConfig {
    /// Largest request body accepted, in bytes (413 beyond).
    pub max_body_bytes: usize,
    /// The most upstream calls one request makes, across retries, rotations and fallbacks.
    pub max_attempts: u32,
    /// The memory, in MiB, that request bodies over 64 KiB may take from their first byte until
    /// their request ends (read at start).
    pub bodies_in_flight_mb: usize,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        LimitsConfig { max_body_bytes: 32 * 1024 * 1024, max_attempts: 12, bodies_in_flight_mb: 256 }
    }
}

#[derive(Clone, Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Server {
    pub listen: String,
    /// After SIGTERM: how long requests in flight may still run before open streams are cut
    /// (with the in-band error, audited `cancelled`).
    #[serde(deserialize_with = "duration")]
    pub shutdown_grace: Duration,
    /// A connection that has not sent a whole request head within this is closed.
    #[serde(deserialize_with = "duration")]
    pub header_timeout: Duration,
    /// A request body that has not arrived whole within this is refused (408).
    #[serde(deserialize_with = "duration")]
    pub body_timeout: Duration,
    /// Connections served at once; more wait in the kernel's accept queue.
    pub max_connections: usize,
    /// The address browsers reach rota at (`https://rota.example.com`): OAuth's `redirect_uri`
    /// is built from it, never from the request's `Host`, and with `https` the console's and
    /// the logins' cookies are `Secure`. Unset: the `Host` header and plain `http` (loopback and
    /// development only).
    #[serde(deserialize_with = "public_url")]
    pub public_url: Option<String>,
    /// A console session unused for this long is signed out; each use extends it.
    #[serde(deserialize_with = "duration")]
    pub session_idle: Duration,
    /// A file holding the bearer token `/metrics` asks for (read at each scrape, so it can be
    /// replaced without a restart). Unset: `/metrics` needs no token.
    pub metrics_token_file: Option<PathBuf>,
    /// Whether a reload that leaves no provider is applied (else it is refused, the last good
    /// config staying).
    pub allow_empty_reload: bool,
}

/// `[console]`: how people sign in to the console (docs/operations.md, "Signing in").
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ConsoleConfig {
    pub sso: Option<Sso>,
}

/// `[console.sso]`: people sign in with their OpenID Connect provider (authorization code +
/// PKCE); their role comes from a claim or from the `roles` lists.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Sso {
    /// The issuer; its `/.well-known/openid-configuration` names the endpoints.
    pub issuer: String,
    pub client_id: String,
    /// The variable holding the client's secret (none for a public client).
    pub client_secret_env: Option<String>,
    #[serde(default = "sso_scopes")]
    pub scopes: Vec<String>,
    /// A claim holding the person's role (`viewer`, `operator` or `admin`), or a list of roles.
    pub role_claim: Option<String>,
    /// The claim listing the person's groups, which `roles` may name.
    #[serde(default = "groups_claim")]
    pub groups_claim: String,
    /// Who has which role: verified emails, `*@domain`, or groups of `groups_claim`.
    #[serde(default)]
    pub roles: SsoRoles,
    /// The identity provider's own email domains (its tenant's): an `email` in one of them is
    /// verified without `email_verified`.
    #[serde(default)]
    pub own_domains: Vec<String>,
    /// Hosts besides the issuer's that its discovery document may name for its endpoints
    /// (Google's: `oauth2.googleapis.com`, `openidconnect.googleapis.com`).
    #[serde(default)]
    pub endpoint_hosts: Vec<String>,
    /// The sign-in page's button.
    #[serde(default = "sso_label")]
    pub label: String,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SsoRoles {
    pub admin: Vec<String>,
    pub operator: Vec<String>,
    pub viewer: Vec<String>,
}

fn sso_scopes() -> Vec<String> {
    ["openid", "email", "profile"].map(String::from).to_vec()
}

fn groups_claim() -> String {
    "groups".into()
}

fn sso_label() -> String {
    "Sign in with SSO".into()
}

impl Default for Server {
    fn default() -> Self {
        Server {
            listen: "127.0.0.1:8080".into(),
            shutdown_grace: Duration::from_secs(30),
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(30),
            max_connections: 4096,
            public_url: None,
            session_idle: Duration::from_secs(30 * 60),
            metrics_token_file: None,
            allow_empty_reload: false,
        }
    }
}

impl Server {
    /// Whether cookies carry `Secure`: `public_url` is an `https` address.
    pub fn secure_cookies(&self) -> bool {
        self.public_url.as_deref().is_some_and(|u| u.starts_with("https://"))
    }
}

/// `server.public_url`: an `http(s)` origin (scheme, host, optional port; no path, query,
/// fragment or user), kept without a trailing slash. Empty is unset (`ROTA_SERVER__PUBLIC_URL=`).
fn public_url<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    let Some(text) = Option::<String>::deserialize(d)?.filter(|t| !t.trim().is_empty()) else { return Ok(None) };
    check_public_url(&text).map(Some).map_err(serde::de::Error::custom)
}

pub fn check_public_url(text: &str) -> Result<String, String> {
    let text = text.trim();
    let bad = |why: &str| {
        format!(
            "invalid public_url `{text}`: {why}; write the address browsers reach rota at, e.g. \"https://rota.example.com\""
        )
    };
    let url = url::Url::parse(text).map_err(|e| bad(&e.to_string()))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(bad("the scheme must be http or https"));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(bad("no host"));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(bad("no user or password belongs in it"));
    }
    if url.path() != "/" || url.query().is_some() || url.fragment().is_some() {
        return Err(bad("rota is served at the root of its address: no path, query or fragment"));
    }
    Ok(url.origin().ascii_serialization())
}

#[derive(Clone, Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Database {
    pub url: String,
    /// SQLite: the size the write-ahead log is truncated to after a checkpoint, in MiB.
    pub wal_limit_mb: u64,
    /// SQLite: how often the write-ahead log is copied into the database (and truncated when
    /// over `wal_limit_mb`).
    #[serde(deserialize_with = "duration")]
    pub checkpoint_every: Duration,
}

impl Default for Database {
    fn default() -> Self {
        Database { url: "sqlite://rota.db".into(), wal_limit_mb: 64, checkpoint_every: Duration::from_secs(1) }
    }
}

/// The audit trail's writer and its retention (docs/audit.md).
#[derive(Clone, Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AuditConfig {
    /// Rows (requests and attempts) waiting to be written at most; beyond, rows are shed and
    /// counted (`rota_audit_dropped_total`).
    pub queue: usize,
    /// How long raw `requests` and `attempts` rows are kept; `0s` keeps them for ever.
    #[serde(deserialize_with = "duration")]
    pub retention: Duration,
    /// How often rows past `retention` are rolled up into `usage_daily` and deleted.
    #[serde(deserialize_with = "duration")]
    pub prune_every: Duration,
}

impl Default for AuditConfig {
    fn default() -> Self {
        AuditConfig {
            queue: 50_000,
            retention: Duration::from_secs(30 * 86_400),
            prune_every: Duration::from_secs(3600),
        }
    }
}

/// A provider's wire format (docs/config.md, docs/translation.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum WireFormat {
    /// OpenAI's own: chat completions and the Responses API, each passed through.
    Openai,
    /// Chat completions only (most OpenAI-compatible servers): Responses requests are
    /// translated to chat.
    OpenaiChat,
    /// The Responses API only: chat and messages requests are translated to it.
    OpenaiResponses,
    Anthropic,
}

impl WireFormat {
    pub fn as_str(self) -> &'static str {
        match self {
            WireFormat::Openai => "openai",
            WireFormat::OpenaiChat => "openai-chat",
            WireFormat::OpenaiResponses => "openai-responses",
            WireFormat::Anthropic => "anthropic",
        }
    }

    /// Whether the provider authenticates and lists models as OpenAI does.
    pub fn is_openai(self) -> bool {
        self != WireFormat::Anthropic
    }
}

/// A provider: written in the file as `super::presets::ProviderFile`, a preset's values filled
/// in (docs/providers.md).
#[derive(Clone, Debug, Deserialize)]
#[serde(try_from = "super::presets::ProviderFile")]
pub struct Provider {
    pub preset: Option<super::presets::Preset>,
    pub api: WireFormat,
    pub base_url: String,
    /// How an API key is sent; OAuth and static tokens always go as `Authorization: Bearer`.
    pub key_header: KeyHeader,
    /// The rate-limit header families read from its answers (docs/rotation.md).
    pub quota: Vec<QuotaFamily>,
    pub oauth: Option<OAuth>,
    /// Where `client_credentials` profiles exchange their client id and secret for access
    /// tokens (docs/providers.md).
    pub client_credentials: Option<ClientCredentials>,
    /// The cheap authenticated call rota makes to confirm an agent's claim that a credential
    /// is revoked or out of credit (`GET base_url + confirm_path`); default `/models` for the
    /// OpenAI format, `/v1/models` for Anthropic's.
    pub confirm_path: String,
    /// Where the provider's `claude…` models answer in Anthropic's format, the model in the URL
    /// (`URL/MODEL:rawPredict`, `:streamRawPredict` streamed) and `anthropic_version` in the
    /// body: Claude on Vertex AI (docs/providers.md).
    pub claude_base_url: Option<String>,
    /// The keys the preset filled in, for `rota doctor`.
    pub filled: Vec<&'static str>,
}

/// The token endpoint and scopes of a provider's `client_credentials` profiles.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClientCredentials {
    pub token_url: String,
    pub scopes: Vec<String>,
    /// A service account key's `token_uri` rota may post to besides Google's
    /// (`https://oauth2.googleapis.com/token`), e.g. a private Google endpoint.
    pub allow_token_uri: Option<String>,
}

/// The `anthropic_version` a Claude model on Vertex AI takes in the body.
pub const VERTEX_ANTHROPIC_VERSION: &str = "vertex-2023-10-16";

impl Provider {
    /// Whether `model` is called at `claude_base_url` (Claude on Vertex AI).
    pub fn claude_on_vertex(&self, model: &str) -> bool {
        self.claude_base_url.is_some() && model.starts_with("claude")
    }

    /// The wire format `model` speaks at this provider.
    pub fn api_for(&self, model: &str) -> WireFormat {
        if self.claude_on_vertex(model) { WireFormat::Anthropic } else { self.api }
    }
}

/// The header an API key travels in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum KeyHeader {
    /// `Authorization: Bearer KEY` (OpenAI and most others).
    Bearer,
    /// `x-api-key: KEY` (Anthropic).
    XApiKey,
    /// `api-key: KEY` (Azure OpenAI).
    ApiKey,
}

impl KeyHeader {
    pub fn as_str(self) -> &'static str {
        match self {
            KeyHeader::Bearer => "bearer",
            KeyHeader::XApiKey => "x-api-key",
            KeyHeader::ApiKey => "api-key",
        }
    }
}

pub use crate::engine::quota::Family as QuotaFamily;

/// OAuth 2.0 / OIDC settings of a provider (used by the login flows).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OAuth {
    pub authorize_url: String,
    pub token_url: String,
    pub device_url: Option<String>,
    pub userinfo_url: Option<String>,
    pub client_id: String,
    pub client_secret_env: Option<String>,
    #[serde(default)]
    pub scopes: Vec<String>,
    #[serde(default)]
    pub extra_params: BTreeMap<String, String>,
    /// The redirect URI registered with the provider, when it is not rota's own
    /// `/oauth/callback` (e.g. a loopback address a CLI tool registered): the console then asks
    /// for the final URL to be pasted.
    pub redirect_uri: Option<String>,
    /// ChatGPT's sign-in (the `codex` preset): its own device flow and a JSON refresh
    /// (docs/providers.md, "Codex").
    #[serde(skip)]
    pub chatgpt: bool,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Auth {
    pub profiles: BTreeMap<ProfileId, ProfileConfig>,
    pub order: BTreeMap<String, Vec<ProfileId>>,
}

/// A profile declared in the config file; its secret comes from an environment variable.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProfileConfig {
    pub provider: String,
    #[serde(rename = "type", default = "api_key")]
    pub kind: ProfileType,
    /// The variable holding the API key (`type = "api_key"`).
    pub api_key_env: Option<String>,
    /// The variable holding the bearer token (`type = "token"`).
    pub token_env: Option<String>,
    /// When a static token stops working (RFC 3339).
    pub expires: Option<chrono::DateTime<chrono::Utc>>,
    /// Each call costs money (a pay-as-you-go key): serving a request with it raises the
    /// `paid` alert (docs/operations.md, "Alerts").
    #[serde(default)]
    pub paid: bool,
}

fn api_key() -> ProfileType {
    ProfileType::ApiKey
}

impl ProfileConfig {
    pub fn secret_env(&self) -> Option<&str> {
        self.api_key_env.as_deref().or(self.token_env.as_deref())
    }

    /// The secret, read from its environment variable now. Empty counts as unset.
    pub fn secret(&self) -> Option<SecretString> {
        let value = std::env::var(self.secret_env()?).ok()?;
        let value = value.trim();
        (!value.is_empty()).then(|| SecretString::from(value.to_string()))
    }
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Models {
    pub primary: Option<String>,
    pub fallbacks: Vec<String>,
    /// docs/rotation.md: on a `context_overflow` of the key (`provider/model`), try these models (with a
    /// larger window) instead of returning the error.
    pub context_fallbacks: BTreeMap<String, Vec<String>>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AgentConfig {
    /// Replaces `models.fallbacks` for this agent; `[]` means no fallback.
    pub fallbacks: Option<Vec<String>>,
    /// Its lease reports are evidence, like rota's own calls: they may reach the disabled lanes
    /// without rota's confirming call.
    pub trusted: bool,
    /// Requests admitted per minute (clock-aligned, across every server); over it, 429.
    pub requests_per_minute: Option<i64>,
    /// Input plus output tokens per UTC day; over it, 429 until midnight UTC.
    pub tokens_per_day: Option<i64>,
    /// USD per UTC day (from the requests' `cost`); over it, 429 until midnight UTC.
    pub cost_per_day: Option<f64>,
    /// The models, aliases and virtual models it may ask for; anything else is a 403, and only
    /// what they resolve to is tried (fallbacks too). Unset: any (or the stored list).
    pub models: Option<Vec<String>>,
}

impl AgentConfig {
    /// The limits this section sets (each wins over the agent's stored value).
    pub fn limits(&self) -> crate::agents::Limits {
        crate::agents::Limits {
            requests_per_minute: self.requests_per_minute,
            tokens_per_day: self.tokens_per_day,
            cost_per_day: self.cost_per_day,
        }
    }
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RotationConfig {
    pub order: Rotation,
    /// Rotate before the 429: a profile whose remaining requests for a model, as the
    /// provider's last answer reported them, are at or below this goes after the profiles that
    /// still have quota, until the provider's reset time.
    pub quota_floor: u32,
    /// The same for remaining tokens: the estimate of the next request's size.
    pub quota_tokens_floor: u32,
}

impl RotationConfig {
    pub fn floor(&self) -> crate::engine::quota::Floor {
        crate::engine::quota::Floor { requests: self.quota_floor.into(), tokens: self.quota_tokens_floor.into() }
    }
}

#[derive(Clone, Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Failover {
    pub enabled: bool,
}

impl Default for Failover {
    fn default() -> Self {
        Failover { enabled: true }
    }
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Classification {
    /// Checked before the built-in table.
    pub rules: Vec<Rule>,
}
