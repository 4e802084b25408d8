//! Responses lost after the commit, and orders abandoned mid-transaction: a
//! retry takes the stock once, and nothing is left open or half-written.

use super::*;

/// Sends `body` to `/graphql` over a raw connection and drops the connection
/// part-way, as a client whose network fails would. `mode` picks where:
/// 0: in the middle of the request; 1: `wait_ms` after the whole request;
/// 2: once the first bytes of the response have arrived (after the commit).
pub(super) async fn send_and_drop(address: &str, token: &str, body: &str, mode: u32, cut: f64, wait_ms: u64) {
    let host = address.trim_start_matches("http://");
    let request = format!(
        "POST /graphql HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {token}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let mut stream = tokio::net::TcpStream::connect(host).await.expect("connect");
    match mode {
        0 => {
            let upto = ((request.len() as f64) * cut) as usize;
            stream.write_all(&request.as_bytes()[..upto]).await.expect("write part");
        }
        1 => {
            stream.write_all(request.as_bytes()).await.expect("write");
            tokio::time::sleep(Duration::from_millis(wait_ms)).await;
        }
        _ => {
            stream.write_all(request.as_bytes()).await.expect("write");
            let mut first = [0u8; 16];
            let read = tokio::time::timeout(Duration::from_secs(10), stream.read(&mut first)).await;
            assert!(matches!(read, Ok(Ok(n)) if n > 0), "the server started answering");
        }
    }
    drop(stream);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_retry_after_a_lost_response_takes_the_stock_once_per_idempotency_key() {
    pub(super) const ROUNDS: usize = 20;
    pub(super) const INITIAL: i32 = 1000;
    let app = TestApp::spawn().await;
    let id = app.create_inventory("LOST-1", INITIAL).await;
    let bob = app.token("bob", Role::Customer);
    let mut rng = StdRng::seed_from_u64(0x5EED);
    let mut committed_first = 0;
    let mut answers = Vec::new();
    for round in 0..ROUNDS {
        let key = format!("lost-{round}");
        let input = json!({ "inventoryId": id, "quantity": 1, "idempotencyKey": key });
        let body = json!({ "query": RESERVE, "variables": { "input": input } }).to_string();
        let mode = (round % 3) as u32;
        send_and_drop(&app.address, &bob, &body, mode, rng.random_range(0.0..1.0), rng.random_range(0..=20)).await;
        let first = format!("SELECT id::text FROM reservations WHERE user_id = 'bob' AND idempotency_key = '{key}'");
        let before = app.db.query_one_raw(Statement::from_string(DbBackend::Postgres, first)).await.expect("query");
        let before: Option<String> = before.map(|row| row.try_get_by_index(0).expect("id"));
        match mode {
            0 => assert!(before.is_none(), "round {round}: half a request is never run"),
            2 => assert!(before.is_some(), "round {round}: a response was on its way, so the first request committed"),
            _ => {}
        }

        // The client retries the same request with the same key.
        let retried = app.reserve(&bob, input).await;
        assert_eq!(retried["__typename"], "Reserved", "round {round} (mode {mode}): {retried}");
        let reservation = retried["reservation"]["id"].as_str().expect("reservation id").to_owned();
        if let Some(first) = before {
            committed_first += 1;
            assert_eq!(reservation, first, "round {round}: the retry returns the first request's reservation");
        }
        answers.push((key, reservation));
    }

    for (key, reservation) in &answers {
        let rows = app
            .count(&format!(
                "SELECT count(*) FROM reservations WHERE user_id = 'bob' AND idempotency_key = '{key}' \
                 AND id = '{reservation}'"
            ))
            .await;
        assert_eq!(rows, 1, "{key}: the answered reservation is the key's one row");
    }
    assert_eq!(app.count("SELECT count(*) FROM reservations").await, ROUNDS as i64, "one reservation per key");
    assert_eq!(
        app.stock_and_version(id).await,
        (INITIAL - ROUNDS as i32, 1 + ROUNDS as i32),
        "stock taken once per key"
    );
    app.assert_invariant().await;
    println!("lost responses: {ROUNDS} keys, {committed_first} first requests had committed before the retry");
}

/// The server's connections that sit in a transaction nobody is running, as
/// `pid: last statement`.
pub(super) async fn open_transactions(app: &TestApp) -> Vec<String> {
    let sql = "SELECT coalesce(json_agg(pid || ': ' || left(query, 80)), '[]')::text FROM pg_stat_activity \
               WHERE datname = current_database() AND application_name = 'stockguard' \
               AND pid <> pg_backend_pid() AND state LIKE 'idle in transaction%'";
    let row = app.db.query_one_raw(Statement::from_string(DbBackend::Postgres, sql)).await.expect("query");
    let text: String = row.expect("one row").try_get_by_index(0).expect("json");
    serde_json::from_str(&text).expect("a list")
}

/// The server's connections running a statement right now.
pub(super) async fn busy_connections(app: &TestApp) -> i64 {
    app.count(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
         AND application_name = 'stockguard' AND pid <> pg_backend_pid() AND state = 'active'",
    )
    .await
}

/// Orders (one transaction each) whose clients hang up part-way: the server
/// must not drop the request's work halfway, and no connection may go back to
/// the pool with a transaction still open, or later requests would run (and
/// never commit) inside it.
#[tokio::test(flavor = "multi_thread")]
async fn orders_abandoned_mid_transaction_leave_no_transaction_open_and_nothing_half_written() {
    pub(super) const ROUNDS: usize = 40;
    let app = TestApp::spawn_with_options(Options { pool_size: 4, ..Options::default() }).await;
    let (a, b) = (app.create_inventory("ABANDON-A", 10_000).await, app.create_inventory("ABANDON-B", 10_000).await);
    let dave = app.token("dave", Role::Customer);
    let mut rng = StdRng::seed_from_u64(0xAB);
    for round in 0..ROUNDS {
        let lines = json!([{ "inventoryId": a, "quantity": 1 }, { "inventoryId": b, "quantity": 2 }]);
        let input = json!({ "items": lines, "shippingAddress": address(&format!("{round} Hang-up Lane")) });
        let body = json!({ "query": PLACE_ORDER, "variables": { "input": input } }).to_string();
        send_and_drop(&app.address, &dave, &body, 1, 0.0, rng.random_range(0..=20)).await;
    }

    // Whatever was cut off settles: the server finishes the work it started
    // (it runs each request to completion, holding its in-flight place until
    // then, also while it waits for a pooled connection), and no connection
    // stays in a transaction.
    let settled = until_settled(&app).await;
    let orders = app.count("SELECT count(*) FROM orders").await;
    let whole = "SELECT count(*) FROM orders o WHERE (SELECT count(*) FROM reservations r \
                 WHERE r.order_id = o.id AND r.status = 'ORDERED') = 2";
    let broken = "SELECT coalesce(json_agg(json_build_object('order', o.id, 'lines', \
                  (SELECT json_agg(json_build_object('status', r.status, 'inventory', r.inventory_id, 'qty', r.quantity)) \
                   FROM reservations r WHERE r.order_id = o.id))), '[]')::text FROM orders o \
                  WHERE (SELECT count(*) FROM reservations r WHERE r.order_id = o.id AND r.status = 'ORDERED') <> 2";
    let row = app.db.query_one_raw(Statement::from_string(DbBackend::Postgres, broken)).await.expect("query");
    let broken: String = row.expect("one row").try_get_by_index(0).expect("json");
    assert_eq!(app.count(whole).await, orders, "every order that exists has both its lines: {broken}");
    assert_eq!(app.count("SELECT count(*) FROM reservations WHERE order_id IS NULL").await, 0);

    // Every pooled connection is fit for use: each reserve is committed (seen
    // from another connection) as soon as it is answered.
    let erin = app.token("erin", Role::Customer);
    for n in 1..=12 {
        let input = if n % 2 == 0 {
            json!({ "inventoryId": a, "idempotencyKey": format!("after-{n}") })
        } else {
            json!({ "inventoryId": b })
        };
        assert_eq!(app.reserve(&erin, input).await["__typename"], "Reserved");
        assert_eq!(app.count("SELECT count(*) FROM reservations WHERE user_id = 'erin'").await, n, "committed");
    }
    assert_eq!(open_transactions(&app).await, Vec::<String>::new(), "no transaction is open afterwards");
    app.assert_invariant().await;
    println!("abandoned orders: {ROUNDS} requests cut off, {orders} orders committed whole, settled in {settled:?}");
}
