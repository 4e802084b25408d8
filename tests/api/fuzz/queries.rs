//! Every query argument and any token subject: a client's error at worst.

use super::*;

/// Every query with an argument, each taking what it declares of the
/// generated variables `sku`, `first`, `after`, `status` and `id`.
pub(super) const QUERIES: [&str; 6] = [
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
pub(super) fn cursor(real: Vec<String>) -> impl Strategy<Value = Value> {
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

/// The inputs these properties found, pinned: each is the client's fault
/// and must never be answered `INTERNAL`.
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
