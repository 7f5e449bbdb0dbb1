//! Google service accounts (docs/providers.md): the JSON key an operator uploads, checked when
//! it is added, and the exchange of an RS256-signed JWT assertion (RFC 7523) for an access token
//! at the key's `token_uri`.

use super::{Granted, Http, OAuthError};
use crate::engine::Millis;
use base64::Engine as _;
use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;

/// The fields of a service account key rota uses (Google writes more).
#[derive(Deserialize)]
pub struct Key {
    #[serde(rename = "type")]
    kind: String,
    pub client_email: String,
    private_key_id: String,
    private_key: String,
    pub token_uri: String,
}

/// Google's token endpoint: the only `token_uri` rota posts a key's assertion to, unless the
/// provider's `client_credentials.allow_token_uri` names another.
pub const GOOGLE_TOKEN_URI: &str = "https://oauth2.googleapis.com/token";

impl Key {
    /// Whether rota may post this key's assertion to its `token_uri`: Google's, or `allowed`.
    pub fn check_token_uri(&self, allowed: Option<&str>) -> Result<(), String> {
        if self.token_uri == GOOGLE_TOKEN_URI || allowed == Some(self.token_uri.as_str()) {
            return Ok(());
        }
        Err(format!(
            "the key's token_uri is not Google's ({GOOGLE_TOKEN_URI}); \
             providers.NAME.client_credentials.allow_token_uri may name another"
        ))
    }

    /// A key as uploaded: Google's JSON, of `type` `service_account`, whose private key is an
    /// RSA key in PKCS#8 PEM and whose `token_uri` is `https` (or `http` on a loopback address).
    /// The message says what is wrong, never what the key holds.
    pub fn parse(json: &str) -> Result<Key, String> {
        // serde's message may quote the key's text: only a missing field's name is repeated.
        let key: Key = serde_json::from_str(json).map_err(|e| {
            let text = e.to_string();
            let said = match e.classify() {
                serde_json::error::Category::Data if text.starts_with("missing field") => {
                    text.split(" at line").next().unwrap_or("").to_string()
                }
                serde_json::error::Category::Data => "a field of the wrong type".to_string(),
                _ => "not JSON".to_string(),
            };
            format!("not a service account key (Google's JSON with client_email, private_key, token_uri): {said}")
        })?;
        if key.kind != "service_account" {
            return Err(format!("the key's type is `{}`, not `service_account`", key.kind.escape_default()));
        }
        key.signer()?;
        let uri = url::Url::parse(&key.token_uri).map_err(|_| "the key's token_uri is not a URL".to_string())?;
        let loopback = uri.host_str().is_some_and(|h| h == "127.0.0.1" || h == "localhost" || h == "[::1]");
        if !(uri.scheme() == "https" || uri.scheme() == "http" && loopback) {
            return Err("the key's token_uri must be https".into());
        }
        Ok(key)
    }

    fn signer(&self) -> Result<ring::signature::RsaKeyPair, String> {
        let body: String =
            self.private_key.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with("-----")).collect();
        let der = base64::engine::general_purpose::STANDARD
            .decode(body)
            .map_err(|_| "the key's private_key is not a PEM key".to_string())?;
        ring::signature::RsaKeyPair::from_pkcs8(&der)
            .map_err(|_| "the key's private_key is not an RSA private key in PKCS#8".to_string())
    }

    /// The assertion for `scopes`, issued now and valid for an hour (Google's maximum).
    fn assertion(&self, scopes: &[String], now: Millis) -> Result<String, String> {
        let b64 = |v: &serde_json::Value| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string());
        let iat = now / 1000;
        let header = serde_json::json!({"alg": "RS256", "typ": "JWT", "kid": self.private_key_id});
        let claims = serde_json::json!({
            "iss": self.client_email,
            "scope": scopes.join(" "),
            "aud": self.token_uri,
            "iat": iat,
            "exp": iat + 3600,
        });
        let signing_input = format!("{}.{}", b64(&header), b64(&claims));
        let signer = self.signer()?;
        let mut signature = vec![0; signer.public().modulus_len()];
        signer
            .sign(
                &ring::signature::RSA_PKCS1_SHA256,
                &ring::rand::SystemRandom::new(),
                signing_input.as_bytes(),
                &mut signature,
            )
            .map_err(|_| "signing the assertion failed".to_string())?;
        Ok(format!("{signing_input}.{}", base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(signature)))
    }
}

#[derive(Deserialize)]
struct TokenAnswer {
    access_token: String,
    expires_in: Option<u64>,
}

#[derive(Deserialize)]
struct ErrorAnswer {
    error: String,
    error_description: Option<String>,
}

/// Exchanges a signed assertion of `key` for an access token with the provider's scopes, at
/// the key's `token_uri` if the provider allows it (`Key::check_token_uri`).
pub async fn exchange(
    http: &Http,
    key: &SecretString,
    cfg: &crate::config::ClientCredentials,
    now: Millis,
) -> Result<Granted, OAuthError> {
    let key = Key::parse(key.expose_secret()).map_err(OAuthError::Malformed)?;
    key.check_token_uri(cfg.allow_token_uri.as_deref()).map_err(OAuthError::Malformed)?;
    let assertion = key.assertion(&cfg.scopes, now).map_err(OAuthError::Malformed)?;
    let form = url::form_urlencoded::Serializer::new(String::new())
        .append_pair("grant_type", "urn:ietf:params:oauth:grant-type:jwt-bearer")
        .append_pair("assertion", &assertion)
        .finish();
    let resp = http
        .client()
        .post(&key.token_uri)
        .header("content-type", "application/x-www-form-urlencoded")
        .body(form)
        .send()
        .await
        .map_err(|e| OAuthError::Transport(crate::redact::error_text(&e)))?;
    let status = resp.status();
    let body = resp.bytes().await.map_err(|e| OAuthError::Transport(crate::redact::error_text(&e)))?;
    if status.is_success() {
        let t: TokenAnswer = serde_json::from_slice(&body)
            .map_err(|_| OAuthError::Malformed("the token endpoint's answer has no access_token".into()))?;
        return Ok(Granted {
            access: SecretString::from(t.access_token),
            refresh: None,
            expires_at: t.expires_in.map(|s| now + s.min(86_400) as Millis * 1000),
            id_token: None,
        });
    }
    match serde_json::from_slice::<ErrorAnswer>(&body) {
        Ok(e) if e.error == "invalid_grant" => Err(OAuthError::InvalidGrant(e.error_description)),
        Ok(e) => Err(OAuthError::Refused { code: e.error, detail: e.error_description }),
        Err(_) => Err(OAuthError::Malformed(format!("the token endpoint answered {status} without an OAuth error"))),
    }
}
