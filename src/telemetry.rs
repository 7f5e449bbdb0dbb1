//! Traces (docs/operations.md, "Traces"). With `[telemetry] otlp_endpoint`, `rota serve`
//! exports its `request` and `attempt` spans over OTLP/HTTP (protobuf) through the
//! `opentelemetry` SDK's batch processor, which runs on its own thread and hands each post to the
//! server's runtime. A client's `traceparent` makes its request a child of the client's trace, and
//! each upstream call carries the attempt's. Off (the default), the request path pays one load of
//! a flag.

use crate::store::{AttemptRow, Outcome};
use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_http::{Bytes, HeaderExtractor, HeaderInjector, HttpClient, HttpError, Request, Response};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tracing::Subscriber;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::Layer;
use tracing_subscriber::registry::LookupSpan;

static ON: AtomicBool = AtomicBool::new(false);

/// A post's limit, the collector's answer included.
const POST_TIMEOUT: Duration = Duration::from_secs(10);

/// Whether spans are exported.
pub fn on() -> bool {
    ON.load(Ordering::Relaxed)
}

/// The exporter, until `shutdown` sends the spans still batched.
pub struct Traces(SdkTracerProvider);

impl Traces {
    pub fn shutdown(self) {
        if let Err(e) = self.0.shutdown() {
            tracing::warn!(error = %e, "the last spans were not exported");
        }
    }
}

/// The layer exporting rota's `request` and `attempt` spans to `url` (the collector's
/// `/v1/traces`), posting on `runtime`; every other span and event stays out of it.
pub fn layer<S>(url: &str, runtime: tokio::runtime::Handle) -> Result<(impl Layer<S>, Traces), String>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
    let client = crate::http::own_client(Duration::from_secs(5), POST_TIMEOUT);
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_http_client(Post { client, runtime })
        .with_protocol(Protocol::HttpBinary)
        .with_endpoint(url)
        .with_timeout(POST_TIMEOUT)
        .build()
        .map_err(|e| format!("telemetry.otlp_endpoint: {e}"))?;
    let resource = opentelemetry_sdk::Resource::builder()
        .with_service_name("rota")
        .with_attribute(opentelemetry::KeyValue::new("service.version", env!("CARGO_PKG_VERSION")))
        .build();
    let provider = SdkTracerProvider::builder().with_batch_exporter(exporter).with_resource(resource).build();
    let exported = tracing_subscriber::filter::filter_fn(|meta| {
        meta.is_span() && meta.target().starts_with("rota") && matches!(meta.name(), "request" | "attempt")
    });
    let layer = tracing_opentelemetry::layer()
        .with_tracer(provider.tracer("rota"))
        .with_location(false)
        .with_threads(false)
        .with_target(false)
        .with_tracked_inactivity(false)
        .with_filter(exported);
    ON.store(true, Ordering::Relaxed);
    Ok((layer, Traces(provider)))
}

/// Makes `span` (a request's) a child of the trace the client's `traceparent` names, when it
/// names one well formed (W3C Trace Context; anything else is ignored).
pub fn adopt(span: &tracing::Span, headers: &http::HeaderMap) {
    if on() && headers.contains_key("traceparent") {
        let _ = span.set_parent(TraceContextPropagator::new().extract(&HeaderExtractor(headers)));
    }
}

/// The current span's `traceparent` (and `tracestate`) for an upstream call; none when off.
pub fn outgoing() -> Option<http::HeaderMap> {
    if !on() {
        return None;
    }
    let mut headers = http::HeaderMap::new();
    TraceContextPropagator::new()
        .inject_context(&tracing::Span::current().context(), &mut HeaderInjector(&mut headers));
    Some(headers)
}

/// The agent a request is of, on the current span (the request's).
pub fn agent(name: &str) {
    if on() {
        tracing::Span::current().record("agent", name);
    }
}

/// What an upstream call came to, on the current span (its `attempt` span).
pub fn attempt_ended(row: &AttemptRow) {
    if !on() || row.profile_id.is_none() {
        return;
    }
    let span = tracing::Span::current();
    span.record("outcome", row.outcome.as_str());
    if let Some(reason) = row.reason {
        span.record("reason", reason.as_str());
    }
    if let Some(ttfb) = row.ttfb_ms {
        span.record("ttfb_ms", ttfb);
    }
    if let Some(status) = row.http_status {
        span.record("status", status as i64);
    }
    if row.outcome == Outcome::Failure {
        span.record("otel.status_code", "error");
    }
}

/// What a request came to, on its span.
pub fn request_ended(span: &tracing::Span, status: http::StatusCode) {
    if on() {
        span.record("status", status.as_u16() as i64);
        if status.is_server_error() {
            span.record("otel.status_code", "error");
        }
    }
}

/// The exporter's HTTP client: rota's reqwest, run on the server's runtime (the batch
/// processor's thread has none).
#[derive(Debug)]
struct Post {
    client: reqwest::Client,
    runtime: tokio::runtime::Handle,
}

#[async_trait::async_trait]
impl HttpClient for Post {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let request = reqwest::Request::try_from(request)?;
        let client = self.client.clone();
        let sent = self.runtime.spawn(async move {
            let response = client.execute(request).await?;
            let mut answer = Response::builder().status(response.status());
            if let Some(headers) = answer.headers_mut() {
                *headers = response.headers().clone();
            }
            Ok::<_, HttpError>(answer.body(response.bytes().await?)?)
        });
        sent.await?
    }
}
