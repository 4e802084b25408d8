//! `adjustStock` and `setSafetyStock`, fuzzed through their input: answered
//! without an internal error, a refusal leaves everything as it was (every
//! level's units and safety stock, and the claimed keys, beside what
//! `mutate` checks), and an answer keeps the invariant. Reserves, with and
//! without `useSafetyStock`, run in between.

use super::*;
use crate::{
    documents::{ADJUST_STOCK, RESERVE_OFFERED, SET_SAFETY_STOCK},
    locations::{create_location, default_location},
};

/// A generated call.
#[derive(Debug, Clone)]
enum Correcting {
    Adjust { input: Value, version: Version, key: Option<Value> },
    Keep(Value),
    Reserve(Value),
}

/// Every level's units and safety stock, and the claimed keys, as one string.
async fn levels(app: &TestApp) -> String {
    let sql = "SELECT (SELECT md5(coalesce(string_agg(concat_ws(':', inventory_id, location_id, available, safety_stock), \
                                                      ',' ORDER BY inventory_id, location_id), '')) FROM stock_levels) \
                      || '|' || (SELECT count(*) FROM idempotency_keys)";
    let row =
        app.db.query_one_raw(Statement::from_string(DbBackend::Postgres, sql)).await.expect("query").expect("row");
    row.try_get_by_index(0).expect("hashes")
}

/// Sends one mutation as `caller`: refused, nothing is written; answered,
/// the invariant holds.
async fn correct(
    app: &TestApp,
    caller: &Caller,
    query: &str,
    variables: Value,
    field: &str,
) -> Result<(), TestCaseError> {
    let before = (state(app).await, levels(app).await);
    let reply = post(app, caller.header(app).as_deref(), request(query, variables)).await;
    if check_transport(&reply, false)? {
        prop_assert!(reply.body["data"][field].is_null(), "data beside errors: {}", reply.body);
        prop_assert_eq!((state(app).await, levels(app).await), before, "refused input wrote: {}", reply.body);
        return Ok(());
    }
    let drifts = invariant::check(&app.db).await.expect("invariant check");
    prop_assert!(drifts.is_empty(), "invariant broken after {}: {:?}", reply.body, drifts);
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn adjustments_and_safety_stock_answer_any_input_without_internal_errors_and_refusals_write_nothing() {
    const REASONS: &[&str] =
        &["CYCLE_COUNT", "DAMAGED", "SHRINKAGE", "FOUND", "CORRECTION", "RETURN_TO_SUPPLIER", "OTHER"];
    const NOTES: &[&str] = &["", "   ", "dropped", "Ünïcødé 📦"];
    let (app, inventories) = server_with_stock().await;
    let default = default_location(&app).await;
    let other = create_location(&app, "fuzz-b", 10).await;
    let (places, known) = (vec![default, other], inventories.clone());
    let app = std::sync::Arc::new(app);
    let strategy = move || {
        let amount = || {
            prop_oneof![
                4 => select(vec![-3, -1, 1, 2, 5]).prop_map(Value::from),
                2 => select(vec![0, -1_000_000_000, 1_000_000_000, -1_000_000_001, i32::MIN, i32::MAX]).prop_map(Value::from),
                1 => any::<i32>().prop_map(Value::from),
                1 => not_an_int(),
            ]
        };
        let reason = prop_oneof![6 => select(REASONS).prop_map(Value::from), 1 => text(&["cycle_count", "LOST"])];
        let note = prop::option::weighted(0.5, prop_oneof![3 => text(NOTES), 1 => Just(json!("x".repeat(501)))]);
        let location = || prop::option::weighted(0.6, uuid(places.clone()));
        let change = prop_oneof![
            3 => amount().prop_map(|delta| json!({ "delta": delta })),
            2 => amount().prop_map(|count| json!({ "countedOnHand": count })),
            1 => (amount(), amount()).prop_map(|(delta, count)| json!({ "delta": delta, "countedOnHand": count })),
            1 => Just(json!({})),
        ];
        let adjust = (uuid(known.clone()), location(), change, reason, note, version(), idempotency_key()).prop_map(
            |(inventory, location, change, reason, note, version, key)| {
                let mut input = change;
                input["inventoryId"] = inventory;
                input["reason"] = reason;
                set(&mut input, "locationId", location);
                set(&mut input, "note", note);
                Correcting::Adjust { input, version, key }
            },
        );
        let keep = (uuid(known.clone()), location(), amount()).prop_map(|(inventory, location, quantity)| {
            let mut input = json!({ "inventoryId": inventory, "quantity": quantity });
            set(&mut input, "locationId", location);
            Correcting::Keep(input)
        });
        let flag = prop::option::weighted(0.3, select(vec![json!(true), json!(false), json!("yes")]));
        let reserve = (plenty(&known), quantity(), flag).prop_map(|(inventory, quantity, flag)| {
            let mut input = json!({ "inventoryId": inventory, "quantity": quantity });
            set(&mut input, "useSafetyStock", flag);
            Correcting::Reserve(input)
        });
        (caller(Caller::Operator), prop_oneof![3 => adjust, 2 => keep, 2 => reserve])
    };
    let shared = app.clone();
    for_64_cases(strategy, move |(caller, call)| {
        let app = shared.clone();
        async move {
            match call {
                Correcting::Adjust { mut input, version, key } => {
                    let inventory = input["inventoryId"].clone();
                    set(&mut input, "expectedVersion", version.resolve(inventory_version(&app, &inventory)).await);
                    set(&mut input, "idempotencyKey", key);
                    correct(&app, &caller, ADJUST_STOCK, json!({ "input": input }), "adjustStock").await
                }
                Correcting::Keep(input) => {
                    correct(&app, &caller, SET_SAFETY_STOCK, json!({ "input": input }), "setSafetyStock").await
                }
                // A customer asking for safety stock is refused; the rest as any reserve.
                Correcting::Reserve(input) => {
                    correct(&app, &caller, RESERVE_OFFERED, json!({ "input": input }), "reserve").await
                }
            }
        }
    })
    .await;
    assert_still_serving(&app).await;
}
