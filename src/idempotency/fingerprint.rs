//! A request's fingerprint: the canonical byte encoding of what makes it
//! that request ([`Part`]), hashed into what is stored beside its key, and
//! the legacy fingerprint a key stored before the encoding holds instead.

use sea_orm::ActiveEnum as _;
use sha2::{Digest, Sha256};
use uuid::Uuid;

use super::legacy;
use crate::stock::{
    allocating::{Allocating, Strategy},
    correcting::{Adjustment, Change},
    rows::ReturnDisposition,
    taking_back::ReturnLine,
};

/// A client's idempotency key and the fingerprint of the request that carries it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Key {
    /// The key, as the client sent it (already checked).
    pub key: String,
    /// The request's fingerprint, as it is stored: `v2:` and the hex
    /// SHA-256 of its canonical encoding.
    pub fingerprint: String,
    /// The fingerprint a key stored before the canonical encoding holds for
    /// the same request (see [`legacy`]); only ever compared, never stored.
    legacy: String,
}

/// What a stored fingerprint of the canonical encoding starts with.
const CANONICAL: &str = "v2:";

/// What the encoding of every request starts with: its name and version.
const MAGIC: &[u8] = b"stockguard.idempotency.v2";

/// A value of a request as it enters a fingerprint, in the canonical
/// encoding: one tag byte, then
///
/// - `s` text: its length in bytes (u32, big-endian), its UTF-8 bytes;
/// - `i` integer: i64, big-endian;
/// - `u` UUID: its 16 bytes;
/// - `n` absent (an optional value not given): nothing;
/// - `l` list: its length (u32, big-endian), then each item;
/// - `r` record: its number of fields (u32, big-endian), then each field's
///   name (as text, without its tag) and value, in the order the request's
///   constructor below writes them (never sorted, never skipped).
///
/// A request is [`MAGIC`], its operation's name as text (without its tag),
/// then a record of its fields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Part<'a> {
    /// Text.
    Text(&'a str),
    /// An integer.
    Int(i64),
    /// A UUID.
    Id(Uuid),
    /// An optional value that was not given.
    Absent,
    /// A list.
    List(Vec<Part<'a>>),
    /// Named fields, in a fixed order.
    Record(Vec<(&'a str, Part<'a>)>),
}

impl<'a> Part<'a> {
    /// Text, or [`Part::Absent`].
    pub(crate) fn optional_text(value: Option<&'a str>) -> Self {
        value.map_or(Self::Absent, Self::Text)
    }

    /// An integer, or [`Part::Absent`].
    pub(crate) fn optional_int(value: Option<i32>) -> Self {
        value.map_or(Self::Absent, |n| Self::Int(n.into()))
    }

    fn encode(&self, out: &mut Vec<u8>) {
        match self {
            Self::Text(text) => {
                out.push(b's');
                encode_text(text, out);
            }
            Self::Int(n) => {
                out.push(b'i');
                out.extend_from_slice(&n.to_be_bytes());
            }
            Self::Id(id) => {
                out.push(b'u');
                out.extend_from_slice(id.as_bytes());
            }
            Self::Absent => out.push(b'n'),
            Self::List(items) => {
                out.push(b'l');
                encode_len(items.len(), out);
                items.iter().for_each(|item| item.encode(out));
            }
            Self::Record(fields) => {
                out.push(b'r');
                encode_len(fields.len(), out);
                for (name, value) in fields {
                    encode_text(name, out);
                    value.encode(out);
                }
            }
        }
    }
}

fn encode_len(len: usize, out: &mut Vec<u8>) {
    // Requests are bounded far below 4 GiB by the body limit.
    out.extend_from_slice(&u32::try_from(len).unwrap_or(u32::MAX).to_be_bytes());
}

fn encode_text(text: &str, out: &mut Vec<u8>) {
    encode_len(text.len(), out);
    out.extend_from_slice(text.as_bytes());
}

/// The canonical encoding of `operation` with `fields`.
fn encoding(operation: &str, fields: Vec<(&str, Part<'_>)>) -> Vec<u8> {
    let mut out = MAGIC.to_vec();
    encode_text(operation, &mut out);
    Part::Record(fields).encode(&mut out);
    out
}

/// The stored fingerprint of `operation` with `fields`.
fn canonical(operation: &str, fields: Vec<(&str, Part<'_>)>) -> String {
    format!("{CANONICAL}{}", hex::encode(Sha256::digest(encoding(operation, fields))))
}

/// What else makes a multi-item request or a checkout what it is, beside
/// its lines: its fields, and the text the legacy fingerprint held for them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Extra<'a> {
    /// Fields after the lines, in a fixed order.
    pub fields: Vec<(&'a str, Part<'a>)>,
    /// The same, as keys stored before the canonical encoding hashed it.
    pub legacy: String,
}

impl Key {
    /// The key of a single `reserve`. Taking safety stock enters the
    /// fingerprint only when asked for, so every fingerprint from before
    /// safety stock stays what it was.
    pub(crate) fn reserve(
        key: String,
        inventory_id: Uuid,
        quantity: i32,
        expected_version: Option<i32>,
        allocating: &Allocating,
        use_safety_stock: bool,
    ) -> Self {
        let mut fields = vec![
            ("inventoryId", Part::Id(inventory_id)),
            ("quantity", Part::Int(quantity.into())),
            ("expectedVersion", Part::optional_int(expected_version)),
        ];
        fields.extend(choice(allocating));
        if use_safety_stock {
            fields.push(("useSafetyStock", Part::Int(1)));
        }
        // No request from before safety stock took it.
        let legacy = if use_safety_stock {
            String::new()
        } else {
            legacy_unless_located(allocating, || legacy::reserve(inventory_id, quantity, expected_version))
        };
        Self { key, fingerprint: canonical("reserve", fields), legacy }
    }

    /// The key of a multi-item `operation` (`"reserveMany"`, `"placeOrder"`)
    /// over its merged lines `(inventory, quantity, expected version)`, plus
    /// `extra`: anything else that makes the request what it is.
    pub(crate) fn multi_item<'l>(
        key: String,
        operation: &str,
        lines: impl IntoIterator<Item = (Uuid, i32, Option<i32>, &'l Allocating)>,
        extra: Extra<'_>,
    ) -> Self {
        let lines: Vec<_> = lines.into_iter().collect();
        let plain: Vec<_> = lines.iter().map(|&(id, quantity, version, _)| (id, quantity, version)).collect();
        let legacy = if lines.iter().all(|(.., allocating)| allocating.is_default()) {
            legacy::multi_item(operation, &plain, &extra.legacy)
        } else {
            String::new()
        };
        let lines = lines
            .into_iter()
            .map(|(inventory_id, quantity, expected_version, allocating)| {
                let mut fields = vec![
                    ("inventoryId", Part::Id(inventory_id)),
                    ("quantity", Part::Int(quantity.into())),
                    ("expectedVersion", Part::optional_int(expected_version)),
                ];
                fields.extend(choice(allocating));
                Part::Record(fields)
            })
            .collect();
        let mut fields = vec![("lines", Part::List(lines))];
        fields.extend(extra.fields);
        Self { key, fingerprint: canonical(operation, fields), legacy }
    }

    /// The key of a `checkout` of these reservations (sorted, without
    /// repeats, as the request is merged), plus `extra`: anything else that
    /// makes the request what it is.
    ///
    /// Kit reservations (sorted, without repeats) enter only when named, so
    /// every fingerprint from before kits stays what it was; a checkout
    /// naming kits has no legacy fingerprint (see [`Key::transfer`]).
    pub(crate) fn checkout(
        key: String,
        reservation_ids: &[Uuid],
        kit_reservation_ids: &[Uuid],
        extra: Extra<'_>,
    ) -> Self {
        let ids = |ids: &[Uuid]| Part::List(ids.iter().copied().map(Part::Id).collect());
        let legacy = if kit_reservation_ids.is_empty() {
            legacy::checkout(reservation_ids, &extra.legacy)
        } else {
            String::new()
        };
        let mut fields = vec![("reservationIds", ids(reservation_ids))];
        fields.extend(extra.fields);
        if !kit_reservation_ids.is_empty() {
            fields.push(("kitReservationIds", ids(kit_reservation_ids)));
        }
        Self { key, fingerprint: canonical("checkout", fields), legacy }
    }

    /// The key of a `reserveKit` of `quantity` kits choosing locations by
    /// `allocating`. A kit has no fingerprint from before the canonical
    /// encoding (see [`Key::transfer`]).
    pub(crate) fn reserve_kit(key: String, kit_id: Uuid, quantity: i32, allocating: &Allocating) -> Self {
        let mut fields = vec![("kitId", Part::Id(kit_id)), ("quantity", Part::Int(quantity.into()))];
        fields.extend(choice(allocating));
        Self { key, fingerprint: canonical("reserveKit", fields), legacy: String::new() }
    }

    /// The key of a `transferStock`. A transfer has no fingerprint from
    /// before the canonical encoding: its legacy one is empty, which no
    /// stored fingerprint is, so a legacy key never matches it.
    pub(crate) fn transfer(
        key: String,
        inventory_id: Uuid,
        (from, to): (Uuid, Uuid),
        quantity: i32,
        expected_version: Option<i32>,
    ) -> Self {
        let fields = vec![
            ("inventoryId", Part::Id(inventory_id)),
            ("fromLocationId", Part::Id(from)),
            ("toLocationId", Part::Id(to)),
            ("quantity", Part::Int(quantity.into())),
            ("expectedVersion", Part::optional_int(expected_version)),
        ];
        Self { key, fingerprint: canonical("transferStock", fields), legacy: String::new() }
    }

    /// The key of a `returnOrder` of `order_id` with these lines and note.
    /// The lines enter in inventory order, whatever order the request named
    /// them in (each inventory is named once). A return has no fingerprint
    /// from before the canonical encoding (see [`Key::transfer`]).
    pub(crate) fn return_order(key: String, order_id: Uuid, lines: &[ReturnLine], note: Option<&str>) -> Self {
        let mut sorted: Vec<&ReturnLine> = lines.iter().collect();
        sorted.sort_by_key(|line| line.inventory_id);
        let lines = sorted
            .into_iter()
            .map(|line| {
                let disposition = match line.disposition {
                    ReturnDisposition::Restock => "RESTOCK",
                    ReturnDisposition::WriteOff => "WRITE_OFF",
                };
                Part::Record(vec![
                    ("inventoryId", Part::Id(line.inventory_id)),
                    ("quantity", Part::Int(line.quantity.into())),
                    ("disposition", Part::Text(disposition)),
                    ("locationId", line.location_id.map_or(Part::Absent, Part::Id)),
                ])
            })
            .collect();
        let fields =
            vec![("orderId", Part::Id(order_id)), ("lines", Part::List(lines)), ("note", Part::optional_text(note))];
        Self { key, fingerprint: canonical("returnOrder", fields), legacy: String::new() }
    }

    /// The key of an `adjustStock`: the inventory, the location (none: the
    /// default one), the change or the count, the reason, the note and the
    /// expected version. An adjustment has no fingerprint from before the
    /// canonical encoding (see [`Key::transfer`]).
    pub(crate) fn adjust(key: String, request: &Adjustment<'_>) -> Self {
        let reason = request.reason.to_value();
        let (change, units) = match request.change {
            Change::Delta(delta) => ("delta", delta),
            Change::Count(counted) => ("countedOnHand", counted),
        };
        let fields = vec![
            ("inventoryId", Part::Id(request.inventory_id)),
            ("locationId", request.location_id.map_or(Part::Absent, Part::Id)),
            (change, Part::Int(units.into())),
            ("reason", Part::Text(&reason)),
            ("note", Part::optional_text(request.note)),
            ("expectedVersion", Part::optional_int(request.expected_version)),
        ];
        Self { key, fingerprint: canonical("adjustStock", fields), legacy: String::new() }
    }

    /// Whether a stored fingerprint is this request's, by the scheme it was
    /// stored with.
    pub(super) fn matches(&self, stored: &str) -> bool {
        if stored.starts_with(CANONICAL) { stored == self.fingerprint } else { stored == self.legacy }
    }
}

/// The fields a request's choice of locations adds to its fingerprint:
/// none for the default (so every fingerprint from before locations stays
/// what it was), else the location ids, strategy and split setting, so a key
/// reused with another choice is a reuse, not a replay.
fn choice(allocating: &Allocating) -> Vec<(&'static str, Part<'static>)> {
    if allocating.is_default() {
        return Vec::new();
    }
    let ids = allocating
        .location_ids
        .as_ref()
        .map_or(Part::Absent, |ids| Part::List(ids.iter().copied().map(Part::Id).collect()));
    let strategy = match allocating.strategy {
        Strategy::Priority => "PRIORITY",
        Strategy::FewestLocations => "FEWEST_LOCATIONS",
    };
    vec![
        ("locationIds", ids),
        ("strategy", Part::Text(strategy)),
        ("allowSplit", Part::Int(allocating.allow_split.into())),
    ]
}

/// The legacy fingerprint of a request that chose no locations; a request
/// that did cannot be a replay of a key written before locations existed,
/// and gets none (an empty text matches no stored fingerprint).
fn legacy_unless_located(allocating: &Allocating, legacy: impl FnOnce() -> String) -> String {
    if allocating.is_default() { legacy() } else { String::new() }
}

#[cfg(test)]
mod tests {
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
        let key = Key::checkout("k".into(), &[Uuid::from_u128(1), Uuid::from_u128(2)], &[], address());
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
    fn a_key_reused_to_take_safety_stock_is_another_request() {
        let plain = Key::reserve("k".into(), Uuid::from_u128(1), 2, None, &Allocating::default(), false);
        let safety = Key::reserve("k".into(), Uuid::from_u128(1), 2, None, &Allocating::default(), true);
        assert!(!safety.matches(&plain.fingerprint));
        assert!(!safety.matches(&plain.legacy), "no key from before safety stock took it");
        assert!(!plain.matches(&safety.fingerprint));
        assert!(safety.matches(&safety.fingerprint));
    }
}
