//! The one GraphQL client of the tests and the examples: [`post`], through
//! which every request of the tests goes, answered as a [`Reply`];
//! [`create_inventory`]; and for the examples' many concurrent callers
//! [`Gql`] (keep-alive connections, answers read as an [`Outcome`]) with the
//! lean `reserve` and `reserveKit` of the benchmark's measured loop ([`Lean`]).

use std::time::Duration;

use anyhow::Context as _;
use http_body_util::{BodyExt as _, Full};
use hyper::{
    body::Bytes,
    client::conn::http1::{Connection, SendRequest},
};
use hyper_util::rt::TokioIo;
use reqwest::{StatusCode, header::HeaderValue};
use serde_json::{Value, json};
use tokio::net::TcpStream;
use uuid::Uuid;

use crate::documents::{
    CREATE_INVENTORY,
    brief::{PLACE_ORDER, RESERVE_KIT_TYPENAME, RESERVE_TYPENAME},
};

/// An HTTP answer: the status and the body as it came.
#[derive(Debug)]
pub struct Reply {
    /// The HTTP status.
    pub status: u16,
    /// The body, or as much of it as arrived.
    pub body: Vec<u8>,
    /// Why the body stopped short, if it did.
    pub cut_short: Option<String>,
}

/// POSTs `body` to the `/graphql` of the server at `address` with `client`
/// (whose timeout bounds the wait), `authorization` as the header when given.
/// `Err` when no response came back at all.
pub async fn post(
    client: &reqwest::Client,
    address: &str,
    authorization: Option<&str>,
    body: impl Into<reqwest::Body>,
) -> Result<Reply, reqwest::Error> {
    let mut request = client.post(format!("{address}/graphql")).header("content-type", "application/json").body(body);
    if let Some(value) = authorization {
        request = request.header("authorization", value);
    }
    let response = request.send().await?;
    let status = response.status().as_u16();
    Ok(match response.bytes().await {
        Ok(body) => Reply { status, body: body.to_vec(), cut_short: None },
        Err(err) => Reply { status, body: Vec::new(), cut_short: Some(err.to_string()) },
    })
}

/// A GraphQL request with `variables`, as bytes.
pub fn request(query: &str, variables: Value) -> Vec<u8> {
    serde_json::to_vec(&json!({ "query": query, "variables": variables })).unwrap_or_default()
}

/// Creates an inventory of `stock` units named `name` as `operator` (a
/// token) on the server at `address`; its id, or the answer that had none.
pub async fn create_inventory(
    client: &reqwest::Client,
    address: &str,
    operator: &str,
    sku: &str,
    name: &str,
    stock: i64,
) -> anyhow::Result<Uuid> {
    let input = json!({ "input": { "sku": sku, "name": name, "stock": stock } });
    let reply = post(client, address, Some(&format!("Bearer {operator}")), request(CREATE_INVENTORY, input)).await?;
    let body: Value = serde_json::from_slice(&reply.body).unwrap_or(Value::Null);
    let id = body["data"]["createInventory"]["id"].as_str().and_then(|id| id.parse().ok());
    id.with_context(|| format!("createInventory {sku}: HTTP {} {body}", reply.status))
}

/// How one operation ended: a union member's `__typename` with
/// `data.<field>`, or an error (an `extensions.code`, or what went wrong
/// over HTTP).
#[derive(Debug, Clone)]
pub enum Outcome {
    /// Answered with this union member.
    Ok(String, Value),
    /// Not answered: the error's code, or `HTTP ...`.
    Error(String),
}

/// GraphQL over HTTP for many concurrent callers: keep-alive connections
/// (one per caller), TCP_NODELAY, a 30 s timeout.
pub struct Gql {
    http: reqwest::Client,
    url: String,
    /// [`RESERVE_TYPENAME`] as a JSON string, for [`Lean`].
    reserve_json: String,
    /// [`RESERVE_KIT_TYPENAME`] as a JSON string, for [`Lean`].
    reserve_kit_json: String,
}

impl Gql {
    /// A client of the server at `base` for `clients` concurrent callers.
    pub fn new(base: &str, clients: usize) -> anyhow::Result<Self> {
        let http = reqwest::Client::builder()
            .pool_max_idle_per_host(clients + 16)
            .tcp_nodelay(true)
            .timeout(Duration::from_secs(30))
            .build()?;
        Ok(Self {
            http,
            url: format!("{base}/graphql"),
            reserve_json: serde_json::to_string(RESERVE_TYPENAME)?,
            reserve_kit_json: serde_json::to_string(RESERVE_KIT_TYPENAME)?,
        })
    }

    /// Posts one operation: the HTTP status and the body when it is JSON. A
    /// request that got no answer is `HTTP timeout` or `HTTP transport`.
    pub async fn post(
        &self,
        token: &str,
        query: &str,
        variables: Value,
    ) -> Result<(StatusCode, Option<Value>), String> {
        let sent =
            self.http.post(&self.url).bearer_auth(token).json(&json!({ "query": query, "variables": variables }));
        let response = sent.send().await.map_err(transport)?;
        let status = response.status();
        Ok((status, response.json().await.ok()))
    }

    /// The whole body of a successful answer, or what went wrong.
    pub async fn data(&self, token: &str, query: &str, variables: Value) -> Result<Value, String> {
        match self.post(token, query, variables).await? {
            (status, _) if !status.is_success() => Err(format!("HTTP {}", status.as_u16())),
            (_, Some(body)) => Ok(body),
            (_, None) => Err("HTTP bad body".to_owned()),
        }
    }

    /// One operation, read as the `__typename` of `data.<field>`.
    pub async fn call(&self, token: &str, query: &str, variables: Value, field: &str) -> Outcome {
        let (status, body) = match self.post(token, query, variables).await {
            Ok(answer) => answer,
            Err(err) => return Outcome::Error(err),
        };
        let Some(body) = body else { return Outcome::Error(format!("HTTP {} (no JSON)", status.as_u16())) };
        if let Some(error) = body["errors"].as_array().and_then(|errors| errors.first()) {
            return Outcome::Error(error["extensions"]["code"].as_str().unwrap_or("no code").to_owned());
        }
        if !status.is_success() {
            return Outcome::Error(format!("HTTP {}", status.as_u16()));
        }
        match body["data"][field]["__typename"].as_str() {
            Some(name) => Outcome::Ok(name.to_owned(), body["data"][field].clone()),
            None => Outcome::Error(format!("no data.{field}")),
        }
    }

    /// A connection of its own for one client of the benchmark's measured
    /// loop (see [`Lean`]), opened on first use.
    pub fn lean(&self) -> anyhow::Result<Lean> {
        let url = reqwest::Url::parse(&self.url)?;
        let host = url.host_str().context("the server's URL names a host")?;
        let port = url.port_or_known_default().context("the server's URL has a port")?;
        let authority = format!("{host}:{port}");
        Ok(Lean {
            path: url.path().parse()?,
            host: HeaderValue::from_str(&authority)?,
            authority,
            reserve_json: self.reserve_json.clone(),
            reserve_kit_json: self.reserve_kit_json.clone(),
            connection: None,
        })
    }

    /// Creates an inventory as `operator`; its id.
    pub async fn create_inventory(&self, operator: &str, sku: &str, name: &str, stock: i64) -> anyhow::Result<Uuid> {
        let address = self.url.trim_end_matches("/graphql");
        create_inventory(&self.http, address, operator, sku, name, stock).await
    }

    /// Places an order of one unit of `inventory` as `customer`; its id.
    pub async fn place_order(&self, customer: &str, inventory: Uuid, address: Value) -> anyhow::Result<Uuid> {
        let input = json!({ "i": { "items": [{ "inventoryId": inventory }], "shippingAddress": address } });
        match self.call(customer, PLACE_ORDER, input, "placeOrder").await {
            Outcome::Ok(name, data) if name == "OrderPlaced" => {
                Ok(data["order"]["id"].as_str().context("an id")?.parse()?)
            }
            Outcome::Ok(name, _) => anyhow::bail!("placeOrder: {name}"),
            Outcome::Error(err) => anyhow::bail!("placeOrder: {err}"),
        }
    }
}

/// One keep-alive HTTP/1.1 connection, driven by the task that sends on it:
/// the benchmark's measured request, lean on purpose. The load generator
/// shares the machine with what it measures, so it should take as little of
/// it as the raw-SQL side's does: no connection pool, no URL parsed per
/// request, no hand-over to a connection task, the body written straight to
/// text and only `__typename` read back.
pub struct Lean {
    authority: String,
    host: HeaderValue,
    path: hyper::Uri,
    /// [`RESERVE_TYPENAME`] as a JSON string.
    reserve_json: String,
    /// [`RESERVE_KIT_TYPENAME`] as a JSON string.
    reserve_kit_json: String,
    /// Open until the server closes it or a request on it fails.
    connection: Option<Open>,
}

/// An open HTTP/1.1 connection: where requests go in, and the connection
/// itself, which must be driven for them to be answered.
type Open = (SendRequest<Full<Bytes>>, Connection<TokioIo<TcpStream>, Full<Bytes>>);

impl Lean {
    /// `reserve` of `quantity` units of `inventory`, with `key` if given. One
    /// unit is asked for by leaving the quantity out, its default.
    pub async fn reserve(
        &mut self,
        authorization: &HeaderValue,
        inventory: Uuid,
        quantity: i32,
        key: Option<&str>,
    ) -> Outcome {
        let quantity = if quantity == 1 { String::new() } else { format!(r#","quantity":{quantity}"#) };
        let key = key.map(|key| format!(r#","idempotencyKey":"{key}""#)).unwrap_or_default();
        let body = format!(
            r#"{{"query":{},"variables":{{"i":{{"inventoryId":"{inventory}"{quantity}{key}}}}}}}"#,
            self.reserve_json
        );
        self.typename(authorization, body, "reserve").await
    }

    /// `reserveKit` of `quantity` of `kit` (every location, the default
    /// choice), with `key` if given. One kit is asked for by leaving the
    /// quantity out, its default.
    pub async fn reserve_kit(
        &mut self,
        authorization: &HeaderValue,
        kit: Uuid,
        quantity: i32,
        key: Option<&str>,
    ) -> Outcome {
        let quantity = if quantity == 1 { String::new() } else { format!(r#","quantity":{quantity}"#) };
        let key = key.map(|key| format!(r#","idempotencyKey":"{key}""#)).unwrap_or_default();
        let body =
            format!(r#"{{"query":{},"variables":{{"i":{{"kitId":"{kit}"{quantity}{key}}}}}}}"#, self.reserve_kit_json);
        self.typename(authorization, body, "reserveKit").await
    }

    /// Posts `body`, one of the documents above, and reads the answer's
    /// `__typename` of `data.<field>`, or its first error's code.
    async fn typename(&mut self, authorization: &HeaderValue, body: String, field: &str) -> Outcome {
        let answer = tokio::time::timeout(Duration::from_secs(30), self.post(authorization, body)).await;
        let (status, bytes) = match answer {
            Ok(Ok(answer)) => answer,
            Ok(Err(_)) => return Outcome::Error("HTTP transport".into()),
            Err(_) => {
                self.connection = None;
                return Outcome::Error("HTTP timeout".into());
            }
        };
        if !status.is_success() {
            return Outcome::Error(format!("HTTP {}", status.as_u16()));
        }
        match serde_json::from_slice::<ReserveAnswer<'_>>(&bytes) {
            Ok(answer) if !answer.errors.is_empty() => {
                let code = answer.errors[0].extensions.as_ref().and_then(|e| e.code.as_deref()).unwrap_or("no code");
                Outcome::Error(code.to_owned())
            }
            Ok(ReserveAnswer { data: Some(ReserveData { reserve: Some(name), .. }), .. }) if field == "reserve" => {
                Outcome::Ok(name.typename.into_owned(), Value::Null)
            }
            Ok(ReserveAnswer { data: Some(ReserveData { reserve_kit: Some(name), .. }), .. })
                if field == "reserveKit" =>
            {
                Outcome::Ok(name.typename.into_owned(), Value::Null)
            }
            Ok(_) => Outcome::Error(format!("no data.{field}")),
            Err(_) => Outcome::Error("HTTP bad body".into()),
        }
    }

    /// Posts `body` on the connection (opened if there is none), driving the
    /// connection in this task until the whole answer is in.
    async fn post(&mut self, authorization: &HeaderValue, body: String) -> anyhow::Result<(StatusCode, Bytes)> {
        if self.connection.as_ref().is_none_or(|(send, _)| send.is_closed()) {
            let stream = TcpStream::connect(&self.authority).await?;
            stream.set_nodelay(true)?;
            self.connection = Some(hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?);
        }
        let Some((send, connection)) = self.connection.as_mut() else { anyhow::bail!("no connection") };
        let request = hyper::Request::post(self.path.clone())
            .header(reqwest::header::HOST, &self.host)
            .header(reqwest::header::AUTHORIZATION, authorization)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(body)))?;
        let exchange = async {
            send.ready().await?;
            let response = send.send_request(request).await?;
            let status = response.status();
            let bytes = response.into_body().collect().await?.to_bytes();
            anyhow::Ok((status, bytes))
        };
        let answer = tokio::select! {
            biased;
            answer = exchange => answer,
            ended = connection => Err(anyhow::anyhow!("the connection ended: {ended:?}")),
        };
        if answer.is_err() {
            self.connection = None;
        }
        answer
    }
}

/// A request that got no answer, by why.
fn transport(err: reqwest::Error) -> String {
    format!("HTTP {}", if err.is_timeout() { "timeout" } else { "transport" })
}

/// Only what [`Lean::reserve`] and [`Lean::reserve_kit`] read of an answer.
#[derive(serde::Deserialize)]
struct ReserveAnswer<'a> {
    #[serde(borrow)]
    data: Option<ReserveData<'a>>,
    #[serde(default)]
    errors: Vec<AnswerError>,
}

#[derive(serde::Deserialize)]
struct ReserveData<'a> {
    #[serde(borrow)]
    reserve: Option<Typename<'a>>,
    #[serde(borrow, rename = "reserveKit")]
    reserve_kit: Option<Typename<'a>>,
}

#[derive(serde::Deserialize)]
struct Typename<'a> {
    #[serde(borrow, rename = "__typename")]
    typename: std::borrow::Cow<'a, str>,
}

#[derive(serde::Deserialize)]
struct AnswerError {
    extensions: Option<AnswerCode>,
}

#[derive(serde::Deserialize)]
struct AnswerCode {
    code: Option<String>,
}
