//! Micro-benchmarks of the engine (divan): ordering 10 to 10,000 profiles (whole, and the
//! first usable ones through the rotation index, with a use moving one to the end), the index's
//! update per mark, classifying a provider error (alone, and beside a 100 KB request), one whole
//! failover decision, and reading the remaining quota of an answer.
//! `cargo bench -p rota-engine`.

use rota_engine::classify::{Classifier, Echoed, Observed};
use rota_engine::order::{OrderRequest, Rotation, RotationIndex, order};
use rota_engine::{CooldownPolicy, Failure, ProfileId, ProfileType, ProfileView, UsageStats, Views};

const NOW: i64 = 1_800_000_000_000;

fn main() {
    divan::main();
}

/// `n` API-key profiles of one provider, used at different times; every tenth one cooling.
fn profiles(n: usize) -> (Vec<ProfileId>, Views) {
    let ids: Vec<ProfileId> = (0..n).map(|i| format!("openai:key-{i:05}").parse().unwrap()).collect();
    let mut views = Views::with_capacity_and_hasher(n, Default::default());
    for (i, id) in ids.iter().enumerate() {
        let mut stats = UsageStats { last_used: Some(NOW - ((i * 7919) % 100_000) as i64), ..Default::default() };
        if i % 10 == 0 {
            let f = Failure {
                reason: rota_engine::Reason::RateLimit,
                model: "gpt-4.1".into(),
                hint_ms: None,
                account_wide: false,
                started_at: NOW - 1,
                claim: false,
            };
            stats.record_failure(&f, NOW - 1, &CooldownPolicy::default());
        }
        views.insert(
            id.clone(),
            ProfileView {
                id: id.clone(),
                kind: ProfileType::ApiKey,
                enabled: true,
                has_secret: true,
                expires_at: None,
                stats,
            },
        );
    }
    (ids, views)
}

fn request<'a>(ids: &'a [ProfileId]) -> OrderRequest<'a> {
    OrderRequest {
        provider: "openai",
        model: "gpt-4.1",
        now: NOW,
        stored_order: None,
        config_order: None,
        configured: &[],
        stored: ids,
        rotation: Rotation::Lru,
        sticky: None,
        pin: None,
        quota_floor: Default::default(),
    }
}

#[divan::bench(args = [10, 100, 1_000, 10_000])]
fn order_profiles(bencher: divan::Bencher, n: usize) {
    let (ids, views) = profiles(n);
    bencher.bench_local(|| order(divan::black_box(&request(&ids)), divan::black_box(&views)).unwrap());
}

/// What a request does on the hot path: the first 8 usable profiles from the rotation index,
/// then the first one used (moved to the end of the rotation).
#[divan::bench(args = [10, 100, 1_000, 10_000])]
fn first_usable_from_the_index(bencher: divan::Bencher, n: usize) {
    let (ids, mut views) = profiles(n);
    let mut index = RotationIndex::new(&ids, &views, Rotation::Lru);
    let mut now = NOW;
    bencher.bench_local(|| {
        let first = index.first(divan::black_box(("openai", "gpt-4.1")), NOW, &views, &[], (8, Default::default()));
        now += 1;
        if let Some(v) = views.get_mut(&first[0]) {
            v.stats.mark_used(now);
        }
        index.touch(&first[0], &views);
        first
    });
}

/// The index's cost per mark: one profile is used (its last use moves on) and its key is
/// moved in the index, a different profile each time.
#[divan::bench(args = [10, 100, 1_000, 10_000])]
fn index_update_per_mark(bencher: divan::Bencher, n: usize) {
    let (ids, mut views) = profiles(n);
    let mut index = RotationIndex::new(&ids, &views, Rotation::Lru);
    let (mut now, mut i) = (NOW, 0);
    bencher.bench_local(|| {
        now += 1;
        i = (i + 7919) % n;
        if let Some(v) = views.get_mut(&ids[i]) {
            v.stats.mark_used(now);
        }
        index.touch(divan::black_box(&ids[i]), &views);
    });
}

const BODY: &str = r#"{"error":{"message":"Rate limit reached for gpt-4.1 in organization org-x on requests per min (RPM): Limit 500, Used 500. Please try again in 1.2s.","type":"requests","code":"rate_limit_exceeded"}}"#;

fn headers() -> Vec<(String, String)> {
    vec![
        ("content-type".into(), "application/json".into()),
        ("retry-after".into(), "2".into()),
        ("x-ratelimit-remaining-requests".into(), "0".into()),
        ("x-ratelimit-reset-requests".into(), "1.2s".into()),
    ]
}

/// The 429 of `BODY` with `headers`, `echoed` the client's text.
fn limited<'a>(headers: &'a [(String, String)], echoed: Echoed<'a>) -> Observed<'a> {
    Observed { status: Some(429), headers, body: BODY, transport: None, echoed }
}

#[divan::bench]
fn classify_429(bencher: divan::Bencher) {
    let classifier = Classifier::with_overrides(vec![]);
    let headers = headers();
    bencher.bench_local(|| {
        let seen = limited(&headers, Echoed::strings(&["gpt-4.1"]));
        classifier.classify(divan::black_box(&seen), NOW)
    });
}

/// The same 429 with what a coding agent sends beside it: a request body of about 100 KB (a
/// system prompt, files read, tool results), every string of which the answer's text is
/// checked against before a rule reads it.
#[divan::bench]
fn classify_429_of_a_100_kb_request(bencher: divan::Bencher) {
    let classifier = Classifier::with_overrides(vec![]);
    let headers = headers();
    let line = "fn main() { let config = load(\"rota.toml\")?; serve(config).await } // the gateway's entry\n";
    let messages: Vec<serde_json::Value> = (0..50)
        .map(|i| serde_json::json!({"role": if i % 2 == 0 { "user" } else { "assistant" }, "content": line.repeat(22)}))
        .collect();
    let body = serde_json::json!({"model": "gpt-4.1", "stream": true, "messages": messages});
    let body = body.as_object().unwrap();
    assert!(serde_json::to_string(body).unwrap().len() > 100_000);
    bencher.bench_local(|| {
        let seen = limited(&headers, Echoed { strings: &["gpt-4.1"], body: Some(body) });
        classifier.classify(divan::black_box(&seen), NOW)
    });
}

/// One failover decision: classify the 429, record it on the profile, order the provider's
/// 100 profiles again for the next attempt.
#[divan::bench]
fn failover_decision(bencher: divan::Bencher) {
    let classifier = Classifier::with_overrides(vec![]);
    let headers = headers();
    let (ids, views) = profiles(100);
    let policy = CooldownPolicy::default();
    bencher.bench_local(|| {
        let seen = limited(&headers, Echoed::strings(&["gpt-4.1"]));
        let class = classifier.classify(&seen, NOW);
        let mut stats = views[&ids[1]].stats.clone();
        let f = Failure {
            reason: class.reason,
            model: "gpt-4.1".into(),
            hint_ms: class.hint.map(|h| h.wait_ms),
            account_wide: class.account_wide,
            started_at: NOW,
            claim: false,
        };
        stats.record_failure(&f, NOW, &policy);
        order(&request(&ids), divan::black_box(&views)).unwrap()
    });
}

/// Rotate before the 429: reading the quota of an OpenAI answer's headers (what every answer
/// of such a provider costs the gateway).
#[divan::bench]
fn read_quota_of_an_answer(bencher: divan::Bencher) {
    let headers: Vec<(&str, &str)> = vec![
        ("date", "Wed, 02 Dec 2026 07:00:00 GMT"),
        ("content-type", "application/json"),
        ("openai-organization", "org-x"),
        ("openai-processing-ms", "412"),
        ("openai-version", "2020-10-01"),
        ("x-ratelimit-limit-requests", "10000"),
        ("x-ratelimit-limit-tokens", "2000000"),
        ("x-ratelimit-remaining-requests", "9999"),
        ("x-ratelimit-remaining-tokens", "1999984"),
        ("x-ratelimit-reset-requests", "6ms"),
        ("x-ratelimit-reset-tokens", "0s"),
        ("x-request-id", "req_0123456789abcdef"),
        ("cf-cache-status", "DYNAMIC"),
    ];
    bencher.bench_local(|| {
        rota_engine::quota::read(
            divan::black_box(headers.iter().copied()),
            &[rota_engine::quota::Family::Openai],
            "gpt-4.1",
            NOW,
            21_600_000,
        )
    });
}
