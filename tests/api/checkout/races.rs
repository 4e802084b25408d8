//! Checkout racing the sweeper, a release, an extension and a second
//! checkout: exactly one wins, at every isolation level.

use super::*;

/// Rounds of each checkout race.
pub(super) const ROUNDS: usize = 25;

/// Per round: one reservation expiring at about the moment a checkout of it
/// and a busy sweeper start together (the expiry is spread from a little
/// before to a little after that moment, round by round). Exactly one wins:
/// the order holds the line and its stock stays taken, or the reservation is
/// EXPIRED and its stock is back; never both (an oversell), never neither.
pub(super) async fn checkout_racing_the_sweeper_lets_exactly_one_win(isolation: Isolation) {
    let app = Arc::new(TestApp::without_sweeper(isolation).await);
    let item = app.create_inventory("EXPIRING-1", 1000).await;
    let alice = app.token("alice", Role::Customer);
    let (mut ordered, mut expired) = (0, 0);
    for round in 0..ROUNDS {
        let id = cart(&app, &alice, &[(item, 2)]).await[0];
        let (stock, _) = app.stock_and_version(item).await;
        let offset_ms = (round % 5) as i64 * 10 - 20;
        expire_in(&app, id, offset_ms).await;
        let checkout = {
            let (app, token) = (app.clone(), alice.clone());
            async move { named(app.checkout(&token, checkout_of(&[id], None)).await) }.boxed()
        };
        let sweeping = {
            let app = app.clone();
            async move {
                // A sweeper that sweeps on until the moment has well passed.
                let until = Instant::now() + Duration::from_millis(offset_ms.max(0) as u64 + 100);
                let mut swept = 0;
                while Instant::now() < until {
                    swept += sweep_all(&app).await;
                }
                (String::new(), json!(swept))
            }
            .boxed()
        };
        let results = at_once(vec![checkout, sweeping]).await;
        let (name, answer) = &results[0];
        // What the sweeper would still do later.
        let swept = results[1].1.as_i64().expect("swept") + sweep_all(&app).await;
        let context = format!("round {round} (expiry {offset_ms:+} ms): {name} {answer}, swept {swept}");

        let row = reservation_row(&app, id).await;
        let expiries = app
            .count(&format!(
                "SELECT count(*) FROM stock_movements WHERE reason = 'EXPIRED' AND reservation_id = '{id}'"
            ))
            .await;
        let orders =
            app.count(&format!("SELECT count(*) FROM reservations WHERE id = '{id}' AND order_id IS NOT NULL")).await;
        match name.as_str() {
            "OrderPlaced" => {
                ordered += 1;
                assert_eq!((&row["status"], orders, expiries, swept), (&json!("ORDERED"), 1, 0, 0), "{context}; {row}");
                assert_eq!(app.stock_and_version(item).await.0, stock, "its stock stays taken; {context}");
            }
            "ReservationsUnavailable" => {
                expired += 1;
                assert_eq!(answer["reservations"][0]["reason"], "EXPIRED", "{context}");
                assert_eq!((&row["status"], orders, expiries, swept), (&json!("EXPIRED"), 0, 1, 1), "{context}; {row}");
                assert_eq!(app.stock_and_version(item).await.0, stock + 2, "its stock is back; {context}");
            }
            _ => panic!("a checkout answers OrderPlaced or ReservationsUnavailable; {context}"),
        }
        app.assert_invariant().await;
    }
    eprintln!("checkout vs sweeper at {isolation:?}: {ordered} ordered, {expired} expired in {ROUNDS} rounds");
    assert_eq!(app.count("SELECT count(*) FROM orders").await, ordered);
}

/// Per round: a cart of two lines checked out while its owner releases the
/// second. One wins: an order holding both lines, or the release with its
/// stock back and no order.
pub(super) async fn checkout_racing_a_release_lets_one_win(isolation: Isolation) {
    let app = Arc::new(TestApp::spawn_with(isolation).await);
    let (x, y) = (app.create_inventory("RACE-X", 1000).await, app.create_inventory("RACE-Y", 1000).await);
    let alice = app.token("alice", Role::Customer);
    let mut ordered = 0;
    for round in 0..ROUNDS {
        let ids = cart(&app, &alice, &[(x, 1), (y, 2)]).await;
        let (y_stock, _) = app.stock_and_version(y).await;
        let checkout = {
            let (app, token, input) = (app.clone(), alice.clone(), checkout_of(&ids, None));
            async move { named(app.checkout(&token, input).await) }.boxed()
        };
        let release = {
            let (app, token, line) = (app.clone(), alice.clone(), ids[1]);
            async move { named(app.release(&token, line).await) }.boxed()
        };
        let results = at_once(vec![checkout, release]).await;
        let ((checkout_name, checkout), (release_name, release)) = (&results[0], &results[1]);
        let context = format!("round {round}: {checkout_name} {checkout}, {release_name} {release}");
        let statuses = [reservation_row(&app, ids[0]).await, reservation_row(&app, ids[1]).await]
            .map(|row| row["status"].as_str().expect("status").to_owned());
        match (checkout_name.as_str(), release_name.as_str()) {
            ("OrderPlaced", "ReservationNotActive") => {
                ordered += 1;
                assert_eq!(release["reservation"]["status"], "ORDERED", "{context}");
                assert_eq!(statuses, ["ORDERED", "ORDERED"], "{context}");
                assert_eq!(app.stock_and_version(y).await.0, y_stock, "{context}");
            }
            ("ReservationsUnavailable", "ReservationReleased") => {
                let listed = &checkout["reservations"];
                assert_eq!(listed.as_array().map(Vec::len), Some(1), "{context}");
                assert_eq!((uuid(&listed[0]["reservationId"]), &listed[0]["reason"]), (ids[1], &json!("RELEASED")));
                assert_eq!(statuses, ["ACTIVE", "RELEASED"], "{context}");
                assert_eq!(app.stock_and_version(y).await.0, y_stock + 2, "{context}");
            }
            _ => panic!("exactly one must win, without errors; {context}"),
        }
        app.assert_invariant().await;
    }
    eprintln!("checkout vs release at {isolation:?}: {ordered} ordered of {ROUNDS}");
    assert_eq!(app.count("SELECT count(*) FROM orders").await, ordered);
}

/// Per round: one cart checked out twice at once (a double submit without a
/// key): exactly one order, the other answer lists every line as ORDERED.
pub(super) async fn two_checkouts_of_one_cart_place_one_order(isolation: Isolation) {
    let app = Arc::new(TestApp::spawn_with(isolation).await);
    let (x, y) = (app.create_inventory("TWICE-X", 1000).await, app.create_inventory("TWICE-Y", 1000).await);
    let alice = app.token("alice", Role::Customer);
    for round in 0..ROUNDS {
        let ids = cart(&app, &alice, &[(x, 1), (y, 1)]).await;
        let requests = (0..2)
            .map(|_| {
                let (app, token, input) = (app.clone(), alice.clone(), checkout_of(&ids, None));
                async move { named(app.checkout(&token, input).await) }.boxed()
            })
            .collect();
        let results = at_once(requests).await;
        let context = format!("round {round}: {results:?}");
        assert_eq!(count(&results, "OrderPlaced"), 1, "{context}");
        assert_eq!(count(&results, "ReservationsUnavailable"), 1, "{context}");
        let (_, placed) = results.iter().find(|(n, _)| n == "OrderPlaced").expect("placed");
        let (_, refused) = results.iter().find(|(n, _)| n == "ReservationsUnavailable").expect("refused");
        let listed = refused["reservations"].as_array().expect("reservations");
        assert_eq!(listed.len(), 2, "{context}");
        assert!(
            listed.iter().all(|r| r["reason"] == "ORDERED" && r["reservation"]["status"] == "ORDERED"),
            "{context}"
        );
        let order = uuid(&placed["order"]["id"]);
        assert_eq!(line_statuses(&app, order).await, ["ORDERED", "ORDERED"], "{context}");
        assert_eq!(app.count("SELECT count(*) FROM orders").await, round as i64 + 1, "{context}");
    }
    app.assert_invariant().await;
}

/// Per round: a line checked out while its owner extends it. Either way the
/// order holds the line, which no longer expires; the extension happened
/// before (extended) or found an order line (not active).
pub(super) async fn checkout_racing_an_extension_is_consistent_either_way(isolation: Isolation) {
    let app = Arc::new(TestApp::spawn_with(isolation).await);
    let item = app.create_inventory("EXTEND-1", 1000).await;
    let alice = app.token("alice", Role::Customer);
    let mut extended_first = 0;
    for round in 0..ROUNDS {
        let id = cart(&app, &alice, &[(item, 1)]).await[0];
        let checkout = {
            let (app, token) = (app.clone(), alice.clone());
            async move { named(app.checkout(&token, checkout_of(&[id], None)).await) }.boxed()
        };
        let extend = {
            let (app, token) = (app.clone(), alice.clone());
            async move { named(app.extend(&token, id, 60).await) }.boxed()
        };
        let results = at_once(vec![checkout, extend]).await;
        let context = format!("round {round}: {results:?}");
        assert_eq!(results[0].0, "OrderPlaced", "an extension never stands in a checkout's way; {context}");
        match results[1].0.as_str() {
            "ReservationExtended" => extended_first += 1,
            "ReservationNotActive" => assert_eq!(results[1].1["reservation"]["status"], "ORDERED", "{context}"),
            _ => panic!("{context}"),
        }
        let row = reservation_row(&app, id).await;
        assert_eq!(row["status"], "ORDERED", "{context}");
        assert!(row["expires_at"].is_null(), "an order line never expires, extended or not; {context}");
    }
    eprintln!("checkout vs extension at {isolation:?}: extended first in {extended_first} of {ROUNDS}");
    app.assert_invariant().await;
}

at_every_isolation! {
    checkout_racing_the_sweeper_lets_exactly_one_win;
    checkout_racing_a_release_lets_one_win;
    two_checkouts_of_one_cart_place_one_order;
    checkout_racing_an_extension_is_consistent_either_way;
    ten_repeats_of_one_keyed_checkout_place_one_order;
}
