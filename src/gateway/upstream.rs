//! The HTTP client that calls providers.

use super::wire::Api;
use crate::book::Credential;
use crate::config::{KeyHeader, Preset, Provider, Timeouts, WireFormat};
use crate::redact::error_text;
use axum::http::HeaderMap;
use bytes::Bytes;
use parking_lot::RwLock;
use secrecy::{ExposeSecret, SecretString};
use std::collections::HashMap;
use std::sync::Arc;

/// Client headers forwarded upstream, per wire format (everything else is rota's business or
/// the agent's key).
const FORWARDED_ANTHROPIC: [&str; 2] = ["anthropic-version", "anthropic-beta"];
const FORWARDED_OPENAI: [&str; 1] = ["openai-beta"];
const DEFAULT_ANTHROPIC_VERSION: &str = "2023-06-01";

/// Why a call did not get an answer from the upstream.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    /// The OAuth profile has no access token yet.
    #[error("the OAuth profile has no access token yet (it needs a refresh)")]
    NoAccessToken,
    /// The request did not reach the upstream, or its answer broke off (no secret in it).
    #[error("{}", error_text(.0))]
    Transport(reqwest::Error),
}

/// What one call sends: the body, the client's headers (those passed on), and whether it streams.
pub struct Outgoing<'a> {
    pub body: Bytes,
    pub client_headers: &'a HeaderMap,
    pub stream: bool,
    /// The attempt's trace context (`traceparent`), when traces are on (crate::telemetry).
    pub trace: Option<HeaderMap>,
}

#[derive(Clone)]
pub struct Upstream {
    client: reqwest::Client,
    /// Endpoints parsed, by their text: parsing a URL (with its IDNA pass) cost more than the
    /// rest of building a request. One entry per base URL and path ever called.
    endpoints: Arc<RwLock<HashMap<String, reqwest::Url, foldhash::fast::RandomState>>>,
}

impl Upstream {
    pub fn new(timeouts: &Timeouts) -> Upstream {
        // One process-wide TLS provider; installing it twice is harmless.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = reqwest::Client::builder()
            .connect_timeout(timeouts.connect)
            // A credential must not travel to another host (reqwest keeps `x-api-key` across
            // a cross-host redirect): a 3xx is the attempt's answer, a failure.
            .redirect(reqwest::redirect::Policy::none())
            .pool_idle_timeout(std::time::Duration::from_secs(90))
            .user_agent(concat!("rota/", env!("CARGO_PKG_VERSION")))
            .build()
            .expect("HTTP client configuration is static and valid");
        Upstream { client, endpoints: Arc::default() }
    }

    /// A POST to `url`, parsed once.
    fn post(&self, url: String) -> reqwest::RequestBuilder {
        let parsed = self.endpoints.read().get(&url).cloned();
        match parsed.or_else(|| {
            let parsed = reqwest::Url::parse(&url).ok()?;
            self.endpoints.write().insert(url.clone(), parsed.clone());
            Some(parsed)
        }) {
            Some(parsed) => self.client.post(parsed),
            // reqwest reports what is wrong with it when the request is sent.
            None => self.client.post(url),
        }
    }

    /// Sends one request of `api`.
    #[tracing::instrument(skip_all, fields(api = api.as_str(), stream))]
    pub async fn send(
        &self,
        provider: &Provider,
        (api, model): (Api, &str),
        credential: &Credential,
        out: Outgoing<'_>,
    ) -> Result<reqwest::Response, UpstreamError> {
        let url = match &provider.claude_base_url {
            // Claude on Vertex AI: the model and the method in the URL (docs/providers.md).
            Some(claude) if provider.claude_on_vertex(model) => {
                let method = if out.stream { "streamRawPredict" } else { "rawPredict" };
                format!("{}/{model}:{method}", claude.trim_end_matches('/'))
            }
            _ => format!("{}{}", provider.base_url.trim_end_matches('/'), api.upstream_path()),
        };
        self.post_json(provider, provider.api_for(model), url, credential, out).await
    }

    /// Sends one request to `path` of the provider's base URL.
    pub async fn send_to(
        &self,
        provider: &Provider,
        path: &str,
        credential: &Credential,
        out: Outgoing<'_>,
    ) -> Result<reqwest::Response, UpstreamError> {
        let url = format!("{}{path}", provider.base_url.trim_end_matches('/'));
        self.post_json(provider, provider.api, url, credential, out).await
    }

    /// Sends one JSON request in the wire format `api`.
    async fn post_json(
        &self,
        provider: &Provider,
        api: WireFormat,
        url: String,
        credential: &Credential,
        Outgoing { body, client_headers, stream, trace }: Outgoing<'_>,
    ) -> Result<reqwest::Response, UpstreamError> {
        let mut req = self.post(url).header("content-type", "application/json").body(body);
        if stream {
            req = req.header("accept", "text/event-stream");
        }
        let forwarded: &[&str] = match api {
            WireFormat::Anthropic => &FORWARDED_ANTHROPIC,
            _ => &FORWARDED_OPENAI,
        };
        for &name in forwarded {
            if let Some(v) = client_headers.get(name) {
                req = req.header(name, v);
            }
        }
        if let Some(trace) = trace {
            req = req.headers(trace);
        }
        authorize(req, provider, api, credential, client_headers)?.send().await.map_err(UpstreamError::Transport)
    }

    /// rota's own cheap authenticated call with a credential (`GET base_url + confirm_path`),
    /// to confirm or refute an agent's claim that it is revoked or out of credit: the status,
    /// headers and body (at most 64 KiB read).
    pub async fn confirm(
        &self,
        provider: &Provider,
        credential: &Credential,
        timeout: std::time::Duration,
    ) -> Result<(u16, Vec<(String, String)>, String), UpstreamError> {
        let url = format!("{}{}", provider.base_url.trim_end_matches('/'), provider.confirm_path);
        let req =
            authorize(self.client.get(url).timeout(timeout), provider, provider.api, credential, &HeaderMap::new())?;
        let mut resp = req.send().await.map_err(UpstreamError::Transport)?;
        let status = resp.status().as_u16();
        let headers = resp
            .headers()
            .iter()
            .map(|(k, v)| (k.as_str().to_string(), v.to_str().unwrap_or("").to_string()))
            .collect();
        let mut body = Vec::new();
        while let Some(chunk) = resp.chunk().await.map_err(UpstreamError::Transport)? {
            body.extend_from_slice(&chunk);
            if body.len() > 64 * 1024 {
                break;
            }
        }
        Ok((status, headers, String::from_utf8_lossy(&body).into_owned()))
    }
}

/// The ChatGPT account a Codex access token is for: its claim
/// `https://api.openai.com/auth`.`chatgpt_account_id`, sent as `ChatGPT-Account-ID` as the Codex
/// CLI sends it (docs/providers.md). Only an id of the shape OpenAI issues (at most 128 letters,
/// digits, `-` and `_`) is sent.
fn chatgpt_account(token: &str) -> Option<String> {
    let claims = crate::oauth::id_token_claims(token)?;
    let id = claims.get("https://api.openai.com/auth")?.get("chatgpt_account_id")?.as_str()?;
    let shaped =
        !id.is_empty() && id.len() <= 128 && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    shaped.then(|| id.to_string())
}

/// The credential in the header its provider reads, and the Anthropic version header.
fn authorize(
    mut req: reqwest::RequestBuilder,
    provider: &Provider,
    api: WireFormat,
    credential: &Credential,
    client_headers: &HeaderMap,
) -> Result<reqwest::RequestBuilder, UpstreamError> {
    let secret = token(credential).ok_or(UpstreamError::NoAccessToken)?;
    if provider.preset == Some(Preset::Codex)
        && let Some(account) = chatgpt_account(secret.expose_secret())
    {
        req = req.header("chatgpt-account-id", account);
    }
    req = match (provider.key_header, credential) {
        (KeyHeader::XApiKey, Credential::ApiKey(_)) => req.header("x-api-key", secret.expose_secret()),
        (KeyHeader::ApiKey, Credential::ApiKey(_)) => req.header("api-key", secret.expose_secret()),
        _ => req.bearer_auth(secret.expose_secret()),
    };
    // Claude on Vertex AI takes its version in the body (`WithModel`), not in this header.
    if api == WireFormat::Anthropic
        && provider.claude_base_url.is_none()
        && !client_headers.contains_key("anthropic-version")
    {
        req = req.header("anthropic-version", DEFAULT_ANTHROPIC_VERSION);
    }
    Ok(req)
}

fn token(c: &Credential) -> Option<&SecretString> {
    match c {
        Credential::ApiKey(s) | Credential::Token(s) => Some(s),
        Credential::OAuth { access, .. } | Credential::Client { access, .. } => access.as_ref(),
    }
}
