//! Client text is never evidence (docs/rotation.md, "Trust"): whatever a client puts in its
//! request, an upstream that repeats it in an error cannot make rota disable an account, cool a
//! whole profile, cool anything past the ladder's first step, or keep a 5xx from failing over.
//!
//! The upstreams' error formats are recorded from the providers (the bodies they send for an
//! unknown parameter, an extra input, an unknown field, a missing model, and a relay's failure),
//! with the place where each repeats the client's text.

use proptest::prelude::*;
use proptest::test_runner::Config as ProptestConfig;
use rota_engine::classify::{Classifier, Echoed, Observed, default_rules};
use rota_engine::{CooldownPolicy, Failure, Millis, Next, UsageStats};
use serde_json::{Map, Value, json};

const NOW: Millis = 1_700_000_000_000;

/// An upstream's error answer: its status and body, `{echo}` where it repeats the client's text
/// (JSON-escaped there).
struct Recorded {
    name: &'static str,
    statuses: &'static [u16],
    body: &'static str,
}

/// The error formats that repeat what the client sent.
const RECORDED: &[Recorded] = &[
    // OpenAI (and Azure OpenAI) name an unknown body field.
    Recorded {
        name: "openai unknown parameter",
        statuses: &[400],
        body: r#"{"error":{"message":"Unrecognized request argument supplied: {echo}","type":"invalid_request_error","param":null,"code":null}}"#,
    },
    Recorded {
        name: "azure openai unknown parameter",
        statuses: &[400],
        body: r#"{"error":{"code":"BadRequest","message":"Unrecognized request argument supplied: {echo}","param":null,"type":"invalid_request_error"}}"#,
    },
    // Anthropic names an input its schema does not know.
    Recorded {
        name: "anthropic extra inputs",
        statuses: &[400],
        body: r#"{"type":"error","error":{"type":"invalid_request_error","message":"{echo}: Extra inputs are not permitted"}}"#,
    },
    // Gemini names an unknown field of the JSON payload.
    Recorded {
        name: "gemini unknown name",
        statuses: &[400],
        body: r#"{"error":{"code":400,"message":"Invalid JSON payload received. Unknown name \"{echo}\": Cannot find field.","status":"INVALID_ARGUMENT","details":[{"@type":"type.googleapis.com/google.rpc.BadRequest","fieldViolations":[{"description":"Invalid JSON payload received. Unknown name \"{echo}\": Cannot find field."}]}]}}"#,
    },
    // vLLM's OpenAI server: pydantic's error list, as a string.
    Recorded {
        name: "vllm extra forbidden",
        statuses: &[400],
        body: r#"{"object":"error","message":"[{'type': 'extra_forbidden', 'loc': ('body', '{echo}'), 'msg': 'Extra inputs are not permitted', 'input': 1}]","type":"BadRequestError","param":null,"code":400}"#,
    },
    // A FastAPI server's validation error.
    Recorded {
        name: "fastapi validation",
        statuses: &[422],
        body: r#"{"detail":[{"type":"extra_forbidden","loc":["body","{echo}"],"msg":"Extra inputs are not permitted","input":"{echo}"}]}"#,
    },
    // OpenAI's missing model, repeating the name asked for.
    Recorded {
        name: "openai model not found",
        statuses: &[404],
        body: r#"{"error":{"message":"The model `{echo}` does not exist or you do not have access to it.","type":"invalid_request_error","param":null,"code":"model_not_found"}}"#,
    },
    // Relays (OpenRouter, LiteLLM's proxy) pass their upstream's failure on, request and all.
    Recorded {
        name: "relayed upstream failure",
        statuses: &[500, 502, 503, 529],
        body: r#"{"error":{"message":"Upstream error from provider: {echo}","code":502,"metadata":{"raw":"{echo}"}}}"#,
    },
    Recorded {
        name: "litellm bad gateway",
        statuses: &[500, 502, 503],
        body: r#"{"error":{"message":"litellm.BadGatewayError: Received malformed response from upstream for request {echo}","type":null,"param":null,"code":"502"}}"#,
    },
    Recorded {
        name: "server error naming the request",
        statuses: &[500, 502, 503, 504, 529],
        body: r#"{"error":{"message":"The server had an error processing {echo}","type":"invalid_request_error"}}"#,
    },
];

/// Every trigger word of the classification table, and every way of wording a reset hint.
fn triggers() -> Vec<String> {
    let mut words: Vec<String> = default_rules().into_iter().flat_map(|r| r.any).collect();
    words.extend(
        [
            "try again in 6h",
            "Please try again in 20s.",
            "retry after 7200 seconds",
            "Retry-After: 21600",
            "retry-after-ms: 86400000",
            "rate limit reached, try again in 6h",
            "quota exceeded, resets at 2031-01-01T00:00:00Z",
            "Your credit balance is too low; try again in 5 hours",
            "retryDelay: 86400s",
            "insufficient_quota: billing hard limit reached",
            "account deactivated (terms of service)",
            "overloaded, please retry in 3600s",
        ]
        .map(str::to_string),
    );
    words.sort();
    words.dedup();
    words
}

/// Where the client puts the trigger.
#[derive(Clone, Copy, Debug)]
enum Place {
    Model,
    FieldName,
    FieldValue,
    Message,
    ToolName,
    Metadata,
    Header,
}

const PLACES: [Place; 7] = [
    Place::Model,
    Place::FieldName,
    Place::FieldValue,
    Place::Message,
    Place::ToolName,
    Place::Metadata,
    Place::Header,
];

/// The request a client sends with `text` at `place`: its JSON body and its header values.
fn request(place: Place, text: &str) -> (Map<String, Value>, Vec<String>) {
    let mut body = json!({
        "model": "gpt-4.1",
        "messages": [{"role": "user", "content": "hello"}],
        "tools": [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}],
    });
    let mut headers = vec!["application/json".to_string(), "Bearer rk_test".to_string()];
    match place {
        Place::Model => body["model"] = json!(text),
        Place::FieldName => body[text] = json!(true),
        Place::FieldValue => body["temperature_mode"] = json!(text),
        Place::Message => body["messages"][0]["content"] = json!(format!("Tell me: {text}")),
        Place::ToolName => body["tools"][0]["function"]["name"] = json!(text),
        Place::Metadata => body["metadata"] = json!({"note": text}),
        Place::Header => headers.push(text.to_string()),
    }
    let Value::Object(body) = body else { unreachable!() };
    (body, headers)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2048, failure_persistence: None, ..ProptestConfig::default() })]

    /// An upstream repeating the client's own text, in any recorded format and status (400,
    /// 404, 422, 5xx), with the text anywhere in the request, and repeating all of it or only
    /// a part: never a disabled lane, never a profile-wide window, never a window longer than
    /// the ladder's first step, and every 5xx fails over.
    #[test]
    fn client_text_repeated_by_an_upstream_never_disables_widens_or_lengthens_a_window(
        trigger in proptest::sample::select(triggers()),
        place in proptest::sample::select(PLACES.to_vec()),
        recorded in 0..RECORDED.len(),
        status_pick in any::<proptest::sample::Index>(),
        part in prop_oneof![Just(None), (0usize..8, 8usize..64).prop_map(Some)],
    ) {
        let r = &RECORDED[recorded];
        let status = *status_pick.get(r.statuses);
        let (body, headers) = request(place, &trigger);
        // What the upstream repeats: the client's text whole, or a part of it (cut as relays do).
        let said: String = match part {
            Some((from, len)) if trigger.len() > from + 8 => trigger.chars().skip(from).take(len).collect(),
            _ => trigger.clone(),
        };
        let escaped = serde_json::to_string(&said).unwrap();
        let answer = r.body.replace("{echo}", &escaped[1..escaped.len() - 1]);
        let model = body.get("model").and_then(Value::as_str).unwrap_or("").to_string();
        let mut strings: Vec<&str> = vec![model.as_str(), "gpt-4.1"];
        strings.extend(headers.iter().map(String::as_str));
        let seen = Observed {
            status: Some(status),
            headers: &[],
            body: &answer,
            transport: None,
            echoed: Echoed { strings: &strings, body: Some(&body) },
        };
        let class = Classifier::default().classify(&seen, NOW);
        let policy = CooldownPolicy::default();
        let mut stats = UsageStats::default();
        let failure = Failure {
            reason: class.reason,
            model: "gpt-4.1".into(),
            hint_ms: class.hint.map(|h| h.wait_ms),
            account_wide: class.account_wide,
            started_at: NOW,
            claim: false,
        };
        stats.record_failure(&failure, NOW, &policy);
        let what = format!("{} ({status}) repeating {said:?} placed at {place:?}: {class:?}", r.name);
        prop_assert!(stats.disabled.is_none(), "disabled lane: {}", what);
        prop_assert!(stats.cooldowns.iter().all(|c| c.model.is_some()), "profile-wide window: {}", what);
        let first_step = policy.ladder(1);
        prop_assert!(stats.cooldowns.iter().all(|c| c.until - NOW <= first_step), "window past the first step: {}", what);
        if status >= 500 {
            prop_assert_ne!(class.reason.next(), Next::Stop, "a 5xx that does not fail over: {}", what);
        }
    }
}

/// The property's recorded formats classify as the providers' documentation says when they
/// repeat nothing that matters (a plain field name): the status class alone.
#[test]
fn the_recorded_formats_alone_classify_by_their_status() {
    for r in RECORDED {
        for &status in r.statuses {
            let answer = r.body.replace("{echo}", "temperature_mode");
            let seen = Observed { status: Some(status), body: &answer, ..Default::default() };
            let reason = Classifier::default().classify(&seen, NOW).reason;
            let want = match status {
                400 | 422 => "format",
                404 => "model_not_found",
                503 | 529 => "overloaded",
                504 => "timeout",
                _ => "server_error",
            };
            assert_eq!(reason.to_string(), want, "{} ({status})", r.name);
        }
    }
}
