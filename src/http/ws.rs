//! GraphQL over websockets at `/graphql/ws` (graphql-transport-ws, and the
//! legacy graphql-ws, by subprotocol).
//!
//! Every operation on a socket goes through the same [`Gateway`] as an HTTP
//! request: the caller (from `connection_init`'s payload or the upgrade's
//! `Authorization` header), the DataLoaders, the document bounds, and the
//! in-flight permit for queries and mutations. A socket adds its own bounds:
//! messages no larger than an HTTP body, `connection_init` within a timeout
//! (else close 4408, as graphql-transport-ws says), a ping every interval
//! (a socket that answers nothing for two is closed), and a cap on live
//! subscriptions per socket and per process (past it, that subscription
//! gets an error; the socket stays open).
//!
//! A panic in an operation's work ends that operation with an `INTERNAL`
//! error and leaves the socket and the process serving (the websocket's
//! counterpart of the HTTP router's `CatchPanicLayer`): a query or mutation
//! runs in a task of its own, and a subscription's stream is polled under
//! [`guarded`].

use std::{
    net::IpAddr,
    sync::{
        Arc, OnceLock,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use async_graphql::{
    Data, Executor, Request, Response, ServerError,
    http::{ALL_WEBSOCKET_PROTOCOLS, WebSocket, WebSocketProtocols, WsMessage},
    parser::types::OperationType,
};
use axum::{
    extract::{
        State, WebSocketUpgrade,
        ws::{CloseFrame, Message, WebSocket as Socket},
    },
    http::{HeaderMap, StatusCode, header},
    response::{IntoResponse, Response as HttpResponse},
};
use futures::{FutureExt, SinkExt, StreamExt, stream::BoxStream};

use super::{
    Http,
    callers::{Peer, address, authorization},
};
use crate::{
    auth::{Keys, Viewer},
    error::ErrorCode,
    gateway::{Caller, Gateway, Refusal},
};

/// A socket's read buffer (and its write buffer's flush threshold): GraphQL
/// messages are small, and a larger one grows as needed up to the limit.
const READ_BUFFER: usize = 4096;

/// Live subscriptions of the whole process, shared by every socket.
#[derive(Clone, Default)]
pub(super) struct Subscriptions(Arc<AtomicUsize>);

/// Upgrades `/graphql/ws` to a websocket and serves GraphQL on it.
pub(super) async fn upgrade(
    State(http): State<Http>,
    peer: Peer,
    headers: HeaderMap,
    upgrade: WebSocketUpgrade,
) -> HttpResponse {
    let protocol = headers
        .get(header::SEC_WEBSOCKET_PROTOCOL)
        .and_then(|value| value.to_str().ok())
        .and_then(|offered| offered.split(',').find_map(|p| p.trim().parse::<WebSocketProtocols>().ok()));
    let Some(protocol) = protocol else {
        return (StatusCode::BAD_REQUEST, "offer graphql-transport-ws or graphql-ws as Sec-WebSocket-Protocol")
            .into_response();
    };
    let limit = http.app.limits.body_limit;
    let authorization = authorization(&headers).map(str::to_owned);
    // The socket's operations are one caller's, from the address it came from.
    let address = address(&http, &headers, &peer);
    upgrade
        .protocols(ALL_WEBSOCKET_PROTOCOLS)
        .max_message_size(limit)
        .max_frame_size(limit)
        // Buffers that grow with the messages instead of 128 KiB per socket
        // up front, and a bound on what waits for a client that stops reading.
        .read_buffer_size(READ_BUFFER)
        .write_buffer_size(READ_BUFFER)
        .max_write_buffer_size(limit.saturating_mul(4))
        .on_upgrade(move |socket| serve(socket, http, protocol, authorization, address))
}

/// One socket, until either side closes it or it breaks a bound.
async fn serve(
    socket: Socket,
    http: Http,
    protocol: WebSocketProtocols,
    authorization: Option<String>,
    address: IpAddr,
) {
    let limits = &http.app.limits;
    let init_timeout = Duration::from_millis(limits.ws_init_timeout_ms);
    let keepalive = Duration::from_millis(limits.ws_keepalive_ms.max(1));
    let (mut sink, stream) = socket.split();
    let heard = Arc::new(std::sync::Mutex::new(Instant::now()));
    let input = {
        let heard = heard.clone();
        stream.take_while(|message| futures::future::ready(message.is_ok())).filter_map(move |message| {
            *heard.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Instant::now();
            futures::future::ready(match message {
                Ok(Message::Text(text)) => Some(text.as_bytes().to_vec()),
                Ok(Message::Binary(bytes)) => Some(bytes.to_vec()),
                _ => None,
            })
        })
    };
    let caller: Arc<OnceLock<Viewer>> = Arc::new(OnceLock::new());
    let initialised = caller.clone();
    let executor = SocketExecutor {
        gateway: http.gateway.clone(),
        caller: caller.clone(),
        address,
        on_socket: Arc::default(),
        per_socket: limits.max_subscriptions_per_socket,
        in_process: http.subscriptions.clone(),
        per_process: limits.max_subscriptions,
    };
    let keys = http.app.keys.clone();
    let messages = WebSocket::new(executor, input, protocol).on_connection_init(move |payload| {
        let _ = caller.set(caller_of(&keys, &payload, authorization.as_deref()));
        futures::future::ready(Ok(Data::default()))
    });
    tokio::pin!(messages);
    let init_deadline = tokio::time::Instant::now() + init_timeout;
    let mut pings = tokio::time::interval_at(tokio::time::Instant::now() + keepalive, keepalive);
    loop {
        let outgoing = tokio::select! {
            message = messages.next() => match message {
                Some(WsMessage::Text(text)) => Message::Text(text.into()),
                Some(WsMessage::Close(code, reason)) => close(code, reason),
                None => break,
            },
            () = tokio::time::sleep_until(init_deadline), if initialised.get().is_none() => {
                close(4408, "Connection initialisation timeout".to_owned())
            }
            _ = pings.tick() => {
                let quiet = heard.lock().unwrap_or_else(std::sync::PoisonError::into_inner).elapsed();
                if quiet > keepalive * 2 {
                    close(1001, "no answer to pings".to_owned())
                } else {
                    Message::Ping(Vec::new().into())
                }
            }
        };
        let closing = matches!(outgoing, Message::Close(_));
        if sink.send(outgoing).await.is_err() {
            return;
        }
        if closing {
            // The closing handshake: read (and drop) what the client still
            // sends until its own Close, so the socket ends cleanly rather
            // than with a reset that could lose our Close frame; bounded.
            let _ = tokio::time::timeout(CLOSING_GRACE, async { while messages.next().await.is_some() {} }).await;
            return;
        }
    }
}

/// How long a closing socket waits for the client's Close.
const CLOSING_GRACE: Duration = Duration::from_secs(1);

fn close(code: u16, reason: String) -> Message {
    Message::Close(Some(CloseFrame { code, reason: reason.into() }))
}

/// The caller of a socket: the `Authorization` in `connection_init`'s payload
/// (at its top, or in `headers`, as GraphiQL and Apollo send it), else the
/// upgrade request's header.
fn caller_of(keys: &Keys, payload: &serde_json::Value, header: Option<&str>) -> Viewer {
    let from_payload = [payload, &payload["headers"]]
        .into_iter()
        .find_map(|object| object.get("Authorization").or_else(|| object.get("authorization")))
        .and_then(serde_json::Value::as_str);
    keys.viewer(from_payload.or(header))
}

/// Runs a socket's operations through the gateway.
#[derive(Clone)]
struct SocketExecutor {
    gateway: Gateway,
    /// Set by `connection_init`.
    caller: Arc<OnceLock<Viewer>>,
    /// Where the socket came from.
    address: IpAddr,
    /// Live subscriptions on this socket.
    on_socket: Arc<AtomicUsize>,
    per_socket: usize,
    /// Live subscriptions in the process.
    in_process: Subscriptions,
    per_process: usize,
}

impl SocketExecutor {
    fn caller(&self) -> Caller {
        Caller { viewer: self.caller.get().cloned().unwrap_or(Viewer::Anonymous), address: self.address }
    }

    /// A place for one more subscription, if both caps allow it.
    fn place(&self) -> Option<Place> {
        let socket = Counted::take(&self.on_socket, self.per_socket)?;
        let process = Counted::take(&self.in_process.0, self.per_process)?;
        crate::telemetry::subscriptions(1);
        Some(Place { _socket: socket, _process: process })
    }
}

impl Executor for SocketExecutor {
    fn execute(&self, request: Request) -> impl std::future::Future<Output = Response> + Send {
        let visit = self.gateway.visit(self.caller());
        let admitted = match self.gateway.turned_away(&visit) {
            Some(refusal) => Err(refusal),
            None => self.gateway.admit(request, &visit),
        }
        .map_err(|refusal| self.gateway.refused(refusal, &visit));
        let work = async move {
            match admitted {
                Ok(admitted) => admitted.execute().await,
                Err(refused) => refused,
            }
        };
        std::panic::AssertUnwindSafe(work).catch_unwind().map(|answer| answer.unwrap_or_else(|_| panicked()))
    }

    fn execute_stream(&self, request: Request, _session: Option<Arc<Data>>) -> BoxStream<'static, Response> {
        let visit = self.gateway.visit(self.caller());
        if let Some(refusal) = self.gateway.turned_away(&visit) {
            return once(self.gateway.refused(refusal, &visit));
        }
        let prepared = match self.gateway.prepare(request, &visit) {
            Ok(prepared) => prepared,
            Err(refusal) => return once(self.gateway.refused(refusal, &visit)),
        };
        if prepared.kind() != OperationType::Subscription {
            // Started at once in a task of its own: an operation that reached
            // the server runs to its end even if its socket closes right
            // after sending it (an HTTP request is kept running the same way).
            return match prepared.admit() {
                Ok(admitted) => {
                    let work = tokio::spawn(admitted.execute());
                    futures::stream::once(async move { work.await.unwrap_or_else(|_| panicked()) }).boxed()
                }
                Err(refusal) => once(self.gateway.refused(refusal, &visit)),
            };
        }
        let Some(place) = self.place() else {
            let mut error = ServerError::new(
                format!(
                    "at most {} live subscriptions per socket and {} per server; end one first",
                    self.per_socket, self.per_process
                ),
                None,
            );
            error.extensions.get_or_insert_with(Default::default).set("code", ErrorCode::TooManySubscriptions);
            return once(self.gateway.refused(Refusal::Request(error), &visit));
        };
        let responses = guarded(prepared.stream_unmetered());
        futures::stream::unfold((responses, place), |(mut responses, place)| async move {
            responses.next().await.map(|response| (response, (responses, place)))
        })
        .boxed()
    }
}

/// `responses`, ending with one `INTERNAL` error instead of unwinding into
/// the socket's task when polling them panics.
fn guarded(responses: BoxStream<'static, Response>) -> BoxStream<'static, Response> {
    std::panic::AssertUnwindSafe(responses)
        .catch_unwind()
        .map(|response| response.unwrap_or_else(|_| panicked()))
        .boxed()
}

/// The answer to an operation whose work panicked (the panic itself was
/// reported by the panic hook).
fn panicked() -> Response {
    tracing::error!("a websocket operation panicked");
    Refusal::internal().into_response()
}

fn once(response: Response) -> BoxStream<'static, Response> {
    futures::stream::once(futures::future::ready(response)).boxed()
}

/// One subscription's place under both caps, given back when it ends.
struct Place {
    _socket: Counted,
    _process: Counted,
}

impl Drop for Place {
    fn drop(&mut self) {
        crate::telemetry::subscriptions(-1);
    }
}

/// One unit of a shared count, given back on drop.
struct Counted(Arc<AtomicUsize>);

impl Counted {
    /// One unit of `count` if it is below `cap`.
    fn take(count: &Arc<AtomicUsize>, cap: usize) -> Option<Self> {
        count.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < cap).then_some(n + 1)).ok()?;
        Some(Self(count.clone()))
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_subscription_whose_stream_panics_ends_with_an_internal_error() {
        let first = Response::new(async_graphql::Value::from(1));
        let responses = futures::stream::iter([Some(first), None])
            .map(|response| response.unwrap_or_else(|| panic!("a resolver's bug")))
            .boxed();
        let answers: Vec<Response> = guarded(responses).collect().await;
        assert_eq!(answers.len(), 2, "the event before the panic, then the error, then the end");
        assert!(answers[0].errors.is_empty());
        let code = answers[1].errors.first().and_then(crate::gateway::code_of);
        assert_eq!(code, Some(ErrorCode::Internal));
    }
}
