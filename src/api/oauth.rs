//! OAuth logins from the console or the API: authorization code + PKCE through rota's callback
//! or a pasted redirect URL, and the device flow. A login's profile is keyed by the account's
//! OpenID subject and named `provider:<email>` (`provider:default` without an email); logging in
//! the same account again updates it, and another account claiming the same email is refused.
//!
//! A callback is accepted only from the browser that started the login: one with a console
//! session holds the login's cookie from the start; a login started with an API key is bound
//! to the first browser that opens the `/oauth/go` link it answers with.

use super::{Actor, ApiState, Operator};
use super::{ApiError, Body};
use crate::book::Credential;
use crate::config::{Config, OAuth as OAuthConfig};
use crate::engine::{Millis, ProfileId, ProfileType};
use crate::oauth::{self, Account, Granted, OAuthError, Pending};
use crate::secrets::SecretField;
use crate::store::{Store, StoreError, StoredProfile};
use axum::Json;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

pub fn routes() -> OpenApiRouter<ApiState> {
    OpenApiRouter::new().routes(routes!(authorize)).routes(routes!(paste)).routes(routes!(device)).routes(routes!(flow))
}

/// A browser login must come back within this time.
const PENDING_TTL: Millis = 15 * 60_000;

/// Which browser may finish a login through the callback.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Binding {
    /// The browser holding the login cookie with this digest.
    Browser(String),
    /// Not yet bound: the first browser to open `/oauth/go?ticket=…` with the ticket of this
    /// digest will be.
    Ticket(String),
    /// No browser: a paste-URL login started without a console session, finished only through
    /// the (authenticated) paste endpoint.
    Nobody,
}

/// A started login: the PKCE verifier and state, the provider's authorization URL, and the
/// browser it is bound to.
struct Started {
    pending: Pending,
    authorize_url: String,
    binding: Binding,
    /// Who started it: the login is recorded as theirs (docs/operations.md, "Admin actions").
    actor: Actor,
}

#[derive(Clone, Serialize, ToSchema)]
pub struct FlowInfo {
    /// `pending`, `done` or `failed`.
    pub state: String,
    pub profile_id: Option<String>,
    pub error: Option<String>,
}

/// Logins in progress, in memory.
#[derive(Default)]
pub struct Logins {
    pub http: oauth::Http,
    started: Mutex<HashMap<String, Started>>,
    flows: Mutex<HashMap<String, FlowInfo>>,
}

/// Why a login's state was not taken.
enum Refused {
    /// No such login (never started, finished, or expired).
    Unknown,
    /// The login exists but `check` refused it (with this status and why): it stays, to be
    /// finished by the right party.
    Check(StatusCode, String),
}

impl Logins {
    /// Consumes the login of `state` if it is live and `check` accepts it; otherwise leaves it
    /// (a forged callback from another browser does not spoil the real one).
    fn take_if(
        &self,
        state: &str,
        now: Millis,
        check: impl FnOnce(&Started) -> Result<(), (StatusCode, String)>,
    ) -> Result<Started, Refused> {
        let mut map = self.started.lock();
        map.retain(|_, s| now - s.pending.created_at < PENDING_TTL);
        let started = map.get(state).ok_or(Refused::Unknown)?;
        check(started).map_err(|(status, why)| Refused::Check(status, why))?;
        map.remove(state).ok_or(Refused::Unknown)
    }

    /// Binds the login whose go-ticket is `ticket` to a new browser nonce; returns the
    /// provider's authorization URL and the nonce. Each ticket works once.
    fn bind(&self, ticket: &str, now: Millis) -> Option<(String, String)> {
        let want = Binding::Ticket(crate::web::digest(ticket));
        let mut map = self.started.lock();
        map.retain(|_, s| now - s.pending.created_at < PENDING_TTL);
        let started = map.values_mut().find(|s| s.binding == want)?;
        let nonce = crate::web::random_token();
        started.binding = Binding::Browser(crate::web::digest(&nonce));
        Some((started.authorize_url.clone(), nonce))
    }

    fn set_flow(&self, id: &str, info: FlowInfo) {
        self.flows.lock().insert(id.to_string(), info);
    }
}

fn oauth_config<'a>(config: &'a Config, provider: &str) -> Result<&'a OAuthConfig, ApiError> {
    let p =
        config.providers.get(provider).ok_or_else(|| ApiError::NotFound(format!("unknown provider `{provider}`")))?;
    p.oauth.as_ref().ok_or_else(|| {
        ApiError::BadRequest(format!(
            "provider {provider} has no [providers.{provider}.oauth] section: add API keys instead"
        ))
    })
}

fn login_error(e: OAuthError) -> ApiError {
    match e {
        OAuthError::Transport(_) => ApiError::ProviderUnreachable(e.to_string()),
        OAuthError::Config { .. } | OAuthError::NoSecret(_) => ApiError::OAuthConfig(e.to_string()),
        _ => ApiError::LoginRefused(e.to_string()),
    }
}

/// The profile a login of `account` goes to: the one already holding its subject, else
/// `provider:<email>` (`provider:default` without an email).
pub async fn login_target(store: &dyn Store, provider: &str, account: &Account) -> anyhow::Result<ProfileId> {
    if let Some(subject) = &account.subject
        && let Some(id) = store.login_profile(provider, subject).await?
    {
        return Ok(id);
    }
    let name = account.email.as_deref().unwrap_or("default");
    ProfileId::new(provider, name).map_err(|e| anyhow::anyhow!("the account's email: {e}"))
}

/// Stores a completed login as the account's profile (added or updated) and puts it in
/// rotation at once. Returns the profile id.
pub async fn complete(
    state: &ApiState,
    provider: &str,
    granted: Granted,
    actor: &Actor,
) -> Result<ProfileId, ApiError> {
    let settings = state.runtime.settings();
    let cfg = oauth_config(&settings.config, provider)?;
    let account = oauth::account(&state.logins.http, cfg, &granted).await;
    let id =
        login_target(state.store.as_ref(), provider, &account).await.map_err(|e| match e.downcast::<StoreError>() {
            Ok(e) => ApiError::internal(e),
            Err(e) => ApiError::BadRequest(e.to_string()),
        })?;
    if settings.config.auth.profiles.contains_key(&id) {
        return Err(ApiError::Conflict(format!("profile {id} is declared in the config file")));
    }
    let now = state.runtime.clock.now();
    let mut sealed = vec![state.key.seal(&id, SecretField::AccessToken, &granted.access)];
    if let Some(r) = &granted.refresh {
        sealed.push(state.key.seal(&id, SecretField::RefreshToken, r));
    }
    let version = sealed.get(1).map(|s| s.nonce.clone());
    let mut profile = StoredProfile::stored(id.clone(), ProfileType::OAuth, granted.expires_at, now);
    profile.email = account.email;
    profile.oauth_subject = account.subject;
    let roster = state.runtime.book.roster();
    let was = roster.views.contains_key(&id).then(|| serde_json::json!({"email": roster.emails.get(&id)}));
    drop(roster);
    let added = state.store.save_login(&profile, &sealed).await.map_err(|e| match e {
        StoreError::Duplicate(id) => ApiError::Conflict(format!("profile {id} exists and is not an OAuth profile")),
        StoreError::OtherAccount(id) => ApiError::Conflict(format!(
            "profile {id} belongs to another account with the same email: the login was not saved (delete that profile first if it is stale)"
        )),
        other => ApiError::internal(other),
    })?;
    let book = &state.runtime.book;
    book.set_tokens(&profile, Credential::OAuth { access: Some(granted.access), refresh: granted.refresh }, version);
    book.set_enabled(&id, true);
    book.clear(&id, now); // a new login ends "needs re-login" and any cooldown
    tracing::info!(profile = %id, added, "OAuth login");
    let now_is = serde_json::json!({"email": profile.email, "expires_at": granted.expires_at.map(crate::status::time)});
    state.record(actor, "profile.login", Some(id.as_str()), (was, Some(now_is))).await?;
    Ok(id)
}

#[derive(Serialize, ToSchema)]
pub struct Authorization {
    /// Open it in a browser. Started with a console session: the provider's authorization
    /// URL (the session's browser is bound to the login by a cookie). Started with an API key:
    /// rota's own `/oauth/go?ticket=…`, which binds the first browser that opens it and sends it
    /// on to the provider; it works once. With `paste`: the provider's URL.
    pub authorize_url: String,
    pub state: String,
    pub redirect_uri: String,
    /// True when the provider redirects to an address rota does not serve: paste the address
    /// the browser ends on to `/api/v1/oauth/{provider}/paste`.
    pub paste: bool,
}

/// Where browsers reach rota: `server.public_url`, else (loopback and development) `http://`
/// and the request's `Host`.
pub(super) fn public_base(config: &Config, headers: &HeaderMap) -> String {
    if let Some(u) = &config.server.public_url {
        return u.clone();
    }
    let host = headers.get("host").and_then(|h| h.to_str().ok()).unwrap_or("127.0.0.1:8080");
    if !is_loopback(host) {
        tracing::warn!(
            host,
            "server.public_url is not set: the OAuth redirect_uri is built from the request's Host header; set it in production"
        );
    }
    format!("http://{host}")
}

/// Whether a `Host` header names this machine: `localhost`, or a loopback address (with or
/// without a port). Parsed, not matched by prefix: `localhost.example.com` and `127.evil.com`
/// are other hosts.
fn is_loopback(host: &str) -> bool {
    let Ok(url) = url::Url::parse(&format!("http://{host}/")) else { return false };
    if url.path() != "/" || url.username() != "" || url.query().is_some() {
        return false;
    }
    match url.host() {
        Some(url::Host::Domain(d)) => d.eq_ignore_ascii_case("localhost"),
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        None => false,
    }
}

/// Start a browser login
#[utoipa::path(post, path = "/api/v1/oauth/{provider}/authorize", tag = "console", params(("provider" = String, Path)),
    responses((status = 200, body = Authorization), (status = 400, body = super::ErrorBody), (status = 404, body = super::ErrorBody)))]
async fn authorize(
    State(state): State<ApiState>,
    Operator(actor): Operator,
    headers: HeaderMap,
    Path(provider): Path<String>,
) -> Result<Response, ApiError> {
    let settings = state.runtime.settings();
    let cfg = oauth_config(&settings.config, &provider)?;
    let base = public_base(&settings.config, &headers);
    let (redirect_uri, paste) = match &cfg.redirect_uri {
        Some(r) => (r.clone(), true),
        None => (format!("{base}/oauth/callback"), false),
    };
    let now = state.runtime.clock.now();
    let (url, pending) = oauth::authorize(&provider, cfg, &redirect_uri, now).map_err(login_error)?;
    let secure = settings.config.server.secure_cookies();
    let (binding, open, cookie) = match state.session(&headers) {
        Some(_) => {
            let nonce = crate::web::random_token();
            (
                Binding::Browser(crate::web::digest(&nonce)),
                url.clone(),
                Some(crate::web::login_cookie(Some(&nonce), secure)),
            )
        }
        None if paste => (Binding::Nobody, url.clone(), None),
        None => {
            let ticket = crate::web::random_token();
            (Binding::Ticket(crate::web::digest(&ticket)), format!("{base}/oauth/go?ticket={ticket}"), None)
        }
    };
    let answer = Authorization { authorize_url: open, state: pending.state.clone(), redirect_uri, paste };
    state.logins.started.lock().insert(pending.state.clone(), Started { pending, authorize_url: url, binding, actor });
    let mut resp = Json(answer).into_response();
    if let Some(c) = cookie {
        resp.headers_mut().insert(axum::http::header::SET_COOKIE, c);
    }
    Ok(resp)
}

/// `GET /oauth/go?ticket=…`: binds a login started with an API key to this browser (its login
/// cookie) and sends it on to the provider. A ticket works once.
pub async fn go(State(state): State<ApiState>, RawQuery(query): RawQuery) -> Response {
    let query = query.unwrap_or_default();
    let ticket = url::form_urlencoded::parse(query.as_bytes()).find(|(k, _)| k == "ticket").map(|(_, v)| v.to_string());
    let now = state.runtime.clock.now();
    match ticket.and_then(|t| state.logins.bind(&t, now)) {
        Some((to, nonce)) => {
            crate::web::go_redirect(&to, &nonce, state.runtime.settings().config.server.secure_cookies())
        }
        None => crate::web::error_page(
            StatusCode::BAD_REQUEST,
            "this login link is unknown, expired or already used: start the login again",
        ),
    }
}

/// The provider sends the browser here after consent: `?code=…&state=…`. The login must be
/// live and bound to this browser (its login cookie) before it is consumed: a callback from
/// any other browser is refused and leaves the login to its own browser.
pub async fn callback(State(state): State<ApiState>, headers: HeaderMap, RawQuery(query): RawQuery) -> Response {
    let page = |status: StatusCode, msg: &str| crate::web::error_page(status, msg);
    let query = query.unwrap_or_default();
    let state_param =
        url::form_urlencoded::parse(query.as_bytes()).find(|(k, _)| k == "state").map(|(_, v)| v.to_string());
    let Some(state_param) = state_param else { return page(StatusCode::BAD_REQUEST, "the callback has no state") };
    // A person signing in to the console comes back here too.
    if state.sso.owns(&state_param) {
        return super::sso::callback(&state, &headers, &query, &state_param).await;
    }
    let now = state.runtime.clock.now();
    let browser = crate::web::cookie(&headers, crate::web::LOGIN_COOKIE).map(crate::web::digest);
    let mut code = String::new();
    let check = |s: &Started| {
        code = oauth::code_from_pasted(&format!("?{query}"), &s.pending.state)
            .map_err(|e| (StatusCode::BAD_REQUEST, e))?;
        match (&s.binding, &browser) {
            (Binding::Browser(want), Some(have)) if want == have => Ok(()),
            _ => {
                tracing::warn!("an OAuth callback from another browser than the login's was refused");
                Err((
                    StatusCode::FORBIDDEN,
                    "this login was started in another browser: finish it there, or start it again here".to_string(),
                ))
            }
        }
    };
    let started = match state.logins.take_if(&state_param, now, check) {
        Ok(s) => s,
        Err(Refused::Unknown) => {
            return page(
                StatusCode::BAD_REQUEST,
                "unknown or expired login state: start the login again from the console",
            );
        }
        Err(Refused::Check(status, why)) => return page(status, &why),
    };
    let provider = started.pending.provider.clone();
    let secure = state.runtime.settings().config.server.secure_cookies();
    match finish_code(&state, started.pending, &code, &started.actor).await {
        Ok(id) => crate::web::continue_page(
            &format!("/ui/?added={}", url::form_urlencoded::byte_serialize(id.as_str().as_bytes()).collect::<String>()),
            secure,
        ),
        Err(e) => page(e.status_code(), &format!("{provider}: {e}")),
    }
}

async fn finish_code(state: &ApiState, pending: Pending, code: &str, actor: &Actor) -> Result<ProfileId, ApiError> {
    let settings = state.runtime.settings();
    let provider = pending.provider.clone();
    let cfg = oauth_config(&settings.config, &provider)?;
    let granted = oauth::exchange(&state.logins.http, cfg, pending, code, state.runtime.clock.now())
        .await
        .map_err(login_error)?;
    complete(state, &provider, granted, actor).await
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PasteRequest {
    /// The whole address the browser ended on after consent (`…?code=…&state=…`). It is parsed,
    /// never fetched.
    pub url: String,
    /// The `state` of the login, when the URL's own cannot be trusted to pick it.
    pub state: Option<String>,
}

#[derive(Serialize, ToSchema)]
pub struct LoggedIn {
    pub profile_id: String,
}

/// Finish a browser login with the pasted redirect URL
#[utoipa::path(post, path = "/api/v1/oauth/{provider}/paste", tag = "console", params(("provider" = String, Path)),
    request_body = PasteRequest,
    responses((status = 201, body = LoggedIn), (status = 400, body = super::ErrorBody), (status = 404, body = super::ErrorBody)))]
async fn paste(
    State(state): State<ApiState>,
    Operator(actor): Operator,
    Path(provider): Path<String>,
    Body(req): Body<PasteRequest>,
) -> Result<(StatusCode, Json<LoggedIn>), ApiError> {
    oauth_config(&state.runtime.settings().config, &provider)?;
    // The login to finish: the one named, else the one the URL's state names.
    let query = req.url.split_once('?').map(|(_, q)| q).unwrap_or("");
    let claimed = req.state.clone().or_else(|| {
        url::form_urlencoded::parse(query.as_bytes()).find(|(k, _)| k == "state").map(|(_, v)| v.to_string())
    });
    let now = state.runtime.clock.now();
    let refused = || ApiError::BadRequest("the `state` does not match a login started here: start it again".into());
    // The pasted URL's own state must be the login's before anything is consumed.
    let mut code = String::new();
    let check = |s: &Started| {
        if s.pending.provider != provider {
            return Err((
                StatusCode::BAD_REQUEST,
                format!("this login is for another provider ({})", s.pending.provider),
            ));
        }
        code = oauth::code_from_pasted(&req.url, &s.pending.state).map_err(|e| (StatusCode::BAD_REQUEST, e))?;
        Ok(())
    };
    let started = match claimed.as_deref().map(|s| state.logins.take_if(s, now, check)) {
        Some(Ok(s)) => s,
        Some(Err(Refused::Check(_, why))) => return Err(ApiError::BadRequest(why)),
        Some(Err(Refused::Unknown)) | None => return Err(refused()),
    };
    let id = finish_code(&state, started.pending, &code, &actor).await?;
    Ok((StatusCode::CREATED, Json(LoggedIn { profile_id: id.to_string() })))
}

#[derive(Serialize, ToSchema)]
pub struct DeviceLogin {
    pub flow_id: String,
    /// The code to type at `verification_uri`.
    pub user_code: String,
    pub verification_uri: String,
    pub verification_uri_complete: Option<String>,
    /// RFC 3339.
    pub expires_at: String,
    /// Seconds between rota's polls.
    pub interval: u64,
}

/// Start a device login (RFC 8628, or ChatGPT's own for the `codex` preset)
///
/// rota polls the provider in the background; follow the outcome at `/api/v1/oauth/flows/{flow_id}`.
#[utoipa::path(post, path = "/api/v1/oauth/{provider}/device", tag = "console", params(("provider" = String, Path)),
    responses((status = 201, body = DeviceLogin), (status = 400, body = super::ErrorBody), (status = 404, body = super::ErrorBody),
        (status = 502, body = super::ErrorBody)))]
async fn device(
    State(state): State<ApiState>,
    Operator(actor): Operator,
    Path(provider): Path<String>,
) -> Result<(StatusCode, Json<DeviceLogin>), ApiError> {
    let settings = state.runtime.settings();
    let cfg = oauth_config(&settings.config, &provider)?.clone();
    let clock = state.runtime.clock.clone();
    let now = clock.now();
    let login = oauth::device(&state.logins.http, &provider, &cfg, move || clock.now()).await.map_err(login_error)?;
    let flow_id = uuid::Uuid::new_v4().to_string();
    let answer = DeviceLogin {
        flow_id: flow_id.clone(),
        user_code: login.user_code,
        verification_uri: login.verification_uri,
        verification_uri_complete: login.verification_uri_complete,
        expires_at: crate::status::time(now + login.expires_in.as_millis() as Millis),
        interval: login.interval.as_secs(),
    };
    let finish = login.finish;
    state.logins.set_flow(&flow_id, FlowInfo { state: "pending".into(), profile_id: None, error: None });
    let st = state.clone();
    tokio::spawn(async move {
        let outcome = match finish.await {
            Ok(granted) => complete(&st, &provider, granted, &actor).await,
            Err(e) => Err(login_error(e)),
        };
        let info = match outcome {
            Ok(id) => FlowInfo { state: "done".into(), profile_id: Some(id.to_string()), error: None },
            Err(e) => FlowInfo { state: "failed".into(), profile_id: None, error: Some(e.to_string()) },
        };
        st.logins.set_flow(&flow_id, info);
    });
    Ok((StatusCode::CREATED, Json(answer)))
}

/// A device login's progress
#[utoipa::path(get, path = "/api/v1/oauth/flows/{id}", tag = "console", params(("id" = String, Path)),
    responses((status = 200, body = FlowInfo), (status = 404, body = super::ErrorBody)))]
async fn flow(State(state): State<ApiState>, _: Operator, Path(id): Path<String>) -> Result<Json<FlowInfo>, ApiError> {
    let flows = state.logins.flows.lock();
    flows.get(&id).cloned().map(Json).ok_or_else(|| ApiError::NotFound(format!("no login flow {id}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_loopback_check_parses_the_host() {
        for host in ["localhost", "localhost:8080", "127.0.0.1", "127.0.0.1:3000", "127.8.9.10", "[::1]:8080"] {
            assert!(is_loopback(host), "{host}");
        }
        for host in [
            "localhost.evil.com",
            "127.evil.com",
            "127.0.0.1.nip.io",
            "evil.com",
            "[::2]",
            "localhost/x",
            "a@localhost",
        ] {
            assert!(!is_loopback(host), "{host}");
        }
    }
}
