//! One client of the load through HAProxy: retries every retryable answer
//! with the same key until it ends in a union member.

use super::*;

/// One well-behaved client: reserves with a fresh key each round, every
/// eighth round places an order (with a key) instead, and cancels every
/// other order it placed; every request is retried until it is answered.
pub(super) struct Client {
    pub(super) gql: Arc<Gql>,
    pub(super) seen: Arc<Seen>,
    pub(super) stop: Arc<AtomicBool>,
    pub(super) token: Result<String, jsonwebtoken::errors::Error>,
    pub(super) reserve_items: Vec<Uuid>,
    pub(super) order_items: Vec<Uuid>,
    /// Which client, to spread the items.
    pub(super) n: usize,
}

impl Client {
    pub(super) async fn run(self) {
        let Ok(token) = &self.token else { return };
        let seen = &self.seen;
        let mut round = 0usize;
        while !self.stop.load(Ordering::Relaxed) {
            round += 1;
            if !round.is_multiple_of(8) {
                let item = self.reserve_items[(self.n + round) % self.reserve_items.len()];
                let input = json!({ "i": { "inventoryId": item, "idempotencyKey": format!("r-{round}") } });
                let Some((name, data, _)) = seen.until_answered(&self.gql, token, RESERVE, input, "reserve").await
                else {
                    continue;
                };
                match name.as_str() {
                    "Reserved" => match data["reservation"]["id"].as_str().and_then(|id| id.parse().ok()) {
                        Some(id) => lock(&seen.reserved).push(id),
                        None => lock(&seen.bad).push("Reserved without an id".into()),
                    },
                    "SoldOut" => {}
                    other => lock(&seen.bad).push(format!("reserve: {other}")),
                }
                continue;
            }
            let input = json!({ "i": {
                "items": [{ "inventoryId": self.order_items[round % self.order_items.len()], "quantity": 1 }],
                "shippingAddress": address(),
                "idempotencyKey": format!("o-{round}"),
            }});
            let Some((name, data, _)) = seen.until_answered(&self.gql, token, PLACE_ORDER, input, "placeOrder").await
            else {
                continue;
            };
            let Some(id) =
                data["order"]["id"].as_str().and_then(|id| id.parse().ok()).filter(|_| name == "OrderPlaced")
            else {
                lock(&seen.bad).push(format!("placeOrder: {name}"));
                continue;
            };
            lock(&seen.placed).push(id);
            if round.is_multiple_of(16)
                && let Some((name, data, retried)) =
                    seen.until_answered(&self.gql, token, CANCEL, json!({ "id": id }), "cancelOrder").await
            {
                // cancelOrder has no key: when an attempt failed with its
                // commit in flight (the primary killed), the retry finds
                // the order already CANCELLED, which is that attempt's work.
                let ours = retried && name == "OrderCannotBeCancelled" && data["order"]["status"] == "CANCELLED";
                if name == "OrderCancelled" || ours {
                    lock(&seen.cancelled).push(id);
                } else {
                    lock(&seen.bad).push(format!("cancelOrder: {name}"));
                }
            }
        }
    }
}

/// Creates an inventory through HAProxy (before any fault; retried while the formation settles).
pub(super) async fn create(gql: &Gql, operator: &str, sku: &str, stock: i64) -> anyhow::Result<Uuid> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match gql.create_inventory(operator, sku, sku, stock).await {
            Ok(id) => return Ok(id),
            Err(err) if Instant::now() < deadline => {
                eprintln!("failover: createInventory {sku}: {err:#}; again");
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
            Err(err) => return Err(err),
        }
    }
}
