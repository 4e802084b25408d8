//! Kits through the coalescer: a `reserveKit` by the default choice that
//! queues shares the next batch's statement with whoever waits (single
//! reserves of its components or of anything else), is judged against all
//! of its components at its turn in arrival order, and when its turn
//! refuses it, runs its own statement after the batch, as a caller
//! arriving later would.

use std::{sync::Arc, time::Duration};

use sea_orm::{ConnectionTrait, DatabaseTransaction, TransactionTrait};
use serde_json::{Value, json};
use stockguard::auth::Role;
use tokio::task::JoinHandle;
use uuid::Uuid;

use super::{kit_of, reserve_kit};
use crate::{
    helpers::{Isolation, TestApp, at_every_isolation, uuid},
    location_races::assert_levels_add_up,
    locations::stocked,
};

/// How long each caller is given to reach the coalescer's queue before the
/// next is sent, so that they queue in the order they are sent.
const GAP: Duration = Duration::from_millis(400);

/// What a queued caller asks for.
enum Ask {
    /// One kit.
    Kit(Uuid),
    /// Units of one inventory.
    One(Uuid, i64),
}

/// Holds the row of a fresh inventory, sends a first reserve of it (its
/// statement then waits for the row, keeping the coalescer's one lane busy),
/// sends `asks` one after another (each queues behind it), lets the row go,
/// and returns their answers in order: the queued callers share the next
/// batch.
async fn queued_behind_a_held_row(app: &Arc<TestApp>, name: &str, asks: Vec<Ask>) -> Vec<Value> {
    let held = stocked(app, &format!("{name}-HELD"), 10).await;
    let holder = hold_row(app, held).await;
    let first = send(app, "first".into(), Ask::One(held, 1));
    app.until_waiting_for_a_lock("WITH").await;
    let mut queued = Vec::new();
    for (n, ask) in asks.into_iter().enumerate() {
        queued.push(send(app, format!("{name}-caller-{n}"), ask));
        tokio::time::sleep(GAP).await;
    }
    holder.rollback().await.expect("let the row go");
    assert_eq!(first.await.expect("task")["__typename"], "Reserved");
    let mut answers = Vec::new();
    for caller in queued {
        answers.push(caller.await.expect("task"));
    }
    answers
}

fn send(app: &Arc<TestApp>, user: String, ask: Ask) -> JoinHandle<Value> {
    let app = app.clone();
    tokio::spawn(async move {
        let token = app.token(&user, Role::Customer);
        match ask {
            Ask::Kit(kit) => reserve_kit(&app, &token, kit, 1, json!({})).await,
            Ask::One(item, quantity) => app.reserve(&token, json!({ "inventoryId": item, "quantity": quantity })).await,
        }
    })
}

async fn hold_row(app: &TestApp, id: Uuid) -> DatabaseTransaction {
    let holder = app.db.begin().await.expect("begin");
    let lock = format!("SELECT 1 FROM inventories WHERE id = '{id}' FOR UPDATE");
    holder.execute_unprepared(&lock).await.expect("lock the row");
    holder
}

/// The transactions (`xmin`) that wrote the ACTIVE reservations of `users`.
async fn transactions_of(app: &TestApp, users: &[String]) -> Vec<String> {
    let users: Vec<String> = users.iter().map(|u| format!("'{u}'")).collect();
    let rows = app
        .rows(&format!(
            "SELECT DISTINCT xmin::text AS tx FROM reservations WHERE user_id IN ({}) AND status = 'ACTIVE'",
            users.join(",")
        ))
        .await;
    rows.iter().map(|row| row["tx"].as_str().expect("xmin").to_owned()).collect()
}

/// A kit (A + 2 B) queued first among single reserves of A, B and C is
/// taken whole at its turn in the batch's one statement, and the singles
/// after it see what it left: A's single is sold out (A had 1), B's and
/// C's are served; the kit's components and those singles were written by
/// one transaction. Then, on fresh items, a kit queued after a single that
/// takes its A is refused at its turn and answers, from its own statement
/// after the batch, `KitSoldOut` naming A (0 left) and B (1 left after the
/// single reserve of 3 queued behind it); the singles shared one
/// transaction and no kit reservation was made. Levels, the ledger and the
/// check hold.
async fn a_queued_kit_shares_the_batch_and_is_judged_at_its_turn(isolation: Isolation) {
    let app = Arc::new(TestApp::spawn_with(isolation).await);
    let (a, b, c) =
        (stocked(&app, "BATCH-A", 1).await, stocked(&app, "BATCH-B", 4).await, stocked(&app, "BATCH-C", 5).await);
    let cam =
        kit_of(&app, "BATCH-CAM", json!([{ "inventoryId": a, "quantity": 1 }, { "inventoryId": b, "quantity": 2 }]))
            .await;
    let answers =
        queued_behind_a_held_row(&app, "FIRST", vec![Ask::Kit(cam), Ask::One(a, 1), Ask::One(b, 2), Ask::One(c, 1)])
            .await;
    let names: Vec<&str> = answers.iter().map(|a| a["__typename"].as_str().unwrap_or("ERROR")).collect();
    assert_eq!(names, ["KitReserved", "SoldOut", "Reserved", "Reserved"], "{answers:#?}");
    assert_eq!(answers[1]["inventory"]["stock"], 0, "A's single came after the kit took A's unit: {}", answers[1]);
    let units: Vec<(Uuid, i64)> = {
        let parts = answers[0]["kitReservation"]["reservations"].as_array().expect("components");
        let mut units: Vec<(Uuid, i64)> =
            parts.iter().map(|r| (uuid(&r["inventory"]["id"]), r["quantity"].as_i64().expect("units"))).collect();
        units.sort();
        units
    };
    let mut expected = vec![(a, 1), (b, 2)];
    expected.sort();
    assert_eq!(units, expected, "the kit whole");
    let served: Vec<String> = [0, 2, 3].iter().map(|n| format!("FIRST-caller-{n}")).collect();
    let transactions = transactions_of(&app, &served).await;
    assert_eq!(transactions.len(), 1, "the kit and the singles after it share one statement: {transactions:?}");
    // B: the kit's component is one change, the single after it the next.
    let b_versions = app
        .rows(&format!(
            "SELECT version_after, delta, kit_reservation_id IS NOT NULL AS kit FROM stock_movements \
             WHERE inventory_id = '{b}' AND reason = 'RESERVED' ORDER BY version_after"
        ))
        .await;
    let b_versions: Vec<(i64, i64, bool)> = b_versions
        .iter()
        .map(|r| (r["version_after"].as_i64().expect("v"), r["delta"].as_i64().expect("d"), r["kit"] == true))
        .collect();
    assert_eq!(b_versions, [(2, -2, true), (3, -2, false)], "one change per component and per single, in turn");

    let (a, b) = (stocked(&app, "BATCH-A2", 1).await, stocked(&app, "BATCH-B2", 4).await);
    let cam =
        kit_of(&app, "BATCH-CAM2", json!([{ "inventoryId": a, "quantity": 1 }, { "inventoryId": b, "quantity": 2 }]))
            .await;
    let answers = queued_behind_a_held_row(&app, "SECOND", vec![Ask::One(a, 1), Ask::Kit(cam), Ask::One(b, 3)]).await;
    let names: Vec<&str> = answers.iter().map(|a| a["__typename"].as_str().unwrap_or("ERROR")).collect();
    assert_eq!(names, ["Reserved", "KitSoldOut", "Reserved"], "{answers:#?}");
    let mut short: Vec<(Uuid, i64)> = answers[1]["components"]
        .as_array()
        .expect("short components")
        .iter()
        .map(|c| (uuid(&c["inventoryId"]), c["available"].as_i64().expect("available")))
        .collect();
    short.sort();
    let mut expected = vec![(a, 0), (b, 1)];
    expected.sort();
    assert_eq!(short, expected, "judged after the batch: {}", answers[1]);
    assert_eq!(answers[1]["available"], 0);
    let served: Vec<String> = [0, 2].iter().map(|n| format!("SECOND-caller-{n}")).collect();
    assert_eq!(transactions_of(&app, &served).await.len(), 1, "the singles shared one statement");
    let kit_reservations = app.count(&format!("SELECT count(*) FROM kit_reservations WHERE kit_id = '{cam}'")).await;
    assert_eq!(kit_reservations, 0, "a refused kit writes nothing");
    assert_levels_add_up(&app.db).await;
    app.assert_invariant().await;
}

at_every_isolation! {
    a_queued_kit_shares_the_batch_and_is_judged_at_its_turn;
}
