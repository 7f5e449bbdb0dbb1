//! The configuration file (`rota.toml`), `ROTA_*` environment overrides and `.env` (docs/api.md).
//!
//! Loading only parses; [`Config::problems`] then checks what parsing cannot (unknown
//! providers, cycles, unset `api_key_env` variables). Every message names the key at fault.

use crate::engine::chain::{self, ChainRequest, Routing, VirtualModel};
use crate::engine::classify::Rule;
use crate::engine::duration::deserialize as duration;
use crate::engine::order::Rotation;
use crate::engine::profile::valid_provider_name;
use crate::engine::{BillingLane, CooldownLane, CooldownPolicy, Millis, ProfileId, ProfileType, RefreshWindow};
use crate::prices::Price;
use figment::Figment;
use figment::providers::{Env, Format, Toml};
use secrecy::{ExposeSecret, SecretString};
use serde::{Deserialize, Deserializer};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::time::Duration;

pub const DEFAULT_FILE: &str = "rota.toml";

/// The config file `rota demo` writes beside its database at each start: what the demo serves,
/// and what `rota --config rota-demo.toml …` reads to reach the demo's database.
pub const DEMO_FILE: &str = "rota-demo.toml";

/// When a demo's config is in the working directory and is not the config that was read
/// (`config_read`): how to reach the demo's database instead.
pub fn demo_hint(config_read: Option<&Path>) -> Option<String> {
    let demo = Path::new(DEMO_FILE);
    if !demo.is_file() {
        return None;
    }
    let canonical = |p: &Path| std::fs::canonicalize(p).ok();
    if config_read.is_some_and(|f| canonical(f).is_some_and(|f| Some(f) == canonical(demo))) {
        return None;
    }
    Some(format!("{DEMO_FILE} is here: `rota --config {DEMO_FILE} …` reaches the demo's database"))
}

/// The top-level sections a `ROTA_` variable may override (`ROTA_SECTION__KEY`). Other `ROTA_`
/// variables (`ROTA_CONFIG`, `ROTA_MASTER_KEY`, `ROTA_LOG`, an operator's own) are not config.
const SECTIONS: [&str; 20] = [
    "server",
    "audit",
    "database",
    "providers",
    "auth",
    "models",
    "aliases",
    "virtual_models",
    "agents",
    "cooldown",
    "billing",
    "rotation",
    "failover",
    "classification",
    "timeouts",
    "limits",
    "leases",
    "refresh",
    "secrets",
    "prices",
];

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub server: Server,
    #[serde(default)]
    pub database: Database,
    #[serde(default)]
    pub audit: AuditConfig,
    #[serde(default)]
    pub providers: BTreeMap<String, Provider>,
    #[serde(default)]
    pub auth: Auth,
    #[serde(default)]
    pub models: Models,
    #[serde(default)]
    pub aliases: HashMap<String, String>,
    #[serde(default)]
    pub virtual_models: HashMap<String, VirtualModel>,
    #[serde(default)]
    pub agents: BTreeMap<String, Agent>,
    /// The cooldown and billing lanes: the engine's types, whose defaults are
    /// `CooldownPolicy::default()`'s.
    #[serde(default)]
    pub cooldown: CooldownLane,
    #[serde(default)]
    pub billing: BillingLane,
    #[serde(default)]
    pub rotation: RotationConfig,
    #[serde(default)]
    pub failover: Failover,
    #[serde(default)]
    pub classification: Classification,
    #[serde(default)]
    pub timeouts: Timeouts,
    #[serde(default)]
    pub limits: Limits,
    #[serde(default)]
    pub leases: Leases,
    #[serde(default)]
    pub refresh: Refresh,
    #[serde(default)]
    pub secrets: Secrets,
    /// Prices by `"provider/model"` or `"model"`, over the shipped table (`src/prices.toml`).
    #[serde(default)]
    pub prices: BTreeMap<String, Price>,
}

/// Where the master key lives (docs/gateway.md, "Secrets").
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Secrets {
    /// `auto` (the Secret Service when a DBus session offers one), `secret-service`, `keyutils`
    /// (survives no reboot) or `off`. `ROTA_MASTER_KEY` always comes first.
    #[serde(default)]
    pub keyring: crate::keyring::Choice,
    /// The master key's file (its name ends in `.key`). Default: beside the SQLite file
    /// (`rota.db` → `rota.key`); with PostgreSQL, `rota.key` in the working directory.
    #[serde(default)]
    pub key_file: Option<PathBuf>,
}

/// Upstream timeouts (docs/gateway.md).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Timeouts {
    #[serde(default = "d10s", deserialize_with = "duration")]
    pub connect: Duration,
    /// Until the upstream's answer (non-streaming) or first content event (streaming).
    #[serde(default = "d120s", deserialize_with = "duration")]
    pub first_byte: Duration,
    /// A stream that sends nothing for this long has stalled (keep-alive comments do not count).
    #[serde(default = "d60s", deserialize_with = "duration")]
    pub idle: Duration,
    /// Ceiling for a whole request, every attempt included.
    #[serde(default = "d600s", deserialize_with = "duration")]
    pub total: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts { connect: d10s(), first_byte: d120s(), idle: d60s(), total: d600s() }
    }
}

fn d10s() -> Duration {
    Duration::from_secs(10)
}
fn d120s() -> Duration {
    Duration::from_secs(120)
}
fn d600s() -> Duration {
    Duration::from_secs(600)
}

/// OAuth token refresh (docs/api.md).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Refresh {
    /// Access tokens are refreshed this long before they expire.
    #[serde(default = "d300s", deserialize_with = "duration")]
    pub lead: Duration,
}

impl Default for Refresh {
    fn default() -> Self {
        Refresh { lead: d300s() }
    }
}

impl Refresh {
    /// The refresh window of an access token that expires at `expires_at`.
    pub fn window(&self, expires_at: Millis) -> RefreshWindow {
        RefreshWindow { expires_at, lead: self.lead.as_millis() as Millis }
    }
}

fn d300s() -> Duration {
    Duration::from_secs(300)
}

/// The lease API (docs/api.md).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Leases {
    /// How long a lease waits for its report; past it, the lease expires without changing stats.
    #[serde(default = "d600s", deserialize_with = "duration")]
    pub ttl: Duration,
    /// Outstanding leases one agent may hold; past it, its new leases get 429.
    #[serde(default = "thousand")]
    pub max_live_per_agent: usize,
    /// Failure reports one agent may make per minute; past it, its reports get 429.
    #[serde(default = "six_hundred")]
    pub failure_reports_per_minute: u32,
    /// Success reports one agent may make per minute (each may carry quota headers that order
    /// a profile last); past it, its reports get 429.
    #[serde(default = "six_thousand")]
    pub success_reports_per_minute: u32,
}

impl Default for Leases {
    fn default() -> Self {
        Leases {
            ttl: d600s(),
            max_live_per_agent: thousand(),
            failure_reports_per_minute: six_hundred(),
            success_reports_per_minute: six_thousand(),
        }
    }
}

fn thousand() -> usize {
    1000
}

fn six_hundred() -> u32 {
    600
}

fn six_thousand() -> u32 {
    6000
}

/// Request limits.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// Largest request body accepted, in bytes (413 beyond).
    #[serde(default = "default_body_max")]
    pub max_body_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { max_body_bytes: default_body_max() }
    }
}

fn default_body_max() -> usize {
    32 * 1024 * 1024
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Server {
    #[serde(default = "default_listen")]
    pub listen: String,
    /// After SIGTERM: how long requests in flight may still run before open streams are cut
    /// (with the in-band error, audited `cancelled`).
    #[serde(default = "d30s", deserialize_with = "duration")]
    pub shutdown_grace: Duration,
    /// A connection that has not sent a whole request head within this is closed.
    #[serde(default = "d10s", deserialize_with = "duration")]
    pub header_timeout: Duration,
    /// A request body that has not arrived whole within this is refused (408).
    #[serde(default = "d30s", deserialize_with = "duration")]
    pub body_timeout: Duration,
    /// Connections served at once; more wait in the kernel's accept queue.
    #[serde(default = "default_max_connections")]
    pub max_connections: usize,
    /// The address browsers reach rota at (`https://rota.example.com`): OAuth's `redirect_uri`
    /// is built from it, never from the request's `Host`, and with `https` the console's and
    /// the logins' cookies are `Secure`. Unset: the `Host` header and plain `http` (loopback and
    /// development only).
    #[serde(default, deserialize_with = "public_url")]
    pub public_url: Option<String>,
    /// A console session unused for this long is signed out; each use extends it.
    #[serde(default = "d30m", deserialize_with = "duration")]
    pub session_idle: Duration,
    /// A file holding the bearer token `/metrics` asks for (read at each scrape, so it can be
    /// replaced without a restart). Unset: `/metrics` needs no token.
    #[serde(default)]
    pub metrics_token_file: Option<PathBuf>,
}

impl Default for Server {
    fn default() -> Self {
        Server {
            listen: default_listen(),
            shutdown_grace: d30s(),
            header_timeout: d10s(),
            body_timeout: d30s(),
            max_connections: default_max_connections(),
            public_url: None,
            session_idle: d30m(),
            metrics_token_file: None,
        }
    }
}

impl Server {
    /// Whether cookies carry `Secure`: `public_url` is an `https` address.
    pub fn secure_cookies(&self) -> bool {
        self.public_url.as_deref().is_some_and(|u| u.starts_with("https://"))
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

fn d30m() -> Duration {
    Duration::from_secs(30 * 60)
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

fn default_listen() -> String {
    "127.0.0.1:8080".into()
}

fn default_max_connections() -> usize {
    4096
}

fn d1s() -> Duration {
    Duration::from_secs(1)
}

fn d30s() -> Duration {
    Duration::from_secs(30)
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Database {
    #[serde(default = "default_db")]
    pub url: String,
    /// SQLite: the size the write-ahead log is truncated to after a checkpoint, in MiB.
    #[serde(default = "default_wal_limit")]
    pub wal_limit_mb: u64,
    /// SQLite: how often the write-ahead log is copied into the database (and truncated when
    /// over `wal_limit_mb`).
    #[serde(default = "d1s", deserialize_with = "duration")]
    pub checkpoint_every: Duration,
}

impl Default for Database {
    fn default() -> Self {
        Database { url: default_db(), wal_limit_mb: default_wal_limit(), checkpoint_every: d1s() }
    }
}

fn default_wal_limit() -> u64 {
    64
}

/// The audit trail's writer and its retention (docs/audit.md).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuditConfig {
    /// Rows (requests and attempts) waiting to be written at most; beyond, rows are shed and
    /// counted (`rota_audit_dropped_total`).
    #[serde(default = "default_audit_queue")]
    pub queue: usize,
    /// How long raw `requests` and `attempts` rows are kept; `0s` keeps them for ever.
    #[serde(default = "d30d", deserialize_with = "duration")]
    pub retention: Duration,
    /// How often rows past `retention` are rolled up into `usage_daily` and deleted.
    #[serde(default = "d1h", deserialize_with = "duration")]
    pub prune_every: Duration,
}

impl Default for AuditConfig {
    fn default() -> Self {
        AuditConfig { queue: default_audit_queue(), retention: d30d(), prune_every: d1h() }
    }
}

fn default_audit_queue() -> usize {
    50_000
}

fn d30d() -> Duration {
    Duration::from_secs(30 * 86_400)
}

fn default_db() -> String {
    "sqlite://rota.db".into()
}

/// A provider's wire format (docs/config.md, docs/translation.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Api {
    /// OpenAI's own: chat completions and the Responses API, each passed through.
    Openai,
    /// Chat completions only (most OpenAI-compatible servers): Responses requests are
    /// translated to chat.
    OpenaiChat,
    /// The Responses API only: chat and messages requests are translated to it.
    OpenaiResponses,
    Anthropic,
}

impl Api {
    pub fn as_str(self) -> &'static str {
        match self {
            Api::Openai => "openai",
            Api::OpenaiChat => "openai-chat",
            Api::OpenaiResponses => "openai-responses",
            Api::Anthropic => "anthropic",
        }
    }

    /// Whether the provider authenticates and lists models as OpenAI does.
    pub fn is_openai(self) -> bool {
        self != Api::Anthropic
    }
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Provider {
    pub api: Api,
    pub base_url: String,
    pub oauth: Option<OAuth>,
    /// The cheap authenticated call rota makes to confirm an agent's claim that a credential
    /// is revoked or out of credit (`GET base_url + confirm_path`); default `/models` for the
    /// OpenAI format, `/v1/models` for Anthropic's.
    pub confirm_path: Option<String>,
}

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
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Auth {
    #[serde(default)]
    pub profiles: BTreeMap<ProfileId, ProfileConfig>,
    #[serde(default)]
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
#[serde(deny_unknown_fields)]
pub struct Models {
    pub primary: Option<String>,
    #[serde(default)]
    pub fallbacks: Vec<String>,
    /// docs/rotation.md: on a `context_overflow` of the key (`provider/model`), try these models (with a
    /// larger window) instead of returning the error.
    #[serde(default)]
    pub context_fallbacks: BTreeMap<String, Vec<String>>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Agent {
    /// Replaces `models.fallbacks` for this agent; `[]` means no fallback.
    pub fallbacks: Option<Vec<String>>,
    /// Its lease reports are evidence, like rota's own calls: they may reach the disabled lanes
    /// without rota's confirming call.
    #[serde(default)]
    pub trusted: bool,
    /// Requests admitted per minute (clock-aligned, across every server); over it, 429.
    pub requests_per_minute: Option<i64>,
    /// Input plus output tokens per UTC day; over it, 429 until midnight UTC.
    pub tokens_per_day: Option<i64>,
    /// USD per UTC day (from the requests' `cost`); over it, 429 until midnight UTC.
    pub cost_per_day: Option<f64>,
}

impl Agent {
    /// The limits this section sets (each wins over the agent's stored value).
    pub fn limits(&self) -> crate::agents::Limits {
        crate::agents::Limits {
            requests_per_minute: self.requests_per_minute,
            tokens_per_day: self.tokens_per_day,
            cost_per_day: self.cost_per_day,
        }
    }
}

fn d60s() -> Duration {
    Duration::from_secs(60)
}
fn d1h() -> Duration {
    Duration::from_secs(3600)
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RotationConfig {
    #[serde(default)]
    pub order: Rotation,
    /// Rotate before the 429: a profile whose remaining requests for a model, as the
    /// provider's last answer reported them, are at or below this goes after the profiles that
    /// still have quota, until the provider's reset time.
    #[serde(default)]
    pub quota_floor: u32,
    /// The same for remaining tokens: the estimate of the next request's size.
    #[serde(default)]
    pub quota_tokens_floor: u32,
}

impl RotationConfig {
    pub fn floor(&self) -> crate::engine::quota::Floor {
        crate::engine::quota::Floor { requests: self.quota_floor.into(), tokens: self.quota_tokens_floor.into() }
    }
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Failover {
    #[serde(default = "yes")]
    pub enabled: bool,
}

impl Default for Failover {
    fn default() -> Self {
        Failover { enabled: true }
    }
}

fn yes() -> bool {
    true
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Classification {
    /// Checked before the built-in table.
    #[serde(default)]
    pub rules: Vec<Rule>,
}

/// A configuration that failed to load, with every error found.
#[derive(Debug, thiserror::Error)]
#[error("{}", .0.join("\n"))]
pub struct ConfigError(pub Vec<String>);

/// Where the configuration came from.
#[derive(Clone, Debug)]
pub struct Source {
    /// The file, when one was read.
    pub file: Option<PathBuf>,
}

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

    /// Reads `path` (or `ROTA_CONFIG`, or `./rota.toml` when it exists), then the `ROTA_*`
    /// environment (`__` nests: `ROTA_SERVER__LISTEN`), then `DATABASE_URL`.
    pub fn load(path: Option<&Path>) -> Result<(Config, Source), ConfigError> {
        let explicit = path.map(Path::to_path_buf).or_else(|| std::env::var_os("ROTA_CONFIG").map(PathBuf::from));
        let file = match explicit {
            Some(p) if !p.is_file() => {
                return Err(ConfigError(vec![format!("config file {} not found", p.display())]));
            }
            Some(p) => Some(p),
            None => Some(PathBuf::from(DEFAULT_FILE)).filter(|p| p.is_file()),
        };
        let mut fig = Figment::new();
        if let Some(f) = &file {
            fig = fig.merge(Toml::file_exact(f));
        }
        fig = fig
            .merge(
                Env::prefixed("ROTA_")
                    .filter(|k| {
                        k == "failover_enabled"
                            || k.as_str()
                                .to_ascii_lowercase()
                                .split_once("__")
                                .is_some_and(|(s, _)| SECTIONS.contains(&s))
                    })
                    .map(|k| if k == "failover_enabled" { "failover.enabled".into() } else { k.into() })
                    .split("__"),
            )
            .merge(Env::raw().only(&["database_url"]).map(|_| "database.url".into()));
        let config = extract(&fig)?;
        Ok((config, Source { file }))
    }

    pub fn from_toml(text: &str) -> Result<Config, ConfigError> {
        extract(&Figment::new().merge(Toml::string(text)))
    }

    /// The file at `path` alone: no `ROTA_*` variable, no `DATABASE_URL` (what `rota demo`
    /// writes and then serves).
    pub fn from_file(path: &Path) -> Result<Config, ConfigError> {
        extract(&Figment::new().merge(Toml::file_exact(path)))
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

    /// Resolves a chain with this configuration's routing.
    pub fn chain(&self, req: &ChainRequest<'_>) -> Result<Vec<chain::Candidate>, chain::ChainError> {
        self.routing(|routing| chain::resolve(routing, req))
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

    /// Everything wrong with a parsed configuration, each naming its key. Empty when sound.
    pub fn problems(&self) -> Vec<String> {
        let mut out = Vec::new();
        if self.server.max_connections == 0 {
            out.push("server.max_connections: must be at least 1".into());
        }
        if self.audit.queue == 0 {
            out.push("audit.queue: must be at least 1".into());
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
        self.routing_problems(&mut out);
        out
    }

    /// The limits in force for `agent`: each key of its `[agents.NAME]` section, else the
    /// stored value.
    pub fn agent_limits(&self, agent: &crate::agents::Agent) -> crate::agents::Limits {
        match self.agents.get(&agent.name) {
            Some(section) => agent.limits.over(&section.limits()),
            None => agent.limits,
        }
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
        }
    }

    /// The database named by `database.url`: an SQLite file (`sqlite://rota.db`,
    /// `sqlite:rota.db`, a path) or a PostgreSQL server (`postgres://…`, `postgresql://…`).
    pub fn database(&self) -> Result<DatabaseTarget, ConfigError> {
        DatabaseTarget::parse(&self.database.url)
    }

    /// The path the master key's file (`key_file_for`) and keyring entry are named after.
    pub fn key_anchor(&self) -> Result<PathBuf, ConfigError> {
        match &self.secrets.key_file {
            Some(file) if file.extension().is_some_and(|e| e == "key") => Ok(file.clone()),
            Some(file) => Err(ConfigError(vec![format!(
                "secrets.key_file: `{}` must end in `.key` (its rotation writes `.key.new` beside it)",
                file.display()
            )])),
            None => Ok(self.database()?.key_anchor()),
        }
    }
}

/// Where rota keeps its state (`database.url`).
#[derive(Clone, PartialEq, Eq)]
pub enum DatabaseTarget {
    Sqlite(PathBuf),
    /// A PostgreSQL connection URL as written; shown only through `Display`, which hides its
    /// password.
    Postgres(String),
}

impl DatabaseTarget {
    /// `url` in one of the forms `database.url` takes (see `Config::database`).
    pub fn parse(url: &str) -> Result<DatabaseTarget, ConfigError> {
        let url = url.trim();
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            return Ok(DatabaseTarget::Postgres(url.to_string()));
        }
        let rest = url.strip_prefix("sqlite://").or_else(|| url.strip_prefix("sqlite:")).unwrap_or(url);
        let rest = rest.split('?').next().unwrap_or("");
        if url.contains("://") && !url.starts_with("sqlite://") {
            let scheme = url.split("://").next().unwrap_or("");
            return Err(ConfigError(vec![format!(
                "database.url: the scheme `{scheme}://` is not supported; use sqlite://PATH or postgres://USER@HOST/DB"
            )]));
        }
        if rest.is_empty() || rest.contains(":memory:") {
            return Err(ConfigError(vec![format!("database.url: `{url}` does not name a database file")]));
        }
        Ok(DatabaseTarget::Sqlite(PathBuf::from(rest)))
    }

    /// The path the master key's file and keyring entry are named after: the SQLite file
    /// (`rota.db` → `rota.key` beside it); with PostgreSQL, `rota.db` in the working directory
    /// (so `rota.key` there). A fleet gives every instance the same `ROTA_MASTER_KEY` instead.
    pub fn key_anchor(&self) -> PathBuf {
        match self {
            DatabaseTarget::Sqlite(path) => path.clone(),
            DatabaseTarget::Postgres(_) => PathBuf::from("rota.db"),
        }
    }

    /// False only for an SQLite file not created yet.
    pub fn exists(&self) -> bool {
        match self {
            DatabaseTarget::Sqlite(path) => path.exists(),
            DatabaseTarget::Postgres(_) => true,
        }
    }
}

impl std::fmt::Display for DatabaseTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DatabaseTarget::Sqlite(path) => write!(f, "{}", path.display()),
            DatabaseTarget::Postgres(url) => f.write_str(&redacted_url(url)),
        }
    }
}

impl std::fmt::Debug for DatabaseTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DatabaseTarget({self})")
    }
}

/// A database URL without its password: the one after the user, and any query parameter
/// whose name holds `password` (`?password=…`, `sslpassword`).
pub fn redacted_url(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut u) => {
            if u.password().is_some() {
                let _ = u.set_password(Some("***"));
            }
            let secret = |k: &str| k.to_ascii_lowercase().contains("password");
            if u.query_pairs().any(|(k, _)| secret(&k)) {
                let pairs: Vec<(String, String)> = u
                    .query_pairs()
                    .map(|(k, v)| (k.to_string(), if secret(&k) { "***".to_string() } else { v.to_string() }))
                    .collect();
                u.query_pairs_mut().clear().extend_pairs(pairs);
            }
            u.to_string()
        }
        Err(_) => "(a database URL that does not parse)".into(),
    }
}

/// Errors reported at most from one load; past them, the message says there are more.
const MAX_ERRORS: usize = 64;

/// Deserializes the merged configuration and reports every key at fault, not only the first:
/// after each error the key at fault is set aside and the rest deserialized again.
fn extract(fig: &Figment) -> Result<Config, ConfigError> {
    // A file that is not TOML at all stops here, with the parser's line and column.
    let mut tree = fig.find_value("").map_err(|e| ConfigError(describe(e)))?;
    let mut errors = Vec::new();
    let mut set_aside: Vec<Vec<String>> = Vec::new();
    loop {
        let e = match Config::deserialize(&tree) {
            Ok(config) if errors.is_empty() => return Ok(config),
            // What is left past the keys at fault is checked too, so that one run reports
            // every problem: a typo in a provider and the model that names it, together.
            Ok(rest) => {
                errors.extend(rest.problems());
                break;
            }
            Err(e) => e,
        };
        // A required key whose value was refused (and set aside) is not also reported missing.
        let follows = matches!(&e.kind, figment::error::Kind::MissingField(f)
            if set_aside.iter().any(|p| p.split_last().is_some_and(|(last, parent)| last == f && parent == e.path)));
        if !follows {
            errors.push(describe_at(fig, &tree, &e));
        }
        if errors.len() >= MAX_ERRORS {
            errors.push(format!("(stopped after {MAX_ERRORS} errors)"));
            break;
        }
        match set_aside_key(&mut tree, &e.path) {
            Some(p) => set_aside.push(p),
            None => break,
        }
    }
    Err(ConfigError(errors))
}

/// Removes the deepest table key on `path` (an error inside an array removes the array), so the
/// next pass goes past it. Its path, or `None` when the path names nothing left to remove.
fn set_aside_key(tree: &mut figment::value::Value, path: &[String]) -> Option<Vec<String>> {
    use figment::value::Value;
    let mut depth = 0;
    let mut at: &Value = tree;
    while let (Value::Dict(_, d), Some(seg)) = (at, path.get(depth)) {
        match d.get(seg) {
            Some(v) => (at, depth) = (v, depth + 1),
            None => break,
        }
    }
    if depth == 0 {
        return None;
    }
    let mut dict = tree;
    for seg in &path[..depth - 1] {
        dict = match dict {
            Value::Dict(_, d) => d.get_mut(seg)?,
            _ => return None,
        };
    }
    match dict {
        Value::Dict(_, d) => d.remove(&path[depth - 1]).map(|_| path[..depth].to_vec()),
        _ => None,
    }
}

/// One line for one error: the file (or variables) the key came from, the key as written in
/// TOML (`auth.profiles."openai:work".expires`, `models.fallbacks[0]`), then the problem.
fn describe_at(fig: &Figment, tree: &figment::value::Value, e: &figment::Error) -> String {
    use figment::value::Value;
    let mut key = String::new();
    let mut at = Some(tree);
    let mut tag = tree.tag();
    for seg in &e.path {
        match at {
            Some(Value::Array(_, items)) => {
                key.push_str(&format!("[{seg}]"));
                at = seg.parse::<usize>().ok().and_then(|i| items.get(i));
            }
            _ => {
                if !key.is_empty() {
                    key.push('.');
                }
                let bare = !seg.is_empty() && seg.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
                if bare {
                    key.push_str(seg)
                } else {
                    key.push_str(&format!("{seg:?}"))
                }
                at = match at {
                    Some(Value::Dict(_, d)) => d.get(seg),
                    _ => None,
                };
            }
        }
        if let Some(v) = at {
            tag = v.tag();
        }
    }
    let what = describe_kind(&e.kind);
    let origin = fig.get_metadata(tag).map(|m| match &m.source {
        Some(figment::Source::File(p)) => p.display().to_string(),
        _ => m.name.to_string(),
    });
    match (origin, key.is_empty()) {
        (Some(o), false) => format!("{o}: key `{key}`: {what}"),
        (Some(o), true) => format!("{o}: {what}"),
        (None, false) => format!("key `{key}`: {what}"),
        (None, true) => what,
    }
}

/// The problem in words; names in backticks once (figment's own text nests them).
fn describe_kind(kind: &figment::error::Kind) -> String {
    use figment::error::Kind;
    match kind {
        Kind::Message(m) => m.clone(),
        Kind::UnknownField(found, expected) => unknown("unknown key", found, expected),
        Kind::UnknownVariant(found, expected) => unknown(&format!("unknown value `{found}`"), found, expected),
        Kind::MissingField(f) => format!("missing `{f}`, which is required"),
        Kind::DuplicateField(f) => format!("`{f}` is given twice"),
        Kind::InvalidType(found, expected) => format!("expected {expected}, found {found}"),
        Kind::InvalidValue(found, expected) => format!("invalid value {found}, expected {expected}"),
        other => other.to_string(),
    }
}

/// `what`, then the closest valid name when one is close enough, else the valid names.
fn unknown(what: &str, found: &str, expected: &[&str]) -> String {
    if let Some(near) = did_you_mean(found, expected) {
        return format!("{what}; did you mean `{near}`?");
    }
    let names: Vec<String> = expected.iter().map(|n| format!("`{n}`")).collect();
    match names.as_slice() {
        [] => what.to_string(),
        [one] => format!("{what}; expected {one}"),
        [a, b] => format!("{what}; expected {a} or {b}"),
        [init @ .., last] => format!("{what}; expected one of {} or {last}", init.join(", ")),
    }
}

/// The valid name nearest to `found` (edit distance, transpositions counting once), when it is
/// a likely typo: at most one edit per three characters, and at least one.
pub fn did_you_mean<'a>(found: &str, valid: &[&'a str]) -> Option<&'a str> {
    let found = found.to_ascii_lowercase();
    let limit = (found.chars().count() / 3).max(1);
    valid
        .iter()
        .map(|v| (strsim::osa_distance(&found, v), *v))
        .filter(|(d, _)| *d <= limit)
        .min_by_key(|(d, _)| *d)
        .map(|(_, v)| v)
}

/// One line per figment error (a file that does not parse): the file (or variable) and the key
/// at fault, then the problem.
fn describe(err: figment::Error) -> Vec<String> {
    err.into_iter()
        .map(|e| {
            let key = e.path.join(".");
            let origin = e.metadata.as_ref().map(|m| match &m.source {
                Some(figment::Source::File(p)) => p.display().to_string(),
                _ => m.name.to_string(),
            });
            let what = describe_kind(&e.kind);
            match (origin, key.is_empty()) {
                (Some(o), false) => format!("{o}: key `{key}`: {what}"),
                (Some(o), true) => format!("{o}: {what}"),
                (None, false) => format!("key `{key}`: {what}"),
                (None, true) => what,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_database_url_is_shown_without_any_password() {
        let shown = redacted_url(
            "postgres://rota:hunter2@db.example:5432/rota?sslmode=require&password=s3cret&sslpassword=k3y",
        );
        assert_eq!(shown, "postgres://rota:***@db.example:5432/rota?sslmode=require&password=***&sslpassword=***");
        assert!(!shown.contains("hunter2") && !shown.contains("s3cret") && !shown.contains("k3y"));
        assert_eq!(redacted_url("postgres://rota@localhost/rota"), "postgres://rota@localhost/rota");
    }

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
        assert_eq!(err, "key `providers.x`: missing `base_url`, which is required");
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
        let stored =
            crate::agents::Limits { requests_per_minute: Some(50), tokens_per_day: Some(9), cost_per_day: None };
        let agent = crate::agents::Agent {
            id: "1".into(),
            name: "planner".into(),
            admin: false,
            created_at: 0,
            revoked_at: None,
            limits: stored,
        };
        let l = c.agent_limits(&agent);
        assert_eq!((l.requests_per_minute, l.tokens_per_day, l.cost_per_day), (Some(5), Some(9), None));
        let other = crate::agents::Agent { name: "other".into(), ..agent };
        assert_eq!(c.agent_limits(&other), stored);
    }

    #[test]
    fn database_url_forms() {
        let with = |u: &str| {
            Config { database: Database { url: u.into(), ..Default::default() }, ..Default::default() }.database()
        };
        let file = |p: &str| DatabaseTarget::Sqlite(PathBuf::from(p));
        assert_eq!(with("sqlite://rota.db").unwrap(), file("rota.db"));
        assert_eq!(with("sqlite:///var/lib/rota.db?mode=rwc").unwrap(), file("/var/lib/rota.db"));
        assert_eq!(with("data/x.db").unwrap(), file("data/x.db"));
        assert!(with("sqlite::memory:").is_err());
        let pg = with("postgres://rota:hunter2@db.internal:5432/rota").unwrap();
        assert_eq!(pg, DatabaseTarget::Postgres("postgres://rota:hunter2@db.internal:5432/rota".into()));
        assert_eq!(pg.to_string(), "postgres://rota:***@db.internal:5432/rota");
        assert!(!format!("{pg:?}").contains("hunter2"));
        assert!(with("postgresql://h/db").is_ok());
        let refused = with("mysql://root:hunter2@h/db").unwrap_err().to_string();
        assert!(refused.contains("mysql://") && !refused.contains("hunter2"), "{refused}");
    }

    #[test]
    fn spec_example_config_parses() {
        let c = parse(include_str!("../rota.example.toml"));
        assert!(c.has_provider("corp"));
        assert_eq!(c.virtual_models["smart"].targets.len(), 2);
        assert_eq!(c.agents["planner"].fallbacks, Some(vec![]));
    }
}
