//! The webhook receiver of `--webhook`: answers every POST with 204 and
//! records what arrived and when: the lag of each event, the stock changes
//! received, a repeat or a version out of order, a body not signed with the
//! endpoint's secret.
//!
//! It stands for a shop's system on another machine, so it takes as little
//! of this one as it can while the load runs: it listens on a thread of its
//! own (not the load's), and it only keeps each body with its arrival time
//! and signature, as docs/webhooks.md tells receivers to (answer, then
//! work); the bodies are checked when what arrived is read, between the
//! measured runs.

use std::{
    collections::{HashMap, HashSet},
    net::SocketAddr,
    sync::{Arc, Mutex, OnceLock, PoisonError},
    time::Duration,
};

use axum::{
    Router,
    body::Bytes,
    extract::State,
    http::{HeaderMap, HeaderValue, StatusCode},
    routing::post,
};
use chrono::{DateTime, Utc};
use serde::Deserialize;
use uuid::Uuid;

/// What the receiver recorded.
#[derive(Default)]
pub(super) struct Arrivals {
    /// `(inventory, version)` of every STOCK_CHANGED received.
    pub(super) stock: HashSet<(Uuid, i64)>,
    /// The highest version received per inventory.
    pub(super) newest: HashMap<Uuid, i64>,
    /// Lags are recorded for events that occurred from this instant on.
    pub(super) lags_from: Option<DateTime<Utc>>,
    /// Of each stock change's first arrival: (`occurredAt` after
    /// `lags_from`, arrival minus `occurredAt` in ms). Its other events
    /// come in the same pass of the pump, so they add nothing.
    pub(super) lags: Vec<(Duration, f64)>,
    pub(super) events: u64,
    pub(super) bodies: u64,
    pub(super) repeats: u64,
    pub(super) out_of_order: u64,
    pub(super) bad: u64,
}

/// A webhook receiver in this process: answers every POST with 204 and
/// records what arrived, when.
pub(super) struct Receiver {
    /// `http://127.0.0.1:<port>/hook`.
    pub(super) url: String,
    shared: Arc<Shared>,
    /// Stops the receiver's thread when dropped.
    _stop: tokio::sync::oneshot::Sender<()>,
}

/// Most bytes of bodies kept unchecked: past them the receiver checks what
/// it kept before it answers (a long run's bodies would not fit in memory).
/// Above what the cells send (about 350 MiB in the default full run, under
/// 1 GiB at 24 s a side): a check is a burst of a second of CPU, and one
/// that fell in a round with the endpoint counted against it (at 256 MiB,
/// two or three fell inside the cells of every full run).
const MOST_KEPT_BYTES: usize = 2 << 30;

#[derive(Default)]
struct Shared {
    /// The endpoint's signing secret, once created.
    secret: OnceLock<String>,
    /// The bodies not yet checked, and their bytes.
    kept: Mutex<(Vec<Kept>, usize)>,
    arrivals: Mutex<Arrivals>,
}

/// A body as it arrived, not yet checked.
struct Kept {
    at: DateTime<Utc>,
    signature: Option<HeaderValue>,
    body: Bytes,
}

/// A body as sent; `data` and the other fields are not read.
#[derive(Deserialize)]
struct Body {
    events: Vec<Event>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Event {
    #[serde(rename = "type")]
    kind: String,
    occurred_at: DateTime<Utc>,
    inventory_id: Option<Uuid>,
    version: Option<i64>,
}

impl Receiver {
    /// Listens on a free loopback port, on a thread of its own.
    pub(super) async fn start() -> anyhow::Result<Self> {
        let listener = std::net::TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0)))?;
        listener.set_nonblocking(true)?;
        let port = listener.local_addr()?.port();
        let shared = Arc::new(Shared::default());
        let app = Router::new().route("/hook", post(receive)).with_state(shared.clone());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        std::thread::Builder::new().name("webhook-receiver".into()).spawn(move || {
            runtime.block_on(async move {
                let served = async {
                    let listener = tokio::net::TcpListener::from_std(listener)?;
                    axum::serve(listener, app).with_graceful_shutdown(async { drop(stopped.await) }).await
                };
                if let Err(err) = served.await {
                    eprintln!("bench: webhook: the receiver stopped: {err}");
                }
            });
        })?;
        let url = format!("http://127.0.0.1:{port}/hook");
        Ok(Self { url, shared, _stop: stop })
    }

    /// The endpoint's signing secret, once it is created.
    pub(super) fn set_secret(&self, secret: &str) {
        let _ = self.shared.secret.set(secret.to_owned());
    }

    /// What arrived so far, every body kept until now checked.
    pub(super) fn inner(&self) -> std::sync::MutexGuard<'_, Arrivals> {
        self.shared.check_kept()
    }
}

async fn receive(State(shared): State<Arc<Shared>>, headers: HeaderMap, body: Bytes) -> StatusCode {
    let body = Kept { at: Utc::now(), signature: headers.get("stockguard-signature").cloned(), body };
    let full = {
        let mut kept = shared.kept.lock().unwrap_or_else(PoisonError::into_inner);
        kept.1 += body.body.len();
        kept.0.push(body);
        kept.1 > MOST_KEPT_BYTES
    };
    if full {
        drop(shared.check_kept());
    }
    StatusCode::NO_CONTENT
}

impl Shared {
    /// Checks the bodies kept; what arrived.
    fn check_kept(&self) -> std::sync::MutexGuard<'_, Arrivals> {
        let (kept, _) = std::mem::take(&mut *self.kept.lock().unwrap_or_else(PoisonError::into_inner));
        let mut arrivals = self.arrivals.lock().unwrap_or_else(PoisonError::into_inner);
        let secret = self.secret.get().map(String::as_str);
        for body in kept {
            arrivals.check(secret, body);
        }
        arrivals
    }
}

impl Arrivals {
    /// Records a body that arrived `kept.at`.
    fn check(&mut self, secret: Option<&str>, kept: Kept) {
        let signature = kept.signature.as_ref().and_then(|v| v.to_str().ok()).unwrap_or_default();
        let signed = signed(secret, signature, &kept.body);
        self.bodies += 1;
        let events = match serde_json::from_slice::<Body>(&kept.body) {
            Ok(parsed) if signed => parsed.events,
            _ => {
                self.bad += 1;
                return;
            }
        };
        for event in events {
            self.events += 1;
            let (Some(inventory), Some(version)) = (event.inventory_id, event.version) else { continue };
            if event.kind != "STOCK_CHANGED" {
                continue;
            }
            if !self.stock.insert((inventory, version)) {
                self.repeats += 1;
                continue;
            }
            if let Some(from) = self.lags_from.filter(|from| event.occurred_at >= *from) {
                let at = (event.occurred_at - from).to_std().unwrap_or_default();
                let lag_ms = (kept.at - event.occurred_at).num_microseconds().unwrap_or(i64::MAX) as f64 / 1000.0;
                self.lags.push((at, lag_ms));
            }
            let newest = self.newest.entry(inventory).or_insert(i64::MIN);
            let in_order = version > *newest;
            *newest = version.max(*newest);
            if !in_order {
                self.out_of_order += 1;
            }
        }
    }
}

/// Whether `header` is the signature of `body` with `secret`
/// (`t=<unix seconds>,v1=<hex HMAC>`, docs/webhooks.md).
fn signed(secret: Option<&str>, header: &str, body: &[u8]) -> bool {
    let t = header.split(',').find_map(|part| part.strip_prefix("t=")).and_then(|t| t.parse().ok());
    let (Some(secret), Some(t), Ok(body)) = (secret, t, std::str::from_utf8(body)) else { return false };
    stockguard::events::deliver::send::signature(secret, t, body).is_some_and(|expected| expected == header)
}
