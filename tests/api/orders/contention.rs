//! Retries that run out, a held order row that times out, and releases
//! racing each other.

use super::*;

pub(super) async fn confirm_and_cancel_report_modified_concurrently_after_three_lost_races(isolation: Isolation) {
    let app = TestApp::spawn_configured(isolation, limits(OrderLocking::Optimistic)).await;
    let item = app.create_inventory("LOSE-1", 10).await;
    let alice = app.token("alice", Role::Customer);
    let id = new_order(&app, &alice, item, 2).await;
    // Every status change of an order now affects 0 rows: a race lost every time.
    app.db
        .execute_unprepared(
            "CREATE FUNCTION lose_every_race() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NULL; END $$; \
             CREATE TRIGGER lose_every_race BEFORE UPDATE ON orders FOR EACH ROW \
             WHEN (NEW.status IS DISTINCT FROM OLD.status) EXECUTE FUNCTION lose_every_race();",
        )
        .await
        .expect("install the trigger");
    let before = order_state(&app, id).await;
    let snapshot = app.snapshot().await;

    for what in ["confirm", "cancel"] {
        let (name, result) = if what == "confirm" {
            named(app.confirm(&app.operator(), id).await)
        } else {
            named(app.cancel(&alice, id).await)
        };
        assert_eq!(name, "OrderModifiedConcurrently", "{what}: {result}");
        assert_eq!(result["orderId"], id.to_string(), "{what}");
        assert_eq!(result["attempts"], 3, "{what}: at most 3 attempts");
        assert_eq!(order_state(&app, id).await, before, "{what} changed nothing");
        assert_eq!(app.snapshot().await, snapshot, "{what} moved no stock");
    }
    assert_eq!(line_statuses(&app, id).await, ["ORDERED"]);
    app.assert_invariant().await;

    // Once races can be won again, the order is as good as new.
    app.db.execute_unprepared("DROP TRIGGER lose_every_race ON orders").await.expect("drop the trigger");
    let (name, result) = named(app.cancel(&alice, id).await);
    assert_eq!(name, "OrderCancelled", "{result}");
    assert_eq!(order_row(&app, id).await["version"], 2);
    assert_eq!(app.stock_and_version(item).await.0, 10);
    app.assert_invariant().await;
}

at_every_isolation! { confirm_and_cancel_report_modified_concurrently_after_three_lost_races; }

// ---------- 5. lock timeout ----------

pub(super) async fn a_held_order_row_times_out_into_modified_concurrently_in_pessimistic_mode(isolation: Isolation) {
    let limits = Limits { order_locking: OrderLocking::Pessimistic, lock_timeout_ms: 300, ..Limits::default() };
    let app = TestApp::spawn_configured(isolation, limits).await;
    let item = app.create_inventory("LOCK-1", 10).await;
    let alice = app.token("alice", Role::Customer);
    let id = new_order(&app, &alice, item, 1).await;
    let before = order_state(&app, id).await;
    let snapshot = app.snapshot().await;

    let txn = app.db.begin().await.expect("begin");
    txn.execute_unprepared(&format!("SELECT 1 FROM orders WHERE id = '{id}' FOR UPDATE")).await.expect("lock the row");
    for what in ["confirm", "cancel"] {
        let started = Instant::now();
        let (name, result) = if what == "confirm" {
            named(app.confirm(&app.operator(), id).await)
        } else {
            named(app.cancel(&alice, id).await)
        };
        let elapsed = started.elapsed();
        assert_eq!(name, "OrderModifiedConcurrently", "{what}: {result}");
        assert_eq!(result["orderId"], id.to_string());
        assert!(result["attempts"].as_i64().is_some_and(|n| n >= 1), "{result}");
        assert!(elapsed < Duration::from_secs(5), "{what} gave up on the lock in {elapsed:?}");
    }
    txn.rollback().await.expect("rollback");

    assert_eq!(order_row(&app, id).await["status"], "PENDING");
    assert_eq!(order_state(&app, id).await, before, "nothing written while the row was held");
    assert_eq!(app.snapshot().await, snapshot);
    // The lock is gone, and so is the obstacle.
    let (name, result) = named(app.confirm(&app.operator(), id).await);
    assert_eq!(name, "OrderConfirmed", "{result}");
    assert_eq!(order_row(&app, id).await["status"], "CONFIRMED");
    app.assert_invariant().await;
}

at_every_isolation! { a_held_order_row_times_out_into_modified_concurrently_in_pessimistic_mode; }

// ---------- 6. releasing reservations ----------

pub(super) async fn ten_releases_of_one_reservation_return_its_stock_once(isolation: Isolation) {
    let app = Arc::new(TestApp::spawn_with(isolation).await);
    let item = app.create_inventory("FREE-1", 10).await;
    let alice = app.token("alice", Role::Customer);
    let reserved = app.reserve(&alice, json!({ "inventoryId": item, "quantity": 3 })).await;
    assert_eq!(reserved["__typename"], "Reserved", "{reserved}");
    let reservation = uuid(&reserved["reservation"]["id"]);

    let requests = (0..10)
        .map(|_| {
            let (app, token) = (app.clone(), alice.clone());
            async move { named(app.release(&token, reservation).await) }.boxed()
        })
        .collect();
    let results = at_once(requests).await;
    assert_eq!(count(&results, "ReservationReleased"), 1, "{:?}", names(&results));
    assert_eq!(count(&results, "ReservationNotActive"), 9, "{:?}", names(&results));
    for (name, result) in &results {
        assert_eq!(result["reservation"]["status"], "RELEASED", "{name}: {result}");
    }
    let released = &results.iter().find(|(n, _)| n == "ReservationReleased").expect("one release").1;
    assert_eq!(released["inventory"]["stock"], 10);
    assert_eq!(released["inventory"]["version"], 3);

    assert_eq!(app.stock_and_version(item).await, (10, 3), "stock returned exactly once");
    let stored = app.rows(&format!("SELECT status FROM reservations WHERE id = '{reservation}'")).await;
    assert_eq!(stored, [json!({ "status": "RELEASED" })]);
    app.assert_invariant().await;
}

at_every_isolation! { ten_releases_of_one_reservation_return_its_stock_once; }

#[tokio::test(flavor = "multi_thread")]
async fn only_the_owner_releases_a_reservation_and_order_lines_are_not_releasable() {
    let app = TestApp::spawn().await;
    let item = app.create_inventory("FREE-2", 10).await;
    let (alice, bob) = (app.token("alice", Role::Customer), app.token("bob", Role::Customer));
    let reserved = app.reserve(&alice, json!({ "inventoryId": item, "quantity": 1 })).await;
    let reservation = uuid(&reserved["reservation"]["id"]);
    let order = new_order(&app, &alice, item, 2).await;
    let line = uuid(&app.rows(&format!("SELECT id FROM reservations WHERE order_id = '{order}'")).await[0]["id"]);
    let snapshot = app.snapshot().await;

    let (name, result) = named(app.release(&bob, reservation).await);
    assert_eq!(name, "ReservationNotFound", "someone else's reservation reads as absent: {result}");
    assert_eq!(result["reservationId"], reservation.to_string());
    let (name, result) = named(app.release(&alice, line).await);
    assert_eq!(name, "ReservationNotActive", "an order line is released by cancelling the order: {result}");
    assert_eq!(result["reservation"]["status"], "ORDERED");

    assert_eq!(app.snapshot().await, snapshot, "nothing written");
    let mut statuses: Vec<String> =
        app.rows("SELECT status FROM reservations").await.iter().map(|r| r["status"].to_string()).collect();
    statuses.sort();
    assert_eq!(statuses, [r#""ACTIVE""#, r#""ORDERED""#], "both untouched");
    assert_eq!(order_row(&app, order).await["version"], 1);
    app.assert_invariant().await;
}
