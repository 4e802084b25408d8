//! A small websocket client for the subscription tests: connect with a
//! subprotocol, send, and read the next message that is not a keep-alive.

use std::time::Duration;

use futures::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio_tungstenite::{
    MaybeTlsStream, WebSocketStream, connect_async,
    tungstenite::{Message, client::IntoClientRequest, http::HeaderValue},
};

/// A client websocket.
pub type Socket = WebSocketStream<MaybeTlsStream<tokio::net::TcpStream>>;

/// The live-stock subscription every test subscribes to.
pub const SUBSCRIPTION: &str = "subscription($id: UUID!) { inventoryChanged(id: $id) { id stock version } }";

/// A connection to the server at `address` (`http://...`) speaking
/// `protocol`, initialised and acknowledged.
pub async fn connect(address: &str, protocol: &str) -> Socket {
    connect_with(address, protocol, json!({})).await
}

/// A connection initialised with `payload` (e.g. `{"Authorization": ...}`).
pub async fn connect_with(address: &str, protocol: &str, payload: Value) -> Socket {
    let mut socket = open(address, protocol).await;
    send(&mut socket, json!({ "type": "connection_init", "payload": payload })).await;
    assert_eq!(next(&mut socket).await["type"], "connection_ack");
    socket
}

/// A connection that has sent nothing yet.
pub async fn open(address: &str, protocol: &str) -> Socket {
    let url = format!("{}/graphql/ws", address.replace("http://", "ws://"));
    let mut request = url.into_client_request().expect("request");
    request.headers_mut().insert("Sec-WebSocket-Protocol", HeaderValue::from_str(protocol).expect("header"));
    let (socket, _) = tokio::time::timeout(Duration::from_secs(10), connect_async(request))
        .await
        .expect("a websocket within 10 s")
        .expect("websocket");
    socket
}

/// Sends one JSON message.
pub async fn send(socket: &mut Socket, message: Value) {
    socket.send(Message::text(message.to_string())).await.expect("send");
}

/// The next JSON message, skipping keep-alives; fails after 10 s.
pub async fn next(socket: &mut Socket) -> Value {
    loop {
        let message = tokio::time::timeout(Duration::from_secs(10), socket.next())
            .await
            .expect("a message within 10 s")
            .expect("open")
            .expect("frame");
        if let Message::Text(text) = message {
            let value: Value = serde_json::from_str(&text).expect("json");
            if value["type"] != "ka" && value["type"] != "ping" && value["type"] != "pong" {
                return value;
            }
        }
    }
}

/// The next result (`next` or `error`), skipping the `complete` of
/// operations that have ended.
pub async fn next_result(socket: &mut Socket) -> Value {
    loop {
        let message = next(socket).await;
        if message["type"] != "complete" {
            return message;
        }
    }
}
