//! OAuth logins from the console or the API: authorization code + PKCE through rota's callback
//! or a pasted redirect URL, and the device flow. A login names its profile `provider:<email>`
//! (`provider:default` without an email); logging in the same account again updates it.

use super::{Admin, ApiError, Body};
use crate::book::Credential;
use crate::config::{Config, OAuth as OAuthConfig};
use crate::engine::{Millis, ProfileId, ProfileType};
use crate::oauth::{self, Granted, OAuthError, Pending};
use crate::secrets::SecretField;
use crate::server::AppState;
use crate::store::{StoreError, StoredProfile};
use axum::Json;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::sync::Mutex;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(authorize)).routes(routes!(paste)).routes(routes!(device)).routes(routes!(flow))
}

/// A browser login must come back within this time.
const PENDING_TTL: Millis = 15 * 60_000;

/// A started login: the PKCE verifier and state, bound to the browser that started it (the
/// digest of its login cookie) when a console session started it.
struct Started {
    pending: Pending,
    browser: Option<String>,
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

impl Logins {
    fn take(&self, state: &str, now: Millis) -> Option<Started> {
        let mut map = self.started.lock().unwrap_or_else(|e| e.into_inner());
        map.retain(|_, s| now - s.pending.created_at < PENDING_TTL);
        map.remove(state)
    }

    fn set_flow(&self, id: &str, info: FlowInfo) {
        self.flows.lock().unwrap_or_else(|e| e.into_inner()).insert(id.to_string(), info);
    }
}

fn oauth_config<'a>(config: &'a Config, provider: &str) -> Result<&'a OAuthConfig, ApiError> {
    let p =
        config.providers.get(provider).ok_or_else(|| ApiError::not_found(format!("unknown provider `{provider}`")))?;
    p.oauth.as_ref().ok_or_else(|| {
        ApiError::bad_request(format!(
            "provider {provider} has no [providers.{provider}.oauth] section: add API keys instead"
        ))
    })
}

fn login_error(e: OAuthError) -> ApiError {
    match e {
        OAuthError::Transport(_) => ApiError::new(502, "provider_unreachable", e.to_string()),
        OAuthError::Config { .. } | OAuthError::NoSecret(_) => ApiError::new(500, "oauth_config", e.to_string()),
        _ => ApiError::new(400, "login_refused", e.to_string()),
    }
}

/// Stores a completed login as the account's profile (added or updated) and puts it in
/// rotation at once. Returns the profile id.
pub async fn complete(state: &AppState, provider: &str, granted: Granted) -> Result<ProfileId, ApiError> {
    let settings = state.engine.settings();
    let cfg = oauth_config(&settings.config, provider)?;
    let email = oauth::email(&state.logins.http, cfg, &granted).await;
    let name = email.clone().unwrap_or_else(|| "default".into());
    let id = ProfileId::new(provider, &name).map_err(|e| ApiError::bad_request(format!("the account's email: {e}")))?;
    if settings.config.auth.profiles.contains_key(&id) {
        return Err(ApiError::conflict(format!("profile {id} is declared in the config file")));
    }
    let now = state.engine.clock.now();
    let mut sealed = vec![state.key.seal(&id, SecretField::AccessToken, &granted.access)];
    if let Some(r) = &granted.refresh {
        sealed.push(state.key.seal(&id, SecretField::RefreshToken, r));
    }
    let version = sealed.get(1).map(|s| s.nonce.clone());
    let mut profile = StoredProfile::stored(id.clone(), ProfileType::OAuth, granted.expires_at, now);
    profile.email = email;
    let added = state.store.save_login(&profile, &sealed).await.map_err(|e| match e {
        StoreError::Duplicate(id) => ApiError::conflict(format!("profile {id} exists and is not an OAuth profile")),
        other => ApiError::internal(other),
    })?;
    let book = &state.engine.book;
    book.set_tokens(&profile, Credential::OAuth { access: Some(granted.access), refresh: granted.refresh }, version);
    book.set_enabled(&id, true);
    book.clear(&id, now); // a new login ends "needs re-login" and any cooldown
    tracing::info!(profile = %id, added, "OAuth login");
    Ok(id)
}

#[derive(Serialize, ToSchema)]
pub struct Authorization {
    /// Open it in a browser.
    pub authorize_url: String,
    pub state: String,
    pub redirect_uri: String,
    /// True when the provider redirects to an address rota does not serve: paste the address
    /// the browser ends on to `/api/v1/oauth/{provider}/paste`.
    pub paste: bool,
}

/// Start a browser login
#[utoipa::path(post, path = "/api/v1/oauth/{provider}/authorize", tag = "console", params(("provider" = String, Path)),
    responses((status = 200, body = Authorization), (status = 400, body = super::ErrorBody), (status = 404, body = super::ErrorBody)))]
async fn authorize(
    State(state): State<AppState>,
    _: Admin,
    headers: HeaderMap,
    Path(provider): Path<String>,
) -> Result<Response, ApiError> {
    let settings = state.engine.settings();
    let cfg = oauth_config(&settings.config, &provider)?;
    let (redirect_uri, paste) = match &cfg.redirect_uri {
        Some(r) => (r.clone(), true),
        None => {
            let host = headers.get("host").and_then(|h| h.to_str().ok()).unwrap_or("127.0.0.1:8080");
            (format!("http://{host}/oauth/callback"), false)
        }
    };
    let now = state.engine.clock.now();
    let (url, pending) = oauth::authorize(&provider, cfg, &redirect_uri, now).map_err(login_error)?;
    let nonce = state.session(&headers).map(|_| crate::web::random_token());
    let browser = nonce.as_deref().map(crate::web::digest);
    let answer = Authorization { authorize_url: url, state: pending.state.clone(), redirect_uri, paste };
    state
        .logins
        .started
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(pending.state.clone(), Started { pending, browser });
    let mut resp = Json(answer).into_response();
    if let Some(n) = nonce {
        resp.headers_mut().insert(axum::http::header::SET_COOKIE, crate::web::login_cookie(Some(&n)));
    }
    Ok(resp)
}

/// The provider sends the browser here after consent: `?code=…&state=…`.
pub async fn callback(State(state): State<AppState>, headers: HeaderMap, RawQuery(query): RawQuery) -> Response {
    let page = |status: StatusCode, msg: &str| crate::web::error_page(status, msg);
    let query = query.unwrap_or_default();
    let state_param =
        url::form_urlencoded::parse(query.as_bytes()).find(|(k, _)| k == "state").map(|(_, v)| v.to_string());
    let Some(state_param) = state_param else { return page(StatusCode::BAD_REQUEST, "the callback has no state") };
    let now = state.engine.clock.now();
    let Some(started) = state.logins.take(&state_param, now) else {
        return page(StatusCode::BAD_REQUEST, "unknown or expired login state: start the login again from the console");
    };
    let browser = crate::web::cookie(&headers, crate::web::LOGIN_COOKIE).map(crate::web::digest);
    if started.browser.is_some() && started.browser != browser {
        return page(
            StatusCode::BAD_REQUEST,
            "this login was started in another browser: start it again from the console",
        );
    }
    let code = match oauth::code_from_pasted(&format!("?{query}"), &started.pending.state) {
        Ok(c) => c,
        Err(e) => return page(StatusCode::BAD_REQUEST, &e),
    };
    let provider = started.pending.provider.clone();
    match finish_code(&state, started.pending, &code).await {
        Ok(id) => crate::web::continue_page(&format!(
            "/ui/?added={}",
            url::form_urlencoded::byte_serialize(id.as_str().as_bytes()).collect::<String>()
        )),
        Err(e) => page(e.status, &format!("{provider}: {}", e.message)),
    }
}

async fn finish_code(state: &AppState, pending: Pending, code: &str) -> Result<ProfileId, ApiError> {
    let settings = state.engine.settings();
    let provider = pending.provider.clone();
    let cfg = oauth_config(&settings.config, &provider)?;
    let granted =
        oauth::exchange(&state.logins.http, cfg, pending, code, state.engine.clock.now()).await.map_err(login_error)?;
    complete(state, &provider, granted).await
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
    State(state): State<AppState>,
    _: Admin,
    Path(provider): Path<String>,
    Body(req): Body<PasteRequest>,
) -> Result<(StatusCode, Json<LoggedIn>), ApiError> {
    oauth_config(&state.engine.settings().config, &provider)?;
    // The login to finish: the one named, else the one the URL's state names.
    let query = req.url.split_once('?').map(|(_, q)| q).unwrap_or("");
    let claimed = req.state.clone().or_else(|| {
        url::form_urlencoded::parse(query.as_bytes()).find(|(k, _)| k == "state").map(|(_, v)| v.to_string())
    });
    let now = state.engine.clock.now();
    let started = claimed
        .as_deref()
        .and_then(|s| state.logins.take(s, now))
        .filter(|s| s.pending.provider == provider)
        .ok_or_else(|| ApiError::bad_request("the `state` does not match a login started here: start it again"))?;
    let code = oauth::code_from_pasted(&req.url, &started.pending.state).map_err(ApiError::bad_request)?;
    let id = finish_code(&state, started.pending, &code).await?;
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

/// Start a device login (RFC 8628)
///
/// rota polls the provider in the background; follow the outcome at `/api/v1/oauth/flows/{flow_id}`.
#[utoipa::path(post, path = "/api/v1/oauth/{provider}/device", tag = "console", params(("provider" = String, Path)),
    responses((status = 201, body = DeviceLogin), (status = 400, body = super::ErrorBody), (status = 404, body = super::ErrorBody),
        (status = 502, body = super::ErrorBody)))]
async fn device(
    State(state): State<AppState>,
    _: Admin,
    Path(provider): Path<String>,
) -> Result<(StatusCode, Json<DeviceLogin>), ApiError> {
    let settings = state.engine.settings();
    let cfg = oauth_config(&settings.config, &provider)?.clone();
    let details = oauth::device_start(&state.logins.http, &provider, &cfg).await.map_err(login_error)?;
    let flow_id = uuid::Uuid::new_v4().to_string();
    let now = state.engine.clock.now();
    let answer = DeviceLogin {
        flow_id: flow_id.clone(),
        user_code: details.user_code().secret().clone(),
        verification_uri: details.verification_uri().to_string(),
        verification_uri_complete: details.verification_uri_complete().map(|u| u.secret().clone()),
        expires_at: crate::status::time(now + details.expires_in().as_millis() as Millis),
        interval: details.interval().as_secs(),
    };
    state.logins.set_flow(&flow_id, FlowInfo { state: "pending".into(), profile_id: None, error: None });
    let st = state.clone();
    tokio::spawn(async move {
        let clock = st.engine.clock.clone();
        let outcome = match oauth::device_finish(&st.logins.http, &provider, &cfg, &details, || clock.now()).await {
            Ok(granted) => complete(&st, &provider, granted).await,
            Err(e) => Err(login_error(e)),
        };
        let info = match outcome {
            Ok(id) => FlowInfo { state: "done".into(), profile_id: Some(id.to_string()), error: None },
            Err(e) => FlowInfo { state: "failed".into(), profile_id: None, error: Some(e.message) },
        };
        st.logins.set_flow(&flow_id, info);
    });
    Ok((StatusCode::CREATED, Json(answer)))
}

/// A device login's progress
#[utoipa::path(get, path = "/api/v1/oauth/flows/{id}", tag = "console", params(("id" = String, Path)),
    responses((status = 200, body = FlowInfo), (status = 404, body = super::ErrorBody)))]
async fn flow(State(state): State<AppState>, _: Admin, Path(id): Path<String>) -> Result<Json<FlowInfo>, ApiError> {
    let flows = state.logins.flows.lock().unwrap_or_else(|e| e.into_inner());
    flows.get(&id).cloned().map(Json).ok_or_else(|| ApiError::not_found(format!("no login flow {id}")))
}
