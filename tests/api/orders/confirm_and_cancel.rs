//! Confirm racing cancel: exactly one wins, at every isolation level and in
//! both locking modes.

use super::*;

/// Per round: a fresh PENDING order; the operator confirms it while its owner
/// cancels it, both released by one barrier. Exactly one wins.
pub(super) async fn confirm_racing_cancel_lets_exactly_one_win(
    isolation: Isolation,
    locking: OrderLocking,
    rounds: usize,
) {
    let app = Arc::new(TestApp::spawn_configured(isolation, limits(locking)).await);
    let item = app.create_inventory("RACE-1", 1000).await;
    let (alice, operator) = (app.token("alice", Role::Customer), app.operator());
    let mut confirmed = 0;
    for round in 0..rounds {
        let id = new_order(&app, &alice, item, 1).await;
        let confirming = {
            let (app, token) = (app.clone(), operator.clone());
            async move { named(app.confirm(&token, id).await) }.boxed()
        };
        let cancelling = {
            let (app, token) = (app.clone(), alice.clone());
            async move { named(app.cancel(&token, id).await) }.boxed()
        };
        let results = at_once(vec![confirming, cancelling]).await;
        let ((confirm_name, confirm_body), (cancel_name, cancel_body)) = (&results[0], &results[1]);
        let context = format!("round {round}: confirm {confirm_body}, cancel {cancel_body}");

        let won_by_confirm = match (confirm_name.as_str(), cancel_name.as_str()) {
            ("OrderConfirmed", "OrderCannotBeCancelled" | "OrderModifiedConcurrently") => true,
            ("OrderCannotBeConfirmed" | "OrderModifiedConcurrently", "OrderCancelled") => false,
            _ => panic!("exactly one must win, without errors; {context}"),
        };
        let row = order_row(&app, id).await;
        let lines = line_statuses(&app, id).await;
        assert_eq!(row["version"], 2, "one change, one version step; {context}; row {row}");
        if won_by_confirm {
            confirmed += 1;
            let order = &confirm_body["order"];
            assert_eq!(order["status"], "CONFIRMED", "{context}");
            assert_eq!(order["version"], 2, "{context}");
            assert_eq!(order["confirmedBy"], "operator", "{context}");
            assert!(order["confirmedAt"].is_string(), "{context}");
            match cancel_name.as_str() {
                "OrderCannotBeCancelled" => assert_eq!(cancel_body["order"]["status"], "CONFIRMED", "{context}"),
                _ => assert_eq!(cancel_body["orderId"], id.to_string(), "{context}"),
            }
            assert_eq!(row["status"], "CONFIRMED", "{context}; row {row}");
            assert_eq!(row["confirmed_by"], "operator", "{context}; row {row}");
            assert!(!row["confirmed_at"].is_null(), "{context}; row {row}");
            assert_eq!(lines, ["ORDERED"], "confirming keeps the lines; {context}");
        } else {
            let order = &cancel_body["order"];
            assert_eq!(order["status"], "CANCELLED", "{context}");
            assert_eq!(order["version"], 2, "{context}");
            assert!(order["confirmedAt"].is_null() && order["confirmedBy"].is_null(), "{context}");
            match confirm_name.as_str() {
                "OrderCannotBeConfirmed" => assert_eq!(confirm_body["order"]["status"], "CANCELLED", "{context}"),
                _ => assert_eq!(confirm_body["orderId"], id.to_string(), "{context}"),
            }
            assert_eq!(row["status"], "CANCELLED", "{context}; row {row}");
            assert!(row["confirmed_at"].is_null() && row["confirmed_by"].is_null(), "{context}; row {row}");
            assert_eq!(lines, ["RELEASED"], "cancelling releases the lines; {context}");
        }
        assert_eq!(app.stock_and_version(item).await.0, 1000 - confirmed, "{context}");
    }
    assert_eq!(
        app.count("SELECT count(*) FROM orders WHERE status = 'PENDING'").await,
        0,
        "every round decided its order"
    );
    assert_eq!(app.count("SELECT count(*) FROM orders WHERE status = 'CONFIRMED'").await, i64::from(confirmed));
    app.assert_invariant().await;
}

/// Rounds of a race: most where races are cheapest to run (READ COMMITTED, optimistic).
pub(super) fn race_rounds(isolation: Isolation, locking: OrderLocking) -> usize {
    match (isolation, locking) {
        (Isolation::ReadCommitted, OrderLocking::Optimistic) => 100,
        _ => 25,
    }
}

at_every_isolation! {
    confirm_racing_cancel_lets_exactly_one_win_optimistic => |isolation| {
        confirm_racing_cancel_lets_exactly_one_win(isolation, OrderLocking::Optimistic, race_rounds(isolation, OrderLocking::Optimistic))
    };
    confirm_racing_cancel_lets_exactly_one_win_pessimistic => |isolation| {
        confirm_racing_cancel_lets_exactly_one_win(isolation, OrderLocking::Pessimistic, race_rounds(isolation, OrderLocking::Pessimistic))
    };
}
