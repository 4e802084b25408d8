//! What is checked after a run, on the primary, and the subscriber that
//! follows one hot inventory through the faults.

use super::*;

/// The checks on the primary; how many acknowledged writes are missing.
pub(super) async fn check(
    db: &DatabaseConnection,
    seen: &Seen,
    reserve_items: &[Uuid],
    order_items: &[Uuid],
    tag: &str,
    violations: &mut Vec<String>,
) -> anyhow::Result<usize> {
    let ids = |sql: String| async move {
        let rows = db.query_all_raw(Statement::from_string(DbBackend::Postgres, sql)).await?;
        rows.iter().map(|row| row.try_get_by_index::<Uuid>(0)).collect::<Result<HashSet<Uuid>, _>>()
    };
    let list = |items: &[Uuid]| items.iter().map(|id| format!("'{id}'")).collect::<Vec<_>>().join(",");
    let acknowledged: HashSet<Uuid> = lock(&seen.reserved).iter().copied().collect();
    let stored = ids(format!(
        "SELECT id FROM reservations WHERE inventory_id IN ({}) AND order_id IS NULL",
        list(reserve_items)
    ))
    .await?;
    let lost_reservations = acknowledged.difference(&stored).count();
    let phantom_reservations = stored.difference(&acknowledged).count();
    let placed: HashSet<Uuid> = lock(&seen.placed).iter().copied().collect();
    let orders = ids(format!("SELECT id FROM orders WHERE user_id LIKE '{tag}-%'")).await?;
    let lost_orders = placed.difference(&orders).count();
    let phantom_orders = orders.difference(&placed).count();
    let cancelled: Vec<Uuid> = lock(&seen.cancelled).clone();
    let still_open = if cancelled.is_empty() {
        0
    } else {
        ids(format!("SELECT id FROM orders WHERE id IN ({}) AND status <> 'CANCELLED'", list(&cancelled))).await?.len()
    };
    if lost_reservations + lost_orders + still_open > 0 {
        violations.push(format!(
            "acknowledged writes lost: {lost_reservations} reservations, {lost_orders} orders, {still_open} cancellations"
        ));
    }
    if phantom_reservations + phantom_orders > 0 {
        violations.push(format!(
            "{phantom_reservations} reservations and {phantom_orders} orders exist that no client's retries ended in"
        ));
    }
    let negative = ids(format!(
        "SELECT id FROM inventories WHERE stock < 0 AND id IN ({},{})",
        list(reserve_items),
        list(order_items)
    ))
    .await?;
    if !negative.is_empty() {
        violations.push(format!("oversold: {negative:?}"));
    }
    let drifts = stockguard::invariant::check(db).await?;
    if !drifts.is_empty() {
        violations.push(format!("invariant: {drifts:?}"));
    }
    eprintln!(
        "failover: checked {} reservations and {} orders acknowledged, {} cancellations",
        acknowledged.len(),
        placed.len(),
        cancelled.len()
    );
    Ok(lost_reservations + lost_orders + still_open)
}

/// Follows `inventoryChanged` of `id` through HAProxy until `stop`,
/// recording when each change arrives; reconnects (counted) when the socket breaks.
pub(super) async fn subscribe(
    base: String,
    id: Uuid,
    changes: Arc<Mutex<Vec<Instant>>>,
    reconnects: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
) {
    use tokio_tungstenite::tungstenite::{Message, client::IntoClientRequest as _, http::HeaderValue};
    let mut first = true;
    while !stop.load(Ordering::Relaxed) {
        if !first {
            reconnects.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        first = false;
        let Ok(mut request) = format!("{}/graphql/ws", base.replace("http://", "ws://")).into_client_request() else {
            return;
        };
        request.headers_mut().insert("Sec-WebSocket-Protocol", HeaderValue::from_static("graphql-transport-ws"));
        let Ok(Ok((mut socket, _))) =
            tokio::time::timeout(Duration::from_secs(5), tokio_tungstenite::connect_async(request)).await
        else {
            continue;
        };
        let init = json!({ "type": "connection_init", "payload": {} }).to_string();
        let query = "subscription($id: UUID!) { inventoryChanged(id: $id) { version } }";
        let subscribe =
            json!({ "id": "1", "type": "subscribe", "payload": { "query": query, "variables": { "id": id } } });
        if socket.send(Message::text(init)).await.is_err()
            || socket.send(Message::text(subscribe.to_string())).await.is_err()
        {
            continue;
        }
        loop {
            if stop.load(Ordering::Relaxed) {
                return;
            }
            let message = match tokio::time::timeout(Duration::from_millis(500), socket.next()).await {
                Err(_) => continue,
                Ok(Some(Ok(message))) => message,
                Ok(_) => break,
            };
            match message {
                Message::Text(text) => {
                    let value: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
                    match value["type"].as_str() {
                        Some("next") => lock(&changes).push(Instant::now()),
                        Some("ping") => {
                            let _ = socket.send(Message::text(json!({ "type": "pong" }).to_string())).await;
                        }
                        Some("error" | "complete") => break,
                        _ => {}
                    }
                }
                Message::Close(_) => break,
                _ => {}
            }
        }
    }
}
