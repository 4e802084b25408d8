//! Sending one body to one endpoint: the egress rules checked again on
//! the addresses its host resolves to now, the body signed, no redirects,
//! and the answer (or why none came) kept for the delivery's record. The
//! endpoint's HTTP client is kept between attempts ([`Client`]).

use std::time::Duration;

use chrono::Utc;
use hmac::{Hmac, Mac};
use sha2::Sha256;
use uuid::Uuid;

use super::Delivering;
use crate::events::{egress, outbox::step::Endpoint};

/// Most bytes of a receiver's answer kept in `last_error`.
const MAX_ERROR_CHARS: usize = 300;

/// An endpoint's HTTP client, kept from attempt to attempt so its
/// connection is reused (a client per attempt, its TLS roots loaded and a
/// connection opened each time, was most of a body's time on loopback); a
/// new one when the endpoint's host or its resolved addresses change.
#[derive(Default)]
pub(crate) struct Client {
    kept: Option<(String, Vec<std::net::SocketAddr>, reqwest::Client)>,
}

impl Client {
    /// The client for `host` at `addresses`.
    fn for_host(
        &mut self,
        host: &str,
        addresses: &[std::net::SocketAddr],
        timeout: Duration,
    ) -> reqwest::Result<reqwest::Client> {
        if let Some((kept_host, kept_addresses, client)) = &self.kept
            && kept_host == host
            && kept_addresses == addresses
        {
            return Ok(client.clone());
        }
        let client = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .timeout(timeout)
            .resolve_to_addrs(host, addresses)
            .build()?;
        self.kept = Some((host.to_owned(), addresses.to_vec(), client.clone()));
        Ok(client)
    }
}

/// What one attempt came to.
pub(crate) struct Attempt {
    /// The receiver's status, when it answered.
    pub status: Option<u16>,
    /// Why it failed, when it did.
    pub error: Option<String>,
}

/// The `stockguard-signature` header of `body` sent at `t` (Unix seconds):
/// HMAC-SHA256 of `"<t>.<body>"` with the endpoint's secret, in hex. None
/// only if the MAC refused the key, which HMAC never does (any length).
pub fn signature(secret: &str, t: i64, body: &str) -> Option<String> {
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(secret.as_bytes()).ok()?;
    mac.update(format!("{t}.").as_bytes());
    mac.update(body.as_bytes());
    Some(format!("t={t},v1={}", hex::encode(mac.finalize().into_bytes())))
}

/// Sends `body` once: the egress rules checked again on the resolved
/// addresses (an endpoint's name may have come to point inside), no
/// redirects, the whole attempt bounded by the timeout.
pub(crate) async fn send(
    client: &mut Client,
    endpoint: &Endpoint,
    delivery_id: Uuid,
    body: &str,
    delivering: &Delivering,
) -> Attempt {
    let failed = |error: String| Attempt { status: None, error: Some(error) };
    let checked = match egress::check_url(&endpoint.url, delivering.allow_loopback) {
        Ok(checked) => checked,
        Err(err) => return failed(format!("refused: {err}")),
    };
    let addresses = match egress::resolve(&checked, delivering.allow_loopback).await {
        Ok(addresses) => addresses,
        Err(err) => return failed(format!("refused: {err}")),
    };
    let host = match reqwest::Url::parse(&endpoint.url).ok().and_then(|url| url.host_str().map(str::to_owned)) {
        Some(host) => host,
        None => return failed("the URL has no host".into()),
    };
    let client = match client.for_host(&host, &addresses, delivering.timeout) {
        Ok(client) => client,
        Err(err) => return failed(format!("client: {err}")),
    };
    let t = Utc::now().timestamp();
    let Some(signature) = signature(&endpoint.secret, t, body) else {
        return failed("the secret cannot sign".into());
    };
    let sent = client
        .post(&endpoint.url)
        .header("content-type", "application/json")
        .header("stockguard-delivery", delivery_id.to_string())
        .header("stockguard-signature", signature)
        .body(body.to_owned())
        .send()
        .await;
    match sent {
        Ok(response) if response.status().is_success() => {
            Attempt { status: Some(response.status().as_u16()), error: None }
        }
        Ok(response) => {
            let status = response.status().as_u16();
            Attempt { status: Some(status), error: Some(format!("answered {status}")) }
        }
        Err(err) if err.is_timeout() => failed("timed out".into()),
        Err(err) => failed(without_url(&err)),
    }
}

/// A reqwest error's text without its URL (which may carry a token a receiver put in its path).
fn without_url(err: &reqwest::Error) -> String {
    let mut text = err.to_string();
    if let Some(url) = err.url() {
        text = text.replace(url.as_str(), "<url>");
    }
    text.chars().take(MAX_ERROR_CHARS).collect()
}
