//! Traces reach a real OTLP receiver: an HTTP server here that decodes what
//! it gets with the official protobuf definitions (`opentelemetry-proto`),
//! as a collector does, in both of the protocols the variables name. The
//! server runs as a process configured only by the standard
//! `OTEL_EXPORTER_OTLP_*` variables.

use std::{
    collections::HashMap,
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::Duration,
};

use axum::{Router, body::Bytes, extract::State, http::HeaderMap, routing::post};
use opentelemetry_proto::tonic::{
    collector::trace::v1::ExportTraceServiceRequest,
    common::v1::{AnyValue, any_value},
};
use prost::Message as _;
use serde_json::{Value, json};
use stockguard::auth::Role;
use uuid::Uuid;

use crate::{
    documents,
    helpers::{eventually, metric},
    process::Process,
};

/// One span as the receiver decoded it, ids in hex.
#[derive(Debug, Clone)]
struct Received {
    trace_id: String,
    span_id: String,
    parent_span_id: String,
    name: String,
    attributes: HashMap<String, String>,
    /// The spans it links to: (trace id, span id).
    links: Vec<(String, String)>,
    /// The resource's `service.name`.
    service: String,
}

/// An OTLP/HTTP receiver on port 0: every export it was sent, decoded, and
/// the content types they came as.
#[derive(Clone, Default)]
struct Receiver {
    spans: Arc<Mutex<Vec<Received>>>,
    content_types: Arc<Mutex<Vec<String>>>,
}

impl Receiver {
    /// Starts receiving; its `/v1/traces` URL's base.
    async fn start() -> (Self, String) {
        let receiver = Self::default();
        let app = Router::new().route("/v1/traces", post(receive)).with_state(receiver.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind the receiver");
        let addr: SocketAddr = listener.local_addr().expect("its address");
        tokio::spawn(async move { axum::serve(listener, app).await });
        (receiver, format!("http://{addr}"))
    }

    fn spans(&self) -> Vec<Received> {
        self.spans.lock().expect("spans").clone()
    }

    /// Waits (30 s at most) until `done` holds of the spans received.
    async fn until(&self, what: &str, done: impl Fn(&[Received]) -> bool) -> Vec<Received> {
        eventually(Duration::from_secs(30), what, || async { done(&self.spans()) }).await;
        self.spans()
    }
}

/// `POST /v1/traces`: decodes the request as its content type says.
async fn receive(
    State(receiver): State<Receiver>,
    headers: HeaderMap,
    body: Bytes,
) -> (axum::http::StatusCode, &'static str) {
    let content_type = headers.get("content-type").and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
    let decoded = if content_type.starts_with("application/json") {
        serde_json::from_slice::<ExportTraceServiceRequest>(&body).map_err(|err| err.to_string())
    } else {
        ExportTraceServiceRequest::decode(body).map_err(|err| err.to_string())
    };
    let Ok(request) = decoded else { return (axum::http::StatusCode::BAD_REQUEST, "undecodable") };
    receiver.content_types.lock().expect("types").push(content_type);
    let mut spans = receiver.spans.lock().expect("spans");
    for resource in request.resource_spans {
        let attributes = resource.resource.map(|r| r.attributes).unwrap_or_default();
        let service =
            attributes.iter().find(|kv| kv.key == "service.name").map(|kv| text(&kv.value)).unwrap_or_default();
        for scope in resource.scope_spans {
            for span in scope.spans {
                spans.push(Received {
                    trace_id: hex::encode(&span.trace_id),
                    span_id: hex::encode(&span.span_id),
                    parent_span_id: hex::encode(&span.parent_span_id),
                    name: span.name,
                    attributes: span.attributes.iter().map(|kv| (kv.key.clone(), text(&kv.value))).collect(),
                    links: span.links.iter().map(|l| (hex::encode(&l.trace_id), hex::encode(&l.span_id))).collect(),
                    service: service.clone(),
                });
            }
        }
    }
    (axum::http::StatusCode::OK, "")
}

/// An attribute's value as text.
fn text(value: &Option<AnyValue>) -> String {
    match value.as_ref().and_then(|v| v.value.as_ref()) {
        Some(any_value::Value::StringValue(s)) => s.clone(),
        Some(any_value::Value::IntValue(i)) => i.to_string(),
        Some(any_value::Value::BoolValue(b)) => b.to_string(),
        Some(any_value::Value::DoubleValue(d)) => d.to_string(),
        other => format!("{other:?}"),
    }
}

/// A server exporting to `endpoint` as `protocol`, sending every 100 ms.
async fn traced_server(endpoint: &str, protocol: &str) -> Process {
    Process::start(&[
        ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", protocol),
        ("OTEL_BSP_SCHEDULE_DELAY", "100"),
        ("OTEL_SERVICE_NAME", "stockguard-under-test"),
    ])
    .await
}

/// POSTs `query` with `traceparent`; the response's `traceparent` and body.
async fn traced_post(
    server: &Process,
    token: &str,
    traceparent: &str,
    query: &str,
    variables: Value,
) -> (String, Value) {
    let response = server
        .client
        .post(format!("{}/graphql", server.address))
        .bearer_auth(token)
        .header("traceparent", traceparent)
        .json(&json!({ "query": query, "variables": variables }))
        .send()
        .await
        .expect("post");
    let returned = response.headers().get("traceparent").and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
    (returned, response.json().await.expect("json"))
}

const RESERVE_NAMED: &str =
    "mutation ReserveForTheTrace($input: ReserveInput!) { reserve(input: $input) { __typename } }";

async fn spans_of_one_request_reach_the_receiver(protocol: &str) {
    let (receiver, endpoint) = Receiver::start().await;
    let server = traced_server(&endpoint, protocol).await;
    let id = server.create_inventory("TRACED-1", 10).await;
    let token = server.token("tracer", Role::Customer);
    // A value no span may carry: variables are never exported.
    let key = format!("never-in-a-span-{}", Uuid::new_v4().simple());
    let (trace_id, caller_span) = ("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7");
    let traceparent = format!("00-{trace_id}-{caller_span}-01");
    let input = json!({ "input": { "inventoryId": id, "quantity": 2, "idempotencyKey": key } });
    let (returned, body) = traced_post(&server, &token, &traceparent, RESERVE_NAMED, input).await;
    assert_eq!(body["data"]["reserve"]["__typename"], "Reserved", "{body}");

    // traceparent out: the caller's trace, this server's span.
    let parts: Vec<&str> = returned.split('-').collect();
    assert_eq!(parts.len(), 4, "a W3C traceparent comes back: {returned:?}");
    assert_eq!(parts[1], trace_id, "the response names the caller's trace");
    assert_ne!(parts[2], caller_span, "and a span of the server's");

    // Each span is exported when it ends, the statement's first and the
    // HTTP request's last, possibly in a later export: wait for all three.
    let spans = receiver
        .until("the request's HTTP, operation and statement spans arrive", |spans| {
            ["POST /graphql", "mutation ReserveForTheTrace", "reserve"]
                .iter()
                .all(|name| spans.iter().any(|s| s.trace_id == trace_id && s.name == *name))
        })
        .await;
    let ours: Vec<&Received> = spans.iter().filter(|s| s.trace_id == trace_id).collect();
    let http = ours.iter().find(|s| s.name == "POST /graphql").expect("the HTTP span");
    assert_eq!(http.parent_span_id, caller_span, "traceparent in: the HTTP span is the caller's child");
    assert_eq!(http.span_id, parts[2], "traceparent out names the HTTP span");
    assert_eq!(http.attributes.get("http.response.status_code").map(String::as_str), Some("200"));
    assert_eq!(http.service, "stockguard-under-test");
    let operation = ours.iter().find(|s| s.name == "mutation ReserveForTheTrace").expect("the operation's span");
    assert_eq!(operation.parent_span_id, http.span_id, "the operation runs in the request");
    let attribute = |span: &Received, key: &str| span.attributes.get(key).cloned().unwrap_or_default();
    assert_eq!(attribute(operation, "graphql.operation.name"), "ReserveForTheTrace");
    assert_eq!(attribute(operation, "graphql.operation.type"), "mutation");
    assert_eq!(attribute(operation, "stockguard.role"), "customer");
    let statement = ours.iter().find(|s| s.name == "reserve").expect("the statement's span");
    assert_eq!(statement.parent_span_id, operation.span_id, "the statement runs in the operation");
    assert_eq!(attribute(statement, "db.system.name"), "postgresql");

    // The ORM's statements are spans too (the operator's createInventory).
    assert!(
        spans.iter().any(|s| s.name.starts_with("sea_orm.") && s.attributes.contains_key("db.operation")),
        "no ORM statement span: {:?}",
        spans.iter().map(|s| &s.name).collect::<Vec<_>>()
    );
    // Nothing exported carries the token or a variable's value.
    for span in &spans {
        for value in span.attributes.values() {
            assert!(!value.contains(&key) && !value.contains(&token), "{span:?} leaks a secret");
        }
    }
    let types = receiver.content_types.lock().expect("types").clone();
    let expected = if protocol == "http/json" { "application/json" } else { "application/x-protobuf" };
    assert!(types.iter().all(|t| t.starts_with(expected)), "{protocol} sent as {types:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn spans_of_one_request_reach_a_real_receiver_over_http_protobuf() {
    spans_of_one_request_reach_the_receiver("http/protobuf").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn spans_of_one_request_reach_a_real_receiver_over_http_json() {
    spans_of_one_request_reach_the_receiver("http/json").await;
}

/// Callers queued behind a held row share one statement: its batch span
/// links to the operation span of each caller it served.
#[tokio::test(flavor = "multi_thread")]
async fn a_coalesced_batch_links_to_every_caller_it_served() {
    let (receiver, endpoint) = Receiver::start().await;
    let server = traced_server(&endpoint, "http/protobuf").await;
    let id = server.create_inventory("TRACED-HOT", 100).await;
    let holder = sea_orm::TransactionTrait::begin(&server.db).await.expect("begin");
    sea_orm::ConnectionTrait::execute_unprepared(
        &holder,
        &format!("SELECT 1 FROM inventories WHERE id = '{id}' FOR UPDATE"),
    )
    .await
    .expect("hold the row");
    let reserve = |user: String| {
        let (client, address, token) =
            (server.client.clone(), server.address.clone(), server.token(&user, Role::Customer));
        tokio::spawn(async move {
            let body =
                json!({ "query": documents::RESERVE, "variables": { "input": { "inventoryId": id, "quantity": 1 } } });
            let response = client.post(format!("{address}/graphql")).bearer_auth(token).json(&body).send().await;
            response.expect("post").json::<Value>().await.expect("json")
        })
    };
    let first = reserve("first".into());
    let waiting =
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'";
    eventually(Duration::from_secs(10), "the first caller waits for the row", || async {
        server.count(waiting).await > 0
    })
    .await;
    let queued: Vec<_> = (0..5).map(|i| reserve(format!("queued-{i}"))).collect();
    // They queue in the server behind the first (nothing of theirs reaches
    // the database), each holding its place under the in-flight limit.
    eventually(Duration::from_secs(10), "the five callers are in the server behind the first", || async {
        metric(&server.client, &server.address, "stockguard_operations_in_flight").await == Some(6.0)
    })
    .await;
    holder.rollback().await.expect("let the row go");
    for caller in std::iter::once(first).chain(queued) {
        let body = caller.await.expect("task");
        assert_eq!(body["data"]["reserve"]["__typename"], "Reserved", "{body}");
    }

    let spans = receiver
        .until("a batch span with links arrives", |spans| {
            spans.iter().any(|s| s.name == "coalesced batch" && s.links.len() >= 2)
        })
        .await;
    let batch = spans.iter().find(|s| s.name == "coalesced batch" && s.links.len() >= 2).expect("a batch");
    assert_eq!(
        batch.attributes.get("stockguard.callers").map(String::as_str),
        Some(batch.links.len().to_string().as_str())
    );
    // Each link is a caller's operation span, each in a trace of its own.
    let linked = receiver
        .until("every linked operation span arrives", |spans| {
            batch.links.iter().all(|(trace, span)| spans.iter().any(|s| &s.trace_id == trace && &s.span_id == span))
        })
        .await;
    for (trace, span) in &batch.links {
        let caller = linked.iter().find(|s| &s.trace_id == trace && &s.span_id == span).expect("linked");
        assert!(caller.name.starts_with("mutation"), "a link points at {caller:?}");
    }
    let traces: std::collections::HashSet<&String> = batch.links.iter().map(|(trace, _)| trace).collect();
    assert_eq!(traces.len(), batch.links.len(), "one trace per caller");
    assert!(
        spans.iter().any(|s| s.name == "reserve coalesced" && s.parent_span_id == batch.span_id),
        "the batch's statement runs in the batch's span"
    );
}
