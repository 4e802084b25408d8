//! HTTP: `POST /graphql`, subscriptions at `/graphql/ws`, GraphiQL at `/`,
//! `/healthz`, `/readyz`, `/metrics`; the body limit and the request
//! timeout; serving with bounded connections until SIGINT/SIGTERM.
//!
//! Every GraphQL operation, from here or from a websocket, enters through
//! the [`Gateway`]; this module only turns HTTP into requests and
//! responses into HTTP.

mod server;
mod ws;

use std::time::Duration;

use async_graphql::{BatchRequest, BatchResponse, http::GraphiQLSource};
use async_graphql_axum::GraphQLResponse;
use axum::{
    Router,
    body::{Body, Bytes},
    extract::{DefaultBodyLimit, Request, State},
    http::{HeaderMap, StatusCode, header},
    middleware::{self, Next},
    response::{Html, IntoResponse, Response},
    routing::get,
};
use serde_json::json;
use tower_http::catch_panic::CatchPanicLayer;

pub use self::server::{ConnectionLimits, serve};
use crate::{
    app::AppState,
    gateway::{Admitted, Gateway, Refusal},
    server::Server,
};

/// What the handlers share.
#[derive(Clone)]
struct Http {
    /// Where every GraphQL operation enters.
    gateway: Gateway,
    /// The shared state: keys, limits, the pool for readiness.
    app: AppState,
    /// The rendered GraphiQL page.
    graphiql: String,
    /// Live subscriptions of this process, under their cap.
    subscriptions: ws::Subscriptions,
}

/// The router over `server`. `graphiql_token`, when given, is prefilled as the
/// `Authorization` header of GraphiQL (only for a server with a throw-away
/// secret on a loopback address, see `cli.rs`).
pub fn router(server: &Server, graphiql_token: Option<&str>) -> Router {
    crate::telemetry::install_metrics();
    let bearer = graphiql_token.map(|token| format!("Bearer {token}"));
    let mut graphiql =
        GraphiQLSource::build().endpoint("/graphql").subscription_endpoint("/graphql/ws").title("Stockguard");
    if let Some(bearer) = bearer.as_deref() {
        graphiql = graphiql.header("Authorization", bearer);
    }
    let app = server.state().clone();
    let limits = app.limits.clone();
    let state = Http {
        gateway: Gateway::new(server),
        app,
        graphiql: graphiql.finish(),
        subscriptions: ws::Subscriptions::default(),
    };
    let request_timeout = Duration::from_millis(limits.request_timeout_ms);
    // Requests that end: bounded in time. The websocket is long-lived and
    // bounded by its own timeouts instead.
    let requests = Router::new()
        .route("/", get(graphiql_page))
        .route("/graphql", get(graphiql_page).post(graphql))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .layer(middleware::from_fn_with_state(request_timeout, within_timeout));
    Router::new()
        // graphql-transport-ws and the legacy graphql-ws, by subprotocol.
        .route("/graphql/ws", get(ws::upgrade))
        .merge(requests)
        .layer(DefaultBodyLimit::max(limits.body_limit))
        // A bug must not drop the connection without an answer: a panic in a
        // handler becomes a 500 with a GraphQL-shaped INTERNAL error.
        .layer(CatchPanicLayer::custom(|_| {
            tracing::error!("request handler panicked");
            error_response(StatusCode::INTERNAL_SERVER_ERROR, "INTERNAL", "internal error")
        }))
        .with_state(state)
}

/// The connection bounds of `limits`, for [`serve`].
pub fn connection_limits(limits: &crate::config::Limits) -> ConnectionLimits {
    ConnectionLimits {
        max_connections: limits.max_connections,
        header_read_timeout: Duration::from_millis(limits.header_read_timeout_ms),
        idle_timeout: Duration::from_millis(limits.idle_timeout_ms),
    }
}

/// A GraphQL-shaped error body with one error and its code, for answers
/// that never reached GraphQL (a body that is not a request, too large, too
/// slow, a full server, a panic).
fn error_response(status: StatusCode, code: &str, message: &str) -> Response {
    let retryable = matches!(status, StatusCode::SERVICE_UNAVAILABLE | StatusCode::REQUEST_TIMEOUT);
    let mut extensions = json!({ "code": code });
    if retryable {
        extensions["retryable"] = json!(true);
    }
    let body = json!({ "errors": [{ "message": message, "extensions": extensions }] });
    let mut response = (status, axum::Json(body)).into_response();
    if status == StatusCode::SERVICE_UNAVAILABLE {
        response.headers_mut().insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
    }
    response
}

/// Answers 408 when a request (its body upload included) takes longer than
/// the request timeout. Work that has started is not cut: it finishes in
/// the background (see `gateway::Finish`).
async fn within_timeout(State(timeout): State<Duration>, request: Request, next: Next) -> Response {
    match tokio::time::timeout(timeout, next.run(request)).await {
        Ok(response) => response,
        Err(_) => error_response(
            StatusCode::REQUEST_TIMEOUT,
            "REQUEST_TIMEOUT",
            "the request took longer than the server's request timeout",
        ),
    }
}

async fn graphiql_page(State(http): State<Http>) -> Html<String> {
    Html(http.graphiql)
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

/// Reads the body within the body limit: 413 past it.
async fn read_body(body: Body, limit: usize) -> Result<Bytes, Response> {
    axum::body::to_bytes(body, limit).await.map_err(|err| {
        let too_large =
            std::error::Error::source(&err).is_some_and(|source| source.is::<http_body_util::LengthLimitError>());
        if too_large {
            let message = format!("the body is larger than the limit of {limit} bytes");
            error_response(StatusCode::PAYLOAD_TOO_LARGE, "REQUEST_TOO_LARGE", &message)
        } else {
            error_response(StatusCode::BAD_REQUEST, "BAD_REQUEST", "the body could not be read")
        }
    })
}

/// Runs a GraphQL request or batch: JSON that is not a GraphQL request
/// answers 400, a body over the limit 413, a full server 503.
async fn graphql(State(http): State<Http>, headers: HeaderMap, body: Body) -> Response {
    let body = match read_body(body, http.app.limits.body_limit).await {
        Ok(body) => body,
        Err(response) => return response,
    };
    let batch = match parse_body(&body) {
        Ok(batch) => batch,
        Err(err) => {
            let message = format!("the body is not a GraphQL request: {err}");
            return error_response(StatusCode::BAD_REQUEST, "BAD_REQUEST", &message);
        }
    };
    // A JSON object without a query parses as an empty request; it is not one.
    let empty = |r: &async_graphql::Request| r.query.trim().is_empty();
    let single = matches!(batch, BatchRequest::Single(_));
    let requests = match batch {
        BatchRequest::Single(request) => vec![request],
        BatchRequest::Batch(requests) if requests.len() > http.app.limits.max_batch => {
            let message = format!("a batch may hold at most {} operations", http.app.limits.max_batch);
            return error_response(StatusCode::BAD_REQUEST, "BAD_REQUEST", &message);
        }
        BatchRequest::Batch(requests) if requests.is_empty() => Vec::new(),
        BatchRequest::Batch(requests) => requests,
    };
    if requests.is_empty() || requests.iter().any(empty) {
        return error_response(
            StatusCode::BAD_REQUEST,
            "BAD_REQUEST",
            "the body is not a GraphQL request: it has no query",
        );
    }
    let viewer = http.app.keys.viewer(headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()));
    let mut admitted: Vec<Result<Admitted, Refusal>> = Vec::with_capacity(requests.len());
    for request in requests {
        let admission = http.gateway.admit(request, viewer.clone());
        if matches!(admission, Err(Refusal::Overloaded)) {
            // Whatever was admitted is dropped unrun, its permits given back.
            return error_response(
                StatusCode::SERVICE_UNAVAILABLE,
                "OVERLOADED",
                "the server is at its limit of requests in flight, try again",
            );
        }
        admitted.push(admission);
    }
    let responses = futures::future::join_all(admitted.into_iter().map(|admission| async move {
        match admission {
            Ok(admitted) => admitted.execute().await,
            Err(refusal) => refusal.into_response(),
        }
    }))
    .await;
    let response = if single {
        BatchResponse::Single(responses.into_iter().next().unwrap_or_default())
    } else {
        BatchResponse::Batch(responses)
    };
    GraphQLResponse::from(response).into_response()
}

/// Prometheus text format.
async fn metrics(State(http): State<Http>) -> Response {
    let body = crate::telemetry::render(&http.app.db);
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], body).into_response()
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
