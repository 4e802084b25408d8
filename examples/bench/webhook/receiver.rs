//! The webhook receiver of `--webhook`: answers every POST with 204 and
//! records what arrived and when, cheaply (the bench's one thread also
//! drives the load): the lag of each event, the stock changes received, a
//! repeat or a version out of order, a body not signed with the endpoint's
//! secret.

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
    http::{HeaderMap, StatusCode},
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
    /// The endpoint's signing secret, once created.
    pub(super) secret: Arc<OnceLock<String>>,
    arrivals: Arc<Mutex<Arrivals>>,
    pub(super) task: tokio::task::JoinHandle<()>,
}

#[derive(Clone)]
struct Hook {
    secret: Arc<OnceLock<String>>,
    arrivals: Arc<Mutex<Arrivals>>,
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
    /// Listens on a free loopback port.
    pub(super) async fn start() -> anyhow::Result<Self> {
        let listener = tokio::net::TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0))).await?;
        let port = listener.local_addr()?.port();
        let hook = Hook { secret: Arc::default(), arrivals: Arc::default() };
        let app = Router::new().route("/hook", post(receive)).with_state(hook.clone());
        let task = tokio::spawn(async move {
            if let Err(err) = axum::serve(listener, app).await {
                eprintln!("bench: webhook: the receiver stopped: {err}");
            }
        });
        Ok(Self { url: format!("http://127.0.0.1:{port}/hook"), secret: hook.secret, arrivals: hook.arrivals, task })
    }

    /// What arrived so far.
    pub(super) fn inner(&self) -> std::sync::MutexGuard<'_, Arrivals> {
        self.arrivals.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

async fn receive(State(hook): State<Hook>, headers: HeaderMap, body: Bytes) -> StatusCode {
    let now = Utc::now();
    let signature = headers.get("stockguard-signature").and_then(|v| v.to_str().ok()).unwrap_or_default();
    let signed = signed(hook.secret.get().map(String::as_str), signature, &body);
    let parsed = serde_json::from_slice::<Body>(&body);
    let mut arrivals = hook.arrivals.lock().unwrap_or_else(PoisonError::into_inner);
    arrivals.bodies += 1;
    let events = match parsed {
        Ok(parsed) if signed => parsed.events,
        _ => {
            arrivals.bad += 1;
            return StatusCode::NO_CONTENT;
        }
    };
    let from = arrivals.lags_from;
    for event in events {
        arrivals.events += 1;
        let (Some(inventory), Some(version)) = (event.inventory_id, event.version) else { continue };
        if event.kind != "STOCK_CHANGED" {
            continue;
        }
        if !arrivals.stock.insert((inventory, version)) {
            arrivals.repeats += 1;
            continue;
        }
        if let Some(from) = from.filter(|from| event.occurred_at >= *from) {
            let at = (event.occurred_at - from).to_std().unwrap_or_default();
            let lag_ms = (now - event.occurred_at).num_microseconds().unwrap_or(i64::MAX) as f64 / 1000.0;
            arrivals.lags.push((at, lag_ms));
        }
        let newest = arrivals.newest.entry(inventory).or_insert(i64::MIN);
        let in_order = version > *newest;
        *newest = version.max(*newest);
        if !in_order {
            arrivals.out_of_order += 1;
        }
    }
    StatusCode::NO_CONTENT
}

/// Whether `header` is the signature of `body` with `secret`
/// (`t=<unix seconds>,v1=<hex HMAC>`, docs/webhooks.md).
fn signed(secret: Option<&str>, header: &str, body: &[u8]) -> bool {
    let t = header.split(',').find_map(|part| part.strip_prefix("t=")).and_then(|t| t.parse().ok());
    let (Some(secret), Some(t), Ok(body)) = (secret, t, std::str::from_utf8(body)) else { return false };
    stockguard::events::deliver::signature(secret, t, body).is_some_and(|expected| expected == header)
}
