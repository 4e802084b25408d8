//! `transferStock`: units move between two locations of one inventory in
//! one statement, as one change of the inventory (version + 1, stock
//! unchanged) with two ledger rows at that version; sold out, conflict,
//! unknown inventory or location and bad input write nothing; a key
//! replays; and transfers in both directions at once never deadlock, never
//! overdraw a level and keep the levels adding up, at every isolation level.

use futures::FutureExt;
use sea_orm::ConnectionTrait;
use serde_json::{Value, json};
use std::sync::Arc;
use uuid::Uuid;

use crate::{
    helpers::{Isolation, TestApp, at_every_isolation, at_once, count, error_code, named, names, uuid},
    locations::{create_location, default_location, levels_of, stocked},
};

pub const TRANSFER: &str = "mutation($input: TransferStockInput!) { transferStock(input: $input) { __typename
  ... on StockTransferred { inventory { id stock version }
        from { location { code } available reserved committed onHand } to { location { code } available } }
  ... on SoldOut { requested available inventory { stock version } }
  ... on Conflict { expectedVersion inventory { stock version } }
  ... on InventoryNotFound { inventoryId }
  ... on LocationNotFound { locationId } } }";

const LEDGER: &str = "query($id: UUID!, $first: Int, $after: String) { inventory(id: $id) {
  movements(first: $first, after: $after) { nodes { id delta reason stockAfter versionAfter location { code } }
                                            pageInfo { hasNextPage endCursor } } } }";

/// `transferStock` with `input`, as `token`.
pub async fn transfer(app: &TestApp, token: &str, input: Value) -> Value {
    app.mutate(token, "transferStock", TRANSFER, json!({ "input": input })).await
}

/// The ledger rows of `inventory` at `version`: `(reason, delta, stock_after, location code)` by reason.
async fn ledger_at(app: &TestApp, inventory: Uuid, version: i32) -> Vec<Value> {
    app.rows(&format!(
        "SELECT m.reason, m.delta, m.stock_after, l.code FROM stock_movements m LEFT JOIN locations l ON l.id = m.location_id
          WHERE m.inventory_id = '{inventory}' AND m.version_after = {version} ORDER BY m.reason"
    ))
    .await
}

/// An inventory of 10 at the default location, and a second location `b`.
async fn setup(app: &TestApp) -> (Uuid, Uuid, Uuid) {
    let item = stocked(app, "MOVE-1", 10).await;
    (item, default_location(app).await, create_location(app, "b", 10).await)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_transfer_moves_units_in_one_change_with_two_ledger_rows() {
    let app = TestApp::spawn().await;
    let (item, default, b) = setup(&app).await;
    let input = json!({ "inventoryId": item, "fromLocationId": default, "toLocationId": b, "quantity": 4 });
    let moved = transfer(&app, &app.operator(), input).await;
    assert_eq!(moved["__typename"], "StockTransferred", "{moved}");
    assert_eq!(moved["inventory"], json!({ "id": item, "stock": 10, "version": 2 }), "{moved}");
    let from = json!({ "location": { "code": "default" }, "available": 6, "reserved": 0, "committed": 0, "onHand": 6 });
    assert_eq!(moved["from"], from, "{moved}");
    assert_eq!(moved["to"], json!({ "location": { "code": "b" }, "available": 4 }), "{moved}");

    assert_eq!(app.stock_and_version(item).await, (10, 2), "stock unchanged, one version step");
    assert_eq!(levels_of(&app, item).await, vec![("default".into(), 6), ("b".into(), 4)]);
    assert_eq!(
        ledger_at(&app, item, 2).await,
        vec![
            json!({ "reason": "TRANSFERRED_IN", "delta": 4, "stock_after": 10, "code": "b" }),
            json!({ "reason": "TRANSFERRED_OUT", "delta": -4, "stock_after": 10, "code": "default" }),
        ]
    );
    // Back again, all of it: the target level already exists.
    let back = json!({ "inventoryId": item, "fromLocationId": b, "toLocationId": default, "quantity": 4, "expectedVersion": 2 });
    let moved = transfer(&app, &app.operator(), back).await;
    assert_eq!((&moved["from"]["available"], &moved["to"]["available"]), (&json!(0), &json!(10)), "{moved}");
    assert_eq!(levels_of(&app, item).await, vec![("default".into(), 10), ("b".into(), 0)], "an emptied level stays");
    assert_eq!(app.stock_and_version(item).await, (10, 3));
    app.assert_invariant().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_ledger_pages_through_rows_that_share_a_version_each_once() {
    let app = TestApp::spawn().await;
    let (item, default, b) = setup(&app).await;
    for (from, to) in [(default, b), (b, default), (default, b)] {
        let input = json!({ "inventoryId": item, "fromLocationId": from, "toLocationId": to, "quantity": 1 });
        assert_eq!(transfer(&app, &app.operator(), input).await["__typename"], "StockTransferred");
    }
    let (mut seen, mut after) = (Vec::new(), Value::Null);
    loop {
        let body = app.graphql(Some(&app.operator()), LEDGER, json!({ "id": item, "first": 1, "after": after })).await;
        let movements = &body["data"]["inventory"]["movements"];
        let nodes = movements["nodes"].as_array().unwrap_or_else(|| panic!("{body}"));
        seen.extend(nodes.iter().cloned());
        if movements["pageInfo"]["hasNextPage"] != true {
            break;
        }
        after = movements["pageInfo"]["endCursor"].clone();
    }
    let ids: Vec<Uuid> = seen.iter().map(|row| uuid(&row["id"])).collect();
    let stored = app
        .rows(&format!("SELECT id FROM stock_movements WHERE inventory_id = '{item}' ORDER BY version_after, id"))
        .await;
    assert_eq!(ids, stored.iter().map(|row| uuid(&row["id"])).collect::<Vec<_>>(), "every row once, in order");
    assert_eq!(seen.len(), 7, "created, then two rows for each of three transfers");
    for row in &seen[1..] {
        let code =
            row["location"]["code"].as_str().unwrap_or_else(|| panic!("a transfer row names its location: {row}"));
        let expected = if row["reason"] == "TRANSFERRED_OUT" { -1 } else { 1 };
        assert_eq!(row["delta"], expected, "{row}");
        assert!(["default", "b"].contains(&code), "{row}");
    }
    // A cursor from before a version could hold several rows still works:
    // it stands after every row of its version.
    let body = app.graphql(Some(&app.operator()), LEDGER, json!({ "id": item, "after": "v2" })).await;
    let versions: Vec<&Value> = body["data"]["inventory"]["movements"]["nodes"]
        .as_array()
        .expect("nodes")
        .iter()
        .map(|n| &n["versionAfter"])
        .collect();
    assert_eq!(versions, vec![&json!(3), &json!(3), &json!(4), &json!(4)], "{body}");
}

#[tokio::test(flavor = "multi_thread")]
async fn more_than_the_source_holds_is_sold_out_with_what_it_holds_and_moves_nothing() {
    let app = TestApp::spawn().await;
    let (item, default, b) = setup(&app).await;
    let c = create_location(&app, "c", 20).await;
    let before = (app.snapshot().await, levels_of(&app, item).await);
    let input = json!({ "inventoryId": item, "fromLocationId": default, "toLocationId": b, "quantity": 11 });
    let answer = transfer(&app, &app.operator(), input).await;
    assert_eq!(
        answer,
        json!({ "__typename": "SoldOut", "requested": 11, "available": 10,
                               "inventory": { "stock": 10, "version": 1 } })
    );
    // A location that never held the inventory holds 0 of it.
    let input = json!({ "inventoryId": item, "fromLocationId": c, "toLocationId": b, "quantity": 1 });
    let answer = transfer(&app, &app.operator(), input).await;
    assert_eq!((&answer["__typename"], &answer["available"]), (&json!("SoldOut"), &json!(0)), "{answer}");
    assert_eq!((app.snapshot().await, levels_of(&app, item).await), before, "nothing moved");
    app.assert_invariant().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stale_expected_version_is_a_conflict_and_moves_nothing() {
    let app = TestApp::spawn().await;
    let (item, default, b) = setup(&app).await;
    let before = (app.snapshot().await, levels_of(&app, item).await);
    let input = json!({ "inventoryId": item, "fromLocationId": default, "toLocationId": b, "quantity": 1, "expectedVersion": 5 });
    let answer = transfer(&app, &app.operator(), input).await;
    assert_eq!(
        answer,
        json!({ "__typename": "Conflict", "expectedVersion": 5, "inventory": { "stock": 10, "version": 1 } })
    );
    assert_eq!((app.snapshot().await, levels_of(&app, item).await), before, "nothing moved");
    let input = json!({ "inventoryId": item, "fromLocationId": default, "toLocationId": b, "quantity": 1, "expectedVersion": 1 });
    assert_eq!(transfer(&app, &app.operator(), input).await["__typename"], "StockTransferred");
    assert_eq!(app.stock_and_version(item).await, (10, 2));
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unknown_inventory_or_location_is_named_and_nothing_moves() {
    let app = TestApp::spawn().await;
    let (item, default, b) = setup(&app).await;
    let before = (app.snapshot().await, levels_of(&app, item).await);
    let (nowhere, nothing) = (Uuid::new_v4(), Uuid::new_v4());
    let input = json!({ "inventoryId": nothing, "fromLocationId": default, "toLocationId": b, "quantity": 1 });
    assert_eq!(
        transfer(&app, &app.operator(), input).await,
        json!({ "__typename": "InventoryNotFound", "inventoryId": nothing })
    );
    for (from, to) in [(nowhere, b), (default, nowhere)] {
        let input = json!({ "inventoryId": item, "fromLocationId": from, "toLocationId": to, "quantity": 1 });
        let answer = transfer(&app, &app.operator(), input).await;
        assert_eq!(answer, json!({ "__typename": "LocationNotFound", "locationId": nowhere }));
    }
    assert_eq!((app.snapshot().await, levels_of(&app, item).await), before, "nothing moved");
    assert_eq!(
        app.count("SELECT count(*) FROM stock_levels WHERE location_id NOT IN (SELECT id FROM locations)").await,
        0
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_transfer_to_its_source_or_of_a_quantity_out_of_range_is_bad_input() {
    let app = TestApp::spawn().await;
    let (item, default, b) = setup(&app).await;
    let before = (app.snapshot().await, levels_of(&app, item).await);
    for (from, to, quantity, field) in [
        (default, default, 1, "input.toLocationId"),
        (default, b, 0, "input.quantity"),
        (default, b, -3, "input.quantity"),
        (default, b, 1_000_000_001, "input.quantity"),
    ] {
        let input = json!({ "inventoryId": item, "fromLocationId": from, "toLocationId": to, "quantity": quantity });
        let body = transfer(&app, &app.operator(), input).await;
        assert_eq!(error_code(&body), Some("BAD_USER_INPUT"), "{body}");
        assert_eq!(body["errors"][0]["extensions"]["field"], field, "{body}");
    }
    assert_eq!((app.snapshot().await, levels_of(&app, item).await), before, "nothing moved");
}

/// Every run of the statement collides (a trigger raises 40001, as a
/// SERIALIZABLE transaction that keeps losing would): after the configured
/// runs the answer is `Conflict` with the latest row, as for a restock, and
/// nothing moved; without the trigger the same request moves the units.
#[tokio::test(flavor = "multi_thread")]
async fn a_transfer_whose_collision_retries_run_out_is_a_conflict_and_moves_nothing() {
    let limits = stockguard::config::Limits { collision_attempts: 2, ..Default::default() };
    let app = TestApp::spawn_configured(Isolation::ReadCommitted, limits).await;
    let (item, default, b) = setup(&app).await;
    let collide = "CREATE FUNCTION collide() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN \
                   RAISE EXCEPTION 'a collision forced by the test' USING ERRCODE = 'serialization_failure'; END $$; \
                   CREATE TRIGGER collide BEFORE UPDATE ON stock_levels FOR EACH ROW EXECUTE FUNCTION collide()";
    app.db.execute_unprepared(collide).await.expect("the colliding trigger");
    let before = (app.snapshot().await, levels_of(&app, item).await);
    let input = json!({ "inventoryId": item, "fromLocationId": default, "toLocationId": b, "quantity": 2 });
    let answer = transfer(&app, &app.operator(), input.clone()).await;
    assert_eq!(
        answer,
        json!({ "__typename": "Conflict", "expectedVersion": 1, "inventory": { "stock": 10, "version": 1 } })
    );
    assert_eq!((app.snapshot().await, levels_of(&app, item).await), before, "nothing moved");
    app.db.execute_unprepared("DROP TRIGGER collide ON stock_levels").await.expect("drop the trigger");
    assert_eq!(transfer(&app, &app.operator(), input).await["__typename"], "StockTransferred");
    app.assert_invariant().await;
}

/// Five transfers with one key at once move the units once, and all five
/// answer with the transfer; the key with another quantity is refused.
async fn a_repeated_key_moves_units_once_and_a_reused_one_is_refused(isolation: Isolation) {
    let app = Arc::new(TestApp::spawn_with(isolation).await);
    let (item, default, b) = setup(&app).await;
    let input = move |quantity: i32| json!({ "inventoryId": item, "fromLocationId": default, "toLocationId": b, "quantity": quantity, "idempotencyKey": "move-1" });
    let repeats = (0..5).map(|_| {
        let app = app.clone();
        async move { named(transfer(&app, &app.operator(), input(3)).await) }.boxed()
    });
    let answers = at_once(repeats.collect()).await;
    assert_eq!(count(&answers, "StockTransferred"), 5, "{:?}", names(&answers));
    for (_, answer) in &answers {
        assert_eq!((&answer["from"]["available"], &answer["to"]["available"]), (&json!(7), &json!(3)), "{answer}");
    }
    assert_eq!(app.stock_and_version(item).await, (10, 2), "one change");
    assert_eq!(levels_of(&app, item).await, vec![("default".into(), 7), ("b".into(), 3)]);
    assert_eq!(app.count(&format!("SELECT count(*) FROM stock_movements WHERE inventory_id = '{item}'")).await, 3);
    let reused = transfer(&app, &app.operator(), input(4)).await;
    assert_eq!(error_code(&reused), Some("IDEMPOTENCY_KEY_REUSED"), "{reused}");
    assert_eq!(app.stock_and_version(item).await, (10, 2), "nothing moved");
}

/// Forty transfers of 1 to 3 units at once, half from the default location
/// to `b` and half back, on one inventory of 100 split 50/50: each either
/// moves or is sold out (or, when its collision retries run out, a
/// conflict); none fails, so no deadlock (40P01) or serialization failure
/// (40001) ever reaches a client; no level goes negative, the levels add up
/// to the unchanged stock, and the version counts exactly the setup and the
/// transfers that moved, each with its two ledger rows.
async fn transfers_both_ways_at_once_never_deadlock_or_overdraw(isolation: Isolation) {
    let app = Arc::new(TestApp::spawn_with(isolation).await);
    let item = stocked(&app, "MOVE-HOT", 100).await;
    let (default, b) = (default_location(&app).await, create_location(&app, "b", 10).await);
    let setup = json!({ "inventoryId": item, "fromLocationId": default, "toLocationId": b, "quantity": 50 });
    assert_eq!(transfer(&app, &app.operator(), setup).await["__typename"], "StockTransferred");
    let requests = (0..40)
        .map(|n| {
            let app = app.clone();
            let (from, to) = if n % 2 == 0 { (default, b) } else { (b, default) };
            let input =
                json!({ "inventoryId": item, "fromLocationId": from, "toLocationId": to, "quantity": 1 + n % 3 });
            async move { named(transfer(&app, &app.operator(), input).await) }.boxed()
        })
        .collect();
    let answers = at_once(requests).await;
    let moved = count(&answers, "StockTransferred");
    let settled = moved + count(&answers, "SoldOut") + count(&answers, "Conflict");
    assert_eq!(settled, answers.len(), "no errors: {answers:?}");
    assert!(moved > 0, "{:?}", names(&answers));

    let levels = levels_of(&app, item).await;
    assert!(levels.iter().all(|(_, available)| *available >= 0), "{levels:?}");
    assert_eq!(levels.iter().map(|(_, available)| available).sum::<i64>(), 100, "{levels:?}");
    let moved = i32::try_from(moved).expect("moved");
    assert_eq!(app.stock_and_version(item).await, (100, 2 + moved), "created, the setup, then one step per transfer");
    let ledger = app.count(&format!("SELECT count(*) FROM stock_movements WHERE inventory_id = '{item}'")).await;
    assert_eq!(ledger, 3 + 2 * i64::from(moved), "two rows per transfer");
    app.assert_invariant().await;
}

at_every_isolation! {
    a_repeated_key_moves_units_once_and_a_reused_one_is_refused;
    transfers_both_ways_at_once_never_deadlock_or_overdraw;
}
