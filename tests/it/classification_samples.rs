//! Realistic upstream error samples against the classification table (docs/rotation.md).
//!
//! Every row is a status code, headers and body as the real provider sends them (or the
//! transport error text reqwest/hyper produce), with the reason docs/rotation.md says it must get, the
//! effect of that reason (`next`, `mark`), the exact reset hint (docs/rotation.md, "Provider hint wins")
//! and, where it matters, whether the limit is account-wide.
//!
//! `table_samples_classify_as_specified` checks every row and reports *all* mismatches in one
//! failure, so one run shows every wrong row. The named tests below pin the most important rules.
//!
//! Date-based hints are computed against `NOW_MS` = 1_700_000_000_000 = 2023-11-14T22:13:20Z.

use rota::engine::classify::{Classified, Classifier, Echoed, Observed};
use rota::engine::reason::{Mark, Next, Reason};
use std::collections::BTreeSet;

/// 2023-11-14T22:13:20Z.
const NOW_MS: i64 = 1_700_000_000_000;

struct Sample {
    name: &'static str,
    /// Provider group, for the coverage test.
    group: &'static str,
    status: Option<u16>,
    headers: &'static [(&'static str, &'static str)],
    body: &'static str,
    transport: Option<&'static str>,
    reason: Reason,
    next: Next,
    mark: Mark,
    /// The exact `hint.wait_ms`; `None` means the answer carries no reset hint at all.
    wait_ms: Option<i64>,
    /// `Some(x)`: `account_wide` must be `x`. `None`: not asserted.
    account_wide: Option<bool>,
}

const GROUPS: [&str; 7] = ["openai", "anthropic", "gemini", "openrouter", "ollama", "transport", "other"];

const JSON: (&str, &str) = ("content-type", "application/json");

// Effects, spelled out per reason (docs/rotation.md "effect" column) so the rows stay readable.
use Mark::{CooldownModel, CooldownProfile, Disabled, Model};
use Next::{NextModel, Rotate, Stop};
const NO_MARK: Mark = Mark::None;

static SAMPLES: &[Sample] = &[
    // ───────────────────────────── OpenAI ─────────────────────────────
    Sample {
        name: "openai_429_rate_limit_tokens_per_min",
        group: "openai",
        status: Some(429),
        headers: &[
            JSON,
            ("x-request-id", "req_8f2b1c0e4a7d4e1f9b3c2a1d0e9f8a7b"),
            ("openai-organization", "org-abc123"),
            ("openai-processing-ms", "12"),
            ("x-ratelimit-limit-requests", "10000"),
            ("x-ratelimit-limit-tokens", "30000"),
            ("x-ratelimit-remaining-requests", "9999"),
            ("x-ratelimit-remaining-tokens", "0"),
            ("x-ratelimit-reset-requests", "6ms"),
            ("x-ratelimit-reset-tokens", "20s"),
        ],
        body: r#"{
    "error": {
        "message": "Rate limit reached for gpt-4o in organization org-abc123 on tokens per min (TPM): Limit 30000, Used 29876, Requested 1200. Please try again in 20s. Visit https://platform.openai.com/account/rate-limits to learn more.",
        "type": "tokens",
        "param": null,
        "code": "rate_limit_exceeded"
    }
}"#,
        transport: None,
        reason: Reason::RateLimit,
        next: Rotate,
        mark: CooldownModel,
        wait_ms: Some(20_000),
        account_wide: Some(false),
    },
    Sample {
        name: "openai_429_rate_limit_requests_per_min",
        group: "openai",
        status: Some(429),
        headers: &[
            JSON,
            ("x-ratelimit-limit-requests", "500"),
            ("x-ratelimit-limit-tokens", "200000"),
            ("x-ratelimit-remaining-requests", "0"),
            ("x-ratelimit-remaining-tokens", "199852"),
            ("x-ratelimit-reset-requests", "1m12s"),
            ("x-ratelimit-reset-tokens", "44ms"),
        ],
        body: r#"{"error":{"message":"Rate limit reached for gpt-4o-mini in organization org-abc123 on requests per min (RPM): Limit 500, Used 500, Requested 1. Please try again in 1m12s. Visit https://platform.openai.com/account/rate-limits to learn more.","type":"requests","param":null,"code":"rate_limit_exceeded"}}"#,
        transport: None,
        reason: Reason::RateLimit,
        next: Rotate,
        mark: CooldownModel,
        wait_ms: Some(72_000),
        account_wide: Some(false),
    },
    Sample {
        name: "openai_429_insufficient_quota",
        group: "openai",
        status: Some(429),
        headers: &[JSON, ("x-request-id", "req_1b2c3d4e5f60718293a4b5c6d7e8f901")],
        body: r#"{
    "error": {
        "message": "You exceeded your current quota, please check your plan and billing details. For more information on this error, read the docs: https://platform.openai.com/docs/guides/error-codes/api-errors.",
        "type": "insufficient_quota",
        "param": null,
        "code": "insufficient_quota"
    }
}"#,
        transport: None,
        reason: Reason::Billing,
        next: Rotate,
        mark: Disabled,
        wait_ms: None,
        account_wide: Some(true),
    },
    Sample {
        name: "openai_401_invalid_api_key",
        group: "openai",
        status: Some(401),
        headers: &[JSON, ("www-authenticate", "Bearer realm=\"OpenAI API\"")],
        body: r#"{
    "error": {
        "message": "Incorrect API key provided: sk-proj-********************************************abcd. You can find your API key at https://platform.openai.com/account/api-keys.",
        "type": "invalid_request_error",
        "param": null,
        "code": "invalid_api_key"
    }
}"#,
        transport: None,
        reason: Reason::Auth,
        next: Rotate,
        mark: CooldownProfile,
        wait_ms: None,
        account_wide: None,
    },
    Sample {
        // docs/rotation.md: 401 is auth. OpenAI tags it `invalid_request_error`, which must not make it
        // a (no-failover) format error.
        name: "openai_401_missing_api_key",
        group: "openai",
        status: Some(401),
        headers: &[JSON],
        body: r#"{
    "error": {
        "message": "You didn't provide an API key. You need to provide your API key in an Authorization header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY), or as the password field (with blank username) if you're accessing the API from your browser and are prompted for a username and password. You can obtain an API key from https://platform.openai.com/account/api-keys.",
        "type": "invalid_request_error",
        "param": null,
        "code": null
    }
}"#,
        transport: None,
        reason: Reason::Auth,
        next: Rotate,
        mark: CooldownProfile,
        wait_ms: None,
        account_wide: None,
    },
    Sample {
        name: "openai_400_context_length_exceeded",
        group: "openai",
        status: Some(400),
        headers: &[JSON],
        body: r#"{
    "error": {
        "message": "This model's maximum context length is 128000 tokens. However, your messages resulted in 130532 tokens. Please reduce the length of the messages.",
        "type": "invalid_request_error",
        "param": "messages",
        "code": "context_length_exceeded"
    }
}"#,
        transport: None,
        reason: Reason::ContextOverflow,
        next: Stop,
        mark: NO_MARK,
        wait_ms: None,
        account_wide: None,
    },
    Sample {
        name: "openai_404_model_not_found",
        group: "openai",
        status: Some(404),
        headers: &[JSON],
        body: r#"{
    "error": {
        "message": "The model `gpt-9` does not exist or you do not have access to it.",
        "type": "invalid_request_error",
        "param": null,
        "code": "model_not_found"
    }
}"#,
        transport: None,
        reason: Reason::ModelNotFound,
        next: NextModel,
        mark: Model,
        wait_ms: None,
        account_wide: None,
    },
    Sample {
        name: "openai_500_server_error",
        group: "openai",
        status: Some(500),
        headers: &[JSON],
        body: r#"{
    "error": {
        "message": "The server had an error while processing your request. Sorry about that!",
        "type": "server_error",
        "param": null,
        "code": null
    }
}"#,
        transport: None,
        reason: Reason::ServerError,
        next: Rotate,
        mark: CooldownModel,
        wait_ms: None,
        account_wide: None,
    },
    Sample {
        name: "openai_503_engine_overloaded",
        group: "openai",
        status: Some(503),
        headers: &[JSON],
        body: r#"{
    "error": {
        "message": "The engine is currently overloaded, please try again later",
        "type": "server_error",
        "param": null,
        "code": null
    }
}"#,
        transport: None,
        reason: Reason::Overloaded,
        next: Rotate,
        mark: CooldownModel,
        wait_ms: None,
        account_wide: None,
    },
    Sample {
        name: "openai_400_invalid_param_value",
        group: "openai",
        status: Some(400),
        headers: &[JSON],
        body: r#"{
    "error": {
        "message": "Invalid 'temperature': decimal above maximum value. Expected a value <= 2, but got 3.5 instead.",
        "type": "invalid_request_error",
        "param": "temperature",
        "code": "decimal_above_max_value"
    }
}"#,
        transport: None,
        reason: Reason::Format,
        next: Stop,
        mark: NO_MARK,
        wait_ms: None,
        account_wide: None,
    },
    Sample {
        name: "openai_400_missing_tool_call_id_response",
        group: "openai",
        status: Some(400),
        headers: &[JSON],
        body: r#"{
    "error": {
        "message": "An assistant message with 'tool_calls' must be followed by tool messages responding to each 'tool_call_id'. The following tool_call_ids did not have response messages: call_Zx8kQ2mN4pR7sT1v",
        "type": "invalid_request_error",
        "param": "messages.[3].role",
        "code": null
    }
}"#,
        transport: None,
        reason: Reason::Format,
        next: Stop,
        mark: NO_MARK,
        wait_ms: None,
        account_wide: None,
    },
    Sample {
        name: "openai_403_account_deactivated",
        group: "openai",
        status: Some(403),
        headers: &[JSON],
        body: r#"{
    "error": {
        "message": "Your OpenAI account has been deactivated, please check your email for more information. If you feel this is an error, contact us through our help center at help.openai.com.",
        "type": "invalid_request_error",
        "param": null,
        "code": "account_deactivated"
    }
}"#,
        transport: None,
        reason: Reason::AuthPermanent,
        next: Rotate,
        mark: Disabled,
        wait_ms: None,
        account_wide: None,
    },
    Sample {
        name: "openai_403_unsupported_country",
        group: "openai",
        status: Some(403),
        headers: &[JSON],
        body: r#"{"error":{"code":"unsupported_country_region_territory","message":"Country, region, or territory not supported","param":null,"type":"request_forbidden"}}"#,
        transport: None,
        reason: Reason::Auth,
        next: Rotate,
        mark: CooldownProfile,
        wait_ms: None,
        account_wide: None,
    },
    Sample {
        // Azure OpenAI: a per-deployment TPM limit. The only "quota" in it is the
        // `aka.ms/oai/quotaincrease` link, which does not make the limit account-wide.
        name: "azure_openai_429_token_rate_limit_retry_after",
        group: "openai",
        status: Some(429),
        headers: &[
            JSON,
            ("retry-after", "6"),
            ("retry-after-ms", "6000"),
            ("x-ms-region", "East US"),
            ("apim-request-id", "2f6c1f6e-5d7a-4b0e-9a55-0b1d2e3f4a5b"),
        ],
        body: r#"{"error":{"code":"429","message":"Requests to the ChatCompletions_Create Operation under Azure OpenAI API version 2024-02-01 have exceeded token rate limit of your current OpenAI S0 pricing tier. Please retry after 6 seconds. Please go here: https://aka.ms/oai/quotaincrease if you would like to further increase the default rate limit."}}"#,
        transport: None,
        reason: Reason::RateLimit,
        next: Rotate,
        mark: CooldownModel,
        wait_ms: Some(6_000),
        account_wide: Some(false),
    },
    // ──────────────────────────── Anthropic ────────────────────────────
    Sample {
        name: "anthropic_429_rate_limit_error",
        group: "anthropic",
        status: Some(429),
        headers: &[
            JSON,
            ("request-id", "req_011CQ3kZ7w8xYvQ2nP4rT6uV"),
            ("retry-after", "27"),
            ("anthropic-ratelimit-requests-limit", "50"),
            ("anthropic-ratelimit-requests-remaining", "0"),
            ("anthropic-ratelimit-requests-reset", "2023-11-14T22:13:47Z"),
            ("anthropic-ratelimit-input-tokens-limit", "40000"),
            ("anthropic-ratelimit-input-tokens-remaining", "12000"),
            ("anthropic-ratelimit-input-tokens-reset", "2023-11-14T22:13:21Z"),
            ("anthropic-ratelimit-output-tokens-limit", "8000"),
            ("anthropic-ratelimit-output-tokens-remaining", "8000"),
            ("anthropic-ratelimit-output-tokens-reset", "2023-11-14T22:13:20Z"),
        ],
        body: r#"{"type":"error","error":{"type":"rate_limit_error","message":"This request would exceed the rate limit for your organization (5b9f3c2e-1d4a-4e8b-9c7d-0a1b2c3d4e5f) of 50 requests per minute. For details, refer to: https://docs.anthropic.com/en/api/rate-limits. You can see the response headers for current usage. Please reduce the prompt length or the maximum tokens requested, or try again later. You may also contact sales at https://www.anthropic.com/contact-sales to discuss your options for a rate limit increase."}}"#,
        transport: None,
        reason: Reason::RateLimit,
        next: Rotate,
        mark: CooldownModel,
        wait_ms: Some(27_000),
        account_wide: Some(false),
    },
    Sample {
        // Claude subscription (OAuth) window: the unified reset covers every model.
        name: "anthropic_429_unified_subscription_window",
        group: "anthropic",
        status: Some(429),
        headers: &[
            JSON,
            ("anthropic-ratelimit-unified-status", "rejected"),
            ("anthropic-ratelimit-unified-reset", "1700003600"),
        ],
        body: r#"{"type":"error","error":{"type":"rate_limit_error","message":"This request would exceed your account's rate limit. Please try again later."}}"#,
        transport: None,
        reason: Reason::RateLimit,
        next: Rotate,
        mark: CooldownModel,
        wait_ms: Some(3_600_000),
        account_wide: Some(true),
    },
    Sample {
        name: "anthropic_529_overloaded_error",
        group: "anthropic",
        status: Some(529),
        headers: &[JSON, ("x-should-retry", "true"), ("request-id", "req_011CQ3m2aBcDeFgHiJkLmNoP")],
        body: r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#,
        transport: None,
        reason: Reason::Overloaded,
        next: Rotate,
        mark: CooldownModel,
        wait_ms: None,
        account_wide: None,
    },
    Sample {
        name: "anthropic_400_prompt_too_long",
        group: "anthropic",
        status: Some(400),
        headers: &[JSON],
        body: r#"{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 210000 tokens > 200000 maximum"}}"#,
        transport: None,
        reason: Reason::ContextOverflow,
        next: Stop,
        mark: NO_MARK,
        wait_ms: None,
        account_wide: None,
    },
    Sample {
        // Input plus max_tokens over the window: a context overflow, not a malformed request.
        name: "anthropic_400_input_and_max_tokens_exceed_context_limit",
        group: "anthropic",
        status: Some(400),
        headers: &[JSON],
        body: r#"{"type":"error","error":{"type":"invalid_request_error","message":"input length and `max_tokens` exceed context limit: 187254 + 20000 > 200000, decrease input length or `max_tokens` and try again"}}"#,
        transport: None,
        reason: Reason::ContextOverflow,
        next: Stop,
        mark: NO_MARK,
        wait_ms: None,
        account_wide: None,
    },
    Sample {
        name: "anthropic_400_credit_balance_too_low",
        group: "anthropic",
        status: Some(400),
        headers: &[JSON],
        body: r#"{"type":"error","error":{"type":"invalid_request_error","message":"Your credit balance is too low to access the Anthropic API. Please go to Plans & Billing to upgrade or purchase credits."}}"#,
        transport: None,
        reason: Reason::Billing,
        next: Rotate,
        mark: Disabled,
        wait_ms: None,
        account_wide: Some(true),
    },
    Sample {
        name: "anthropic_401_invalid_x_api_key",
        group: "anthropic",
        status: Some(401),
        headers: &[JSON],
        body: r#"{"type":"error","error":{"type":"authentication_error","message":"invalid x-api-key"}}"#,
        transport: None,
        reason: Reason::Auth,
        next: Rotate,
        mark: CooldownProfile,
        wait_ms: None,
        account_wide: None,
    },
    Sample {
        name: "anthropic_401_oauth_token_expired",
        group: "anthropic",
        status: Some(401),
        headers: &[JSON],
        body: r#"{"type":"error","error":{"type":"authentication_error","message":"OAuth token has expired. Please obtain a new token or refresh your existing token."}}"#,
        transport: None,
        reason: Reason::Auth,
        next: Rotate,
        mark: CooldownProfile,
        wait_ms: None,
        account_wide: None,
    },
    Sample {
        name: "anthropic_403_permission_error",
        group: "anthropic",
        status: Some(403),
        headers: &[JSON],
        body: r#"{"type":"error","error":{"type":"permission_error","message":"Your API key does not have permission to use the specified resource."}}"#,
        transport: None,
        reason: Reason::Auth,
        next: Rotate,
        mark: CooldownProfile,
        wait_ms: None,
        account_wide: None,
    },
    Sample {
        name: "anthropic_404_not_found_model",
        group: "anthropic",
        status: Some(404),
        headers: &[JSON],
        body: r#"{"type":"error","error":{"type":"not_found_error","message":"model: claude-9"}}"#,
        transport: None,
        reason: Reason::ModelNotFound,
        next: NextModel,
        mark: Model,
        wait_ms: None,
        account_wide: None,
    },
    Sample {
        name: "anthropic_400_tool_use_id_mismatch",
        group: "anthropic",
        status: Some(400),
        headers: &[JSON],
        body: r#"{"type":"error","error":{"type":"invalid_request_error","message":"messages.1.content.0: unexpected `tool_use_id` found in `tool_result` blocks: toolu_01AbCdEfGhIjKlMnOpQrStUv. Each `tool_result` block must have a corresponding `tool_use` block in the previous message."}}"#,
        transport: None,
        reason: Reason::Format,
        next: Stop,
        mark: NO_MARK,
        wait_ms: None,
        account_wide: None,
    },
    Sample {
        name: "anthropic_400_max_tokens_above_model_limit",
        group: "anthropic",
        status: Some(400),
        headers: &[JSON],
        body: r#"{"type":"error","error":{"type":"invalid_request_error","message":"max_tokens: 128000 > 64000, which is the maximum allowed number of output tokens for claude-sonnet-4-20250514"}}"#,
        transport: None,
        reason: Reason::Format,
        next: Stop,
        mark: NO_MARK,
        wait_ms: None,
        account_wide: None,
    },
    Sample {
        name: "anthropic_413_request_too_large",
        group: "anthropic",
        status: Some(413),
        headers: &[JSON],
        body: r#"{"type":"error","error":{"type":"request_too_large","message":"Request exceeds the maximum allowed number of bytes. The maximum request size is 32 MB for standard API requests."}}"#,
        transport: None,
        reason: Reason::ContextOverflow,
        next: Stop,
        mark: NO_MARK,
        wait_ms: None,
        account_wide: None,
    },
    Sample {
        name: "anthropic_500_api_error",
        group: "anthropic",
        status: Some(500),
        headers: &[JSON],
        body: r#"{"type":"error","error":{"type":"api_error","message":"Internal server error"}}"#,
        transport: None,
        reason: Reason::ServerError,
        next: Rotate,
        mark: CooldownModel,
        wait_ms: None,
        account_wide: None,
    },
    // ─────────────────────────── Google Gemini ───────────────────────────
    Sample {
        // A per-minute, per-model free-tier quota (QuotaFailure + RetryInfo 37s). Gemini words it
        // like OpenAI's billing error, but RESOURCE_EXHAUSTED with a 37 s retry delay is a rate
        // limit (docs/rotation.md: resource_exhausted → rate_limit), not a billing failure.
        name: "gemini_429_resource_exhausted_retry_info",
        group: "gemini",
        status: Some(429),
        headers: &[("content-type", "application/json; charset=UTF-8"), ("server", "scaffolding on HTTPServer2")],
        body: r#"{
  "error": {
    "code": 429,
    "message": "You exceeded your current quota, please check your plan and billing details. For more information on this error, head to: https://ai.google.dev/gemini-api/docs/rate-limits.",
    "status": "RESOURCE_EXHAUSTED",
    "details": [
      {
        "@type": "type.googleapis.com/google.rpc.QuotaFailure",
        "violations": [
          {
            "quotaMetric": "generativelanguage.googleapis.com/generate_content_free_tier_requests",
            "quotaId": "GenerateRequestsPerMinutePerProjectPerModel-FreeTier",
            "quotaDimensions": {
              "location": "global",
              "model": "gemini-2.0-flash"
            },
            "quotaValue": "15"
          }
        ]
      },
      {
        "@type": "type.googleapis.com/google.rpc.Help",
        "links": [
          {
            "description": "Learn more about Gemini API quotas",
            "url": "https://ai.google.dev/gemini-api/docs/rate-limits"
          }
        ]
      },
      {
        "@type": "type.googleapis.com/google.rpc.RetryInfo",
        "retryDelay": "37s"
      }
    ]
  }
}"#,
        transport: None,
        reason: Reason::RateLimit,
        next: Rotate,
        mark: CooldownModel,
        wait_ms: Some(37_000),
        account_wide: None,
    },
    Sample {
        name: "gemini_429_resource_exhausted_legacy_wording",
        group: "gemini",
        status: Some(429),
        headers: &[("content-type", "application/json; charset=UTF-8")],
        body: r#"{
  "error": {
    "code": 429,
    "message": "Resource has been exhausted (e.g. check quota).",
    "status": "RESOURCE_EXHAUSTED"
  }
}"#,
        transport: None,
        reason: Reason::RateLimit,
        next: Rotate,
        mark: CooldownModel,
        wait_ms: None,
        account_wide: None,
    },
    Sample {
        name: "gemini_400_api_key_invalid",
        group: "gemini",
        status: Some(400),
        headers: &[("content-type", "application/json; charset=UTF-8")],
        body: r#"{
  "error": {
    "code": 400,
    "message": "API key not valid. Please pass a valid API key.",
    "status": "INVALID_ARGUMENT",
    "details": [
      {
        "@type": "type.googleapis.com/google.rpc.ErrorInfo",
        "reason": "API_KEY_INVALID",
        "domain": "googleapis.com",
        "metadata": {
          "service": "generativelanguage.googleapis.com"
        }
      },
      {
        "@type": "type.googleapis.com/google.rpc.LocalizedMessage",
        "locale": "en-US",
        "message": "API key not valid. Please pass a valid API key."
      }
    ]
  }
}"#,
        transport: None,
        reason: Reason::Auth,
        next: Rotate,
        mark: CooldownProfile,
        wait_ms: None,
        account_wide: None,
    },
    Sample {
        name: "gemini_403_permission_denied_unregistered_caller",
        group: "gemini",
        status: Some(403),
        headers: &[("content-type", "application/json; charset=UTF-8")],
        body: r#"{
  "error": {
    "code": 403,
    "message": "Method doesn't allow unregistered callers (callers without established identity). Please use API Key or other form of API consumer identity to call this API.",
    "status": "PERMISSION_DENIED"
  }
}"#,
        transport: None,
        reason: Reason::Auth,
        next: Rotate,
        mark: CooldownProfile,
        wait_ms: None,
        account_wide: None,
    },
    Sample {
        name: "gemini_403_permission_denied_consumer_suspended",
        group: "gemini",
        status: Some(403),
        headers: &[("content-type", "application/json; charset=UTF-8")],
        body: r#"{
  "error": {
    "code": 403,
    "message": "Permission denied: Consumer 'api_key:AIzaSyD-xxxxxxxxxxxxxxxxxxxxxxxxxxxxxx' has been suspended.",
    "status": "PERMISSION_DENIED",
    "details": [
      {
        "@type": "type.googleapis.com/google.rpc.ErrorInfo",
        "reason": "CONSUMER_SUSPENDED",
        "domain": "googleapis.com",
        "metadata": {
          "consumer": "projects/123456789012",
          "service": "generativelanguage.googleapis.com"
        }
      }
    ]
  }
}"#,
        transport: None,
        reason: Reason::AuthPermanent,
        next: Rotate,
        mark: Disabled,
        wait_ms: None,
        account_wide: None,
    },
    Sample {
        name: "gemini_403_service_disabled",
        group: "gemini",
        status: Some(403),
        headers: &[("content-type", "application/json; charset=UTF-8")],
        body: r#"{
  "error": {
    "code": 403,
    "message": "Generative Language API has not been used in project 123456789012 before or it is disabled. Enable it by visiting https://console.developers.google.com/apis/api/generativelanguage.googleapis.com/overview?project=123456789012 then retry. If you enabled this API recently, wait a few minutes for the action to propagate to our systems and retry.",
    "status": "PERMISSION_DENIED",
    "details": [
      {
        "@type": "type.googleapis.com/google.rpc.ErrorInfo",
        "reason": "SERVICE_DISABLED",
        "domain": "googleapis.com",
        "metadata": {
          "consumer": "projects/123456789012",
          "service": "generativelanguage.googleapis.com"
        }
      }
    ]
  }
}"#,
        transport: None,
        reason: Reason::AuthPermanent,
        next: Rotate,
        mark: Disabled,
        wait_ms: None,
        account_wide: None,
    },
    Sample {
        name: "gemini_404_model_not_found",
        group: "gemini",
        status: Some(404),
        headers: &[("content-type", "application/json; charset=UTF-8")],
        body: r#"{
  "error": {
    "code": 404,
    "message": "models/gemini-9 is not found for API version v1beta, or is not supported for generateContent. Call ListModels to see the list of available models and their supported methods.",
    "status": "NOT_FOUND"
  }
}"#,
        transport: None,
        reason: Reason::ModelNotFound,
        next: NextModel,
        mark: Model,
        wait_ms: None,
        account_wide: None,
    },
    Sample {
        name: "gemini_503_unavailable_model_overloaded",
        group: "gemini",
        status: Some(503),
        headers: &[("content-type", "application/json; charset=UTF-8")],
        body: r#"{
  "error": {
    "code": 503,
    "message": "The model is overloaded. Please try again later.",
    "status": "UNAVAILABLE"
  }
}"#,
        transport: None,
        reason: Reason::Overloaded,
        next: Rotate,
        mark: CooldownModel,
        wait_ms: None,
        account_wide: None,
    },
    Sample {
        name: "gemini_504_deadline_exceeded",
        group: "gemini",
        status: Some(504),
        headers: &[("content-type", "application/json; charset=UTF-8")],
        body: r#"{
  "error": {
    "code": 504,
    "message": "Deadline Exceeded",
    "status": "DEADLINE_EXCEEDED"
  }
}"#,
        transport: None,
        reason: Reason::Timeout,
        next: Rotate,
        mark: CooldownModel,
        wait_ms: None,
        account_wide: None,
    },
    Sample {
        name: "gemini_400_input_token_count_exceeds_maximum",
        group: "gemini",
        status: Some(400),
        headers: &[("content-type", "application/json; charset=UTF-8")],
        body: r#"{
  "error": {
    "code": 400,
    "message": "The input token count (1196265) exceeds the maximum number of tokens allowed (1048575).",
    "status": "INVALID_ARGUMENT"
  }
}"#,
        transport: None,
        reason: Reason::ContextOverflow,
        next: Stop,
        mark: NO_MARK,
        wait_ms: None,
        account_wide: None,
    },
    Sample {
        name: "gemini_400_invalid_json_payload",
        group: "gemini",
        status: Some(400),
        headers: &[("content-type", "application/json; charset=UTF-8")],
        body: r#"{
  "error": {
    "code": 400,
    "message": "Invalid JSON payload received. Unknown name \"foo\" at 'generation_config': Cannot find field.",
    "status": "INVALID_ARGUMENT",
    "details": [
      {
        "@type": "type.googleapis.com/google.rpc.BadRequest",
        "fieldViolations": [
          {
            "field": "generation_config",
            "description": "Invalid JSON payload received. Unknown name \"foo\" at 'generation_config': Cannot find field."
          }
        ]
      }
    ]
  }
}"#,
        transport: None,
        reason: Reason::Format,
        next: Stop,
        mark: NO_MARK,
        wait_ms: None,
        account_wide: None,
    },
    Sample {
        name: "gemini_500_internal",
        group: "gemini",
        status: Some(500),
        headers: &[("content-type", "application/json; charset=UTF-8")],
        body: r#"{
  "error": {
    "code": 500,
    "message": "An internal error has occurred. Please retry or report in https://developers.generativeai.google/guide/troubleshooting",
    "status": "INTERNAL"
  }
}"#,
        transport: None,
        reason: Reason::ServerError,
        next: Rotate,
        mark: CooldownModel,
        wait_ms: None,
        account_wide: None,
    },
    // ──────────────────────────── OpenRouter ────────────────────────────
    Sample {
        name: "openrouter_402_insufficient_credits",
        group: "openrouter",
        status: Some(402),
        headers: &[JSON],
        body: r#"{"error":{"message":"Insufficient credits. Add more using https://openrouter.ai/credits","code":402}}"#,
        transport: None,
        reason: Reason::Billing,
        next: Rotate,
        mark: Disabled,
        wait_ms: None,
        account_wide: Some(true),
    },
    Sample {
        name: "openrouter_402_requires_more_credits",
        group: "openrouter",
        status: Some(402),
        headers: &[JSON],
        body: r#"{"error":{"message":"This request requires more credits, or fewer max_tokens. You requested up to 8192 tokens, but can only afford 1733. To increase, visit https://openrouter.ai/settings/credits and upgrade to a paid account","code":402,"metadata":{"provider_name":null}},"user_id":"user_2abcDEF3ghiJKL4mnoPQR5stu"}"#,
        transport: None,
        reason: Reason::Billing,
        next: Rotate,
        mark: Disabled,
        wait_ms: None,
        account_wide: Some(true),
    },
    Sample {
        // X-RateLimit-Reset is Unix milliseconds: 1700000042000 - NOW_MS = 42 s.
        name: "openrouter_429_free_models_per_min_reset_unix_ms",
        group: "openrouter",
        status: Some(429),
        headers: &[
            JSON,
            ("X-RateLimit-Limit", "20"),
            ("X-RateLimit-Remaining", "0"),
            ("X-RateLimit-Reset", "1700000042000"),
        ],
        body: r#"{"error":{"message":"Rate limit exceeded: free-models-per-min. ","code":429,"metadata":{"headers":{"X-RateLimit-Limit":"20","X-RateLimit-Remaining":"0","X-RateLimit-Reset":"1700000042000"},"provider_name":null}},"user_id":"user_2abcDEF3ghiJKL4mnoPQR5stu"}"#,
        transport: None,
        reason: Reason::RateLimit,
        next: Rotate,
        mark: CooldownModel,
        wait_ms: Some(42_000),
        account_wide: Some(false),
    },
    Sample {
        // Daily free-model cap; resets at the next UTC midnight (2023-11-15T00:00:00Z).
        name: "openrouter_429_free_models_per_day_reset_midnight",
        group: "openrouter",
        status: Some(429),
        headers: &[
            JSON,
            ("X-RateLimit-Limit", "50"),
            ("X-RateLimit-Remaining", "0"),
            ("X-RateLimit-Reset", "1700006400000"),
        ],
        body: r#"{"error":{"message":"Rate limit exceeded: free-models-per-day. Add 10 credits to unlock 1000 free model requests per day","code":429,"metadata":{"headers":{"X-RateLimit-Limit":"50","X-RateLimit-Remaining":"0","X-RateLimit-Reset":"1700006400000"},"provider_name":null}},"user_id":"user_2abcDEF3ghiJKL4mnoPQR5stu"}"#,
        transport: None,
        reason: Reason::RateLimit,
        next: Rotate,
        mark: CooldownModel,
        wait_ms: Some(6_400_000),
        account_wide: Some(true),
    },
    Sample {
        name: "openrouter_400_relayed_upstream_request_failed",
        group: "openrouter",
        status: Some(400),
        headers: &[JSON],
        body: r#"{"error":{"message":"Upstream request failed","code":400}}"#,
        transport: None,
        reason: Reason::ServerError,
        next: Rotate,
        mark: CooldownModel,
        wait_ms: None,
        account_wide: None,
    },
    Sample {
        name: "openrouter_502_provider_returned_error",
        group: "openrouter",
        status: Some(502),
        headers: &[JSON],
        body: r#"{"error":{"message":"Provider returned error","code":502,"metadata":{"raw":"{\"error\":{\"message\":\"upstream connect error or disconnect/reset before headers. reset reason: connection termination\"}}","provider_name":"Together"}},"user_id":"user_2abcDEF3ghiJKL4mnoPQR5stu"}"#,
        transport: None,
        reason: Reason::ServerError,
        next: Rotate,
        mark: CooldownModel,
        wait_ms: None,
        account_wide: None,
    },
    Sample {
        name: "openrouter_408_request_timed_out",
        group: "openrouter",
        status: Some(408),
        headers: &[JSON],
        body: r#"{"error":{"message":"Your request timed out","code":408}}"#,
        transport: None,
        reason: Reason::Timeout,
        next: Rotate,
        mark: CooldownModel,
        wait_ms: None,
        account_wide: None,
    },
    Sample {
        name: "openrouter_401_no_auth_credentials",
        group: "openrouter",
        status: Some(401),
        headers: &[JSON],
        body: r#"{"error":{"message":"No auth credentials found","code":401}}"#,
        transport: None,
        reason: Reason::Auth,
        next: Rotate,
        mark: CooldownProfile,
        wait_ms: None,
        account_wide: None,
    },
    // ────────────────────────────── Ollama ──────────────────────────────
    Sample {
        name: "ollama_404_model_not_found_try_pulling",
        group: "ollama",
        status: Some(404),
        headers: &[("content-type", "application/json; charset=utf-8")],
        body: r#"{"error":"model \"llama9\" not found, try pulling it first"}"#,
        transport: None,
        reason: Reason::ModelNotFound,
        next: NextModel,
        mark: Model,
        wait_ms: None,
        account_wide: None,
    },
    Sample {
        name: "ollama_500_runner_terminated",
        group: "ollama",
        status: Some(500),
        headers: &[("content-type", "application/json; charset=utf-8")],
        body: r#"{"error":"llama runner process has terminated: exit status 2"}"#,
        transport: None,
        reason: Reason::ServerError,
        next: Rotate,
        mark: CooldownModel,
        wait_ms: None,
        account_wide: None,
    },
    Sample {
        name: "ollama_400_input_exceeds_context_length",
        group: "ollama",
        status: Some(400),
        headers: &[("content-type", "application/json; charset=utf-8")],
        body: r#"{"error":"input length exceeds maximum context length"}"#,
        transport: None,
        reason: Reason::ContextOverflow,
        next: Stop,
        mark: NO_MARK,
        wait_ms: None,
        account_wide: None,
    },
    Sample {
        name: "ollama_500_not_enough_memory",
        group: "ollama",
        status: Some(500),
        headers: &[("content-type", "application/json; charset=utf-8")],
        body: r#"{"error":"model requires more system memory (12.3 GiB) than is available (8.0 GiB)"}"#,
        transport: None,
        reason: Reason::ServerError,
        next: Rotate,
        mark: CooldownModel,
        wait_ms: None,
        account_wide: None,
    },
    // ───────────────────── Transport (no HTTP answer) ─────────────────────
    Sample {
        name: "transport_connection_refused",
        group: "transport",
        status: None,
        headers: &[],
        body: "",
        transport: Some(
            "error sending request for url (http://127.0.0.1:11434/api/chat): error trying to connect: tcp connect error: Connection refused (os error 111)",
        ),
        reason: Reason::Network,
        next: Rotate,
        mark: CooldownProfile,
        wait_ms: None,
        account_wide: None,
    },
    Sample {
        name: "transport_connection_reset_by_peer",
        group: "transport",
        status: None,
        headers: &[],
        body: "",
        transport: Some(
            "error sending request for url (https://api.openai.com/v1/chat/completions): connection error: Connection reset by peer (os error 104)",
        ),
        reason: Reason::Network,
        next: Rotate,
        mark: CooldownProfile,
        wait_ms: None,
        account_wide: None,
    },
    Sample {
        name: "transport_dns_lookup_failure",
        group: "transport",
        status: None,
        headers: &[],
        body: "",
        transport: Some(
            "error sending request for url (https://api.anthropic.com/v1/messages): error trying to connect: dns error: failed to lookup address information: Name or service not known",
        ),
        reason: Reason::Network,
        next: Rotate,
        mark: CooldownProfile,
        wait_ms: None,
        account_wide: None,
    },
    Sample {
        name: "transport_tls_handshake_eof",
        group: "transport",
        status: None,
        headers: &[],
        body: "",
        transport: Some(
            "error sending request for url (https://openrouter.ai/api/v1/chat/completions): error trying to connect: tls handshake eof",
        ),
        reason: Reason::Network,
        next: Rotate,
        mark: CooldownProfile,
        wait_ms: None,
        account_wide: None,
    },
    Sample {
        name: "transport_tls_invalid_peer_certificate",
        group: "transport",
        status: None,
        headers: &[],
        body: "",
        transport: Some(
            "error sending request for url (https://llm.internal.example/v1/chat/completions): error trying to connect: invalid peer certificate: UnknownIssuer",
        ),
        reason: Reason::Network,
        next: Rotate,
        mark: CooldownProfile,
        wait_ms: None,
        account_wide: None,
    },
    Sample {
        name: "transport_operation_timed_out",
        group: "transport",
        status: None,
        headers: &[],
        body: "",
        transport: Some(
            "error sending request for url (https://generativelanguage.googleapis.com/v1beta/models/gemini-2.0-flash:generateContent): operation timed out",
        ),
        reason: Reason::Timeout,
        next: Rotate,
        mark: CooldownModel,
        wait_ms: None,
        account_wide: None,
    },
    Sample {
        name: "transport_tcp_connect_timed_out",
        group: "transport",
        status: None,
        headers: &[],
        body: "",
        transport: Some(
            "error sending request for url (https://api.mistral.ai/v1/chat/completions): error trying to connect: tcp connect error: Connection timed out (os error 110)",
        ),
        reason: Reason::Timeout,
        next: Rotate,
        mark: CooldownModel,
        wait_ms: None,
        account_wide: None,
    },
    Sample {
        name: "transport_connection_closed_before_message_completed",
        group: "transport",
        status: None,
        headers: &[],
        body: "",
        transport: Some(
            "error sending request for url (http://10.0.0.5:8000/v1/chat/completions): connection closed before message completed",
        ),
        reason: Reason::Network,
        next: Rotate,
        mark: CooldownProfile,
        wait_ms: None,
        account_wide: None,
    },
    // ─────────────────── Other: proxies, OAuth, compat APIs ───────────────────
    Sample {
        name: "empty_200_body",
        group: "other",
        status: Some(200),
        headers: &[JSON, ("content-length", "0")],
        body: "",
        transport: None,
        reason: Reason::ServerError,
        next: Rotate,
        mark: CooldownModel,
        wait_ms: None,
        account_wide: None,
    },
    Sample {
        name: "html_502_bad_gateway_from_load_balancer",
        group: "other",
        status: Some(502),
        headers: &[("content-type", "text/html"), ("server", "cloudflare"), ("cf-ray", "8250b2f0cd2a1c3e-FRA")],
        body: "<html>\r\n<head><title>502 Bad Gateway</title></head>\r\n<body>\r\n<center><h1>502 Bad Gateway</h1></center>\r\n<hr><center>cloudflare</center>\r\n</body>\r\n</html>\r\n",
        transport: None,
        reason: Reason::ServerError,
        next: Rotate,
        mark: CooldownModel,
        wait_ms: None,
        account_wide: None,
    },
    Sample {
        name: "html_503_service_unavailable_from_elb",
        group: "other",
        status: Some(503),
        headers: &[("content-type", "text/html"), ("server", "awselb/2.0")],
        body: "<html>\r\n<head><title>503 Service Temporarily Unavailable</title></head>\r\n<body>\r\n<center><h1>503 Service Temporarily Unavailable</h1></center>\r\n</body>\r\n</html>\r\n",
        transport: None,
        reason: Reason::Overloaded,
        next: Rotate,
        mark: CooldownModel,
        wait_ms: None,
        account_wide: None,
    },
    Sample {
        name: "cloudflare_524_plain_text",
        group: "other",
        status: Some(524),
        headers: &[("content-type", "text/plain; charset=UTF-8"), ("server", "cloudflare")],
        body: "error code: 524",
        transport: None,
        reason: Reason::ServerError,
        next: Rotate,
        mark: CooldownModel,
        wait_ms: None,
        account_wide: None,
    },
    Sample {
        name: "oauth_refresh_invalid_grant_400",
        group: "other",
        status: Some(400),
        headers: &[JSON, ("cache-control", "no-store")],
        body: r#"{"error":"invalid_grant","error_description":"Invalid refresh token"}"#,
        transport: None,
        reason: Reason::AuthPermanent,
        next: Rotate,
        mark: Disabled,
        wait_ms: None,
        account_wide: None,
    },
    Sample {
        name: "google_oauth_refresh_invalid_grant_expired_or_revoked",
        group: "other",
        status: Some(400),
        headers: &[("content-type", "application/json; charset=utf-8")],
        body: r#"{
  "error": "invalid_grant",
  "error_description": "Token has been expired or revoked."
}"#,
        transport: None,
        reason: Reason::AuthPermanent,
        next: Rotate,
        mark: Disabled,
        wait_ms: None,
        account_wide: None,
    },
    Sample {
        // DeepSeek's out-of-balance answer: a 402 whose `code` is `invalid_request_error`.
        // docs/rotation.md: 402 is billing.
        name: "deepseek_402_insufficient_balance",
        group: "other",
        status: Some(402),
        headers: &[JSON],
        body: r#"{"error":{"message":"Insufficient Balance","type":"unknown_error","param":null,"code":"invalid_request_error"}}"#,
        transport: None,
        reason: Reason::Billing,
        next: Rotate,
        mark: Disabled,
        wait_ms: None,
        account_wide: None,
    },
    Sample {
        name: "mistral_429_requests_rate_limit_exceeded",
        group: "other",
        status: Some(429),
        headers: &[JSON, ("ratelimitbysize-limit", "500000"), ("ratelimitbysize-remaining", "0")],
        body: r#"{"object":"error","message":"Requests rate limit exceeded","type":"rate_limited","param":null,"code":"1300"}"#,
        transport: None,
        reason: Reason::RateLimit,
        next: Rotate,
        mark: CooldownModel,
        wait_ms: None,
        account_wide: Some(false),
    },
];

fn headers_of(s: &Sample) -> Vec<(String, String)> {
    s.headers.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

fn run(s: &Sample) -> Classified {
    let headers = headers_of(s);
    let seen = Observed {
        status: s.status,
        headers: &headers,
        body: s.body,
        transport: s.transport,
        echoed: Default::default(),
    };
    Classifier::default().classify(&seen, NOW_MS)
}

fn sample(name: &str) -> &'static Sample {
    SAMPLES.iter().find(|s| s.name == name).unwrap_or_else(|| panic!("no sample named `{name}` in the table"))
}

/// Every difference between what the classifier said and what the row expects.
fn mismatches(s: &Sample) -> Vec<String> {
    let out = run(s);
    let mut bad = Vec::new();
    if out.reason != s.reason {
        bad.push(format!("reason: expected {}, got {}", s.reason, out.reason));
    }
    if out.reason.next() != s.next {
        bad.push(format!("next: expected {:?}, got {:?}", s.next, out.reason.next()));
    }
    if out.reason.mark() != s.mark {
        bad.push(format!("mark: expected {:?}, got {:?}", s.mark, out.reason.mark()));
    }
    let wait = out.hint.map(|h| h.wait_ms);
    if wait != s.wait_ms {
        bad.push(format!("hint.wait_ms: expected {:?}, got {:?}", s.wait_ms, wait));
    }
    if let Some(want) = s.account_wide
        && out.account_wide != want
    {
        bad.push(format!("account_wide: expected {want}, got {}", out.account_wide));
    }
    if out.message.trim().is_empty() {
        bad.push("message: empty".to_string());
    }
    bad
}

#[test]
fn table_samples_classify_as_specified() {
    let failures: Vec<String> = SAMPLES
        .iter()
        .filter_map(|s| {
            let bad = mismatches(s);
            (!bad.is_empty()).then(|| format!("  {} [{}]: {}", s.name, s.group, bad.join("; ")))
        })
        .collect();
    assert!(
        failures.is_empty(),
        "{} of {} samples misclassified:\n{}",
        failures.len(),
        SAMPLES.len(),
        failures.join("\n")
    );
}

#[test]
fn table_rows_are_consistent_with_the_effect_table() {
    // Guards the table itself: the spelled-out next/mark of each row must be the effect of its
    // expected reason (docs/rotation.md), so a typo in a row cannot hide a classifier bug.
    let wrong: Vec<String> = SAMPLES
        .iter()
        .filter(|s| s.reason.next() != s.next || s.reason.mark() != s.mark)
        .map(|s| {
            format!(
                "  {}: {} is ({:?}, {:?}), row says ({:?}, {:?})",
                s.name,
                s.reason,
                s.reason.next(),
                s.reason.mark(),
                s.next,
                s.mark
            )
        })
        .collect();
    assert!(wrong.is_empty(), "rows whose effect does not match their reason:\n{}", wrong.join("\n"));
    for s in SAMPLES {
        assert_eq!(s.status.is_none(), s.transport.is_some(), "{}: exactly one of status / transport", s.name);
    }
}

#[test]
fn table_has_at_least_45_samples_covering_every_provider_group() {
    assert!(SAMPLES.len() >= 45, "only {} samples", SAMPLES.len());
    let mut names = BTreeSet::new();
    for s in SAMPLES {
        assert!(names.insert(s.name), "duplicate sample name `{}`", s.name);
        assert!(GROUPS.contains(&s.group), "{}: unknown group `{}`", s.name, s.group);
    }
    for g in GROUPS {
        let n = SAMPLES.iter().filter(|s| s.group == g).count();
        assert!(n >= 3, "provider group `{g}` has only {n} samples");
    }
    // Every reason an upstream answer can produce appears at least once.
    let seen: BTreeSet<Reason> = SAMPLES.iter().map(|s| s.reason).collect();
    for r in [
        Reason::ContextOverflow,
        Reason::Format,
        Reason::AuthPermanent,
        Reason::Auth,
        Reason::Billing,
        Reason::RateLimit,
        Reason::Overloaded,
        Reason::ServerError,
        Reason::Timeout,
        Reason::Network,
        Reason::ModelNotFound,
    ] {
        assert!(seen.contains(&r), "no sample expects `{r}`");
    }
}

// ───────────────────────── Named rules ─────────────────────────

fn assert_row(name: &str) -> Classified {
    let s = sample(name);
    let bad = mismatches(s);
    assert!(bad.is_empty(), "{name}: {}", bad.join("; "));
    run(s)
}

#[test]
fn openai_insufficient_quota_429_is_billing_not_rate_limit() {
    let out = assert_row("openai_429_insufficient_quota");
    assert_eq!(out.reason, Reason::Billing);
    assert_eq!(out.reason.mark(), Mark::Disabled);
    assert!(out.account_wide, "quota wording covers the whole account");
    assert!(out.message.starts_with("You exceeded your current quota"), "{}", out.message);
}

#[test]
fn openai_per_model_tpm_429_is_rate_limit_scoped_to_the_model() {
    let out = assert_row("openai_429_rate_limit_tokens_per_min");
    assert_eq!(out.reason, Reason::RateLimit);
    assert_eq!(out.reason.mark(), Mark::CooldownModel);
    assert!(!out.account_wide, "a tokens-per-min limit of one model is not account-wide");
    // The exhausted limit (tokens, remaining 0) gives the wait, not the 6 ms request reset.
    assert_eq!(out.hint.map(|h| h.wait_ms), Some(20_000));
}

#[test]
fn relayed_upstream_request_failed_400_is_server_error() {
    let out = assert_row("openrouter_400_relayed_upstream_request_failed");
    assert_eq!(out.reason, Reason::ServerError);
    assert_eq!(out.reason.next(), Next::Rotate);
    assert_eq!(out.message, "Upstream request failed");
}

#[test]
fn anthropic_prompt_too_long_is_context_overflow_no_failover() {
    let out = assert_row("anthropic_400_prompt_too_long");
    assert_eq!(out.reason, Reason::ContextOverflow);
    assert_eq!(out.reason.next(), Next::Stop);
    assert_eq!(out.reason.mark(), Mark::None);
    assert_eq!(out.message, "prompt is too long: 210000 tokens > 200000 maximum");
}

#[test]
fn anthropic_credit_balance_400_is_billing_not_format() {
    let out = assert_row("anthropic_400_credit_balance_too_low");
    assert_eq!(out.reason, Reason::Billing);
    assert_eq!(out.reason.next(), Next::Rotate);
    assert!(out.account_wide);
}

#[test]
fn anthropic_tool_use_id_mismatch_is_format_no_failover() {
    let out = assert_row("anthropic_400_tool_use_id_mismatch");
    assert_eq!(out.reason, Reason::Format);
    assert_eq!((out.reason.next(), out.reason.mark()), (Next::Stop, Mark::None));
}

#[test]
fn anthropic_overloaded_529_cools_the_model_and_rotates() {
    let out = assert_row("anthropic_529_overloaded_error");
    assert_eq!(out.reason, Reason::Overloaded);
    assert_eq!(out.reason.same_profile_retries(), 2);
    assert_eq!(out.message, "Overloaded");
}

#[test]
fn anthropic_unified_reset_is_an_account_wide_hint() {
    let out = assert_row("anthropic_429_unified_subscription_window");
    let hint = out.hint.expect("unified reset header is a hint");
    assert_eq!(hint.wait_ms, 3_600_000);
    assert!(hint.account_wide && out.account_wide);
}

#[test]
fn gemini_resource_exhausted_is_rate_limit_with_retry_info_delay() {
    let out = assert_row("gemini_429_resource_exhausted_retry_info");
    assert_eq!(out.reason, Reason::RateLimit);
    assert_eq!(out.hint.map(|h| h.wait_ms), Some(37_000));
}

#[test]
fn openrouter_reset_header_in_unix_ms_is_relative_to_now() {
    let out = assert_row("openrouter_429_free_models_per_min_reset_unix_ms");
    assert_eq!(out.hint.map(|h| h.wait_ms), Some(42_000));
}

#[test]
fn model_not_found_404_skips_to_the_next_model_for_every_provider() {
    for name in [
        "openai_404_model_not_found",
        "anthropic_404_not_found_model",
        "gemini_404_model_not_found",
        "ollama_404_model_not_found_try_pulling",
    ] {
        let out = assert_row(name);
        assert_eq!((out.reason.next(), out.reason.mark()), (Next::NextModel, Mark::Model), "{name}");
    }
}

#[test]
fn oauth_invalid_grant_disables_the_profile_permanently() {
    for name in ["oauth_refresh_invalid_grant_400", "google_oauth_refresh_invalid_grant_expired_or_revoked"] {
        let out = assert_row(name);
        assert_eq!(out.reason, Reason::AuthPermanent, "{name}");
        assert_eq!(out.reason.mark(), Mark::Disabled, "{name}");
    }
}

#[test]
fn transport_errors_are_network_or_timeout() {
    for s in SAMPLES.iter().filter(|s| s.group == "transport") {
        let out = assert_row(s.name);
        assert!(matches!(out.reason, Reason::Network | Reason::Timeout), "{}: {}", s.name, out.reason);
        assert_eq!(out.message, s.transport.unwrap(), "{}: the transport text is the message", s.name);
    }
}

#[test]
fn empty_200_is_server_error_with_a_readable_message() {
    let out = assert_row("empty_200_body");
    assert_eq!(out.reason, Reason::ServerError);
    assert_eq!(out.message, "HTTP 200 with an empty body");
}

// -- hostile input: text the client controls, wording outside its status, hints off their reason --

const HOSTILE_MODELS: [&str; 5] =
    ["billing", "insufficient_quota", "credit balance is too low", "revoked", "unauthorized"];

fn classify_echo(status: u16, body: &str, headers: &[(&str, &str)], echoed: &[&str]) -> Classified {
    let headers: Vec<(String, String)> = headers.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    let seen =
        Observed { status: Some(status), headers: &headers, body, transport: None, echoed: Echoed::strings(echoed) };
    Classifier::default().classify(&seen, NOW_MS)
}

#[test]
fn an_echoed_model_name_never_picks_its_own_classification() {
    for name in HOSTILE_MODELS {
        let echoed = [name, &format!("openai/{name}")];
        let not_found = format!(
            r#"{{"error":{{"message":"The model `{name}` does not exist or you do not have access to it.","type":"invalid_request_error","param":null,"code":"model_not_found"}}}}"#
        );
        let out = classify_echo(404, &not_found, &[], &echoed);
        assert_eq!((out.reason, out.account_wide), (Reason::ModelNotFound, false), "404 for model {name}");
        // Even without the client's model removed, no word overrides a 404.
        assert_eq!(classify_echo(404, &not_found, &[], &[]).reason, Reason::ModelNotFound, "{name}");
        let denied =
            format!(r#"{{"error":{{"message":"You do not have access to model {name}.","type":"permission_error"}}}}"#);
        let out = classify_echo(403, &denied, &[], &echoed);
        assert_eq!(
            (out.reason, out.account_wide),
            (Reason::Auth, false),
            "403 for model {name}: a cooldown step at most"
        );
        let throttled = format!(
            r#"{{"error":{{"message":"Rate limit reached for {name} on requests per min.","type":"requests"}}}}"#
        );
        let out = classify_echo(429, &throttled, &[], &echoed);
        assert_eq!((out.reason, out.account_wide), (Reason::RateLimit, false), "429 for model {name}");
    }
}

#[test]
fn a_model_named_like_a_reset_hint_sets_no_window() {
    let name = "try again in 6h";
    let body = format!(r#"{{"error":{{"message":"Rate limit reached for {name}.","type":"requests"}}}}"#);
    let out = classify_echo(429, &body, &[], &[name]);
    assert_eq!((out.reason, out.hint), (Reason::RateLimit, None));
}

#[test]
fn no_word_overrides_a_404() {
    for text in ["billing", "insufficient_quota", "revoked", "unauthorized", "rate limit", "overloaded", "timed out"] {
        let body = format!(r#"{{"error":{{"message":"route not found: {text}"}}}}"#);
        let out = classify_echo(404, &body, &[], &[]);
        assert_eq!(out.reason, Reason::Unknown, "404 saying {text:?}");
    }
}

#[test]
fn billing_and_permanent_auth_words_need_their_statuses() {
    let body = |m: &str| format!(r#"{{"error":{{"message":"{m}"}}}}"#);
    assert_eq!(classify_echo(400, &body("insufficient_quota for this request"), &[], &[]).reason, Reason::Format);
    assert_eq!(classify_echo(500, &body("billing service down"), &[], &[]).reason, Reason::ServerError);
    assert_eq!(classify_echo(429, &body("quota exceeded for the account"), &[], &[]).reason, Reason::Billing);
    assert_eq!(classify_echo(402, &body("payment required"), &[], &[]).reason, Reason::Billing);
    assert_eq!(classify_echo(400, &body("key revoked"), &[], &[]).reason, Reason::Format);
    assert_eq!(classify_echo(403, &body("key revoked"), &[], &[]).reason, Reason::AuthPermanent);
}

#[test]
fn a_401_saying_does_not_exist_is_the_keys_problem_not_the_models() {
    let body = r#"{"error":{"message":"API key does not exist","type":"invalid_request_error"}}"#;
    assert_eq!(classify_echo(401, body, &[], &[]).reason, Reason::Auth);
}

#[test]
fn timeout_wording_in_a_400_is_a_format_error() {
    let body = r#"{"error":{"message":"`timeout` must be a number","type":"invalid_request_error"}}"#;
    assert_eq!(classify_echo(400, body, &[], &[]).reason, Reason::Format);
}

#[test]
fn reset_hints_set_the_window_of_throttles_and_billing_only() {
    let hint = [("x-ratelimit-reset-requests", "120ms"), ("retry-after", "30")];
    let body = r#"{"error":{"message":"boom"}}"#;
    for (status, reason) in [(500, Reason::ServerError), (401, Reason::Auth), (408, Reason::Timeout)] {
        let out = classify_echo(status, body, &hint, &[]);
        assert_eq!((out.reason, out.hint), (reason, None), "{status}: the ladder applies");
    }
    for (status, reason) in [(429, Reason::RateLimit), (529, Reason::Overloaded), (402, Reason::Billing)] {
        let out = classify_echo(status, body, &hint, &[]);
        assert_eq!(out.reason, reason);
        assert!(out.hint.is_some(), "{status}: the provider's hint sets the window");
    }
}

/// One sample per trigger of docs/rotation.md (status rows and words), in the error shape of a provider
/// that sends it where one is known; `None` status: a transport error.
#[test]
fn every_spec_section_4_trigger_has_a_sample() {
    use Reason::*;
    let openai = |m: &str, t: &str| format!(r#"{{"error":{{"message":"{m}","type":"{t}","param":null,"code":null}}}}"#);
    let anthropic = |t: &str, m: &str| format!(r#"{{"type":"error","error":{{"type":"{t}","message":"{m}"}}}}"#);
    let cases: Vec<(&str, Option<u16>, String, Reason)> = vec![
        // context_overflow
        ("context_length_exceeded", Some(400), r#"{"error":{"message":"This model's maximum context length is 128000 tokens.","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}"#.into(), ContextOverflow),
        ("prompt is too long", Some(400), anthropic("invalid_request_error", "prompt is too long: 210000 tokens > 200000 maximum"), ContextOverflow),
        ("maximum context length", Some(400), openai("This model's maximum context length is 8192 tokens", "invalid_request_error"), ContextOverflow),
        ("request_too_large", Some(413), anthropic("request_too_large", "Request exceeds the maximum allowed number of bytes."), ContextOverflow),
        ("input is too long", Some(400), r#"{"message":"Input is too long for requested model."}"#.into(), ContextOverflow),
        // format
        ("400 invalid request", Some(400), openai("Invalid request: 'messages' is a required property", "invalid_request_error"), Format),
        ("422", Some(422), r#"{"detail":[{"loc":["body","messages"],"msg":"field required","type":"value_error.missing"}]}"#.into(), Format),
        ("malformed", Some(400), r#"{"error":"malformed JSON in request body"}"#.into(), Format),
        ("tool_use_id mismatch", Some(400), anthropic("invalid_request_error", "messages.2: `tool_use` ids were found without `tool_result` blocks immediately after: toolu_01. Each `tool_use` block must have a corresponding `tool_result` block (tool_use_id)."), Format),
        ("upstream request failed", Some(400), r#"{"error":{"message":"Upstream request failed","code":400}}"#.into(), ServerError),
        ("upstream error", Some(422), r#"{"error":{"message":"Upstream error from provider","code":422}}"#.into(), ServerError),
        // auth_permanent
        ("revoked", Some(401), openai("This API key has been revoked.", "invalid_request_error"), AuthPermanent),
        ("deactivated", Some(401), openai("Your account has been deactivated.", "invalid_request_error"), AuthPermanent),
        ("disabled", Some(403), openai("This organization has been disabled.", "invalid_request_error"), AuthPermanent),
        ("deleted", Some(401), openai("The API key was deleted.", "invalid_request_error"), AuthPermanent),
        ("violation of Terms of Service", Some(403), anthropic("permission_error", "This account has been suspended for violation of Terms of Service."), AuthPermanent),
        ("only authorized for use with", Some(400), anthropic("invalid_request_error", "This credential is only authorized for use with Claude Code and cannot be used for other API requests."), Auth),
        ("only authorized for use with (403)", Some(403), anthropic("permission_error", "This credential is only authorized for use with Claude Code."), AuthPermanent),
        ("invalid_grant", Some(400), r#"{"error":"invalid_grant","error_description":"refresh token revoked"}"#.into(), AuthPermanent),
        // auth
        ("401", Some(401), "{}".into(), Auth),
        ("403", Some(403), "{}".into(), Auth),
        ("authentication", Some(401), anthropic("authentication_error", "invalid x-api-key"), Auth),
        ("unauthorized", Some(401), r#"{"error":"Unauthorized"}"#.into(), Auth),
        ("invalid api key", Some(401), openai("Incorrect API key provided: sk-abc***. You can find your API key at https://platform.openai.com/account/api-keys.", "invalid_request_error"), Auth),
        ("expired token", Some(401), r#"{"error":{"message":"Expired token: the OAuth token has expired","type":"authentication_error"}}"#.into(), Auth),
        // billing
        ("402", Some(402), "{}".into(), Billing),
        ("billing", Some(403), openai("Billing hard limit has been reached.", "insufficient_quota"), Billing),
        ("payment required", Some(402), r#"{"error":{"message":"Payment Required","code":402}}"#.into(), Billing),
        ("insufficient credits", Some(402), r#"{"error":{"message":"Insufficient credits. Add more using https://openrouter.ai/credits","code":402}}"#.into(), Billing),
        ("credit balance", Some(400), anthropic("invalid_request_error", "Your credit balance is too low to access the Anthropic API."), Billing),
        ("insufficient_quota", Some(429), r#"{"error":{"message":"You exceeded your current quota, please check your plan and billing details.","type":"insufficient_quota","param":null,"code":"insufficient_quota"}}"#.into(), Billing),
        ("quota exceeded", Some(429), r#"{"error":{"message":"Monthly quota exceeded for this account","type":"quota_error"}}"#.into(), Billing),
        // rate_limit
        ("429", Some(429), "{}".into(), RateLimit),
        ("rate limit", Some(429), openai("Rate limit reached for gpt-4o in organization org-x on requests per min (RPM): Limit 500.", "requests"), RateLimit),
        ("too many requests", Some(429), r#"{"error":"Too Many Requests"}"#.into(), RateLimit),
        ("resource_exhausted", Some(429), r#"{"error":{"code":429,"message":"Resource has been exhausted (e.g. check quota).","status":"RESOURCE_EXHAUSTED"}}"#.into(), RateLimit),
        ("usage limit", Some(429), anthropic("rate_limit_error", "You have reached your usage limit for this period."), RateLimit),
        // overloaded
        ("503", Some(503), "{}".into(), Overloaded),
        ("529", Some(529), "{}".into(), Overloaded),
        ("overloaded", Some(200), anthropic("overloaded_error", "Overloaded"), Overloaded),
        ("capacity", Some(500), openai("The engine is currently at capacity. Please try again later.", "server_error"), Overloaded),
        // server_error
        ("other 5xx", Some(500), openai("The server had an error while processing your request.", "server_error"), ServerError),
        ("502", Some(502), "<html><body>502 Bad Gateway</body></html>".into(), ServerError),
        ("empty successful reply", Some(200), String::new(), ServerError),
        // timeout
        ("408", Some(408), "{}".into(), Timeout),
        ("504", Some(504), "{}".into(), Timeout),
        ("deadline exceeded", Some(504), r#"{"error":{"code":504,"message":"Deadline exceeded","status":"DEADLINE_EXCEEDED"}}"#.into(), Timeout),
        ("first-byte timeout", None, "operation timed out".into(), Timeout),
        ("ETIMEDOUT", None, "connect ETIMEDOUT 10.0.0.1:443".into(), Timeout),
        // network
        ("connection refused", None, "error sending request: tcp connect error: Connection refused (os error 111)".into(), Network),
        ("connection reset", None, "error reading a body from connection: Connection reset by peer (os error 104)".into(), Network),
        ("DNS failure", None, "error sending request: dns error: failed to lookup address information".into(), Network),
        ("TLS failure", None, "error sending request: invalid peer certificate: UnknownIssuer (tls)".into(), Network),
        // model_not_found
        ("404 + model", Some(404), r#"{"error":{"message":"The model `gpt-9` does not exist or you do not have access to it.","type":"invalid_request_error","param":null,"code":"model_not_found"}}"#.into(), ModelNotFound),
        ("model not found", Some(404), r#"{"error":"model 'llama9' not found, try pulling it first"}"#.into(), ModelNotFound),
        ("does not exist", Some(404), openai("The requested engine does not exist", "invalid_request_error"), ModelNotFound),
        ("unsupported model", Some(404), openai("Unsupported model: text-foo", "invalid_request_error"), ModelNotFound),
        // The status class decides first: a 400 or a 422 is the request's fault whatever it says,
        // and a 5xx always fails over.
        ("400 saying does not exist", Some(400), openai("Invalid parameter: tool_call_id call_9 does not exist", "invalid_request_error"), Format),
        ("400 saying capacity", Some(400), openai("Invalid value for 'capacity': overloaded", "invalid_request_error"), Format),
        ("400 saying rate limit", Some(400), openai("Unrecognized request argument supplied: rate_limit", "invalid_request_error"), Format),
        ("422 saying too many requests", Some(422), r#"{"detail":[{"msg":"too many requests in field","type":"value_error"}]}"#.into(), Format),
        ("502 saying malformed", Some(502), openai("Received malformed response from upstream", "server_error"), ServerError),
        ("500 typed invalid_request_error", Some(500), openai("Something went wrong", "invalid_request_error"), ServerError),
        // unknown
        ("anything else", Some(418), r#"{"error":"I'm a teapot"}"#.into(), Unknown),
    ];
    let mut wrong = Vec::new();
    for (trigger, status, text, want) in &cases {
        let seen = match status {
            Some(_) => Observed { status: *status, body: text, ..Default::default() },
            None => Observed { transport: Some(text), ..Default::default() },
        };
        let got = Classifier::default().classify(&seen, NOW_MS).reason;
        if got != *want {
            wrong.push(format!("  {trigger} ({status:?}): expected {want}, got {got}"));
        }
    }
    assert!(
        wrong.is_empty(),
        "{} of {} classification table samples misclassified:\n{}",
        wrong.len(),
        cases.len(),
        wrong.join("\n")
    );
}
