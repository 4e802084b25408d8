//! A real HTTP receiver of webhooks in the test process: it keeps every
//! body it was sent with its headers, and answers as told: 204, an error
//! status, or a stall longer than the server's timeout.

use std::{
    net::SocketAddr,
    sync::{Arc, Mutex, PoisonError},
    time::{Duration, Instant},
};

use axum::{
    Router,
    body::Bytes,
    extract::State,
    http::{HeaderMap, StatusCode},
    routing::post,
};
use hmac::{Hmac, Mac};
use serde_json::Value;
use sha2::Sha256;

/// How the receiver answers the next requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// 204.
    Accept,
    /// This status.
    Fail(u16),
    /// No answer for this long (then 204).
    Stall(Duration),
}

/// One request as it arrived.
#[derive(Debug, Clone)]
pub struct Received {
    /// `stockguard-delivery`.
    pub delivery: String,
    /// `stockguard-signature`.
    pub signature: String,
    /// The raw body.
    pub body: String,
    /// What it answered.
    pub answered: Answer,
    /// When it arrived.
    pub at: Instant,
}

#[derive(Default)]
struct Inner {
    received: Vec<Received>,
    /// Answers for the next requests, in turn; then `Accept`.
    script: Vec<Answer>,
}

/// The receiver: its address and what it got.
#[derive(Clone)]
pub struct Receiver {
    /// `http://127.0.0.1:<port>/hook`.
    pub url: String,
    inner: Arc<Mutex<Inner>>,
}

impl Receiver {
    /// Listens on a free loopback port.
    pub async fn start() -> Self {
        let inner: Arc<Mutex<Inner>> = Arc::default();
        let listener = tokio::net::TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0))).await.expect("bind");
        let port = listener.local_addr().expect("address").port();
        let app = Router::new().route("/hook", post(hook)).with_state(inner.clone());
        tokio::spawn(async move { axum::serve(listener, app).await });
        Self { url: format!("http://127.0.0.1:{port}/hook"), inner }
    }

    fn inner(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The next requests are answered with `answers`, in turn.
    pub fn script(&self, answers: &[Answer]) {
        self.inner().script = answers.iter().rev().copied().collect();
    }

    /// Every request so far.
    pub fn received(&self) -> Vec<Received> {
        self.inner().received.clone()
    }

    /// The events of every accepted body, in the order they arrived.
    pub fn accepted_events(&self) -> Vec<Value> {
        let received = self.received();
        let accepted = received.iter().filter(|r| r.answered == Answer::Accept);
        accepted.flat_map(|r| events(&r.body)).collect()
    }
}

/// The events of a body.
pub fn events(body: &str) -> Vec<Value> {
    let body: Value = serde_json::from_str(body).expect("a JSON body");
    body["events"].as_array().expect("events").clone()
}

/// Whether `signature` (`t=…,v1=…`) is the HMAC-SHA256 of `"<t>.<body>"`
/// with `secret`, checked as docs/webhooks.md tells receivers to.
pub fn verifies(secret: &str, signature: &str, body: &str) -> bool {
    let mut t = None;
    let mut v1 = None;
    for part in signature.split(',') {
        match part.split_once('=') {
            Some(("t", value)) => t = Some(value),
            Some(("v1", value)) => v1 = hex::decode(value).ok(),
            _ => {}
        }
    }
    let (Some(t), Some(v1)) = (t, v1) else { return false };
    let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).expect("any key");
    mac.update(format!("{t}.{body}").as_bytes());
    mac.verify_slice(&v1).is_ok()
}

async fn hook(State(inner): State<Arc<Mutex<Inner>>>, headers: HeaderMap, body: Bytes) -> StatusCode {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
    let answer = {
        let mut inner = inner.lock().unwrap_or_else(PoisonError::into_inner);
        let answer = inner.script.pop().unwrap_or(Answer::Accept);
        inner.received.push(Received {
            delivery: header("stockguard-delivery"),
            signature: header("stockguard-signature"),
            body: String::from_utf8_lossy(&body).into_owned(),
            answered: answer,
            at: Instant::now(),
        });
        answer
    };
    match answer {
        Answer::Accept => StatusCode::NO_CONTENT,
        Answer::Fail(status) => StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        Answer::Stall(pause) => {
            tokio::time::sleep(pause).await;
            StatusCode::NO_CONTENT
        }
    }
}
