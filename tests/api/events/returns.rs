//! Returns as events: each return of an order is one `ORDER_CHANGED` of its
//! own (`data.returnId`, the order's unchanged version), arriving after the
//! order's FULFILLED version and after the returns made before it, by
//! number; each restocking return is one `STOCK_CHANGED` (`RETURNED`) per
//! inventory it restocked; a write-off and a refused return send nothing.

use std::{collections::BTreeSet, time::Duration};

use futures::FutureExt;
use serde_json::{Value, json};
use uuid::Uuid;

use super::{
    Isolation, assert_in_order, committed_changes, first_arrivals, limits, receiver::Receiver, spawn, stock_changes,
    subscribe, until_delivered,
};
use crate::{
    helpers::{at_every_isolation, at_once, eventually, named, uuid},
    returns::{fulfilled_order, line},
};

/// Eight returns of one order at once (restocked or written off, some more
/// than is left): the receiver gets one ORDER_CHANGED per return made, with
/// its id and number, in number order after the FULFILLED one, and one
/// STOCK_CHANGED RETURNED per restocking return, with the units after it.
async fn each_return_is_one_order_event_in_the_order_they_were_made(isolation: Isolation) {
    let app = spawn(isolation, limits(&[0.05, 0.05, 0.05])).await;
    let receiver = Receiver::start().await;
    subscribe(&app, &receiver).await;
    let item = app.create_inventory("EV-RETURN", 10).await;
    let order = fulfilled_order(&app, &[(item, 6)]).await;
    let calls = (0..8).map(|n: i32| {
        let app = app.clone();
        let input = json!({ "orderId": order, "lines": [line(item, 1 + n % 2, n % 3 == 0, None)] });
        async move { named(app.return_order(&app.operator(), input).await) }.boxed()
    });
    let answers = at_once(calls.collect()).await;
    let made: BTreeSet<Uuid> =
        answers.iter().filter(|(name, _)| name == "OrderReturned").map(|(_, a)| uuid(&a["return"]["id"])).collect();
    assert!(!made.is_empty() && made.len() < 8, "some returned, some exceeded: {answers:?}");

    let committed = committed_changes(&app, &[item]).await;
    until_delivered(&receiver, &committed, Duration::from_secs(30), "every stock change delivered").await;
    let returns_of = |first: &[Value]| -> Vec<Value> {
        first.iter().filter(|e| e["type"] == "ORDER_CHANGED" && e["data"]["returnId"].is_string()).cloned().collect()
    };
    eventually(Duration::from_secs(30), "every return's event delivered", || {
        let (receiver, made) = (receiver.clone(), made.len());
        async move { returns_of(&first_arrivals(&receiver.accepted_events())).len() >= made }
    })
    .await;
    let first = first_arrivals(&receiver.accepted_events());
    assert_in_order(&first);
    let of_order: Vec<&Value> = first.iter().filter(|e| e["orderId"] == json!(order)).collect();
    let fulfilled = of_order.iter().position(|e| e["data"]["status"] == "FULFILLED" && e["data"]["returnId"].is_null());
    let fulfilled = fulfilled.unwrap_or_else(|| panic!("the FULFILLED version arrived: {of_order:?}"));
    let returns = returns_of(&first);
    assert_eq!(returns.len(), made.len(), "one per return, none for a refused one");
    let numbers: Vec<i64> = returns.iter().map(|e| e["data"]["returnNumber"].as_i64().expect("a number")).collect();
    assert_eq!(numbers, (1..=made.len() as i64).collect::<Vec<_>>(), "in the order they were made");
    let ids: BTreeSet<Uuid> = returns.iter().map(|e| uuid(&e["data"]["returnId"])).collect();
    assert_eq!(ids, made);
    for event in &returns {
        assert_eq!((&event["version"], &event["data"]["status"]), (&json!(3), &json!("FULFILLED")), "{event}");
    }
    assert!(of_order.iter().skip(fulfilled + 1).all(|e| e["data"]["returnId"].is_string()), "returns after FULFILLED");

    let restocking = app
        .count(&format!(
            "SELECT count(DISTINCT l.return_id) FROM return_lines l JOIN returns r ON r.id = l.return_id
              WHERE r.order_id = '{order}' AND l.disposition = 'RESTOCK'"
        ))
        .await;
    let stock: Vec<&Value> = first
        .iter()
        .filter(|e| {
            e["type"] == "STOCK_CHANGED" && e["inventoryId"] == json!(item) && e["data"]["reason"] == "RETURNED"
        })
        .collect();
    assert_eq!(stock.len() as i64, restocking, "one stock change per restocking return");
    for event in &stock {
        let data = &event["data"];
        assert!(data["delta"].as_i64().is_some_and(|d| d > 0), "{event}");
        assert_eq!(data["orderId"], json!(order), "{event}");
        assert_eq!(data["onHand"], data["available"], "nothing held: {event}");
    }
    assert_eq!(stock_changes(&first).len(), committed.len(), "no stock change twice or invented");
    app.assert_invariant().await;
}

at_every_isolation! {
    each_return_is_one_order_event_in_the_order_they_were_made;
}
