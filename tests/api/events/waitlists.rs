//! Waiting lists as events: every change of an entry (its joining, each
//! change of status) is one `WAITLIST_CHANGED` event, in the entry's
//! version order, the offered ones naming the offer's reservation, so a
//! shop can email a customer the moment an offer exists.

use std::{collections::BTreeMap, time::Duration};

use futures::FutureExt;
use serde_json::{Value, json};
use stockguard::auth::Role;

use super::{CREATE_WEBHOOK, Isolation, assert_in_order, first_arrivals, limits, receiver::Receiver, spawn};
use crate::helpers::{address, at_every_isolation, at_once, eventually, retried, uuid};

const JOIN: &str = "mutation($input: JoinWaitlistInput!) { joinWaitlist(input: $input) { __typename
  ... on WaitlistJoined { entry { id } } } }";
const LEAVE: &str = "mutation($id: UUID!) { leaveWaitlist(id: $id) { id status } }";
const CHECKOUT: &str = "mutation($input: CheckoutInput!) { checkout(input: $input) { __typename } }";

/// Two units held by two customers, three more in line (A, B, C): both
/// holds released at once (A and B offered), A releases its offer (C
/// offered), B checks out (CLAIMED), C leaves (LEFT). The receiver gets
/// exactly three events per entry, versions 1 to 3 in order, with the
/// statuses each went through, and the OFFERED ones name the offer.
async fn each_entry_change_is_one_event_in_its_order(isolation: Isolation) {
    let app = spawn(isolation, limits(&[0.05, 0.05, 0.05])).await;
    let receiver = Receiver::start().await;
    let input = json!({ "input": { "url": receiver.url,
        "events": ["STOCK_CHANGED", "RESERVATION_CHANGED", "ORDER_CHANGED", "WAITLIST_CHANGED"] } });
    let created = app.mutate(&app.operator(), "createWebhook", CREATE_WEBHOOK, input).await;
    assert!(created["secret"].is_string(), "{created}");
    let item = app.create_inventory("EV-WAIT", 2).await;
    let mut holds = Vec::new();
    for n in 0..2 {
        let token = app.token(&format!("ev-wh-{n}"), Role::Customer);
        let reserved = app.reserve(&token, json!({ "inventoryId": item, "quantity": 1 })).await;
        holds.push((token, reserved["reservation"]["id"].as_str().expect("held").to_owned()));
    }
    let mut entries = BTreeMap::new();
    for who in ["ev-wa", "ev-wb", "ev-wc"] {
        let token = app.token(who, Role::Customer);
        let input = json!({ "input": { "inventoryId": item } });
        let joined = app.mutate(&token, "joinWaitlist", JOIN, input).await;
        entries.insert(who, (token, uuid(&joined["entry"]["id"])));
    }
    let releases = holds.into_iter().map(|(token, id)| {
        let app = app.clone();
        async move { retried(|| app.release(&token, &id)).await }.boxed()
    });
    for released in at_once(releases.collect()).await {
        assert_eq!(released["__typename"], "ReservationReleased", "{released}");
    }
    let offer_of = |who: &str| {
        let app = app.clone();
        let sql = format!(
            "SELECT id FROM reservations WHERE user_id = '{who}' AND inventory_id = '{item}' AND waitlist_entry_id IS NOT NULL"
        );
        async move { app.rows(&sql).await[0]["id"].as_str().expect("an offer").to_owned() }
    };
    let (a, b, c) = (offer_of("ev-wa").await, offer_of("ev-wb").await, &entries["ev-wc"]);
    assert_eq!(app.release(&entries["ev-wa"].0, &a).await["__typename"], "ReservationReleased");
    let checkout = json!({ "input": { "reservationIds": [b], "shippingAddress": address("2 Line Lane") } });
    let placed = app.mutate(&entries["ev-wb"].0, "checkout", CHECKOUT, checkout).await;
    assert_eq!(placed["__typename"], "OrderPlaced", "{placed}");
    let c_offer = offer_of("ev-wc").await;
    let left = app.graphql(Some(&c.0), LEAVE, json!({ "id": c.1 })).await;
    assert_eq!(left["data"]["leaveWaitlist"]["status"], "LEFT", "{left}");

    let waitlist_events =
        |first: &[Value]| -> Vec<Value> { first.iter().filter(|e| e["type"] == "WAITLIST_CHANGED").cloned().collect() };
    eventually(Duration::from_secs(30), "nine waiting list events delivered", || {
        let receiver = receiver.clone();
        async move { waitlist_events(&first_arrivals(&receiver.accepted_events())).len() >= 9 }
    })
    .await;
    let first = first_arrivals(&receiver.accepted_events());
    assert_in_order(&first);
    let events = waitlist_events(&first);
    assert_eq!(events.len(), 9, "{events:?}");
    let expected = [
        ("ev-wa", ["WAITING", "OFFERED", "LEFT"], a.clone()),
        ("ev-wb", ["WAITING", "OFFERED", "CLAIMED"], b.clone()),
        ("ev-wc", ["WAITING", "OFFERED", "LEFT"], c_offer.clone()),
    ];
    for (who, statuses, offer) in expected {
        let id = entries[who].1;
        let of_entry: Vec<&Value> = events.iter().filter(|e| e["entryId"] == json!(id)).collect();
        let seen: Vec<(&Value, &Value)> = of_entry.iter().map(|e| (&e["version"], &e["data"]["status"])).collect();
        let wanted: Vec<(Value, Value)> = statuses.iter().enumerate().map(|(n, s)| (json!(n + 1), json!(s))).collect();
        assert_eq!(seen, wanted.iter().map(|(v, s)| (v, s)).collect::<Vec<_>>(), "{who}: {of_entry:?}");
        assert_eq!(of_entry[0]["data"]["reservationId"], Value::Null, "{who} waiting: no offer yet");
        assert_eq!(of_entry[1]["data"]["reservationId"], json!(offer), "{who}: the offer named");
    }
}

at_every_isolation! {
    each_entry_change_is_one_event_in_its_order;
}
