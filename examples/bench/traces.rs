//! `--traces RATIO`: what exporting traces costs the reserve path (issue 28,
//! docs/operations.md "Traces").
//!
//! A second server of this build, on a database of its own seeded as the
//! first, exports its spans over OTLP/HTTP (protobuf) to a collector in this
//! process, sampling `RATIO` of the traces (`OTEL_TRACES_SAMPLER=
//! parentbased_traceidratio`); HOT and SPREAD take turns on the main server
//! (traces off) and on it, round by round. The collector decodes every
//! export with the official definitions and counts the spans, so the report
//! can say what was sent per reservation as well as what it cost.

use std::{
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
};

use axum::{Router, body::Bytes, extract::State, http::StatusCode, routing::post};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use prost::Message as _;

use crate::{
    pairs::{self, Pair, Server},
    scenarios::{Bench, Shop},
};
use stockguard_support::process::ServerProcess;

/// What the collector received.
#[derive(Default)]
struct Received {
    exports: AtomicU64,
    spans: AtomicU64,
    bytes: AtomicU64,
}

/// The `--traces` run.
pub struct Traces {
    /// The sampling ratio of the server with traces on.
    pub ratio: f64,
    /// HOT and SPREAD with traces off (the main server) and on.
    pub cells: Vec<Pair>,
    /// Exports, spans and bytes the collector received over the cells.
    pub exports: u64,
    pub spans: u64,
    pub bytes: u64,
    /// Reservations the traced server made over the cells.
    pub reservations: u64,
}

/// Starts the traced server on a database of its own and measures the cells.
pub async fn compare(
    bench: &mut Bench,
    server: &ServerProcess,
    server_bin: &std::path::Path,
    database_url_base: &str,
    secret: &str,
    ratio: f64,
) -> anyhow::Result<Traces> {
    let received = Arc::new(Received::default());
    let app = Router::new().route("/v1/traces", post(collect)).with_state(received.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr: SocketAddr = listener.local_addr()?;
    let collector = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    eprintln!("bench: traces: a second server exporting {ratio} of its traces to {addr}");
    let counts = |r: &Received| [&r.exports, &r.spans, &r.bytes].map(|n| n.load(Ordering::Relaxed));
    let (endpoint, ratio_text) = (format!("http://{addr}"), ratio.to_string());
    let env = [
        ("STOCKGUARD_ORDER_LOCKING", "optimistic"),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
        ("OTEL_TRACES_SAMPLER", "parentbased_traceidratio"),
        ("OTEL_TRACES_SAMPLER_ARG", ratio_text.as_str()),
        // Every span sampled is sent: a queue that overflows drops
        // spans (the default holds 2,048, five seconds at the default
        // delay), and dropped spans would cost less than sent ones.
        ("OTEL_BSP_SCHEDULE_DELAY", "200"),
        ("OTEL_BSP_MAX_QUEUE_SIZE", "1000000"),
    ];
    let measured = pairs::beside(database_url_base, server_bin, secret, &env, async |traced, url| {
        let shop = Shop::open(url, traced, &bench.keys).await?;
        let servers = [
            Server { label: "traces off", process: server, shop: None, checked: true },
            Server { label: "traces on", process: traced, shop: Some(&shop), checked: true },
        ];
        // Seeding's spans are not the cells'.
        let before = counts(&received);
        let cells = bench.pairs(servers, "traces off and on").await;
        shop.db.close().await?;
        anyhow::Ok((before, cells?))
    })
    .await;
    // Stopped, the server has sent its last spans.
    collector.abort();
    let (before, cells) = measured?;
    let after = counts(&received);
    let reservations = cells.iter().map(|c| c.stats[1].successes).sum();
    let [exports, spans, bytes] = [0, 1, 2].map(|i| after[i] - before[i]);
    Ok(Traces { ratio, cells, exports, spans, bytes, reservations })
}

/// `POST /v1/traces`: decoded and counted.
async fn collect(State(received): State<Arc<Received>>, body: Bytes) -> StatusCode {
    let bytes = body.len() as u64;
    let Ok(request) = ExportTraceServiceRequest::decode(body) else { return StatusCode::BAD_REQUEST };
    let spans: usize = request.resource_spans.iter().flat_map(|r| &r.scope_spans).map(|scope| scope.spans.len()).sum();
    received.exports.fetch_add(1, Ordering::Relaxed);
    received.spans.fetch_add(spans as u64, Ordering::Relaxed);
    received.bytes.fetch_add(bytes, Ordering::Relaxed);
    StatusCode::OK
}

impl Traces {
    /// Errors over its cells.
    pub fn errors(&self) -> u64 {
        self.cells.iter().map(Pair::errors).sum()
    }

    /// The report's section.
    pub fn markdown(&self) -> String {
        let per = |n: u64| n as f64 / self.reservations.max(1) as f64;
        let mut md = format!(
            "\n## Traces: what exporting them costs\n\n\
             A second server of this build, on a database of its own seeded the same way, exporting its spans \
             over OTLP/HTTP (protobuf) to a collector in the benchmark process that decodes every export, \
             sampling {} of the traces (`OTEL_TRACES_SAMPLER=parentbased_traceidratio`); it took turns round by \
             round with the main server (traces off). Over the cells the collector received {} exports, {} spans \
             ({:.2} per reservation) and {:.1} MB ({:.0} bytes per reservation); its CPU falls on the load \
             generator. On / off = res/s with traces over res/s without.\n\n",
            self.ratio,
            self.exports,
            self.spans,
            per(self.spans),
            self.bytes as f64 / 1e6,
            per(self.bytes),
        );
        md.push_str(&pairs::table(&self.cells, ["off", "on"]));
        md
    }
}
