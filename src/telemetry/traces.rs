//! OpenTelemetry traces over OTLP/HTTP, off unless an endpoint is set.
//!
//! Configured only by the standard variables, as every collector's docs
//! describe them: `OTEL_EXPORTER_OTLP_ENDPOINT` (or `…_TRACES_ENDPOINT`)
//! turns export on; `OTEL_EXPORTER_OTLP_PROTOCOL` picks `http/protobuf` (the
//! default) or `http/json`; `OTEL_EXPORTER_OTLP_HEADERS`,
//! `OTEL_TRACES_SAMPLER` / `OTEL_TRACES_SAMPLER_ARG` (the sampling ratio),
//! `OTEL_SERVICE_NAME`, `OTEL_BSP_*` and `OTEL_SDK_DISABLED` mean what the
//! specification says. The spans are the `tracing` spans the server already
//! makes (HTTP request, GraphQL operation, database statement, coalesced
//! batch); this module adds the layer that exports them, reads and writes
//! `traceparent`, and links a batch to its callers.

use std::{fmt, time::Duration};

use axum::{extract::Request, middleware::Next, response::Response};
use opentelemetry::{propagation::TextMapPropagator, trace::TracerProvider as _};
use opentelemetry_http::{Bytes, HeaderExtractor, HeaderInjector, HttpClient, HttpError};
use opentelemetry_otlp::{SpanExporter, WithHttpConfig};
use opentelemetry_sdk::{Resource, propagation::TraceContextPropagator, trace::SdkTracerProvider};
use tracing::{Instrument, Span};
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::{
    Layer, Registry,
    filter::{FilterExt, Targets, dynamic_filter_fn},
};

/// The exporter's HTTP timeout when `OTEL_EXPORTER_OTLP_TIMEOUT` is unset
/// (the specification's default).
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

/// Whether the standard variables ask for traces: an endpoint is set, and
/// neither `OTEL_SDK_DISABLED=true` nor `OTEL_TRACES_EXPORTER=none` says no.
fn wanted() -> bool {
    let set = |name: &str| std::env::var(name).is_ok_and(|value| !value.trim().is_empty());
    let is = |name: &str, value: &str| std::env::var(name).is_ok_and(|v| v.trim().eq_ignore_ascii_case(value));
    (set("OTEL_EXPORTER_OTLP_ENDPOINT") || set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))
        && !is("OTEL_SDK_DISABLED", "true")
        && !is("OTEL_TRACES_EXPORTER", "none")
}

/// The export pipeline, flushed by [`Traces::shutdown`].
pub(crate) struct Traces(Option<SdkTracerProvider>);

impl Traces {
    /// Sends the spans still buffered and stops the exporter.
    pub(crate) async fn shutdown(self) {
        let Some(provider) = self.0 else { return };
        // The batch processor's shutdown blocks until its thread has sent
        // the last batch, which our client sends on this runtime.
        let flushed = tokio::task::spawn_blocking(move || provider.shutdown()).await;
        if let Ok(Err(err)) = flushed {
            tracing::warn!(error = %err, "the last spans could not be exported");
        }
    }
}

/// The layer that exports spans, if the environment asks for it, and the
/// pipeline to flush at exit. Must run on a Tokio runtime: the exporter's
/// requests run on it.
pub(super) fn layer() -> (Option<Box<dyn Layer<Registry> + Send + Sync>>, Traces) {
    if !wanted() {
        return (None, Traces(None));
    }
    let exporter = match Client::new() {
        Ok(client) => SpanExporter::builder().with_http().with_http_client(client).build(),
        Err(err) => {
            eprintln!("stockguard: traces are off: cannot build the exporter's client: {err}");
            return (None, Traces(None));
        }
    };
    let exporter = match exporter {
        Ok(exporter) => exporter,
        Err(err) => {
            eprintln!("stockguard: traces are off: {err}");
            return (None, Traces(None));
        }
    };
    let mut resource = Resource::builder();
    if std::env::var_os("OTEL_SERVICE_NAME").is_none() {
        resource = resource.with_service_name("stockguard");
    }
    let provider = SdkTracerProvider::builder().with_resource(resource.build()).with_batch_exporter(exporter).build();
    let tracer = provider.tracer("stockguard");
    // Our spans and the ORM's statement spans; nothing of sqlx (whose events
    // carry the statements' text) and no log events below warnings.
    let spans = Targets::new()
        .with_target("stockguard", tracing::Level::INFO)
        .with_target(TARGET, tracing::Level::DEBUG)
        .with_target("sea_orm", tracing::Level::INFO)
        .with_default(tracing::Level::WARN);
    // The ORM's statements only inside a span of ours: the background loops
    // (sweeper, event pump, deliveries) poll, and each poll would otherwise
    // be a trace of its own.
    let in_work = dynamic_filter_fn(|meta, cx| !meta.target().starts_with("sea_orm") || cx.lookup_current().is_some());
    let layer = tracing_opentelemetry::layer().with_tracer(tracer).with_filter(spans.and(in_work)).boxed();
    ON.store(true, std::sync::atomic::Ordering::Relaxed);
    (Some(layer), Traces(Some(provider)))
}

/// The target of the spans made only for traces (the HTTP request, each
/// statement, each batch): at DEBUG, so the log's default filter skips them
/// and they cost nothing with traces off.
const TARGET: &str = "stockguard::trace";

/// Set once traces are exported: what is only worth doing then (reading
/// `traceparent`, linking a batch) is skipped otherwise.
static ON: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether spans leave the process.
pub(super) fn on() -> bool {
    ON.load(std::sync::atomic::Ordering::Relaxed)
}

/// The span of an HTTP request to `/graphql`: a child of the caller's
/// `traceparent` when it sends one, and named in the response's
/// `traceparent` so the caller can find it. With traces off, nothing.
pub(crate) async fn http_request(request: Request, next: Next) -> Response {
    if !on() {
        return next.run(request).await;
    }
    let span = tracing::debug_span!(
        target: TARGET,
        "http",
        otel.name = %format_args!("{} /graphql", request.method()),
        otel.kind = "server",
        http.request.method = %request.method(),
        url.path = request.uri().path(),
        http.response.status_code = tracing::field::Empty,
    );
    let propagator = TraceContextPropagator::new();
    let parent = propagator.extract(&HeaderExtractor(request.headers()));
    // A missing or malformed traceparent leaves the span a root of its own.
    let _ = span.set_parent(parent);
    let mut response = next.run(request).instrument(span.clone()).await;
    span.record("http.response.status_code", response.status().as_u16());
    propagator.inject_context(&span.context(), &mut HeaderInjector(response.headers_mut()));
    response
}

/// The span of one database statement, by its name (never its parameters).
pub(crate) fn statement(name: &'static str) -> Span {
    tracing::debug_span!(
        target: TARGET,
        "statement",
        otel.name = name,
        otel.kind = "client",
        db.system.name = "postgresql",
        db.query.summary = name,
    )
}

/// The span of a coalesced batch of `callers`; link it to theirs with
/// [`link_callers`].
pub(crate) fn batch(callers: usize) -> Span {
    tracing::debug_span!(target: TARGET, "coalesced batch", stockguard.callers = callers)
}

/// The span a caller was in, kept to link the batch that serves it.
pub(crate) fn caller_span() -> Span {
    if on() { Span::current() } else { Span::none() }
}

/// Links `batch` to the span of every caller it serves.
pub(crate) fn link_callers<'a>(batch: &Span, callers: impl Iterator<Item = &'a Span>) {
    if batch.is_disabled() {
        return;
    }
    for caller in callers {
        let context = caller.context();
        let caller = opentelemetry::trace::TraceContextExt::span(&context).span_context().clone();
        if caller.is_valid() {
            batch.add_link(caller);
        }
    }
}

/// The exporter's HTTP client: the server's reqwest on the server's runtime.
/// The batch processor exports from a thread of its own, blocking on each
/// request; the request runs as a task of the runtime captured here.
struct Client {
    http: reqwest::Client,
    runtime: tokio::runtime::Handle,
}

impl Client {
    fn new() -> anyhow::Result<Self> {
        let timeout = std::env::var("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT")
            .or_else(|_| std::env::var("OTEL_EXPORTER_OTLP_TIMEOUT"))
            .ok()
            .and_then(|ms| ms.trim().parse().ok())
            .map_or(EXPORT_TIMEOUT, Duration::from_millis);
        let http = reqwest::Client::builder().timeout(timeout).redirect(reqwest::redirect::Policy::none()).build()?;
        Ok(Self { http, runtime: tokio::runtime::Handle::try_current()? })
    }
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("stockguard OTLP client")
    }
}

#[async_graphql::async_trait::async_trait]
impl HttpClient for Client {
    async fn send_bytes(
        &self,
        request: opentelemetry_http::Request<Bytes>,
    ) -> Result<opentelemetry_http::Response<Bytes>, HttpError> {
        let request = reqwest::Request::try_from(request.map(reqwest::Body::from))?;
        let http = self.http.clone();
        let sent = self.runtime.spawn(async move {
            let response = http.execute(request).await?;
            let (status, headers) = (response.status(), response.headers().clone());
            let body = response.bytes().await?;
            Ok::<_, reqwest::Error>((status, headers, body))
        });
        let (status, headers, body) = sent.await??;
        let mut response = opentelemetry_http::Response::new(body);
        *response.status_mut() = status;
        *response.headers_mut() = headers;
        Ok(response)
    }
}
