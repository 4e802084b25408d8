//! Serving the router on a TCP listener with every connection bounded: a cap
//! on open connections, a header-read timeout, an idle keep-alive timeout,
//! and a graceful shutdown that lets the requests in flight finish.
//!
//! hyper's own header-read timer starts whenever a connection waits for a
//! request head, idle keep-alive included, so it cannot tell a slow client
//! from a quiet one. Each connection here is watched instead: bytes of a new
//! request arriving start the header clock, the router taking the request
//! stops it, and a connection with no request in flight is closed when its
//! head is late or it has been idle too long. A connection that is serving a
//! request is never cut here (the router's request timeout answers it).

use std::{
    future::Future,
    io,
    pin::Pin,
    sync::{Arc, Mutex},
    task::{Context, Poll},
    time::{Duration, Instant},
};

use axum::{
    Router,
    body::Body,
    extract::{ConnectInfo, Request},
};
use hyper::body::Incoming;
use hyper_util::{
    rt::{TokioExecutor, TokioIo},
    server::{conn::auto, graceful::GracefulShutdown},
};
use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    net::{TcpListener, TcpStream},
    sync::{OwnedSemaphorePermit, Semaphore},
};
use tower::ServiceExt;

/// How long a stopping server waits for the requests in flight.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);

/// The bounds every connection keeps.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ConnectionLimits {
    /// Most connections open at once.
    pub max_connections: usize,
    /// Longest wait for a request's head once it is due (connection opened,
    /// or its first byte arrived).
    pub header_read_timeout: Duration,
    /// Longest idle time between requests.
    pub idle_timeout: Duration,
}

/// Serves `router` on `listener` until `shutdown` resolves, then lets the
/// requests in flight finish (at most [`DRAIN_TIMEOUT`]).
pub(crate) async fn serve(
    listener: TcpListener,
    router: Router,
    limits: ConnectionLimits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> io::Result<()> {
    let open = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let graceful = GracefulShutdown::new();
    let mut builder = auto::Builder::new(TokioExecutor::new());
    // The watch below replaces hyper's header timer (see the module docs).
    builder.http1().header_read_timeout(None);
    let builder = Arc::new(builder);
    tokio::pin!(shutdown);
    loop {
        // At the cap, stop accepting: new clients wait in the listen queue
        // until a connection closes, instead of being refused.
        let permit = tokio::select! {
            permit = open.clone().acquire_owned() => permit.map_err(io::Error::other)?,
            () = &mut shutdown => break,
        };
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(err) => {
                    // Out of file descriptors and the like: back off, keep serving.
                    tracing::warn!(error = %err, "cannot accept a connection");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        // Answers are small and each is written at once: Nagle's algorithm could
        // only hold one back waiting for the client's ACK.
        if let Err(err) = stream.set_nodelay(true) {
            tracing::debug!(error = %err, "cannot set TCP_NODELAY");
        }
        let watch = Watch::new();
        let service = {
            let (router, watch) = (router.clone(), watch.clone());
            hyper::service::service_fn(move |mut request: Request<Incoming>| {
                let busy = watch.busy();
                // The peer's address, for the handlers that key on the caller (as
                // axum's `into_make_service_with_connect_info` would put it).
                request.extensions_mut().insert(ConnectInfo(peer));
                let response = router.clone().oneshot(request.map(Body::new));
                async move {
                    let response = response.await;
                    drop(busy);
                    response
                }
            })
        };
        let io = TokioIo::new(Watched::new(stream, watch.clone(), permit));
        let connection = graceful.watch(builder.serve_connection_with_upgrades(io, service).into_owned());
        tokio::spawn(async move { watch.until_done_or_stale(connection, limits).await });
    }
    drop(listener);
    tokio::select! {
        () = graceful.shutdown() => {}
        () = tokio::time::sleep(DRAIN_TIMEOUT) => tracing::warn!("requests still in flight after the drain timeout"),
    }
    Ok(())
}

/// What a connection is doing, as its watch sees it.
#[derive(Debug)]
struct State {
    /// Requests the router is serving on it.
    in_flight: usize,
    /// Since when a request head is due: the connection opened, or bytes of
    /// a new request arrived. `None` while serving or idle.
    head_due_since: Option<Instant>,
    /// Since when it has had nothing to do.
    idle_since: Instant,
}

/// The shared view of one connection.
#[derive(Clone)]
struct Watch(Arc<Mutex<State>>);

/// Marks a request in flight until dropped (also when its client hangs up).
struct Busy(Watch);

impl Watch {
    fn new() -> Self {
        let now = Instant::now();
        // A new connection owes its first request's head at once.
        Self(Arc::new(Mutex::new(State { in_flight: 0, head_due_since: Some(now), idle_since: now })))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn busy(&self) -> Busy {
        let mut state = self.lock();
        state.in_flight += 1;
        state.head_due_since = None;
        Busy(self.clone())
    }

    /// Bytes arrived: on a connection with nothing in flight they start a
    /// request, whose head is now due.
    fn read_some(&self) {
        let mut state = self.lock();
        if state.in_flight == 0 && state.head_due_since.is_none() {
            state.head_due_since = Some(Instant::now());
        }
    }

    /// When this connection is stale if nothing changes; `None` while it serves.
    fn deadline(&self, limits: ConnectionLimits) -> Option<Instant> {
        let state = self.lock();
        match (state.in_flight, state.head_due_since) {
            (0, Some(since)) => Some(since + limits.header_read_timeout),
            (0, None) => Some(state.idle_since + limits.idle_timeout),
            _ => None,
        }
    }

    /// Drives `connection` until it ends or goes stale; a stale connection
    /// is dropped, which closes its socket.
    async fn until_done_or_stale(
        &self,
        connection: impl Future<Output = Result<(), BoxError>>,
        limits: ConnectionLimits,
    ) {
        tokio::pin!(connection);
        loop {
            // Changes of state are not signalled (that would cost a wake-up
            // per request), so the connection is looked at again at least
            // every shorter timeout: a stale one is closed at most that late.
            let recheck = Instant::now() + limits.header_read_timeout.min(limits.idle_timeout);
            let wake = self.deadline(limits).map_or(recheck, |deadline| deadline.min(recheck));
            tokio::select! {
                ended = &mut connection => {
                    if let Err(err) = ended {
                        tracing::debug!(error = %err, "connection ended with an error");
                    }
                    return;
                }
                () = tokio::time::sleep_until(wake.into()) => {}
            }
            if self.deadline(limits).is_some_and(|deadline| deadline <= Instant::now()) {
                tracing::debug!("closing a connection that was idle or slow to send a request");
                return;
            }
        }
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl Drop for Busy {
    fn drop(&mut self) {
        let mut state = self.0.lock();
        state.in_flight = state.in_flight.saturating_sub(1);
        if state.in_flight == 0 {
            state.idle_since = Instant::now();
        }
    }
}

/// A TCP stream that tells its watch when bytes arrive. It holds its place
/// under the connection cap for as long as it is open, after a websocket
/// upgrade too.
struct Watched {
    stream: TcpStream,
    watch: Watch,
    _place: OwnedSemaphorePermit,
}

impl Watched {
    fn new(stream: TcpStream, watch: Watch, place: OwnedSemaphorePermit) -> Self {
        crate::telemetry::http_connections(1);
        Self { stream, watch, _place: place }
    }
}

impl Drop for Watched {
    fn drop(&mut self) {
        crate::telemetry::http_connections(-1);
    }
}

impl AsyncRead for Watched {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.stream).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.watch.read_some();
        }
        polled
    }
}

impl AsyncWrite for Watched {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}
