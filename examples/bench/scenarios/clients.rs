//! The client loops: the hot or spread `reserve`, one contested order,
//! contested checkouts of carts; the benchmark and the load tool both run them.

use super::*;

/// One client reserving units of a random one of `targets` over and over
/// until `rec`'s end, or until `budget` units have been asked for (shared by
/// all clients), whichever comes first; `keyed`, each with a fresh
/// idempotency key.
pub async fn reserve_client(
    gql: Arc<Gql>,
    token: String,
    targets: Targets,
    seed: u64,
    mut rec: Recorder,
    budget: Option<Arc<AtomicI64>>,
    keyed: bool,
) -> anyhow::Result<Recorder> {
    let until = rec.until.context("a client's recorder says when it ends")?;
    let authorization = HeaderValue::from_str(&format!("Bearer {token}"))?;
    let mut rng = Rng::new(seed);
    // Keys are unique per user: a client's run has its own prefix.
    let (prefix, mut sent) = (Uuid::new_v4().simple(), 0u64);
    let mut lean = gql.lean()?;
    while Instant::now() < until && budget.as_ref().is_none_or(|left| left.fetch_sub(1, Ordering::SeqCst) > 0) {
        let id = targets.ids[rng.below(targets.ids.len())];
        let quantity = targets.units.draw(&mut rng);
        sent += 1;
        let key = keyed.then(|| format!("{prefix}-{sent}"));
        let start = Instant::now();
        let outcome = lean.reserve(&authorization, id, quantity, key.as_deref()).await;
        rec.record(start, &outcome, ONE_REQUEST);
    }
    Ok(rec)
}

/// One client of a contested order: mostly address changes (read the
/// version, then change at it), every 50th operation a confirm or a cancel;
/// when the order is confirmed or cancelled the next one is placed.
pub struct OrderContest {
    /// The client.
    pub gql: Arc<Gql>,
    /// The order being contested now.
    pub current: Arc<RwLock<Uuid>>,
    /// Confirms and cancels.
    pub operator: String,
    /// Owns the orders and changes their address.
    pub customer: String,
    /// What the orders hold.
    pub inventory: Uuid,
}

/// The outcomes that count as a success in a contested order.
pub const ORDER_SUCCESSES: [&str; 3] =
    ["changeShippingAddress → ShippingAddressChanged", "confirmOrder → OrderConfirmed", "cancelOrder → OrderCancelled"];

impl OrderContest {
    /// Client `i`'s loop until `until`.
    pub async fn client(self: Arc<Self>, i: usize, mut rec: Recorder, until: Instant) -> anyhow::Result<Recorder> {
        let mut n = 0usize;
        while Instant::now() < until {
            n += 1;
            let order = *self.current.read().await;
            let (op, query) = match (i + n) % 50 {
                0 => ("confirmOrder", CONFIRM),
                1 => ("cancelOrder", CANCEL),
                _ => ("changeShippingAddress", CHANGE_ADDRESS),
            };
            let start = Instant::now();
            let mut extra = ONE_REQUEST;
            let outcome = if op == "changeShippingAddress" {
                extra.requests = 2;
                match self.gql.data(&self.customer, ORDER_VERSION, json!({ "id": order })).await {
                    Ok(seen) => {
                        let version = seen["data"]["order"]["version"].as_i64().unwrap_or(0);
                        let input = json!({ "i": { "orderId": order, "expectedVersion": version,
                            "shippingAddress": address(&format!("client {i} #{n}")) } });
                        self.gql.call(&self.customer, query, input, op).await
                    }
                    Err(err) => Outcome::Error(err),
                }
            } else {
                self.gql.call(&self.operator, query, json!({ "id": order }), op).await
            };
            if let Outcome::Ok(name, _) = &outcome
                && (name == "OrderVersionConflict" || name == "OrderModifiedConcurrently")
            {
                extra.conflicts = 1;
            }
            let named = named(op, outcome);
            let finished =
                matches!(&named, Outcome::Ok(n, _) if n.ends_with("OrderConfirmed") || n.ends_with("OrderCancelled"));
            rec.record(start, &named, extra);
            if finished {
                let next = self.gql.place_order(&self.customer, self.inventory, address("start")).await?;
                let mut current = self.current.write().await;
                if *current == order {
                    *current = next;
                }
            }
        }
        Ok(rec)
    }
}

/// One client of contested checkouts: it fills a cart with `lines` holds of
/// one unit on a few hot inventories, then submits its checkout `submits`
/// times at once (a double submit, no idempotency key); every 10th cart its
/// owner also releases the last line at the same moment. Exactly one submit
/// may place the order; the others must be refused as ORDERED (or, when the
/// release won, every submit as RELEASED).
pub struct CheckoutContest {
    /// The client.
    pub gql: Arc<Gql>,
    /// What the carts hold.
    pub inventories: Arc<Vec<Uuid>>,
    /// Holds per cart.
    pub lines: usize,
    /// Checkouts sent at once per cart.
    pub submits: usize,
}

/// The outcome that counts as a success in contested checkouts: a placed order.
pub const CHECKOUT_SUCCESSES: [&str; 1] = ["checkout → OrderPlaced"];

impl CheckoutContest {
    /// Client `i`'s loop, as customer `token`, until `until`.
    pub async fn client(
        self: Arc<Self>,
        i: usize,
        token: String,
        mut rec: Recorder,
        until: Instant,
    ) -> anyhow::Result<Recorder> {
        let mut rng = Rng::new(i as u64 + 1);
        let mut n = 0usize;
        while Instant::now() < until {
            n += 1;
            let mut cart = Vec::with_capacity(self.lines);
            for _ in 0..self.lines {
                let inventory = self.inventories[rng.below(self.inventories.len())];
                let start = Instant::now();
                let outcome =
                    self.gql.call(&token, RESERVE, json!({ "i": { "inventoryId": inventory } }), "reserve").await;
                if let Outcome::Ok(name, data) = &outcome
                    && name == "Reserved"
                {
                    cart.push(data["reservation"]["id"].clone());
                }
                rec.record(start, &named("reserve", outcome), ONE_REQUEST);
            }
            if cart.is_empty() {
                continue;
            }
            let input =
                json!({ "i": { "reservationIds": cart, "shippingAddress": address(&format!("cart {i} #{n}")) } });
            let checkouts = (0..self.submits).map(|_| async {
                let start = Instant::now();
                (start, self.gql.call(&token, CHECKOUT, input.clone(), "checkout").await)
            });
            let release = async {
                if !n.is_multiple_of(10) {
                    return None;
                }
                let start = Instant::now();
                let id = cart.last().cloned().unwrap_or(Value::Null);
                Some((start, self.gql.call(&token, RELEASE, json!({ "id": id }), "releaseReservation").await))
            };
            let (answers, released) = tokio::join!(futures::future::join_all(checkouts), release);
            let placed =
                answers.iter().filter(|(_, o)| matches!(o, Outcome::Ok(name, _) if name == "OrderPlaced")).count();
            for (start, outcome) in answers {
                let outcome = match outcome {
                    Outcome::Ok(name, data) if name == "ReservationsUnavailable" => {
                        let mut reasons: Vec<&str> = data["reservations"]
                            .as_array()
                            .into_iter()
                            .flatten()
                            .filter_map(|r| r["reason"].as_str())
                            .collect();
                        reasons.sort_unstable();
                        reasons.dedup();
                        Outcome::Ok(format!("{name} {}", reasons.join("+")), data.clone())
                    }
                    outcome => outcome,
                };
                let extra = Extra {
                    conflicts: u64::from(placed > 0 && !matches!(&outcome, Outcome::Ok(n, _) if n == "OrderPlaced")),
                    ..ONE_REQUEST
                };
                rec.record(start, &named("checkout", outcome), extra);
            }
            if let Some((start, outcome)) = released {
                rec.record(start, &named("releaseReservation", outcome), ONE_REQUEST);
            }
            anyhow::ensure!(placed <= 1, "one cart placed {placed} orders");
        }
        Ok(rec)
    }
}

/// `outcome` named after the operation `op` (`"checkout → OrderPlaced"`).
pub(super) fn named(op: &str, outcome: Outcome) -> Outcome {
    match outcome {
        Outcome::Ok(name, data) => Outcome::Ok(format!("{op} → {name}"), data),
        Outcome::Error(err) => Outcome::Error(format!("{op} → {err}")),
    }
}

/// A shipping address whose first line is `line1`.
pub fn address(line1: &str) -> Value {
    json!({ "name": "Bench", "line1": line1, "city": "Osaka", "postalCode": "530-0001", "country": "JP" })
}
