//! People sign in to the console with their OpenID Connect provider (`[console.sso]`,
//! docs/operations.md, "Signing in"): authorization code + PKCE through rota's
//! `/oauth/callback` (the same address account logins come back to), the id_token's issuer,
//! audience, nonce and expiry checked, the role from a claim or the configured lists, and a
//! console session bound to the person.

use super::{Actor, ApiState};
use crate::config::{OAuth as OAuthConfig, Sso};
use crate::engine::Millis;
use crate::oauth::{self, OAuthError, Pending};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::Response;
use parking_lot::Mutex;
use serde::Deserialize;
use std::collections::{BTreeMap, HashMap};

/// A sign-in must come back within this time.
const PENDING_TTL: Millis = 15 * 60_000;
/// The provider's endpoints are read again after this long.
const DISCOVERY_TTL: Millis = 60 * 60_000;

/// The endpoints of `/.well-known/openid-configuration` rota uses.
#[derive(Clone, Debug, Deserialize)]
struct Discovery {
    issuer: String,
    authorization_endpoint: String,
    token_endpoint: String,
    userinfo_endpoint: Option<String>,
}

struct Started {
    pending: Pending,
    /// The OIDC nonce the id_token must carry.
    nonce: String,
    /// The digest of the browser's login cookie.
    browser: String,
}

/// Sign-ins in progress and the provider's endpoints, in memory.
#[derive(Default)]
pub struct SsoLogins {
    started: Mutex<HashMap<String, Started>>,
    discovered: Mutex<Option<(String, Discovery, Millis)>>,
}

impl SsoLogins {
    /// Whether `state` is a sign-in started here (the callback is then this module's).
    pub fn owns(&self, state: &str) -> bool {
        self.started.lock().contains_key(state)
    }
}

fn failed(why: impl std::fmt::Display) -> Response {
    crate::web::error_page(StatusCode::BAD_GATEWAY, &format!("sign-in: {why}"))
}

/// The provider's endpoints, from its discovery document (whose `issuer` must be the one
/// configured, OpenID Connect Discovery §4.3).
async fn discover(state: &ApiState, sso: &Sso) -> Result<Discovery, OAuthError> {
    let now = state.runtime.clock.now();
    if let Some((issuer, d, at)) = state.sso.discovered.lock().as_ref()
        && *issuer == sso.issuer
        && now - at < DISCOVERY_TTL
    {
        return Ok(d.clone());
    }
    let url = format!("{}/.well-known/openid-configuration", sso.issuer.trim_end_matches('/'));
    let d: Discovery = oauth::get_json(&state.logins.http, &url).await?;
    if d.issuer.trim_end_matches('/') != sso.issuer.trim_end_matches('/') {
        return Err(OAuthError::Malformed(format!(
            "the discovery document names the issuer {}, not {}",
            d.issuer, sso.issuer
        )));
    }
    *state.sso.discovered.lock() = Some((sso.issuer.clone(), d.clone(), now));
    Ok(d)
}

/// The sign-in as an OAuth client of the provider.
fn client(sso: &Sso, d: &Discovery, nonce: &str) -> OAuthConfig {
    OAuthConfig {
        authorize_url: d.authorization_endpoint.clone(),
        token_url: d.token_endpoint.clone(),
        device_url: None,
        userinfo_url: d.userinfo_endpoint.clone(),
        client_id: sso.client_id.clone(),
        client_secret_env: sso.client_secret_env.clone(),
        scopes: sso.scopes.clone(),
        extra_params: BTreeMap::from([("nonce".to_string(), nonce.to_string())]),
        redirect_uri: None,
        chatgpt: false,
    }
}

/// `GET /ui/sso`: off to the provider, the browser holding the sign-in's cookie.
pub async fn start(State(state): State<ApiState>, headers: HeaderMap) -> Response {
    let settings = state.runtime.settings();
    let Some(sso) = &settings.config.console.sso else {
        return crate::web::error_page(
            StatusCode::NOT_FOUND,
            "no [console.sso] is configured: sign in with an admin key",
        );
    };
    let d = match discover(&state, sso).await {
        Ok(d) => d,
        Err(e) => return failed(e),
    };
    let redirect = format!("{}/oauth/callback", super::oauth::public_base(&settings.config, &headers));
    let nonce = crate::web::random_token();
    let now = state.runtime.clock.now();
    let (url, pending) = match oauth::authorize("console", &client(sso, &d, &nonce), &redirect, now) {
        Ok(x) => x,
        Err(e) => return failed(e),
    };
    let browser = crate::web::random_token();
    let mut started = state.sso.started.lock();
    started.retain(|_, s| now - s.pending.created_at < PENDING_TTL);
    started.insert(pending.state.clone(), Started { pending, nonce, browser: crate::web::digest(&browser) });
    drop(started);
    crate::web::go_redirect(&url, &browser, settings.config.server.secure_cookies())
}

/// The provider's redirect back, for a sign-in (`oauth::callback` hands it over when the
/// `state` is one of these): the code exchanged, the id_token checked, the role found, and a
/// session for the person.
pub async fn callback(state: &ApiState, headers: &HeaderMap, query: &str, state_param: &str) -> Response {
    let page = |status: StatusCode, msg: &str| crate::web::error_page(status, msg);
    let Some(started) = state.sso.started.lock().remove(state_param) else {
        return page(StatusCode::BAD_REQUEST, "unknown or expired sign-in: sign in again");
    };
    let browser = crate::web::cookie(headers, crate::web::LOGIN_COOKIE).map(crate::web::digest);
    if browser.as_deref() != Some(started.browser.as_str()) {
        tracing::warn!("a console sign-in's callback from another browser was refused");
        return page(StatusCode::FORBIDDEN, "this sign-in was started in another browser: sign in again here");
    }
    let code = match oauth::code_from_pasted(&format!("?{query}"), &started.pending.state) {
        Ok(c) => c,
        Err(e) => return page(StatusCode::BAD_REQUEST, &e),
    };
    let settings = state.runtime.settings();
    let Some(sso) = &settings.config.console.sso else {
        return page(StatusCode::NOT_FOUND, "no [console.sso] is configured any more");
    };
    let d = match discover(state, sso).await {
        Ok(d) => d,
        Err(e) => return failed(e),
    };
    let cfg = client(sso, &d, &started.nonce);
    let now = state.runtime.clock.now();
    let granted = match oauth::exchange(&state.logins.http, &cfg, started.pending, &code, now).await {
        Ok(g) => g,
        Err(e) => return failed(e),
    };
    let Some(mut claims) = granted.id_token.as_deref().and_then(oauth::id_token_claims) else {
        return failed("the provider sent no id_token");
    };
    if let Err(why) = check_id_token(&claims, sso, &started.nonce, now) {
        tracing::warn!(%why, "a console sign-in's id_token was refused");
        return page(StatusCode::FORBIDDEN, &format!("the provider's id_token is refused: {why}"));
    }
    if claims.get("email").is_none()
        && let Some(email) = oauth::account(&state.logins.http, &cfg, &granted).await.email
    {
        claims["email"] = email.into();
    }
    let name =
        claims.get("email").or_else(|| claims.get("sub")).and_then(|v| v.as_str()).unwrap_or_default().to_string();
    let Some(role) = super::roles::role_of(sso, &claims) else {
        tracing::info!(person = %name, "a console sign-in without a role was refused");
        return page(
            StatusCode::FORBIDDEN,
            &format!("{name} signed in, but [console.sso] gives them no role: ask an admin (docs/operations.md)"),
        );
    };
    let actor = Actor { name, person: true, role };
    let server = &settings.config.server;
    let (token, session) = state.sessions.create(actor, None, now, server.session_idle);
    tracing::info!(person = %session.actor.name, role = role.as_str(), "console sign-in");
    let mut resp = crate::web::continue_page("/ui/", server.secure_cookies());
    resp.headers_mut().append(header::SET_COOKIE, crate::web::set_cookie(Some(&token), server.secure_cookies()));
    resp
}

/// OpenID Connect Core §3.1.3.7: the id_token came over the TLS connection rota opened to the
/// token endpoint, so its signature is not checked; its issuer, audience, nonce and expiry are.
fn check_id_token(claims: &serde_json::Value, sso: &Sso, nonce: &str, now: Millis) -> Result<(), String> {
    let text = |k: &str| claims.get(k).and_then(|v| v.as_str());
    if text("iss").map(|i| i.trim_end_matches('/')) != Some(sso.issuer.trim_end_matches('/')) {
        return Err(format!("its issuer is {:?}, not {}", text("iss"), sso.issuer));
    }
    let aud_ok = match claims.get("aud") {
        Some(serde_json::Value::String(a)) => *a == sso.client_id,
        Some(serde_json::Value::Array(a)) => a.iter().any(|x| x.as_str() == Some(&sso.client_id)),
        _ => false,
    };
    if !aud_ok {
        return Err("it is not for this client (aud)".into());
    }
    if text("nonce") != Some(nonce) {
        return Err("its nonce is not this sign-in's".into());
    }
    match claims.get("exp").and_then(|v| v.as_i64()) {
        Some(exp) if exp * 1000 > now => Ok(()),
        _ => Err("it has expired".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn an_id_token_must_be_this_issuers_for_this_client_with_this_nonce_and_unexpired() {
        let sso: Sso = toml::from_str(
            "issuer = \"https://idp.example.com\"\nclient_id = \"rota\"\n[roles]\nadmin = [\"a@example.com\"]",
        )
        .unwrap();
        let good = json!({"iss": "https://idp.example.com", "aud": ["x", "rota"], "nonce": "n1", "exp": 2_000});
        assert_eq!(check_id_token(&good, &sso, "n1", 1_000_000), Ok(()));
        let with = |k: &str, v: serde_json::Value| {
            let mut c = good.clone();
            c[k] = v;
            check_id_token(&c, &sso, "n1", 1_000_000).unwrap_err()
        };
        assert!(with("iss", json!("https://evil.example.com")).contains("issuer"));
        assert!(with("aud", json!("other")).contains("aud"));
        assert!(with("nonce", json!("n2")).contains("nonce"));
        assert!(with("exp", json!(999)).contains("expired"));
    }
}
