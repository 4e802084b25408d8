//! Every mutation, fuzzed through its input: answered without an internal
//! error, and a refusal writes nothing.

use super::*;

pub(super) const RESERVE_MANY: &str = r#"
mutation($input: ReserveManyInput!) {
  reserveMany(input: $input) {
    __typename
    ... on ReservedAll { reservations { id quantity status inventory { id stock version } } }
    ... on ItemsUnavailable { items { inventoryId reason inventory { id stock version } } }
  }
}"#;

pub(super) const PLACE_ORDER: &str = r#"
mutation($input: PlaceOrderInput!) {
  placeOrder(input: $input) {
    __typename
    ... on OrderPlaced { order { id status version items { quantity inventory { id stock } }
                                 shippingAddress { name line1 line2 city postalCode country } } }
    ... on ItemsUnavailable { items { inventoryId reason inventory { id stock version } } }
  }
}"#;

pub(super) const RELEASE: &str = r#"
mutation($id: UUID!) {
  releaseReservation(id: $id) {
    __typename
    ... on ReservationReleased { reservation { id status } inventory { id stock version } }
    ... on ReservationNotFound { reservationId }
    ... on ReservationNotActive { reservation { id status } }
  }
}"#;

pub(super) const EXTEND: &str = r#"
mutation($id: UUID!, $seconds: Int!) {
  extendReservation(id: $id, seconds: $seconds) {
    __typename
    ... on ReservationExtended { reservation { id status expiresAt } }
    ... on ReservationNotFound { reservationId }
    ... on ReservationNotActive { reservation { id status } }
  }
}"#;

pub(super) const CREATE: &str = r#"
mutation($input: CreateInventoryInput!) {
  createInventory(input: $input) { __typename id sku name stock version }
}"#;

pub(super) const RESTOCK: &str = r#"
mutation($input: RestockInput!) {
  restock(input: $input) {
    __typename
    ... on Restocked { inventory { id stock version } }
    ... on Conflict { expectedVersion inventory { id stock version } }
    ... on InventoryNotFound { inventoryId }
  }
}"#;

pub(super) const CONFIRM: &str = r#"
mutation($id: UUID!) {
  confirmOrder(id: $id) {
    __typename
    ... on OrderConfirmed { order { id status confirmedAt confirmedBy version } }
    ... on OrderCannotBeConfirmed { order { id status } }
    ... on OrderNotFound { orderId }
    ... on OrderModifiedConcurrently { orderId attempts }
  }
}"#;

pub(super) const CANCEL: &str = r#"
mutation($id: UUID!) {
  cancelOrder(id: $id) {
    __typename
    ... on OrderCancelled { order { id status version items { quantity } } }
    ... on OrderCannotBeCancelled { order { id status } }
    ... on OrderNotFound { orderId }
    ... on OrderModifiedConcurrently { orderId attempts }
  }
}"#;

pub(super) const CHANGE_ADDRESS: &str = r#"
mutation($input: ChangeShippingAddressInput!) {
  changeShippingAddress(input: $input) {
    __typename
    ... on ShippingAddressChanged {
      order { id version shippingAddress { name line1 line2 city postalCode country } }
    }
    ... on OrderVersionConflict {
      expectedVersion current { id version } submitted { name line1 line2 city postalCode country }
    }
    ... on OrderNotEditable { order { id status } }
    ... on OrderNotFound { orderId }
  }
}"#;

pub(super) const CHECKOUT: &str = r#"
mutation($input: CheckoutInput!) {
  checkout(input: $input) {
    __typename
    ... on OrderPlaced { order { id status version items { quantity inventory { id stock reserved committed } } } }
    ... on ReservationsUnavailable { reservations { reservationId reason reservation { id status quantity } } }
  }
}"#;

pub(super) const CHANGE_QUANTITY: &str = r#"
mutation($input: ChangeReservationQuantityInput!) {
  changeReservationQuantity(input: $input) {
    __typename
    ... on ReservationChanged { reservation { id quantity } inventory { id stock version available onHand } }
    ... on SoldOut { requested inventory { id stock version } }
    ... on ReservationNotActive { reservation { id status } }
    ... on ReservationNotFound { reservationId }
  }
}"#;

pub(super) const FULFILL: &str = r#"
mutation($id: UUID!) {
  fulfillOrder(id: $id) {
    __typename
    ... on OrderFulfilled { order { id status fulfilledAt fulfilledBy version } }
    ... on OrderCannotBeFulfilled { order { id status } }
    ... on OrderNotFound { orderId }
    ... on OrderModifiedConcurrently { orderId attempts }
  }
}"#;

pub(super) const RETURN_ORDER: &str = r#"
mutation($input: ReturnOrderInput!) {
  returnOrder(input: $input) {
    __typename
    ... on OrderReturned {
      order { id status version items { quantity returned } }
      return { id note createdBy createdAt lines { quantity disposition inventory { id stock } location { code } } }
    }
    ... on ReturnExceedsFulfilled { inventoryId fulfilled returned requested }
    ... on OrderCannotBeReturned { order { id status } }
    ... on OrderNotFound { orderId }
  }
}"#;

/// A server with a big inventory, a nearly sold-out one, and their ids (the
/// big one first).
pub(super) async fn server_with_stock() -> (TestApp, Vec<Uuid>) {
    let app = TestApp::spawn().await;
    let big = app.create_inventory("FUZZ-BIG", 1_000_000_000).await;
    let low = app.create_inventory("FUZZ-LOW", 3).await;
    (app, vec![big, low])
}

/// A fresh ACTIVE reservation of Alice's.
pub(super) async fn fresh_reservation(app: &TestApp, inventory: Uuid) -> Uuid {
    let token = app.token("alice", Role::Customer);
    let reserved = app.reserve(&token, json!({ "inventoryId": inventory })).await;
    reserved["reservation"]["id"].as_str().and_then(|id| id.parse().ok()).unwrap_or_else(|| panic!("{reserved}"))
}

/// A fresh PENDING order of `user`'s, of one unit.
pub(super) async fn fresh_order(app: &TestApp, user: &str, inventory: Uuid) -> Uuid {
    let input = json!({ "items": [{ "inventoryId": inventory }], "shippingAddress": valid_address() });
    let body = app.graphql(Some(&app.token(user, Role::Customer)), PLACE_ORDER, json!({ "input": input })).await;
    body["data"]["placeOrder"]["order"]["id"]
        .as_str()
        .and_then(|id| id.parse().ok())
        .unwrap_or_else(|| panic!("{body}"))
}

/// A fresh FULFILLED order of Alice's, of `quantity` units.
pub(super) async fn fresh_fulfilled_order(app: &TestApp, inventory: Uuid, quantity: i32) -> Uuid {
    let input =
        json!({ "items": [{ "inventoryId": inventory, "quantity": quantity }], "shippingAddress": valid_address() });
    let body = app.graphql(Some(&app.token("alice", Role::Customer)), PLACE_ORDER, json!({ "input": input })).await;
    let id = body["data"]["placeOrder"]["order"]["id"]
        .as_str()
        .and_then(|id| id.parse().ok())
        .unwrap_or_else(|| panic!("{body}"));
    for query in [CONFIRM, FULFILL] {
        let done = app.graphql(Some(&app.operator()), query, json!({ "id": id })).await;
        assert!(done.get("errors").is_none(), "{done}");
    }
    id
}

pub(super) async fn ids(app: &TestApp, sql: &str) -> Vec<Uuid> {
    let rows = app.db.query_all_raw(Statement::from_string(DbBackend::Postgres, sql)).await.expect("query");
    rows.iter().map(|row| row.try_get_by_index(0).expect("id")).collect()
}

// ---------------------------------------------------------------------------
// Mutations

#[tokio::test(flavor = "multi_thread")]
async fn reserve_answers_any_input_without_internal_errors_and_refusals_write_nothing() {
    let (app, inventories) = server_with_stock().await;
    let app = std::sync::Arc::new(app);
    let known = inventories.clone();
    let strategy = move || {
        let valid = (
            Just(Caller::Alice),
            plenty(&known),
            (1..=3_i32).prop_map(|quantity| Some(json!(quantity))),
            valid_version(),
            fresh_key(),
            Just(false),
        );
        let fuzzed = (
            caller(Caller::Alice),
            uuid(known),
            prop::option::weighted(0.8, quantity()),
            version(),
            idempotency_key(),
            prop::bool::weighted(0.05),
        );
        prop_oneof![1 => valid, 2 => fuzzed]
    };
    let shared = app.clone();
    for_64_cases(strategy, move |(caller, inventory, quantity, version, key, unknown_field)| {
        let app = shared.clone();
        async move {
            let mut input = json!({ "inventoryId": inventory });
            set(&mut input, "quantity", quantity);
            set(&mut input, "expectedVersion", version.resolve(inventory_version(&app, &inventory)).await);
            set(&mut input, "idempotencyKey", key);
            if unknown_field {
                input["userId"] = json!("mallory");
            }
            mutate(&app, &caller, RESERVE, json!({ "input": input }), "reserve").await.map(drop)
        }
    })
    .await;
    assert_still_serving(&app).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn reserve_many_and_place_order_answer_any_lines_without_internal_errors_and_refusals_write_nothing() {
    let (app, inventories) = server_with_stock().await;
    let app = std::sync::Arc::new(app);
    let known = inventories.clone();
    let strategy = move || {
        let key = prop_oneof![fresh_key(), idempotency_key()];
        (any::<bool>(), caller(Caller::Alice), items(known), address(), key)
    };
    let shared = app.clone();
    for_64_cases(strategy, move |(order, caller, items, address, key)| {
        let app = shared.clone();
        async move {
            let mut lines = Vec::with_capacity(items.len());
            for item in &items {
                lines.push(item.to_json(&app).await);
            }
            let mut input = json!({ "items": lines });
            set(&mut input, "idempotencyKey", key);
            if order {
                input["shippingAddress"] = address;
                mutate(&app, &caller, PLACE_ORDER, json!({ "input": input }), "placeOrder").await.map(drop)
            } else {
                mutate(&app, &caller, RESERVE_MANY, json!({ "input": input }), "reserveMany").await.map(drop)
            }
        }
    })
    .await;
    assert_still_serving(&app).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn release_and_extend_answer_any_id_and_seconds_without_internal_errors_and_refusals_write_nothing() {
    let (app, inventories) = server_with_stock().await;
    let big = inventories[0];
    // Alice's, Bob's (absent to Alice) and an order line (never ACTIVE).
    let mut known = vec![fresh_reservation(&app, big).await, fresh_reservation(&app, big).await];
    let bobs = app.reserve(&app.token("bob", Role::Customer), json!({ "inventoryId": big })).await;
    known.push(bobs["reservation"]["id"].as_str().and_then(|id| id.parse().ok()).expect("bob's reservation"));
    fresh_order(&app, "alice", big).await;
    known.extend(ids(&app, "SELECT id FROM reservations WHERE order_id IS NOT NULL").await);
    let app = std::sync::Arc::new(app);
    let strategy = move || (any::<bool>(), caller(Caller::Alice), target(known), seconds());
    let shared = app.clone();
    for_64_cases(strategy, move |(release, caller, target, seconds)| {
        let app = shared.clone();
        async move {
            let id = match target {
                Target::Fresh => json!(fresh_reservation(&app, big).await),
                Target::Id(id) => id,
            };
            if release {
                mutate(&app, &caller, RELEASE, json!({ "id": id }), "releaseReservation").await.map(drop)
            } else {
                let variables = json!({ "id": id, "seconds": seconds });
                mutate(&app, &caller, EXTEND, variables, "extendReservation").await.map(drop)
            }
        }
    })
    .await;
    assert_still_serving(&app).await;
}

/// An operator's mutation.
#[derive(Debug, Clone)]
pub(super) enum Stocking {
    Create(Value),
    Restock { inventory: Value, quantity: Value, version: Version },
}

#[tokio::test(flavor = "multi_thread")]
async fn create_inventory_and_restock_answer_any_input_without_internal_errors_and_refusals_write_nothing() {
    pub(super) const SKUS: &[&str] = &["FUZZ-BIG", "NEW-1", "NEW-2", "Ünïcødé-SKU", "sku with spaces"];
    pub(super) const NAMES: &[&str] = &["A thing", "Ding 🛒", "名前"];
    let (app, inventories) = server_with_stock().await;
    let app = std::sync::Arc::new(app);
    let known = inventories.clone();
    let strategy = move || {
        let amount = || {
            prop_oneof![
                4 => select(vec![0, 1, 1000, 1_000_000_000]).prop_map(Value::from),
                2 => select(vec![-1, 1_000_000_001, i32::MIN, i32::MAX]).prop_map(Value::from),
                1 => any::<i32>().prop_map(Value::from),
                1 => not_an_int(),
            ]
        };
        let sku = prop_oneof![3 => text(SKUS), 2 => "[A-Z]{2,4}-[0-9]{1,6}".prop_map(Value::from)];
        let create = prop_oneof![
            ("[A-Z]{3}-[0-9]{8}", 0..=1000_i32)
                .prop_map(|(sku, stock)| json!({ "sku": sku, "name": "New", "stock": stock })),
            (sku, text(NAMES), amount())
                .prop_map(|(sku, name, stock)| json!({ "sku": sku, "name": name, "stock": stock })),
        ]
        .prop_map(Stocking::Create);
        let restock = prop_oneof![
            (plenty(&known), (1..=1000_i32).prop_map(Value::from), valid_version()),
            (uuid(known), amount(), version()),
        ]
        .prop_map(|(inventory, quantity, version)| Stocking::Restock { inventory, quantity, version });
        (caller(Caller::Operator), prop_oneof![create, restock])
    };
    let shared = app.clone();
    for_64_cases(strategy, move |(caller, call)| {
        let app = shared.clone();
        async move {
            match call {
                Stocking::Create(input) => {
                    mutate(&app, &caller, CREATE, json!({ "input": input }), "createInventory").await.map(drop)
                }
                Stocking::Restock { inventory, quantity, version } => {
                    let mut input = json!({ "inventoryId": inventory, "quantity": quantity });
                    set(&mut input, "expectedVersion", version.resolve(inventory_version(&app, &inventory)).await);
                    mutate(&app, &caller, RESTOCK, json!({ "input": input }), "restock").await.map(drop)
                }
            }
        }
    })
    .await;
    assert_still_serving(&app).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn confirm_and_cancel_answer_any_id_without_internal_errors_and_refusals_write_nothing() {
    let (app, inventories) = server_with_stock().await;
    let big = inventories[0];
    let mut known = vec![fresh_order(&app, "alice", big).await, fresh_order(&app, "alice", big).await];
    known.push(fresh_order(&app, "bob", big).await);
    let app = std::sync::Arc::new(app);
    let strategy = move || {
        let confirm = (Just(true), caller(Caller::Operator), target(known.clone()));
        let cancel = (Just(false), prop_oneof![caller(Caller::Alice), caller(Caller::Operator)], target(known));
        prop_oneof![confirm, cancel]
    };
    let shared = app.clone();
    for_64_cases(strategy, move |(confirm, caller, target)| {
        let app = shared.clone();
        async move {
            let id = match target {
                Target::Fresh => json!(fresh_order(&app, "alice", big).await),
                Target::Id(id) => id,
            };
            let (query, field) = if confirm { (CONFIRM, "confirmOrder") } else { (CANCEL, "cancelOrder") };
            mutate(&app, &caller, query, json!({ "id": id }), field).await.map(drop)
        }
    })
    .await;
    assert_still_serving(&app).await;
}

/// A cart mutation or a fulfilment, as generated.
#[derive(Debug, Clone)]
pub(super) enum CartStep {
    /// `checkout` of these reservations.
    Checkout { caller: Caller, lines: Vec<Target>, address: Value, key: Option<Value> },
    /// `changeReservationQuantity` of one.
    Resize { caller: Caller, line: Target, quantity: Value },
    /// `fulfillOrder` of an order (a fresh one is confirmed first).
    Fulfil { caller: Caller, order: Target },
}

#[tokio::test(flavor = "multi_thread")]
async fn checkout_quantity_changes_and_fulfilment_answer_any_input_without_internal_errors_and_refusals_write_nothing()
{
    let (app, inventories) = server_with_stock().await;
    let (big, low) = (inventories[0], inventories[1]);
    // Alice's on both inventories, Bob's, and an order line.
    let mut lines = vec![fresh_reservation(&app, big).await, fresh_reservation(&app, low).await];
    let bobs = app.reserve(&app.token("bob", Role::Customer), json!({ "inventoryId": big })).await;
    lines.push(bobs["reservation"]["id"].as_str().and_then(|id| id.parse().ok()).expect("bob's reservation"));
    let order = fresh_order(&app, "alice", big).await;
    lines.extend(ids(&app, "SELECT id FROM reservations WHERE order_id IS NOT NULL").await);
    let confirmed = fresh_order(&app, "alice", big).await;
    app.graphql(Some(&app.operator()), CONFIRM, json!({ "id": confirmed })).await;
    let orders = vec![order, confirmed, fresh_order(&app, "bob", big).await];
    let app = std::sync::Arc::new(app);
    let strategy = move || {
        let many = (101..=105_usize).prop_map(|n| (0..n).map(|_| Target::Id(json!(Uuid::new_v4()))).collect());
        let cart = prop_oneof![4 => vec(target(lines.clone()), 0..=4), 1 => many];
        let key = prop_oneof![fresh_key(), idempotency_key()];
        prop_oneof![
            (caller(Caller::Alice), cart, address(), key)
                .prop_map(|(caller, lines, address, key)| CartStep::Checkout { caller, lines, address, key }),
            (caller(Caller::Alice), target(lines.clone()), quantity())
                .prop_map(|(caller, line, quantity)| CartStep::Resize { caller, line, quantity }),
            (caller(Caller::Operator), target(orders)).prop_map(|(caller, order)| CartStep::Fulfil { caller, order }),
        ]
    };
    let shared = app.clone();
    for_64_cases(strategy, move |step| {
        let app = shared.clone();
        async move {
            let reservation = |target: Target| {
                let app = app.clone();
                async move {
                    match target {
                        Target::Fresh => json!(fresh_reservation(&app, big).await),
                        Target::Id(id) => id,
                    }
                }
            };
            match step {
                CartStep::Checkout { caller, lines, address, key } => {
                    let mut ids = Vec::with_capacity(lines.len());
                    for line in lines {
                        ids.push(reservation(line).await);
                    }
                    let mut input = json!({ "reservationIds": ids, "shippingAddress": address });
                    set(&mut input, "idempotencyKey", key);
                    mutate(&app, &caller, CHECKOUT, json!({ "input": input }), "checkout").await.map(drop)
                }
                CartStep::Resize { caller, line, quantity } => {
                    let input = json!({ "reservationId": reservation(line).await, "quantity": quantity });
                    let variables = json!({ "input": input });
                    mutate(&app, &caller, CHANGE_QUANTITY, variables, "changeReservationQuantity").await.map(drop)
                }
                CartStep::Fulfil { caller, order } => {
                    let id = match order {
                        Target::Fresh => {
                            let id = fresh_order(&app, "alice", big).await;
                            app.graphql(Some(&app.operator()), CONFIRM, json!({ "id": id })).await;
                            json!(id)
                        }
                        Target::Id(id) => id,
                    };
                    mutate(&app, &caller, FULFILL, json!({ "id": id }), "fulfillOrder").await.map(drop)
                }
            }
        }
    })
    .await;
    assert_still_serving(&app).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn change_shipping_address_answers_any_input_without_internal_errors_and_refusals_write_nothing() {
    let (app, inventories) = server_with_stock().await;
    let big = inventories[0];
    let operator = app.operator();
    let pending = fresh_order(&app, "alice", big).await;
    let confirmed = fresh_order(&app, "alice", big).await;
    let cancelled = fresh_order(&app, "alice", big).await;
    app.graphql(Some(&operator), CONFIRM, json!({ "id": confirmed })).await;
    app.graphql(Some(&operator), CANCEL, json!({ "id": cancelled })).await;
    let bobs = fresh_order(&app, "bob", big).await;
    let known = vec![pending, confirmed, cancelled, bobs];
    let app = std::sync::Arc::new(app);
    let strategy = move || (caller(Caller::Alice), target(known), version(), address());
    let shared = app.clone();
    for_64_cases(strategy, move |(caller, target, version, address)| {
        let app = shared.clone();
        async move {
            let id = match target {
                Target::Fresh => json!(fresh_order(&app, "alice", big).await),
                Target::Id(id) => id,
            };
            let mut input = json!({ "orderId": id, "shippingAddress": address });
            // expectedVersion is required: "Omit" sends the current one.
            let version = if matches!(version, Version::Omit) { Version::Current } else { version };
            set(&mut input, "expectedVersion", version.resolve(order_version(&app, &id)).await);
            mutate(&app, &caller, CHANGE_ADDRESS, json!({ "input": input }), "changeShippingAddress").await.map(drop)
        }
    })
    .await;
    assert_still_serving(&app).await;
}

/// One generated line of a return.
#[derive(Debug, Clone)]
pub(super) struct ReturnedLine {
    inventory: Value,
    quantity: Value,
    disposition: Value,
    location: Option<Value>,
}

impl ReturnedLine {
    fn to_json(&self) -> Value {
        let mut line =
            json!({ "inventoryId": self.inventory, "quantity": self.quantity, "disposition": self.disposition });
        set(&mut line, "locationId", self.location.clone());
        line
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn return_order_answers_any_input_without_internal_errors_and_refusals_write_nothing() {
    let (app, inventories) = server_with_stock().await;
    let big = inventories[0];
    let fulfilled = fresh_fulfilled_order(&app, big, 3).await;
    let pending = fresh_order(&app, "alice", big).await;
    let default = crate::locations::default_location(&app).await;
    let other = crate::locations::create_location(&app, "porto", 10).await;
    let orders = vec![fulfilled, pending];
    let app = std::sync::Arc::new(app);
    let strategy = move || {
        let disposition = prop_oneof![
            6 => select(vec!["RESTOCK", "WRITE_OFF"]).prop_map(Value::from),
            1 => select(vec![json!("SHRED"), json!("restock"), json!(1), json!(null)]),
        ];
        let location = prop_oneof![
            4 => Just(None),
            2 => select(vec![default, other]).prop_map(|id| Some(json!(id))),
            1 => uuid(vec![default]).prop_map(Some),
        ];
        let one = (plenty(&inventories), quantity(), disposition, location)
            .prop_map(|(inventory, quantity, disposition, location)| ReturnedLine {
                inventory,
                quantity,
                disposition,
                location,
            })
            .boxed();
        let lines = prop_oneof![
            6 => vec(one.clone(), 1..=2),
            1 => Just(Vec::new()),
            1 => vec(one, 101..=102),
        ];
        let note = prop_oneof![
            4 => Just(None),
            2 => Just(Some(json!("box opened"))),
            1 => Just(Some(json!("n".repeat(501)))),
            1 => hostile_text().prop_map(|note| Some(json!(note))),
        ];
        let key = prop_oneof![fresh_key(), idempotency_key()];
        (caller(Caller::Operator), target(orders), lines, note, key)
    };
    let shared = app.clone();
    for_64_cases(strategy, move |(caller, order, lines, note, key)| {
        let app = shared.clone();
        async move {
            let id = match order {
                Target::Fresh => json!(fresh_fulfilled_order(&app, big, 3).await),
                Target::Id(id) => id,
            };
            let lines: Vec<Value> = lines.iter().map(ReturnedLine::to_json).collect();
            let mut input = json!({ "orderId": id, "lines": lines });
            set(&mut input, "note", note);
            set(&mut input, "idempotencyKey", key);
            mutate(&app, &caller, RETURN_ORDER, json!({ "input": input }), "returnOrder").await.map(drop)
        }
    })
    .await;
    assert_still_serving(&app).await;
}
