//! The operator console (SPEC §8): sign-in with an admin key, a session cookie (HttpOnly,
//! SameSite=Strict, Secure behind an https `server.public_url`) with a CSRF token and an idle
//! timeout, the console page and its assets (from `web/`, embedded in the binary), and the
//! OAuth callback. Every answer here carries a Content-Security-Policy.

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
/// The header of the console's background refreshes: they do not extend the session.
pub const BACKGROUND: &str = "x-rota-background";
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
        .route("/oauth/go", get(crate::api::oauth::go))
        .layer(axum::middleware::map_response(default_csp))
}

/// The console's pages: their own script and style files, API calls to rota, nothing inline.
pub const CONSOLE_CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
     connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";
/// The OAuth callback's pages (logged in, login failed) and `/oauth/go`: rota's stylesheet and
/// nothing else; no script at all.
pub const CALLBACK_CSP: &str =
    "default-src 'none'; style-src 'self'; form-action 'none'; frame-ancestors 'none'; base-uri 'none'";

/// Every answer of this router without a policy of its own (redirects, assets) gets the
/// strictest one.
async fn default_csp(mut r: Response) -> Response {
    r.headers_mut()
        .entry(header::CONTENT_SECURITY_POLICY)
        .or_insert(HeaderValue::from_static("default-src 'none'; frame-ancestors 'none'; base-uri 'none'"));
    r
}

/// The headers of every page rota shows a browser: its CSP, no framing, no referrer, no cache.
fn harden(resp: &mut Response, csp: &'static str) {
    let h = resp.headers_mut();
    h.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(csp));
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
}

async fn asset(content_type: &'static str, body: &'static str) -> Response {
    ([(header::CONTENT_TYPE, content_type), (header::CACHE_CONTROL, "no-cache")], body).into_response()
}

/// Pages carry no data: the console fetches everything from the API with its session.
fn page(html: &'static str) -> Response {
    let mut resp = Html(html).into_response();
    harden(&mut resp, CONSOLE_CSP);
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
    /// Unused for this long, the session ends (`server.session_idle` when it was created).
    idle: Millis,
    last_used: Millis,
}

impl Session {
    fn live(&self, now: Millis) -> bool {
        self.expires_at > now && now - self.last_used < self.idle
    }

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
    /// A new session for `agent` that ends after `idle` unused (and 12 hours at most): the
    /// cookie's value and the session.
    pub fn create(&self, agent: Agent, now: Millis, idle: std::time::Duration) -> (String, Session) {
        let token = random_token();
        let id = digest(&token);
        let idle = Millis::try_from(idle.as_millis()).unwrap_or(Millis::MAX).max(1);
        let session = Session {
            agent,
            csrf: random_token(),
            id: id.clone(),
            expires_at: now + SESSION_TTL,
            idle,
            last_used: now,
        };
        let mut map = self.by_digest.lock().unwrap_or_else(|e| e.into_inner());
        map.retain(|_, s| s.live(now));
        map.insert(id, session.clone());
        (token, session)
    }

    /// The session the request's cookie names, if it is live (used within its idle timeout,
    /// younger than 12 hours) and its agent still `admitted` (an active admin: a key revoked or
    /// demoted anywhere, by the CLI or another instance too, ends its sessions at their next
    /// use). Finding it counts as a use, its idle timeout starting again, unless the request
    /// says it is the console's own background refresh (`x-rota-background`).
    pub fn find(&self, headers: &HeaderMap, now: Millis, admitted: impl Fn(&Agent) -> bool) -> Option<Session> {
        let token = cookie(headers, COOKIE)?;
        let id = digest(token);
        let mut map = self.by_digest.lock().unwrap_or_else(|e| e.into_inner());
        let session = map.get_mut(&id)?;
        if !session.live(now) || !admitted(&session.agent) {
            map.remove(&id);
            return None;
        }
        if !headers.contains_key(BACKGROUND) {
            session.last_used = session.last_used.max(now);
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

/// `; Secure` when rota is reached over https (`server.public_url`).
fn secure_attr(secure: bool) -> &'static str {
    if secure { "; Secure" } else { "" }
}

/// `Set-Cookie` for a session (or, with `None`, one that removes it); `Secure` when `secure`.
pub fn set_cookie(token: Option<&str>, secure: bool) -> HeaderValue {
    let s = secure_attr(secure);
    let v = match token {
        Some(t) => format!("{COOKIE}={t}; HttpOnly; SameSite=Strict; Path=/; Max-Age={}{s}", SESSION_TTL / 1000),
        None => format!("{COOKIE}=; HttpOnly; SameSite=Strict; Path=/; Max-Age=0{s}"),
    };
    HeaderValue::from_str(&v).expect("a session token is URL-safe base64")
}

/// Binds an OAuth login to the browser that started it. The provider's redirect back is a
/// cross-site navigation, which carries `SameSite=Lax` cookies but not the Strict session
/// cookie, so the login has a cookie of its own, sent only to the callback.
pub const LOGIN_COOKIE: &str = "rota_login";

pub fn login_cookie(nonce: Option<&str>, secure: bool) -> HeaderValue {
    let s = secure_attr(secure);
    let v = match nonce {
        Some(n) => format!("{LOGIN_COOKIE}={n}; HttpOnly; SameSite=Lax; Path=/oauth/callback; Max-Age=900{s}"),
        None => format!("{LOGIN_COOKIE}=; HttpOnly; SameSite=Lax; Path=/oauth/callback; Max-Age=0{s}"),
    };
    HeaderValue::from_str(&v).expect("a login nonce is URL-safe base64")
}

/// `/oauth/go`'s answer: the browser that opened it now holds the login's cookie and goes on
/// to the provider.
pub fn go_redirect(to: &str, nonce: &str, secure: bool) -> Response {
    let mut resp = Redirect::to(to).into_response();
    harden(&mut resp, CALLBACK_CSP);
    resp.headers_mut().insert(header::SET_COOKIE, login_cookie(Some(nonce), secure));
    resp
}

/// The callback's success page: it moves on to the console itself, so that the navigation
/// starts on rota's own site and carries the session cookie.
pub fn continue_page(target: &str, secure: bool) -> Response {
    let escaped = target.replace('&', "&amp;").replace('"', "&quot;").replace('<', "&lt;");
    let html = format!(
        "<!doctype html><meta charset=utf-8><meta http-equiv=refresh content=\"0;url={escaped}\"><title>rota: logged in</title>\
         <link rel=stylesheet href=/ui/style.css><main class=narrow><h1>Logged in</h1><p><a id=continue href=\"{escaped}\">Back to the console</a></p></main>"
    );
    let mut resp = Html(html).into_response();
    harden(&mut resp, CALLBACK_CSP);
    resp.headers_mut().insert(header::SET_COOKIE, login_cookie(None, secure));
    resp
}

/// An error page for the browser (the OAuth callback).
pub fn error_page(status: StatusCode, message: &str) -> Response {
    let escaped = message.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;");
    let html = format!(
        "<!doctype html><meta charset=utf-8><title>rota: login failed</title><link rel=stylesheet href=/ui/style.css>\
         <main class=narrow><h1>Login failed</h1><p id=error>{escaped}</p><p><a href=/ui/>Back to the console</a></p></main>"
    );
    let mut resp = (status, Html(html)).into_response();
    harden(&mut resp, CALLBACK_CSP);
    resp
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
        let set = set_cookie(Some("t"), false).to_str().unwrap().to_string();
        assert!(set.contains("HttpOnly") && set.contains("SameSite=Strict") && set.contains("Path=/"));
        assert!(!set.contains("Secure"));
        assert!(set_cookie(Some("t"), true).to_str().unwrap().ends_with("; Secure"));
        assert!(login_cookie(None, true).to_str().unwrap().ends_with("; Secure"));
    }

    #[test]
    fn an_idle_session_ends_and_each_use_extends_it() {
        let s = Sessions::default();
        let agent = Agent { id: "1".into(), name: "ops".into(), admin: true, created_at: 0, revoked_at: None };
        let (token, _) = s.create(agent, 0, std::time::Duration::from_secs(60));
        let mut h = HeaderMap::new();
        h.insert(header::COOKIE, HeaderValue::from_str(&format!("{COOKIE}={token}")).unwrap());
        for minute in 1..=5 {
            let now = minute * 59_000;
            assert!(s.find(&h, now, |_| true).is_some(), "used every 59 s: alive at {now} ms");
        }
        assert!(s.find(&h, 5 * 59_000 + 60_000, |_| true).is_none(), "60 s unused: gone");
        assert!(s.find(&h, 5 * 59_000 + 1_000, |_| true).is_none(), "and it stays gone");
    }

    #[test]
    fn sessions_expire_and_end() {
        let s = Sessions::default();
        let agent = Agent { id: "1".into(), name: "ops".into(), admin: true, created_at: 0, revoked_at: None };
        let forever = std::time::Duration::from_millis(SESSION_TTL as u64 * 2);
        let (token, session) = s.create(agent.clone(), 1_000, forever);
        let mut h = HeaderMap::new();
        let with = |h: &mut HeaderMap, token: &str| {
            h.insert(header::COOKIE, HeaderValue::from_str(&format!("{COOKIE}={token}")).unwrap());
        };
        with(&mut h, &token);
        let admitted = |_: &Agent| true;
        assert_eq!(s.find(&h, 2_000, admitted).map(|x| x.id), Some(session.id.clone()));
        assert!(session.csrf_ok(Some(&session.csrf)) && !session.csrf_ok(Some("x")) && !session.csrf_ok(None));
        assert!(s.find(&h, 3_000, |_| false).is_none(), "the agent is no longer an active admin");
        assert!(s.find(&h, 4_000, admitted).is_none(), "and the session is gone");
        let (token, _) = s.create(agent, 1_000, forever);
        with(&mut h, &token);
        assert!(s.find(&h, SESSION_TTL, admitted).is_some(), "used all along, it lasts its 12 hours");
        assert!(s.find(&h, 1_000 + SESSION_TTL, admitted).is_none(), "and not longer");
        let (token, _) = s.create(session.agent.clone(), 1_000, std::time::Duration::from_secs(60));
        h.insert(header::COOKIE, HeaderValue::from_str(&format!("{COOKIE}={token}")).unwrap());
        s.end_agent("ops");
        assert!(s.find(&h, 2_000, admitted).is_none());
    }
}
