//! OAuth 2.0 / OIDC logins (docs/api.md), generic over the providers the config declares:
//! authorization code with PKCE (callback or pasted redirect URL), the device flow (RFC 8628),
//! and refresh. The profile is keyed by the account's OpenID subject (`sub`) and named after
//! its email, from userinfo or the id_token.

pub mod chatgpt;
pub mod service_account;

use crate::config::OAuth as OAuthConfig;
use crate::engine::Millis;
use oauth2::basic::{
    BasicErrorResponse, BasicErrorResponseType, BasicRevocationErrorResponse, BasicTokenIntrospectionResponse,
    BasicTokenType,
};
use oauth2::{
    AuthUrl, AuthorizationCode, Client, ClientId, ClientSecret, CsrfToken, DeviceAuthorizationUrl, EndpointMaybeSet,
    EndpointNotSet, EndpointSet, ExtraTokenFields, HttpRequest, HttpResponse, PkceCodeChallenge, PkceCodeVerifier,
    RedirectUrl, RefreshToken, RequestTokenError, Scope, StandardDeviceAuthorizationResponse, StandardRevocableToken,
    StandardTokenResponse, TokenResponse, TokenUrl,
};
use secrecy::{ExposeSecret, SecretString};
use serde::{Deserialize, Serialize};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// The id_token, when the provider sends one (OIDC).
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub struct IdToken {
    pub id_token: Option<String>,
}
impl ExtraTokenFields for IdToken {}

pub type Tokens = StandardTokenResponse<IdToken, BasicTokenType>;

type OAuthClient = Client<
    BasicErrorResponse,
    Tokens,
    BasicTokenIntrospectionResponse,
    StandardRevocableToken,
    BasicRevocationErrorResponse,
    EndpointSet,
    EndpointMaybeSet,
    EndpointNotSet,
    EndpointNotSet,
    EndpointSet,
>;

/// What a login or refresh yields.
pub struct Granted {
    pub access: SecretString,
    pub refresh: Option<SecretString>,
    /// When the access token expires (Unix ms), if the provider said.
    pub expires_at: Option<Millis>,
    pub id_token: Option<String>,
}

impl Granted {
    fn of(t: &Tokens, now: Millis) -> Granted {
        Granted {
            access: SecretString::from(t.access_token().secret().clone()),
            refresh: t.refresh_token().map(|r| SecretString::from(r.secret().clone())),
            expires_at: t.expires_in().map(|d| now + d.as_millis() as Millis),
            id_token: t.extra_fields().id_token.clone(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum OAuthError {
    #[error("[providers.{provider}.oauth].{key}: {why}")]
    Config { provider: String, key: &'static str, why: String },
    #[error("the client secret variable {0} is not set")]
    NoSecret(String),
    /// The provider refused the grant (`invalid_grant`): the refresh token is used up or revoked.
    #[error("the provider refused the grant (invalid_grant){}", .0.as_ref().map(|d| format!(": {d}")).unwrap_or_default())]
    InvalidGrant(Option<String>),
    #[error("the provider answered {code}{}", .detail.as_ref().map(|d| format!(": {d}")).unwrap_or_default())]
    Refused { code: String, detail: Option<String> },
    #[error("the provider could not be reached: {0}")]
    Transport(String),
    /// An answer that is not what the endpoint should send (never a parser's message: the
    /// console shows it).
    #[error("{0}")]
    Malformed(String),
    #[error("the device code expired before the login was completed")]
    DeviceExpired,
}

/// The HTTP client of the token, device and userinfo endpoints. It never follows redirects
/// (an endpoint that redirects could send credentials elsewhere). Built on first use: building
/// one reads the system's root certificates, which a gateway without OAuth profiles never needs
/// (docs/performance.md).
#[derive(Clone, Default)]
pub struct Http(Arc<OnceLock<reqwest::Client>>);

impl Http {
    fn client(&self) -> &reqwest::Client {
        self.0.get_or_init(|| crate::http::own_client(Duration::from_secs(10), Duration::from_secs(30)))
    }
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct HttpError(String);

impl<'c> oauth2::AsyncHttpClient<'c> for Http {
    type Error = HttpError;
    type Future = Pin<Box<dyn Future<Output = Result<HttpResponse, HttpError>> + Send + 'c>>;

    fn call(&'c self, request: HttpRequest) -> Self::Future {
        Box::pin(async move {
            let (parts, body) = request.into_parts();
            let resp = self
                .client()
                .request(parts.method, parts.uri.to_string())
                .headers(parts.headers)
                .body(body)
                .send()
                .await
                .map_err(|e| HttpError(crate::redact::error_text(&e)))?;
            let mut out = http::Response::builder().status(resp.status());
            for (k, v) in resp.headers() {
                out = out.header(k, v);
            }
            let bytes = resp.bytes().await.map_err(|e| HttpError(crate::redact::error_text(&e)))?;
            out.body(bytes.to_vec()).map_err(|e| HttpError(e.to_string()))
        })
    }
}

/// One OAuth call: `Http`, noting the status and content type of the last answer, so that an
/// answer that cannot be read is described in words (`Answer::malformed`).
struct Call<'h> {
    http: &'h Http,
    endpoint: Endpoint,
    last: parking_lot::Mutex<Option<(u16, Option<String>)>>,
}

/// The endpoint a call goes to, and what it should answer.
#[derive(Clone, Copy)]
enum Endpoint {
    Device,
    Token,
}

impl Endpoint {
    fn name(self) -> &'static str {
        match self {
            Endpoint::Device => "device",
            Endpoint::Token => "token",
        }
    }

    fn expected(self) -> &'static str {
        match self {
            Endpoint::Device => "a device authorization (expected JSON with device_code, user_code, verification_uri)",
            Endpoint::Token => "a token response (expected JSON with access_token and token_type)",
        }
    }
}

impl<'h> Call<'h> {
    fn new(http: &'h Http, endpoint: Endpoint) -> Self {
        Call { http, endpoint, last: parking_lot::Mutex::new(None) }
    }

    /// The last answer could not be read (`oauth2` said why in `detail`): what it was, in words.
    /// Neither the body nor the parser's message is shown: the body may hold anything.
    fn malformed(&self, detail: &str) -> OAuthError {
        let last = self.last.lock().clone();
        let (name, expected) = (self.endpoint.name(), self.endpoint.expected());
        let Some((status, content_type)) = last else {
            return OAuthError::Malformed(format!(
                "the provider's {name} endpoint did not answer as expected: {detail}"
            ));
        };
        let of_type = match content_type {
            Some(ct) if !ct.to_ascii_lowercase().starts_with("application/json") => {
                format!(" of type {}", ct.split(';').next().unwrap_or("").trim())
            }
            _ => String::new(),
        };
        OAuthError::Malformed(match (status, detail.contains("empty")) {
            (200, true) => format!("the provider's {name} endpoint answered 200 with an empty body, not {expected}"),
            (200, false) => {
                format!("the provider's {name} endpoint answered 200 with a body{of_type} that is not {expected}")
            }
            (_, true) => format!("the provider's {name} endpoint answered {status} with an empty body"),
            (_, false) => format!(
                "the provider's {name} endpoint answered {status} with a body{of_type} that is not an OAuth error (expected JSON with error)"
            ),
        })
    }

    fn token_error<RE: std::error::Error>(&self, e: RequestTokenError<RE, BasicErrorResponse>) -> OAuthError {
        match e {
            RequestTokenError::Parse(..) => self.malformed("parse"),
            RequestTokenError::Other(detail) => self.malformed(&detail),
            e => token_error(e),
        }
    }
}

impl<'c> oauth2::AsyncHttpClient<'c> for Call<'_> {
    type Error = HttpError;
    type Future = Pin<Box<dyn Future<Output = Result<HttpResponse, HttpError>> + Send + 'c>>;

    fn call(&'c self, request: HttpRequest) -> Self::Future {
        Box::pin(async move {
            let resp = oauth2::AsyncHttpClient::call(self.http, request).await?;
            let content_type =
                resp.headers().get(http::header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).map(str::to_string);
            *self.last.lock() = Some((resp.status().as_u16(), content_type));
            Ok(resp)
        })
    }
}

/// A login started in a browser: what the callback (or the pasted URL) must match.
pub struct Pending {
    pub provider: String,
    pub state: String,
    pub redirect_uri: String,
    pub verifier: PkceCodeVerifier,
    pub created_at: Millis,
}

fn bad(provider: &str, key: &'static str, why: impl ToString) -> OAuthError {
    OAuthError::Config { provider: provider.to_string(), key, why: why.to_string() }
}

fn client(provider: &str, cfg: &OAuthConfig, redirect_uri: Option<&str>) -> Result<OAuthClient, OAuthError> {
    let mut c = Client::new(ClientId::new(cfg.client_id.clone()))
        .set_auth_uri(AuthUrl::new(cfg.authorize_url.clone()).map_err(|e| bad(provider, "authorize_url", e))?)
        .set_token_uri(TokenUrl::new(cfg.token_url.clone()).map_err(|e| bad(provider, "token_url", e))?)
        .set_device_authorization_url_option(
            cfg.device_url
                .as_ref()
                .map(|u| DeviceAuthorizationUrl::new(u.clone()).map_err(|e| bad(provider, "device_url", e)))
                .transpose()?,
        );
    if let Some(var) = &cfg.client_secret_env {
        let secret = std::env::var(var).map_err(|_| OAuthError::NoSecret(var.clone()))?;
        c = c.set_client_secret(ClientSecret::new(secret));
    }
    if let Some(r) = redirect_uri {
        c = c.set_redirect_uri(RedirectUrl::new(r.to_string()).map_err(|e| bad(provider, "redirect_uri", e))?);
    }
    Ok(c)
}

fn token_error<RE: std::error::Error>(e: RequestTokenError<RE, BasicErrorResponse>) -> OAuthError {
    match e {
        RequestTokenError::ServerResponse(r) if *r.error() == BasicErrorResponseType::InvalidGrant => {
            OAuthError::InvalidGrant(r.error_description().cloned())
        }
        RequestTokenError::ServerResponse(r) => {
            OAuthError::Refused { code: r.error().to_string(), detail: r.error_description().cloned() }
        }
        RequestTokenError::Request(e) => OAuthError::Transport(e.to_string()),
        RequestTokenError::Parse(e, _) => OAuthError::Malformed(e.to_string()),
        RequestTokenError::Other(e) => OAuthError::Malformed(e),
    }
}

/// The authorization URL for a browser login, and what its callback must match.
pub fn authorize(
    provider: &str,
    cfg: &OAuthConfig,
    redirect_uri: &str,
    now: Millis,
) -> Result<(String, Pending), OAuthError> {
    let c = client(provider, cfg, Some(redirect_uri))?;
    let (challenge, verifier) = PkceCodeChallenge::new_random_sha256();
    let mut req = c.authorize_url(CsrfToken::new_random).set_pkce_challenge(challenge);
    for s in &cfg.scopes {
        req = req.add_scope(Scope::new(s.clone()));
    }
    for (k, v) in &cfg.extra_params {
        req = req.add_extra_param(k.clone(), v.clone());
    }
    let (url, state) = req.url();
    let pending = Pending {
        provider: provider.to_string(),
        state: state.secret().clone(),
        redirect_uri: redirect_uri.to_string(),
        verifier,
        created_at: now,
    };
    Ok((url.to_string(), pending))
}

/// A JSON document at `url` (an OpenID provider's discovery document).
pub async fn get_json<T: serde::de::DeserializeOwned>(http: &Http, url: &str) -> Result<T, OAuthError> {
    let resp = http.client().get(url).send().await.map_err(|e| OAuthError::Transport(crate::redact::error_text(&e)))?;
    if !resp.status().is_success() {
        return Err(OAuthError::Refused {
            code: format!("HTTP {}", resp.status().as_u16()),
            detail: Some(url.to_string()),
        });
    }
    let bytes = resp.bytes().await.map_err(|e| OAuthError::Transport(crate::redact::error_text(&e)))?;
    serde_json::from_slice(&bytes)
        .map_err(|_| OAuthError::Malformed(format!("{url} is not the JSON document expected")))
}

/// Exchanges the authorization code (with the PKCE verifier) for tokens.
pub async fn exchange(
    http: &Http,
    cfg: &OAuthConfig,
    pending: Pending,
    code: &str,
    now: Millis,
) -> Result<Granted, OAuthError> {
    let c = client(&pending.provider, cfg, Some(&pending.redirect_uri))?;
    let call = Call::new(http, Endpoint::Token);
    let tokens = c
        .exchange_code(AuthorizationCode::new(code.to_string()))
        .set_pkce_verifier(pending.verifier)
        .request_async(&call)
        .await
        .map_err(|e| call.token_error(e))?;
    Ok(Granted::of(&tokens, now))
}

/// A device login under way: what the person is shown, and the wait for their approval.
pub struct DeviceLogin {
    pub user_code: String,
    pub verification_uri: String,
    pub verification_uri_complete: Option<String>,
    pub expires_in: Duration,
    pub interval: Duration,
    /// Polls until the login is done, refused or expired.
    pub finish: futures_util::future::BoxFuture<'static, Result<Granted, OAuthError>>,
}

/// Starts a device login: RFC 8628, or ChatGPT's own flow for the `codex` preset.
pub async fn device(
    http: &Http,
    provider: &str,
    cfg: &OAuthConfig,
    now: impl Fn() -> Millis + Send + 'static,
) -> Result<DeviceLogin, OAuthError> {
    let (http, cfg) = (http.clone(), cfg.clone());
    if cfg.chatgpt {
        let d = chatgpt::device_start(&http, &cfg).await?;
        return Ok(DeviceLogin {
            user_code: d.user_code.clone(),
            verification_uri: d.verification_uri.clone(),
            verification_uri_complete: None,
            expires_in: chatgpt::DEVICE_WAIT,
            interval: d.interval,
            finish: Box::pin(async move { chatgpt::device_finish(&http, &cfg, &d, now).await }),
        });
    }
    let d = device_start(&http, provider, &cfg).await?;
    let provider = provider.to_string();
    Ok(DeviceLogin {
        user_code: d.user_code().secret().clone(),
        verification_uri: d.verification_uri().to_string(),
        verification_uri_complete: d.verification_uri_complete().map(|u| u.secret().clone()),
        expires_in: d.expires_in(),
        interval: d.interval(),
        finish: Box::pin(async move { device_finish(&http, &provider, &cfg, &d, now).await }),
    })
}

/// Starts a device login (RFC 8628): the code the user types and where.
async fn device_start(
    http: &Http,
    provider: &str,
    cfg: &OAuthConfig,
) -> Result<StandardDeviceAuthorizationResponse, OAuthError> {
    let c = client(provider, cfg, None)?;
    let mut req =
        c.exchange_device_code().map_err(|_| bad(provider, "device_url", "not set: the device flow needs it"))?;
    // A client with a secret authenticates with HTTP Basic, which names it only in the header:
    // Entra ID requires `client_id` in the body of its device authorization request too.
    if cfg.client_secret_env.is_some() {
        req = req.add_extra_param("client_id", cfg.client_id.clone());
    }
    for s in &cfg.scopes {
        req = req.add_scope(Scope::new(s.clone()));
    }
    for (k, v) in &cfg.extra_params {
        req = req.add_extra_param(k.clone(), v.clone());
    }
    let call = Call::new(http, Endpoint::Device);
    req.request_async(&call).await.map_err(|e| call.token_error(e))
}

/// Polls until the user completed the device login (or the code expired).
async fn device_finish(
    http: &Http,
    provider: &str,
    cfg: &OAuthConfig,
    details: &StandardDeviceAuthorizationResponse,
    now: impl Fn() -> Millis,
) -> Result<Granted, OAuthError> {
    let c = client(provider, cfg, None)?;
    let req = c.exchange_device_access_token(details);
    let call = Call::new(http, Endpoint::Token);
    let tokens =
        req.request_async(&call, tokio::time::sleep, Some(details.expires_in())).await.map_err(|e| match e {
            RequestTokenError::ServerResponse(r) => match r.error() {
                oauth2::DeviceCodeErrorResponseType::ExpiredToken => OAuthError::DeviceExpired,
                other => OAuthError::Refused { code: other.to_string(), detail: r.error_description().cloned() },
            },
            RequestTokenError::Request(e) => OAuthError::Transport(e.to_string()),
            RequestTokenError::Parse(..) => call.malformed("parse"),
            RequestTokenError::Other(e) if e.contains("timed out") || e.contains("imeout") => OAuthError::DeviceExpired,
            RequestTokenError::Other(e) => call.malformed(&e),
        })?;
    Ok(Granted::of(&tokens, now()))
}

/// Exchanges a refresh token for new tokens.
pub async fn refresh(
    http: &Http,
    provider: &str,
    cfg: &OAuthConfig,
    token: &SecretString,
    now: Millis,
) -> Result<Granted, OAuthError> {
    if cfg.chatgpt {
        return chatgpt::refresh(http, cfg, token, now).await;
    }
    let c = client(provider, cfg, None)?;
    let t = RefreshToken::new(token.expose_secret().to_string());
    let call = Call::new(http, Endpoint::Token);
    let tokens = c.exchange_refresh_token(&t).request_async(&call).await.map_err(|e| call.token_error(e))?;
    Ok(Granted::of(&tokens, now))
}

/// Exchanges an OAuth client's id and secret for an access token (RFC 6749 §4.4), for the
/// `client_credentials` profiles (docs/providers.md). The secret travels in the form body, as
/// Microsoft Entra ID documents it (and as every provider accepts it).
pub async fn client_credentials(
    http: &Http,
    cfg: &crate::config::ClientCredentials,
    client_id: &str,
    secret: &SecretString,
    now: Millis,
) -> Result<Granted, OAuthError> {
    let token_url = TokenUrl::new(cfg.token_url.clone())
        .map_err(|e| OAuthError::Malformed(format!("client_credentials.token_url: {e}")))?;
    let c = Client::<
        BasicErrorResponse,
        Tokens,
        BasicTokenIntrospectionResponse,
        StandardRevocableToken,
        BasicRevocationErrorResponse,
    >::new(ClientId::new(client_id.to_string()))
    .set_client_secret(ClientSecret::new(secret.expose_secret().to_string()))
    .set_auth_type(oauth2::AuthType::RequestBody)
    .set_token_uri(token_url);
    let mut req = c.exchange_client_credentials();
    for s in &cfg.scopes {
        req = req.add_scope(Scope::new(s.clone()));
    }
    let call = Call::new(http, Endpoint::Token);
    let tokens = req.request_async(&call).await.map_err(|e| call.token_error(e))?;
    Ok(Granted::of(&tokens, now))
}

/// The `AADSTS…` code at the start of a Microsoft Entra ID error description, which says why
/// (7000215: a wrong secret, 7000222: an expired one, 700016: no such application).
pub fn aadsts(description: &str) -> Option<&str> {
    let code = description.trim_start().split(|c: char| !c.is_ascii_alphanumeric()).next()?;
    (code.len() > 6 && code.starts_with("AADSTS") && code[6..].bytes().all(|b| b.is_ascii_digit())).then_some(code)
}

/// Who logged in: the account's subject (what its profile is keyed by) and its email (what
/// the profile is named after and shows; not trusted to identify the account).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Account {
    /// `<issuer> <sub>`: the OpenID `sub` claim with its issuer (the id_token's `iss`, else the
    /// provider's `token_url`). `None` when the provider names no subject (plain OAuth 2.0).
    pub subject: Option<String>,
    pub email: Option<String>,
}

/// The account of a login: `sub` and `email` from the id_token's claims, and from userinfo when
/// configured (its `email` is preferred; a userinfo whose `sub` differs from the id_token's is
/// not used at all, as OIDC Core §5.3.2 requires).
pub async fn account(http: &Http, cfg: &OAuthConfig, granted: &Granted) -> Account {
    let claims = granted.id_token.as_deref().and_then(id_token_claims).unwrap_or_default();
    let text = |v: &serde_json::Value, k: &str| v.get(k).and_then(|e| e.as_str()).map(str::to_string);
    let mut sub = text(&claims, "sub");
    // Entra ID names the person in `preferred_username` (an email address as a rule).
    let username = text(&claims, "preferred_username").filter(|u| u.contains('@'));
    let mut email = text(&claims, "email").or(username);
    if let Some(info) = userinfo(http, cfg, granted).await {
        let info_sub = text(&info, "sub");
        if sub.is_none() || info_sub == sub {
            sub = sub.or(info_sub);
            email = text(&info, "email").or(email);
        }
    }
    let issuer = text(&claims, "iss").unwrap_or_else(|| cfg.token_url.clone());
    Account { subject: sub.filter(|s| !s.is_empty()).map(|s| format!("{issuer} {s}")), email }
}

pub async fn userinfo(http: &Http, cfg: &OAuthConfig, granted: &Granted) -> Option<serde_json::Value> {
    let url = cfg.userinfo_url.as_ref()?;
    let resp = http.client().get(url).bearer_auth(granted.access.expose_secret()).send().await.ok()?;
    if !resp.status().is_success() {
        return None;
    }
    serde_json::from_slice(&resp.bytes().await.ok()?).ok()
}

/// The claims of a JWT's payload. The id_token came straight from the token endpoint over the
/// connection rota opened, so its signature is not checked (OIDC Core §3.1.3.7).
pub fn id_token_claims(jwt: &str) -> Option<serde_json::Value> {
    use base64::Engine as _;
    let payload = jwt.split('.').nth(1)?;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(payload.trim_end_matches('=')).ok()?;
    serde_json::from_slice::<serde_json::Value>(&bytes).ok().filter(serde_json::Value::is_object)
}

/// The `email` claim of a JWT's payload.
pub fn id_token_email(jwt: &str) -> Option<String> {
    id_token_claims(jwt)?.get("email").and_then(|e| e.as_str()).map(str::to_string)
}

/// The `code` of a redirect URL pasted by a person, after checking its `state`. The URL is
/// parsed, never fetched. A duplicated parameter, a missing code or a state that does not
/// match is refused; an `error` parameter is reported as the provider's refusal.
pub fn code_from_pasted(url: &str, expected_state: &str) -> Result<String, String> {
    let query = url
        .trim()
        .split_once('?')
        .map(|(_, q)| q)
        .ok_or("the pasted text is not a redirect URL with a query (…?code=…&state=…)")?;
    let query = query.split('#').next().unwrap_or("");
    let mut seen: std::collections::BTreeMap<String, String> = std::collections::BTreeMap::new();
    for (k, v) in url::form_urlencoded::parse(query.as_bytes()) {
        if seen.insert(k.to_string(), v.to_string()).is_some() {
            return Err(format!("the parameter `{k}` appears twice: refused"));
        }
    }
    if let Some(e) = seen.get("error") {
        let detail = seen.get("error_description").map(|d| format!(": {d}")).unwrap_or_default();
        return Err(format!("the provider refused the login ({e}{detail})"));
    }
    match seen.get("state") {
        None => return Err("the URL has no `state`: paste the whole address the browser ended on".into()),
        Some(s) if s != expected_state => return Err("the `state` does not match this login: start it again".into()),
        Some(_) => {}
    }
    seen.remove("code").filter(|c| !c.is_empty()).ok_or_else(|| "the URL has no `code`".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pasted_url_gives_its_code_only_when_everything_matches() {
        let ok = "http://localhost:1455/auth/callback?code=abc%2F1&state=s1&iss=x";
        assert_eq!(code_from_pasted(ok, "s1"), Ok("abc/1".into()));
        assert_eq!(code_from_pasted(&format!("  {ok}#frag \n"), "s1"), Ok("abc/1".into()));
        assert!(code_from_pasted(ok, "s2").unwrap_err().contains("does not match"));
        assert!(code_from_pasted("http://h/cb?code=a&code=b&state=s1", "s1").unwrap_err().contains("twice"));
        assert!(code_from_pasted("http://h/cb?code=a&state=s1&state=s1", "s1").unwrap_err().contains("twice"));
        assert!(code_from_pasted("http://h/cb?state=s1", "s1").unwrap_err().contains("no `code`"));
        assert!(code_from_pasted("http://h/cb?code=&state=s1", "s1").unwrap_err().contains("no `code`"));
        assert!(code_from_pasted("http://h/cb?code=a", "s1").unwrap_err().contains("no `state`"));
        assert!(code_from_pasted("abc", "s1").unwrap_err().contains("not a redirect URL"));
        let denied = code_from_pasted("http://h/cb?error=access_denied&error_description=no&state=s1", "s1");
        assert_eq!(denied, Err("the provider refused the login (access_denied: no)".into()));
    }

    /// A userinfo endpoint answering `body`, and a provider config that uses it.
    async fn with_userinfo(body: serde_json::Value) -> OAuthConfig {
        let app = axum::Router::new().route("/me", axum::routing::get(move || async move { axum::Json(body) }));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        OAuthConfig {
            authorize_url: "https://idp.test/authorize".into(),
            token_url: "https://idp.test/token".into(),
            device_url: None,
            userinfo_url: Some(format!("http://{addr}/me")),
            client_id: "rota".into(),
            client_secret_env: None,
            scopes: vec![],
            extra_params: Default::default(),
            redirect_uri: None,
            chatgpt: false,
        }
    }

    fn granted(claims: Option<&str>) -> Granted {
        use base64::Engine as _;
        let enc = |v: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v);
        Granted {
            access: SecretString::from("at"),
            refresh: None,
            expires_at: None,
            id_token: claims.map(|c| format!("{}.{}.sig", enc(r#"{"alg":"RS256"}"#), enc(c))),
        }
    }

    #[tokio::test]
    async fn the_account_is_its_subject_and_userinfo_counts_only_for_the_same_subject() {
        let http = Http::default();
        let id_token = Some(r#"{"iss":"https://issuer.test","sub":"42","email":"a@example.com"}"#);
        let same = with_userinfo(serde_json::json!({"sub": "42", "email": "a@new.example.com"})).await;
        let got = account(&http, &same, &granted(id_token)).await;
        let want = |s: &str, e: &str| Account { subject: Some(s.into()), email: Some(e.into()) };
        assert_eq!(got, want("https://issuer.test 42", "a@new.example.com"));
        let other = with_userinfo(serde_json::json!({"sub": "666", "email": "victim@example.com"})).await;
        let got = account(&http, &other, &granted(id_token)).await;
        assert_eq!(got, want("https://issuer.test 42", "a@example.com"), "another subject's userinfo is not used");
        let plain = with_userinfo(serde_json::json!({"sub": "7", "email": "p@example.com"})).await;
        let got = account(&http, &plain, &granted(None)).await;
        assert_eq!(got, want("https://idp.test/token 7", "p@example.com"), "no id_token: the token_url issues");
        let entra = Some(
            r#"{"iss":"https://login.microsoftonline.com/t/v2.0","sub":"9","preferred_username":"p@contoso.com"}"#,
        );
        let got = account(&http, &with_userinfo(serde_json::json!({})).await, &granted(entra)).await;
        assert_eq!(
            got,
            want("https://login.microsoftonline.com/t/v2.0 9", "p@contoso.com"),
            "Entra's preferred_username"
        );
        let nobody = with_userinfo(serde_json::json!({"email": "n@example.com"})).await;
        let got = account(&http, &nobody, &granted(None)).await;
        assert_eq!(got, Account { subject: None, email: Some("n@example.com".into()) });
    }

    #[test]
    fn the_email_comes_from_the_id_token_claims() {
        use base64::Engine as _;
        let enc = |v: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v);
        let jwt = format!("{}.{}.sig", enc(r#"{"alg":"RS256"}"#), enc(r#"{"sub":"1","email":"a@example.com"}"#));
        assert_eq!(id_token_email(&jwt), Some("a@example.com".into()));
        assert_eq!(id_token_email("garbage"), None);
        let no_email = format!("h.{}.s", enc(r#"{"sub":"1"}"#));
        assert_eq!(id_token_email(&no_email), None);
    }
}
