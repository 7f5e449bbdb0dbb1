//! The operator console (SPEC §8): sign-in with an admin key, a session cookie (HttpOnly,
//! SameSite=Strict) with a CSRF token, the console page and its assets (from `web/`, embedded
//! in the binary), and the OAuth callback.

use crate::agents::Agent;
use crate::engine::Millis;
use crate::server::AppState;
use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::get;
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use chacha20poly1305::aead::{OsRng, rand_core::RngCore};
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::sync::Mutex;

pub const COOKIE: &str = "rota_session";
/// A session lasts this long from sign-in.
const SESSION_TTL: Millis = 12 * 3_600_000;

const CONSOLE_HTML: &str = include_str!("../web/console.html");
const SIGN_IN_HTML: &str = include_str!("../web/sign-in.html");
const APP_JS: &str = include_str!("../web/app.js");
const SIGN_IN_JS: &str = include_str!("../web/sign-in.js");
const STYLE_CSS: &str = include_str!("../web/style.css");

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/", get(|| async { Redirect::to("/ui/") }))
        .route("/ui", get(|| async { Redirect::to("/ui/") }))
        .route("/ui/", get(console))
        .route("/ui/app.js", get(|| asset("text/javascript", APP_JS)))
        .route("/ui/sign-in.js", get(|| asset("text/javascript", SIGN_IN_JS)))
        .route("/ui/style.css", get(|| asset("text/css", STYLE_CSS)))
        .route("/oauth/callback", get(crate::api::oauth::callback))
}

async fn asset(content_type: &'static str, body: &'static str) -> Response {
    ([(header::CONTENT_TYPE, content_type), (header::CACHE_CONTROL, "no-cache")], body).into_response()
}

/// Pages carry no data: the console fetches everything from the API with its session.
fn page(html: &'static str) -> Response {
    let mut resp = Html(html).into_response();
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'; form-action 'self'",
        ),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    resp
}

/// The console with a session, else the sign-in page.
async fn console(State(state): State<AppState>, headers: HeaderMap) -> Response {
    match state.session(&headers) {
        Some(_) => page(CONSOLE_HTML),
        None => page(SIGN_IN_HTML),
    }
}

/// 32 random bytes, URL-safe.
pub fn random_token() -> String {
    let mut bytes = [0u8; 32];
    OsRng.fill_bytes(&mut bytes);
    URL_SAFE_NO_PAD.encode(bytes)
}

pub fn digest(token: &str) -> String {
    Sha256::digest(token.as_bytes()).iter().map(|b| format!("{b:02x}")).collect()
}

#[derive(Clone, Debug)]
pub struct Session {
    pub agent: Agent,
    pub csrf: String,
    /// The digest of the cookie's token: what OAuth logins started in this session are bound to.
    pub id: String,
    expires_at: Millis,
}

impl Session {
    /// Whether `presented` is this session's CSRF token (compared as digests).
    pub fn csrf_ok(&self, presented: Option<&str>) -> bool {
        presented.is_some_and(|p| digest(p) == digest(&self.csrf))
    }
}

/// Console sessions, in memory: a restart signs everyone out.
#[derive(Default)]
pub struct Sessions {
    by_digest: Mutex<HashMap<String, Session>>,
}

impl Sessions {
    /// A new session for `agent`: the cookie's value and the session.
    pub fn create(&self, agent: Agent, now: Millis) -> (String, Session) {
        let token = random_token();
        let id = digest(&token);
        let session = Session { agent, csrf: random_token(), id: id.clone(), expires_at: now + SESSION_TTL };
        let mut map = self.by_digest.lock().unwrap_or_else(|e| e.into_inner());
        map.retain(|_, s| s.expires_at > now);
        map.insert(id, session.clone());
        (token, session)
    }

    /// The session the request's cookie names, if it is live and its agent still `admitted`
    /// (an active admin: a key revoked or demoted anywhere, by the CLI or another instance too,
    /// ends its sessions at their next use).
    pub fn find(&self, headers: &HeaderMap, now: Millis, admitted: impl Fn(&Agent) -> bool) -> Option<Session> {
        let token = cookie(headers, COOKIE)?;
        let id = digest(token);
        let mut map = self.by_digest.lock().unwrap_or_else(|e| e.into_inner());
        let session = map.get(&id).filter(|s| s.expires_at > now)?;
        if !admitted(&session.agent) {
            map.remove(&id);
            return None;
        }
        Some(session.clone())
    }

    pub fn end(&self, id: &str) {
        self.by_digest.lock().unwrap_or_else(|e| e.into_inner()).remove(id);
    }

    /// Ends every session of an agent (its key was revoked).
    pub fn end_agent(&self, name: &str) {
        self.by_digest.lock().unwrap_or_else(|e| e.into_inner()).retain(|_, s| s.agent.name != name);
    }
}

/// The value of cookie `name` in the request's `Cookie` headers.
pub fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
}

/// `Set-Cookie` for a session (or, with `None`, one that removes it).
pub fn set_cookie(token: Option<&str>) -> HeaderValue {
    let v = match token {
        Some(t) => format!("{COOKIE}={t}; HttpOnly; SameSite=Strict; Path=/; Max-Age={}", SESSION_TTL / 1000),
        None => format!("{COOKIE}=; HttpOnly; SameSite=Strict; Path=/; Max-Age=0"),
    };
    HeaderValue::from_str(&v).expect("a session token is URL-safe base64")
}

/// Binds an OAuth login to the browser that started it. The provider's redirect back is a
/// cross-site navigation, which carries `SameSite=Lax` cookies but not the Strict session
/// cookie, so the login has a cookie of its own, sent only to the callback.
pub const LOGIN_COOKIE: &str = "rota_login";

pub fn login_cookie(nonce: Option<&str>) -> HeaderValue {
    let v = match nonce {
        Some(n) => format!("{LOGIN_COOKIE}={n}; HttpOnly; SameSite=Lax; Path=/oauth/callback; Max-Age=900"),
        None => format!("{LOGIN_COOKIE}=; HttpOnly; SameSite=Lax; Path=/oauth/callback; Max-Age=0"),
    };
    HeaderValue::from_str(&v).expect("a login nonce is URL-safe base64")
}

/// The callback's success page: it moves on to the console itself, so that the navigation
/// starts on rota's own site and carries the session cookie.
pub fn continue_page(target: &str) -> Response {
    let escaped = target.replace('&', "&amp;").replace('"', "&quot;").replace('<', "&lt;");
    let html = format!(
        "<!doctype html><meta charset=utf-8><meta http-equiv=refresh content=\"0;url={escaped}\"><title>rota: logged in</title>\
         <link rel=stylesheet href=/ui/style.css><main class=narrow><h1>Logged in</h1><p><a id=continue href=\"{escaped}\">Back to the console</a></p></main>"
    );
    let mut resp = Html(html).into_response();
    resp.headers_mut().insert(header::SET_COOKIE, login_cookie(None));
    resp
}

/// An error page for the browser (the OAuth callback).
pub fn error_page(status: StatusCode, message: &str) -> Response {
    let escaped = message.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;");
    let html = format!(
        "<!doctype html><meta charset=utf-8><title>rota: login failed</title><link rel=stylesheet href=/ui/style.css>\
         <main class=narrow><h1>Login failed</h1><p id=error>{escaped}</p><p><a href=/ui/>Back to the console</a></p></main>"
    );
    (status, Html(html)).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cookies_are_found_among_others() {
        let mut h = HeaderMap::new();
        h.append(header::COOKIE, HeaderValue::from_static("a=1; rota_session=tok; b=2"));
        assert_eq!(cookie(&h, COOKIE), Some("tok"));
        assert_eq!(cookie(&h, "b"), Some("2"));
        assert_eq!(cookie(&h, "rota"), None);
        let set = set_cookie(Some("t")).to_str().unwrap().to_string();
        assert!(set.contains("HttpOnly") && set.contains("SameSite=Strict") && set.contains("Path=/"));
    }

    #[test]
    fn sessions_expire_and_end() {
        let s = Sessions::default();
        let agent = Agent { id: "1".into(), name: "ops".into(), admin: true, created_at: 0, revoked_at: None };
        let (token, session) = s.create(agent, 1_000);
        let mut h = HeaderMap::new();
        h.insert(header::COOKIE, HeaderValue::from_str(&format!("{COOKIE}={token}")).unwrap());
        let admitted = |_: &Agent| true;
        assert_eq!(s.find(&h, 2_000, admitted).map(|x| x.id), Some(session.id.clone()));
        assert!(s.find(&h, 1_000 + SESSION_TTL, admitted).is_none(), "expired");
        assert!(session.csrf_ok(Some(&session.csrf)) && !session.csrf_ok(Some("x")) && !session.csrf_ok(None));
        assert!(s.find(&h, 2_000, |_| false).is_none(), "the agent is no longer an active admin");
        assert!(s.find(&h, 2_000, admitted).is_none(), "and the session is gone");
        let (token, _) = s.create(session.agent.clone(), 1_000);
        h.insert(header::COOKIE, HeaderValue::from_str(&format!("{COOKIE}={token}")).unwrap());
        s.end_agent("ops");
        assert!(s.find(&h, 2_000, admitted).is_none());
    }
}
