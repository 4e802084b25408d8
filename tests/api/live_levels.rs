//! `inventoryChanged` carries the levels: every event's levels add up to
//! the inventory's own numbers and show each change at the location where
//! it happened, for a transfer (one change, stock unchanged), a reserve
//! split over two locations, a checkout (the states move, the version
//! stays) and a cancellation (each unit back where it came from); and they
//! still add up while reserves and transfers race, at every isolation level.

use std::sync::Arc;

use futures::FutureExt;
use serde_json::{Value, json};
use stockguard::auth::Role;

use crate::{
    helpers::{Isolation, TestApp, address, at_every_isolation, at_once, named, uuid},
    live::until_watched,
    locations::{create_location, default_location, stocked},
    transfers::transfer,
    ws::{connect, next, send},
};

/// The live inventory with its own numbers and its levels.
const LEVELS_SUBSCRIPTION: &str = "subscription($id: UUID!) { inventoryChanged(id: $id) {
  version stock available reserved committed onHand
  levels { location { code } available reserved committed onHand } } }";

/// One level as an event shows it: `(code, [available, reserved, committed, onHand])`.
type Level = (String, [i64; 4]);

/// One event: `(version, stock, levels)`.
type Event = (i64, i64, Vec<Level>);

/// The next event, after checking that its levels add up to its own stock
/// states. Its `version` and `stock` are the announced row's, while the
/// states and levels are read as it is sent, so only a caller that waited
/// for each change may expect `stock` to equal their `available`.
async fn next_event(socket: &mut crate::ws::Socket) -> Event {
    let message = next(socket).await;
    let inventory = &message["payload"]["data"]["inventoryChanged"];
    let n = |value: &Value, name: &str| value[name].as_i64().unwrap_or_else(|| panic!("{name} in {message}"));
    let states = |value: &Value| ["available", "reserved", "committed", "onHand"].map(|name| n(value, name));
    let levels: Vec<Level> = inventory["levels"]
        .as_array()
        .unwrap_or_else(|| panic!("levels in {message}"))
        .iter()
        .map(|level| (level["location"]["code"].as_str().expect("code").to_owned(), states(level)))
        .collect();
    let sums = levels.iter().fold([0; 4], |sums, (_, level)| std::array::from_fn(|i| sums[i] + level[i]));
    assert_eq!(sums, states(inventory), "the levels add up to the inventory's states: {message}");
    (n(inventory, "version"), n(inventory, "stock"), levels)
}

/// Subscribes to `item` with its levels on a new socket.
async fn subscribe(app: &TestApp, item: uuid::Uuid) -> crate::ws::Socket {
    let mut socket = connect(&app.address, "graphql-transport-ws").await;
    let payload = json!({ "query": LEVELS_SUBSCRIPTION, "variables": { "id": item } });
    send(&mut socket, json!({ "id": "1", "type": "subscribe", "payload": payload })).await;
    until_watched(app, item).await;
    socket
}

/// The expected levels of `default` and `b`.
fn levels(default: [i64; 4], b: [i64; 4]) -> Vec<Level> {
    vec![("default".to_owned(), default), ("b".to_owned(), b)]
}

#[tokio::test(flavor = "multi_thread")]
async fn a_subscriber_sees_each_change_at_the_location_where_it_happened() {
    let app = TestApp::spawn().await;
    let item = stocked(&app, "LIVE-LEVELS", 10).await;
    let (default, b) = (default_location(&app).await, create_location(&app, "b", 10).await);
    let mut socket = subscribe(&app, item).await;

    // Each event is awaited before the next change is made: the levels are
    // read when the event is sent, so they show the state it announces.
    let input = json!({ "inventoryId": item, "fromLocationId": default, "toLocationId": b, "quantity": 4 });
    assert_eq!(transfer(&app, &app.operator(), input).await["__typename"], "StockTransferred");
    let moved = next_event(&mut socket).await;
    assert_eq!(moved, (2, 10, levels([6, 0, 0, 6], [4, 0, 0, 4])), "a transfer: one change, stock unchanged");

    // `b` first: all four of its units, and the fifth from `default`.
    let alice = app.token("alice", Role::Customer);
    let split = json!({ "inventoryId": item, "quantity": 5, "locationIds": [b, default] });
    let reserved = app.reserve(&alice, split).await;
    assert_eq!(reserved["__typename"], "Reserved", "{reserved}");
    assert_eq!(next_event(&mut socket).await, (3, 5, levels([5, 1, 0, 6], [0, 4, 0, 4])), "reserved, split");

    let cart = json!({ "reservationIds": [reserved["reservation"]["id"]], "shippingAddress": address("1 Level St") });
    let placed = app.checkout(&alice, cart).await;
    assert_eq!(placed["__typename"], "OrderPlaced", "{placed}");
    let checked_out = next_event(&mut socket).await;
    assert_eq!(checked_out, (3, 5, levels([5, 0, 1, 6], [0, 0, 4, 4])), "committed at the same locations");

    let cancelled = app.cancel(&alice, uuid(&placed["order"]["id"])).await;
    assert_eq!(cancelled["__typename"], "OrderCancelled", "{cancelled}");
    let back = next_event(&mut socket).await;
    assert_eq!(back, (4, 10, levels([6, 0, 0, 6], [4, 0, 0, 4])), "each unit back where it came from");
    app.assert_invariant().await;
}

/// Reserves of 1 to 3 units preferring either location and transfers in
/// both directions, all at once, while a subscriber watches: every event's
/// levels add up to its states (they are one statement's), the events come
/// in version order, and the last one shows the levels as they are.
async fn events_add_up_while_reserves_and_transfers_race(isolation: Isolation) {
    let app = Arc::new(TestApp::spawn_with(isolation).await);
    let item = stocked(&app, "LIVE-RACE", 60).await;
    let (default, b) = (default_location(&app).await, create_location(&app, "b", 10).await);
    let setup = json!({ "inventoryId": item, "fromLocationId": default, "toLocationId": b, "quantity": 30 });
    assert_eq!(transfer(&app, &app.operator(), setup).await["__typename"], "StockTransferred");
    let mut socket = subscribe(&app, item).await;

    let alice = app.token("alice", Role::Customer);
    let requests = (0..40)
        .map(|n| {
            let (app, alice) = (app.clone(), alice.clone());
            let (first, second) = if n % 2 == 0 { (default, b) } else { (b, default) };
            async move {
                if n % 4 < 2 {
                    let input = json!({ "inventoryId": item, "quantity": 1 + n % 3, "locationIds": [first, second] });
                    named(app.reserve(&alice, input).await)
                } else {
                    let input =
                        json!({ "inventoryId": item, "fromLocationId": first, "toLocationId": second, "quantity": 2 });
                    named(transfer(&app, &app.operator(), input).await)
                }
            }
            .boxed()
        })
        .collect();
    let answers = at_once(requests).await;
    let changed = answers.iter().filter(|(name, _)| name == "Reserved" || name == "StockTransferred").count();
    let settled = changed + answers.iter().filter(|(name, _)| name == "SoldOut" || name == "Conflict").count();
    assert_eq!(settled, answers.len(), "no errors: {answers:?}");

    let last = 2 + i64::try_from(changed).expect("changed");
    let mut seen = 2;
    let mut levels = Vec::new();
    while seen < last {
        let (version, _, event_levels) = next_event(&mut socket).await;
        assert!(version > seen, "events in version order: {version} after {seen}");
        (seen, levels) = (version, event_levels);
    }
    let now = crate::locations::levels_of(&app, item).await;
    let shown: Vec<(String, i64)> = levels.iter().map(|(code, level)| (code.clone(), level[0])).collect();
    assert_eq!(shown, now, "the last event shows the levels as they are");
    app.assert_invariant().await;
}

at_every_isolation! {
    events_add_up_while_reserves_and_transfers_race;
}
