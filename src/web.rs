//! What rota shows a browser (docs/api.md): the console's pages and assets (from `web/`, embedded
//! in the binary), the session and login cookies (HttpOnly, SameSite=Strict, Secure behind an
//! https `server.public_url`), the OAuth callback's pages, and the Content-Security-Policy
//! every one of them carries. The sessions and the OAuth routes are the API's.

use crate::engine::Millis;
use axum::Router;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::get;
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use chacha20poly1305::aead::{OsRng, rand_core::RngCore};

pub const COOKIE: &str = "rota_session";
/// The header of the console's background refreshes: they do not extend the session.
pub const BACKGROUND: &str = "x-rota-background";
/// A session lasts this long from sign-in (its cookie too).
pub const SESSION_TTL: Millis = 12 * 3_600_000;

const CONSOLE_HTML: &str = include_str!("../web/console.html");
const SIGN_IN_HTML: &str = include_str!("../web/sign-in.html");

const JS: &str = "text/javascript";
const CSS: &str = "text/css";
/// The console's scripts and stylesheets under `/ui/`: its own, and uPlot (MIT, vendored from
/// npm `uplot` 1.6.32, web/vendor/uPlot.LICENSE) for the overview's charts.
const ASSETS: [(&str, &str, &str); 13] = [
    ("app.js", JS, include_str!("../web/app.js")),
    ("sign-in.js", JS, include_str!("../web/sign-in.js")),
    ("style.css", CSS, include_str!("../web/style.css")),
    ("js/core.js", JS, include_str!("../web/js/core.js")),
    ("js/overview.js", JS, include_str!("../web/js/overview.js")),
    ("js/profiles.js", JS, include_str!("../web/js/profiles.js")),
    ("js/requests.js", JS, include_str!("../web/js/requests.js")),
    ("js/chains.js", JS, include_str!("../web/js/chains.js")),
    ("js/agents.js", JS, include_str!("../web/js/agents.js")),
    ("js/changes.js", JS, include_str!("../web/js/changes.js")),
    ("js/alerts.js", JS, include_str!("../web/js/alerts.js")),
    ("vendor/uPlot.iife.min.js", JS, include_str!("../web/vendor/uPlot.iife.min.js")),
    ("vendor/uPlot.min.css", CSS, include_str!("../web/vendor/uPlot.min.css")),
];

/// The console's assets and redirects; the console page itself (`/ui/`) is the API's, which
/// knows the session.
pub fn router() -> Router {
    let mut router = Router::new()
        .route("/", get(|| async { Redirect::to("/ui/") }))
        .route("/ui", get(|| async { Redirect::to("/ui/") }));
    for (name, content_type, body) in ASSETS {
        router = router.route(&format!("/ui/{name}"), get(move || asset(content_type, body)));
    }
    router.layer(axum::middleware::map_response(default_csp))
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
pub async fn default_csp(mut r: Response) -> Response {
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

/// The console (with a session) or the sign-in page, with the identity provider's button when
/// `[console.sso]` is set (`sso`: its label).
pub fn console_page(signed_in: bool, sso: Option<&str>) -> Response {
    match (signed_in, sso) {
        (true, _) => page(CONSOLE_HTML),
        (false, None) => page(SIGN_IN_HTML),
        (false, Some(label)) => {
            let label = label.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;");
            let button = format!(r#"<a id="sso" class="button primary" href="/ui/sso">{label}</a>"#);
            let start = SIGN_IN_HTML.find("<!--sso-->").expect("the sign-in page has the SSO slot");
            let end = SIGN_IN_HTML.find("<!--/sso-->").expect("the sign-in page has the SSO slot");
            let html = format!("{}{button}{}", &SIGN_IN_HTML[..start], &SIGN_IN_HTML[end + "<!--/sso-->".len()..]);
            let mut resp = Html(html).into_response();
            harden(&mut resp, CONSOLE_CSP);
            resp
        }
    }
}

/// 32 random bytes, URL-safe.
pub fn random_token() -> String {
    let mut bytes = [0u8; 32];
    OsRng.fill_bytes(&mut bytes);
    URL_SAFE_NO_PAD.encode(bytes)
}

pub fn digest(token: &str) -> String {
    crate::agents::digest_of(token)
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
}
