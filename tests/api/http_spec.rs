//! GraphQL over HTTP where async-graphql-axum's extractor answers otherwise
//! (the reasons `src/http/graphql.rs` reads requests itself): the spec's
//! names for GET parameters, and a body past the limit that is 413 however
//! it arrives.

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use crate::helpers::TestApp;

fn url_encoded(text: &str) -> String {
    serde_urlencoded::to_string([("query", text)]).expect("encoded")
}

#[tokio::test(flavor = "multi_thread")]
async fn a_get_of_several_operations_runs_the_one_its_operation_name_names() {
    let app = TestApp::spawn().await;
    let document = "query First { __typename } query Second { inventories(first: 1) { nodes { id } } }";
    let url = format!("{}/graphql?{}&operationName=Second", app.address, url_encoded(document));
    let response = app.client.get(url).send().await.expect("send");
    assert_eq!(response.status(), 200);
    let body: Value = response.json().await.expect("json");
    assert!(body.get("errors").is_none(), "operationName picks the operation: {body}");
    assert!(body["data"]["inventories"]["nodes"].is_array(), "{body}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_body_past_the_limit_is_413_with_or_without_a_length() {
    let app = TestApp::spawn().await;
    let padding = "x".repeat(70 * 1024);
    let huge = json!({ "query": format!("{{ __typename }} # {padding}") }).to_string();
    // Chunked, so no Content-Length tells the size before the body is read.
    let address = app.address.trim_start_matches("http://");
    let mut stream = tokio::net::TcpStream::connect(address).await.expect("connect");
    let head = format!(
        "POST /graphql HTTP/1.1\r\nhost: {address}\r\ncontent-type: application/json\r\n\
         transfer-encoding: chunked\r\nconnection: close\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).await.expect("head");
    for chunk in huge.as_bytes().chunks(8 * 1024) {
        let framed = [format!("{:x}\r\n", chunk.len()).as_bytes(), chunk, b"\r\n"].concat();
        if stream.write_all(&framed).await.is_err() {
            break; // the server answered and closed before the rest
        }
    }
    let _ = stream.write_all(b"0\r\n\r\n").await;
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer).await;
    let answer = String::from_utf8_lossy(&answer);
    let status = answer.split_whitespace().nth(1).unwrap_or_default();
    assert_eq!(status, "413", "a chunked body past the limit: {answer}");
    assert!(answer.contains("REQUEST_TOO_LARGE"), "{answer}");
}
