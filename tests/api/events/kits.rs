//! Kits as events: a kit reservation's change is one change of each
//! component's inventory, so one `STOCK_CHANGED` per component, and one
//! `RESERVATION_CHANGED` per component reservation whose status moved,
//! each naming the kit reservation (`data.kitReservationId`), the
//! checkout's too; a plain reservation's names none.

use std::time::Duration;

use serde_json::{Value, json};
use stockguard::auth::Role;

use super::{
    Isolation, assert_in_order, committed_changes, first_arrivals, limits, receiver::Receiver, spawn, stock_changes,
    subscribe, until_delivered,
};
use crate::{
    documents::{CHECKOUT_KITS, RELEASE_KIT},
    helpers::{address, eventually, uuid},
    kits::{kit_of, reserve_kit},
    locations::stocked,
};

#[tokio::test(flavor = "multi_thread")]
async fn a_kit_reservations_events_are_its_components_each_naming_the_kit_reservation() {
    let app = spawn(Isolation::ReadCommitted, limits(&[0.05, 0.05, 0.05])).await;
    let receiver = Receiver::start().await;
    subscribe(&app, &receiver).await;
    let (a, b) = (stocked(&app, "EV-KIT-A", 10).await, stocked(&app, "EV-KIT-B", 10).await);
    let kit =
        kit_of(&app, "EV-KIT", json!([{ "inventoryId": a, "quantity": 2 }, { "inventoryId": b, "quantity": 1 }])).await;
    let alice = app.token("alice", Role::Customer);
    let released = reserve_kit(&app, &alice, kit, 1, json!({})).await;
    let released_id = released["kitReservation"]["id"].clone();
    app.mutate(&alice, "releaseKitReservation", RELEASE_KIT, json!({ "id": released_id })).await;
    let ordered = reserve_kit(&app, &alice, kit, 1, json!({})).await;
    let ordered_id = ordered["kitReservation"]["id"].clone();
    let checkout =
        json!({ "input": { "kitReservationIds": [ordered_id], "shippingAddress": address("1 Event Road") } });
    assert_eq!(app.mutate(&alice, "checkout", CHECKOUT_KITS, checkout).await["__typename"], "OrderPlaced");
    let plain = app.reserve(&alice, json!({ "inventoryId": a, "quantity": 1 })).await;

    let committed = committed_changes(&app, &[a, b]).await;
    // Each inventory's creation, each kit's reserve (a change of each component), the first's release, the plain reserve.
    assert_eq!(committed.len(), 2 + 2 + 2 + 2 + 1);
    until_delivered(&receiver, &committed, Duration::from_secs(30), "every stock change delivered").await;
    let first = first_arrivals(&receiver.accepted_events());
    assert_in_order(&first);
    assert_eq!(stock_changes(&first).len(), committed.len(), "one per change of each component");
    // Nine status changes: each kit's two components reserved, the first's released, the second's checked out.
    eventually(Duration::from_secs(30), "every reservation change delivered", || {
        let receiver = receiver.clone();
        async move {
            let events = first_arrivals(&receiver.accepted_events());
            events.iter().filter(|e| e["type"] == "RESERVATION_CHANGED").count() >= 9
        }
    })
    .await;
    let first = first_arrivals(&receiver.accepted_events());
    let changes: Vec<&Value> = first.iter().filter(|e| e["type"] == "RESERVATION_CHANGED").collect();
    let named = |id: &Value, status: &str| {
        changes.iter().filter(|e| e["data"]["kitReservationId"] == *id && e["data"]["status"] == status).count()
    };
    assert_eq!((named(&released_id, "ACTIVE"), named(&released_id, "RELEASED")), (2, 2), "{changes:?}");
    assert_eq!((named(&ordered_id, "ACTIVE"), named(&ordered_id, "ORDERED")), (2, 2), "{changes:?}");
    let plain_id = plain["reservation"]["id"].clone();
    let plain_changes: Vec<&&Value> = changes.iter().filter(|e| e["data"]["reservationId"] == plain_id).collect();
    assert_eq!(plain_changes.len(), 1);
    assert_eq!(plain_changes[0]["data"]["kitReservationId"], Value::Null, "a reservation of its own names no kit");
    let part = uuid(&released["kitReservation"]["reservations"][0]["id"]);
    assert!(changes.iter().any(|e| e["data"]["reservationId"] == json!(part)), "each component is named");
}
