//! What a checkout refuses: an expired cart, a released line, failing
//! reservations with their reasons, bad input.

use super::*;

#[tokio::test(flavor = "multi_thread")]
async fn an_expired_cart_cannot_be_checked_out() {
    let app = TestApp::without_sweeper(Isolation::ReadCommitted).await;
    let (x, y) = (app.create_inventory("EXPIRED-X", 10).await, app.create_inventory("EXPIRED-Y", 10).await);
    let alice = app.token("alice", Role::Customer);
    let ids = cart(&app, &alice, &[(x, 2), (y, 1)]).await;
    // Both due, neither swept yet.
    expire_in(&app, ids[0], -1000).await;
    expire_in(&app, ids[1], -1000).await;
    let snapshot = app.snapshot().await;

    let (name, result) = named(app.checkout(&alice, checkout_of(&ids, None)).await);
    assert_eq!(name, "ReservationsUnavailable", "{result}");
    let listed = result["reservations"].as_array().expect("reservations");
    assert_eq!(listed.len(), 2, "{result}");
    let mut sorted = ids.clone();
    sorted.sort();
    for (item, id) in listed.iter().zip(&sorted) {
        assert_eq!(uuid(&item["reservationId"]), *id, "{result}");
        assert_eq!(item["reason"], "EXPIRED", "{result}");
        assert_eq!(item["reservation"]["status"], "EXPIRED", "due reads as expired before the sweep: {result}");
    }
    assert_eq!(app.snapshot().await, snapshot, "nothing written");
    assert_eq!(app.count("SELECT count(*) FROM orders").await, 0);
    // Until the sweep their units are still held, then they are available.
    assert_eq!(app.states(x).await, [8, 2, 0, 10]);
    assert_eq!(sweep_all(&app).await, 2);
    assert_eq!(app.states(x).await, [10, 0, 0, 10]);
    let (name, result) = named(app.checkout(&alice, checkout_of(&ids, None)).await);
    assert_eq!(name, "ReservationsUnavailable", "{result}");
    assert!(result["reservations"].as_array().expect("listed").iter().all(|r| r["reason"] == "EXPIRED"));
    app.assert_invariant().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_cart_with_one_released_line_places_nothing() {
    let app = TestApp::spawn().await;
    let (x, y, z) = (
        app.create_inventory("RELEASED-X", 10).await,
        app.create_inventory("RELEASED-Y", 10).await,
        app.create_inventory("RELEASED-Z", 10).await,
    );
    let alice = app.token("alice", Role::Customer);
    let ids = cart(&app, &alice, &[(x, 1), (y, 2), (z, 3)]).await;
    assert_eq!(named(app.release(&alice, ids[1]).await).0, "ReservationReleased");
    let snapshot = app.snapshot().await;

    let (name, result) = named(app.checkout(&alice, checkout_of(&ids, None)).await);
    assert_eq!(name, "ReservationsUnavailable", "{result}");
    assert_eq!(
        result["reservations"],
        json!([{
            "reservationId": ids[1],
            "reason": "RELEASED",
            "reservation": { "id": ids[1], "status": "RELEASED", "quantity": 2, "expiresAt": result["reservations"][0]["reservation"]["expiresAt"] },
        }]),
        "only the failing line is listed"
    );
    assert_eq!(app.snapshot().await, snapshot, "nothing written");
    assert_eq!(app.count("SELECT count(*) FROM orders").await, 0);
    for id in [ids[0], ids[2]] {
        let row = reservation_row(&app, id).await;
        assert_eq!((&row["status"], &row["order_id"]), (&json!("ACTIVE"), &Value::Null), "untouched: {row}");
        assert!(!row["expires_at"].is_null(), "its expiry kept: {row}");
    }
    // Without the released line the rest checks out.
    let (name, result) = named(app.checkout(&alice, checkout_of(&[ids[0], ids[2]], None)).await);
    assert_eq!(name, "OrderPlaced", "{result}");
    app.assert_invariant().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_checkout_lists_every_failing_reservation_with_its_reason() {
    let app = TestApp::without_sweeper(Isolation::ReadCommitted).await;
    let item = app.create_inventory("REASONS-1", 20).await;
    let (alice, bob) = (app.token("alice", Role::Customer), app.token("bob", Role::Customer));
    let [good, expired, released, ordered] =
        cart(&app, &alice, &[(item, 1), (item, 1), (item, 1), (item, 1)]).await.try_into().expect("four");
    let bobs = cart(&app, &bob, &[(item, 1)]).await[0];
    let unknown = Uuid::new_v4();
    expire_in(&app, expired, -1000).await;
    app.release(&alice, released).await;
    assert_eq!(named(app.checkout(&alice, checkout_of(&[ordered], None)).await).0, "OrderPlaced");
    let snapshot = app.snapshot().await;

    let all = [good, expired, released, ordered, bobs, unknown];
    let (name, result) = named(app.checkout(&alice, checkout_of(&all, None)).await);
    assert_eq!(name, "ReservationsUnavailable", "{result}");
    let mut listed: Vec<(Uuid, String, Value)> = result["reservations"]
        .as_array()
        .expect("reservations")
        .iter()
        .map(|r| {
            (uuid(&r["reservationId"]), r["reason"].as_str().expect("reason").to_owned(), r["reservation"].clone())
        })
        .collect();
    listed.sort_by_key(|(id, ..)| *id);
    let mut expected = vec![
        (expired, "EXPIRED", "EXPIRED"),
        (released, "RELEASED", "RELEASED"),
        (ordered, "ORDERED", "ORDERED"),
        (bobs, "NOT_FOUND", ""),
        (unknown, "NOT_FOUND", ""),
    ];
    expected.sort_by_key(|(id, ..)| *id);
    assert_eq!(listed.len(), expected.len(), "every failing one, and only those: {result}");
    for ((id, reason, reservation), (want_id, want_reason, want_status)) in listed.iter().zip(&expected) {
        assert_eq!((id, reason.as_str()), (want_id, *want_reason), "{result}");
        if want_status.is_empty() {
            assert!(reservation.is_null(), "someone else's or unknown reads as absent: {result}");
        } else {
            assert_eq!(reservation["status"], *want_status, "{result}");
        }
    }
    assert_eq!(app.snapshot().await, snapshot, "nothing written");
    assert_eq!(reservation_row(&app, good).await["status"], "ACTIVE");
    assert_eq!(reservation_row(&app, bobs).await["status"], "ACTIVE");
    app.assert_invariant().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_checkout_input_is_refused_and_writes_nothing() {
    let app = TestApp::spawn().await;
    let item = app.create_inventory("BADCART-1", 200).await;
    let alice = app.token("alice", Role::Customer);
    let ids = cart(&app, &alice, &[(item, 1)]).await;
    let snapshot = app.snapshot().await;
    let mut blank_name = checkout_of(&ids, None);
    blank_name["shippingAddress"]["name"] = json!("  ");
    let too_many: Vec<Uuid> = (0..101).map(|_| Uuid::new_v4()).collect();
    for (what, input) in [
        ("no reservations", checkout_of(&[], None)),
        ("101 reservations", checkout_of(&too_many, None)),
        ("a blank name", blank_name),
        ("a blank key", checkout_of(&ids, Some("  "))),
    ] {
        let body = app.checkout(&alice, input).await;
        assert_eq!(error_code(&body), Some("BAD_USER_INPUT"), "{what}: {body}");
        assert_eq!(app.snapshot().await, snapshot, "{what} wrote nothing");
    }
    let anonymous = app.graphql(None, crate::documents::CHECKOUT, json!({ "input": checkout_of(&ids, None) })).await;
    assert_eq!(error_code(&anonymous), Some("UNAUTHENTICATED"), "{anonymous}");
    // One id named twice is one line.
    let (name, placed) = named(app.checkout(&alice, checkout_of(&[ids[0], ids[0]], None)).await);
    assert_eq!(name, "OrderPlaced", "{placed}");
    assert_eq!(placed["order"]["items"].as_array().map(Vec::len), Some(1), "{placed}");
    assert_eq!(app.count("SELECT count(*) FROM orders").await, 1);
    app.assert_invariant().await;
}
