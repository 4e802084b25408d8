//! What a pass makes of ledger rows and recorded events, rendered and
//! parsed back: one event per change, in order, with the units after it.

use super::*;

fn at(micros: i64) -> DateTime<Utc> {
    DateTime::from_timestamp_micros(1_796_000_000_000_000 + micros).expect("a time")
}

fn moved(
    inventory: Uuid,
    version: i32,
    reason: MovementReason,
    delta: i32,
    stock_after: i32,
    reservation: Option<Uuid>,
) -> Move {
    Move {
        id: Uuid::new_v4(),
        inventory_id: inventory,
        version,
        reason,
        delta,
        location_id: None,
        stock_after,
        reservation_id: reservation,
        order_id: None,
        created_at: at(i64::from(version)),
        adjustment_reason: None,
        kit_reservation_id: None,
    }
}

#[test]
fn timestamps_read_as_postgresql_writes_them() {
    let mut out = String::new();
    timestamp(at(120_000), &mut out);
    assert!(out.ends_with(":20.12+00:00"), "{out}");
    out.clear();
    timestamp(at(0), &mut out);
    assert!(out.ends_with(":20+00:00"), "{out}");
}

#[test]
fn a_reservation_is_a_stock_change_then_a_reservation_change_in_one_row() {
    let (item, home, held) = (Uuid::new_v4(), Uuid::new_v4(), Uuid::new_v4());
    let moves = [moved(item, 2, MovementReason::Reserved, -1, 4, Some(held))];
    let pass = Pass::new(&moves, &[], Some(home));
    let units = HashMap::from([(item, Units { kept: None, held: Some((5, 0)) })]);
    let made = pass.make(7, &units);
    assert_eq!(made.events, 2);
    let [row] = made.rows.as_slice() else { panic!("one row: {:?}", made.rows) };
    assert_eq!((row.first_seq, row.last_seq), (8, 9));
    assert_eq!(row.types, [EventType::StockChanged, EventType::ReservationChanged]);
    let body: serde_json::Value = serde_json::from_str(&format!("[{}]", row.body)).expect("JSON");
    assert_eq!(body[0]["data"]["available"], 4);
    assert_eq!(body[0]["data"]["reserved"], 1);
    assert_eq!(body[0]["data"]["onHand"], 5);
    assert_eq!(body[0]["data"]["locations"][0]["locationId"], home.to_string());
    assert_eq!(body[1]["data"]["status"], "ACTIVE");
    assert_eq!(row.ends[0] as usize, row.body.find(",{\"id\"").expect("a second event"));
    assert_eq!(row.ends[1] as usize, row.body.len());
    assert_eq!(made.units, [(item, 5, 0)]);
}

/// The events of `moves` (one pass, units unknown), parsed.
fn events_of(moves: &[Move]) -> Vec<serde_json::Value> {
    let made = Pass::new(moves, &[], None).make(0, &HashMap::new());
    let bodies: Vec<&str> = made.rows.iter().map(|row| row.body.as_str()).collect();
    serde_json::from_str(&format!("[{}]", bodies.join(","))).expect("JSON")
}

#[test]
fn a_transfer_is_one_stock_change_named_transferred_and_no_reservation_change() {
    let (item, from, to) = (Uuid::new_v4(), Uuid::new_v4(), Uuid::new_v4());
    let mut out = moved(item, 3, MovementReason::TransferredOut, -2, 8, None);
    let mut into = moved(item, 3, MovementReason::TransferredIn, 2, 10, None);
    (out.location_id, into.location_id) = (Some(from), Some(to));
    let events = events_of(&[out, into]);
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0]["data"]["reason"], "TRANSFERRED");
    assert_eq!(events[0]["data"]["delta"], 0);
}

#[test]
fn a_reservation_taken_from_two_locations_is_one_status_change_of_its_whole_quantity() {
    let (item, held) = (Uuid::new_v4(), Uuid::new_v4());
    let mut first = moved(item, 2, MovementReason::Reserved, -2, 0, Some(held));
    let mut second = moved(item, 2, MovementReason::Reserved, -1, 3, Some(held));
    (first.location_id, second.location_id) = (Some(Uuid::new_v4()), Some(Uuid::new_v4()));
    let events = events_of(&[first, second]);
    let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().expect("a type")).collect();
    assert_eq!(kinds, ["STOCK_CHANGED", "RESERVATION_CHANGED"]);
    assert_eq!(events[0]["data"]["reason"], "RESERVED");
    assert_eq!(events[1]["data"]["status"], "ACTIVE");
    assert_eq!(events[1]["data"]["quantity"], 3);
}

#[test]
fn reasons_leave_reservations_in_the_statuses_readers_see() {
    let item = Uuid::new_v4();
    let status = |reason| {
        let events = events_of(&[moved(item, 2, reason, 1, 1, Some(Uuid::new_v4()))]);
        events.get(1).map(|e| e["data"]["status"].as_str().expect("a status").to_owned())
    };
    assert_eq!(status(MovementReason::OrderCancelled).as_deref(), Some("RELEASED"));
    assert_eq!(status(MovementReason::Expired).as_deref(), Some("EXPIRED"));
    assert_eq!(status(MovementReason::Fulfilled).as_deref(), Some("FULFILLED"));
    assert_eq!(status(MovementReason::QuantityChanged), None, "a quantity change keeps the status");
}

#[test]
fn an_orders_returns_follow_its_last_version_by_number_whatever_their_ids() {
    let order = Uuid::new_v4();
    let recorded = |id: u128, version: i32, number: Option<i32>| Recorded {
        id: Uuid::from_u128(id),
        kind: EventType::OrderChanged,
        subject_id: order,
        version,
        data: format!(r#"{{"version":{version},"returnNumber":{}}}"#, number.unwrap_or(0)),
        occurred_at: at(0),
        reservation_id: None,
        quantity: None,
        return_number: number,
    };
    // By id alone the second return (id 1) would come first.
    let found = [recorded(1, 4, Some(2)), recorded(5, 3, None), recorded(2, 4, Some(1)), recorded(3, 4, None)];
    let made = Pass::new(&[], &found, None).make(0, &HashMap::new());
    let events: Vec<serde_json::Value> = serde_json::from_str(&format!("[{}]", made.rows[0].body)).expect("JSON");
    let order_of: Vec<serde_json::Value> =
        events.iter().map(|e| serde_json::json!([e["version"], e["data"]["returnNumber"]])).collect();
    assert_eq!(serde_json::Value::from(order_of), serde_json::json!([[3, 0], [4, 0], [4, 1], [4, 2]]));
}

#[test]
fn a_restocking_return_is_a_stock_change_of_on_hand_and_available_and_no_reservation_change() {
    let (item, line) = (Uuid::new_v4(), Uuid::new_v4());
    let moves = [moved(item, 5, MovementReason::Returned, 2, 7, Some(line))];
    let units = HashMap::from([(item, Units { kept: Some((5, 0)), held: None })]);
    let made = Pass::new(&moves, &[], None).make(0, &units);
    assert_eq!(made.events, 1, "no RESERVATION_CHANGED: the line stays FULFILLED");
    let body: serde_json::Value = serde_json::from_str(&made.rows[0].body).expect("JSON");
    let data = &body["data"];
    assert_eq!((&data["reason"], &data["delta"], &data["available"]), (&"RETURNED".into(), &2.into(), &7.into()));
    assert_eq!(data["onHand"], 7, "on hand grows with the units returned");
    assert_eq!((data["reservationId"].as_str(), made.units), (Some(line.to_string().as_str()), vec![(item, 7, 0)]));
}

#[test]
fn an_adjustment_is_one_stock_change_of_on_hand_and_available_with_its_reason() {
    let item = Uuid::new_v4();
    let mut adjusted = moved(item, 4, MovementReason::Adjusted, -2, 3, None);
    adjusted.adjustment_reason = Some(AdjustmentReason::Damaged);
    let units = HashMap::from([(item, Units { kept: Some((5, 0)), held: None })]);
    let made = Pass::new(&[adjusted], &[], None).make(0, &units);
    assert_eq!(made.events, 1, "no RESERVATION_CHANGED");
    let body: serde_json::Value = serde_json::from_str(&made.rows[0].body).expect("JSON");
    let data = &body["data"];
    assert_eq!((&data["reason"], &data["adjustmentReason"]), (&"ADJUSTED".into(), &"DAMAGED".into()));
    assert_eq!((&data["delta"], &data["available"], &data["onHand"]), (&(-2).into(), &3.into(), &3.into()));
    assert_eq!(made.units, [(item, 3, 0)], "on hand falls with the units adjusted away");
    let reserved = events_of(&[moved(item, 2, MovementReason::Reserved, -1, 4, Some(Uuid::new_v4()))]);
    assert!(reserved[0]["data"].get("adjustmentReason").is_none(), "only an adjustment says why");
}

#[test]
fn many_events_are_cut_into_rows_of_a_hundred() {
    let item = Uuid::new_v4();
    let moves: Vec<Move> = (2..=151).map(|v| moved(item, v, MovementReason::Restocked, 1, v, None)).collect();
    let pass = Pass::new(&moves, &[], None);
    let units = HashMap::from([(item, Units { kept: Some((1, 0)), held: None })]);
    let made = pass.make(0, &units);
    let bounds: Vec<(i64, i64)> = made.rows.iter().map(|r| (r.first_seq, r.last_seq)).collect();
    assert_eq!(bounds, [(1, 100), (101, 150)]);
    let last: serde_json::Value = serde_json::from_str(&format!("[{}]", made.rows[1].body)).expect("JSON");
    assert_eq!(last[49]["version"], 151);
    assert_eq!(last[49]["data"]["onHand"], 151);
    assert_eq!(made.units, [(item, 151, 0)]);
}
