//! Every stock state of an inventory (`available`, `reserved`, `committed`,
//! `onHand`): read in one snapshot, so they add up in every read while carts
//! are reserved, resized, checked out, released, cancelled and swept; and
//! batched for lists.

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::Duration,
};

use futures::future::join_all;
use serde_json::json;
use stockguard::{auth::Role, config::Limits};

use crate::{
    documents::INVENTORY_STATES_PAGE,
    helpers::{Isolation, TestApp, address, uuid},
};

/// Customers working their carts on one inventory of 40 while a reader
/// reads its states without pause, and a sweeper expires the holds that
/// run out (a TTL of one second): nothing is received or fulfilled, so
/// every read must find the same 40 on hand, however the units move among
/// the states. States read apart would not add up.
#[tokio::test(flavor = "multi_thread")]
async fn the_stock_states_add_up_in_every_read_while_carts_move() {
    let limits = Limits { reservation_ttl_secs: 1, sweep_interval_ms: 50, ..Limits::default() };
    let app = Arc::new(TestApp::spawn_configured(Isolation::ReadCommitted, limits).await);
    let item = app.create_inventory("STATES-1", 40).await;
    let done = Arc::new(AtomicBool::new(false));
    let reads = Arc::new(AtomicUsize::new(0));

    let reader = {
        let (app, done, reads) = (app.clone(), done.clone(), reads.clone());
        tokio::spawn(async move {
            while !done.load(Ordering::SeqCst) {
                let [available, reserved, committed, on_hand] = app.states(item).await;
                assert_eq!(on_hand, 40, "available {available} + reserved {reserved} + committed {committed}");
                assert!(available >= 0 && reserved >= 0 && committed >= 0, "{available} {reserved} {committed}");
                reads.fetch_add(1, Ordering::SeqCst);
            }
        })
    };
    let customers = (0..6).map(|c| {
        let app = app.clone();
        tokio::spawn(async move {
            let token = app.token(&format!("customer-{c}"), Role::Customer);
            for n in 0..12 {
                let reserved = app.reserve(&token, json!({ "inventoryId": item, "quantity": 1 + n % 3 })).await;
                if reserved["__typename"] != "Reserved" {
                    continue;
                }
                let id = uuid(&reserved["reservation"]["id"]);
                app.change_quantity(&token, id, 1 + (n + c) % 4).await;
                match (n + c) % 4 {
                    0 => drop(app.release(&token, id).await),
                    // Left to expire: the sweeper returns it.
                    1 => {}
                    _ => {
                        let input = json!({ "reservationIds": [id], "shippingAddress": address("1 Busy St") });
                        let placed = app.checkout(&token, input).await;
                        if n % 2 == 0 && placed["__typename"] == "OrderPlaced" {
                            app.cancel(&token, uuid(&placed["order"]["id"])).await;
                        }
                    }
                }
            }
        })
    });
    for customer in join_all(customers).await {
        customer.expect("customer");
    }
    // Let the sweeper take the holds left to expire, while the reader reads on.
    crate::helpers::eventually(Duration::from_secs(10), "every lapsed hold is swept", || async {
        app.count("SELECT count(*) FROM reservations WHERE status = 'ACTIVE'").await == 0
    })
    .await;
    done.store(true, Ordering::SeqCst);
    reader.await.expect("every read adds up");
    assert!(reads.load(Ordering::SeqCst) > 20, "the reader read while the carts moved");
    let [available, reserved, committed, on_hand] = app.states(item).await;
    assert_eq!((reserved, on_hand), (0, 40));
    let (stock, _) = app.stock_and_version(item).await;
    assert_eq!(available, i64::from(stock));
    let held = format!(
        "SELECT coalesce(sum(quantity), 0)::bigint FROM reservations WHERE inventory_id = '{item}' AND status = 'ORDERED'"
    );
    assert_eq!(committed, app.count(&held).await, "committed is what the open orders hold");
    app.assert_invariant().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_stock_states_of_a_page_of_inventories_load_in_one_batch() {
    // The sweeper's statements run on the same pool: keep it out of the count.
    let app = TestApp::without_sweeper(Isolation::ReadCommitted).await;
    let alice = app.token("alice", Role::Customer);
    for i in 0..50 {
        let id = app.create_inventory(&format!("BATCH-{i}"), 5).await;
        app.reserve(&alice, json!({ "inventoryId": id, "quantity": 2 })).await;
    }
    let before = app.statements.load(Ordering::SeqCst);
    let body = app.graphql(None, INVENTORY_STATES_PAGE, json!({ "f": 50 })).await;
    let statements = app.statements.load(Ordering::SeqCst) - before;
    let nodes = body["data"]["inventories"]["nodes"].as_array().expect("nodes");
    assert_eq!(nodes.len(), 50, "{body}");
    for node in nodes {
        assert_eq!(
            (&node["available"], &node["reserved"], &node["committed"], &node["onHand"]),
            (&json!(3), &json!(2), &json!(0), &json!(5)),
            "{node}"
        );
    }
    // One for the page and one batch for every state of the fifty (one per
    // inventory would be 51). The loader's 1 ms window closes early when the
    // executing task is not polled for a millisecond on a loaded machine, so
    // the bound is "far from one per row".
    assert!((2..=11).contains(&statements), "{statements} statements for a page of 50: the states do not batch");
}
