//! HTTP: `POST /graphql`, subscriptions at `/graphql/ws`, GraphiQL at `/`,
//! `/healthz`, `/readyz`, `/metrics`, the body limit, and serving until
//! SIGINT/SIGTERM.

use std::{
    future::Future,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
    time::Duration,
};

use async_graphql::{BatchRequest, dataloader::DataLoader, http::GraphiQLSource};
use async_graphql_axum::{GraphQLResponse, GraphQLSubscription};
use axum::{
    Router,
    body::Bytes,
    extract::{DefaultBodyLimit, State},
    http::{HeaderMap, StatusCode, header::AUTHORIZATION},
    response::{Html, IntoResponse, Response},
    routing::get,
    serve::ListenerExt,
};
use serde_json::json;
use tokio::{net::TcpListener, sync::Semaphore};
use tower_http::catch_panic::CatchPanicLayer;

use crate::{
    app::AppState,
    documents::{Documents, Introspection},
    inventory::loader::InventoryLoader,
    orders::loader::OrderLinesLoader,
    schema::AppSchema,
};

/// What the handlers share.
#[derive(Clone)]
struct Http {
    /// The executable schema (it holds the `AppState` too).
    schema: AppSchema,
    /// The same schema with the looser depth bound for introspection-only requests.
    introspection: AppSchema,
    /// The shared state, for auth and readiness.
    app: AppState,
    /// The rendered GraphiQL page.
    graphiql: String,
    /// Admission control: one permit per GraphQL request in flight.
    in_flight: Arc<Semaphore>,
    /// Parsed documents of recent queries.
    documents: Documents,
}

/// The router over `app`. `graphiql_token`, when given, is prefilled as the
/// `Authorization` header of GraphiQL (only for a server with a throw-away secret).
pub fn router(app: AppState, schema: AppSchema, graphiql_token: Option<&str>) -> Router {
    crate::telemetry::install_metrics();
    let bearer = graphiql_token.map(|token| format!("Bearer {token}"));
    let mut graphiql =
        GraphiQLSource::build().endpoint("/graphql").subscription_endpoint("/graphql/ws").title("Stockguard");
    if let Some(bearer) = bearer.as_deref() {
        graphiql = graphiql.header("Authorization", bearer);
    }
    let body_limit = app.limits.body_limit;
    let subscriptions = GraphQLSubscription::new(schema.clone());
    let introspection = crate::schema::build_for_introspection(app.clone());
    let in_flight = Arc::new(Semaphore::new(app.limits.max_in_flight.max(1)));
    let state =
        Http { schema, introspection, app, graphiql: graphiql.finish(), in_flight, documents: Documents::default() };
    Router::new()
        .route("/", get(graphiql_page))
        .route("/graphql", get(graphiql_page).post(graphql))
        // graphql-transport-ws and the legacy graphql-ws, by subprotocol.
        .route_service("/graphql/ws", subscriptions)
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .layer(DefaultBodyLimit::max(body_limit))
        // A bug must not drop the connection without an answer: a panic in a
        // handler becomes a 500 with a GraphQL-shaped INTERNAL error.
        .layer(CatchPanicLayer::custom(|_| {
            tracing::error!("request handler panicked");
            let body = json!({ "errors": [{ "message": "internal error", "extensions": { "code": "INTERNAL" } }] });
            (StatusCode::INTERNAL_SERVER_ERROR, axum::Json(body)).into_response()
        }))
        .with_state(state)
}

async fn graphiql_page(State(http): State<Http>) -> Html<String> {
    Html(http.graphiql)
}

/// A plain error response for a body that never became a GraphQL request.
fn bad_request(message: String) -> Response {
    let body = json!({ "errors": [{ "message": message, "extensions": { "code": "BAD_REQUEST" } }] });
    (StatusCode::BAD_REQUEST, axum::Json(body)).into_response()
}

/// A GraphQL request or, when the body is a JSON array, a batch. Deciding
/// by the first byte spares serde's untagged-enum buffering, which copies
/// every string of the body once more before it is read.
fn parse_body(body: &[u8]) -> serde_json::Result<BatchRequest> {
    match body.iter().find(|b| !b.is_ascii_whitespace()) {
        Some(b'[') => serde_json::from_slice(body).map(BatchRequest::Batch),
        _ => serde_json::from_slice(body).map(BatchRequest::Single),
    }
}

/// Runs a GraphQL request or batch. The body is read as bytes so the body
/// limit answers 413, and JSON that is not a GraphQL request answers 400.
async fn graphql(State(http): State<Http>, headers: HeaderMap, body: Bytes) -> Response {
    // Refuse rather than queue: a full server answers at once, so memory and
    // waiting stay bounded however many clients come.
    let Ok(_permit) = http.in_flight.clone().try_acquire_owned() else {
        crate::telemetry::db_failure("overloaded");
        let body = json!({ "errors": [{
            "message": "the server is at its limit of requests in flight, try again",
            "extensions": { "code": "OVERLOADED", "retryable": true }
        }] });
        return (StatusCode::SERVICE_UNAVAILABLE, [(axum::http::header::RETRY_AFTER, "1")], axum::Json(body))
            .into_response();
    };
    let batch = match parse_body(&body) {
        Ok(batch) => batch,
        Err(err) => return bad_request(format!("the body is not a GraphQL request: {err}")),
    };
    // A JSON object without a query parses as an empty request; it is not one.
    let empty = |r: &async_graphql::Request| r.query.trim().is_empty();
    let has_empty = match &batch {
        BatchRequest::Single(request) => empty(request),
        BatchRequest::Batch(requests) => requests.is_empty() || requests.iter().any(empty),
    };
    if has_empty {
        return bad_request("the body is not a GraphQL request: it has no query".to_owned());
    }
    let viewer = http.app.keys.viewer(headers.get(AUTHORIZATION).and_then(|v| v.to_str().ok()));
    // Each operation gets its own DataLoaders, so nothing is cached past it.
    let mut introspecting = true;
    let mut prepare = |mut request: async_graphql::Request| {
        introspecting &= http.documents.prepare(&mut request) == Introspection::Only;
        let inventories = DataLoader::new(InventoryLoader { db: http.app.db.clone() }, tokio::spawn);
        let order_lines = DataLoader::new(OrderLinesLoader { db: http.app.db.clone() }, tokio::spawn);
        request.data(viewer.clone()).data(inventories).data(order_lines)
    };
    let batch = match batch {
        BatchRequest::Single(request) => BatchRequest::Single(prepare(request)),
        BatchRequest::Batch(requests) if requests.len() > http.app.limits.max_batch => {
            return bad_request(format!("a batch may hold at most {} operations", http.app.limits.max_batch));
        }
        BatchRequest::Batch(requests) => BatchRequest::Batch(requests.into_iter().map(prepare).collect()),
    };
    let schema = if introspecting { http.introspection } else { http.schema };
    let response = Finish::new(async move { schema.execute_batch(batch).await }).await;
    GraphQLResponse::from(response).into_response()
}

/// Runs a request's work to the end even when its handler is dropped.
///
/// hyper drops a handler when the client hangs up, and a request cancelled
/// halfway through its database work could leave a connection inside an open
/// transaction (sqlx 0.9 loses track of a transaction whose BEGIN was cut off)
/// or a commit whose answer nobody reads. So the work is awaited in place (no
/// hand-over to another task on the common path), and if the handler goes
/// away first, what is left of it moves to a task of its own and finishes
/// there (an idempotency key lets the client fetch the committed outcome).
struct Finish<F: Future + Send + 'static>(Option<Pin<Box<F>>>);

impl<F: Future + Send + 'static> Finish<F> {
    fn new(work: F) -> Self {
        Self(Some(Box::pin(work)))
    }
}

impl<F: Future + Send + 'static> Future for Finish<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let work = self.0.as_mut().unwrap_or_else(|| unreachable!("Finish polled after it completed"));
        let output = std::task::ready!(work.as_mut().poll(cx));
        self.0 = None;
        Poll::Ready(output)
    }
}

impl<F: Future + Send + 'static> Drop for Finish<F> {
    fn drop(&mut self) {
        // A panic in the work is the handler's to report; the work is not resumed.
        if std::thread::panicking() {
            return;
        }
        if let (Some(rest), Ok(runtime)) = (self.0.take(), tokio::runtime::Handle::try_current()) {
            runtime.spawn(async move {
                rest.await;
            });
        }
    }
}

/// Prometheus text format.
async fn metrics(State(http): State<Http>) -> Response {
    let body = crate::telemetry::render(&http.app.db);
    ([(axum::http::header::CONTENT_TYPE, "text/plain; version=0.0.4")], body).into_response()
}

async fn healthz() -> &'static str {
    "ok"
}

/// Ready when the database answers within a second.
async fn readyz(State(http): State<Http>) -> Response {
    if crate::db::is_ready(&http.app.db, Duration::from_secs(1)).await {
        "ready".into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "database unreachable").into_response()
    }
}

/// Serves `router` on `listener` until `shutdown` resolves, then lets the
/// requests in flight finish.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    // Answers are small and each is written at once: Nagle's algorithm could
    // only hold one back waiting for the client's ACK.
    let listener = listener.tap_io(|tcp| {
        if let Err(err) = tcp.set_nodelay(true) {
            tracing::debug!(error = %err, "cannot set TCP_NODELAY");
        }
    });
    axum::serve(listener, router).with_graceful_shutdown(shutdown).await
}

/// Resolves on SIGINT or SIGTERM.
pub async fn shutdown_signal() {
    let interrupt = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut terminate = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(signal) => signal,
            Err(err) => {
                tracing::warn!(error = %err, "cannot listen for SIGTERM");
                let _ = interrupt.await;
                return;
            }
        };
        tokio::select! {
            _ = interrupt => {},
            _ = terminate.recv() => {},
        }
    }
    #[cfg(not(unix))]
    let _ = interrupt.await;
    tracing::info!("shutting down: finishing requests in flight");
}
