//! What a pass of the pump makes of the changes it found: one event per
//! change, in delivery order, rendered as sent, cut into the outbox's rows
//! (`outbox.rs`). Pure: the pump reads the changes and writes what this
//! returns (`pump.rs`).
//!
//! One `STOCK_CHANGED` per inventory version (whatever number of locations
//! it touched), one `RESERVATION_CHANGED` per status change a ledger row
//! records, and the recorded `ORDER_CHANGED` and checkout events, ordered
//! per inventory and per order by version (a version's stock change first,
//! then its reservations' changes, then checkouts; an order's change before
//! the stock it moved; an order's returns, which make no version, after the
//! version they were made at, by their number). A `STOCK_CHANGED` event carries the inventory's
//! units after its version: `available` from its ledger rows, `onHand` and
//! `committed` carried from the units the pump kept for it (`event_stock`)
//! by what each version changed of them, `reserved` the rest.

use std::{
    collections::{BTreeMap, HashMap},
    fmt::Write as _,
};

use chrono::{DateTime, Datelike as _, Timelike as _, Utc};
use md5::{Digest as _, Md5};
use sea_orm::ActiveEnum as _;
use uuid::Uuid;

use super::{
    EventType,
    outbox::{self, Row},
};
use crate::stock::{
    fragments::{COMMITTING_MOVES, ON_HAND_MOVES},
    rows::{AdjustmentReason, MovementReason, ReservationStatus},
};

/// One ledger row of a transaction the pass found committed.
#[derive(Debug, Clone)]
pub(crate) struct Move {
    pub id: Uuid,
    pub inventory_id: Uuid,
    pub version: i32,
    pub reason: MovementReason,
    pub delta: i32,
    pub location_id: Option<Uuid>,
    pub stock_after: i32,
    pub reservation_id: Option<Uuid>,
    pub order_id: Option<Uuid>,
    pub created_at: DateTime<Utc>,
    /// Why an operator adjusted stock (ADJUSTED rows only).
    pub adjustment_reason: Option<AdjustmentReason>,
    /// The kit reservation whose change wrote the row, if any.
    pub kit_reservation_id: Option<Uuid>,
}

/// An event a trigger recorded (an order's new version, a checkout).
#[derive(Debug, Clone)]
pub(crate) struct Recorded {
    pub id: Uuid,
    /// `RESERVATION_CHANGED` (a checkout) or `ORDER_CHANGED`, as the
    /// table's check allows.
    pub kind: EventType,
    /// The order, or the inventory of a checked-out reservation.
    pub subject_id: Uuid,
    pub version: i32,
    /// Its `data`, as PostgreSQL prints the `jsonb`.
    pub data: String,
    pub occurred_at: DateTime<Utc>,
    /// A checkout's reservation and units.
    pub reservation_id: Option<Uuid>,
    pub quantity: Option<i64>,
    /// A return's number among its order's returns (its `ORDER_CHANGED`).
    pub return_number: Option<i32>,
}

/// An inventory's units on hand and committed before the pass: as the pump
/// kept them, or (an inventory it does not follow yet) as it holds them at
/// the pass's snapshot, which includes what the pass's changes did.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Units {
    pub kept: Option<(i64, i64)>,
    pub held: Option<(i64, i64)>,
}

/// The version checkouts carry: recorded without one, they are placed by
/// the ledger instead (see [`Pass::checkouts`]).
const UNVERSIONED: i32 = i32::MAX;

/// An event, ready to be numbered: in `(key, version, rank, then, id)` order.
struct Event {
    key: Uuid,
    version: i32,
    rank: u8,
    /// Among an order's events at one version: 0 for the version's own,
    /// then its returns by number.
    then: i32,
    id: Uuid,
    kind: EventType,
    subject: &'static str,
    occurred_at: DateTime<Utc>,
    data: String,
}

/// What a pass writes.
#[derive(Debug, Default)]
pub(crate) struct Made {
    pub rows: Vec<Row>,
    /// Each touched inventory's units on hand and committed after the pass.
    pub units: Vec<(Uuid, i64, i64)>,
    pub events: i64,
}

/// The changes a pass found.
pub(crate) struct Pass<'a> {
    moves: &'a [Move],
    recorded: &'a [Recorded],
    /// The `default` location, named for ledger rows from before locations.
    home: Option<Uuid>,
    /// Each checkout's inventory, units, and the version it counts from
    /// (see [`checkouts`]).
    checkouts: Vec<(Uuid, i64, i32)>,
}

/// A version's ledger rows, summed.
struct Version<'a> {
    rows: Vec<&'a Move>,
    on_hand: i64,
    committed: i64,
}

/// The checkouts among `recorded`: inventory, units, and the version they
/// count from, right after their reservation's last change in `moves`
/// (taken, or its quantity changed), or before the pass's versions when
/// there is none: never before the units they commit were reserved, and
/// before the order's cancellation or shipment.
fn checkouts(moves: &[Move], recorded: &[Recorded]) -> Vec<(Uuid, i64, i32)> {
    let recorded = recorded.iter().filter(|r| r.kind == EventType::ReservationChanged);
    if recorded.clone().next().is_none() {
        return Vec::new();
    }
    let mut taken: HashMap<Uuid, i32> = HashMap::new();
    for m in moves.iter().filter(|m| matches!(m.reason, MovementReason::Reserved | MovementReason::QuantityChanged)) {
        if let Some(reservation) = m.reservation_id {
            let version = taken.entry(reservation).or_insert(m.version);
            *version = (*version).max(m.version);
        }
    }
    recorded
        .map(|r| {
            let version = r.reservation_id.and_then(|id| taken.get(&id).copied()).unwrap_or(0);
            (r.subject_id, r.quantity.unwrap_or(0), version)
        })
        .collect()
}

impl<'a> Pass<'a> {
    /// The changes a pass found: the ledger rows `moves`, the `recorded`
    /// events, and the `home` location.
    pub(crate) fn new(moves: &'a [Move], recorded: &'a [Recorded], home: Option<Uuid>) -> Self {
        Self { moves, recorded, home, checkouts: checkouts(moves, recorded) }
    }

    /// The inventories whose units the pass needs.
    pub(crate) fn touched(&self) -> Vec<Uuid> {
        let mut ids: Vec<Uuid> = self.moves.iter().map(|m| m.inventory_id).collect();
        ids.extend(self.checkouts.iter().map(|&(inventory, ..)| inventory));
        ids.sort_unstable();
        ids.dedup();
        ids
    }

    /// The pass's events, numbered from `last_seq + 1` into rows; `units`,
    /// the touched inventories' units before it.
    pub(crate) fn make(&self, last_seq: i64, units: &HashMap<Uuid, Units>) -> Made {
        let mut versions: BTreeMap<(Uuid, i32), Version<'a>> = BTreeMap::new();
        for m in self.moves {
            let version = versions.entry((m.inventory_id, m.version)).or_insert(Version {
                rows: Vec::new(),
                on_hand: 0,
                committed: 0,
            });
            // As `fragments::ledger_on_hand` and `ledger_committed` sum them.
            let delta = i64::from(m.delta);
            if ON_HAND_MOVES.contains(&m.reason) {
                version.on_hand += delta;
            }
            if COMMITTING_MOVES.contains(&m.reason) {
                version.committed -= delta;
            } else if m.reason == MovementReason::Fulfilled {
                version.committed += delta;
            }
            version.rows.push(m);
        }
        // Each inventory's steps in order: its versions, and the checkouts
        // after the version they count from.
        let mut steps: BTreeMap<Uuid, Vec<(i32, bool, i64, i64)>> = BTreeMap::new();
        for (&(inventory, number), version) in &versions {
            steps.entry(inventory).or_default().push((number, false, version.on_hand, version.committed));
        }
        for &(inventory, committed, number) in &self.checkouts {
            steps.entry(inventory).or_default().push((number, true, 0, committed));
        }
        // Both in (inventory, version) order: each inventory's versions
        // come out of `in_order` as its steps reach them.
        let mut events = Vec::with_capacity(self.moves.len() * 2 + self.recorded.len());
        let mut in_order = versions.iter_mut();
        let mut kept = Vec::with_capacity(steps.len());
        for (inventory, mut steps) in steps {
            steps.sort_by_key(|&(number, checkout, ..)| (number, checkout));
            let (on_hand_delta, committed_delta) = steps.iter().fold((0, 0), |(h, c), s| (h + s.2, c + s.3));
            let found = units.get(&inventory).copied().unwrap_or_default();
            let before = found.kept.or(found.held.map(|(h, c)| (h - on_hand_delta, c - committed_delta)));
            let (mut on_hand, mut committed) = (before.map(|b| b.0), before.map(|b| b.1));
            for (number, checkout, h, c) in steps {
                on_hand = on_hand.map(|u| u + h);
                committed = committed.map(|u| u + c);
                if !checkout && let Some((_, version)) = in_order.next() {
                    events.push(self.stock_changed(inventory, number, version, on_hand, committed));
                    reservation_changes(inventory, number, &version.rows, &mut events);
                }
            }
            if let (Some(on_hand), Some(committed)) = (on_hand, committed) {
                kept.push((inventory, on_hand, committed));
            }
        }

        for r in self.recorded {
            // An order's change goes before the stock it moved; a
            // checkout, after its version's stock and reservation changes.
            let (rank, subject) = match r.kind {
                EventType::OrderChanged => (0, "orderId"),
                // An entry's changes are ordered by its own version.
                EventType::WaitlistChanged => (0, "entryId"),
                EventType::StockChanged | EventType::ReservationChanged => (2, "inventoryId"),
            };
            events.push(Event {
                key: r.subject_id,
                version: r.version,
                rank,
                then: r.return_number.unwrap_or(0),
                id: r.id,
                kind: r.kind,
                subject,
                occurred_at: r.occurred_at,
                data: r.data.clone(),
            });
        }
        events.sort_by_key(|e| (e.key, e.version, e.rank, e.then, e.id));
        let rows = outbox::rows(last_seq, &events, |event, body| {
            render(event, body);
            (event.id, event.kind)
        });
        Made { events: events.len() as i64, rows, units: kept }
    }

    /// The `STOCK_CHANGED` event of one version.
    fn stock_changed(
        &self,
        inventory: Uuid,
        number: i32,
        version: &mut Version<'_>,
        on_hand: Option<i64>,
        committed: Option<i64>,
    ) -> Event {
        // Locations in id order, rows from before locations (none) last.
        version.rows.sort_by_key(|m| (m.location_id.is_none(), m.location_id));
        let rows = &version.rows;
        let reason = StockReason::of(rows).map(StockReason::spelled).unwrap_or_default();
        let delta: i64 = rows.iter().map(|m| i64::from(m.delta)).sum();
        let available = rows.iter().map(|m| m.stock_after).min().unwrap_or(0);
        let mut data = format!(r#"{{"reason":"{reason}","#);
        // An adjustment's one row says why the operator made it.
        if let Some(why) = rows.iter().find_map(|m| m.adjustment_reason) {
            let _ = write!(data, r#""adjustmentReason":"{}","#, why.to_value());
        }
        let _ = write!(data, r#""delta":{delta},"locations":["#);
        let mut first = true;
        for m in rows.iter() {
            let Some(location) = m.location_id.or(self.home) else { continue };
            if !first {
                data.push(',');
            }
            first = false;
            data.push_str(r#"{"locationId":""#);
            push_uuid(&mut data, location);
            let _ = write!(data, r#"","delta":{}}}"#, m.delta);
        }
        let _ = write!(data, r#"],"available":{available},"reserved":"#);
        match (on_hand, committed) {
            (Some(on_hand), Some(committed)) => {
                let reserved = on_hand - i64::from(available) - committed;
                let _ = write!(data, r#"{reserved},"committed":{committed},"onHand":{on_hand}"#);
            }
            _ => data.push_str(r#"null,"committed":null,"onHand":null"#),
        }
        data.push_str(r#","reservationId":"#);
        push_id(&mut data, rows.first().and_then(|m| m.reservation_id));
        data.push_str(r#","orderId":"#);
        push_id(&mut data, rows.first().and_then(|m| m.order_id));
        data.push('}');
        Event {
            key: inventory,
            version: number,
            rank: 0,
            then: 0,
            id: rows.iter().map(|m| m.id).min().unwrap_or_default(),
            kind: EventType::StockChanged,
            subject: "inventoryId",
            occurred_at: rows.iter().map(|m| m.created_at).max().unwrap_or_default(),
            data,
        }
    }
}

/// The `RESERVATION_CHANGED` events a version's ledger rows record: one per
/// reservation whose status they change. Its id is made from its first
/// ledger row's, so a pass run again names it the same.
fn reservation_changes(inventory: Uuid, number: i32, rows: &[&Move], events: &mut Vec<Event>) {
    let mut by_reservation: BTreeMap<Uuid, (ReservationStatus, Vec<&Move>)> = BTreeMap::new();
    for m in rows {
        // A change's rows (one per location) share its reason, so the
        // first row of a reservation names the status they leave it in.
        if let (Some(reservation), Some(status)) = (m.reservation_id, status_after(m.reason)) {
            by_reservation.entry(reservation).or_insert((status, Vec::new())).1.push(m);
        }
    }
    for (reservation, (status, rows)) in by_reservation {
        let status = status.to_value();
        let quantity = rows.iter().map(|m| i64::from(m.delta)).sum::<i64>().abs();
        let mut data = String::with_capacity(120);
        data.push_str(r#"{"reservationId":""#);
        push_uuid(&mut data, reservation);
        let _ = write!(data, r#"","status":"{status}","quantity":{quantity},"orderId":"#);
        push_id(&mut data, rows.first().and_then(|m| m.order_id));
        data.push_str(r#","kitReservationId":"#);
        push_id(&mut data, rows.first().and_then(|m| m.kit_reservation_id));
        data.push('}');
        let first = rows.iter().map(|m| m.id).min().unwrap_or_default();
        let mut id = [0; 16];
        id.copy_from_slice(&Md5::digest(format!("{first}/reservation").as_bytes()));
        events.push(Event {
            key: inventory,
            version: number,
            rank: 1,
            then: 0,
            id: Uuid::from_bytes(id),
            kind: EventType::ReservationChanged,
            subject: "inventoryId",
            occurred_at: rows.iter().map(|m| m.created_at).max().unwrap_or_default(),
            data,
        });
    }
}

/// The status a ledger row of `reason` leaves its reservation in; none for
/// a change that leaves the status as it was (a quantity changed, a
/// transfer) or has no reservation.
fn status_after(reason: MovementReason) -> Option<ReservationStatus> {
    use MovementReason::*;
    match reason {
        Reserved => Some(ReservationStatus::Active),
        Released | OrderCancelled => Some(ReservationStatus::Released),
        Expired => Some(ReservationStatus::Expired),
        Ordered => Some(ReservationStatus::Ordered),
        Fulfilled => Some(ReservationStatus::Fulfilled),
        Created | Restocked | QuantityChanged | TransferredOut | TransferredIn | Returned | Adjusted => None,
    }
}

/// Why an inventory's version changed, as its `STOCK_CHANGED` event names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StockReason {
    /// One change, whose ledger rows (one per location it touched) share its reason.
    Moved(MovementReason),
    /// Units moved between two locations of the inventory: a TRANSFERRED_OUT
    /// and a TRANSFERRED_IN row, one change.
    Transferred,
}

impl StockReason {
    /// The reason of a version's ledger rows; none when it has none.
    fn of(rows: &[&Move]) -> Option<Self> {
        let transferring =
            |m: &&Move| matches!(m.reason, MovementReason::TransferredOut | MovementReason::TransferredIn);
        if rows.len() > 1 && rows.iter().all(transferring) {
            return Some(Self::Transferred);
        }
        rows.first().map(|m| Self::Moved(m.reason))
    }

    /// As an event spells it: the ledger's reason, or `TRANSFERRED`.
    fn spelled(self) -> String {
        match self {
            Self::Moved(reason) => reason.to_value(),
            Self::Transferred => "TRANSFERRED".to_owned(),
        }
    }
}

/// `"<id>"`, or `null`.
fn push_id(out: &mut String, id: Option<Uuid>) {
    match id {
        Some(id) => {
            out.push('"');
            push_uuid(out, id);
            out.push('"');
        }
        None => out.push_str("null"),
    }
}

/// `id` in its hyphenated lower-case form, as PostgreSQL prints a uuid
/// (without going through `fmt`).
fn push_uuid(out: &mut String, id: Uuid) {
    out.push_str(id.hyphenated().encode_lower(&mut Uuid::encode_buffer()));
}

/// One event as sent, its keys in the documented order (docs/webhooks.md).
fn render(e: &Event, out: &mut String) {
    out.push_str(r#"{"id":""#);
    push_uuid(out, e.id);
    out.push_str(r#"","type":""#);
    out.push_str(&e.kind.to_value());
    out.push_str(r#"","occurredAt":""#);
    timestamp(e.occurred_at, out);
    out.push_str(r#"",""#);
    out.push_str(e.subject);
    out.push_str(r#"":""#);
    push_uuid(out, e.key);
    out.push('"');
    if e.version != UNVERSIONED {
        let _ = write!(out, r#","version":{}"#, e.version);
    }
    let _ = write!(out, r#","data":{}}}"#, e.data);
}

/// `at` as PostgreSQL writes a `timestamptz` in JSON in UTC: microseconds
/// without their trailing zeros, none when whole. (Not `format`, whose
/// pattern is parsed at every call: a tenth of a pass.)
fn timestamp(at: DateTime<Utc>, out: &mut String) {
    let (year, month, day) = (at.year(), at.month(), at.day());
    let (hour, minute, second) = (at.hour(), at.minute(), at.second());
    let _ = write!(out, "{year:04}-{month:02}-{day:02}T{hour:02}:{minute:02}:{second:02}");
    let micros = at.nanosecond() / 1_000 % 1_000_000;
    if micros != 0 {
        let digits = format!("{micros:06}");
        out.push('.');
        out.push_str(digits.trim_end_matches('0'));
    }
    out.push_str("+00:00");
}

#[cfg(test)]
mod tests;
