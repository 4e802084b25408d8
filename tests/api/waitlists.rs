//! Waiting lists, tried from outside: customers who could not get an item
//! join its line; every unit freed while they wait (a release, an expiry,
//! a restock, a cancelled order, a leaving entry) goes to the first of them
//! in the statement that frees it, and nobody reserving at the same time
//! gets one. Each scenario runs at every isolation level, and the
//! invariant is read from the database after it.

use std::{sync::Arc, time::Duration};

use futures::FutureExt;
use sea_orm::ConnectionTrait;
use serde_json::{Value, json};
use stockguard::{auth::Role, config::Limits};
use uuid::Uuid;

use crate::{
    helpers::{
        Isolation, Options, TestApp, address, at_every_isolation, at_once, eventually, retried, sweep_all, uuid,
    },
    locations::{create_location, default_location},
    process::Process,
    returns::{fulfilled_order, line},
    stock_ops::{adjust, set_safety},
    transfers::transfer,
};

const JOIN: &str = "mutation($input: JoinWaitlistInput!) { joinWaitlist(input: $input) { __typename
  ... on WaitlistJoined { entry { id status position quantity offer { id status quantity userId } } }
  ... on NotSoldOut { available } ... on InventoryNotFound { inventoryId } } }";
const LEAVE: &str = "mutation($id: UUID!) { leaveWaitlist(id: $id) { id status } }";
const MINE: &str = "{ myWaitlistEntries(first: 50) { nodes { id status position offer { id status userId } } } }";
const LINE: &str = "query($i: UUID!) { waitlist(inventoryId: $i, first: 100) { nodes { id userId status position } } }";
const CHECKOUT: &str = "mutation($input: CheckoutInput!) { checkout(input: $input) { __typename
  ... on OrderPlaced { order { id } } } }";
const CANCEL: &str = "mutation($id: UUID!) { cancelOrder(id: $id) { __typename } }";

/// A server whose offers live `offer_secs` and whose sweeper stays out of
/// the way: the tests expire holds and sweep by hand.
async fn spawn(isolation: Isolation, offer_secs: i32) -> Arc<TestApp> {
    let limits = Limits { waitlist_offer_secs: offer_secs, sweep_interval_ms: 3_600_000, ..Limits::default() };
    Arc::new(TestApp::spawn_with_options(Options { isolation, limits, ..Options::default() }).await)
}

/// `who` joins the line of `item` for `quantity` units; the answer.
async fn join(app: &TestApp, who: &str, item: Uuid, quantity: i32) -> Value {
    let token = app.token(who, Role::Customer);
    let input = json!({ "input": { "inventoryId": item, "quantity": quantity } });
    retried(|| app.mutate(&token, "joinWaitlist", JOIN, input.clone())).await
}

/// `who` joins and is in line: the entry's id.
async fn joined(app: &TestApp, who: &str, item: Uuid, quantity: i32) -> Uuid {
    let answer = join(app, who, item, quantity).await;
    assert_eq!(answer["__typename"], "WaitlistJoined", "{answer}");
    assert_eq!(answer["entry"]["status"], "WAITING", "{answer}");
    uuid(&answer["entry"]["id"])
}

/// Each entry's status, from the database, by the customer's name.
async fn statuses(app: &TestApp, item: Uuid) -> Vec<(String, String, i64)> {
    let rows = app
        .rows(&format!("SELECT user_id, status, held FROM waitlist_entries WHERE inventory_id = '{item}' ORDER BY seq"))
        .await;
    rows.iter()
        .map(|r| {
            (
                r["user_id"].as_str().expect("text").to_owned(),
                r["status"].as_str().expect("text").to_owned(),
                r["held"].as_i64().expect("a number"),
            )
        })
        .collect()
}

/// The ACTIVE offer reservation of `who` for `item` and its units, from the database.
async fn offered_units(app: &TestApp, who: &str, item: Uuid) -> i64 {
    app.count(&format!(
        "SELECT coalesce(sum(quantity), 0) FROM reservations
          WHERE inventory_id = '{item}' AND user_id = '{who}' AND status = 'ACTIVE'
            AND waitlist_entry_id IS NOT NULL AND expires_at > now()"
    ))
    .await
}

/// Sells `item` (of `units` units) out to `units` customers `<prefix>-<n>`;
/// their reservations' ids with their tokens.
async fn sell_out(app: &Arc<TestApp>, item: Uuid, units: usize, prefix: &str) -> Vec<(String, String)> {
    let mut held = Vec::new();
    for n in 0..units {
        let token = app.token(&format!("{prefix}-{n}"), Role::Customer);
        let reserved = app.reserve(&token, json!({ "inventoryId": item, "quantity": 1 })).await;
        assert_eq!(reserved["__typename"], "Reserved", "{reserved}");
        held.push((token, reserved["reservation"]["id"].as_str().expect("text").to_owned()));
    }
    held
}

/// A sold-out item of 4 units; E (1 unit), A (1), B (2), C (1) and D (1)
/// join its line in that order. While the four holds are released at once,
/// 24 other customers try to reserve it at the same instant: none of them
/// gets a unit; E, A and B are offered, C and D still wait. The offers are ACTIVE reservations of their
/// customers, the line's reads agree, and the invariant holds.
async fn freed_units_go_to_the_line_in_order_and_nobody_snipes(isolation: Isolation) {
    let app = spawn(isolation, 900).await;
    let item = app.create_inventory("WL-DROP", 4).await;
    let held = sell_out(&app, item, 4, "wl-first").await;
    for (who, quantity) in [("wl-early", 1), ("wl-a", 1), ("wl-b", 2), ("wl-c", 1), ("wl-d", 1)] {
        joined(&app, who, item, quantity).await;
    }
    let releases = held.into_iter().map(|(token, id)| {
        let app = app.clone();
        async move { retried(|| app.release(&token, &id)).await["__typename"].as_str().unwrap_or("ERROR").to_owned() }
            .boxed()
    });
    let snipers = (0..24).map(|n| {
        let (app, token) = (app.clone(), app.token(&format!("wl-sniper-{n}"), Role::Customer));
        async move {
            let input = json!({ "inventoryId": item, "quantity": 1 });
            retried(|| app.reserve(&token, input.clone())).await["__typename"].as_str().unwrap_or("ERROR").to_owned()
        }
        .boxed()
    });
    let answers = at_once(releases.chain(snipers).collect()).await;
    assert!(answers[..4].iter().all(|a| a == "ReservationReleased"), "{answers:?}");
    assert!(answers[4..].iter().all(|a| a == "SoldOut"), "a sniper got a unit: {answers:?}");
    eprintln!("freed_units_go_to_the_line_in_order_and_nobody_snipes {isolation:?}: {:?}", tally(&answers));
    // wl-early joined first of all: it was in line before A.
    let line = statuses(&app, item).await;
    let status = |who: &str| line.iter().find(|(u, ..)| u == who).map(|(_, s, h)| (s.clone(), *h)).expect("in line");
    assert_eq!(status("wl-early"), ("OFFERED".into(), 1), "{line:?}");
    assert_eq!(status("wl-a"), ("OFFERED".into(), 1), "{line:?}");
    assert_eq!(status("wl-b"), ("OFFERED".into(), 2), "{line:?}");
    assert_eq!(status("wl-c"), ("WAITING".into(), 0), "{line:?}");
    assert_eq!(status("wl-d"), ("WAITING".into(), 0), "{line:?}");
    for (who, units) in [("wl-early", 1), ("wl-a", 1), ("wl-b", 2), ("wl-c", 0)] {
        assert_eq!(offered_units(&app, who, item).await, units, "{who}");
    }
    assert_eq!(app.count(&format!("SELECT stock::bigint FROM inventories WHERE id = '{item}'")).await, 0);
    // Through the API: the line in order, positions of the waiting, the offer is the customer's own hold.
    let line = app.graphql(Some(&app.operator()), LINE, json!({ "i": item })).await;
    let nodes = line["data"]["waitlist"]["nodes"].as_array().expect("a page").clone();
    let order: Vec<&str> = nodes.iter().map(|n| n["userId"].as_str().expect("text")).collect();
    assert_eq!(order, ["wl-early", "wl-a", "wl-b", "wl-c", "wl-d"], "{line}");
    assert_eq!(nodes[3]["position"], 1, "{line}");
    assert_eq!(nodes[4]["position"], 2, "{line}");
    let mine = app.graphql(Some(&app.token("wl-b", Role::Customer)), MINE, json!({})).await;
    let offer = &mine["data"]["myWaitlistEntries"]["nodes"][0]["offer"];
    assert_eq!((offer["status"].as_str(), offer["userId"].as_str()), (Some("ACTIVE"), Some("wl-b")), "{mine}");
    let inventory = app
        .graphql(None, "query($i: UUID!) { inventory(id: $i) { waiting reserved available } }", json!({ "i": item }))
        .await;
    assert_eq!(inventory["data"]["inventory"]["waiting"], 2, "C and D wait for a unit each: {inventory}");
    app.assert_invariant().await;
}

/// A customer who could reserve gets `NotSoldOut` and nothing is written;
/// joining twice returns the one open entry; a key replays; bad input is
/// refused; a stranger's entry cannot be left.
async fn joining_is_only_for_what_cannot_be_reserved(isolation: Isolation) {
    let app = spawn(isolation, 900).await;
    let item = app.create_inventory("WL-OPEN", 3).await;
    let answer = join(&app, "wl-x", item, 3).await;
    assert_eq!(
        (answer["__typename"].as_str(), answer["available"].as_i64()),
        (Some("NotSoldOut"), Some(3)),
        "{answer}"
    );
    assert_eq!(app.count("SELECT count(*) FROM waitlist_entries").await, 0);
    let first = joined(&app, "wl-x", item, 4).await;
    assert_eq!(joined(&app, "wl-x", item, 4).await, first, "the open entry again");
    let token = app.token("wl-y", Role::Customer);
    let keyed = json!({ "input": { "inventoryId": item, "quantity": 5, "idempotencyKey": "k1" } });
    let one = app.mutate(&token, "joinWaitlist", JOIN, keyed.clone()).await;
    let two = app.mutate(&token, "joinWaitlist", JOIN, keyed).await;
    assert_eq!(one["entry"]["id"], two["entry"]["id"], "{one} {two}");
    assert_eq!(one["entry"]["position"], 2, "{one}");
    let unknown = join(&app, "wl-z", Uuid::now_v7(), 1).await;
    assert_eq!(unknown["__typename"], "InventoryNotFound", "{unknown}");
    for input in [
        json!({ "inventoryId": item, "quantity": 0 }),
        json!({ "inventoryId": item, "kitId": item }),
        json!({ "quantity": 1 }),
        json!({ "inventoryId": item, "locationIds": [Uuid::now_v7()] }),
    ] {
        let refused = app.graphql(Some(&token), JOIN, json!({ "input": input })).await;
        assert_eq!(crate::helpers::error_code(&refused), Some("BAD_USER_INPUT"), "{refused}");
    }
    let anonymous = app.graphql(None, JOIN, json!({ "input": { "inventoryId": item } })).await;
    assert_eq!(crate::helpers::error_code(&anonymous), Some("UNAUTHENTICATED"), "{anonymous}");
    let forbidden = app.graphql(Some(&token), LINE, json!({ "i": item })).await;
    assert_eq!(crate::helpers::error_code(&forbidden), Some("FORBIDDEN"), "{forbidden}");
    let stranger = app.graphql(Some(&token), LEAVE, json!({ "id": first })).await;
    assert_eq!(stranger["data"]["leaveWaitlist"], Value::Null, "{stranger}");
    assert_eq!(app.count("SELECT count(*) FROM waitlist_entries WHERE status = 'WAITING'").await, 2);
    app.assert_invariant().await;
}

/// The hand-off: an offer that expires passes its units to the next in
/// line in the sweep that expires it (the entry EXPIRED); one that is
/// checked out makes its entry CLAIMED, and cancelling that order gives the
/// units to the next in line without reopening the entry; a waiting entry
/// that leaves passes the units held for it on. A restock feeds the line
/// first.
async fn offers_pass_on_when_they_expire_are_released_or_cancelled(isolation: Isolation) {
    let app = spawn(isolation, 900).await;
    let item = app.create_inventory("WL-HAND", 1).await;
    let held = sell_out(&app, item, 1, "wl-h").await;
    joined(&app, "wl-1", item, 1).await;
    joined(&app, "wl-2", item, 1).await;
    let three = joined(&app, "wl-3", item, 2).await;
    joined(&app, "wl-4", item, 1).await;
    let (token, id) = &held[0];
    assert_eq!(retried(|| app.release(token, id)).await["__typename"], "ReservationReleased");
    assert_eq!(offered_units(&app, "wl-1", item).await, 1);
    // wl-1's offer runs out (its expiry moved to the past, as time would):
    // the sweep that expires it offers wl-2.
    let due = "UPDATE reservations SET expires_at = now() - interval '1 second' WHERE user_id = 'wl-1'";
    app.db.execute_unprepared(due).await.expect("the offer due");
    assert_eq!(sweep_all(&app.db, 100).await, 1);
    let line = statuses(&app, item).await;
    assert_eq!(line[0].1, "EXPIRED", "{line:?}");
    assert_eq!(line[1].1, "OFFERED", "{line:?}");
    // wl-2 checks its offer out at once: CLAIMED.
    let two = app.token("wl-2", Role::Customer);
    let offer = app
        .rows(&format!("SELECT id FROM reservations WHERE user_id = 'wl-2' AND inventory_id = '{item}'"))
        .await[0]["id"]
        .as_str()
        .expect("wl-2's offer")
        .to_owned();
    let input = json!({ "input": { "reservationIds": [offer], "shippingAddress": address("1 Queue Street") } });
    let placed = app.mutate(&two, "checkout", CHECKOUT, input).await;
    assert_eq!(placed["__typename"], "OrderPlaced", "{placed}");
    assert_eq!(statuses(&app, item).await[1].1, "CLAIMED");
    // A restock of 1: wl-3 wants 2, so the unit is held for it, not sellable.
    let restocked = app.restock(&app.operator(), json!({ "inventoryId": item, "quantity": 1 })).await;
    assert_eq!(restocked["__typename"], "Restocked", "{restocked}");
    assert_eq!(statuses(&app, item).await[2], ("wl-3".into(), "WAITING".into(), 1));
    let sniper =
        app.reserve(&app.token("wl-sniper", Role::Customer), json!({ "inventoryId": item, "quantity": 1 })).await;
    assert_eq!(sniper["__typename"], "SoldOut", "{sniper}");
    // wl-2 cancels the order: its unit joins wl-3's, which is offered; wl-2 stays CLAIMED.
    let order = placed["order"]["id"].as_str().expect("text").to_owned();
    let cancelled = app.mutate(&two, "cancelOrder", CANCEL, json!({ "id": order })).await;
    assert_eq!(cancelled["__typename"], "OrderCancelled", "{cancelled}");
    let line = statuses(&app, item).await;
    assert_eq!(line[1].1, "CLAIMED", "no resurrection: {line:?}");
    assert_eq!(line[2], ("wl-3".into(), "OFFERED".into(), 2), "{line:?}");
    // wl-3 leaves: its offer is released and its two units go to wl-4 (one) and the shelf (one).
    let left = app.graphql(Some(&app.token("wl-3", Role::Customer)), LEAVE, json!({ "id": three })).await;
    assert_eq!(left["data"]["leaveWaitlist"]["status"], "LEFT", "{left}");
    let line = statuses(&app, item).await;
    assert_eq!(line[3], ("wl-4".into(), "OFFERED".into(), 1), "{line:?}");
    assert_eq!(
        app.count(&format!("SELECT stock::bigint FROM inventories WHERE id = '{item}'")).await,
        1,
        "one unit for sale"
    );
    app.assert_invariant().await;
}

at_every_isolation! {
    freed_units_go_to_the_line_in_order_and_nobody_snipes;
    joining_is_only_for_what_cannot_be_reserved;
    offers_pass_on_when_they_expire_are_released_or_cancelled;
}

/// Thirty customers in line (wanting 1, 2 or 3 units each) for an item of
/// 20 units held by 20 others. At one instant: 15 of the holds are
/// released, the other 5 are expired by two sweeps, an operator restocks 3
/// units twice, and 20 more customers try to reserve. Whatever the
/// interleaving, the 26 freed units go to the line in its order: the
/// entries that fit are OFFERED their whole quantity, the next holds the
/// remainder, the rest hold nothing, and no reserver gets a unit. Read from
/// the database, with the invariant (which judges every entry's hold).
async fn racing_frees_offer_each_unit_once_in_order(isolation: Isolation) {
    let app = spawn(isolation, 900).await;
    let item = app.create_inventory("WL-RACE", 20).await;
    let held = sell_out(&app, item, 20, "wl-r").await;
    let wants: Vec<i64> = (0..30).map(|n| 1 + (n * 7 % 3)).collect();
    for (n, quantity) in wants.iter().enumerate() {
        joined(&app, &format!("wl-q{n:02}"), item, *quantity as i32).await;
    }
    let due: Vec<String> = held[15..].iter().map(|(_, id)| format!("'{id}'")).collect();
    let due =
        format!("UPDATE reservations SET expires_at = now() - interval '1 second' WHERE id IN ({})", due.join(","));
    app.db.execute_unprepared(&due).await.expect("five holds due");
    let releases = held[..15].iter().cloned().map(|(token, id)| {
        let app = app.clone();
        async move { retried(|| app.release(&token, &id)).await["__typename"].as_str().unwrap_or("ERROR").to_owned() }
            .boxed()
    });
    let sweeps = (0..2).map(|_| {
        let app = app.clone();
        async move { format!("swept {}", sweep_all(&app.db, 2).await) }.boxed()
    });
    let restocks = (0..2).map(|_| {
        let (app, operator) = (app.clone(), app.operator());
        async move {
            let input = json!({ "inventoryId": item, "quantity": 3 });
            retried(|| app.restock(&operator, input.clone())).await["__typename"].as_str().unwrap_or("ERROR").to_owned()
        }
        .boxed()
    });
    let snipers = (0..20).map(|n| {
        let (app, token) = (app.clone(), app.token(&format!("wl-rs-{n}"), Role::Customer));
        async move {
            let input = json!({ "inventoryId": item, "quantity": 1 });
            retried(|| app.reserve(&token, input.clone())).await["__typename"].as_str().unwrap_or("ERROR").to_owned()
        }
        .boxed()
    });
    let answers = at_once(releases.chain(sweeps).chain(restocks).chain(snipers).collect()).await;
    assert!(answers[..15].iter().all(|a| a == "ReservationReleased"), "{answers:?}");
    let swept: i64 = answers[15..17].iter().map(|a| a["swept ".len()..].parse::<i64>().expect("a count")).sum();
    assert_eq!(swept, 5, "{answers:?}");
    assert!(answers[17..19].iter().all(|a| a == "Restocked"), "{answers:?}");
    assert!(answers[19..].iter().all(|a| a == "SoldOut"), "a reserver got a freed unit: {answers:?}");
    // The model: 26 units down the line in order.
    let mut left = 26;
    let expected: Vec<(String, String, i64)> = wants
        .iter()
        .enumerate()
        .map(|(n, want)| {
            let held = left.min(*want);
            left -= held;
            let status = if held == *want { "OFFERED" } else { "WAITING" };
            (format!("wl-q{n:02}"), status.to_owned(), held)
        })
        .collect();
    assert_eq!(statuses(&app, item).await, expected);
    assert_eq!(app.count(&format!("SELECT stock::bigint FROM inventories WHERE id = '{item}'")).await, 0);
    app.assert_invariant().await;
    eprintln!("racing_frees_offer_each_unit_once_in_order {isolation:?}: {:?}", tally(&answers));
}

at_every_isolation! {
    racing_frees_offer_each_unit_once_in_order;
}

/// Every path that frees units feeds the line, each in its own statement:
/// a smaller quantity, a restocking return, a positive adjustment, a
/// transfer in (from a location whose units are its safety stock), and a
/// release. Eight entries of one unit each are offered one path after
/// another, in the order they joined, and nothing is sellable while one of
/// them waits.
async fn every_path_that_frees_units_feeds_the_line(isolation: Isolation) {
    let app = spawn(isolation, 900).await;
    let operator = app.operator();
    let item = app.create_inventory("WL-PATHS", 10).await;
    let (home, spare) = (default_location(&app).await, create_location(&app, "wl-spare", 50).await);
    let order = fulfilled_order(&app, &[(item, 2)]).await;
    // One unit at the spare location, kept there as its safety stock.
    let moved = transfer(
        &app,
        &operator,
        json!({ "inventoryId": item, "fromLocationId": home,
        "toLocationId": spare, "quantity": 1 }),
    )
    .await;
    assert_eq!(moved["__typename"], "StockTransferred", "{moved}");
    let kept = set_safety(&app, &operator, json!({ "inventoryId": item, "locationId": spare, "quantity": 1 })).await;
    assert!(kept.get("errors").is_none(), "{kept}");
    let holder = app.token("wl-holder", Role::Customer);
    let held = app.reserve(&holder, json!({ "inventoryId": item, "quantity": 7, "locationIds": [home] })).await;
    assert_eq!(held["__typename"], "Reserved", "{held}");
    let hold = held["reservation"]["id"].as_str().expect("a hold").to_owned();
    for n in 0..8 {
        joined(&app, &format!("wl-p{n}"), item, 1).await;
    }
    let offered = |app: Arc<TestApp>| async move {
        statuses(&app, item).await.iter().filter(|(_, status, _)| status == "OFFERED").count()
    };
    let sellable = "SELECT coalesce(sum(greatest(available - safety_stock, 0)), 0)::bigint FROM stock_levels";
    let check = |path: &'static str, answer: Value, n: usize| {
        let app = app.clone();
        async move {
            assert!(answer.get("errors").is_none() && !answer.is_null(), "{path}: {answer}");
            assert_eq!(offered(app.clone()).await, n, "{path} offered the next in line");
            assert_eq!(app.count(&format!("{sellable} WHERE inventory_id = '{item}'")).await, 0, "{path}");
        }
    };
    check("a smaller quantity", app.change_quantity(&holder, &hold, 6).await, 1).await;
    let returned = json!({ "orderId": order, "lines": [line(item, 1, false, None)] });
    check("a restocking return", app.return_order(&operator, returned).await, 2).await;
    let found = json!({ "inventoryId": item, "delta": 1, "reason": "FOUND" });
    check("a positive adjustment", adjust(&app, &operator, found).await, 3).await;
    let back = json!({ "inventoryId": item, "fromLocationId": spare, "toLocationId": home, "quantity": 1 });
    check("a transfer in", transfer(&app, &operator, back).await, 4).await;
    assert_eq!(retried(|| app.release(&holder, &hold)).await["__typename"], "ReservationReleased");
    let line = statuses(&app, item).await;
    assert!(line.iter().all(|(_, status, held)| status == "OFFERED" && *held == 1), "{line:?}");
    assert_eq!(app.count(&format!("{sellable} WHERE inventory_id = '{item}'")).await, 2, "6 released, 4 offered");
    // Nobody waits now: the next units freed at the level clear its flag,
    // and it stops calling the trigger.
    let flagged = format!(
        "SELECT count(*) FROM stock_levels WHERE inventory_id = '{item}' AND location_id = '{home}' AND waiting"
    );
    assert_eq!(app.count(&flagged).await, 1);
    let first = app.rows("SELECT id FROM reservations WHERE user_id = 'wl-p0'").await[0]["id"].clone();
    let released = app.release(&app.token("wl-p0", Role::Customer), first.as_str().expect("an offer")).await;
    assert_eq!(released["__typename"], "ReservationReleased", "{released}");
    assert_eq!(app.count(&flagged).await, 0, "cleared when nobody waits");
    assert_eq!(app.count(&format!("{sellable} WHERE inventory_id = '{item}'")).await, 3);
    app.assert_invariant().await;
}

/// Ten customers send three joins each at once while five of the ten
/// holds on the item are released: each customer has one entry (their
/// three answers name it, or were `NotSoldOut` while a released unit was
/// on the shelf), and whenever an entry waits no unit is sellable. Then
/// everyone leaves at once while an operator restocks 3: every entry is
/// LEFT, no hold is left, and every unit is on the shelf or with its holder.
async fn joins_and_leaves_racing_frees_keep_one_entry_each_and_no_unit_between(isolation: Isolation) {
    let app = spawn(isolation, 900).await;
    let item = app.create_inventory("WL-JOINS", 10).await;
    let held = sell_out(&app, item, 10, "wl-jh").await;
    let joins = (0..30).map(|n| {
        let app = app.clone();
        async move { named_entry(join(&app, &format!("wl-j{}", n % 10), item, 1).await) }.boxed()
    });
    let releases = held[..5].iter().cloned().map(|(token, id)| {
        let app = app.clone();
        async move { (retried(|| app.release(&token, &id)).await["__typename"].to_string(), None) }.boxed()
    });
    let answers = at_once(joins.chain(releases).collect()).await;
    assert!(answers[30..].iter().all(|(name, _)| name == "\"ReservationReleased\""), "{answers:?}");
    for customer in 0..10 {
        let mine: Vec<&(String, Option<Uuid>)> = answers[..30].iter().skip(customer).step_by(10).collect();
        let entries: std::collections::BTreeSet<Uuid> = mine.iter().filter_map(|(_, id)| *id).collect();
        assert!(entries.len() <= 1, "wl-j{customer} has one entry: {mine:?}");
        assert!(mine.iter().all(|(name, _)| name == "WaitlistJoined" || name == "NotSoldOut"), "{mine:?}");
    }
    let waiting = app
        .count(&format!("SELECT count(*) FROM waitlist_entries WHERE inventory_id = '{item}' AND status = 'WAITING'"))
        .await;
    let shelf = app.count(&format!("SELECT stock::bigint FROM inventories WHERE id = '{item}'")).await;
    assert!(waiting == 0 || shelf == 0, "{waiting} wait while {shelf} are sellable");
    assert_eq!(
        app.count(&format!(
            "SELECT count(*) FROM waitlist_entries WHERE inventory_id = '{item}' AND status = 'OFFERED'"
        ))
        .await
            + shelf,
        5
    );
    app.assert_invariant().await;

    let entries = app.rows(&format!("SELECT id, user_id FROM waitlist_entries WHERE inventory_id = '{item}'")).await;
    let leaves = entries.iter().map(|row| {
        let (app, id) = (app.clone(), uuid(&row["id"]));
        let token = app.token(row["user_id"].as_str().expect("a customer"), Role::Customer);
        async move {
            let left = retried(|| app.graphql(Some(&token), LEAVE, json!({ "id": id }))).await;
            left["data"]["leaveWaitlist"]["status"].as_str().unwrap_or("ERROR").to_owned()
        }
        .boxed()
    });
    let restock = {
        let (app, operator) = (app.clone(), app.operator());
        async move {
            let input = json!({ "inventoryId": item, "quantity": 3 });
            retried(|| app.restock(&operator, input.clone())).await["__typename"].as_str().unwrap_or("ERROR").to_owned()
        }
        .boxed()
    };
    let answers = at_once(leaves.chain(std::iter::once(restock)).collect()).await;
    assert_eq!(answers.last().map(String::as_str), Some("Restocked"), "{answers:?}");
    assert!(answers[..answers.len() - 1].iter().all(|a| a == "LEFT"), "{answers:?}");
    assert_eq!(
        app.count(&format!("SELECT count(*) FROM waitlist_entries WHERE inventory_id = '{item}' AND status <> 'LEFT'"))
            .await,
        0
    );
    assert_eq!(
        app.count("SELECT count(*) FROM reservations WHERE waitlist_entry_id IS NOT NULL AND status = 'ACTIVE'").await,
        0
    );
    assert_eq!(
        app.count(&format!("SELECT stock::bigint FROM inventories WHERE id = '{item}'")).await,
        8,
        "5 released, 3 restocked"
    );
    app.assert_invariant().await;
}

/// How many answers of each kind a race got, for the test's log.
fn tally(answers: &[String]) -> std::collections::BTreeMap<&str, usize> {
    answers.iter().fold(std::collections::BTreeMap::new(), |mut counts, answer| {
        *counts.entry(answer.as_str()).or_insert(0) += 1;
        counts
    })
}

/// A join's answer as its union member and entry id.
fn named_entry(answer: Value) -> (String, Option<Uuid>) {
    let name = answer["__typename"].as_str().unwrap_or("ERROR").to_owned();
    let id = answer["entry"]["id"].as_str().map(|_| uuid(&answer["entry"]["id"]));
    (name, id)
}

at_every_isolation! {
    every_path_that_frees_units_feeds_the_line;
    joins_and_leaves_racing_frees_keep_one_entry_each_and_no_unit_between;
}

/// With the server's own sweeper at its default interval, an offer that
/// runs out is followed by the next entry's offer within the interval and
/// a second of its expiry instant (read from the database's clocks).
#[tokio::test(flavor = "multi_thread")]
async fn the_sweeper_hands_an_expired_offer_on_within_its_interval() {
    let limits = Limits { waitlist_offer_secs: 1, ..Limits::default() };
    let app = Arc::new(TestApp::spawn_with_options(Options { limits, ..Options::default() }).await);
    let item = app.create_inventory("WL-TICK", 1).await;
    let held = sell_out(&app, item, 1, "wl-t").await;
    joined(&app, "wl-t1", item, 1).await;
    joined(&app, "wl-t2", item, 1).await;
    let (token, id) = &held[0];
    assert_eq!(retried(|| app.release(token, id)).await["__typename"], "ReservationReleased");
    let second = "SELECT count(*) FROM waitlist_entries WHERE user_id = 'wl-t2' AND status = 'OFFERED'";
    eventually(Duration::from_secs(20), "the second in line offered", || {
        let app = app.clone();
        async move { app.count(second).await == 1 }
    })
    .await;
    let late = app
        .count(
            "SELECT (extract(epoch FROM (SELECT offered_at FROM waitlist_entries WHERE user_id = 'wl-t2')
                   - (SELECT expires_at FROM reservations WHERE user_id = 'wl-t1')) * 1000)::bigint",
        )
        .await;
    let bound = i64::try_from(Limits::default().sweep_interval_ms).expect("ms") + 1000;
    assert!((0..=bound).contains(&late), "offered {late} ms after the expiry (at most {bound})");
    eprintln!("the_sweeper_hands_an_expired_offer_on_within_its_interval: the next offer {late} ms after the expiry");
    assert_eq!(statuses(&app, item).await[0].1, "EXPIRED");
    app.assert_invariant().await;
}

/// A hold that is not its entry's, and a level that would not hand its
/// freed units to a waiting entry (each written directly, as a bug would),
/// are reported by the check, and only they.
#[tokio::test(flavor = "multi_thread")]
async fn the_check_reports_an_entry_whose_hold_does_not_add_up() {
    let app = spawn(Isolation::ReadCommitted, 900).await;
    let item = app.create_inventory("WL-DRIFT", 1).await;
    sell_out(&app, item, 1, "wl-dh").await;
    let entry = joined(&app, "wl-d1", item, 2).await;
    app.assert_invariant().await;
    app.db
        .execute_unprepared(&format!("UPDATE waitlist_entries SET held = 1 WHERE id = '{entry}'"))
        .await
        .expect("broken on purpose");
    let drifts = stockguard::invariant::check(&app.db).await.expect("check");
    assert_eq!(drifts.len(), 1, "{drifts:?}");
    let text = drifts[0].to_string();
    assert!(text.contains(&entry.to_string()) && text.contains("1 of 2 held"), "{text}");
    // A level whose flag a bug cleared while the entry waits would let its
    // freed units be sold: reported too.
    let repaired = format!("UPDATE waitlist_entries SET held = 0 WHERE id = '{entry}'");
    app.db.execute_unprepared(&repaired).await.expect("repaired");
    app.assert_invariant().await;
    let unflagged = format!("UPDATE stock_levels SET waiting = false WHERE inventory_id = '{item}'");
    app.db.execute_unprepared(&unflagged).await.expect("broken on purpose");
    let drifts = stockguard::invariant::check(&app.db).await.expect("check");
    assert_eq!(drifts.len(), 1, "{drifts:?}");
    assert!(drifts[0].to_string().contains("1 levels not flagged waiting"), "{}", drifts[0]);
}

/// Two server processes on one database (a deployment of several): twelve
/// holds released through both at once, an operator restocking 2 through
/// each, and snipers on both. The 16 freed units go down the line of 12
/// entries (1 or 2 units each, 18 in all) in order, each once, and no
/// sniper gets one.
async fn two_processes_freeing_at_once_offer_each_unit_once(isolation: Isolation) {
    let env = [("STOCKGUARD_SWEEP_INTERVAL_MS", "3600000")];
    let (one, two) = Process::start_two(&env, isolation).await;
    let item = one.create_inventory("WL-TWO", 12).await;
    let mut holds = Vec::new();
    for n in 0..12 {
        let token = one.token(&format!("wl-2h{n}"), Role::Customer);
        let input = json!({ "input": { "inventoryId": item, "quantity": 1 } });
        let reserved = ask(&one, &token, RESERVE, input).await;
        holds.push((token, reserved["data"]["reserve"]["reservation"]["id"].as_str().expect("held").to_owned()));
    }
    let wants: Vec<i64> = (0..12).map(|n| 1 + n % 2).collect();
    for (n, want) in wants.iter().enumerate() {
        let token = one.token(&format!("wl-2q{n}"), Role::Customer);
        let joined = ask(&one, &token, JOIN, json!({ "input": { "inventoryId": item, "quantity": want } })).await;
        assert_eq!(joined["data"]["joinWaitlist"]["__typename"], "WaitlistJoined", "{joined}");
    }
    let operator = one.token("operator", Role::Operator);
    let barrier = Arc::new(tokio::sync::Barrier::new(12 + 2 + 10));
    let calls = holds
        .iter()
        .enumerate()
        .map(|(n, (token, id))| (n % 2, token.clone(), RELEASE, json!({ "id": id })))
        .chain(
            (0..2).map(|n| (n, operator.clone(), RESTOCK, json!({ "input": { "inventoryId": item, "quantity": 2 } }))),
        )
        .chain((0..10).map(|n| {
            let token = one.token(&format!("wl-2s{n}"), Role::Customer);
            (n % 2, token, RESERVE, json!({ "input": { "inventoryId": item, "quantity": 1 } }))
        }))
        .map(|(side, token, query, variables)| {
            let (barrier, process) = (barrier.clone(), if side == 0 { &one } else { &two });
            async move {
                barrier.wait().await;
                let body = ask(process, &token, query, variables).await;
                let data = body["data"].as_object().and_then(|d| d.values().next().cloned()).unwrap_or(body);
                data["__typename"].as_str().unwrap_or("ERROR").to_owned()
            }
        });
    let answers = futures::future::join_all(calls).await;
    assert!(answers[..12].iter().all(|a| a == "ReservationReleased"), "{answers:?}");
    assert!(answers[12..14].iter().all(|a| a == "Restocked"), "{answers:?}");
    assert!(answers[14..].iter().all(|a| a == "SoldOut"), "a sniper got a freed unit: {answers:?}");
    let mut left = 16;
    let expected: Vec<String> = wants
        .iter()
        .map(|want| {
            let held = left.min(*want);
            left -= held;
            format!("{}:{held}", if held == *want { "OFFERED" } else { "WAITING" })
        })
        .collect();
    let line = one
        .db
        .query_all_raw(sea_orm::Statement::from_string(
            sea_orm::DbBackend::Postgres,
            format!(
                "SELECT status || ':' || held AS s FROM waitlist_entries WHERE inventory_id = '{item}' ORDER BY seq"
            ),
        ))
        .await
        .expect("the line");
    let line: Vec<String> = line.iter().map(|row| row.try_get("", "s").expect("text")).collect();
    assert_eq!(line, expected);
    assert_eq!(one.count(&format!("SELECT stock::bigint FROM inventories WHERE id = '{item}'")).await, 0);
    eprintln!("two_processes_freeing_at_once_offer_each_unit_once {isolation:?}: {:?}", tally(&answers));
    let drifts = stockguard::invariant::check(&one.db).await.expect("check");
    assert!(drifts.is_empty(), "{drifts:?}");
}

/// `query` through `process` as `token`, sent again (as a client would)
/// while it answers the retryable `DATABASE_UNAVAILABLE`; the body.
async fn ask(process: &Process, token: &str, query: &str, variables: Value) -> Value {
    for _ in 0..10 {
        let (_, body) = process.graphql(Some(token), query, variables.clone()).await.expect("an answer");
        if crate::helpers::error_code(&body) != Some("DATABASE_UNAVAILABLE") {
            return body;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("still unavailable after 10 tries")
}

const RESERVE: &str = "mutation($input: ReserveInput!) { reserve(input: $input) { __typename
  ... on Reserved { reservation { id } } } }";
const RELEASE: &str = "mutation($id: UUID!) { releaseReservation(id: $id) { __typename } }";
const RESTOCK: &str = "mutation($input: RestockInput!) { restock(input: $input) { __typename } }";

at_every_isolation! {
    two_processes_freeing_at_once_offer_each_unit_once;
}

const CHECKOUT_KIT: &str = "mutation($input: CheckoutInput!) { checkout(input: $input) { __typename } }";
const JOIN_KIT: &str = "mutation($input: JoinWaitlistInput!) { joinWaitlist(input: $input) { __typename
  ... on WaitlistJoined { entry { id status position kit { sku waiting } } }
  ... on NotSoldOut { available } ... on KitNotFound { kitId } } }";

/// `who` joins the line of `kit` for `quantity` kits: the entry's id.
async fn joined_kit(app: &TestApp, who: &str, kit: Uuid, quantity: i32) -> Uuid {
    let token = app.token(who, Role::Customer);
    let input = json!({ "input": { "kitId": kit, "quantity": quantity } });
    let answer = retried(|| app.mutate(&token, "joinWaitlist", JOIN_KIT, input.clone())).await;
    assert_eq!(answer["__typename"], "WaitlistJoined", "{answer}");
    uuid(&answer["entry"]["id"])
}

/// `units` units of `item` held by `who`; the reservation's id.
async fn hold(app: &TestApp, who: &str, item: Uuid, units: i32) -> (String, String) {
    let token = app.token(who, Role::Customer);
    let reserved = app.reserve(&token, json!({ "inventoryId": item, "quantity": units })).await;
    assert_eq!(reserved["__typename"], "Reserved", "{reserved}");
    (token, reserved["reservation"]["id"].as_str().expect("an id").to_owned())
}

/// The units of `item` held for (or offered to) `entry`, from the database.
async fn held_for(app: &TestApp, entry: Uuid, item: Uuid) -> i64 {
    app.count(&format!(
        "SELECT coalesce(sum(quantity), 0)::bigint FROM reservations
          WHERE waitlist_entry_id = '{entry}' AND inventory_id = '{item}' AND status = 'ACTIVE'"
    ))
    .await
}

/// A kit of one A and two B, both sold out; a customer waits for a kit,
/// then another for one A. Two A come back: the kit's entry, first in
/// line, holds one (all it needs of A), the A entry is offered the other.
/// Nobody can reserve the kit meanwhile. Two B come back: the kit's entry
/// has every component and is offered them as one kit reservation of its
/// customer, which it checks out (CLAIMED).
async fn a_kit_entry_holds_each_component_and_is_offered_them_whole(isolation: Isolation) {
    let app = spawn(isolation, 900).await;
    let (a, b) = (app.create_inventory("WL-KA", 2).await, app.create_inventory("WL-KB", 2).await);
    let kit = crate::kits::kit_of(
        &app,
        "WL-KIT",
        json!([{ "inventoryId": a, "quantity": 1 }, { "inventoryId": b, "quantity": 2 }]),
    )
    .await;
    let (ha, ra) = hold(&app, "wl-kha", a, 2).await;
    let (hb, rb) = hold(&app, "wl-khb", b, 2).await;
    let kit_entry = joined_kit(&app, "wl-k1", kit, 1).await;
    let a_entry = joined(&app, "wl-k2", a, 1).await;

    assert_eq!(retried(|| app.release(&ha, &ra)).await["__typename"], "ReservationReleased");
    assert_eq!(held_for(&app, kit_entry, a).await, 1, "the kit's entry holds its A");
    assert_eq!(held_for(&app, a_entry, a).await, 1, "the A entry is offered the other");
    let line = statuses(&app, a).await;
    assert_eq!(line, vec![("wl-k2".to_owned(), "OFFERED".to_owned(), 1)], "{line:?}");
    let sniper = app.token("wl-ksniper", Role::Customer);
    let refused = crate::kits::reserve_kit(&app, &sniper, kit, 1, json!({})).await;
    assert_eq!(refused["__typename"], "KitSoldOut", "{refused}");
    let line = app
        .graphql(
            Some(&app.operator()),
            "query($k: UUID!) { waitlist(kitId: $k) { nodes { id status position } } }",
            json!({ "k": kit }),
        )
        .await;
    assert_eq!(line["data"]["waitlist"]["nodes"][0]["position"], 1, "{line}");

    assert_eq!(retried(|| app.release(&hb, &rb)).await["__typename"], "ReservationReleased");
    let offered = app
        .rows(&format!(
            "SELECT e.status, e.kit_reservation_id, k.user_id, k.quantity,
                    (SELECT count(*) FROM reservations r WHERE r.kit_reservation_id = k.id AND r.user_id = 'wl-k1'
                        AND r.status = 'ACTIVE' AND r.expires_at > now()) AS parts
               FROM waitlist_entries e JOIN kit_reservations k ON k.id = e.kit_reservation_id
              WHERE e.id = '{kit_entry}'"
        ))
        .await;
    assert_eq!(offered.len(), 1, "the kit's entry is offered a kit reservation");
    assert_eq!(
        (&offered[0]["status"], &offered[0]["user_id"], &offered[0]["parts"]),
        (&json!("OFFERED"), &json!("wl-k1"), &json!(2))
    );
    let kit_offer = offered[0]["kit_reservation_id"].as_str().expect("an offer").to_owned();
    let waiting =
        app.graphql(None, "query($k: UUID!) { kit(id: $k) { waiting available } }", json!({ "k": kit })).await;
    assert_eq!(waiting["data"]["kit"], json!({ "waiting": 0, "available": 0 }), "{waiting}");
    let input = json!({ "input": { "kitReservationIds": [kit_offer], "shippingAddress": address("3 Kit Court") } });
    let placed = app.mutate(&app.token("wl-k1", Role::Customer), "checkout", CHECKOUT_KIT, input).await;
    assert_eq!(placed["__typename"], "OrderPlaced", "{placed}");
    assert_eq!(
        app.count(&format!("SELECT count(*) FROM waitlist_entries WHERE id = '{kit_entry}' AND status = 'CLAIMED'"))
            .await,
        1
    );
    app.assert_invariant().await;
}

/// A kit's entry holding some of its components leaves: its holds go to
/// the next in line (an entry of one of them). A second kit entry is then
/// offered by a restock and its offer expires: the sweep gives every
/// component back at once and the entry is EXPIRED.
async fn a_kit_entry_that_leaves_or_expires_passes_its_components_on(isolation: Isolation) {
    let app = spawn(isolation, 900).await;
    let (a, b) = (app.create_inventory("WL-LA", 1).await, app.create_inventory("WL-LB", 1).await);
    let kit = crate::kits::kit_of(
        &app,
        "WL-LKIT",
        json!([{ "inventoryId": a, "quantity": 1 }, { "inventoryId": b, "quantity": 1 }]),
    )
    .await;
    let (ha, ra) = hold(&app, "wl-lha", a, 1).await;
    hold(&app, "wl-lhb", b, 1).await;
    let first = joined_kit(&app, "wl-l1", kit, 1).await;
    let a_entry = joined(&app, "wl-l2", a, 1).await;
    assert_eq!(retried(|| app.release(&ha, &ra)).await["__typename"], "ReservationReleased");
    assert_eq!(held_for(&app, first, a).await, 1);
    let left = app.graphql(Some(&app.token("wl-l1", Role::Customer)), LEAVE, json!({ "id": first })).await;
    assert_eq!(left["data"]["leaveWaitlist"]["status"], "LEFT", "{left}");
    assert_eq!(held_for(&app, first, a).await, 0);
    assert_eq!(held_for(&app, a_entry, a).await, 1, "the A entry is offered what the kit's entry held");

    let second = joined_kit(&app, "wl-l3", kit, 1).await;
    let restock = |item: Uuid| json!({ "inventoryId": item, "quantity": 1 });
    assert_eq!(app.restock(&app.operator(), restock(a)).await["__typename"], "Restocked");
    assert_eq!(app.restock(&app.operator(), restock(b)).await["__typename"], "Restocked");
    let offered = format!("SELECT count(*) FROM waitlist_entries WHERE id = '{second}' AND status = 'OFFERED'");
    assert_eq!(app.count(&offered).await, 1);
    let due = "UPDATE reservations SET expires_at = now() - interval '1 second' WHERE user_id = 'wl-l3'";
    app.db.execute_unprepared(due).await.expect("the offer due");
    assert_eq!(sweep_all(&app.db, 100).await, 2, "both components at once");
    let expired = format!("SELECT count(*) FROM waitlist_entries WHERE id = '{second}' AND status = 'EXPIRED'");
    assert_eq!(app.count(&expired).await, 1);
    let shelf = format!("SELECT sum(stock)::bigint FROM inventories WHERE id IN ('{a}', '{b}')");
    assert_eq!(app.count(&shelf).await, 2, "nobody else waits: both units on the shelf");
    app.assert_invariant().await;
}

at_every_isolation! {
    a_kit_entry_holds_each_component_and_is_offered_them_whole;
    a_kit_entry_that_leaves_or_expires_passes_its_components_on;
}

/// A kit of one A and two B; A and B each sold out to 6 holders of one
/// unit. Kit entries and A entries join in turn (kit, A, kit, A, ...: 8
/// A and 8 B wanted, 6 of each there). At one instant the 12 holds are
/// released while snipers reserve A, B and the kit: the units go down each
/// component's line in joining order, so the first three kit entries and
/// the first three A entries are offered, the fourth of each holds
/// nothing, and no sniper gets a unit.
async fn kits_and_inventories_in_one_line_racing_frees_are_served_in_order(isolation: Isolation) {
    let app = spawn(isolation, 900).await;
    let (a, b) = (app.create_inventory("WL-RA", 6).await, app.create_inventory("WL-RB", 6).await);
    let kit = crate::kits::kit_of(
        &app,
        "WL-RKIT",
        json!([{ "inventoryId": a, "quantity": 1 }, { "inventoryId": b, "quantity": 2 }]),
    )
    .await;
    let mut holds = Vec::new();
    for n in 0..6 {
        holds.push(hold(&app, &format!("wl-rha{n}"), a, 1).await);
        holds.push(hold(&app, &format!("wl-rhb{n}"), b, 1).await);
    }
    let mut entries = Vec::new();
    for n in 0..4 {
        entries.push(("kit", joined_kit(&app, &format!("wl-rk{n}"), kit, 1).await));
        entries.push(("a", joined(&app, &format!("wl-ra{n}"), a, 1).await));
    }
    let releases = holds.into_iter().map(|(token, id)| {
        let app = app.clone();
        async move { retried(|| app.release(&token, &id)).await["__typename"].as_str().unwrap_or("ERROR").to_owned() }
            .boxed()
    });
    let snipers = (0..12).map(|n| {
        let (app, token) = (app.clone(), app.token(&format!("wl-rs{n}"), Role::Customer));
        async move {
            let answer = match n % 3 {
                0 => crate::kits::reserve_kit(&app, &token, kit, 1, json!({})).await,
                1 => retried(|| app.reserve(&token, json!({ "inventoryId": a, "quantity": 1 }))).await,
                _ => retried(|| app.reserve(&token, json!({ "inventoryId": b, "quantity": 1 }))).await,
            };
            answer["__typename"].as_str().unwrap_or("ERROR").to_owned()
        }
        .boxed()
    });
    let answers = at_once(releases.chain(snipers).collect()).await;
    assert!(answers[..12].iter().all(|a| a == "ReservationReleased"), "{answers:?}");
    assert!(answers[12..].iter().all(|a| a == "SoldOut" || a == "KitSoldOut"), "a sniper got a unit: {answers:?}");
    for (n, (what, entry)) in entries.iter().enumerate() {
        let expected = if n < 6 { "OFFERED" } else { "WAITING" };
        let status = format!("SELECT count(*) FROM waitlist_entries WHERE id = '{entry}' AND status = '{expected}'");
        assert_eq!(app.count(&status).await, 1, "the {what} entry {n} is {expected}");
        if n >= 6 {
            assert_eq!(held_for(&app, *entry, a).await + held_for(&app, *entry, b).await, 0, "entry {n} holds nothing");
        }
    }
    let shelf = format!("SELECT sum(stock)::bigint FROM inventories WHERE id IN ('{a}', '{b}')");
    assert_eq!(app.count(&shelf).await, 0);
    app.assert_invariant().await;
    eprintln!("kits_and_inventories_in_one_line_racing_frees_are_served_in_order {isolation:?}: {:?}", tally(&answers));
}

at_every_isolation! {
    kits_and_inventories_in_one_line_racing_frees_are_served_in_order;
}
