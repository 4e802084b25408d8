//! The waiting list mutations, fuzzed through their input: `joinWaitlist`
//! and `leaveWaitlist` answer anything without an internal error, and a
//! refusal leaves the entries as they were (beside everything `mutate`
//! checks); an answered one keeps the invariant, entries' holds included.

use super::*;

const JOIN: &str = "mutation($input: JoinWaitlistInput!) { joinWaitlist(input: $input) { __typename } }";
const LEAVE: &str = "mutation($id: UUID!) { leaveWaitlist(id: $id) { id status } }";

/// A generated call.
#[derive(Debug, Clone)]
enum Waiting {
    Join(Value),
    Leave(Value),
}

/// Every entry, as one string.
async fn entries(app: &TestApp) -> String {
    let sql = "SELECT md5(coalesce(string_agg(concat_ws(':', id, status, held, quantity, reservation_id), ',' \
               ORDER BY id), '')) FROM waitlist_entries";
    let row =
        app.db.query_one_raw(Statement::from_string(DbBackend::Postgres, sql)).await.expect("query").expect("row");
    row.try_get_by_index(0).expect("a hash")
}

/// Sends one mutation and checks: the transport; no data beside errors;
/// when refused, nothing written, entries included; when answered, the
/// invariant.
async fn wait(app: &TestApp, caller: &Caller, query: &str, variables: Value, field: &str) -> Result<(), TestCaseError> {
    let before = (state(app).await, entries(app).await);
    let reply = post(app, caller.header(app).as_deref(), request(query, variables)).await;
    if check_transport(&reply, false)? {
        prop_assert!(reply.body["data"][field].is_null(), "data beside errors: {}", reply.body);
        prop_assert_eq!((state(app).await, entries(app).await), before, "refused input wrote: {}", reply.body);
        return Ok(());
    }
    let drifts = invariant::check(&app.db).await.expect("invariant check");
    prop_assert!(drifts.is_empty(), "invariant broken after {}: {:?}", reply.body, drifts);
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn waitlist_mutations_answer_any_input_without_internal_errors_and_refusals_write_nothing() {
    let (app, inventories) = server_with_stock().await;
    let known_entries: Vec<Uuid> = {
        let token = app.token("alice", Role::Customer);
        let input = json!({ "input": { "inventoryId": inventories[1], "quantity": 5 } });
        let joined = app
            .mutate(
                &token,
                "joinWaitlist",
                "mutation($input: JoinWaitlistInput!) {
            joinWaitlist(input: $input) { ... on WaitlistJoined { entry { id } } } }",
                input,
            )
            .await;
        vec![joined["entry"]["id"].as_str().and_then(|id| id.parse().ok()).unwrap_or_else(|| panic!("{joined}"))]
    };
    let app = std::sync::Arc::new(app);
    let strategy = move || {
        let join = (
            optional(uuid(inventories.clone())),
            optional(uuid(inventories.clone())),
            optional(quantity()),
            optional(prop_oneof![
                Just(json!([])),
                uuid(inventories.clone()).prop_map(|id| json!([id])),
                Just(json!("x"))
            ]),
            idempotency_key(),
        )
            .prop_map(|(inventory, kit, quantity, locations, key)| {
                let mut input = json!({});
                set(&mut input, "inventoryId", inventory);
                set(&mut input, "kitId", kit);
                set(&mut input, "quantity", quantity);
                set(&mut input, "locationIds", locations);
                set(&mut input, "idempotencyKey", key);
                Waiting::Join(input)
            });
        let leave = uuid(known_entries.clone()).prop_map(Waiting::Leave);
        (caller(Caller::Alice), prop_oneof![3 => join, 1 => leave])
    };
    let shared = app.clone();
    for_64_cases(strategy, move |(caller, call)| {
        let app = shared.clone();
        async move {
            match call {
                Waiting::Join(input) => wait(&app, &caller, JOIN, json!({ "input": input }), "joinWaitlist").await,
                Waiting::Leave(id) => wait(&app, &caller, LEAVE, json!({ "id": id }), "leaveWaitlist").await,
            }
        }
    })
    .await;
    assert_still_serving(&app).await;
}

/// Leaves out a field now and then.
fn optional(value: impl Strategy<Value = Value>) -> impl Strategy<Value = Option<Value>> {
    prop::option::weighted(0.7, value)
}
