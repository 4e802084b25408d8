//! Hostile input, generated. Every mutation's input is fuzzed with proptest
//! and sent as GraphQL variables; malicious documents and random bodies are
//! thrown at the transport. One real server per test, 64 cases each.
//!
//! The properties, for every case:
//! - the HTTP status is 200 (400 or 413 only for a body that is not a GraphQL
//!   request or is over the limit), never 500;
//! - the body is JSON with `data` or `errors`, and every error has an
//!   `extensions.code` that is a client's fault ([`CLIENT_CODES`]), never
//!   `INTERNAL` or `DATABASE_UNAVAILABLE`, and never missing;
//! - a refused request leaves the database exactly as it was;
//! - an answered one (a union member) keeps the docs/design.md invariant.
//!
//! proptest runs synchronously, so each test runs its cases on a blocking
//! thread and drives every case's requests with the runtime's `block_on`.

use std::future::Future;

use proptest::{
    collection::vec,
    prelude::*,
    sample::select,
    test_runner::{Config, TestCaseError, TestRunner},
};
use sea_orm::{ConnectionTrait, DbBackend, Statement};
use serde_json::{Value, json};
use stockguard::{auth::Role, invariant};
use uuid::Uuid;

use crate::{
    helpers::{RESERVE, TestApp, error_code, request},
    hostile::{aliases, deep_value, fragment_fan_out},
};

/// The body limit of `Limits::default()`.
const BODY_LIMIT: usize = 64 * 1024;

/// The codes a client can earn; anything else is the server's fault.
const CLIENT_CODES: [&str; 9] = [
    "BAD_USER_INPUT",
    "IDEMPOTENCY_KEY_REUSED",
    "UNAUTHENTICATED",
    "FORBIDDEN",
    "GRAPHQL_PARSE_FAILED",
    "GRAPHQL_VALIDATION_FAILED",
    "OPERATION_RESOLUTION_FAILURE",
    "MAX_DEPTH_LIMIT",
    "COST_ESTIMATED_TOO_EXPENSIVE",
];

// ---------------------------------------------------------------------------
// Running properties against one server

/// Runs `case` on 64 values of the strategy `make` builds, on a blocking
/// thread so that each case can drive its requests with `block_on`. Fails
/// the test with proptest's (shrunk) counterexample.
async fn for_64_cases<S, F, Fut>(make: impl FnOnce() -> S + Send + 'static, case: F)
where
    S: Strategy,
    F: Fn(S::Value) -> Fut + Send + 'static,
    Fut: Future<Output = Result<(), TestCaseError>>,
{
    let runtime = tokio::runtime::Handle::current();
    let result = tokio::task::spawn_blocking(move || {
        // Each shrinking step is a real request too, so shrink a little only.
        let config = Config { cases: 64, max_shrink_iters: 32, failure_persistence: None, ..Config::default() };
        TestRunner::new(config).run(&make(), |value| runtime.block_on(case(value))).map_err(|err| err.to_string())
    })
    .await
    .expect("the property runner");
    if let Err(failure) = result {
        panic!("{failure}");
    }
}

/// What the database holds that a refused request must not touch: the
/// helpers' snapshot plus every reservation's and order's mutable columns.
async fn state(app: &TestApp) -> String {
    let sql = "SELECT \
        (SELECT md5(coalesce(string_agg(concat_ws(':', id, status, quantity, expires_at, order_id, idempotency_key), \
                                        ',' ORDER BY id), '')) FROM reservations) || '|' || \
        (SELECT md5(coalesce(string_agg(concat_ws(':', id, status, version, ship_name, ship_line1, ship_line2, \
                                                  ship_city, ship_postal_code, ship_country, confirmed_by, \
                                                  fulfilled_by), \
                                        ',' ORDER BY id), '')) FROM orders)";
    let row =
        app.db.query_one_raw(Statement::from_string(DbBackend::Postgres, sql)).await.expect("query").expect("row");
    let rows: String = row.try_get_by_index(0).expect("hashes");
    format!("{}|{rows}", app.snapshot().await)
}

/// One integer column of the row with `id`, if there is one.
async fn scalar(app: &TestApp, sql: &str, id: Uuid) -> Option<i32> {
    let row = app
        .db
        .query_one_raw(Statement::from_sql_and_values(DbBackend::Postgres, sql, [id.into()]))
        .await
        .expect("query")?;
    Some(row.try_get_by_index(0).expect("integer"))
}

/// An HTTP answer: status, body (JSON, or the text as a JSON string), and
/// how many bytes were sent.
#[derive(Debug)]
struct Reply {
    status: u16,
    body: Value,
    sent: usize,
}

/// POSTs `body` to /graphql with `authorization` as the header, if any.
async fn post(app: &TestApp, authorization: Option<&str>, body: Vec<u8>) -> Reply {
    let sent = body.len();
    let reply = app.post(authorization, body).await.expect("the server answers");
    assert!(reply.cut_short.is_none(), "a body: {:?}", reply.cut_short);
    let text = String::from_utf8_lossy(&reply.body).into_owned();
    let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
    Reply { status: reply.status, body, sent }
}

/// The transport's part of the contract: never 500, 413 exactly for bodies
/// over the limit, 400 only for bodies that are not GraphQL requests (pass
/// `may_be_400` for those), otherwise 200 with `data` or `errors` whose codes
/// are all the client's fault. Returns whether the reply carries errors (or
/// is not a 200 at all: then nothing ran).
fn check_transport(reply: &Reply, may_be_400: bool) -> Result<bool, TestCaseError> {
    prop_assert_ne!(reply.status, 500, "a 500: {}", reply.body);
    if reply.sent > BODY_LIMIT {
        prop_assert_eq!(reply.status, 413, "{} bytes: {}", reply.sent, reply.body);
        return Ok(true);
    }
    if reply.status == 400 && may_be_400 {
        prop_assert_eq!(&reply.body["errors"][0]["extensions"]["code"], "BAD_REQUEST", "{}", reply.body);
        return Ok(true);
    }
    prop_assert_eq!(reply.status, 200, "{}", reply.body);
    prop_assert!(
        reply.body.get("data").is_some() || reply.body.get("errors").is_some(),
        "neither data nor errors: {}",
        reply.body
    );
    let errors = reply.body.get("errors").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
    for error in errors {
        prop_assert!(error["message"].is_string(), "an error without a message: {}", reply.body);
        let code = &error["extensions"]["code"];
        prop_assert!(
            code.as_str().is_some_and(|code| CLIENT_CODES.contains(&code)),
            "code {} is not the client's fault: {}",
            code,
            reply.body
        );
    }
    Ok(!errors.is_empty())
}

/// Sends one mutation as `caller` and checks every property: the transport,
/// no data beside errors, nothing written when refused, the invariant when
/// answered. Returns `data.<field>` when answered.
async fn mutate(
    app: &TestApp,
    caller: &Caller,
    query: &str,
    variables: Value,
    field: &str,
) -> Result<Option<Value>, TestCaseError> {
    let before = state(app).await;
    let reply = post(app, caller.header(app).as_deref(), request(query, variables)).await;
    let refused = check_transport(&reply, false)?;
    let data = &reply.body["data"][field];
    if refused {
        prop_assert!(data.is_null(), "data beside errors: {}", reply.body);
        prop_assert_eq!(state(app).await, before, "refused input wrote: {}", reply.body);
        return Ok(None);
    }
    prop_assert!(data.get("__typename").is_some_and(Value::is_string), "no result: {}", reply.body);
    let drifts = invariant::check(&app.db).await.expect("invariant check");
    prop_assert!(drifts.is_empty(), "invariant broken after {}: {:?}", reply.body, drifts);
    Ok(Some(data.clone()))
}

/// Sends a body that may be anything and checks the transport; whatever was
/// refused wrote nothing, whatever ran kept the invariant.
async fn send_anything(app: &TestApp, authorization: Option<&str>, body: Vec<u8>) -> Result<Reply, TestCaseError> {
    let before = state(app).await;
    let reply = post(app, authorization, body).await;
    if check_transport(&reply, true)? {
        // Errors beside data happen only to queries, which write nothing anyway.
        prop_assert_eq!(state(app).await, before, "a refused body wrote: {}", reply.body);
    } else {
        let drifts = invariant::check(&app.db).await.expect("invariant check");
        prop_assert!(drifts.is_empty(), "invariant broken after {}: {:?}", reply.body, drifts);
    }
    Ok(reply)
}

/// After everything, the server still answers a plain query.
async fn assert_still_serving(app: &TestApp) {
    let body = app.graphql(None, "{ inventories(first: 5) { nodes { id sku } } }", json!({})).await;
    assert!(body.get("errors").is_none(), "{body}");
    assert!(body["data"]["inventories"]["nodes"].is_array(), "{body}");
    app.assert_invariant().await;
}

// ---------------------------------------------------------------------------
// Who calls

/// The caller of a generated request.
#[derive(Debug, Clone)]
enum Caller {
    /// The customer the fixtures belong to.
    Alice,
    /// Another customer.
    Bob,
    Operator,
    Anonymous,
    /// An `Authorization` header that is not a valid token.
    Garbage(&'static str),
}

impl Caller {
    fn header(&self, app: &TestApp) -> Option<String> {
        let bearer = |token: String| Some(format!("Bearer {token}"));
        match self {
            Self::Alice => bearer(app.token("alice", Role::Customer)),
            Self::Bob => bearer(app.token("bob", Role::Customer)),
            Self::Operator => bearer(app.operator()),
            Self::Anonymous => None,
            Self::Garbage(value) => Some((*value).to_owned()),
        }
    }
}

const GARBAGE_HEADERS: [&str; 5] =
    ["Bearer not-a-token", "Bearer ", "Bearer a.b.c", "Basic YWxpY2U6c2VjcmV0", "bearer eyJhbGciOiJIUzI1NiJ9.e30.x"];

/// Mostly `main`, sometimes anyone else.
fn caller(main: Caller) -> impl Strategy<Value = Caller> {
    let other = if matches!(main, Caller::Operator) { Caller::Alice } else { Caller::Operator };
    prop_oneof![
        8 => Just(main),
        1 => prop_oneof![Just(other), Just(Caller::Bob)],
        1 => Just(Caller::Anonymous),
        1 => select(GARBAGE_HEADERS.to_vec()).prop_map(Caller::Garbage),
    ]
}

// ---------------------------------------------------------------------------
// Values

/// Things that are not a 32-bit integer: GraphQL refuses them as variables.
fn not_an_int() -> impl Strategy<Value = Value> {
    select(vec![
        json!(2_147_483_648_i64),
        json!(-2_147_483_649_i64),
        json!(9_007_199_254_740_993_i64),
        json!(1.5),
        json!(1e300),
        json!("1"),
        json!(null),
        json!(true),
        json!([1]),
        json!({ "n": 1 }),
    ])
}

/// An `Int` for a quantity: mostly valid, often at or past the edges.
fn quantity() -> impl Strategy<Value = Value> {
    prop_oneof![
        6 => (1..=5_i32).prop_map(Value::from),
        1 => Just(json!(1000)),
        2 => select(vec![0, -1, 1001, i32::MIN, i32::MAX]).prop_map(Value::from),
        1 => any::<i32>().prop_map(Value::from),
        1 => not_an_int(),
    ]
}

/// Strings a client should never get away with, or that must be stored
/// exactly: empty, blank, 10 KiB, Unicode of every kind, NUL, SQL, random.
fn hostile_text() -> impl Strategy<Value = String> {
    prop_oneof![
        select(vec![
            String::new(),
            " \t\n ".to_owned(),
            "x".repeat(10 * 1024),
            "🛒".repeat(300),
            "\u{0}".to_owned(),
            "a\u{0}b".to_owned(),
            "📦🔥🛒".to_owned(),
            "\u{202E}kcatta\u{202C}".to_owned(),
            "שלום עולם".to_owned(),
            "e\u{301}\u{301}\u{301}\u{301}".to_owned(),
            "\u{200B}\u{FEFF}".to_owned(),
            "'; DROP TABLE inventories; --".to_owned(),
            "' OR '1'='1".to_owned(),
            "\\\\".to_owned(),
            "%_%".to_owned(),
            "$1".to_owned(),
            "\"}]}".to_owned(),
        ]),
        vec(any::<char>(), 0..40).prop_map(String::from_iter),
        "[a-z]{1,8}".prop_map(|word| word.repeat(40)),
    ]
}

/// A string field: one of `valid`, or hostile text, or not a string at all.
fn text(valid: &'static [&'static str]) -> impl Strategy<Value = Value> {
    prop_oneof![
        4 => select(valid).prop_map(Value::from),
        2 => hostile_text().prop_map(Value::from),
        1 => select(vec![json!(42), json!(null), json!(["a"]), json!({ "a": 1 })]),
    ]
}

/// An inventory a well-behaved client names: mostly the first of `known`
/// (which has plenty of stock), sometimes another.
fn plenty(known: &[Uuid]) -> impl Strategy<Value = Value> + use<> {
    prop_oneof![4 => Just(known[0]), 1 => select(known.to_vec())].prop_map(|id| json!(id))
}

/// A `UUID`: mostly one of `known`, else random, nil, or malformed.
fn uuid(known: Vec<Uuid>) -> impl Strategy<Value = Value> {
    let spelled = known.clone();
    prop_oneof![
        6 => select(known).prop_map(|id| json!(id)),
        1 => any::<u128>().prop_map(|n| json!(Uuid::from_u128(n))),
        1 => Just(json!(Uuid::nil())),
        // Other spellings of a real id: the UUID scalar accepts some of them.
        1 => (select(spelled), 0..5_usize).prop_map(|(id, how)| {
            let id = id.to_string();
            json!(match how {
                0 => id.to_uppercase(),
                1 => format!("{{{id}}}"),
                2 => format!("{id}x"),
                3 => id[..35].to_owned(),
                _ => id.replace('-', ""),
            })
        }),
        1 => prop_oneof![
            select(vec!["", "not-a-uuid", "00000000-0000-0000-0000-00000000000g", "'; DROP TABLE inventories; --"])
                .prop_map(Value::from),
            hostile_text().prop_map(Value::from),
            select(vec![json!(42), json!(null), json!([])]),
        ],
    ]
}

/// The version a request expects, resolved against the database when sent.
#[derive(Debug, Clone)]
enum Version {
    Omit,
    Current,
    Stale,
    Literal(Value),
}

/// A version a well-behaved client sends: none, or the one it just read.
fn valid_version() -> impl Strategy<Value = Version> {
    prop_oneof![Just(Version::Omit), Just(Version::Current)]
}

fn version() -> impl Strategy<Value = Version> {
    prop_oneof![
        4 => Just(Version::Omit),
        3 => Just(Version::Current),
        1 => Just(Version::Stale),
        1 => select(vec![0, -1, i32::MAX, i32::MIN]).prop_map(|v| Version::Literal(json!(v))),
        1 => any::<i32>().prop_map(|v| Version::Literal(json!(v))),
        1 => not_an_int().prop_map(Version::Literal),
    ]
}

impl Version {
    /// The value to send (none: leave the field out); `current` reads the
    /// row's version when the target is a real row.
    async fn resolve(&self, current: impl Future<Output = Option<i32>>) -> Option<Value> {
        match self {
            Self::Omit => None,
            Self::Current => Some(json!(current.await.unwrap_or(1))),
            Self::Stale => Some(json!(current.await.unwrap_or(1) - 1)),
            Self::Literal(value) => Some(value.clone()),
        }
    }
}

async fn inventory_version(app: &TestApp, id: &Value) -> Option<i32> {
    let id = id.as_str()?.parse().ok()?;
    scalar(app, "SELECT version FROM inventories WHERE id = $1", id).await
}

async fn order_version(app: &TestApp, id: &Value) -> Option<i32> {
    let id = id.as_str()?.parse().ok()?;
    scalar(app, "SELECT version FROM orders WHERE id = $1", id).await
}

/// An idempotency key: mostly none, often one of a few (so replays and
/// reuses happen), sometimes hostile.
fn idempotency_key() -> impl Strategy<Value = Option<Value>> {
    prop_oneof![
        4 => Just(None),
        3 => select(vec!["k1", "k2", "k3"]).prop_map(|key| Some(json!(key))),
        1 => Just(Some(json!("k".repeat(129)))),
        1 => hostile_text().prop_map(|key| Some(json!(key))),
    ]
}

/// A well-behaved client's key: none, or a new one.
fn fresh_key() -> impl Strategy<Value = Option<Value>> {
    prop::option::weighted(0.3, "[a-z0-9]{12}".prop_map(Value::from))
}

/// Sets `field` on `object` unless the value is to be left out.
fn set(object: &mut Value, field: &str, value: Option<Value>) {
    if let Some(value) = value {
        object[field] = value;
    }
}

fn valid_address() -> Value {
    json!({ "name": "Alice Example", "line1": "1 Main St", "line2": "Apt 4", "city": "Osaka",
            "postalCode": "530-0001", "country": "JP" })
}

const ADDRESS_FIELDS: [&str; 6] = ["name", "line1", "line2", "city", "postalCode", "country"];

/// A shipping address: valid, or valid but for one field, or all fuzzed.
fn address() -> impl Strategy<Value = Value> {
    const NAMES: &[&str] = &["Alice", "Zoë Ångström", "山田太郎"];
    const LINES: &[&str] = &["1 Main St", "221B Baker Street"];
    const CITIES: &[&str] = &["Osaka", "Köln"];
    const CODES: &[&str] = &["530-0001", "50667"];
    const COUNTRIES: &[&str] = &["JP", "DE"];
    prop_oneof![
        3 => Just(valid_address()),
        3 => (select(ADDRESS_FIELDS.to_vec()), text(NAMES)).prop_map(|(field, value)| {
            let mut address = valid_address();
            address[field] = value;
            address
        }),
        1 => (text(NAMES), text(LINES), text(LINES), text(CITIES), text(CODES), text(COUNTRIES)).prop_map(
            |(name, line1, line2, city, postal_code, country)| {
                json!({ "name": name, "line1": line1, "line2": line2, "city": city,
                        "postalCode": postal_code, "country": country })
            }
        ),
    ]
}

/// One line of `reserveMany` / `placeOrder`.
#[derive(Debug, Clone)]
struct Item {
    inventory: Value,
    quantity: Option<Value>,
    version: Version,
}

impl Item {
    async fn to_json(&self, app: &TestApp) -> Value {
        let mut item = json!({ "inventoryId": self.inventory });
        set(&mut item, "quantity", self.quantity.clone());
        set(&mut item, "expectedVersion", self.version.resolve(inventory_version(app, &self.inventory)).await);
        item
    }
}

fn item(known: Vec<Uuid>) -> impl Strategy<Value = Item> {
    (uuid(known), prop::option::weighted(0.8, quantity()), version()).prop_map(|(inventory, quantity, version)| Item {
        inventory,
        quantity,
        version,
    })
}

/// Lines: a few, none, one inventory many times, or more than 100 inventories.
fn items(known: Vec<Uuid>) -> impl Strategy<Value = Vec<Item>> {
    let one = Item { inventory: json!(Uuid::nil()), quantity: None, version: Version::Omit };
    let valid = (plenty(&known), 1..=3_i32, valid_version()).prop_map(|(inventory, quantity, version)| Item {
        inventory,
        quantity: Some(json!(quantity)),
        version,
    });
    prop_oneof![
        4 => vec(valid, 1..=3),
        4 => vec(item(known.clone()), 1..=4),
        1 => Just(vec![]),
        1 => (item(known), 2..=30_usize).prop_map(|(item, n)| vec![item; n]),
        1 => (101..=120_usize, any::<u64>()).prop_map(move |(n, seed)| {
            (0..n)
                .map(|i| Item {
                    inventory: json!(Uuid::from_u128((u128::from(seed) << 64) | i as u128)),
                    ..one.clone()
                })
                .collect()
        }),
    ]
}

/// Seconds for `extendReservation`.
fn seconds() -> impl Strategy<Value = Value> {
    prop_oneof![
        6 => select(vec![1, 60, 3600]).prop_map(Value::from),
        2 => select(vec![0, -1, 3601, i32::MIN, i32::MAX]).prop_map(Value::from),
        2 => any::<i32>().prop_map(Value::from),
        1 => not_an_int(),
    ]
}

/// What a release, extend, confirm or cancel names.
#[derive(Debug, Clone)]
enum Target {
    /// A reservation or order made for Alice just before the request.
    Fresh,
    Id(Value),
}

fn target(known: Vec<Uuid>) -> impl Strategy<Value = Target> {
    prop_oneof![2 => Just(Target::Fresh), 5 => uuid(known).prop_map(Target::Id)]
}

// ---------------------------------------------------------------------------
// Fixtures

const RESERVE_MANY: &str = r#"
mutation($input: ReserveManyInput!) {
  reserveMany(input: $input) {
    __typename
    ... on ReservedAll { reservations { id quantity status inventory { id stock version } } }
    ... on ItemsUnavailable { items { inventoryId reason inventory { id stock version } } }
  }
}"#;

const PLACE_ORDER: &str = r#"
mutation($input: PlaceOrderInput!) {
  placeOrder(input: $input) {
    __typename
    ... on OrderPlaced { order { id status version items { quantity inventory { id stock } }
                                 shippingAddress { name line1 line2 city postalCode country } } }
    ... on ItemsUnavailable { items { inventoryId reason inventory { id stock version } } }
  }
}"#;

const RELEASE: &str = r#"
mutation($id: UUID!) {
  releaseReservation(id: $id) {
    __typename
    ... on ReservationReleased { reservation { id status } inventory { id stock version } }
    ... on ReservationNotFound { reservationId }
    ... on ReservationNotActive { reservation { id status } }
  }
}"#;

const EXTEND: &str = r#"
mutation($id: UUID!, $seconds: Int!) {
  extendReservation(id: $id, seconds: $seconds) {
    __typename
    ... on ReservationExtended { reservation { id status expiresAt } }
    ... on ReservationNotFound { reservationId }
    ... on ReservationNotActive { reservation { id status } }
  }
}"#;

const CREATE: &str = r#"
mutation($input: CreateInventoryInput!) {
  createInventory(input: $input) { __typename id sku name stock version }
}"#;

const RESTOCK: &str = r#"
mutation($input: RestockInput!) {
  restock(input: $input) {
    __typename
    ... on Restocked { inventory { id stock version } }
    ... on Conflict { expectedVersion inventory { id stock version } }
    ... on InventoryNotFound { inventoryId }
  }
}"#;

const CONFIRM: &str = r#"
mutation($id: UUID!) {
  confirmOrder(id: $id) {
    __typename
    ... on OrderConfirmed { order { id status confirmedAt confirmedBy version } }
    ... on OrderCannotBeConfirmed { order { id status } }
    ... on OrderNotFound { orderId }
    ... on OrderModifiedConcurrently { orderId attempts }
  }
}"#;

const CANCEL: &str = r#"
mutation($id: UUID!) {
  cancelOrder(id: $id) {
    __typename
    ... on OrderCancelled { order { id status version items { quantity } } }
    ... on OrderCannotBeCancelled { order { id status } }
    ... on OrderNotFound { orderId }
    ... on OrderModifiedConcurrently { orderId attempts }
  }
}"#;

const CHANGE_ADDRESS: &str = r#"
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

const CHECKOUT: &str = r#"
mutation($input: CheckoutInput!) {
  checkout(input: $input) {
    __typename
    ... on OrderPlaced { order { id status version items { quantity inventory { id stock reserved committed } } } }
    ... on ReservationsUnavailable { reservations { reservationId reason reservation { id status quantity } } }
  }
}"#;

const CHANGE_QUANTITY: &str = r#"
mutation($input: ChangeReservationQuantityInput!) {
  changeReservationQuantity(input: $input) {
    __typename
    ... on ReservationChanged { reservation { id quantity } inventory { id stock version available onHand } }
    ... on SoldOut { requested inventory { id stock version } }
    ... on ReservationNotActive { reservation { id status } }
    ... on ReservationNotFound { reservationId }
  }
}"#;

const FULFILL: &str = r#"
mutation($id: UUID!) {
  fulfillOrder(id: $id) {
    __typename
    ... on OrderFulfilled { order { id status fulfilledAt fulfilledBy version } }
    ... on OrderCannotBeFulfilled { order { id status } }
    ... on OrderNotFound { orderId }
    ... on OrderModifiedConcurrently { orderId attempts }
  }
}"#;

/// A server with a big inventory, a nearly sold-out one, and their ids (the
/// big one first).
async fn server_with_stock() -> (TestApp, Vec<Uuid>) {
    let app = TestApp::spawn().await;
    let big = app.create_inventory("FUZZ-BIG", 1_000_000_000).await;
    let low = app.create_inventory("FUZZ-LOW", 3).await;
    (app, vec![big, low])
}

/// A fresh ACTIVE reservation of Alice's.
async fn fresh_reservation(app: &TestApp, inventory: Uuid) -> Uuid {
    let token = app.token("alice", Role::Customer);
    let reserved = app.reserve(&token, json!({ "inventoryId": inventory })).await;
    reserved["reservation"]["id"].as_str().and_then(|id| id.parse().ok()).unwrap_or_else(|| panic!("{reserved}"))
}

/// A fresh PENDING order of `user`'s, of one unit.
async fn fresh_order(app: &TestApp, user: &str, inventory: Uuid) -> Uuid {
    let input = json!({ "items": [{ "inventoryId": inventory }], "shippingAddress": valid_address() });
    let body = app.graphql(Some(&app.token(user, Role::Customer)), PLACE_ORDER, json!({ "input": input })).await;
    body["data"]["placeOrder"]["order"]["id"]
        .as_str()
        .and_then(|id| id.parse().ok())
        .unwrap_or_else(|| panic!("{body}"))
}

async fn ids(app: &TestApp, sql: &str) -> Vec<Uuid> {
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
enum Stocking {
    Create(Value),
    Restock { inventory: Value, quantity: Value, version: Version },
}

#[tokio::test(flavor = "multi_thread")]
async fn create_inventory_and_restock_answer_any_input_without_internal_errors_and_refusals_write_nothing() {
    const SKUS: &[&str] = &["FUZZ-BIG", "NEW-1", "NEW-2", "Ünïcødé-SKU", "sku with spaces"];
    const NAMES: &[&str] = &["A thing", "Ding 🛒", "名前"];
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
enum CartStep {
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

// ---------------------------------------------------------------------------
// Queries and tokens

/// Every query with an argument, each taking what it declares of the
/// generated variables `sku`, `first`, `after`, `status` and `id`.
const QUERIES: [&str; 6] = [
    "query($sku: String!) { inventoryBySku(sku: $sku) { id sku } }",
    "query($first: Int, $after: String) {
       inventories(first: $first, after: $after) { nodes { id } pageInfo { endCursor hasNextPage } } }",
    "query($first: Int, $after: String) { myReservations(first: $first, after: $after) { nodes { id status } } }",
    "query($first: Int, $after: String, $status: OrderStatus) {
       orders(first: $first, after: $after, status: $status) { nodes { id status } } }",
    "query($id: UUID!) { inventory(id: $id) { id } reservation(id: $id) { id } order(id: $id) { id } }",
    "query($id: UUID!, $first: Int, $after: String) {
       inventory(id: $id) { movements(first: $first, after: $after) { nodes { delta reason } } } }",
];

/// A cursor: a real one, a forged keyset or version cursor, or anything.
fn cursor(real: Vec<String>) -> impl Strategy<Value = Value> {
    prop_oneof![
        2 => select(real).prop_map(Value::from),
        2 => (any::<i64>(), any::<u128>()).prop_map(|(micros, id)| json!(format!("{micros}_{}", Uuid::from_u128(id)))),
        1 => select(vec![i64::MIN, i64::MAX, -210_866_803_200_000_001, -210_866_803_200_000_000, 0])
            .prop_map(|micros| json!(format!("{micros}_{}", Uuid::nil()))),
        1 => any::<i32>().prop_map(|v| json!(format!("v{v}"))),
        2 => hostile_text().prop_map(Value::from),
        1 => Just(json!(null)),
    ]
}

#[tokio::test(flavor = "multi_thread")]
async fn queries_answer_any_argument_without_internal_errors_and_write_nothing() {
    let (app, inventories) = server_with_stock().await;
    let big = inventories[0];
    let mut known = inventories.clone();
    known.push(fresh_reservation(&app, big).await);
    known.push(fresh_order(&app, "alice", big).await);
    let page = app.graphql(None, "{ inventories(first: 1) { pageInfo { endCursor } } }", json!({})).await;
    let mut real = vec![page["data"]["inventories"]["pageInfo"]["endCursor"].as_str().expect("a cursor").to_owned()];
    real.push("v1".to_owned());
    let app = std::sync::Arc::new(app);
    let strategy = move || {
        let first = prop_oneof![
            3 => (1..=100_i32).prop_map(Value::from),
            2 => select(vec![0, -1, 101, i32::MIN, i32::MAX]).prop_map(Value::from),
            1 => not_an_int(),
        ];
        let status = prop_oneof![
            select(vec!["PENDING", "CONFIRMED", "CANCELLED", "BOGUS", ""]).prop_map(Value::from),
            not_an_int()
        ];
        let variables = (text(&["FUZZ-BIG", "FUZZ-LOW", "nope"]), first, cursor(real), status, uuid(known)).prop_map(
            |(sku, first, after, status, id)| {
                json!({ "sku": sku, "first": first, "after": after, "status": status, "id": id })
            },
        );
        (select(QUERIES.to_vec()), caller(Caller::Alice), variables)
    };
    let shared = app.clone();
    for_64_cases(strategy, move |(query, caller, mut variables)| {
        let app = shared.clone();
        async move {
            // Only the variables the query declares: the others would be ignored anyway.
            if let Some(map) = variables.as_object_mut() {
                map.retain(|name, _| query.contains(&format!("${name}")));
            }
            let authorization = if query.contains("movements") { Caller::Operator } else { caller }.header(&app);
            send_anything(&app, authorization.as_deref(), request(query, variables)).await.map(drop)
        }
    })
    .await;
    assert_still_serving(&app).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_signed_token_with_any_subject_is_a_user_or_unauthenticated_never_an_internal_error() {
    let (app, inventories) = server_with_stock().await;
    let big = inventories[0];
    let app = std::sync::Arc::new(app);
    let strategy = || (hostile_text(), any::<bool>(), any::<bool>());
    let shared = app.clone();
    for_64_cases(strategy, move |(sub, operator, write)| {
        let app = shared.clone();
        async move {
            let token = app.token(&sub, if operator { Role::Operator } else { Role::Customer });
            let authorization = Some(format!("Bearer {token}"));
            let body = if write {
                request(RESERVE, json!({ "input": { "inventoryId": big } }))
            } else {
                request("{ myReservations { nodes { id userId } } orders { nodes { id } } }", json!({}))
            };
            let reply = send_anything(&app, authorization.as_deref(), body).await?;
            prop_assert_ne!(reply.status, 400, "{}", reply.body);
            Ok(())
        }
    })
    .await;
    assert_still_serving(&app).await;
}

/// What these properties found once, pinned: each used to be `INTERNAL`.
#[tokio::test(flavor = "multi_thread")]
async fn what_the_fuzzing_found_is_the_client_s_fault_not_an_internal_error() {
    let app = TestApp::spawn().await;
    let alice = app.token("alice", Role::Customer);
    let before = state(&app).await;
    // A SKU holding a NUL names no inventory (PostgreSQL text cannot hold one).
    let by_sku = "query($sku: String!) { inventoryBySku(sku: $sku) { id } }";
    let body = app.graphql(None, by_sku, json!({ "sku": "a\u{0}b" })).await;
    assert!(body.get("errors").is_none() && body["data"]["inventoryBySku"].is_null(), "{body}");
    // A keyset cursor before PostgreSQL's earliest timestamp is no cursor.
    let after = json!({ "after": format!("-210866803200000001_{}", Uuid::nil()) });
    for connection in ["inventories", "myReservations", "orders"] {
        let query = format!("query($after: String) {{ {connection}(after: $after) {{ nodes {{ id }} }} }}");
        let body = app.graphql(Some(&alice), &query, after.clone()).await;
        assert_eq!(error_code(&body), Some("BAD_USER_INPUT"), "{connection}: {body}");
        assert_eq!(body["errors"][0]["extensions"]["field"], "after", "{body}");
    }
    // A signed token whose subject holds a NUL is no user.
    let body = app.reserve(&app.token("a\u{0}b", Role::Customer), json!({ "inventoryId": Uuid::nil() })).await;
    assert_eq!(error_code(&body), Some("UNAUTHENTICATED"), "{body}");
    assert_eq!(state(&app).await, before);
}

// ---------------------------------------------------------------------------
// Malicious documents and bodies

/// A selection `depth` fields deep through the introspection cycle
/// `__Type.fields.type`, starting at `__type`.
fn introspection_at_depth(depth: usize) -> String {
    let mut selection = String::from("name");
    for level in (2..depth).rev() {
        let field = if level % 2 == 0 { "fields" } else { "type" };
        selection = format!("{field} {{ {selection} }}");
    }
    format!(r#"__type(name: "Query") {{ {selection} }}"#)
}

/// `reserve { ... on Reserved { reservation { inventory { reservation { ...`,
/// `depth` fields deep: past the depth limit and through fields Inventory lacks.
fn nested_reserve(depth: usize) -> String {
    let mut selection = String::from("id");
    for level in (2..depth).rev() {
        let field = if level % 2 == 0 { "reservation" } else { "inventory" };
        selection = format!("{field} {{ {selection} }}");
    }
    format!("mutation($input: ReserveInput!) {{ reserve(input: $input) {{ ... on Reserved {{ {selection} }} }} }}")
}

/// `reserve` under `depth` nested inline fragments.
fn fragments_in_fragments(depth: usize) -> String {
    let mut selection = String::from("__typename");
    for _ in 0..depth {
        selection = format!("... on Reserved {{ {selection} }}");
    }
    format!("mutation($input: ReserveInput!) {{ reserve(input: $input) {{ {selection} }} }}")
}

/// A document that must be refused whole, and why.
#[derive(Clone)]
struct Hostile {
    what: &'static str,
    query: String,
    /// Words of which the first error message must hold one (none: any refusal).
    says: &'static [&'static str],
}

/// Shown by what it is, not by its (long) text.
impl std::fmt::Debug for Hostile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let start: String = self.query.chars().take(160).collect();
        write!(f, "{} ({} bytes: {start}...)", self.what, self.query.len())
    }
}

/// Documents refused by validation, whatever their depth or size.
const INVALID_DOCUMENTS: [(&str, &str); 10] = [
    ("a fragment cycle", "{ ...A } fragment A on Query { ...B } fragment B on Query { ...A }"),
    ("a fragment that spreads itself", "{ ...A } fragment A on Query { __typename ...A }"),
    (
        "a fragment cycle around reserve",
        "mutation($input: ReserveInput!) { ...A } \
         fragment A on Mutation { reserve(input: $input) { __typename } ...B } fragment B on Mutation { ...A }",
    ),
    ("an unknown root field", "{ nope }"),
    ("an unknown field of a result", "mutation($input: ReserveInput!) { reserve(input: $input) { nope } }"),
    (
        "an unknown argument",
        r#"mutation($input: ReserveInput!) { reserve(input: $input, userId: "mallory") { __typename } }"#,
    ),
    ("an undeclared variable", "mutation { reserve(input: $nope) { __typename } }"),
    ("an undefined fragment", "mutation($input: ReserveInput!) { reserve(input: $input) { ...Nope } }"),
    (
        "a reserve beside a subscription, no operation named",
        r#"subscription { inventoryChanged(id: "00000000-0000-0000-0000-000000000000") { id } }
           mutation($input: ReserveInput!) { reserve(input: $input) { __typename } }"#,
    ),
    ("a syntax error after a reserve", "mutation($input: ReserveInput!) { reserve(input: $input) { __typename } } }"),
];

const TOO_DEEP: &[&str] = &["deep", "recursion"];

fn beside_a_normal_field(depth: usize) -> String {
    format!("{{ inventories {{ nodes {{ id }} }} {} }}", introspection_at_depth(depth))
}

fn introspection_alone(depth: usize) -> String {
    format!("{{ {} }}", introspection_at_depth(depth))
}

fn hostile_document() -> impl Strategy<Value = Hostile> {
    let deep = |what, says, query: fn(usize) -> String, depths: std::ops::RangeInclusive<usize>| {
        depths.prop_map(move |depth| Hostile { what, query: query(depth), says })
    };
    let complex = |what, query| Just(Hostile { what, query, says: &["complex", "tokens"] });
    prop_oneof![
        deep("introspection beside a normal field", TOO_DEEP, beside_a_normal_field, 13..=100),
        deep("introspection alone past its own bound", TOO_DEEP, introspection_alone, 21..=100),
        deep("reserve nested past the depth limit", &[], nested_reserve, 13..=100),
        deep("fragments nested past the recursion limit", &["recursion", "brackets"], fragments_in_fragments, 33..=100),
        complex("1000 aliases of a page of 100", aliases("query", "inventories(first: 100) { nodes { id } }", 1000)),
        complex(
            "1000 aliased reserves",
            aliases("mutation($input: ReserveInput!)", "reserve(input:$input){...on Reserved{reservation{id}}}", 1000)
        ),
        select(INVALID_DOCUMENTS.to_vec()).prop_map(|(what, query)| Hostile {
            what,
            query: query.to_owned(),
            says: &[]
        }),
    ]
}

#[tokio::test(flavor = "multi_thread")]
async fn malicious_documents_are_refused_whole_and_write_nothing() {
    let (app, inventories) = server_with_stock().await;
    let big = inventories[0];
    let app = std::sync::Arc::new(app);
    let shared = app.clone();
    for_64_cases(hostile_document, move |hostile| {
        let app = shared.clone();
        async move {
            let variables = json!({ "input": { "inventoryId": big } });
            let alice = Caller::Alice.header(&app);
            let body = request(&hostile.query, variables);
            prop_assert!(body.len() <= BODY_LIMIT, "{} must fit the body limit", hostile.what);
            let reply = send_anything(&app, alice.as_deref(), body).await?;
            prop_assert_eq!(reply.status, 200, "{}: {}", hostile.what, reply.body);
            let message = reply.body["errors"][0]["message"].as_str().unwrap_or_default().to_lowercase();
            prop_assert!(!message.is_empty(), "{} must be refused: {}", hostile.what, reply.body);
            prop_assert!(
                hostile.says.is_empty() || hostile.says.iter().any(|word| message.contains(word)),
                "{}: {}",
                hostile.what,
                reply.body
            );
            prop_assert!(reply.body["data"].is_null(), "{} ran: {}", hostile.what, reply.body);
            Ok(())
        }
    })
    .await;

    // Introspection alone is answered up to its own bound.
    let body = app.graphql(None, &format!("{{ {} }}", introspection_at_depth(20)), json!({})).await;
    assert!(body.get("errors").is_none(), "{body}");
    assert_still_serving(&app).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn bodies_that_are_no_graphql_request_get_400_or_413_and_write_nothing() {
    let (app, inventories) = server_with_stock().await;
    let big = inventories[0];
    let alice = Caller::Alice.header(&app);
    let reserve = json!({ "query": RESERVE, "variables": { "input": { "inventoryId": big } } });
    let before = state(&app).await;
    let padded =
        json!({ "query": format!("{RESERVE} # {}", "x".repeat(70 * 1024)), "variables": reserve["variables"] });
    for (what, body, status) in [
        ("a batch of 11 reserves", Value::Array(vec![reserve.clone(); 11]).to_string(), 400),
        ("a reserve padded to 70 KiB", padded.to_string(), 413),
        ("70 KiB of garbage", "x".repeat(70 * 1024), 413),
        ("invalid JSON", "{\"query\": \"mutation {".to_owned(), 400),
        ("a number", "42".to_owned(), 400),
        ("a string", json!(RESERVE).to_string(), 400),
        ("an empty array", "[]".to_owned(), 400),
        ("an empty query", json!({ "query": "" }).to_string(), 400),
        ("a query that is not a string", json!({ "query": 5 }).to_string(), 400),
        ("variables that are not an object", json!({ "query": RESERVE, "variables": [1] }).to_string(), 400),
        ("a batch with a non-request", json!([reserve, 1]).to_string(), 400),
        ("a batch with an empty request", json!([reserve, {}]).to_string(), 400),
        ("JSON nested past serde's limit", format!("{}{}", "[".repeat(10_000), "]".repeat(10_000)), 400),
    ] {
        let reply = post(&app, alice.as_deref(), body.into_bytes()).await;
        assert_eq!(reply.status, status, "{what}: {}", reply.body);
        assert_eq!(state(&app).await, before, "{what} wrote");
    }
    let app = std::sync::Arc::new(app);

    // Random bytes, valid requests with bytes flipped, and GraphQL-ish soup.
    let valid = serde_json::to_vec(&reserve).expect("serialize");
    let strategy = move || {
        let tokens = select(vec![
            "{",
            "}",
            "(",
            ")",
            "[",
            "]",
            ":",
            "$input",
            "...",
            "on",
            "fragment",
            "query",
            "mutation",
            "reserve",
            "input:",
            "__schema",
            "__type",
            "__typename",
            "inventories",
            "nodes",
            "id",
            "@skip(if: true)",
            "\"",
            "#",
            "\\u0000",
            "1e999",
            "Reserved",
            ",",
            " ",
        ]);
        prop_oneof![
            vec(any::<u8>(), 0..2048),
            (vec((any::<prop::sample::Index>(), any::<u8>(), 0..3_u8), 1..8), Just(valid)).prop_map(
                |(edits, mut body)| {
                    for (at, byte, how) in edits {
                        let i = at.index(body.len().max(1)).min(body.len());
                        match how {
                            0 if i < body.len() => body[i] = byte,
                            1 if i < body.len() => {
                                body.remove(i);
                            }
                            _ => body.insert(i, byte),
                        }
                    }
                    body
                }
            ),
            vec(tokens, 0..200).prop_map(|tokens| {
                serde_json::to_vec(&json!({ "query": tokens.concat(), "variables": {} })).expect("serialize")
            }),
        ]
    };
    let shared = app.clone();
    for_64_cases(strategy, move |body| {
        let app = shared.clone();
        async move {
            let alice = Caller::Alice.header(&app);
            send_anything(&app, alice.as_deref(), body).await.map(drop)
        }
    })
    .await;
    assert_still_serving(&app).await;
}

/// A hostile document as an attacker would vary it: a value nested up to
/// 6,000 deep in any of three places, fragments fanning out up to 40 levels,
/// or up to 2,500 aliases of a field (as many as fit the body limit).
fn generated_hostile() -> impl Strategy<Value = Hostile> {
    let fields = select(vec![
        "__typename",
        "inventoryBySku(sku: \"X\") { id }",
        "inventories(first: 100) { nodes { id } }",
        "inventories { edges { node { id sku } } pageInfo { hasNextPage } }",
    ]);
    prop_oneof![
        (1..6000_usize, 0..3_usize).prop_map(|(levels, place)| Hostile {
            what: "a deep value",
            query: deep_value(levels, place),
            says: &[]
        }),
        (1..40_usize).prop_map(|levels| Hostile {
            what: "fragment fan-out",
            query: fragment_fan_out(levels),
            says: &[]
        }),
        // As many as fit well within the body limit (and a websocket message).
        (1..2500_usize, fields).prop_map(|(count, field)| {
            let count = count.min(60_000 / (field.len() + 8));
            Hostile { what: "an alias flood", query: aliases("query", field, count), says: &[] }
        }),
    ]
}

#[tokio::test(flavor = "multi_thread")]
async fn generated_hostile_documents_are_answered_within_bounds_over_http_and_websockets() {
    let (app, _) = server_with_stock().await;
    let app = std::sync::Arc::new(app);
    let shared = app.clone();
    for_64_cases(generated_hostile, move |hostile| {
        let app = shared.clone();
        async move {
            let body = request(&hostile.query, json!({}));
            prop_assert!(body.len() <= BODY_LIMIT, "{:?} must fit the body limit", hostile);
            let started = std::time::Instant::now();
            send_anything(&app, None, body).await?;
            let took = started.elapsed();
            prop_assert!(took < std::time::Duration::from_secs(2), "{:?} took {:?} over HTTP", hostile, took);
            // The same document over a websocket: one result, with codes, and the socket open.
            let mut socket = crate::ws::connect(&app.address, "graphql-transport-ws").await;
            let payload = json!({ "query": hostile.query });
            crate::ws::send(&mut socket, json!({ "id": "h", "type": "subscribe", "payload": payload })).await;
            let answer = crate::ws::next_result(&mut socket).await;
            prop_assert_eq!(&answer["type"], "next", "{:?}: {}", hostile, answer);
            let errors = answer["payload"]["errors"].as_array().cloned().unwrap_or_default();
            for error in errors {
                let code = error["extensions"]["code"].as_str().unwrap_or("none");
                prop_assert!(CLIENT_CODES.contains(&code), "{:?}: {} over the websocket", hostile, error);
            }
            let follow_up = json!({ "id": "after", "type": "subscribe", "payload": { "query": "{ __typename }" } });
            crate::ws::send(&mut socket, follow_up).await;
            let after = crate::ws::next_result(&mut socket).await;
            prop_assert_eq!(&after["payload"]["data"]["__typename"], "Query", "{:?}: the socket stopped", hostile);
            Ok(())
        }
    })
    .await;
    assert_still_serving(&app).await;
}
