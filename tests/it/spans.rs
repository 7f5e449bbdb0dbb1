//! The gateway's tracing (docs/gateway.md): one `attempt` span per upstream call, named by its
//! provider, model, profile and number in the request; a committed stream's relay inside the
//! request's span, so what it logs carries the request id; and no secret in any span or line.
//!
//! Captured in-process: the test's runtime is tokio's current-thread one, so rota's tasks (the
//! server, each request, the relay) run on the test's thread, under a subscriber set for that
//! thread only (the other tests of the binary run on threads of their own).
//!
//! tracing caches whether a callsite is enabled once for the process, when it is first
//! reached. While a single dispatcher is registered, that asks only the default of the thread
//! that reached it: a span first reached by another test's request would be cached as never
//! enabled, here too. A second dispatcher registered for the test's time (`NoSubscriber`) makes
//! every callsite ask both, and each thread's own subscriber decide.

use crate::support::{self, KEYS, Mock, Reply, Scenario, spawn};
use parking_lot::Mutex;
use serde_json::json;
use std::sync::Arc;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id};
use tracing::{Event, Subscriber};
use tracing_subscriber::Layer;
use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::fmt::format::FmtSpan;
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

/// A span's or an event's fields, as `name=value`.
#[derive(Clone, Debug, Default)]
struct Fields(Vec<String>);

impl Fields {
    fn has(&self, name: &str, value: &str) -> bool {
        self.0.contains(&format!("{name}={value}"))
    }
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.push(format!("{}={value}", field.name()));
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.push(format!("{}={value:?}", field.name()));
    }
}

/// A span as it opened: its name and fields, and its ancestors', nearest first (read as it
/// opens: the registry gives a closed span's id to the next one).
#[derive(Clone, Debug)]
struct Opened {
    name: &'static str,
    fields: Fields,
    ancestors: Vec<(&'static str, Fields)>,
}

/// What rota traced: every span as it opened, and every event's fields.
#[derive(Clone, Default)]
struct Traced {
    spans: Arc<Mutex<Vec<Opened>>>,
    events: Arc<Mutex<Vec<Fields>>>,
}

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Traced {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let mut fields = Fields::default();
        attrs.record(&mut fields);
        let Some(span) = ctx.span(id) else { return };
        let of = |s: &tracing_subscriber::registry::SpanRef<'_, S>| s.extensions().get::<Fields>().cloned();
        let ancestors = span.scope().skip(1).map(|s| (s.name(), of(&s).unwrap_or_default())).collect();
        span.extensions_mut().insert(fields.clone());
        self.spans.lock().push(Opened { name: attrs.metadata().name(), fields, ancestors });
    }

    fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
        let mut fields = Fields::default();
        event.record(&mut fields);
        self.events.lock().push(fields);
    }
}

/// What the formatting layer wrote: the log lines as rota's stderr would show them.
#[derive(Clone, Default)]
struct Written(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Written {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A profile named after an email is in a span as `/metrics` labels it: hashed.
#[tokio::test(flavor = "current_thread")]
async fn an_attempt_span_names_a_profile_as_metrics_do() {
    let traced = Traced::default();
    let subscriber = tracing_subscriber::registry().with(LevelFilter::DEBUG).with(traced.clone());
    let _second = tracing::Dispatch::new(tracing::subscriber::NoSubscriber::default());
    let _traced = tracing::subscriber::set_default(subscriber);
    let (_mock, base) = Mock::started().await;
    let keys = [("openai:ops@example.com", "sk-test-email-named-0009")];
    let rota = spawn(Scenario { config: &support::config(&base), keys: &keys, ..Scenario::default() }).await;
    assert_eq!(rota.chat(support::chat(), &[]).await.status(), 200);
    let label = rota::metrics::profile_label(&keys[0].0.parse().unwrap());
    let spans = traced.spans.lock().clone();
    let attempt = spans.iter().find(|s| s.name == "attempt").expect("an attempt span");
    assert!(attempt.fields.has("profile", &label), "{attempt:?}");
    assert!(!format!("{spans:?}").contains("ops@example.com"), "no email in a span");
}

/// A streamed request whose first profile fails before the stream's first event and whose
/// second serves it: two attempt spans, the second one's relay within it, and the keys of both
/// profiles nowhere in what was traced.
#[tokio::test(flavor = "current_thread")]
async fn each_upstream_call_has_an_attempt_span_and_the_relay_runs_in_the_requests_span() {
    let traced = Traced::default();
    let written = Written::default();
    let lines = written.clone();
    let subscriber = tracing_subscriber::registry().with(LevelFilter::DEBUG).with(traced.clone()).with(
        tracing_subscriber::fmt::layer()
            .with_writer(move || lines.clone())
            .with_ansi(false)
            .with_span_events(FmtSpan::NEW),
    );
    let _second = tracing::Dispatch::new(tracing::subscriber::NoSubscriber::default());
    let _traced = tracing::subscriber::set_default(subscriber);

    let (mock, base) = Mock::started().await;
    let rota = spawn(Scenario { config: &support::config(&base), keys: &KEYS[..2], ..Scenario::default() }).await;
    mock.script(KEYS[0].1, vec![Reply::StreamErrorFirst]);
    let mut body = support::chat();
    body["stream"] = json!(true);
    let r = rota.chat(body, &[]).await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["x-rota-profile"], KEYS[1].0);
    let id = r.headers()["x-request-id"].to_str().unwrap().to_string();
    let text = r.text().await.unwrap();
    assert!(text.ends_with("data: [DONE]\n\n"), "the relay forwarded the whole stream: {text}");

    let spans = traced.spans.lock().clone();
    let in_request = |s: &&Opened| s.ancestors.iter().any(|(name, f)| *name == "request" && f.has("request_id", &id));
    let attempts: Vec<&Opened> = spans.iter().filter(|s| s.name == "attempt").filter(in_request).collect();
    let named = |s: &Opened| {
        ["provider", "model", "profile", "n"]
            .map(|k| s.fields.0.iter().find(|f| f.starts_with(&format!("{k}="))).cloned())
    };
    let described: Vec<_> = attempts.iter().map(|s| named(s)).collect();
    let expected = |profile: &str, n: u32| {
        ["provider=openai", "model=gpt-4.1", &format!("profile={profile}"), &format!("n={n}")]
            .map(|f| Some(f.to_string()))
    };
    assert_eq!(described, [expected(KEYS[0].0, 1), expected(KEYS[1].0, 2)], "one span per upstream call: {spans:#?}");
    for attempt in &attempts {
        assert_eq!(attempt.fields.0.len(), 4, "only the provider, model, profile and number: {attempt:?}");
    }

    let relays: Vec<&Opened> = spans.iter().filter(|s| s.name == "relay").filter(in_request).collect();
    assert_eq!(relays.len(), 1, "the committed stream's relay, in the request's span: {spans:#?}");
    let (parent, of) = &relays[0].ancestors[0];
    assert!(*parent == "attempt" && of.has("profile", KEYS[1].0), "within the attempt that committed: {relays:?}");
    let out = String::from_utf8(written.0.lock().clone()).unwrap();
    let relay_lines: Vec<&str> = out.lines().filter(|l| l.contains(":relay:")).collect();
    assert!(!relay_lines.is_empty(), "the relay's span opened: {out}");
    for line in relay_lines {
        assert!(line.contains(&format!("request_id={id}")), "the relay's log carries the request id: {line}");
    }

    let events = format!("{:?}", traced.events.lock());
    let spans = format!("{spans:?}");
    for (profile, secret) in &KEYS[..2] {
        for (what, traced) in [("the log lines", &out), ("a span", &spans), ("an event", &events)] {
            assert!(!traced.contains(secret), "{profile}'s key in {what}: {traced}");
        }
    }
}
