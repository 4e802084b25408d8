//! The canonical encoding and every operation's fingerprint, pinned, and
//! which stored fingerprints a request matches.

use super::*;
use crate::stock::rows::AdjustmentReason;

// Stored fingerprints must stay valid across releases: a changed
// encoding would turn every replay of an older key into
// IDEMPOTENCY_KEY_REUSED. The canonical ones are pinned, and so are the
// legacy ones that keys stored before them still hold.

const ADDRESS: &str = r#"ShippingAddress { name: "Alice", line1: "1 Main St", line2: None, city: "Osaka", postal_code: "530-0001", country: "JP" }"#;

fn address() -> Extra<'static> {
    Extra {
        fields: vec![(
            "address",
            Part::Record(vec![
                ("name", Part::Text("Alice")),
                ("line1", Part::Text("1 Main St")),
                ("line2", Part::Absent),
                ("city", Part::Text("Osaka")),
                ("postalCode", Part::Text("530-0001")),
                ("country", Part::Text("JP")),
            ]),
        )],
        legacy: ADDRESS.to_owned(),
    }
}

#[test]
fn the_canonical_encoding_is_the_documented_bytes() {
    let fields = vec![
        ("inventoryId", Part::Id(Uuid::from_u128(1))),
        ("quantity", Part::Int(2)),
        ("expectedVersion", Part::Absent),
    ];
    let expected = [
        &b"stockguard.idempotency.v2"[..],
        b"\0\0\0\x07reserve",
        b"r\0\0\0\x03",
        b"\0\0\0\x0binventoryId",
        b"u\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\x01",
        b"\0\0\0\x08quantity",
        b"i\0\0\0\0\0\0\0\x02",
        b"\0\0\0\x0fexpectedVersion",
        b"n",
    ]
    .concat();
    assert_eq!(encoding("reserve", fields), expected);
    let list = Part::List(vec![Part::Text("é"), Part::Int(-1)]);
    let mut out = Vec::new();
    list.encode(&mut out);
    assert_eq!(out, b"l\0\0\0\x02s\0\0\0\x02\xc3\xa9i\xff\xff\xff\xff\xff\xff\xff\xff");
}

#[test]
fn the_fingerprint_of_a_reserve_never_changes() {
    let key = Key::reserve("k".into(), Uuid::from_u128(1), 2, Some(3), &Allocating::default(), false);
    assert_eq!(key.fingerprint, "v2:4ca41c39e0d2d05362162d67b6506b965caa63bf8499d33ad82d15569210e961");
    assert_eq!(key.legacy, "7b4809da65cb4d8601e408b69581b64c75c341d4bc16551c7821af6a333104bf");
}

#[test]
fn the_fingerprints_of_multi_item_requests_never_change() {
    let anywhere = Allocating::default();
    let lines = [(Uuid::from_u128(1), 1, None, &anywhere), (Uuid::from_u128(2), 4, Some(7), &anywhere)];
    let many = Key::multi_item("k".into(), "reserveMany", lines, Extra::default());
    assert_eq!(many.fingerprint, "v2:26e6c4e7c08d1c0ad49824850e9dc7c1ff95b0747ab4378ea919a5dbfb73c341");
    assert_eq!(many.legacy, "21f934cb3a771e43aaff30c3400372f1003055020e3f8ea1dd7e7ebc59dbfd4e");
    let order = Key::multi_item("k".into(), "placeOrder", lines, address());
    assert_eq!(order.fingerprint, "v2:b8920e7ad0af2a0f1ec2daf8bab693b278ae53b8773d5a999c53aa23ec43030c");
    assert_eq!(order.legacy, "f7765cbbe731b738278329a9605cfa30124996f60a61fe5ee181d87f1aa9331c");
}

#[test]
fn the_fingerprint_of_a_checkout_never_changes() {
    let key = Key::checkout("k".into(), &[Uuid::from_u128(1), Uuid::from_u128(2)], address());
    assert_eq!(key.fingerprint, "v2:343d94cd4c8ca5f1ce1e1ccf185d8e7b3ae0ec7039d17211824330e0e5a07220");
    assert_eq!(key.legacy, "3ffc95a42fdaf8f5153e4279acb60f7765bcb164755129f082b41041197df284");
}

#[test]
fn the_fingerprint_of_a_transfer_never_changes() {
    let (from, to) = (Uuid::from_u128(2), Uuid::from_u128(3));
    let key = Key::transfer("k".into(), Uuid::from_u128(1), (from, to), 4, None);
    assert_eq!(key.fingerprint, "v2:85d447ebb7636b910a87f8b55514fc2c99e09413911ba93f14d82622f79b8e2a");
    let legacy = Key::reserve("k".into(), Uuid::from_u128(1), 4, None, &Allocating::default(), false).legacy;
    assert!(!key.matches(&legacy), "no legacy fingerprint is a transfer's");
    assert!(!key.matches(&Key::transfer("k".into(), Uuid::from_u128(1), (to, from), 4, None).fingerprint));
}

#[test]
fn the_fingerprint_of_a_return_never_changes() {
    let line = |inventory, quantity, disposition, location: Option<u128>| ReturnLine {
        inventory_id: Uuid::from_u128(inventory),
        quantity,
        disposition,
        location_id: location.map(Uuid::from_u128),
    };
    let lines = [line(2, 1, ReturnDisposition::Restock, Some(3)), line(4, 2, ReturnDisposition::WriteOff, None)];
    let key = Key::return_order("k".into(), Uuid::from_u128(1), &lines, Some("dented"));
    assert_eq!(key.fingerprint, "v2:c5a5cc18984fa2a60df0c72005f14f592d8e5f2c964bee9d7893f35fbe202f3f");
    let without_note = Key::return_order("k".into(), Uuid::from_u128(1), &lines, None);
    assert!(!key.matches(&without_note.fingerprint), "the note makes the request");
    assert!(!key.matches(&Key::return_order("k".into(), Uuid::from_u128(1), &lines[..1], None).fingerprint));
    let reordered = [lines[1].clone(), lines[0].clone()];
    let same = Key::return_order("k".into(), Uuid::from_u128(1), &reordered, Some("dented"));
    assert!(key.matches(&same.fingerprint), "the order of the lines does not make the request");
}

#[test]
fn the_fingerprint_of_an_adjustment_never_changes() {
    let adjustment = Adjustment {
        inventory_id: Uuid::from_u128(1),
        location_id: None,
        change: Change::Delta(-2),
        reason: AdjustmentReason::Damaged,
        note: Some("forklift"),
        expected_version: Some(3),
        operator: "operator",
        key: None,
    };
    let key = Key::adjust("k".into(), &adjustment);
    assert_eq!(key.fingerprint, "v2:d95aaa55d581936309803e6d1abb328647fa11465ee70c65fab0249cc567e884");
    let counted = Adjustment { change: Change::Count(-2), ..adjustment };
    assert!(!key.matches(&Key::adjust("k".into(), &counted).fingerprint), "a count is not a change");
    let elsewhere = Adjustment { location_id: Some(Uuid::from_u128(9)), ..adjustment };
    assert!(!key.matches(&Key::adjust("k".into(), &elsewhere).fingerprint));
    let other_reason = Adjustment { reason: AdjustmentReason::Shrinkage, ..adjustment };
    assert!(!key.matches(&Key::adjust("k".into(), &other_reason).fingerprint));
    let by_another = Adjustment { operator: "someone else", ..adjustment };
    assert!(key.matches(&Key::adjust("k".into(), &by_another).fingerprint), "the key space is the user's");
}

#[test]
fn a_stored_fingerprint_is_matched_by_the_scheme_it_names() {
    let key = Key::reserve("k".into(), Uuid::from_u128(1), 2, Some(3), &Allocating::default(), false);
    assert!(key.matches(&key.fingerprint));
    assert!(key.matches(&key.legacy), "a key stored before the canonical encoding replays");
    let other = Key::reserve("k".into(), Uuid::from_u128(1), 5, Some(3), &Allocating::default(), false);
    assert!(!key.matches(&other.fingerprint));
    assert!(!key.matches(&other.legacy));
    // A legacy hex behind the canonical prefix is not this request's.
    assert!(!key.matches(&format!("{CANONICAL}{}", key.legacy)));
}

#[test]
fn a_key_reused_to_take_safety_stock_is_another_request() {
    let plain = Key::reserve("k".into(), Uuid::from_u128(1), 2, None, &Allocating::default(), false);
    let safety = Key::reserve("k".into(), Uuid::from_u128(1), 2, None, &Allocating::default(), true);
    assert!(!safety.matches(&plain.fingerprint));
    assert!(!safety.matches(&plain.legacy), "no key from before safety stock took it");
    assert!(!plain.matches(&safety.fingerprint));
    assert!(safety.matches(&safety.fingerprint));
}

#[test]
fn a_key_reused_with_another_choice_of_locations_is_another_request() {
    let anywhere = Key::reserve("k".into(), Uuid::from_u128(1), 2, None, &Allocating::default(), false);
    let choices = [
        Allocating { location_ids: Some(vec![Uuid::from_u128(7)]), ..Allocating::default() },
        Allocating { strategy: Strategy::FewestLocations, ..Allocating::default() },
        Allocating { allow_split: false, ..Allocating::default() },
    ];
    for choice in &choices {
        let located = Key::reserve("k".into(), Uuid::from_u128(1), 2, None, choice, false);
        assert!(!located.matches(&anywhere.fingerprint), "{choice:?}");
        assert!(!located.matches(&anywhere.legacy), "{choice:?} replays a key from before locations");
        assert!(!anywhere.matches(&located.fingerprint), "{choice:?}");
        assert!(located.matches(&located.fingerprint));
    }
}
