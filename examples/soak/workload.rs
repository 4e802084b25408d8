//! The soak's workload: the mix of operations, what each client does in a
//! loop, and the tally of what came back.

use super::*;

/// The operations of the mix, each with its weight.
pub(super) const MIX: [(Op, u32); 9] = [
    (Op::Reserve, 22),
    (Op::ReserveTwice, 5),
    (Op::Release, 12),
    (Op::Extend, 10),
    (Op::ReserveMany, 10),
    (Op::PlaceOrder, 12),
    (Op::Confirm, 8),
    (Op::Cancel, 8),
    (Op::ChangeAddress, 10),
];

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
pub(super) enum Op {
    Reserve,
    /// The same keyed reserve sent twice (a double click).
    ReserveTwice,
    Release,
    Extend,
    ReserveMany,
    PlaceOrder,
    Confirm,
    Cancel,
    ChangeAddress,
}

impl Op {
    pub(super) fn name(self) -> &'static str {
        match self {
            Self::Reserve => "reserve",
            Self::ReserveTwice => "reserve (keyed, twice)",
            Self::Release => "releaseReservation",
            Self::Extend => "extendReservation",
            Self::ReserveMany => "reserveMany",
            Self::PlaceOrder => "placeOrder",
            Self::Confirm => "confirmOrder",
            Self::Cancel => "cancelOrder",
            Self::ChangeAddress => "changeShippingAddress",
        }
    }
}

/// What one client saw; merged into the report.
#[derive(Default)]
pub(super) struct Tally {
    /// Requests per operation.
    pub(super) requests: BTreeMap<Op, u64>,
    /// Union members per operation.
    pub(super) outcomes: BTreeMap<Op, BTreeMap<String, u64>>,
    /// Errors by code (or HTTP failure) per operation.
    pub(super) errors: BTreeMap<Op, BTreeMap<String, u64>>,
    /// Reservations seen EXPIRED by release or extend.
    pub(super) seen_expired: u64,
}

impl Tally {
    pub(super) fn record(&mut self, op: Op, outcome: &Outcome) {
        *self.requests.entry(op).or_default() += 1;
        let (map, key) = match outcome {
            Outcome::Ok(name, data) => {
                if data["reservation"]["status"] == "EXPIRED" {
                    self.seen_expired += 1;
                }
                (&mut self.outcomes, name)
            }
            Outcome::Error(code) => (&mut self.errors, code),
        };
        *map.entry(op).or_default().entry(key.clone()).or_default() += 1;
    }

    pub(super) fn merge(&mut self, other: Tally) {
        for (op, n) in other.requests {
            *self.requests.entry(op).or_default() += n;
        }
        for (mine, theirs) in [(&mut self.outcomes, other.outcomes), (&mut self.errors, other.errors)] {
            for (op, names) in theirs {
                for (name, n) in names {
                    *mine.entry(op).or_default().entry(name).or_default() += n;
                }
            }
        }
        self.seen_expired += other.seen_expired;
    }

    pub(super) fn errors_by_code(&self) -> BTreeMap<String, u64> {
        let mut by_code = BTreeMap::new();
        for names in self.errors.values() {
            for (code, n) in names {
                *by_code.entry(code.clone()).or_default() += n;
            }
        }
        by_code
    }
}

/// Everything the clients share.
pub(super) struct Shared {
    pub(super) gql: Gql,
    pub(super) operator: String,
    pub(super) inventories: Vec<Uuid>,
    pub(super) deadline: Instant,
    pub(super) requests: AtomicU64,
}

/// One client: its own token, its own reservations and orders.
pub(super) struct Client {
    pub(super) shared: Arc<Shared>,
    pub(super) token: String,
    pub(super) rng: SmallRng,
    pub(super) tally: Tally,
    pub(super) reservations: Vec<Uuid>,
    /// PENDING as far as this client knows, with the version it last saw.
    pub(super) orders: Vec<(Uuid, i64)>,
    /// The latest version seen of each inventory.
    pub(super) versions: BTreeMap<Uuid, i64>,
    pub(super) keys: u64,
}

impl Client {
    pub(super) async fn call(
        &mut self,
        op: Op,
        token: Option<&str>,
        query: &str,
        variables: Value,
        field: &str,
    ) -> Outcome {
        let token = token.unwrap_or(&self.token).to_owned();
        let outcome = self.shared.gql.call(&token, query, variables, field).await;
        self.shared.requests.fetch_add(1, Ordering::Relaxed);
        self.tally.record(op, &outcome);
        outcome
    }

    pub(super) fn inventory(&mut self) -> Uuid {
        *self.shared.inventories.choose(&mut self.rng).unwrap_or(&Uuid::nil())
    }

    /// Up to `n` distinct inventories.
    pub(super) fn inventories(&mut self, n: usize) -> Vec<Uuid> {
        self.shared.inventories.sample(&mut self.rng, n).copied().collect()
    }

    pub(super) fn remember(&mut self, reservation: &Value) {
        if let Some(id) = reservation["id"].as_str().and_then(|id| id.parse().ok()) {
            if self.reservations.len() >= 32 {
                self.reservations.remove(0);
            }
            self.reservations.push(id);
        }
    }

    pub(super) fn saw_inventory(&mut self, inventory: &Value) {
        if let (Some(id), Some(version)) =
            (inventory["id"].as_str().and_then(|id| id.parse().ok()), inventory["version"].as_i64())
        {
            self.versions.insert(id, version);
        }
    }

    pub(super) fn some_reservation(&mut self) -> Option<Uuid> {
        (!self.reservations.is_empty()).then(|| self.reservations[self.rng.random_range(0..self.reservations.len())])
    }

    pub(super) fn some_order(&mut self) -> Option<usize> {
        (!self.orders.is_empty()).then(|| self.rng.random_range(0..self.orders.len()))
    }

    pub(super) async fn run(mut self) -> Tally {
        let total: u32 = MIX.iter().map(|(_, weight)| weight).sum();
        while Instant::now() < self.shared.deadline {
            let mut pick = self.rng.random_range(0..total);
            let op = MIX
                .iter()
                .find(|(_, weight)| {
                    let hit = pick < *weight;
                    pick = pick.saturating_sub(*weight);
                    hit
                })
                .map_or(Op::Reserve, |(op, _)| *op);
            self.step(op).await;
        }
        self.tally
    }

    pub(super) async fn step(&mut self, op: Op) {
        match op {
            Op::Reserve => {
                let inventory = self.inventory();
                let mut input = json!({ "inventoryId": inventory, "quantity": self.rng.random_range(1..=3) });
                // A quarter of them from a screen: only at the version last seen.
                if self.rng.random_bool(0.25)
                    && let Some(version) = self.versions.get(&inventory)
                {
                    input["expectedVersion"] = json!(version);
                }
                if let Outcome::Ok(_, data) = self.call(op, None, RESERVE, json!({ "i": input }), "reserve").await {
                    self.remember(&data["reservation"]);
                    self.saw_inventory(&data["inventory"]);
                }
            }
            Op::ReserveTwice => {
                self.keys += 1;
                let input = json!({ "inventoryId": self.inventory(), "idempotencyKey": format!("soak-{}", self.keys) });
                let first = self.call(op, None, RESERVE, json!({ "i": input }), "reserve").await;
                let second = self.call(op, None, RESERVE, json!({ "i": input }), "reserve").await;
                // The replay of a request that took stock is that first outcome.
                // (One that found the item sold out took nothing: its replay
                // may find stock that came back since.)
                if let (Outcome::Ok(name, a), Outcome::Ok(_, b)) = (&first, &second)
                    && name == "Reserved"
                    && a["reservation"]["id"] != b["reservation"]["id"]
                {
                    let error = Outcome::Error(format!("REPLAY OF Reserved RETURNED {}", b["__typename"]));
                    self.tally.record(op, &error);
                }
                if let Outcome::Ok(_, data) = first {
                    self.remember(&data["reservation"]);
                }
            }
            Op::Release => {
                if let Some(id) = self.some_reservation() {
                    self.reservations.retain(|r| *r != id);
                    self.call(op, None, RELEASE, json!({ "id": id }), "releaseReservation").await;
                }
            }
            Op::Extend => {
                if let Some(id) = self.some_reservation() {
                    let variables = json!({ "id": id, "s": self.rng.random_range(1..=2) });
                    self.call(op, None, EXTEND, variables, "extendReservation").await;
                }
            }
            Op::ReserveMany => {
                let n = self.rng.random_range(2..=4);
                let items: Vec<Value> = self
                    .inventories(n)
                    .into_iter()
                    .map(|id| json!({ "inventoryId": id, "quantity": 1 + u8::from(id.as_bytes()[0] % 2 == 0) }))
                    .collect();
                let input = json!({ "items": items });
                if let Outcome::Ok(_, data) =
                    self.call(op, None, RESERVE_MANY, json!({ "i": input }), "reserveMany").await
                {
                    for reservation in data["reservations"].as_array().into_iter().flatten() {
                        self.remember(reservation);
                    }
                }
            }
            Op::PlaceOrder => {
                let n = self.rng.random_range(1..=3);
                let items: Vec<Value> =
                    self.inventories(n).into_iter().map(|id| json!({ "inventoryId": id })).collect();
                let input = json!({ "items": items, "shippingAddress": address(&mut self.rng) });
                if let Outcome::Ok(_, data) =
                    self.call(op, None, PLACE_ORDER, json!({ "i": input }), "placeOrder").await
                    && let (Some(id), Some(version)) =
                        (data["order"]["id"].as_str().and_then(|id| id.parse().ok()), data["order"]["version"].as_i64())
                {
                    if self.orders.len() >= 16 {
                        self.orders.remove(0);
                    }
                    self.orders.push((id, version));
                }
            }
            Op::Confirm | Op::Cancel => {
                if let Some(i) = self.some_order() {
                    let (id, _) = self.orders.swap_remove(i);
                    let operator = self.shared.operator.clone();
                    let (query, field, token) = if op == Op::Confirm {
                        (CONFIRM, "confirmOrder", Some(operator.as_str()))
                    } else {
                        (CANCEL, "cancelOrder", None)
                    };
                    self.call(op, token, query, json!({ "id": id }), field).await;
                }
            }
            Op::ChangeAddress => {
                if let Some(i) = self.some_order() {
                    let (id, version) = self.orders[i];
                    let input = json!({ "orderId": id, "expectedVersion": version,
                                        "shippingAddress": address(&mut self.rng) });
                    let outcome =
                        self.call(op, None, CHANGE_ADDRESS, json!({ "i": input }), "changeShippingAddress").await;
                    if let Outcome::Ok(name, data) = outcome {
                        let seen = data["order"]["version"].as_i64().or(data["current"]["version"].as_i64());
                        match (name.as_str(), seen) {
                            ("OrderNotEditable" | "OrderNotFound", _) => {
                                self.orders.swap_remove(i);
                            }
                            (_, Some(seen)) => self.orders[i].1 = seen,
                            _ => {}
                        }
                    }
                }
            }
        }
    }
}
