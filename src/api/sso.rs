//! People sign in to the console with their OpenID Connect provider (`[console.sso]`,
//! docs/operations.md, "Signing in"): authorization code + PKCE through rota's
//! `/oauth/callback` (the same address account logins come back to), the id_token's issuer,
//! audience, nonce and expiry checked, the person's verified identity, the role from a claim or
//! the configured lists, and a console session bound to the person. Sign-ins in progress are
//! bounded (`MAX_PENDING`, `STARTS_PER_MINUTE` an address).

use super::roles::Person;
use super::session::Opener;
use super::{Actor, ApiState};
use crate::config::{OAuth as OAuthConfig, Sso};
use crate::engine::Millis;
use crate::oauth::{self, OAuthError, Pending};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::Response;
use parking_lot::Mutex;
use serde::Deserialize;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::IpAddr;

/// A sign-in must come back within this time.
const PENDING_TTL: Millis = 15 * 60_000;
/// The provider's endpoints are read again after this long.
const DISCOVERY_TTL: Millis = 60 * 60_000;
/// At most this many sign-ins started within `PENDING_TTL`; past it `/ui/sso` answers 503.
pub const MAX_PENDING: usize = 4096;
/// Sign-ins one client address may start a minute; past it `/ui/sso` answers 429.
pub const STARTS_PER_MINUTE: u32 = 20;

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
    started: Mutex<Starts>,
    discovered: Mutex<Option<(String, Discovery, Millis)>>,
}

/// The sign-ins started in the last `PENDING_TTL`, in the order they started (so expiry pops
/// from the front), and the starts of each client address in the current minute.
#[derive(Default)]
struct Starts {
    by_state: HashMap<String, Started>,
    order: VecDeque<(Millis, String)>,
    minute: Millis,
    per_address: HashMap<IpAddr, u32>,
}

impl Starts {
    /// Drops what is older than `PENDING_TTL` and the last minute's address counts.
    fn expire(&mut self, now: Millis) {
        while let Some((at, state)) = self.order.front() {
            if now - at < PENDING_TTL {
                break;
            }
            if self.by_state.get(state).is_some_and(|s| s.pending.created_at == *at) {
                self.by_state.remove(state);
            }
            self.order.pop_front();
        }
        if now / 60_000 != self.minute {
            self.minute = now / 60_000;
            self.per_address.clear();
        }
    }

    /// Why `from` may not start another sign-in now, if it may not.
    fn refused(&mut self, from: Option<IpAddr>, now: Millis) -> Option<(StatusCode, &'static str)> {
        self.expire(now);
        if self.order.len() >= MAX_PENDING {
            return Some((
                StatusCode::SERVICE_UNAVAILABLE,
                "too many sign-ins in progress: try again in a few minutes",
            ));
        }
        let n = self.per_address.entry(from.map_or(IpAddr::from([0, 0, 0, 0]), prefix)).or_default();
        if *n >= STARTS_PER_MINUTE {
            return Some((StatusCode::TOO_MANY_REQUESTS, "too many sign-ins started from this address: wait a minute"));
        }
        *n += 1;
        None
    }

    fn insert(&mut self, started: Started) {
        self.order.push_back((started.pending.created_at, started.pending.state.clone()));
        self.by_state.insert(started.pending.state.clone(), started);
    }
}

/// The address a client is counted under: an IPv6 client's /64, which one host holds whole.
fn prefix(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) if v6.to_ipv4_mapped().is_none() => {
            let s = v6.segments();
            IpAddr::from([s[0], s[1], s[2], s[3], 0, 0, 0, 0])
        }
        IpAddr::V6(v6) => IpAddr::V4(v6.to_ipv4_mapped().expect("mapped")),
        v4 => v4,
    }
}

impl SsoLogins {
    /// Whether `state` is a sign-in started here (the callback is then this module's).
    pub fn owns(&self, state: &str) -> bool {
        self.started.lock().by_state.contains_key(state)
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
    let endpoints = [Some(&d.authorization_endpoint), Some(&d.token_endpoint), d.userinfo_endpoint.as_ref()];
    if let Some(why) = endpoints.into_iter().flatten().find_map(|e| off_issuer(sso, e)) {
        return Err(OAuthError::Malformed(why));
    }
    *state.sso.discovered.lock() = Some((sso.issuer.clone(), d.clone(), now));
    Ok(d)
}

/// Why the discovery document's `endpoint` is refused, if it is: each must be https on the
/// issuer's host (or a host of `console.sso.endpoint_hosts`), http only on a loopback host.
fn off_issuer(sso: &Sso, endpoint: &str) -> Option<String> {
    let host =
        |u: &str| url::Url::parse(u).ok().and_then(|u| Some((u.scheme().to_string(), u.host_str()?.to_string())));
    let Some((scheme, at)) = host(endpoint) else {
        return Some(format!("the discovery document's endpoint {endpoint:?} is no URL"));
    };
    let issuer = host(&sso.issuer).map(|(_, h)| h).unwrap_or_default();
    let loopback =
        |h: &str| h == "localhost" || h.trim_matches(['[', ']']).parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback());
    let secure = scheme == "https" || (scheme == "http" && loopback(&at) && loopback(&issuer));
    let ours = at.eq_ignore_ascii_case(&issuer) || sso.endpoint_hosts.iter().any(|h| h.eq_ignore_ascii_case(&at));
    match (secure, ours) {
        (true, true) => None,
        (false, _) => Some(format!("the discovery document's endpoint {endpoint} is not https")),
        (_, false) => Some(format!(
            "the discovery document's endpoint {endpoint} is not on the issuer's host {issuer} \
             (console.sso.endpoint_hosts may name its host)"
        )),
    }
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
pub async fn start(
    State(state): State<ApiState>,
    peer: Option<axum::Extension<crate::middleware::Peer>>,
    headers: HeaderMap,
) -> Response {
    let settings = state.runtime.settings();
    let Some(sso) = &settings.config.console.sso else {
        return crate::web::error_page(
            StatusCode::NOT_FOUND,
            "no [console.sso] is configured: sign in with an admin key",
        );
    };
    let from = peer.map(|p| p.0.0.ip());
    if let Some((status, why)) = state.sso.started.lock().refused(from, state.runtime.clock.now()) {
        return crate::web::error_page(status, &format!("sign-in: {why}"));
    }
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
    state.sso.started.lock().insert(Started { pending, nonce, browser: crate::web::digest(&browser) });
    crate::web::go_redirect(&url, &browser, settings.config.server.secure_cookies())
}

/// The provider's redirect back, for a sign-in (`oauth::callback` hands it over when the
/// `state` is one of these): the code exchanged, the id_token checked, the role found, and a
/// session for the person.
pub async fn callback(state: &ApiState, headers: &HeaderMap, query: &str, state_param: &str) -> Response {
    let page = |status: StatusCode, msg: &str| crate::web::error_page(status, msg);
    let browser = crate::web::cookie(headers, crate::web::LOGIN_COOKIE).map(crate::web::digest);
    let started = {
        let mut starts = state.sso.started.lock();
        let Some(started) = starts.by_state.get(state_param) else {
            return page(StatusCode::BAD_REQUEST, "unknown or expired sign-in: sign in again");
        };
        // The browser is checked first: a `state` seen by someone else cancels nothing.
        if browser.as_deref() != Some(started.browser.as_str()) {
            tracing::warn!("a console sign-in's callback from another browser was refused");
            return page(StatusCode::FORBIDDEN, "this sign-in was started in another browser: sign in again here");
        }
        starts.by_state.remove(state_param).expect("just found")
    };
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
    let Some(claims) = granted.id_token.as_deref().and_then(oauth::id_token_claims) else {
        return failed("the provider sent no id_token");
    };
    if let Err(why) = check_id_token(&claims, sso, &started.nonce, now) {
        tracing::warn!(%why, "a console sign-in's id_token was refused");
        return page(StatusCode::FORBIDDEN, &format!("the provider's id_token is refused: {why}"));
    }
    // Userinfo is asked only when the id_token holds no verified email.
    let mut person = match Person::verified(sso, &claims, None) {
        Ok(p) => p,
        Err(why) => return page(StatusCode::FORBIDDEN, &format!("the provider's id_token is refused: {why}")),
    };
    if person.email.is_none()
        && let Some(info) = oauth::userinfo(&state.logins.http, &cfg, &granted).await
        && let Ok(p) = Person::verified(sso, &claims, Some(&info))
    {
        person = p;
    }
    let name = person.email.clone().unwrap_or_else(|| person.subject.clone());
    let Some(role) = super::roles::role_of(sso, &person) else {
        tracing::info!(person = %name, "a console sign-in without a role was refused");
        let unverified = if person.email.is_none() { " (the provider vouched for no email of theirs)" } else { "" };
        return page(
            StatusCode::FORBIDDEN,
            &format!(
                "{name} signed in, but [console.sso] gives them no role{unverified}: ask an admin (docs/operations.md)"
            ),
        );
    };
    let actor = Actor { name: person.subject.clone(), person: true, role, email: person.email.clone() };
    let server = &settings.config.server;
    let (token, session) = state.sessions.create(actor, Opener::Person(person), now, server.session_idle);
    tracing::info!(person = %name, role = role.as_str(), "console sign-in");
    if state.record(&session.actor, "session.sign_in", None, (None, None)).await.is_err() {
        state.sessions.end(&session.id);
        return page(StatusCode::SERVICE_UNAVAILABLE, "the sign-in could not be recorded in admin_actions: try again");
    }
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
