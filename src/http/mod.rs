//! HTTP: `GET`/`POST /graphql` (see `graphql.rs`), subscriptions at `/graphql/ws`, GraphiQL at `/`,
//! `/healthz`, `/readyz`, `/metrics`; the body limit and the request
//! timeout; serving with bounded connections until SIGINT/SIGTERM.
//!
//! Every GraphQL operation, from here or from a websocket, enters through
//! the [`Gateway`]; this module only turns HTTP into requests and
//! responses into HTTP.

mod callers;
mod graphiql;
mod graphql;
mod server;
mod ws;

use std::{sync::Arc, time::Duration};

use axum::{
    Router,
    extract::{DefaultBodyLimit, Request, State},
    http::{HeaderName, HeaderValue, Method, StatusCode, header},
    middleware::{self, Next},
    response::{IntoResponse, Response},
    routing::get,
};
use serde_json::json;
use tower_http::{
    catch_panic::CatchPanicLayer,
    cors::{AllowOrigin, CorsLayer},
};

pub(crate) use self::server::{ConnectionLimits, serve};
use crate::{app::AppState, error::ErrorCode, gateway::Gateway, server::Server};

/// What the handlers share: axum clones it for every request, so it is
/// one `Arc` (a clone of the GraphiQL page and of the state for each
/// request measured a tenth of the server's CPU per reservation).
#[derive(Clone)]
struct Http(Arc<Shared>);

impl std::ops::Deref for Http {
    type Target = Shared;

    fn deref(&self) -> &Shared {
        &self.0
    }
}

/// What [`Http`] holds.
struct Shared {
    /// Where every GraphQL operation enters.
    gateway: Gateway,
    /// The shared state: keys, limits, the pool for readiness.
    app: AppState,
    /// The rendered GraphiQL page.
    graphiql: graphiql::Page,
    /// Live subscriptions of this process, under their cap.
    subscriptions: ws::Subscriptions,
}

/// The router over `server`. `graphiql_token`, when given, is prefilled as the
/// `Authorization` header of GraphiQL (only for a server with a throw-away
/// secret on a loopback address, see `Settings::from_config` in `startup.rs`).
pub(crate) fn router(server: &Server, graphiql_token: Option<&str>) -> Router {
    crate::telemetry::install_metrics();
    let bearer = graphiql_token.map(|token| format!("Bearer {token}"));
    let app = server.state().clone();
    let limits = app.limits.clone();
    let state = Http(Arc::new(Shared {
        gateway: server.gateway(),
        app,
        graphiql: graphiql::Page::new(bearer.as_deref()),
        subscriptions: ws::Subscriptions::default(),
    }));
    let request_timeout = Duration::from_millis(limits.request_timeout_ms);
    // Requests that end: bounded in time. The websocket is long-lived and
    // bounded by its own timeouts instead.
    let requests = Router::new()
        .route("/", get(graphiql_page))
        .route("/graphiql/{version}/{name}", get(graphiql::asset))
        .route(
            "/graphql",
            get(graphql::get).post(graphql::post).layer(middleware::from_fn(crate::telemetry::http_request)),
        )
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .layer(middleware::from_fn_with_state(request_timeout, within_timeout));
    Router::new()
        // graphql-transport-ws and the legacy graphql-ws, by subprotocol.
        .route("/graphql/ws", get(ws::upgrade))
        .merge(requests)
        .layer(DefaultBodyLimit::max(limits.body_limit))
        .layer(cors(&limits.cors_origins, graphiql_token.is_some()))
        // A bug must not drop the connection without an answer: a panic in a
        // handler becomes a 500 with a GraphQL-shaped INTERNAL error.
        .layer(CatchPanicLayer::custom(|_| {
            tracing::error!("request handler panicked");
            error_response(StatusCode::INTERNAL_SERVER_ERROR, ErrorCode::Internal, "internal error")
        }))
        .with_state(state)
}

/// Which browser origins may call the API: the configured ones, and in
/// development (`dev`: the server made its own secret) any loopback origin,
/// so a frontend on `localhost:5173` works out of the box. Preflights are
/// answered for GET and POST with the headers GraphQL clients send.
fn cors(origins: &[String], dev: bool) -> CorsLayer {
    let layer = CorsLayer::new()
        .allow_methods([Method::GET, Method::POST])
        .allow_headers([
            header::AUTHORIZATION,
            header::CONTENT_TYPE,
            header::ACCEPT,
            HeaderName::from_static("apollo-require-preflight"),
            HeaderName::from_static("x-apollo-operation-name"),
        ])
        .max_age(Duration::from_secs(600));
    if origins.iter().any(|origin| origin.trim() == "*") {
        return layer.allow_origin(AllowOrigin::any());
    }
    let listed: Vec<HeaderValue> = origins.iter().filter_map(|o| HeaderValue::from_str(o.trim()).ok()).collect();
    layer.allow_origin(AllowOrigin::predicate(move |origin, _| {
        listed.contains(origin) || (dev && origin.to_str().is_ok_and(is_loopback_origin))
    }))
}

/// `http://localhost:<port>`, `http://127.0.0.1:<port>`, `http://[::1]:<port>` (or without a port).
fn is_loopback_origin(origin: &str) -> bool {
    let Some(host) = origin.strip_prefix("http://").or_else(|| origin.strip_prefix("https://")) else { return false };
    let host = match host.rsplit_once(':') {
        Some((host, port)) if port.chars().all(|c| c.is_ascii_digit()) => host,
        _ => host,
    };
    matches!(host, "localhost" | "127.0.0.1" | "[::1]")
}

/// The connection bounds of `limits`, for [`serve`].
pub(crate) fn connection_limits(limits: &crate::config::Limits) -> ConnectionLimits {
    ConnectionLimits {
        max_connections: limits.max_connections,
        header_read_timeout: Duration::from_millis(limits.header_read_timeout_ms),
        idle_timeout: Duration::from_millis(limits.idle_timeout_ms),
    }
}

/// A GraphQL-shaped error body with one error and its code, for answers
/// that never reached GraphQL (a body that is not a request, too large, too
/// slow, a full server, a panic).
fn error_response(status: StatusCode, code: ErrorCode, message: &str) -> Response {
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
            ErrorCode::RequestTimeout,
            "the request took longer than the server's request timeout",
        ),
    }
}

async fn graphiql_page(State(http): State<Http>) -> Response {
    http.graphiql.response()
}

/// Prometheus text format.
async fn metrics(State(http): State<Http>) -> Response {
    let body = crate::telemetry::render(&http.app.db);
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], body).into_response()
}

async fn healthz() -> &'static str {
    "ok"
}

/// Ready when the process is not draining and the database accepts writes
/// within a second (asked on a connection of its own, never behind the pool).
async fn readyz(State(http): State<Http>) -> Response {
    if http.app.draining.load(std::sync::atomic::Ordering::Acquire) {
        (StatusCode::SERVICE_UNAVAILABLE, "draining: this process is stopping").into_response()
    } else if http.app.ready.is_ready(Duration::from_secs(1)).await {
        "ready".into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "database unreachable or read-only").into_response()
    }
}

/// Resolves on SIGINT or SIGTERM.
pub(crate) async fn shutdown_signal() {
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
