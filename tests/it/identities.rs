//! Service identities (docs/providers.md): a `client_credentials` profile is an OAuth client
//! that rota exchanges for access tokens itself, here at a fake of Microsoft Entra ID's v2 token
//! endpoint that enforces the grant as Microsoft documents it.

use crate::support::*;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use parking_lot::Mutex;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

const TENANT: &str = "contoso.onmicrosoft.com";
const CLIENT_ID: &str = "6f1e2d3c-4b5a-4978-8a6b-5c4d3e2f1a0b";
const CLIENT_SECRET: &str = "Qx8Q~entra-client-secret-value-0001";
const SCOPE: &str = "https://cognitiveservices.azure.com/.default";

#[derive(Default)]
struct EntraState {
    /// The forms of every call, in order.
    forms: Vec<HashMap<String, String>>,
    issued: Vec<String>,
    lifetime: u64,
    delay: Duration,
}

/// `POST /{tenant}/oauth2/v2.0/token` for the client credentials grant, as Microsoft's identity
/// platform answers it: a form body with `grant_type=client_credentials`, `client_id`,
/// `client_secret` and one `…/.default` scope; `invalid_client` (AADSTS7000215, 401) for a wrong
/// secret, `unauthorized_client` (AADSTS700016, 400) for an unknown application, `invalid_scope`
/// (AADSTS1002012, 400) for another scope; tokens without a refresh token.
#[derive(Clone, Default)]
struct Entra(Arc<Mutex<EntraState>>);

impl Entra {
    async fn started(lifetime: u64, delay: Duration) -> (Entra, String) {
        let entra = Entra::default();
        {
            let mut st = entra.0.lock();
            (st.lifetime, st.delay) = (lifetime, delay);
        }
        let app = axum::Router::new()
            .route("/{tenant}/oauth2/v2.0/token", axum::routing::post(entra_token))
            .with_state(entra.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        (entra, url)
    }

    fn exchanges(&self) -> usize {
        self.0.lock().issued.len()
    }
}

fn aadsts(status: StatusCode, error: &str, code: u32, text: &str) -> Response {
    let body = json!({
        "error": error,
        "error_description": format!("AADSTS{code}: {text} Trace ID: 0f1e2d3c-0000-4000-8000-000000000001 Correlation ID: 0f1e2d3c-0000-4000-8000-000000000002 Timestamp: 2026-12-03 17:00:00Z"),
        "error_codes": [code],
        "timestamp": "2026-12-03 17:00:00Z",
        "trace_id": "0f1e2d3c-0000-4000-8000-000000000001",
        "correlation_id": "0f1e2d3c-0000-4000-8000-000000000002",
        "error_uri": format!("https://login.microsoftonline.com/error?code={code}"),
    });
    (status, axum::Json(body)).into_response()
}

async fn entra_token(
    axum::extract::State(entra): axum::extract::State<Entra>,
    axum::extract::Path(tenant): axum::extract::Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let form: HashMap<String, String> = url::form_urlencoded::parse(&body).into_owned().collect();
    let (lifetime, delay) = {
        let mut st = entra.0.lock();
        st.forms.push(form.clone());
        (st.lifetime, st.delay)
    };
    tokio::time::sleep(delay).await;
    let form_encoded = headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/x-www-form-urlencoded"));
    if tenant != TENANT || !form_encoded || form.get("grant_type").map(String::as_str) != Some("client_credentials") {
        return aadsts(
            StatusCode::BAD_REQUEST,
            "invalid_request",
            900144,
            "The request body must contain the following parameter: 'grant_type'.",
        );
    }
    if form.get("client_id").map(String::as_str) != Some(CLIENT_ID) {
        return aadsts(
            StatusCode::BAD_REQUEST,
            "unauthorized_client",
            700016,
            "Application with identifier was not found in the directory.",
        );
    }
    if form.get("client_secret").map(String::as_str) != Some(CLIENT_SECRET) {
        return aadsts(
            StatusCode::UNAUTHORIZED,
            "invalid_client",
            7000215,
            "Invalid client secret provided. Ensure the secret being sent in the request is the client secret value, not the client secret ID.",
        );
    }
    if form.get("scope").map(String::as_str) != Some(SCOPE) {
        return aadsts(
            StatusCode::BAD_REQUEST,
            "invalid_scope",
            1002012,
            "The provided value for scope is not valid. Client credential flows must have a scope value with /.default suffixed to the resource identifier.",
        );
    }
    let token = {
        let mut st = entra.0.lock();
        let token = format!("eyJ0eXAiOiJKV1Qi.entra-access-{:04}.sig", st.issued.len() + 1);
        st.issued.push(token.clone());
        token
    };
    axum::Json(
        json!({"token_type": "Bearer", "expires_in": lifetime, "ext_expires_in": lifetime, "access_token": token}),
    )
    .into_response()
}

/// An Azure OpenAI provider (the preset) at the mock, its client credentials at the fake Entra.
fn azure(base: &str, entra: &str) -> String {
    format!(
        "[providers.azure]\npreset = \"azure-openai\"\nresource = \"contoso\"\ntenant = \"{TENANT}\"\n\
         base_url = \"{base}/v1\"\n\
         [providers.azure.client_credentials]\ntoken_url = \"{entra}/{TENANT}/oauth2/v2.0/token\"\n\
         [models]\nprimary = \"azure/gpt-4.1\"\n"
    )
}

async fn add_client(rota: &Rota, secret: &str) -> (u16, Value) {
    let body = json!({"provider": "azure", "name": CLIENT_ID, "type": "client_credentials", "secret": secret});
    rota.api("POST", "/api/v1/profiles", Some(&rota.admin_key), Some(body)).await
}

fn chat() -> Value {
    json!({"model": "azure/gpt-4.1", "messages": [{"role": "user", "content": "hi"}]})
}

#[tokio::test]
async fn a_client_credentials_profile_exchanges_its_secret_once_and_calls_with_the_token() {
    let (mock, base) = Mock::started().await;
    let (entra, entra_url) = Entra::started(3599, Duration::ZERO).await;
    let rota = spawn(Scenario { config: &azure(&base, &entra_url), ..Scenario::default() }).await;
    let (code, profile) = add_client(&rota, CLIENT_SECRET).await;
    assert_eq!(code, 201, "{profile}");
    assert_eq!(
        (profile["id"].as_str(), profile["type"].as_str()),
        (Some(&*format!("azure:{CLIENT_ID}")), Some("client_credentials"))
    );

    for _ in 0..3 {
        assert_eq!(rota.chat(chat(), &[]).await.status(), 200);
    }
    assert_eq!(entra.exchanges(), 1, "one exchange, the token kept for its lifetime");
    let form = entra.0.lock().forms[0].clone();
    let want: HashMap<String, String> = [
        ("grant_type", "client_credentials"),
        ("client_id", CLIENT_ID),
        ("client_secret", CLIENT_SECRET),
        ("scope", SCOPE),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    assert_eq!(form, want);
    let token = entra.0.lock().issued[0].clone();
    let seen: Vec<(String, &str)> = mock.seen().into_iter().map(|s| (s.key, s.header)).collect();
    assert_eq!(seen, vec![(token.clone(), "authorization"); 3], "Entra's token as Bearer, never the secret or api-key");

    // The database holds the secret and the token sealed, and the token's expiry.
    rota.flush().await;
    let fields: Vec<String> =
        sqlx::query_scalar("SELECT field FROM secrets ORDER BY field").fetch_all(rota.pool()).await.unwrap();
    assert_eq!(fields, ["access_token", "client_secret"]);
    let expires: Option<i64> =
        sqlx::query_scalar("SELECT expires_at FROM profiles").fetch_one(rota.pool()).await.unwrap();
    assert!(expires.is_some_and(|e| e > chrono::Utc::now().timestamp_millis() + 3_000_000), "{expires:?}");
    // Neither secret in any answer of the admin API or the audit rows.
    let (_, profiles) = rota.api("GET", "/api/v1/profiles", Some(&rota.admin_key), None).await;
    let (_, attempts) = rota.api("GET", "/api/v1/attempts", Some(&rota.admin_key), None).await;
    for text in [profiles.to_string(), attempts.to_string()] {
        assert!(!text.contains(CLIENT_SECRET) && !text.contains(&token), "{text}");
    }
}

/// Finding: a token that lives less than `refresh.lead` (5 minutes) was exchanged again at every
/// request. Now at most once per `refresh.lead / 2`.
#[tokio::test]
async fn a_token_shorter_than_the_lead_is_exchanged_at_most_once_per_half_lead() {
    let (_mock, base) = Mock::started().await;
    let (entra, entra_url) = Entra::started(60, Duration::ZERO).await;
    let rota = spawn(Scenario { config: &azure(&base, &entra_url), ..Scenario::default() }).await;
    assert_eq!(add_client(&rota, CLIENT_SECRET).await.0, 201);
    for _ in 0..10 {
        assert_eq!(rota.chat(chat(), &[]).await.status(), 200);
    }
    assert_eq!(entra.exchanges(), 1, "a 60 s token, ten requests, one exchange");
}

#[tokio::test]
async fn a_refused_client_secret_puts_the_profile_in_the_disabled_lane_naming_the_aadsts_code() {
    let (mock, base) = Mock::started().await;
    let (entra, entra_url) = Entra::started(3599, Duration::ZERO).await;
    let rota = spawn(Scenario { config: &azure(&base, &entra_url), ..Scenario::default() }).await;
    let wrong = "Qx8Q~an-old-rotated-secret-0002";
    assert_eq!(add_client(&rota, wrong).await.0, 201);
    let r = rota.chat(chat(), &[]).await;
    assert_ne!(r.status(), 200);
    let text = r.text().await.unwrap();
    assert!(text.contains("needs a new client secret") && text.contains("AADSTS7000215"), "{text}");
    assert!(!text.contains(wrong), "{text}");
    assert_eq!((entra.exchanges(), mock.seen().len()), (0, 0), "no token, no upstream call");
    rota.flush().await;
    let (reason, error): (Option<String>, Option<String>) =
        sqlx::query_as("SELECT reason, error FROM attempts").fetch_one(rota.pool()).await.unwrap();
    assert_eq!(reason.as_deref(), Some("auth_permanent"));
    assert!(error.as_deref().is_some_and(|e| e.contains("invalid_client") && !e.contains(wrong)), "{error:?}");
    let (_, profiles) = rota.api("GET", "/api/v1/profiles", Some(&rota.admin_key), None).await;
    assert_eq!(profiles[0]["status"]["state"], "disabled", "{profiles}");
}

#[tokio::test]
async fn a_client_credentials_profile_needs_a_token_endpoint_and_cannot_be_declared() {
    let (_mock, base) = Mock::started().await;
    let config = format!("{}[providers.plain]\napi = \"openai\"\nbase_url = \"{base}/v1\"\n", config(&base));
    let rota = spawn(Scenario { config: &config, ..Scenario::default() }).await;
    let body = json!({"provider": "plain", "name": "app", "type": "client_credentials", "secret": "s3cret-value"});
    let (code, answer) = rota.api("POST", "/api/v1/profiles", Some(&rota.admin_key), Some(body)).await;
    assert_eq!(code, 400);
    assert!(answer.to_string().contains("no token endpoint for client_credentials profiles"), "{answer}");
    let declared =
        format!("{}[auth.profiles.\"openai:app\"]\nprovider = \"openai\"\ntype = \"client_credentials\"\n", config);
    let e = rota::config::Config::from_toml(&declared).unwrap().problems().join("\n");
    assert!(e.contains("client_credentials profiles are added with `rota profiles add openai --type"), "{e}");
}

/// Three instances on one PostgreSQL database share one client: 30 concurrent requests spread
/// over them make one exchange at Entra (the refresh claim), and every call carries its token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_instances_on_postgres_exchange_one_client_secret_once() {
    let (mock, base) = Mock::started().await;
    let (entra, entra_url) = Entra::started(3599, Duration::from_millis(300)).await;
    let db = Db::Postgres(crate::support::postgres_database().await);
    let first = spawn(Scenario { config: &azure(&base, &entra_url), db, ..Scenario::default() }).await;
    assert_eq!(add_client(&first, CLIENT_SECRET).await.0, 201);
    let mut fleet = vec![first];
    for _ in 1..3 {
        let next = fleet[0].another().await;
        fleet.push(next);
    }
    let id = format!("azure:{CLIENT_ID}");
    for rota in &fleet {
        // Each instance has the profile (the change feed) before the requests start.
        let started = std::time::Instant::now();
        while !rota.api("GET", "/api/v1/profiles", Some(&rota.admin_key), None).await.1.to_string().contains(&id) {
            assert!(started.elapsed() < Duration::from_secs(5), "the profile reaches every instance");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let fleet = &fleet;
    let calls = (0..30).map(|i| async move { fleet[i % 3].chat(chat(), &[]).await.status().as_u16() });
    let statuses = futures_util::future::join_all(calls).await;
    assert!(statuses.iter().all(|s| *s == 200), "{statuses:?}");
    assert_eq!(entra.exchanges(), 1, "one exchange for the fleet");
    let token = entra.0.lock().issued[0].clone();
    assert!(mock.keys().iter().all(|k| *k == token), "every call with the one token");
    assert_eq!(mock.keys().len(), 30);
}

/// SQLite cannot change a CHECK in place: migration 0017 rebuilds `profiles` and `secrets`. On
/// a database migrated to 0016 and holding a profile, its secret, stats and quota, the rebuild
/// keeps every row, and afterwards the foreign keys cascade, the change feed's triggers fire and
/// the new type is accepted.
#[tokio::test]
async fn the_sqlite_rebuild_for_client_credentials_keeps_rows_keys_and_triggers() {
    let dir = tempfile::tempdir().unwrap();
    let before = dir.path().join("0001-0016");
    std::fs::create_dir(&before).unwrap();
    for entry in std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/migrations/sqlite")).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_str().unwrap().to_string();
        if name.as_str() < "0017" {
            std::fs::copy(&path, before.join(&name)).unwrap();
        }
    }
    let file = dir.path().join("rota.db");
    let url = format!("sqlite://{}?mode=rwc", file.display());
    {
        let pool = sqlx::SqlitePool::connect(&url).await.unwrap();
        sqlx::query("PRAGMA foreign_keys = ON").execute(&pool).await.unwrap();
        sqlx::migrate::Migrator::new(before.as_path()).await.unwrap().run(&pool).await.unwrap();
        for sql in [
            "INSERT INTO profiles (id, provider, name, type, source, enabled, email, created_at, updated_at, oauth_subject)
             VALUES ('corp:ana', 'corp', 'ana', 'oauth', 'stored', 1, 'ana@example.com', 1, 2, 'https://idp ana')",
            "INSERT INTO secrets (profile_id, field, key_id, nonce, ciphertext, updated_at)
             VALUES ('corp:ana', 'refresh_token', 'k1', x'01', x'02', 3)",
            "INSERT INTO usage_stats (profile_id, last_used, error_count) VALUES ('corp:ana', 5, 1)",
            "INSERT INTO profile_quota (profile_id, model, quota_remaining_requests, quota_seen_at) VALUES ('corp:ana', 'm', 7, 9)",
        ] {
            sqlx::query(sql).execute(&pool).await.unwrap();
        }
        pool.close().await;
    }
    let store = rota::store::open(&rota::store::DatabaseTarget::Sqlite(file.clone())).await.unwrap();
    let migrations = std::fs::read_dir("migrations/sqlite").unwrap().count() as i64;
    assert_eq!(store.applied_migrations().await.unwrap(), migrations, "0017 and every later migration applied");
    store.close().await;

    let pool = sqlx::SqlitePool::connect(&url).await.unwrap();
    sqlx::query("PRAGMA foreign_keys = ON").execute(&pool).await.unwrap();
    let row: (String, String, Option<String>, Option<String>) =
        sqlx::query_as("SELECT id, type, email, oauth_subject FROM profiles").fetch_one(&pool).await.unwrap();
    assert_eq!(
        row,
        ("corp:ana".into(), "oauth".into(), Some("ana@example.com".into()), Some("https://idp ana".into()))
    );
    let secret: (String, Vec<u8>) =
        sqlx::query_as("SELECT field, ciphertext FROM secrets").fetch_one(&pool).await.unwrap();
    assert_eq!(secret, ("refresh_token".into(), vec![2]));
    let problems: Vec<(String,)> = sqlx::query_as("PRAGMA foreign_key_check").fetch_all(&pool).await.unwrap();
    assert!(problems.is_empty(), "{problems:?}");
    let cooling: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM profiles_cooling").fetch_one(&pool).await.unwrap();
    assert_eq!(cooling, 0, "the view over the rebuilt table still reads");

    let feed =
        || async { sqlx::query_scalar::<_, i64>("SELECT COUNT(*) FROM changes").fetch_one(&pool).await.unwrap() };
    let before = feed().await;
    sqlx::query(
        "INSERT INTO profiles (id, provider, name, type, source, created_at, updated_at)
         VALUES ('azure:app', 'azure', 'app', 'client_credentials', 'stored', 1, 1)",
    )
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query("INSERT INTO secrets VALUES ('azure:app', 'client_secret', 'k1', x'03', x'04', 1)")
        .execute(&pool)
        .await
        .unwrap();
    assert!(feed().await > before, "the change feed's triggers fire on the rebuilt tables");
    let refused =
        sqlx::query("INSERT INTO secrets VALUES ('azure:app', 'password', 'k1', x'03', x'04', 1)").execute(&pool).await;
    assert!(refused.is_err(), "the CHECK still holds");
    sqlx::query("DELETE FROM profiles WHERE id = 'corp:ana'").execute(&pool).await.unwrap();
    let left: i64 = sqlx::query_scalar(
        "SELECT (SELECT COUNT(*) FROM secrets WHERE profile_id = 'corp:ana') + (SELECT COUNT(*) FROM usage_stats)
              + (SELECT COUNT(*) FROM profile_quota)",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(left, 0, "deleting a profile still cascades to its rows");
}

const SA_EMAIL: &str = "rota-gateway@acme-ml.iam.gserviceaccount.com";
const CLOUD_PLATFORM: &str = "https://www.googleapis.com/auth/cloud-platform";

/// A service account key as Google writes it, with this private key, its token_uri at `token_uri`.
fn sa_key(pem: &str, token_uri: &str) -> String {
    json!({
        "type": "service_account", "project_id": "acme-ml", "private_key_id": "5e1f0c0ffee0000000000000000000000000000a",
        "private_key": pem, "client_email": SA_EMAIL, "client_id": "100000000000000000001",
        "auth_uri": "https://accounts.google.com/o/oauth2/auth", "token_uri": token_uri,
        "auth_provider_x509_cert_url": "https://www.googleapis.com/oauth2/v1/certs", "universe_domain": "googleapis.com"
    })
    .to_string()
}

fn fixture(name: &str) -> Vec<u8> {
    std::fs::read(format!("{}/tests/fixtures/service-accounts/{name}", env!("CARGO_MANIFEST_DIR"))).unwrap()
}

#[derive(Default)]
struct GoogleState {
    issued: Vec<String>,
    refused: Vec<String>,
}

/// Google's OAuth token endpoint for service accounts (developers.google.com/identity/protocols/
/// oauth2/service-account): a form with the JWT-bearer grant and an assertion whose RS256
/// signature verifies with the account's public key (`a.pub.der`), `iss` the account, `aud` this
/// endpoint, a `scope`, and `iat`/`exp` around now at most an hour apart; `invalid_grant`
/// otherwise, with Google's own descriptions.
#[derive(Clone, Default)]
struct Google(Arc<Mutex<GoogleState>>);

impl Google {
    async fn started() -> (Google, String) {
        let google = Google::default();
        let app = axum::Router::new().route("/token", axum::routing::post(google_token)).with_state(google.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/token", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        (google, url)
    }
}

async fn google_token(
    axum::extract::State(google): axum::extract::State<Google>,
    headers: HeaderMap,
    uri: axum::http::Uri,
    body: Bytes,
) -> Response {
    use base64::Engine as _;
    let refuse = |why: &str| {
        google.0.lock().refused.push(why.to_string());
        (StatusCode::BAD_REQUEST, axum::Json(json!({"error": "invalid_grant", "error_description": why})))
            .into_response()
    };
    let form: HashMap<String, String> = url::form_urlencoded::parse(&body).into_owned().collect();
    let form_encoded =
        headers.get("content-type").is_some_and(|v| v.as_bytes().starts_with(b"application/x-www-form-urlencoded"));
    if !form_encoded
        || form.get("grant_type").map(String::as_str) != Some("urn:ietf:params:oauth:grant-type:jwt-bearer")
    {
        return (
            StatusCode::BAD_REQUEST,
            axum::Json(json!({"error": "unsupported_grant_type", "error_description": "Invalid grant_type: "})),
        )
            .into_response();
    }
    let assertion = form.get("assertion").cloned().unwrap_or_default();
    let parts: Vec<&str> = assertion.split('.').collect();
    let [header, claims, signature] = parts[..] else { return refuse("Invalid JWT: not a JWT.") };
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let public =
        ring::signature::UnparsedPublicKey::new(&ring::signature::RSA_PKCS1_2048_8192_SHA256, fixture("a.pub.der"));
    let signed =
        b64.decode(signature).is_ok_and(|s| public.verify(format!("{header}.{claims}").as_bytes(), &s).is_ok());
    if !signed {
        return refuse("Invalid JWT Signature.");
    }
    let header: Value = serde_json::from_slice(&b64.decode(header).unwrap()).unwrap();
    let claims: Value = serde_json::from_slice(&b64.decode(claims).unwrap()).unwrap();
    let now = chrono::Utc::now().timestamp();
    let (iat, exp) = (claims["iat"].as_i64().unwrap_or(0), claims["exp"].as_i64().unwrap_or(0));
    let endpoint = format!("http://{}{}", headers["host"].to_str().unwrap(), uri.path());
    if header["alg"] != "RS256"
        || claims["iss"] != SA_EMAIL
        || claims["aud"] != endpoint.as_str()
        || claims["scope"] != CLOUD_PLATFORM
    {
        return refuse("Invalid JWT: claims are not as the account's key and this endpoint.");
    }
    if (iat - now).abs() > 60 || exp <= iat || exp - iat > 3600 {
        return refuse(
            "Invalid JWT: Token must be a short-lived token (60 minutes) and in a reasonable timeframe. Check your iat and exp values in the JWT claim.",
        );
    }
    let token = {
        let mut st = google.0.lock();
        let token = format!("ya29.c.service-account-token-{:04}", st.issued.len() + 1);
        st.issued.push(token.clone());
        token
    };
    axum::Json(json!({"access_token": token, "expires_in": 3599, "token_type": "Bearer"})).into_response()
}

/// Vertex AI at the mock (`base`), its service accounts' keys allowed to name `token_uri`.
fn vertex(base: &str, token_uri: &str) -> String {
    format!(
        "[providers.vertex]\npreset = \"vertex\"\nproject = \"acme-ml\"\nlocation = \"us-central1\"\n\
         base_url = \"{base}/v1\"\n[providers.vertex.client_credentials]\nallow_token_uri = \"{token_uri}\"\n\
         [models]\nprimary = \"vertex/google/gemini-2.5-pro\"\n"
    )
}

#[tokio::test]
async fn a_service_account_key_signs_an_assertion_that_google_verifies_and_calls_with_the_token() {
    let (mock, base) = Mock::started().await;
    let (google, token_uri) = Google::started().await;
    let rota = spawn(Scenario { config: &vertex(&base, &token_uri), ..Scenario::default() }).await;
    let key = sa_key(&String::from_utf8(fixture("a.pem")).unwrap(), &token_uri);
    let add = |name: &str, secret: &str| {
        let body = json!({"provider": "vertex", "name": name, "type": "service_account", "secret": secret});
        rota.api("POST", "/api/v1/profiles", Some(&rota.admin_key), Some(body))
    };
    // Refused at the door: not a key, another name than the key's account, a token_uri that is
    // neither Google's nor the one the provider allows.
    let (code, answer) = add(SA_EMAIL, "{\"type\": \"authorized_user\"}").await;
    assert_eq!(code, 400, "{answer}");
    let elsewhere = sa_key(&String::from_utf8(fixture("a.pem")).unwrap(), "https://collector.example.com/token");
    let (code, answer) = add(SA_EMAIL, &elsewhere).await;
    assert_eq!(code, 400, "{answer}");
    assert!(answer.to_string().contains("token_uri is not Google's"), "{answer}");
    let (code, answer) = add("someone-else", &key).await;
    assert_eq!(code, 400);
    assert!(answer.to_string().contains(&format!("name it `{SA_EMAIL}`")), "{answer}");
    let (code, profile) = add(SA_EMAIL, &key).await;
    assert_eq!(code, 201, "{profile}");
    assert_eq!(profile["type"], "service_account");

    for _ in 0..2 {
        let r = rota
            .chat(
                json!({"model": "vertex/google/gemini-2.5-pro", "messages": [{"role": "user", "content": "hi"}]}),
                &[],
            )
            .await;
        let status = r.status();
        let refused = google.0.lock().refused.clone();
        assert_eq!(status, 200, "{refused:?} {}", r.text().await.unwrap());
    }
    let (issued, refused) = {
        let st = google.0.lock();
        (st.issued.clone(), st.refused.clone())
    };
    assert_eq!((issued.len(), refused), (1, Vec::<String>::new()), "one verified assertion");
    assert!(mock.seen().iter().all(|s| s.key == issued[0] && s.header == "authorization"));
    rota.flush().await;
    let fields: Vec<String> =
        sqlx::query_scalar("SELECT field FROM secrets ORDER BY field").fetch_all(rota.pool()).await.unwrap();
    assert_eq!(fields, ["access_token", "service_account_key"]);
    let (_, profiles) = rota.api("GET", "/api/v1/profiles", Some(&rota.admin_key), None).await;
    assert!(!profiles.to_string().contains("PRIVATE KEY") && !profiles.to_string().contains(&issued[0]));
}

#[tokio::test]
async fn an_assertion_signed_with_a_deleted_key_puts_the_profile_in_the_disabled_lane() {
    let (mock, base) = Mock::started().await;
    let (google, token_uri) = Google::started().await;
    let rota = spawn(Scenario { config: &vertex(&base, &token_uri), ..Scenario::default() }).await;
    // b.pem is not the account's key: Google cannot verify what it signs.
    let key = sa_key(&String::from_utf8(fixture("b.pem")).unwrap(), &token_uri);
    let body = json!({"provider": "vertex", "name": SA_EMAIL, "type": "service_account", "secret": key});
    assert_eq!(rota.api("POST", "/api/v1/profiles", Some(&rota.admin_key), Some(body)).await.0, 201);
    let r = rota
        .chat(json!({"model": "vertex/google/gemini-2.5-pro", "messages": [{"role": "user", "content": "hi"}]}), &[])
        .await;
    assert_ne!(r.status(), 200);
    let text = r.text().await.unwrap();
    assert!(text.contains("needs a new key") && text.contains("Invalid JWT Signature"), "{text}");
    assert!(!text.contains("PRIVATE KEY"));
    assert_eq!(google.0.lock().refused, ["Invalid JWT Signature."]);
    assert!(mock.seen().is_empty());
    let (_, profiles) = rota.api("GET", "/api/v1/profiles", Some(&rota.admin_key), None).await;
    assert_eq!(profiles[0]["status"]["state"], "disabled", "{profiles}");
}
