//! Attacks on the server process, each the request (or connection) that took
//! an earlier build down, against the real binary (see `process.rs`): the
//! process must live, answer the attack with a clear error within its bound,
//! keep serving others, and keep its memory and the database as they were.
//! Each test prints what it measured (`cargo test attacks -- --nocapture`).

use std::time::{Duration, Instant};

use futures::{SinkExt, StreamExt};
use serde_json::{Value, json};
use stockguard::auth::Role;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
};
use tokio_tungstenite::tungstenite::Message;
use uuid::Uuid;

use crate::{
    helpers::eventually,
    hostile::{aliases, deep_value, fragment_fan_out},
    process::Process,
    ws::{SUBSCRIPTION, Socket, connect, connect_with, next, next_result, open, send},
};

fn code(body: &Value) -> &str {
    body["errors"][0]["extensions"]["code"].as_str().unwrap_or("none")
}

/// Sends `query` and returns how long the answer took, with the answer.
async fn timed(app: &Process, query: &str, variables: Value) -> (Duration, Result<(u16, Value), String>) {
    let started = Instant::now();
    let answer = app.graphql(None, query, variables).await;
    (started.elapsed(), answer)
}

#[tokio::test(flavor = "multi_thread")]
async fn values_nested_thousands_deep_are_refused_and_the_process_lives() {
    let mut app = Process::start(&[]).await;
    let rss_before = app.rss_kb();
    let documents = [
        ("an argument", deep_value(3000, 0)),
        ("a variable default", deep_value(3000, 1)),
        ("a directive argument", deep_value(3000, 2)),
    ];
    for (what, query) in &documents {
        assert!(query.len() > 6000 && query.len() < 64 * 1024, "{what}: {} bytes", query.len());
        let (took, answer) = timed(&app, query, json!({})).await;
        let (status, body) = answer.unwrap_or_else(|err| panic!("{what}: no answer ({err})\n{}", app.log()));
        println!("deep list in {what}: {status} {} in {took:?}", code(&body));
        assert_eq!(code(&body), "GRAPHQL_PARSE_FAILED", "{what}: {body}");
        assert!(body.get("data").is_none_or(Value::is_null), "{what}: {body}");
        // Generous on a busy machine: what is proved is the refusal at the
        // lexer's depth bound and a process that lives, not a speed.
        assert!(took < Duration::from_secs(10), "{what}: {took:?}");
        app.assert_serving(Duration::from_secs(1)).await;
    }
    // The same over a websocket: an error for that operation, the socket open.
    let mut socket = connect(&app.address, "graphql-transport-ws").await;
    let payload = json!({ "query": documents[0].1 });
    send(&mut socket, json!({ "id": "deep", "type": "subscribe", "payload": payload })).await;
    let answer = next(&mut socket).await;
    let error = if answer["type"] == "error" { &answer["payload"][0] } else { &answer["payload"]["errors"][0] };
    assert_eq!(error["extensions"]["code"], "GRAPHQL_PARSE_FAILED", "{answer}");
    send(&mut socket, json!({ "id": "after", "type": "subscribe", "payload": { "query": "{ __typename }" } })).await;
    assert_eq!(next_result(&mut socket).await["payload"]["data"]["__typename"], "Query", "the socket still serves");
    app.assert_serving(Duration::from_secs(1)).await;
    println!("RSS {} -> {} KiB", rss_before, app.rss_kb());
}

#[tokio::test(flavor = "multi_thread")]
async fn fragment_fan_out_is_refused_in_milliseconds_while_others_are_served() {
    let mut app = Process::start(&[]).await;
    let query = fragment_fan_out(30);
    assert!(query.len() < 2048, "{} bytes", query.len());
    let attacks: Vec<_> = (0..4)
        .map(|_| {
            let (client, address, query) = (app.client.clone(), app.address.clone(), query.clone());
            tokio::spawn(async move {
                let started = Instant::now();
                let response = client.post(format!("{address}/graphql")).json(&json!({ "query": query })).send().await;
                let body: Value = match response {
                    Ok(response) => response.json().await.unwrap_or_default(),
                    Err(err) => json!({ "transport": format!("{err:?}") }),
                };
                (started.elapsed(), body)
            })
        })
        .collect();
    // Others are served while the four attacks are in flight.
    let mut slowest = Duration::ZERO;
    for _ in 0..10 {
        slowest = slowest.max(app.assert_serving(Duration::from_secs(2)).await);
    }
    for attack in attacks {
        let (took, body) = attack.await.expect("attack task");
        println!("fan-out of 30 levels: {} in {took:?}", code(&body));
        assert_eq!(code(&body), "COST_ESTIMATED_TOO_EXPENSIVE", "{body}");
        // 2^30 leaves walked one by one take minutes: within a generous
        // 10 s only a measurement once per fragment answers.
        assert!(took < Duration::from_secs(10), "{took:?}");
    }
    println!("slowest /healthz during the attacks: {slowest:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn aliases_and_unknown_names_never_become_metric_labels() {
    let mut app = Process::start(&[]).await;
    let metrics =
        || async { app.client.get(format!("{}/metrics", app.address)).send().await.expect("metrics").text().await };
    // 900 aliases are refused before they run (too many tokens); 450 run.
    let refused = aliases("query", "inventoryBySku(sku: \"NOPE\") { id }", 900);
    let flood = aliases("query", "inventoryBySku(sku: \"NOPE\") { id }", 450);
    // One of each first, so the page has every series it will ever have.
    app.graphql(None, &flood, json!({})).await.expect("warm up");
    app.graphql(None, &refused, json!({})).await.expect("warm up");
    app.graphql(None, "{ noSuchField }", json!({})).await.expect("warm up");
    let before = metrics().await.expect("metrics");
    let rss_before = app.rss_kb();
    for _ in 0..50 {
        let (_, body) = app.graphql(None, &flood, json!({})).await.expect("flood");
        assert!(body.get("errors").is_none(), "{body}");
        let (_, body) = app.graphql(None, &refused, json!({})).await.expect("flood");
        assert_eq!(code(&body), "GRAPHQL_PARSE_FAILED", "{body}");
        let (_, body) = app.graphql(None, "{ noSuchField noSuchEither }", json!({})).await.expect("unknown");
        assert_eq!(code(&body), "GRAPHQL_VALIDATION_FAILED", "{body}");
    }
    let after = metrics().await.expect("metrics");
    println!(
        "/metrics {} -> {} bytes after 50 x (450 + 900) aliases; RSS {} -> {} KiB",
        before.len(),
        after.len(),
        rss_before,
        app.rss_kb()
    );
    assert!(!after.contains("a449") && !after.contains("noSuchField"), "a client's name became a label");
    let series = |text: &str| text.lines().filter(|line| !line.starts_with('#')).count();
    assert_eq!(series(&after), series(&before), "the number of series grew");
    assert!(after.len() < before.len() + 4096, "{} -> {} bytes", before.len(), after.len());
    assert!(app.rss_kb() < rss_before + 32 * 1024, "RSS {} -> {} KiB", rss_before, app.rss_kb());
    app.assert_serving(Duration::from_secs(1)).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_query_over_the_websocket_gets_the_caller_and_the_data_loaders() {
    let mut app = Process::start(&[]).await;
    let id = app.create_inventory("WS-Q-1", 7).await;
    // Anonymous: inventory is public, read through the DataLoader.
    let mut socket = connect(&app.address, "graphql-transport-ws").await;
    let query = format!("{{ inventory(id: \"{id}\") {{ stock }} }}");
    send(&mut socket, json!({ "id": "1", "type": "subscribe", "payload": { "query": query } })).await;
    let answer = next(&mut socket).await;
    assert_eq!(answer["payload"]["data"]["inventory"]["stock"], 7, "{answer}");
    assert_eq!(next(&mut socket).await["type"], "complete");
    // Signed in through connection_init: the caller's own reservations.
    let alice = app.token("alice", Role::Customer);
    let mut socket =
        connect_with(&app.address, "graphql-transport-ws", json!({ "Authorization": format!("Bearer {alice}") })).await;
    let reserve = format!(
        "mutation {{ reserve(input: {{ inventoryId: \"{id}\", idempotencyKey: \"ws-1\" }}) {{ __typename }} }}"
    );
    send(&mut socket, json!({ "id": "2", "type": "subscribe", "payload": { "query": reserve } })).await;
    assert_eq!(next(&mut socket).await["payload"]["data"]["reserve"]["__typename"], "Reserved");
    assert_eq!(next(&mut socket).await["type"], "complete");
    let mine = "{ myReservations { nodes { userId inventory { stock } } } }";
    send(&mut socket, json!({ "id": "3", "type": "subscribe", "payload": { "query": mine } })).await;
    let answer = next(&mut socket).await;
    assert_eq!(answer["payload"]["data"]["myReservations"]["nodes"][0]["userId"], "alice", "{answer}");
    assert_eq!(answer["payload"]["data"]["myReservations"]["nodes"][0]["inventory"]["stock"], 6, "{answer}");
    app.assert_serving(Duration::from_secs(1)).await;
}

/// Subscribes `socket` to inventory `id` under subscription id `sub`.
async fn subscribe(socket: &mut Socket, sub: &str, id: Uuid) {
    let payload = json!({ "query": SUBSCRIPTION, "variables": { "id": id } });
    send(socket, json!({ "id": sub, "type": "subscribe", "payload": payload })).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn subscriptions_are_capped_per_socket_and_unknown_inventories_cannot_be_watched() {
    let mut app = Process::start(&[("STOCKGUARD_MAX_SUBSCRIPTIONS_PER_SOCKET", "3")]).await;
    let id = app.create_inventory("WS-CAP-1", 10).await;
    let mut socket = connect(&app.address, "graphql-transport-ws").await;
    for n in 0..3 {
        subscribe(&mut socket, &format!("s{n}"), id).await;
    }
    subscribe(&mut socket, "one-too-many", id).await;
    let refused = next(&mut socket).await;
    assert_eq!(refused["id"], "one-too-many", "{refused}");
    assert_eq!(refused["payload"]["errors"][0]["extensions"]["code"], "TOO_MANY_SUBSCRIPTIONS", "{refused}");
    // Three subscriptions of one inventory hold one watcher row.
    let watchers = format!("SELECT count(*) FROM inventory_watchers WHERE inventory_id = '{id}'");
    eventually(Duration::from_secs(10), "the subscriptions register", || async { app.count(&watchers).await == 1 })
        .await;
    // An inventory that does not exist: an error, and no row.
    let mut other = connect(&app.address, "graphql-transport-ws").await;
    subscribe(&mut other, "ghost", Uuid::new_v4()).await;
    let ghost = next(&mut other).await;
    assert_eq!(ghost["payload"]["errors"][0]["extensions"]["code"], "BAD_USER_INPUT", "{ghost}");
    assert_eq!(app.count("SELECT count(*) FROM inventory_watchers").await, 1, "only the real inventory is watched");
    // The capped socket still delivers to its three subscriptions.
    let alice = app.token("alice", Role::Customer);
    let reserve = format!("mutation {{ reserve(input: {{ inventoryId: \"{id}\" }}) {{ __typename }} }}");
    app.graphql(Some(&alice), &reserve, json!({})).await.expect("reserve");
    let mut delivered = std::collections::BTreeSet::new();
    while delivered.len() < 3 {
        let message = next_result(&mut socket).await;
        assert_eq!(message["payload"]["data"]["inventoryChanged"]["stock"], 9, "{message}");
        delivered.insert(message["id"].as_str().unwrap_or_default().to_owned());
    }
    app.assert_serving(Duration::from_secs(1)).await;
}

/// A gauge of the process's `/metrics`, if it is there.
async fn gauge(app: &Process, name: &str) -> Option<i64> {
    let text = app.client.get(format!("{}/metrics", app.address)).send().await.ok()?.text().await.ok()?;
    let value = text.lines().find_map(|line| line.strip_prefix(name)?.strip_prefix(' '))?;
    value.trim().parse::<f64>().ok().map(|n| n as i64)
}

/// The process's live subscriptions, from its `/metrics`.
async fn live_subscriptions(app: &Process) -> i64 {
    gauge(app, "stockguard_subscriptions").await.unwrap_or(-1)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_hundred_sockets_of_subscriptions_stay_within_the_caps_and_the_memory() {
    let mut app = Process::start(&[("STOCKGUARD_MAX_SUBSCRIPTIONS", "500")]).await;
    let mut ids = Vec::new();
    for n in 0..10 {
        ids.push(app.create_inventory(&format!("WS-MANY-{n}"), 1000).await);
    }
    let rss_before = app.rss_kb();
    let started = Instant::now();
    let mut sockets = Vec::new();
    // Fifty sockets take the process's five hundred places...
    for s in 0..50 {
        let mut socket = connect(&app.address, "graphql-transport-ws").await;
        for n in 0..10 {
            subscribe(&mut socket, &format!("real-{n}"), ids[(s + n) % ids.len()]).await;
        }
        sockets.push(socket);
    }
    eventually(Duration::from_secs(20), "500 subscriptions go live", || async {
        live_subscriptions(&app).await == 500
    })
    .await;
    // ...and fifty more get an error for each: past the cap, or no such inventory.
    for _ in 0..50 {
        let mut socket = connect(&app.address, "graphql-transport-ws").await;
        for (n, id) in ids.iter().enumerate() {
            subscribe(&mut socket, &format!("real-{n}"), *id).await;
            subscribe(&mut socket, &format!("ghost-{n}"), Uuid::new_v4()).await;
        }
        for _ in 0..20 {
            let answer = next_result(&mut socket).await;
            let code = answer["payload"]["errors"][0]["extensions"]["code"].as_str().unwrap_or_default().to_owned();
            assert!(code == "BAD_USER_INPUT" || code == "TOO_MANY_SUBSCRIPTIONS", "{answer}");
        }
        sockets.push(socket);
    }
    let rows = app.count("SELECT count(*) FROM inventory_watchers").await;
    let live = live_subscriptions(&app).await;
    println!(
        "100 sockets, 1,500 subscriptions in {:?}: {live} live, {rows} watcher rows; RSS {rss_before} -> {} KiB",
        started.elapsed(),
        app.rss_kb()
    );
    assert_eq!(live, 500, "the process cap");
    assert!(rows <= ids.len() as i64, "one row per watched inventory: {rows}");
    assert!(app.rss_kb() < rss_before + 64 * 1024, "RSS {rss_before} -> {} KiB", app.rss_kb());
    let (took, _) = timed(&app, "{ __typename }", json!({})).await;
    assert!(took < Duration::from_secs(1), "others are still served quickly: {took:?}");
    app.assert_serving(Duration::from_secs(1)).await;
}

/// Reads frames until the socket closes; the close code, if any came.
async fn close_code(socket: &mut Socket, within: Duration) -> Option<u16> {
    let deadline = Instant::now() + within;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, socket.next()).await {
            Ok(Some(Ok(Message::Close(frame)))) => return frame.map(|f| f.code.into()),
            Ok(Some(Ok(_))) => {}
            Ok(Some(Err(_)) | None) => return None,
            Err(_) => panic!("the socket was still open after {within:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_socket_that_never_initialises_is_closed_and_oversized_messages_are_refused_unrun() {
    let mut app = Process::start(&[("STOCKGUARD_WS_INIT_TIMEOUT_MS", "500")]).await;
    let mut silent = open(&app.address, "graphql-transport-ws").await;
    let started = Instant::now();
    assert_eq!(close_code(&mut silent, Duration::from_secs(5)).await, Some(4408));
    println!("a socket without connection_init closed after {:?}", started.elapsed());

    // A 1 MiB message, past the 64 KiB body limit, carrying a mutation.
    let operator = app.token("operator", Role::Operator);
    let mut socket =
        connect_with(&app.address, "graphql-transport-ws", json!({ "Authorization": format!("Bearer {operator}") }))
            .await;
    let padding = "x".repeat(1 << 20);
    let create = format!(
        "mutation {{ createInventory(input: {{ sku: \"HUGE-1\", name: \"huge\", stock: 1 }}) {{ id }} }} # {padding}"
    );
    let message = json!({ "id": "big", "type": "subscribe", "payload": { "query": create } }).to_string();
    let _ = socket.send(Message::text(message)).await;
    let closed = close_code(&mut socket, Duration::from_secs(5)).await;
    println!("a 1 MiB message: closed with {closed:?}");
    assert_eq!(app.count("SELECT count(*) FROM inventories WHERE sku = 'HUGE-1'").await, 0, "it did not run");
    app.assert_serving(Duration::from_secs(1)).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_server_pings_a_quiet_socket_and_closes_one_that_never_answers() {
    // Intervals long enough that a pong is not late on a loaded machine.
    let app = Process::start(&[("STOCKGUARD_WS_KEEPALIVE_MS", "500")]).await;
    // Reading answers the pings (the client library pongs): open for five intervals.
    let mut answering = connect(&app.address, "graphql-transport-ws").await;
    let mut pings = 0;
    let reading = tokio::time::timeout(Duration::from_millis(2500), async {
        while let Some(Ok(message)) = answering.next().await {
            if matches!(message, Message::Ping(_)) {
                pings += 1;
            }
        }
    })
    .await;
    assert!(reading.is_err(), "the answering socket was closed");
    assert!(pings >= 3, "{pings} pings in five intervals");
    send(&mut answering, json!({ "id": "1", "type": "subscribe", "payload": { "query": "{ __typename }" } })).await;
    assert_eq!(next_result(&mut answering).await["payload"]["data"]["__typename"], "Query");
    // A socket that reads nothing answers no ping: closed after two intervals.
    let mut silent = connect(&app.address, "graphql-transport-ws").await;
    let started = Instant::now();
    // Two keep-alive intervals and a margin, the socket not read meanwhile.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(close_code(&mut silent, Duration::from_secs(5)).await, Some(1001), "after {:?}", started.elapsed());
}

/// Holds inventory `id`'s row lock in a transaction of the test's own until dropped.
async fn hold_row(app: &Process, id: Uuid) -> sea_orm::DatabaseTransaction {
    use sea_orm::{ConnectionTrait, TransactionTrait};
    let holder = app.db.begin().await.expect("begin");
    holder.execute_unprepared(&format!("SELECT 1 FROM inventories WHERE id = '{id}' FOR UPDATE")).await.expect("lock");
    holder
}

/// Waits until `n` statements of the server wait on a lock.
async fn until_blocked(app: &Process, n: i64) {
    let blocked =
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'";
    eventually(Duration::from_secs(20), &format!("{n} statements wait on the row"), || async {
        app.count(blocked).await >= n
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn work_whose_client_hung_up_still_counts_against_the_in_flight_limit() {
    let app = Process::start(&[("STOCKGUARD_MAX_IN_FLIGHT", "1")]).await;
    let id = app.create_inventory("HANGUP-1", 10).await;
    let alice = app.token("alice", Role::Customer);
    let holder = hold_row(&app, id).await;
    // A keyed reserve (no coalescing) waits on the row; its client gives up.
    let impatient = reqwest::Client::builder().timeout(Duration::from_millis(500)).build().expect("client");
    let reserve = format!(
        "mutation {{ reserve(input: {{ inventoryId: \"{id}\", idempotencyKey: \"hangup-1\" }}) {{ __typename }} }}"
    );
    let sent = impatient
        .post(format!("{}/graphql", app.address))
        .bearer_auth(&alice)
        .json(&json!({ "query": reserve }))
        .send()
        .await;
    assert!(sent.is_err(), "the client hung up before the answer");
    until_blocked(&app, 1).await;
    // The work still runs, so the server is still full.
    let (status, body) = app.graphql(None, "{ __typename }", json!({})).await.expect("answer");
    assert_eq!((status, code(&body)), (503, "OVERLOADED"), "{body}");
    // Over a websocket too.
    let mut socket = connect(&app.address, "graphql-transport-ws").await;
    send(&mut socket, json!({ "id": "1", "type": "subscribe", "payload": { "query": "{ __typename }" } })).await;
    let answer = next(&mut socket).await;
    assert_eq!(answer["payload"]["errors"][0]["extensions"]["code"], "OVERLOADED", "{answer}");
    holder.rollback().await.expect("release the row");
    // The abandoned reserve committed, and then the permit came back.
    eventually(Duration::from_secs(20), "the abandoned reserve finishes", || async {
        app.graphql(None, "{ __typename }", json!({})).await.expect("answer").0 == 200
    })
    .await;
    assert_eq!(app.count("SELECT count(*) FROM reservations WHERE idempotency_key = 'hangup-1'").await, 1);
}

/// Whether the server closed `stream` (EOF or reset) within `within`.
async fn closed_within(stream: &mut TcpStream, within: Duration) -> bool {
    let mut buf = [0u8; 1024];
    let deadline = Instant::now() + within;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, stream.read(&mut buf)).await {
            Ok(Ok(0) | Err(_)) => return true,
            Ok(Ok(_)) => {}
            Err(_) => return false,
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn slow_clients_are_cut_after_the_header_timeout_and_never_delay_others() {
    let mut app = Process::start(&[("STOCKGUARD_HEADER_READ_TIMEOUT_MS", "5000")]).await;
    let mut slow = Vec::new();
    for _ in 0..100 {
        let mut stream = TcpStream::connect(&app.addr).await.expect("connect");
        stream.write_all(b"POST /graphql HTTP/1.1\r\nHost: stockguard\r\nContent-Ty").await.expect("half a header");
        slow.push(stream);
    }
    let started = Instant::now();
    // Others are served meanwhile: answered while every slow client still
    // holds its connection (none cut yet, nothing to read on any), so they
    // did not wait for the header timeout to free the server.
    for _ in 0..5 {
        let (took, answer) = timed(&app, "{ __typename }", json!({})).await;
        assert_eq!(answer.expect("answer").0, 200, "after {took:?}");
    }
    let still_held = slow
        .iter()
        .filter(
            |stream| matches!(stream.try_read(&mut [0u8; 1]), Err(err) if err.kind() == std::io::ErrorKind::WouldBlock),
        )
        .count();
    assert_eq!(still_held, 100, "the others were served before the header timeout cut a slow client");
    for stream in &mut slow {
        assert!(closed_within(stream, Duration::from_secs(15)).await, "a slow client was still connected");
    }
    println!("100 half-sent headers all closed {:?} after they were sent", started.elapsed());
    app.assert_serving(Duration::from_secs(1)).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn idle_keep_alive_connections_close_and_slow_bodies_get_408() {
    let app =
        Process::start(&[("STOCKGUARD_IDLE_TIMEOUT_MS", "1000"), ("STOCKGUARD_REQUEST_TIMEOUT_MS", "1000")]).await;
    let mut stream = TcpStream::connect(&app.addr).await.expect("connect");
    let body = r#"{"query":"{ __typename }"}"#;
    let request = format!(
        "POST /graphql HTTP/1.1\r\nHost: s\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.expect("request");
    let mut answer = vec![0u8; 4096];
    let n =
        tokio::time::timeout(Duration::from_secs(5), stream.read(&mut answer)).await.expect("answer").expect("read");
    assert!(
        String::from_utf8_lossy(&answer[..n]).starts_with("HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&answer[..n])
    );
    let idle = Instant::now();
    assert!(closed_within(&mut stream, Duration::from_secs(5)).await, "the idle connection stayed open");
    println!("an idle keep-alive connection closed after {:?}", idle.elapsed());

    // A body that never finishes arriving.
    let mut stream = TcpStream::connect(&app.addr).await.expect("connect");
    let head =
        "POST /graphql HTTP/1.1\r\nHost: s\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"qu";
    stream.write_all(head.as_bytes()).await.expect("request");
    let started = Instant::now();
    let n =
        tokio::time::timeout(Duration::from_secs(5), stream.read(&mut answer)).await.expect("answer").expect("read");
    let text = String::from_utf8_lossy(&answer[..n]).into_owned();
    println!("a body that stalls: {} after {:?}", text.lines().next().unwrap_or_default(), started.elapsed());
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert!(text.contains("REQUEST_TIMEOUT"), "{text}");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_connection_cap_holds_and_newcomers_are_served_once_slow_clients_are_cut() {
    // Eleven places: the test client's own keep-alive connection and ten silent ones.
    let app =
        Process::start(&[("STOCKGUARD_MAX_CONNECTIONS", "11"), ("STOCKGUARD_HEADER_READ_TIMEOUT_MS", "1000")]).await;
    let mut idle = Vec::new();
    for _ in 0..10 {
        idle.push(TcpStream::connect(&app.addr).await.expect("connect"));
    }
    // The server has accepted all eleven: its own count says so.
    eventually(Duration::from_secs(10), "the server accepts the ten silent connections", || async {
        gauge(&app, "stockguard_http_connections").await == Some(11)
    })
    .await;
    // A fresh client (the test's own would reuse its connection) must wait
    // for a place, which the header timeout frees.
    let newcomer = reqwest::Client::builder().timeout(Duration::from_secs(20)).build().expect("client");
    let started = Instant::now();
    let response = newcomer.post(format!("{}/graphql", app.address)).json(&json!({ "query": "{ __typename }" })).send();
    let status = response.await.expect("served in the end").status();
    let waited = started.elapsed();
    println!("with 11 of 11 connections taken, a newcomer was served after {waited:?}");
    assert_eq!(status, 200);
    assert!(waited > Duration::from_millis(300), "it waited for a place: {waited:?}");
    // Freed by the header timeout (1 s): nothing else would free a place
    // before the client gave up (20 s).
    assert!(waited < Duration::from_secs(15), "{waited:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn pages_count_in_the_cost_and_every_refusal_has_a_code() {
    let mut app = Process::start(&[]).await;
    let cases = [
        (aliases("query", "inventories(first: 100) { nodes { id } }", 200), json!({}), "COST_ESTIMATED_TOO_EXPENSIVE"),
        ("{ inventories(".to_owned(), json!({}), "GRAPHQL_PARSE_FAILED"),
        ("{ noSuchField }".to_owned(), json!({}), "GRAPHQL_VALIDATION_FAILED"),
        ("query($id: UUID!) { inventory(id: $id) { id } }".to_owned(), json!({ "id": "not-a-uuid" }), "BAD_USER_INPUT"),
        (
            "query($f: Int) { inventories(first: $f) { nodes { id } } }".to_owned(),
            json!({ "f": "ten" }),
            "BAD_USER_INPUT",
        ),
        ("query($id: UUID!) { inventory(id: $id) { id } }".to_owned(), json!({}), "BAD_USER_INPUT"),
        ("{ inventory(id: \"not-a-uuid\") { id } }".to_owned(), json!({}), "BAD_USER_INPUT"),
        ("query A { __typename } query B { __typename }".to_owned(), json!({}), "OPERATION_RESOLUTION_FAILURE"),
        (format!("{{ {} }}", nested_selection(6)), json!({}), "MAX_DEPTH_LIMIT"),
    ];
    for (query, variables, expected) in cases {
        let (_, body) = app.graphql(None, &query, variables).await.expect("answer");
        let errors = body["errors"].as_array().cloned().unwrap_or_default();
        assert!(!errors.is_empty(), "{query}: {body}");
        assert!(errors.iter().all(|e| e["extensions"]["code"] == expected), "{expected} for {query:.80}: {body}");
    }
    let (_, page) = app.graphql(None, "{ inventories(first: 100) { nodes { id } } }", json!({})).await.expect("page");
    assert!(page.get("errors").is_none(), "one page of 100 is fine: {page}");
    app.assert_serving(Duration::from_secs(1)).await;
}

/// A selection `2 + 2 * levels` deep: introspection beside a normal field.
fn nested_selection(levels: usize) -> String {
    let inner = format!("{}name{}", "fields { type { ".repeat(levels), " } }".repeat(levels));
    format!("inventories {{ nodes {{ id }} }} __schema {{ types {{ {inner} }} }}")
}

#[tokio::test(flavor = "multi_thread")]
async fn watcher_rows_of_a_process_that_died_are_cleared_when_a_listener_connects() {
    let app = Process::start(&[]).await;
    let id = app.create_inventory("STALE-1", 5).await;
    // What a crashed process leaves: its row, tied to a listener no backend has.
    let stale = format!(
        "INSERT INTO inventory_watchers (process_id, inventory_id, listener_pid) VALUES ('{}', '{id}', 2147483647)",
        Uuid::new_v4()
    );
    app.count(&format!("WITH i AS ({stale} RETURNING 1) SELECT count(*) FROM i")).await;
    // A listener connects (as at start, or after losing its connection).
    let listener = "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND query LIKE 'LISTEN%'";
    app.count(&format!("SELECT count(pg_terminate_backend(pid)) FROM ({listener}) l")).await;
    eventually(Duration::from_secs(20), "the stale watcher row is cleared", || async {
        app.count("SELECT count(*) FROM inventory_watchers").await == 0
    })
    .await;
}
