//! Logs, spans and metrics.
//!
//! Logging: `RUST_LOG` filters (default `info`, database notices muted),
//! `STOCKGUARD_LOG_FORMAT` picks text or one JSON object per line. Every
//! GraphQL operation runs in a `graphql` span with its name and outcome.
//! Metrics are kept in-process and served at `/metrics` in Prometheus' text
//! format; label values come from the schema and fixed lists only, never from
//! client input, so their number stays bounded. Traces: see `traces.rs`.

mod traces;

use std::{
    sync::{Arc, OnceLock},
    time::{Duration, Instant},
};

use async_graphql::{
    OutputType, Response, ServerResult, Value,
    extensions::{Extension, ExtensionContext, ExtensionFactory, NextExecute, NextResolve, ResolveInfo},
    parser::types::OperationType,
};
use metrics::{counter, gauge, histogram};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use sea_orm::DatabaseConnection;
use tracing::Instrument;
use tracing_subscriber::{EnvFilter, Layer, fmt, layer::SubscriberExt, util::SubscriberInitExt};

pub(crate) use self::traces::{Traces, batch, caller_span, http_request, link_callers, statement};
use crate::{
    auth::{Role, Viewer},
    config::LogFormat,
};

/// Installs the global subscriber: log lines on stderr and, when the
/// environment asks for them, traces to an OpenTelemetry collector (see
/// `traces.rs`). A second call is a no-op. Must run on the runtime.
pub(crate) fn init(format: LogFormat) -> Traces {
    // The ORM's per-statement spans are for traces, not for log lines.
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info,sqlx=warn,sea_orm=warn"));
    let (spans, traces) = traces::layer();
    let _ = match spans {
        // Traces take spans the log lines leave out: each layer filters for itself.
        Some(spans) => tracing_subscriber::registry().with(spans).with(logs(format).with_filter(filter)).try_init(),
        // Log lines alone: one filter for the whole subscriber, so a call
        // site it turns away (the ORM's, sqlx's, hyper's, below their level)
        // is asked once and remembered. A filter of one layer among others
        // is asked at every call instead, which cost the HOT probes about
        // 1 % with and without an endpoint (bench/results/decisions.md,
        // "Twelfth pass").
        None => tracing_subscriber::registry().with(logs(format)).with(filter).try_init(),
    };
    traces
}

/// Log lines on stderr, as text or JSON.
fn logs<S>(format: LogFormat) -> Box<dyn Layer<S> + Send + Sync>
where
    S: tracing::Subscriber + for<'span> tracing_subscriber::registry::LookupSpan<'span>,
{
    let logs = fmt::layer().with_writer(std::io::stderr);
    match format {
        LogFormat::Text => logs.boxed(),
        LogFormat::Json => logs.json().boxed(),
    }
}

/// How often recorded histogram samples are folded into their buckets.
/// `build_recorder` spawns no upkeep of its own: without this (or a scrape
/// of /metrics, which does the same), every sample of every request would be
/// kept and the process would grow without bound.
const UPKEEP_INTERVAL: Duration = Duration::from_secs(5);

/// The process's metrics registry, installed on first use. One per process:
/// several servers in one process (the tests) share it.
fn registry() -> &'static PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE.get_or_init(|| {
        const BUCKETS: &[f64] = &[0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0];
        let recorder = PrometheusBuilder::new()
            .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), BUCKETS)
            .map(PrometheusBuilder::build_recorder);
        match recorder {
            Ok(recorder) => {
                let handle = recorder.handle();
                if metrics::set_global_recorder(recorder).is_err() {
                    tracing::warn!("a metrics recorder was already installed; /metrics stays empty");
                }
                spawn_upkeep(handle.clone());
                handle
            }
            Err(err) => {
                tracing::warn!(error = %err, "cannot build the metrics recorder");
                PrometheusBuilder::new().build_recorder().handle()
            }
        }
    })
}

/// Runs the registry's upkeep every [`UPKEEP_INTERVAL`] for the life of the
/// process, on a thread of its own (so it outlives any one runtime).
fn spawn_upkeep(handle: PrometheusHandle) {
    let spawned = std::thread::Builder::new().name("metrics-upkeep".into()).spawn(move || {
        loop {
            std::thread::sleep(UPKEEP_INTERVAL);
            handle.run_upkeep();
        }
    });
    if let Err(err) = spawned {
        tracing::warn!(error = %err, "cannot start the metrics upkeep; histograms grow until /metrics is read");
    }
}

/// Makes sure the registry exists before the first request is counted.
pub(crate) fn install_metrics() {
    registry();
}

/// The metrics in Prometheus' text format, with the pool's gauges read now.
pub(crate) fn render(db: &DatabaseConnection) -> String {
    let pool = db.get_postgres_connection_pool();
    let (size, idle) = (pool.size(), pool.num_idle() as u32);
    gauge!("stockguard_db_pool_connections", "state" => "in_use").set(f64::from(size.saturating_sub(idle)));
    gauge!("stockguard_db_pool_connections", "state" => "idle").set(f64::from(idle));
    registry().render()
}

/// Counts how a mutation ended by its union member (`Reserved`, `SoldOut`,
/// ...), and hands the result back.
pub(crate) fn counted<T: OutputType>(field: &'static str, result: T) -> T {
    let member = result.introspection_type_name().into_owned();
    counter!("stockguard_outcomes_total", "field" => field, "outcome" => member).increment(1);
    result
}

/// Counts a statement or transaction re-run after a collision.
pub(crate) fn collision_retry(kind: &'static str) {
    counter!("stockguard_collision_retries_total", "kind" => kind).increment(1);
}

/// Counts database failures by class (serialization_failure, deadlock,
/// lock_timeout, unavailable, ...).
pub(crate) fn db_failure(class: &'static str) {
    counter!("stockguard_db_failures_total", "class" => class).increment(1);
}

/// Counts GraphQL operations refused at the in-flight limit (`OVERLOADED`):
/// the server was full, the database was not asked.
pub(crate) fn overloaded() {
    counter!("stockguard_overloaded_total").increment(1);
}

/// Counts GraphQL operations refused with `THROTTLED`, by `reason`: `cost`
/// (the caller's bucket), `known_short` (back before the wait its last
/// refusal named, refused unread) or `in_flight` (the caller's share).
pub(crate) fn throttled(reason: &'static str) {
    counter!("stockguard_throttled_total", "reason" => reason).increment(1);
}

/// Counts queries run on the background lane: their callers took more
/// than their share.
pub(crate) fn background_operation() {
    counter!("stockguard_background_operations_total").increment(1);
}

/// Counts TCP connections opening (`1`) and closing (`-1`).
pub(crate) fn http_connections(delta: i8) {
    gauge!("stockguard_http_connections").increment(f64::from(delta));
}

/// Counts GraphQL operations taking (`1`) and giving back (`-1`) their
/// place under the in-flight limit, which they hold until their work ends.
pub(crate) fn operations_in_flight(delta: i8) {
    gauge!("stockguard_operations_in_flight").increment(f64::from(delta));
}

/// Counts live subscriptions starting (`1`) and ending (`-1`).
pub(crate) fn subscriptions(delta: i8) {
    gauge!("stockguard_subscriptions").increment(f64::from(delta));
}

/// Counts reservations whose stock the sweeper returned.
pub(crate) fn sweeper_returned(expired: i64) {
    counter!("stockguard_sweeper_expired_total").increment(expired.max(0) as u64);
}

/// Counts a panic of an events task, `pump` or `dispatcher`, which is
/// started again (`events::restart`).
pub(crate) fn events_task_panicked(task: &'static str) {
    counter!("stockguard_events_task_panics_total", "task" => task).increment(1);
}

/// The async-graphql extension that times root fields and wraps each
/// operation in a span.
pub(crate) struct Observe;

impl ExtensionFactory for Observe {
    fn create(&self) -> Arc<dyn Extension> {
        Arc::new(ObserveExtension)
    }
}

struct ObserveExtension;

#[async_graphql::async_trait::async_trait]
impl Extension for ObserveExtension {
    async fn execute(
        &self,
        ctx: &ExtensionContext<'_>,
        operation_name: Option<&str>,
        next: NextExecute<'_>,
    ) -> Response {
        let operation = operation_name.unwrap_or("anonymous");
        // The log line's context is the operation's name; what a trace
        // shows of it besides (by the semantic conventions' names: the
        // role, never the token, and never a variable's value) is recorded
        // only while traces are on. Recorded always, those three fields were
        // formatted into a string by the log layer at every operation (2 %
        // of the server's CPU under `bench load reserve`).
        let span = tracing::info_span!(
            "graphql",
            graphql.operation.name = operation,
            otel.name = tracing::field::Empty,
            graphql.operation.type = tracing::field::Empty,
            stockguard.role = tracing::field::Empty,
            outcome = tracing::field::Empty
        );
        if traces::on() {
            let kind = match ctx.data_opt::<OperationType>() {
                Some(OperationType::Query) => "query",
                Some(OperationType::Mutation) => "mutation",
                Some(OperationType::Subscription) => "subscription",
                None => "unknown",
            };
            let role = match ctx.data_opt::<Viewer>() {
                Some(Viewer::User(user)) if user.role == Role::Operator => "operator",
                Some(Viewer::User(_)) => "customer",
                Some(Viewer::Invalid(_)) => "invalid",
                Some(Viewer::Anonymous) | None => "anonymous",
            };
            span.record("otel.name", format_args!("{kind} {operation}"));
            span.record("graphql.operation.type", kind);
            span.record("stockguard.role", role);
        }
        let response = next.run(ctx, operation_name).instrument(span.clone()).await;
        let outcome = match response.errors.first() {
            None => "ok".to_owned(),
            Some(error) => match error.extensions.as_ref().and_then(|ext| ext.get("code")) {
                Some(Value::String(code)) => code.clone(),
                _ => "error".to_owned(),
            },
        };
        span.record("outcome", outcome.as_str());
        response
    }

    async fn resolve(
        &self,
        ctx: &ExtensionContext<'_>,
        info: ResolveInfo<'_>,
        next: NextResolve<'_>,
    ) -> ServerResult<Option<Value>> {
        // Only root fields, and by their name in the schema, never by the
        // alias the client chose: the label values stay a bounded set.
        if info.path_node.parent.is_some() {
            return next.run(ctx, info).await;
        }
        let field = info.name.to_owned();
        let started = Instant::now();
        let result = next.run(ctx, info).await;
        let status = if result.is_ok() { "ok" } else { "error" };
        counter!("stockguard_graphql_fields_total", "field" => field.clone(), "status" => status).increment(1);
        histogram!("stockguard_graphql_field_duration_seconds", "field" => field)
            .record(started.elapsed().as_secs_f64());
        result
    }
}
