//! ChatGPT's sign-in as the Codex CLI does it (docs/providers.md, "Codex"): a device flow of its
//! own, not RFC 8628 (a user code from `…/api/accounts/deviceauth/usercode`, polled at
//! `…/deviceauth/token`, which answers 403 or 404 while the person has not approved, then an
//! authorization code exchanged with PKCE for the redirect `ISSUER/deviceauth/callback`), and a
//! refresh sent as JSON.

use super::{Granted, Http, OAuthError};
use crate::config::OAuth as OAuthConfig;
use crate::engine::Millis;
use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;
use serde_json::{Value, json};
use std::time::Duration;

/// Where the device flow's user-code endpoint sits under the issuer.
const USERCODE_PATH: &str = "/api/accounts/deviceauth/usercode";
/// How long a person has to approve a device login (the Codex CLI waits as long).
pub const DEVICE_WAIT: Duration = Duration::from_secs(15 * 60);
/// The scopes of a refresh, as the Codex CLI sends them.
const REFRESH_SCOPE: &str = "openid profile email";

/// A started device login.
#[derive(Clone, Debug)]
pub struct Device {
    pub device_auth_id: String,
    pub user_code: String,
    /// Where the person enters the code: `ISSUER/codex/device`.
    pub verification_uri: String,
    pub interval: Duration,
}

/// The issuer (`https://auth.openai.com`): the device URL without its fixed path.
fn issuer(cfg: &OAuthConfig) -> Result<&str, OAuthError> {
    let url = cfg.device_url.as_deref().unwrap_or_default();
    url.strip_suffix(USERCODE_PATH).filter(|i| !i.is_empty()).ok_or_else(|| {
        OAuthError::Malformed(format!(
            "oauth.device_url must end with {USERCODE_PATH} for ChatGPT's device flow (the `codex` preset)"
        ))
    })
}

/// The error an answer other than 2xx means: its status and the error code it names (an OAuth
/// `error` string, or OpenAI's `error.code`), never its free text.
async fn refused(resp: reqwest::Response) -> OAuthError {
    let status = resp.status().as_u16();
    let body: Value = read(resp).await.unwrap_or_default();
    let code = body
        .get("error")
        .and_then(|e| e.as_str().or_else(|| e.get("code").and_then(Value::as_str)))
        .filter(|c| c.len() <= 64 && c.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'.'))
        .map(str::to_string);
    match code.as_deref() {
        Some("invalid_grant" | "refresh_token_expired" | "refresh_token_reused" | "refresh_token_invalidated") => {
            OAuthError::InvalidGrant(code)
        }
        _ => OAuthError::Refused { code: format!("HTTP {status}"), detail: code },
    }
}

fn transport(e: reqwest::Error) -> OAuthError {
    OAuthError::Transport(crate::redact::error_text(&e))
}

async fn post_json(http: &Http, url: &str, body: &Value) -> Result<reqwest::Response, OAuthError> {
    let req = http.client().post(url).header("content-type", "application/json").body(body.to_string());
    req.send().await.map_err(transport)
}

/// An answer's JSON, if it is that.
async fn read<T: serde::de::DeserializeOwned>(resp: reqwest::Response) -> Option<T> {
    serde_json::from_slice(&resp.bytes().await.ok()?).ok()
}

/// Asks for a user code.
pub async fn device_start(http: &Http, cfg: &OAuthConfig) -> Result<Device, OAuthError> {
    #[derive(Deserialize)]
    struct UserCode {
        device_auth_id: String,
        #[serde(alias = "usercode")]
        user_code: String,
        #[serde(default)]
        interval: Option<Value>,
    }
    let issuer = issuer(cfg)?;
    let url = cfg.device_url.as_deref().unwrap_or_default();
    let resp = post_json(http, url, &json!({"client_id": cfg.client_id})).await?;
    if !resp.status().is_success() {
        return Err(refused(resp).await);
    }
    let answer: UserCode = read(resp).await.ok_or_else(|| {
        OAuthError::Malformed("the user-code answer is not JSON with device_auth_id and user_code".into())
    })?;
    // The interval comes as a string ("5"); 1 to 60 seconds, 5 when unsaid.
    let interval = match &answer.interval {
        Some(Value::String(s)) => s.trim().parse().ok(),
        Some(Value::Number(n)) => n.as_u64(),
        _ => None,
    };
    Ok(Device {
        device_auth_id: answer.device_auth_id,
        user_code: answer.user_code,
        verification_uri: format!("{issuer}/codex/device"),
        interval: Duration::from_secs(interval.unwrap_or(5).clamp(1, 60)),
    })
}

/// Polls until the person approved the code (or `DEVICE_WAIT` passed), then exchanges the
/// authorization code it yields.
pub async fn device_finish(
    http: &Http,
    cfg: &OAuthConfig,
    device: &Device,
    now: impl Fn() -> Millis,
) -> Result<Granted, OAuthError> {
    #[derive(Deserialize)]
    struct Approved {
        authorization_code: String,
        code_verifier: String,
    }
    let issuer = issuer(cfg)?;
    let poll_url = format!("{issuer}/api/accounts/deviceauth/token");
    let until = tokio::time::Instant::now() + DEVICE_WAIT;
    let body = json!({"device_auth_id": device.device_auth_id, "user_code": device.user_code});
    let approved: Approved = loop {
        if tokio::time::Instant::now() >= until {
            return Err(OAuthError::DeviceExpired);
        }
        tokio::time::sleep(device.interval).await;
        let resp = post_json(http, &poll_url, &body).await?;
        match resp.status().as_u16() {
            403 | 404 => continue,
            s if (200..300).contains(&s) => {
                break read(resp).await.ok_or_else(|| {
                    OAuthError::Malformed(
                        "the device answer is not JSON with authorization_code and code_verifier".into(),
                    )
                })?;
            }
            _ => return Err(refused(resp).await),
        }
    };
    let form = [
        ("grant_type", "authorization_code"),
        ("code", approved.authorization_code.as_str()),
        ("redirect_uri", &format!("{issuer}/deviceauth/callback")),
        ("client_id", cfg.client_id.as_str()),
        ("code_verifier", approved.code_verifier.as_str()),
    ];
    let form = url::form_urlencoded::Serializer::new(String::new()).extend_pairs(form).finish();
    let resp = http
        .client()
        .post(&cfg.token_url)
        .header("content-type", "application/x-www-form-urlencoded")
        .body(form)
        .send()
        .await
        .map_err(transport)?;
    tokens(resp, now()).await
}

/// Exchanges a refresh token, as JSON (the Codex CLI's request).
pub async fn refresh(http: &Http, cfg: &OAuthConfig, token: &SecretString, now: Millis) -> Result<Granted, OAuthError> {
    let body = json!({
        "client_id": cfg.client_id,
        "grant_type": "refresh_token",
        "refresh_token": token.expose_secret(),
        "scope": REFRESH_SCOPE,
    });
    let resp = post_json(http, &cfg.token_url, &body).await?;
    tokens(resp, now).await
}

/// A token answer. Without `expires_in`, the access token's own `exp` says when it expires.
async fn tokens(resp: reqwest::Response, now: Millis) -> Result<Granted, OAuthError> {
    #[derive(Deserialize)]
    struct Tokens {
        access_token: String,
        refresh_token: Option<String>,
        id_token: Option<String>,
        expires_in: Option<u64>,
    }
    if !resp.status().is_success() {
        return Err(refused(resp).await);
    }
    let t: Tokens = read(resp)
        .await
        .ok_or_else(|| OAuthError::Malformed("the token answer is not JSON with an access_token".into()))?;
    let exp = || super::id_token_claims(&t.access_token)?.get("exp")?.as_i64().map(|s| s * 1000);
    Ok(Granted {
        expires_at: t.expires_in.map(|s| now + s as Millis * 1000).or_else(exp),
        access: SecretString::from(t.access_token.clone()),
        refresh: t.refresh_token.map(SecretString::from),
        id_token: t.id_token,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::Json;
    use axum::http::{HeaderMap, StatusCode};
    use axum::routing::post;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn jwt(claims: Value) -> String {
        use base64::Engine as _;
        let part = |v: &Value| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string());
        format!("{}.{}.sig", part(&json!({"alg": "RS256"})), part(&claims))
    }

    /// auth.openai.com as the Codex CLI meets it: "pending" as 404 then 403, the code exchanged
    /// for the device callback only, refresh only as JSON, a used refresh token refused.
    async fn fake() -> (OAuthConfig, String) {
        let polls = Arc::new(AtomicUsize::new(0));
        let app = axum::Router::new()
            .route(
                "/api/accounts/deviceauth/usercode",
                post(|Json(b): Json<Value>| async move {
                    assert_eq!(b, json!({"client_id": "app_test"}));
                    Json(json!({"device_auth_id": "dev-1", "user_code": "ABCD-1234", "interval": "1"}))
                }),
            )
            .route(
                "/api/accounts/deviceauth/token",
                post(move |Json(b): Json<Value>| async move {
                    assert_eq!(b, json!({"device_auth_id": "dev-1", "user_code": "ABCD-1234"}));
                    match polls.fetch_add(1, Ordering::SeqCst) {
                        0 => (StatusCode::NOT_FOUND, Json(json!({}))),
                        1 => (StatusCode::FORBIDDEN, Json(json!({}))),
                        _ => (
                            StatusCode::OK,
                            Json(
                                json!({"authorization_code": "code-1", "code_challenge": "c", "code_verifier": "v-1"}),
                            ),
                        ),
                    }
                }),
            )
            .route(
                "/oauth/token",
                post(|headers: HeaderMap, body: String| async move {
                    let exp = 4_102_444_800i64; // 2100-01-01
                    let access = jwt(json!({"exp": exp, "email": "a@example.com"}));
                    if headers["content-type"] == "application/json" {
                        let b: Value = serde_json::from_str(&body).unwrap();
                        assert_eq!(b["scope"], "openid profile email");
                        return match b["refresh_token"].as_str() {
                            Some("rt-1") => {
                                (StatusCode::OK, Json(json!({"access_token": access, "refresh_token": "rt-2"})))
                            }
                            _ => (
                                StatusCode::UNAUTHORIZED,
                                Json(json!({"error": {"message": "already used", "code": "refresh_token_reused"}})),
                            ),
                        };
                    }
                    let form: std::collections::HashMap<String, String> =
                        url::form_urlencoded::parse(body.as_bytes()).into_owned().collect();
                    let issuer = form["redirect_uri"].trim_end_matches("/deviceauth/callback").to_string();
                    let good = form["grant_type"] == "authorization_code"
                        && form["code"] == "code-1"
                        && form["code_verifier"] == "v-1"
                        && form["client_id"] == "app_test"
                        && issuer.starts_with("http://127.0.0.1:");
                    match good {
                        true => (
                            StatusCode::OK,
                            Json(json!({"access_token": access, "refresh_token": "rt-1", "id_token": "x.y.z"})),
                        ),
                        false => (StatusCode::BAD_REQUEST, Json(json!({"error": "invalid_grant"}))),
                    }
                }),
            );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        (config(&base, USERCODE_PATH), base)
    }

    fn config(base: &str, device_path: &str) -> OAuthConfig {
        OAuthConfig {
            authorize_url: format!("{base}/oauth/authorize"),
            token_url: format!("{base}/oauth/token"),
            device_url: Some(format!("{base}{device_path}")),
            userinfo_url: None,
            client_id: "app_test".into(),
            client_secret_env: None,
            scopes: vec![],
            extra_params: Default::default(),
            redirect_uri: None,
            chatgpt: true,
        }
    }

    #[tokio::test]
    async fn the_device_flow_waits_through_403_and_404_then_exchanges_and_refreshes_as_json() {
        let (cfg, base) = fake().await;
        let http = Http::default();
        let device = device_start(&http, &cfg).await.unwrap();
        assert_eq!((device.user_code.as_str(), device.interval), ("ABCD-1234", Duration::from_secs(1)));
        assert_eq!(device.verification_uri, format!("{base}/codex/device"));
        let granted = device_finish(&http, &cfg, &device, || 0).await.unwrap();
        assert_eq!(granted.expires_at, Some(4_102_444_800_000), "the access token's own exp");
        assert_eq!(granted.refresh.as_ref().unwrap().expose_secret(), "rt-1");

        let refreshed = refresh(&http, &cfg, &SecretString::from("rt-1"), 0).await.unwrap();
        assert_eq!(refreshed.refresh.unwrap().expose_secret(), "rt-2");
        let reused = refresh(&http, &cfg, &SecretString::from("rt-1-old"), 0).await;
        assert!(matches!(reused, Err(OAuthError::InvalidGrant(Some(ref c))) if c == "refresh_token_reused"));
    }

    #[test]
    fn the_device_url_must_have_chatgpts_path() {
        let cfg = config("https://auth.openai.com", "/device");
        assert!(issuer(&cfg).is_err());
        assert_eq!(issuer(&config("https://auth.openai.com", USERCODE_PATH)).unwrap(), "https://auth.openai.com");
    }
}
