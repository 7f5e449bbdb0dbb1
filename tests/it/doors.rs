//! rota's own doors, end to end against rota in-process on a real SQLite file: OAuth callbacks
//! bound to the browser that started the login (checked before the login is consumed),
//! `server.public_url` for the redirect URI and `Secure` cookies, profiles keyed by the OpenID
//! subject, the console session's idle timeout, the Content-Security-Policy of every page, and
//! `/metrics` behind a bearer token without emails in its labels.

use crate::support::{Mock, Reply, Rota, Scenario, code_for, spawn};
use reqwest::header::{CONTENT_SECURITY_POLICY, LOCATION, SET_COOKIE};
use serde_json::{Value, json};
use std::time::Duration;

/// rota with the OAuth provider `corp` in front of a fresh mock; `server` goes in `[server]`.
async fn start(server: &str) -> (Mock, String, Rota) {
    let (mock, base) = Mock::started().await;
    let config = format!("[server]\n{server}\n{}[secrets]\nkeyring = \"off\"\n", crate::support::oauth_provider(&base));
    let rota = spawn(Scenario { config: &config, ..Scenario::default() }).await;
    (mock, base, rota)
}

/// A client that does not follow redirects, as a test's "browser" that looks at each step.
pub(crate) fn browser() -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap()
}

/// The `name=value` of the `Set-Cookie` for `name`, and the whole header.
fn set_cookie(r: &reqwest::Response, name: &str) -> Option<(String, String)> {
    r.headers().get_all(SET_COOKIE).iter().filter_map(|v| v.to_str().ok()).find_map(|v| {
        v.starts_with(&format!("{name}=")).then(|| (v.split(';').next().unwrap().to_string(), v.to_string()))
    })
}

fn csp(r: &reqwest::Response) -> String {
    r.headers().get(CONTENT_SECURITY_POLICY).map(|v| v.to_str().unwrap().to_string()).unwrap_or_default()
}

/// Starts a login with the admin key (no console session): the answer's JSON.
async fn authorize(rota: &Rota) -> Value {
    let (status, answer) = rota.api("POST", "/api/v1/oauth/corp/authorize", Some(&rota.admin_key), None).await;
    assert_eq!(status, 200, "{answer}");
    answer
}

/// `GET /oauth/callback?code=…&state=…` with the login cookie `cookie` (`rota_login=…`), if any.
async fn callback(rota: &Rota, code: &str, state: &str, cookie: Option<&str>) -> reqwest::Response {
    let query: String = url::form_urlencoded::Serializer::new(String::new())
        .append_pair("code", code)
        .append_pair("state", state)
        .finish();
    let mut req = browser().get(format!("{}/oauth/callback?{query}", rota.url));
    if let Some(c) = cookie {
        req = req.header("cookie", c);
    }
    req.send().await.unwrap()
}

/// A whole login as a browser makes it: the API's `/oauth/go` link, then the provider's
/// callback with the cookie the link set. The callback's answer.
async fn login(rota: &Rota, code: &str) -> reqwest::Response {
    let answer = authorize(rota).await;
    let go = browser().get(answer["authorize_url"].as_str().unwrap()).send().await.unwrap();
    assert_eq!(go.status(), 303);
    let (cookie, _) = set_cookie(&go, "rota_login").expect("the go link sets the login cookie");
    callback(rota, code, answer["state"].as_str().unwrap(), Some(&cookie)).await
}

/// The corp profiles as `(id, email)`.
async fn corp_profiles(rota: &Rota) -> Vec<(String, Option<String>)> {
    let (status, v) = rota.api("GET", "/api/v1/profiles", Some(&rota.admin_key), None).await;
    assert_eq!(status, 200);
    let list = v.as_array().or_else(|| v["profiles"].as_array()).expect("a list of profiles").clone();
    list.iter()
        .filter(|p| p["id"].as_str().unwrap().starts_with("corp:"))
        .map(|p| (p["id"].as_str().unwrap().to_string(), p["email"].as_str().map(str::to_string)))
        .collect()
}

#[tokio::test]
async fn a_login_started_with_an_api_key_is_bound_to_the_browser_that_opens_its_link() {
    let (mock, base, rota) = start("").await;
    let answer = authorize(&rota).await;
    let state = answer["state"].as_str().unwrap();
    let open = answer["authorize_url"].as_str().unwrap();
    assert!(open.starts_with(&format!("{}/oauth/go?ticket=", rota.url)), "rota's own link: {open}");
    assert!(!open.contains(state), "the link is not the state");
    assert_eq!(answer["redirect_uri"], format!("{}/oauth/callback", rota.url));
    let code = code_for("u-alice", Some("alice@example.com"));

    // Before any browser opened the link, nobody's callback is taken.
    let early = callback(&rota, &code, state, None).await;
    assert_eq!(early.status(), 403);
    assert!(csp(&early).contains("default-src 'none'"), "the error page has its CSP");

    // The user's browser opens the link: bound, and on to the provider with the state.
    let go = browser().get(open).send().await.unwrap();
    assert_eq!(go.status(), 303);
    let to = go.headers()[LOCATION].to_str().unwrap().to_string();
    assert!(to.starts_with(&format!("{base}/oauth/authorize?")), "{to}");
    let to = url::Url::parse(&to).unwrap();
    assert_eq!(to.query_pairs().find(|(k, _)| k == "state").unwrap().1, state);
    let (cookie, header) = set_cookie(&go, "rota_login").expect("the login cookie");
    for attr in ["HttpOnly", "SameSite=Lax", "Path=/oauth/callback"] {
        assert!(header.contains(attr), "{header}");
    }
    assert!(!header.contains("Secure"), "plain http without public_url: {header}");
    assert!(csp(&go).contains("default-src 'none'"));
    let again = browser().get(open).send().await.unwrap();
    assert_eq!(again.status(), 400, "a link binds one browser only");
    assert!(set_cookie(&again, "rota_login").is_none());

    // Forged callbacks from other browsers (no cookie, another cookie): refused, and the login
    // is not consumed: no code exchange happened.
    for forged in [None, Some("rota_login=forged-nonce-of-another-browser")] {
        let r = callback(&rota, &code, state, forged).await;
        assert_eq!(r.status(), 403, "{forged:?}");
        assert!(r.text().await.unwrap().contains("another browser"));
    }
    assert_eq!(mock.token_calls(), 0, "no code exchange for a refused callback");

    // The real browser still finishes.
    let done = callback(&rota, &code, state, Some(&cookie)).await;
    assert_eq!(done.status(), 200);
    assert!(csp(&done).contains("default-src 'none'") && !csp(&done).contains("script-src"), "{}", csp(&done));
    assert!(done.text().await.unwrap().contains("Logged in"));
    assert_eq!(mock.token_calls(), 1);
    assert_eq!(corp_profiles(&rota).await, vec![("corp:alice@example.com".into(), Some("alice@example.com".into()))]);

    // And its state is spent.
    assert_eq!(callback(&rota, &code, state, Some(&cookie)).await.status(), 400);
    assert_eq!(mock.token_calls(), 1);
}

#[tokio::test]
async fn a_login_started_in_a_console_session_is_bound_to_that_browser() {
    let (mock, base, rota) = start("").await;
    let client = browser();
    let signed = client.post(format!("{}/api/v1/session", rota.url)).json(&json!({"key": rota.admin_key}));
    let signed = signed.send().await.unwrap();
    assert_eq!(signed.status(), 200);
    let (session, _) = set_cookie(&signed, "rota_session").unwrap();
    let csrf = signed.json::<Value>().await.unwrap()["csrf"].as_str().unwrap().to_string();
    let started = client
        .post(format!("{}/api/v1/oauth/corp/authorize", rota.url))
        .header("cookie", &session)
        .header("x-csrf-token", &csrf)
        .send()
        .await
        .unwrap();
    assert_eq!(started.status(), 200);
    let (login_cookie, _) = set_cookie(&started, "rota_login").expect("the session's browser gets the login cookie");
    let answer: Value = started.json().await.unwrap();
    assert!(answer["authorize_url"].as_str().unwrap().starts_with(&format!("{base}/oauth/authorize?")));
    let state = answer["state"].as_str().unwrap();
    let code = code_for("u-bob", Some("bob@example.com"));
    assert_eq!(callback(&rota, &code, state, Some("rota_login=someone-else")).await.status(), 403);
    assert_eq!(callback(&rota, &code, state, None).await.status(), 403);
    assert_eq!(mock.token_calls(), 0);
    assert_eq!(callback(&rota, &code, state, Some(&login_cookie)).await.status(), 200);
    assert_eq!(corp_profiles(&rota).await, vec![("corp:bob@example.com".into(), Some("bob@example.com".into()))]);
}

#[tokio::test]
async fn public_url_makes_the_redirect_uri_whatever_the_host_header_and_the_cookies_secure() {
    let (_, _, rota) = start("public_url = \"https://rota.example.com/\"").await;
    let r = Rota::client()
        .post(format!("{}/api/v1/oauth/corp/authorize", rota.url))
        .bearer_auth(&rota.admin_key)
        .header("host", "evil.example.net")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let answer: Value = r.json().await.unwrap();
    assert_eq!(answer["redirect_uri"], "https://rota.example.com/oauth/callback");
    let open = answer["authorize_url"].as_str().unwrap();
    assert!(open.starts_with("https://rota.example.com/oauth/go?ticket="), "{open}");
    // The link itself, as the proxy in front of rota would pass it on.
    let local = open.replace("https://rota.example.com", &rota.url);
    let go = browser().get(&local).header("host", "evil.example.net").send().await.unwrap();
    assert_eq!(go.status(), 303);
    let to = url::Url::parse(go.headers()[LOCATION].to_str().unwrap()).unwrap();
    let redirect = to.query_pairs().find(|(k, _)| k == "redirect_uri").unwrap().1.to_string();
    assert_eq!(redirect, "https://rota.example.com/oauth/callback");
    let (_, header) = set_cookie(&go, "rota_login").unwrap();
    assert!(header.ends_with("; Secure"), "{header}");

    let signed = browser().post(format!("{}/api/v1/session", rota.url)).json(&json!({"key": rota.admin_key}));
    let signed = signed.send().await.unwrap();
    let (_, header) = set_cookie(&signed, "rota_session").unwrap();
    assert!(header.contains("; Secure") && header.contains("HttpOnly") && header.contains("SameSite=Strict"));
}

#[tokio::test]
async fn an_invalid_public_url_is_refused_at_load_with_the_key_named() {
    for bad in
        ["rota.example.com", "ftp://rota.example.com", "https://rota.example.com/console", "https://u:p@h.example"]
    {
        let err = rota::config::Config::from_toml(&format!("[server]\npublic_url = \"{bad}\"\n")).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("public_url") && text.contains(bad), "{bad}: {text}");
    }
    let ok = rota::config::Config::from_toml("[server]\npublic_url = \"https://rota.example.com:8443/\"\n").unwrap();
    assert_eq!(ok.server.public_url.as_deref(), Some("https://rota.example.com:8443"));
}

#[tokio::test]
async fn profiles_are_keyed_by_the_openid_subject_not_the_email() {
    let (mock, base, rota) = start("").await;
    assert_eq!(login(&rota, &code_for("u-1", Some("alice@example.com"))).await.status(), 200);
    // The same account, its email changed: the same profile, its email updated.
    assert_eq!(login(&rota, &code_for("u-1", Some("alice@new.example.com"))).await.status(), 200);
    assert_eq!(
        corp_profiles(&rota).await,
        vec![("corp:alice@example.com".into(), Some("alice@new.example.com".into()))]
    );
    let subject: String = sqlx::query_scalar("SELECT oauth_subject FROM profiles WHERE id = 'corp:alice@example.com'")
        .fetch_one(rota.pool())
        .await
        .unwrap();
    assert_eq!(subject, "https://idp.test u-1");

    // Another account claiming the email the first profile is named after: refused, and the
    // first account's tokens are untouched (its second login's, at-new-0002, still serve).
    let other = login(&rota, &code_for("u-2", Some("alice@example.com"))).await;
    assert_eq!(other.status(), 409);
    assert!(other.text().await.unwrap().contains("another account"));
    assert_eq!(mock.token_calls(), 3);
    assert_eq!(corp_profiles(&rota).await.len(), 1);
    let served = rota.chat(json!({"model": "corp/m", "messages": [{"role": "user", "content": "hi"}]}), &[]).await;
    assert_eq!(served.status(), 200);
    assert_eq!(mock.keys(), vec!["at-new-0002".to_string()], "the first account's token, not the other's");

    // The other account under its own email is a profile of its own.
    assert_eq!(login(&rota, &code_for("u-2", Some("mallory@example.com"))).await.status(), 200);
    let mut ids: Vec<String> = corp_profiles(&rota).await.into_iter().map(|(id, _)| id).collect();
    ids.sort();
    assert_eq!(ids, ["corp:alice@example.com", "corp:mallory@example.com"]);

    // A profile logged in before subjects were kept takes the subject of its next login.
    drop(base);
    sqlx::query("UPDATE profiles SET oauth_subject = NULL WHERE id = 'corp:mallory@example.com'")
        .execute(rota.pool())
        .await
        .unwrap();
    assert_eq!(login(&rota, &code_for("u-3", Some("mallory@example.com"))).await.status(), 200);
    assert_eq!(login(&rota, &code_for("u-2", Some("mallory@example.com"))).await.status(), 409, "now u-3's");
}

#[tokio::test]
async fn an_idle_console_session_ends_and_each_use_extends_it() {
    let (_, _, rota) = start("session_idle = \"2s\"").await;
    let client = browser();
    let signed = client.post(format!("{}/api/v1/session", rota.url)).json(&json!({"key": rota.admin_key}));
    let (cookie, _) = set_cookie(&signed.send().await.unwrap(), "rota_session").unwrap();
    let current = || async {
        let r = client.get(format!("{}/api/v1/session", rota.url)).header("cookie", &cookie).send().await.unwrap();
        r.status().as_u16()
    };
    for _ in 0..4 {
        tokio::time::sleep(Duration::from_millis(1_000)).await;
        assert_eq!(current().await, 200, "used every second, a 2 s idle timeout does not end it");
    }
    tokio::time::sleep(Duration::from_millis(2_300)).await;
    assert_eq!(current().await, 401, "2 s unused: signed out");
    let profiles = client.get(format!("{}/api/v1/profiles", rota.url)).header("cookie", &cookie).send().await.unwrap();
    assert_eq!(profiles.status(), 401);

    // The console's background refresh is answered but is not a use: an unattended console
    // still signs out.
    let signed = client.post(format!("{}/api/v1/session", rota.url)).json(&json!({"key": rota.admin_key}));
    let (cookie, _) = set_cookie(&signed.send().await.unwrap(), "rota_session").unwrap();
    let poll = || async {
        let r = client.get(format!("{}/api/v1/profiles", rota.url)).header("cookie", &cookie);
        r.header("x-rota-background", "1").send().await.unwrap().status().as_u16()
    };
    let t0 = std::time::Instant::now();
    for at in [800, 1_500] {
        tokio::time::sleep(Duration::from_millis(at).saturating_sub(t0.elapsed())).await;
        assert_eq!(poll().await, 200, "within 2 s of signing in");
    }
    tokio::time::sleep(Duration::from_millis(2_400).saturating_sub(t0.elapsed())).await;
    assert_eq!(poll().await, 401, "background refreshes did not keep it alive");
}

#[tokio::test]
async fn every_page_carries_a_content_security_policy_without_inline_script() {
    let (_, _, rota) = start("").await;
    let client = browser();
    let sign_in = client.get(format!("{}/ui/", rota.url)).send().await.unwrap();
    let signed = client.post(format!("{}/api/v1/session", rota.url)).json(&json!({"key": rota.admin_key}));
    let (cookie, _) = set_cookie(&signed.send().await.unwrap(), "rota_session").unwrap();
    let console = client.get(format!("{}/ui/", rota.url)).header("cookie", &cookie).send().await.unwrap();
    for (page, r) in [("sign-in", sign_in), ("console", console)] {
        let policy = csp(&r);
        for part in [
            "default-src 'none'",
            "script-src 'self'",
            "style-src 'self'",
            "connect-src 'self'",
            "frame-ancestors 'none'",
        ] {
            assert!(policy.contains(part), "{page}: {policy}");
        }
        assert!(!policy.contains("unsafe"), "{page}: {policy}");
        let html = r.text().await.unwrap();
        assert!(html.contains("<script src="), "{page} has its script file");
        assert_eq!(html.matches("<script").count(), html.matches("<script src=").count(), "{page}: no inline script");
        assert!(!html.contains(" style="), "{page}: no inline style");
    }
    for path in [
        "/",
        "/ui",
        "/ui/app.js",
        "/ui/js/core.js",
        "/ui/vendor/uPlot.iife.min.js",
        "/ui/style.css",
        "/oauth/callback",
        "/oauth/go?ticket=x",
    ] {
        let r = client.get(format!("{}{path}", rota.url)).send().await.unwrap();
        assert!(csp(&r).starts_with("default-src 'none'"), "{path}: {}", csp(&r));
    }
}

#[tokio::test]
async fn metrics_ask_for_the_bearer_token_and_never_show_an_email() {
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("metrics.token");
    std::fs::write(&token_file, "scrape-token-0123456789\n").unwrap();
    let (mock, _, rota) = start(&format!("metrics_token_file = \"{}\"", token_file.display())).await;
    assert_eq!(login(&rota, &code_for("u-1", Some("alice@example.com"))).await.status(), 200);
    // A cooling OAuth profile (a 429 on its token): its cooldown gauge names it.
    let limited =
        Reply::Status(429, vec![("retry-after", "600".into())], r#"{"error":{"message":"slow down"}}"#.into());
    mock.script("at-new-0001", vec![limited]);
    let chat = json!({"model": "corp/m", "messages": [{"role": "user", "content": "hi"}]});
    assert!(rota.chat(chat, &[]).await.status().is_client_error());
    let scrape = |token: Option<&'static str>| {
        let mut req = Rota::client().get(format!("{}/metrics", rota.url));
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        async move { req.send().await.unwrap() }
    };
    let bare = scrape(None).await;
    assert_eq!(bare.status(), 401);
    assert!(bare.headers().contains_key("www-authenticate"));
    assert_eq!(scrape(Some("wrong-token")).await.status(), 401);
    let ok = scrape(Some("scrape-token-0123456789")).await;
    assert_eq!(ok.status(), 200);
    let text = ok.text().await.unwrap();
    assert!(text.contains("rota_profiles"), "{text}");
    let label = rota::metrics::profile_label(&"corp:alice@example.com".parse().unwrap());
    assert!(text.contains(&format!("rota_profile_cooldown_seconds{{profile=\"{label}\"}}")), "{text}");
    assert!(!text.contains('@'), "no email in any label:\n{text}");
    // The token file is read at each scrape: a new token works at once, the old one no longer.
    std::fs::write(&token_file, "scrape-token-rotated\n").unwrap();
    assert_eq!(scrape(Some("scrape-token-0123456789")).await.status(), 401);
    assert_eq!(scrape(Some("scrape-token-rotated")).await.status(), 200);
}

/// Without a token file, `/metrics` answers a client on this machine that names a loopback
/// host, and nothing else: a page whose name was rebound to 127.0.0.1 sends its own `Host`, and
/// a reverse proxy on this machine (nginx's default `Host` is its upstream's, 127.0.0.1:PORT)
/// says whom it forwards for.
#[tokio::test]
async fn metrics_without_a_token_answer_only_over_loopback() {
    let (_mock, _, rota) = start("").await;
    let port = rota.url.rsplit(':').next().unwrap().to_string();
    let scrape = |host: String| {
        let req = Rota::client().get(format!("{}/metrics", rota.url)).header("host", host);
        async move { req.send().await.unwrap().status().as_u16() }
    };
    assert_eq!(scrape(format!("127.0.0.1:{port}")).await, 200);
    assert_eq!(scrape(format!("localhost:{port}")).await, 200);
    assert_eq!(scrape(format!("[::1]:{port}")).await, 200);
    assert_eq!(scrape(format!("attacker.example:{port}")).await, 401, "a rebound name");
    assert_eq!(scrape("rota.internal.example".into()).await, 401);
    for header in ["x-forwarded-for", "x-real-ip", "forwarded"] {
        let req = Rota::client()
            .get(format!("{}/metrics", rota.url))
            .header("host", format!("127.0.0.1:{port}"))
            .header(header, "for=203.0.113.7");
        assert_eq!(req.send().await.unwrap().status().as_u16(), 401, "through a proxy ({header})");
    }
}

#[test]
fn a_profile_label_names_no_email() {
    let id: rota::engine::ProfileId = "corp:alice@example.com".parse().unwrap();
    let label = rota::metrics::profile_label(&id);
    use sha2::Digest as _;
    let hex: String = sha2::Sha256::digest(b"corp:alice@example.com")[..6].iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(label, format!("corp:sha256-{hex}"));
    let plain: rota::engine::ProfileId = "openai:work".parse().unwrap();
    assert_eq!(rota::metrics::profile_label(&plain), "openai:work");
}

#[tokio::test]
async fn every_file_rota_writes_is_readable_by_its_owner_only() {
    use std::os::unix::fs::PermissionsExt;
    let (_, _, rota) = start("").await;
    assert_eq!(login(&rota, &code_for("u-1", Some("alice@example.com"))).await.status(), 200);
    rota.flush().await;
    let mode = |name: &str| {
        let path = rota.dir.path().join(name);
        std::fs::metadata(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display())).permissions().mode() & 0o777
    };
    for name in ["rota.db", "rota.db-wal", "rota.db-shm", "rota.key"] {
        assert_eq!(mode(name), 0o600, "{name}");
    }
    // A key file made more open by hand is made 0600 again at the next start.
    let key = rota.dir.path().join("rota.key");
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
    let again = rota.another().await;
    assert_eq!(mode("rota.key"), 0o600);
    drop(again);
}
