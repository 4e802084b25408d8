//! `returnOrder`: units of a fulfilled order come back, restocked where
//! they shipped from (most preferred location first) or at a chosen
//! location, or written off; one change of each restocked inventory with
//! one `RETURNED` ledger row per level; never more than a line shipped;
//! orders not fulfilled, unknown orders and bad input write nothing. The
//! races are in `races.rs`.

mod races;

use serde_json::{Value, json};
use stockguard::auth::Role;
use uuid::Uuid;

use crate::{
    documents::ORDER_RETURNS,
    helpers::{TestApp, address, error_code, uuid},
    locations::{create_location, default_location, levels_of, stocked},
    transfers::transfer,
};

/// A FULFILLED order of alice's with `items` (`(inventory, quantity)`),
/// placed, confirmed and fulfilled; its id.
pub async fn fulfilled_order(app: &TestApp, items: &[(Uuid, i32)]) -> Uuid {
    let items: Vec<Value> =
        items.iter().map(|(inventory, quantity)| json!({ "inventoryId": inventory, "quantity": quantity })).collect();
    let input = json!({ "items": items, "shippingAddress": address("1 Return Road") });
    let placed = app.place_order(&app.token("alice", Role::Customer), input).await;
    assert_eq!(placed["__typename"], "OrderPlaced", "{placed}");
    let order = uuid(&placed["order"]["id"]);
    assert_eq!(app.confirm(&app.operator(), order).await["__typename"], "OrderConfirmed");
    assert_eq!(app.fulfill(&app.operator(), order).await["__typename"], "OrderFulfilled");
    order
}

/// A return line of `quantity` units of `inventory`, RESTOCK (`at` a
/// location, or None: where it shipped from) or, with `write_off`, WRITE_OFF.
pub fn line(inventory: Uuid, quantity: i32, write_off: bool, at: Option<Uuid>) -> Value {
    let disposition = if write_off { "WRITE_OFF" } else { "RESTOCK" };
    let mut line = json!({ "inventoryId": inventory, "quantity": quantity, "disposition": disposition });
    if let Some(at) = at {
        line["locationId"] = json!(at);
    }
    line
}

/// The `returned` of an order's lines of `inventory`, summed, from the database.
pub async fn returned_of(app: &TestApp, order: Uuid, inventory: Uuid) -> i64 {
    app.count(&format!(
        "SELECT coalesce(sum(returned), 0)::bigint FROM reservations WHERE order_id = '{order}' AND inventory_id = '{inventory}'"
    ))
    .await
}

/// The `RETURNED` ledger rows of `inventory` at `version`: `(code, delta,
/// stock_after, note, actor)` by location code.
async fn returned_rows(app: &TestApp, inventory: Uuid, version: i32) -> Vec<Value> {
    app.rows(&format!(
        "SELECT l.code, m.delta, m.stock_after, m.note, m.actor FROM stock_movements m JOIN locations l ON l.id = m.location_id
          WHERE m.inventory_id = '{inventory}' AND m.version_after = {version} AND m.reason = 'RETURNED' ORDER BY l.code"
    ))
    .await
}

/// Everything a refused return must leave as it was.
pub async fn untouched(app: &TestApp) -> (String, i64, i64) {
    (
        app.snapshot().await,
        app.count("SELECT count(*) FROM returns").await,
        app.count("SELECT coalesce(sum(returned), 0)::bigint FROM reservations").await,
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn a_restocking_return_puts_units_back_where_they_shipped_from_most_preferred_first() {
    let app = TestApp::spawn().await;
    let operator = app.operator();
    let item = stocked(&app, "RET-1", 8).await;
    let (default, b) = (default_location(&app).await, create_location(&app, "b", 10).await);
    let moved = json!({ "inventoryId": item, "fromLocationId": default, "toLocationId": b, "quantity": 5 });
    assert_eq!(transfer(&app, &operator, moved).await["__typename"], "StockTransferred");
    // Five shipped: 3 from the default location (priority 0), 2 from b.
    let order = fulfilled_order(&app, &[(item, 5)]).await;
    assert_eq!(levels_of(&app, item).await, vec![("default".into(), 0), ("b".into(), 3)]);
    let (stock, version) = app.stock_and_version(item).await;
    assert_eq!(stock, 3);

    let input = json!({ "orderId": order, "lines": [line(item, 4, false, None)], "note": "  box opened  " });
    let answer = app.return_order(&operator, input).await;
    assert_eq!(answer["__typename"], "OrderReturned", "{answer}");
    assert_eq!(answer["order"]["status"], "FULFILLED", "{answer}");
    assert_eq!(answer["order"]["version"], 3, "placed, confirmed, fulfilled: a return makes no version");
    assert_eq!(answer["order"]["items"], json!([{ "inventory": { "id": item }, "quantity": 5, "returned": 4 }]));
    let made = &answer["return"];
    assert_eq!((&made["note"], &made["createdBy"]), (&json!("box opened"), &json!("operator")), "{made}");
    assert_eq!(
        made["lines"],
        json!([
            { "inventory": { "id": item }, "quantity": 3, "disposition": "RESTOCK", "location": { "id": default, "code": "default" } },
            { "inventory": { "id": item }, "quantity": 1, "disposition": "RESTOCK", "location": { "id": b, "code": "b" } },
        ]),
        "the most preferred location first, each up to what it shipped"
    );
    assert_eq!(levels_of(&app, item).await, vec![("default".into(), 3), ("b".into(), 4)]);
    assert_eq!(app.stock_and_version(item).await, (7, version + 1), "one change of the inventory");
    let row = |code: &str, delta: i64| json!({ "code": code, "delta": delta, "stock_after": 7, "note": "box opened", "actor": "operator" });
    assert_eq!(returned_rows(&app, item, version + 1).await, vec![row("b", 1), row("default", 3)]);
    assert_eq!(app.states(item).await, [7, 0, 0, 7], "available and on hand grow, nothing held");

    // The default location has taken back all it shipped: the next unit goes to b.
    let input = json!({ "orderId": order, "lines": [line(item, 1, false, None)] });
    let answer = app.return_order(&operator, input).await;
    assert_eq!(answer["return"]["lines"][0]["location"]["code"], "b", "{answer}");
    assert_eq!(answer["return"]["note"], Value::Null, "{answer}");
    assert_eq!(levels_of(&app, item).await, vec![("default".into(), 3), ("b".into(), 5)]);

    // All five are back: one more is more than shipped, and writes nothing.
    let before = untouched(&app).await;
    let input = json!({ "orderId": order, "lines": [line(item, 1, true, None)] });
    let answer = app.return_order(&operator, input).await;
    assert_eq!(
        answer,
        json!({ "__typename": "ReturnExceedsFulfilled", "inventoryId": item, "fulfilled": 5, "returned": 5, "requested": 1 })
    );
    assert_eq!(untouched(&app).await, before, "nothing written");

    let body = app.graphql(Some(&operator), ORDER_RETURNS, json!({ "id": order })).await;
    let returns = body["data"]["order"]["returns"].as_array().unwrap_or_else(|| panic!("{body}"));
    let quantities: Vec<&Value> = returns.iter().map(|r| &r["lines"][0]["quantity"]).collect();
    assert_eq!(quantities, [&json!(3), &json!(1)], "in the order they were made: {body}");
    assert_eq!(app.count(&format!("SELECT max(number)::bigint FROM returns WHERE order_id = '{order}'")).await, 2);
    app.assert_invariant().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_write_off_counts_the_units_and_moves_none_and_a_chosen_location_takes_restocked_ones() {
    let app = TestApp::spawn().await;
    let (damaged, fine) = (stocked(&app, "RET-A", 5).await, stocked(&app, "RET-B", 5).await);
    let c = create_location(&app, "c", 20).await;
    let order = fulfilled_order(&app, &[(damaged, 3), (fine, 2)]).await;
    let damaged_before = app.stock_and_version(damaged).await;
    let (_, fine_version) = app.stock_and_version(fine).await;

    let input = json!({ "orderId": order, "lines": [line(damaged, 2, true, None), line(fine, 2, false, Some(c))] });
    let answer = app.return_order(&app.operator(), input).await;
    assert_eq!(answer["__typename"], "OrderReturned", "{answer}");
    let mut lines = answer["return"]["lines"].as_array().expect("lines").clone();
    lines.sort_by_key(|l| l["disposition"].as_str().map(str::to_owned));
    assert_eq!(
        lines,
        vec![
            json!({ "inventory": { "id": fine }, "quantity": 2, "disposition": "RESTOCK", "location": { "id": c, "code": "c" } }),
            json!({ "inventory": { "id": damaged }, "quantity": 2, "disposition": "WRITE_OFF", "location": null }),
        ]
    );
    assert_eq!(app.stock_and_version(damaged).await, damaged_before, "a write-off moves nothing");
    let written_off =
        format!("SELECT count(*) FROM stock_movements WHERE inventory_id = '{damaged}' AND reason = 'RETURNED'");
    assert_eq!(app.count(&written_off).await, 0, "and writes no ledger row");
    assert_eq!(returned_of(&app, order, damaged).await, 2, "but counts as returned");

    assert_eq!(levels_of(&app, fine).await, vec![("default".into(), 3), ("c".into(), 2)], "a level made at c");
    assert_eq!(app.stock_and_version(fine).await, (5, fine_version + 1));
    assert_eq!(returned_rows(&app, fine, fine_version + 1).await.len(), 1);
    let sole = format!("SELECT count(*) FROM inventories WHERE id = '{fine}' AND sole_location_id IS NULL");
    assert_eq!(app.count(&sole).await, 1, "held in two places now");
    app.assert_invariant().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn returns_of_orders_not_fulfilled_of_unknown_orders_and_of_bad_input_write_nothing() {
    let app = TestApp::spawn().await;
    let operator = app.operator();
    let (item, other) = (stocked(&app, "RET-X", 10).await, stocked(&app, "RET-Y", 10).await);
    let placed = app
        .place_order(
            &app.token("alice", Role::Customer),
            json!({ "items": [{ "inventoryId": item, "quantity": 2 }], "shippingAddress": address("1 Main Street") }),
        )
        .await;
    let pending = uuid(&placed["order"]["id"]);
    let order = fulfilled_order(&app, &[(item, 2)]).await;
    let before = untouched(&app).await;

    let answer =
        app.return_order(&operator, json!({ "orderId": pending, "lines": [line(item, 1, false, None)] })).await;
    assert_eq!(answer["__typename"], "OrderCannotBeReturned", "{answer}");
    assert_eq!(answer["order"], json!({ "id": pending, "status": "PENDING" }));
    let nowhere = Uuid::new_v4();
    let answer =
        app.return_order(&operator, json!({ "orderId": nowhere, "lines": [line(item, 1, false, None)] })).await;
    assert_eq!(answer, json!({ "__typename": "OrderNotFound", "orderId": nowhere }));
    let customer = app.token("alice", Role::Customer);
    let answer = app.return_order(&customer, json!({ "orderId": order, "lines": [line(item, 1, false, None)] })).await;
    assert_eq!(error_code(&answer), Some("FORBIDDEN"), "{answer}");

    let unknown = Uuid::new_v4();
    let cases = [
        (json!([]), None, "input.lines"),
        (json!([line(item, 0, false, None)]), None, "input.lines[0].quantity"),
        (json!([line(item, -1, true, None)]), None, "input.lines[0].quantity"),
        (json!([line(item, 1001, false, None)]), None, "input.lines[0].quantity"),
        (json!([line(other, 1, false, None)]), None, "input.lines[0].inventoryId"),
        (json!([line(item, 1, false, None), line(item, 1, true, None)]), None, "input.lines[1].inventoryId"),
        (json!([line(item, 1, true, Some(unknown))]), None, "input.lines[0].locationId"),
        (json!([line(item, 1, false, Some(unknown))]), None, "input.lines[0].locationId"),
        (json!([line(item, 1, false, None)]), Some("x".repeat(501)), "input.note"),
    ];
    for (lines, note, field) in cases {
        let input = json!({ "orderId": order, "lines": lines, "note": note });
        let body = app.return_order(&operator, input).await;
        assert_eq!(error_code(&body), Some("BAD_USER_INPUT"), "{field}: {body}");
        assert_eq!(body["errors"][0]["extensions"]["field"], field, "{body}");
    }
    assert_eq!(untouched(&app).await, before, "nothing written");
    // The same lines within bounds are returned.
    let answer = app
        .return_order(
            &operator,
            json!({ "orderId": order, "lines": [line(item, 2, false, None)], "note": "x".repeat(500) }),
        )
        .await;
    assert_eq!(answer["__typename"], "OrderReturned", "{answer}");
    app.assert_invariant().await;
}
