//! People signing in to the console (`[console.sso]`, docs/operations.md "Signing in") against a
//! hand-made OpenID provider whose id_tokens and userinfo answers each test writes: only a
//! verified identity gets a role, the role follows the config in force at every request, sign-in
//! starts are bounded, and sign-ins and sign-outs are recorded.

use crate::doors::browser as no_redirects;
use crate::support::{self, Mock, Rota, Scenario, spawn};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use parking_lot::Mutex;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

/// Per authorization code: the id_token's claims and the userinfo answer.
type Grants = HashMap<String, (Value, Option<Value>)>;

/// An OpenID provider: discovery, a token endpoint that answers each code with the claims the
/// test gave it (`grant`), and userinfo per access token.
#[derive(Clone, Default)]
pub(crate) struct Idp {
    url: Arc<Mutex<String>>,
    grants: Arc<Mutex<Grants>>,
    /// Overrides of the discovery document's endpoints.
    token_endpoint: Arc<Mutex<Option<String>>>,
}

impl Idp {
    pub(crate) async fn started() -> Idp {
        let idp = Idp::default();
        let app = axum::Router::new()
            .route("/.well-known/openid-configuration", axum::routing::get(discovery))
            .route("/token", axum::routing::post(token))
            .route("/userinfo", axum::routing::get(userinfo))
            .with_state(idp.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        *idp.url.lock() = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        idp
    }

    pub(crate) fn url(&self) -> String {
        self.url.lock().clone()
    }
}

async fn discovery(State(idp): State<Idp>) -> axum::Json<Value> {
    let url = idp.url();
    let token = idp.token_endpoint.lock().clone().unwrap_or(format!("{url}/token"));
    axum::Json(json!({
        "issuer": url, "authorization_endpoint": format!("{url}/authorize"),
        "token_endpoint": token, "userinfo_endpoint": format!("{url}/userinfo"),
    }))
}

async fn token(State(idp): State<Idp>, body: String) -> Response {
    use base64::Engine as _;
    let form: HashMap<String, String> = url::form_urlencoded::parse(body.as_bytes()).into_owned().collect();
    let code = form.get("code").cloned().unwrap_or_default();
    let Some((claims, _)) = idp.grants.lock().get(&code).cloned() else {
        return (StatusCode::BAD_REQUEST, axum::Json(json!({"error": "invalid_grant"}))).into_response();
    };
    let enc = |b: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b);
    let id_token = format!("{}.{}.sig", enc(br#"{"alg":"RS256"}"#), enc(claims.to_string().as_bytes()));
    axum::Json(
        json!({"access_token": format!("at-{code}"), "token_type": "Bearer", "expires_in": 3600, "id_token": id_token}),
    )
    .into_response()
}

async fn userinfo(State(idp): State<Idp>, headers: HeaderMap) -> Response {
    let bearer = headers.get("authorization").and_then(|v| v.to_str().ok()).unwrap_or_default();
    let code = bearer.trim_start_matches("Bearer at-");
    match idp.grants.lock().get(code).and_then(|(_, info)| info.clone()) {
        Some(info) => axum::Json(info).into_response(),
        None => StatusCode::UNAUTHORIZED.into_response(),
    }
}

fn sso(idp: &str, roles: &str) -> String {
    format!(
        "[console.sso]\nissuer = \"{idp}\"\nclient_id = \"rota\"\nscopes = [\"openid\", \"email\"]\n\
         own_domains = [\"corp.example\"]\n[console.sso.roles]\n{roles}"
    )
}

const ROLES: &str = "admin = [\"alice@example.com\", \"*@corp.example\"]\nviewer = [\"vera@example.com\"]\n";

async fn start(roles: &str) -> (Idp, Rota, String) {
    let (_mock, base) = Mock::started().await;
    let idp = Idp::started().await;
    let config = format!("{}{}", support::config(&base), sso(&idp.url(), roles));
    let rota = spawn(Scenario { config: &config, ..Scenario::default() }).await;
    (idp, rota, config)
}

/// `name=value` of the `Set-Cookie` header naming `name`.
fn cookie(r: &reqwest::Response, name: &str) -> Option<String> {
    r.headers()
        .get_all("set-cookie")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find(|v| v.starts_with(&format!("{name}=")) && !v.starts_with(&format!("{name}=;")))
        .map(|v| v.split(';').next().unwrap().to_string())
}

/// A sign-in started at `/ui/sso`: its `state`, `nonce` and the browser's login cookie.
async fn begin(rota: &Rota) -> (String, String, String) {
    let r = no_redirects().get(format!("{}/ui/sso", rota.url)).send().await.unwrap();
    assert_eq!(r.status(), 303, "{:?}", r.text().await);
    let to = url::Url::parse(r.headers()["location"].to_str().unwrap()).unwrap();
    let q: HashMap<String, String> = to.query_pairs().into_owned().collect();
    (q["state"].clone(), q["nonce"].clone(), cookie(&r, "rota_login").expect("the login cookie"))
}

/// Signs in a person whose id_token carries `claims` (with the right issuer, audience, nonce and
/// expiry added) and whose userinfo answers `info`: the callback's status and the session cookie.
async fn sign_in(rota: &Rota, idp: &Idp, claims: Value, info: Option<Value>) -> (u16, Option<String>, String) {
    let (state, nonce, login) = begin(rota).await;
    let mut claims = claims;
    let exp = chrono::Utc::now().timestamp() + 600;
    for (k, v) in [("iss", json!(idp.url())), ("aud", json!("rota")), ("nonce", json!(nonce)), ("exp", json!(exp))] {
        claims[k] = v;
    }
    let code = format!("code-{state}");
    idp.grants.lock().insert(code.clone(), (claims, info));
    let r = no_redirects()
        .get(format!("{}/oauth/callback?code={code}&state={state}", rota.url))
        .header("cookie", login)
        .send()
        .await
        .unwrap();
    let session = cookie(&r, "rota_session");
    (r.status().as_u16(), session, r.text().await.unwrap())
}

async fn session_of(rota: &Rota, cookie: &str) -> (u16, Value) {
    let r = no_redirects().get(format!("{}/api/v1/session", rota.url)).header("cookie", cookie).send().await.unwrap();
    (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
}

#[tokio::test]
async fn only_a_verified_identity_signs_in_with_a_role() {
    let (idp, rota, _) = start(ROLES).await;
    let refused = [
        ("an unverified email", json!({"sub": "a1", "email": "alice@example.com", "email_verified": false}), None),
        ("the string \"false\"", json!({"sub": "a2", "email": "alice@example.com", "email_verified": "false"}), None),
        ("the string \"true\"", json!({"sub": "a3", "email": "alice@example.com", "email_verified": "true"}), None),
        ("no flag at all", json!({"sub": "a4", "email": "alice@example.com"}), None),
        ("a user name only", json!({"sub": "a5", "preferred_username": "alice@example.com"}), None),
        (
            "userinfo's unverified email",
            json!({"sub": "a6"}),
            Some(json!({"sub": "a6", "email": "alice@example.com", "email_verified": false})),
        ),
        (
            "userinfo's \"false\"",
            json!({"sub": "a7"}),
            Some(json!({"sub": "a7", "email": "alice@example.com", "email_verified": "false"})),
        ),
        (
            "another subject's userinfo",
            json!({"sub": "a8"}),
            Some(json!({"sub": "victim", "email": "alice@example.com", "email_verified": true})),
        ),
    ];
    for (case, claims, info) in refused {
        let (status, session, page) = sign_in(&rota, &idp, claims, info).await;
        assert_eq!(status, 403, "{case}: {page}");
        assert!(session.is_none(), "{case}: no session");
        assert!(page.contains("gives them no role"), "{case}: {page}");
    }

    let verified = json!({"sub": "alice-1", "email": "alice@example.com", "email_verified": true});
    let (status, session, page) = sign_in(&rota, &idp, verified, None).await;
    assert_eq!(status, 200, "{page}");
    let alice = session.unwrap();
    let (_, me) = session_of(&rota, &alice).await;
    assert_eq!((me["agent"].as_str(), me["role"].as_str()), (Some("alice@example.com"), Some("admin")));
    let out = no_redirects()
        .delete(format!("{}/api/v1/session", rota.url))
        .header("cookie", &alice)
        .header("x-csrf-token", me["csrf"].as_str().unwrap())
        .send()
        .await
        .unwrap();
    assert_eq!(out.status(), 204);

    // Verified through userinfo, and through the provider's own domain without a flag.
    let info = json!({"sub": "vera-1", "email": "vera@example.com", "email_verified": true});
    let (status, session, _) = sign_in(&rota, &idp, json!({"sub": "vera-1"}), Some(info)).await;
    assert_eq!(status, 200);
    assert_eq!(session_of(&rota, &session.unwrap()).await.1["role"], "viewer");
    let (status, session, _) = sign_in(&rota, &idp, json!({"sub": "bob-1", "email": "bob@corp.example"}), None).await;
    assert_eq!(status, 200);
    assert_eq!(session_of(&rota, &session.unwrap()).await.1["role"], "admin");

    // The actor recorded is the verified subject, the verified email beside it.
    let (_, actions) = rota.api("GET", "/api/v1/admin-actions", Some(&rota.admin_key), None).await;
    let signed_out: Vec<&Value> =
        actions.as_array().unwrap().iter().filter(|a| a["action"] == "session.sign_out").collect();
    assert_eq!(signed_out.len(), 1);
    assert_eq!(signed_out[0]["actor_email"], "alice@example.com");
    let signed: Vec<(String, String, Option<String>)> = actions
        .as_array()
        .unwrap()
        .iter()
        .filter(|a| a["action"] == "session.sign_in")
        .map(|a| {
            let s = |k: &str| a[k].as_str().map(str::to_string);
            (s("actor").unwrap(), s("actor_kind").unwrap(), s("actor_email"))
        })
        .collect();
    let subject = |s: &str| format!("{} {s}", idp.url());
    let person = |s: &str, e: &str| (subject(s), "person".to_string(), Some(e.to_string()));
    assert_eq!(
        signed,
        vec![
            person("bob-1", "bob@corp.example"),
            person("vera-1", "vera@example.com"),
            person("alice-1", "alice@example.com")
        ]
    );
}

#[tokio::test]
async fn a_persons_role_follows_the_config_at_their_next_request() {
    let (idp, rota, config) = start(ROLES).await;
    let claims = json!({"sub": "alice-1", "email": "alice@example.com", "email_verified": true});
    let (_, session, _) = sign_in(&rota, &idp, claims, None).await;
    let cookie = session.unwrap();
    assert_eq!(session_of(&rota, &cookie).await.1["role"], "admin");

    let file = rota.dir.path().join("rota.toml");
    let text = std::fs::read_to_string(&file).unwrap();
    let write = |roles: &str| {
        let now = text.replace(ROLES, roles);
        assert_ne!(now, text);
        std::fs::write(&file, now).unwrap();
    };
    let role_after_reload = |want: &'static str| {
        let rota = &rota;
        let cookie = cookie.clone();
        async move {
            for _ in 0..100 {
                let (status, me) = session_of(rota, &cookie).await;
                let got =
                    if status == 401 { "signed out".to_string() } else { me["role"].as_str().unwrap().to_string() };
                if got == want {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            panic!("the session never became {want}");
        }
    };
    // Demoted: the next request has the lower role, and an admin's change is refused.
    write("viewer = [\"alice@example.com\"]\n");
    role_after_reload("viewer").await;
    let r = no_redirects()
        .post(format!("{}/api/v1/agents", rota.url))
        .header("cookie", &cookie)
        .header("x-csrf-token", session_of(&rota, &cookie).await.1["csrf"].as_str().unwrap())
        .json(&json!({"name": "minted", "admin": true}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403, "a viewer mints no key");
    // Removed: signed out at once.
    write("viewer = [\"vera@example.com\"]\n");
    role_after_reload("signed out").await;
    let r = no_redirects().get(format!("{}/api/v1/profiles", rota.url)).header("cookie", &cookie).send().await.unwrap();
    assert_eq!(r.status(), 401);
    drop(config);
}

#[tokio::test]
async fn a_state_seen_by_another_browser_cancels_nothing() {
    let (idp, rota, _) = start(ROLES).await;
    let (state, nonce, login) = begin(&rota).await;
    let exp = chrono::Utc::now().timestamp() + 600;
    let claims = json!({"iss": idp.url(), "aud": "rota", "nonce": nonce, "exp": exp,
        "sub": "alice-1", "email": "alice@example.com", "email_verified": true});
    idp.grants.lock().insert("c1".into(), (claims, None));
    let callback = format!("{}/oauth/callback?code=c1&state={state}", rota.url);
    let stranger = no_redirects().get(&callback).header("cookie", "rota_login=stolen").send().await.unwrap();
    assert_eq!(stranger.status(), 403);
    let owner = no_redirects().get(&callback).header("cookie", login).send().await.unwrap();
    assert_eq!(owner.status(), 200, "the browser that started it still signs in");
    assert!(cookie(&owner, "rota_session").is_some());
}

#[tokio::test]
async fn sign_in_starts_are_bounded_per_address() {
    let (_idp, rota, _) = start(ROLES).await;
    let client = no_redirects();
    let mut statuses = HashMap::<u16, usize>::new();
    for _ in 0..rota::api::sso::STARTS_PER_MINUTE + 30 {
        let r = client.get(format!("{}/ui/sso", rota.url)).send().await.unwrap();
        *statuses.entry(r.status().as_u16()).or_default() += 1;
    }
    // A minute boundary may fall inside the loop: then a second minute's share starts.
    let allowed = statuses.get(&303).copied().unwrap_or_default();
    assert!(
        (rota::api::sso::STARTS_PER_MINUTE as usize..=2 * rota::api::sso::STARTS_PER_MINUTE as usize)
            .contains(&allowed),
        "{statuses:?}"
    );
    assert!(statuses.get(&429).copied().unwrap_or_default() >= 10, "{statuses:?}");
}

#[tokio::test]
async fn discovery_endpoints_off_the_issuers_host_are_refused() {
    let (idp, rota, _) = start(ROLES).await;
    *idp.token_endpoint.lock() = Some("http://127.0.0.2:9/token".into());
    let r = no_redirects().get(format!("{}/ui/sso", rota.url)).send().await.unwrap();
    assert_eq!(r.status(), 502);
    assert!(r.text().await.unwrap().contains("not on the issuer's host"));
}
