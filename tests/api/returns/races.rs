//! Returns under concurrency, at every isolation level, each round checked
//! against the database: a return that waited for another judges what that
//! one left; racing returns of one order never return more than it
//! shipped, and are numbered one after another; returns racing
//! reserves and transfers on the same inventories never deadlock and never
//! lose a unit; a keyed return sent ten times at once returns once.

use std::sync::Arc;

use futures::FutureExt;
use sea_orm::{ConnectionTrait, TransactionTrait};
use serde_json::{Value, json};
use stockguard::{
    auth::Role,
    stock::{
        rows::ReturnDisposition,
        taking_back::{self, OrderReturn, ReturnLine},
    },
};
use uuid::Uuid;

use super::{fulfilled_order, line, returned_of};
use crate::{
    helpers::{Isolation, TestApp, at_every_isolation, at_once, count, error_code, named, names},
    locations::{create_location, default_location, stocked},
    transfers::transfer,
};

/// The units a successful return's answer says came back.
fn units_of(answer: &Value) -> i64 {
    let lines = answer["return"]["lines"].as_array().unwrap_or_else(|| panic!("lines: {answer}"));
    lines.iter().map(|l| l["quantity"].as_i64().expect("a quantity")).sum()
}

/// Sixteen returns of one order line of 10 at once, of 1 to 3 units each
/// (31 asked for), restocked where they shipped from, at a chosen location
/// or written off: each is returned or exceeds what shipped, never an
/// error; the line's `returned` is what the returned answers add up to,
/// never more than 10, and at least 8 (a refused request asked for more
/// than was left, 3 at most); the returns are numbered 1..n; the inventory
/// changed once per restocking return.
async fn returns_racing_each_other_never_exceed_the_fulfilled_quantity(isolation: Isolation) {
    let app = Arc::new(TestApp::spawn_with(isolation).await);
    let item = stocked(&app, "RET-RACE", 20).await;
    let b = create_location(&app, "b", 10).await;
    let order = fulfilled_order(&app, &[(item, 10)]).await;
    let (stock, version) = app.stock_and_version(item).await;
    let requests = (0..16)
        .map(|n: i32| {
            let app = app.clone();
            let returned = match n % 4 {
                1 => line(item, 1 + n % 3, true, None),
                3 => line(item, 1 + n % 3, false, Some(b)),
                _ => line(item, 1 + n % 3, false, None),
            };
            let input = json!({ "orderId": order, "lines": [returned], "note": format!("return {n}") });
            async move { named(app.return_order(&app.operator(), input).await) }.boxed()
        })
        .collect();
    let answers = at_once(requests).await;
    let returned = count(&answers, "OrderReturned");
    assert_eq!(returned + count(&answers, "ReturnExceedsFulfilled"), answers.len(), "no errors: {answers:?}");
    let units: i64 = answers.iter().filter(|(name, _)| name == "OrderReturned").map(|(_, a)| units_of(a)).sum();
    for (_, refused) in answers.iter().filter(|(name, _)| name == "ReturnExceedsFulfilled") {
        let asked = refused["returned"].as_i64().unwrap_or(99) + refused["requested"].as_i64().unwrap_or(0);
        assert!(asked > 10 && refused["fulfilled"] == 10, "{refused}");
    }
    let in_db = returned_of(&app, order, item).await;
    assert_eq!(in_db, units, "the line counts what the answers returned");
    assert!((8..=10).contains(&in_db), "never more than shipped, and no fitting request refused: {in_db}");

    let numbers = app.rows(&format!("SELECT number FROM returns WHERE order_id = '{order}' ORDER BY number")).await;
    let expected: Vec<Value> = (1..=returned).map(|n| json!({ "number": n })).collect();
    assert_eq!(numbers, expected, "numbered one after another");
    let restocking = app
        .count(&format!(
            "SELECT count(DISTINCT l.return_id) FROM return_lines l JOIN returns r ON r.id = l.return_id
              WHERE r.order_id = '{order}' AND l.disposition = 'RESTOCK'"
        ))
        .await;
    let restocked = app
        .count(&format!(
            "SELECT coalesce(sum(l.quantity), 0)::bigint FROM return_lines l JOIN returns r ON r.id = l.return_id
              WHERE r.order_id = '{order}' AND l.disposition = 'RESTOCK'"
        ))
        .await;
    let (stock_after, version_after) = app.stock_and_version(item).await;
    assert_eq!(i64::from(stock_after), i64::from(stock) + restocked, "restocked units are available");
    assert_eq!(i64::from(version_after), i64::from(version) + restocking, "one change per restocking return");
    app.assert_invariant().await;
    eprintln!(
        "returns_racing_each_other_never_exceed_the_fulfilled_quantity {isolation:?}: {} requests, {returned} returned \
         ({units} units, {restocking} restocking), {} exceeded",
        answers.len(),
        answers.len() - returned
    );
}

/// Eight returns of a fulfilled order (one unit of X each, half back where
/// it shipped from, half to location b; four also return a unit of Y),
/// eight customers' reserves of X and eight transfers of X between the two
/// locations, all at once: no request fails (no deadlock, no collision
/// reaches a client), every return is made, and no unit is lost: X's on
/// hand is what it held plus the 8 returned, Y's plus the 2 restocked.
async fn returns_racing_reserves_and_transfers_never_deadlock_or_lose_a_unit(isolation: Isolation) {
    let app = Arc::new(TestApp::spawn_with(isolation).await);
    let operator = app.operator();
    let (x, y) = (stocked(&app, "RET-X", 12).await, stocked(&app, "RET-Y", 6).await);
    let (default, b) = (default_location(&app).await, create_location(&app, "b", 10).await);
    let split = json!({ "inventoryId": x, "fromLocationId": default, "toLocationId": b, "quantity": 6 });
    assert_eq!(transfer(&app, &operator, split).await["__typename"], "StockTransferred");
    // X ships 6 from the default location and 2 from b.
    let order = fulfilled_order(&app, &[(x, 8), (y, 4)]).await;
    assert_eq!((app.states(x).await[3], app.states(y).await[3]), (4, 2), "on hand after shipping");

    let mut requests = Vec::new();
    for n in 0..8 {
        let app = app.clone();
        let mut lines = vec![line(x, 1, false, (n % 2 == 1).then_some(b))];
        if n < 4 {
            lines.push(line(y, 1, n % 2 == 1, None));
        }
        let input = json!({ "orderId": order, "lines": lines });
        requests.push(async move { ("return", named(app.return_order(&app.operator(), input).await)) }.boxed());
    }
    for n in 0..8 {
        let app = app.clone();
        let token = app.token(&format!("racer-{n}"), Role::Customer);
        let input = json!({ "inventoryId": x, "quantity": 1 });
        requests.push(async move { ("reserve", named(app.reserve(&token, input).await)) }.boxed());
    }
    for n in 0..8 {
        let app = app.clone();
        let (from, to) = if n % 2 == 0 { (b, default) } else { (default, b) };
        let input = json!({ "inventoryId": x, "fromLocationId": from, "toLocationId": to, "quantity": 1 });
        requests.push(async move { ("transfer", named(transfer(&app, &app.operator(), input).await)) }.boxed());
    }
    let answers = at_once(requests).await;
    let of = |kind: &str| -> Vec<(String, Value)> {
        answers.iter().filter(|(k, _)| *k == kind).map(|(_, answer)| answer.clone()).collect()
    };
    let (returns, reserves, transfers) = (of("return"), of("reserve"), of("transfer"));
    assert_eq!(count(&returns, "OrderReturned"), 8, "every return is made: {:?}", names(&returns));
    let reserved = count(&reserves, "Reserved");
    assert_eq!(reserved + count(&reserves, "SoldOut"), 8, "{:?}", names(&reserves));
    let moved = count(&transfers, "StockTransferred");
    let settled = moved + count(&transfers, "SoldOut") + count(&transfers, "Conflict");
    assert_eq!(settled, 8, "{:?}", names(&transfers));

    assert_eq!((returned_of(&app, order, x).await, returned_of(&app, order, y).await), (8, 4));
    let [available, held, committed, on_hand] = app.states(x).await;
    assert_eq!(on_hand, 4 + 8, "every returned unit is on hand, none lost");
    assert_eq!((held, committed, available), (reserved as i64, 0, 12 - reserved as i64));
    assert_eq!(app.states(y).await, [4, 0, 0, 4], "Y's two restocked units back, two written off");
    app.assert_invariant().await;
    eprintln!(
        "returns_racing_reserves_and_transfers_never_deadlock_or_lose_a_unit {isolation:?}: 8 returned, \
         {reserved} of 8 reserved, {moved} of 8 transferred"
    );
}

/// Ten returns with one key at once return once: all ten answer the same
/// return, the line counts its units once, the inventory changed once; the
/// key with another quantity is refused, and a new key returns again.
async fn a_keyed_return_repeated_ten_times_at_once_returns_once(isolation: Isolation) {
    let app = Arc::new(TestApp::spawn_with(isolation).await);
    let item = stocked(&app, "RET-KEY", 5).await;
    let order = fulfilled_order(&app, &[(item, 3)]).await;
    let (stock, version) = app.stock_and_version(item).await;
    let input = move |quantity: i32, key: &str| json!({ "orderId": order, "lines": [line(item, quantity, false, None)], "idempotencyKey": key });
    let repeats = (0..10).map(|_| {
        let (app, input) = (app.clone(), input(2, "return-1"));
        async move { named(app.return_order(&app.operator(), input).await) }.boxed()
    });
    let answers = at_once(repeats.collect()).await;
    assert_eq!(count(&answers, "OrderReturned"), 10, "{answers:?}");
    let first = &answers[0].1["return"]["id"];
    assert!(answers.iter().all(|(_, answer)| &answer["return"]["id"] == first), "one return: {answers:?}");
    assert_eq!(app.count(&format!("SELECT count(*) FROM returns WHERE order_id = '{order}'")).await, 1);
    assert_eq!(returned_of(&app, order, item).await, 2);
    assert_eq!(app.stock_and_version(item).await, (stock + 2, version + 1), "one change");

    let reused = app.return_order(&app.operator(), input(1, "return-1")).await;
    assert_eq!(error_code(&reused), Some("IDEMPOTENCY_KEY_REUSED"), "{reused}");
    assert_eq!(returned_of(&app, order, item).await, 2, "nothing written");
    let again = app.return_order(&app.operator(), input(1, "return-2")).await;
    assert_eq!(again["__typename"], "OrderReturned", "{again}");
    assert_eq!(returned_of(&app, order, item).await, 3);
    app.assert_invariant().await;
}

/// A return that waits for another return of the same order (here, one
/// the test holds open in a transaction of its own) judges what that one
/// left once it has committed: it is numbered after it, and puts its unit
/// back where the line shipped it and no return has put one back yet. At
/// READ COMMITTED the waiting statement sees the lines' counters as the
/// first return left them, but not its return lines: it is run again
/// rather than read them too early (which would put the unit back at the
/// default location a second time, or number it 1 again).
async fn a_return_that_waited_for_another_judges_what_that_one_left(isolation: Isolation) {
    let app = Arc::new(TestApp::spawn_with(isolation).await);
    let item = stocked(&app, "RET-WAIT", 6).await;
    let (default, b) = (default_location(&app).await, create_location(&app, "b", 10).await);
    let split = json!({ "inventoryId": item, "fromLocationId": default, "toLocationId": b, "quantity": 5 });
    assert_eq!(transfer(&app, &app.operator(), split).await["__typename"], "StockTransferred");
    // One unit shipped from each location.
    let order = fulfilled_order(&app, &[(item, 2)]).await;

    let first =
        [ReturnLine { inventory_id: item, quantity: 1, disposition: ReturnDisposition::Restock, location_id: None }];
    let held = app.db.begin().await.expect("begin");
    let statement = OrderReturn {
        order_id: order,
        return_id: Uuid::new_v4(),
        operator: "operator",
        note: None,
        lines: &first,
        key: None,
    };
    held.query_all_raw(taking_back::return_order(statement)).await.expect("the first return, not yet committed");
    let waiting = {
        let app = app.clone();
        let input = json!({ "orderId": order, "lines": [line(item, 1, false, None)] });
        tokio::spawn(async move { app.return_order(&app.operator(), input).await })
    };
    app.until_waiting_for_a_lock("WITH asked").await;
    held.commit().await.expect("commit the first return");

    let answer = waiting.await.expect("the second return");
    assert_eq!(answer["__typename"], "OrderReturned", "{answer}");
    assert_eq!(
        answer["return"]["lines"][0]["location"]["code"], "b",
        "the default location had its unit back: {answer}"
    );
    let numbers = app
        .rows(&format!(
            "SELECT r.number, l.code FROM returns r JOIN return_lines x ON x.return_id = r.id
               JOIN locations l ON l.id = x.location_id WHERE r.order_id = '{order}' ORDER BY r.number"
        ))
        .await;
    assert_eq!(numbers, vec![json!({ "number": 1, "code": "default" }), json!({ "number": 2, "code": "b" })]);
    assert_eq!(returned_of(&app, order, item).await, 2);
    app.assert_invariant().await;
}

at_every_isolation! {
    a_return_that_waited_for_another_judges_what_that_one_left;
    returns_racing_each_other_never_exceed_the_fulfilled_quantity;
    returns_racing_reserves_and_transfers_never_deadlock_or_lose_a_unit;
    a_keyed_return_repeated_ten_times_at_once_returns_once;
}
