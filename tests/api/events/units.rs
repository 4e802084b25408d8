//! The units a `STOCK_CHANGED` event reports: after a mix of every kind of
//! change, made at once by many callers, and on an inventory with a past
//! from before the endpoint, each event's `available`, `reserved`,
//! `committed` and `onHand` add up, and each inventory's last event says
//! what the API says it holds.

use std::{
    collections::{BTreeMap, BTreeSet},
    time::Duration,
};

use futures::FutureExt;
use serde_json::{Value, json};
use stockguard::auth::Role;
use uuid::Uuid;

use super::{
    Isolation, first_arrivals, limits, receiver::Receiver, reserve_at_once, spawn, stock_changes, subscribe,
    until_delivered,
};
use crate::helpers::{address, at_every_isolation, at_once, eventually, uuid};

/// Reserves, releases, changes of quantity, checkouts, orders placed,
/// cancelled and fulfilled, restocks: the events' units agree with the API.
async fn stock_events_carry_the_units_after_each_change(isolation: Isolation) {
    let app = spawn(isolation, limits(&[0.05, 0.05, 0.05])).await;
    let operator = app.operator();
    // A past the pump never followed: reservations and an order from before
    // any endpoint.
    let old = app.create_inventory("EV-UNITS-OLD", 40).await;
    let early = app.token("ev-early", Role::Customer);
    for _ in 0..3 {
        assert_eq!(app.reserve(&early, json!({ "inventoryId": old, "quantity": 2 })).await["__typename"], "Reserved");
    }
    let order = json!({ "items": [{ "inventoryId": old, "quantity": 1 }], "shippingAddress": address("1 Early St") });
    let early_order = uuid(&app.place_order(&early, order).await["order"]["id"]);

    let receiver = Receiver::start().await;
    subscribe(&app, &receiver).await;
    let new = app.create_inventory("EV-UNITS-NEW", 30).await;
    let items = [old, new];

    let reserves = (0..24).map(|n| {
        let app = app.clone();
        async move {
            let token = app.token(&format!("ev-units-{n}"), Role::Customer);
            let reserved = app.reserve(&token, json!({ "inventoryId": items[n % 2], "quantity": 1 + n % 3 })).await;
            (token, reserved)
        }
        .boxed()
    });
    let granted: Vec<(String, Value)> =
        at_once(reserves.collect()).await.into_iter().filter(|(_, r)| r["__typename"] == "Reserved").collect();
    assert!(granted.len() >= 20, "{} reserves granted", granted.len());

    let mut changes = Vec::new();
    for (n, (token, reserved)) in granted.iter().enumerate() {
        let (app, token, id) = (app.clone(), token.clone(), reserved["reservation"]["id"].clone());
        changes.push(
            async move {
                let id = id.as_str().expect("an id").to_owned();
                match n % 4 {
                    0 => app.release(&token, &id).await,
                    1 => app.change_quantity(&token, &id, 4).await,
                    2 => {
                        let input = json!({ "reservationIds": [id], "shippingAddress": address("2 Cart St") });
                        app.checkout(&token, input).await
                    }
                    _ => json!({ "__typename": "Kept" }),
                }
            }
            .boxed(),
        );
    }
    let (app2, operator2) = (app.clone(), operator.clone());
    changes.push(async move { app2.restock(&operator2, json!({ "inventoryId": new, "quantity": 5 })).await }.boxed());
    let outcomes = at_once(changes).await;
    let orders: Vec<Uuid> =
        outcomes.iter().filter(|o| o["__typename"] == "OrderPlaced").map(|o| uuid(&o["order"]["id"])).collect();
    assert!(orders.len() >= 2, "checkouts placed orders: {outcomes:?}");
    assert_eq!(app.cancel(&operator, orders[0]).await["__typename"], "OrderCancelled");
    for order in [orders[1], early_order] {
        assert_eq!(app.confirm(&operator, order).await["__typename"], "OrderConfirmed");
        assert_eq!(app.fulfill(&operator, order).await["__typename"], "OrderFulfilled");
    }

    // A checkout changes no version: it counts from the next one pumped
    // after it, so one more change of each inventory follows once every
    // checkout has been pumped.
    eventually(Duration::from_secs(20), "every checkout pumped", || {
        let app = app.clone();
        async move { app.count("SELECT count(*) FROM events").await == 0 }
    })
    .await;
    for item in items {
        app.restock(&operator, json!({ "inventoryId": item, "quantity": 1 })).await;
    }
    eventually(Duration::from_secs(30), "the last change of each inventory delivered", || {
        let (receiver, app) = (receiver.clone(), app.clone());
        async move {
            let delivered = stock_changes(&receiver.accepted_events());
            let (old_last, new_last) = (app.stock_and_version(old).await.1, app.stock_and_version(new).await.1);
            delivered.contains(&(old, i64::from(old_last))) && delivered.contains(&(new, i64::from(new_last)))
        }
    })
    .await;

    let first = first_arrivals(&receiver.accepted_events());
    let mut last: BTreeMap<Uuid, &Value> = BTreeMap::new();
    for event in first.iter().filter(|e| e["type"] == "STOCK_CHANGED") {
        let data = &event["data"];
        let unit = |name: &str| data[name].as_i64().unwrap_or_else(|| panic!("{name} in {event}"));
        let [available, reserved, committed, on_hand] = ["available", "reserved", "committed", "onHand"].map(unit);
        assert_eq!(on_hand, available + reserved + committed, "{event}");
        assert!(reserved >= 0 && committed >= 0, "{event}");
        let item = uuid(&event["inventoryId"]);
        if last.get(&item).is_none_or(|before| before["version"].as_i64() < event["version"].as_i64()) {
            last.insert(item, event);
        }
    }
    for item in items {
        let data = &last.get(&item).unwrap_or_else(|| panic!("no event of {item}"))["data"];
        let reported = ["available", "reserved", "committed", "onHand"].map(|name| data[name].as_i64().expect(name));
        assert_eq!(reported, app.states(item).await, "the last event of {item} against the API: {data}");
    }
    app.assert_invariant().await;
}

/// The units the pump keeps of an inventory (`event_stock`), with the
/// row version that wrote them.
async fn kept(app: &crate::helpers::TestApp, item: Uuid) -> Value {
    let sql =
        format!("SELECT xmin::text AS written, on_hand, committed FROM event_stock WHERE inventory_id = '{item}'");
    app.rows(&sql).await.pop().unwrap_or_else(|| panic!("no units kept of {item}"))
}

/// Waits until the receiver has the stock change of `item`'s current version.
async fn until_sent(app: &crate::helpers::TestApp, receiver: &Receiver, item: Uuid) {
    let version = i64::from(app.stock_and_version(item).await.1);
    until_delivered(receiver, &BTreeSet::from([(item, version)]), Duration::from_secs(30), "the last change delivered")
        .await;
}

/// Reservations, made at once, change neither the units on hand nor the
/// committed ones: the pump sends their events without writing the units
/// it keeps again; a restock changes them, and they are written.
async fn reservations_leave_the_kept_units_unwritten(isolation: Isolation) {
    let app = spawn(isolation, limits(&[0.05, 0.05, 0.05])).await;
    let receiver = Receiver::start().await;
    subscribe(&app, &receiver).await;
    let item = app.create_inventory("EV-KEPT", 30).await;
    until_sent(&app, &receiver, item).await;
    let before = kept(&app, item).await;
    reserve_at_once(&app, item, 12, "ev-kept").await;
    until_sent(&app, &receiver, item).await;
    assert_eq!(kept(&app, item).await, before, "the units kept, as they were");
    app.restock(&app.operator(), json!({ "inventoryId": item, "quantity": 5 })).await;
    until_sent(&app, &receiver, item).await;
    let after = kept(&app, item).await;
    assert_ne!(after["written"], before["written"], "written again");
    assert_eq!(after["on_hand"].as_i64(), before["on_hand"].as_i64().map(|units| units + 5), "{after}");
}

at_every_isolation! {
    stock_events_carry_the_units_after_each_change;
    reservations_leave_the_kept_units_unwritten;
}
