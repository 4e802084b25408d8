//! The rules of reservations that need no database: how a reservation's
//! status reads, the checking and merging of a multi-item request's lines
//! (`reserveMany`, `placeOrder`), and which of them locked inventory rows
//! cannot serve.
//!
//! Lines naming the same inventory are merged first and sorted by
//! inventory id, the one order rows are locked in, so two requests naming
//! the same inventories in opposite orders queue instead of deadlocking.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::{ReservationRow, ReservationStatus};
use crate::{
    error::AppError,
    inventory::InventoryRow,
    stock::{
        allocating::{Allocating, Strategy},
        lines::{KitPart, Line, LockedLine, Part},
    },
    validate,
};

/// `reservation`'s status as it reads at `now`: an ACTIVE one past its
/// expiry is EXPIRED at once, whether or not the sweeper has returned its
/// stock yet (those units count as held until it has).
pub(crate) fn status_at(reservation: &ReservationRow, now: DateTime<Utc>) -> ReservationStatus {
    match (reservation.status, reservation.expires_at) {
        (ReservationStatus::Active, Some(at)) if at <= now => ReservationStatus::Expired,
        (status, _) => status,
    }
}

/// Most lines in one request, after merging.
pub(crate) const MAX_LINES: usize = 100;

/// A line as the client sent it.
#[derive(Debug, Clone)]
pub(crate) struct LineInput {
    /// The inventory.
    pub inventory_id: Uuid,
    /// Units.
    pub quantity: i32,
    /// The version the client saw.
    pub expected_version: Option<i32>,
    /// Where its units may come from.
    pub allocating: Allocating,
}

/// Most location ids one request or line may name.
pub(crate) const MAX_LOCATION_IDS: usize = 100;

/// Checks a request's choice of locations: a list, when given, names 1 to
/// [`MAX_LOCATION_IDS`] locations, none twice (whether they exist is
/// checked against the database afterwards).
pub(crate) fn choice(
    field: &str,
    location_ids: Option<Vec<Uuid>>,
    strategy: Strategy,
    allow_split: bool,
) -> Result<Allocating, AppError> {
    if let Some(ids) = &location_ids {
        if ids.is_empty() || ids.len() > MAX_LOCATION_IDS {
            return Err(AppError::bad_input(
                field,
                format!("{field} must name 1 to {MAX_LOCATION_IDS} locations, or be omitted for every location"),
            ));
        }
        let mut seen = std::collections::HashSet::new();
        if let Some(twice) = ids.iter().find(|id| !seen.insert(**id)) {
            return Err(AppError::bad_input(field, format!("{field} names location {twice} twice")));
        }
    }
    Ok(Allocating { location_ids, strategy, allow_split })
}

/// Checks and merges lines, each named by the field it came from
/// (`input.items[2]`): each quantity and each merged sum in
/// `1..=max_quantity`, at most [`MAX_LINES`], one expected version and one
/// choice of locations per inventory. The result is sorted by inventory
/// id, the locking order.
fn merge(lines: impl Iterator<Item = (String, LineInput)>, max_quantity: i32) -> Result<Vec<Line>, AppError> {
    let mut merged: BTreeMap<Uuid, Line> = BTreeMap::new();
    for (name, input) in lines {
        let field = format!("{name}.quantity");
        validate::quantity(&field, input.quantity, max_quantity)?;
        let line = merged.entry(input.inventory_id).or_insert_with(|| Line {
            inventory_id: input.inventory_id,
            quantity: 0,
            expected_version: None,
            allocating: input.allocating.clone(),
        });
        if line.allocating != input.allocating {
            return Err(AppError::bad_input(
                format!("{name}.locationIds"),
                format!("inventory {} is named with two different choices of locations", input.inventory_id),
            ));
        }
        line.quantity = validate::quantity(&field, line.quantity + input.quantity, max_quantity)?;
        match (line.expected_version, input.expected_version) {
            (Some(a), Some(b)) if a != b => {
                return Err(AppError::bad_input(
                    format!("{name}.expectedVersion"),
                    format!("inventory {} is named with two different expectedVersions", input.inventory_id),
                ));
            }
            (None, given) => line.expected_version = given,
            _ => {}
        }
    }
    if merged.len() > MAX_LINES {
        return Err(AppError::bad_input("input.items", format!("at most {MAX_LINES} inventories per request")));
    }
    Ok(merged.into_values().collect())
}

/// A kit line of a multi-item request, with its kit's components (each
/// inventory and its units per kit).
#[derive(Debug, Clone)]
pub(crate) struct KitLine {
    /// The kit.
    pub kit_id: Uuid,
    /// Kits.
    pub quantity: i32,
    /// Where every component's units may come from.
    pub allocating: Allocating,
    /// The kit's components.
    pub components: Vec<(Uuid, i32)>,
    /// Whether the kit may be reserved: an inactive kit's line is refused
    /// (`NOT_FOUND`) after a replay of the request's key is looked for, so
    /// a key still replays the first outcome once the kit is deactivated.
    pub active: bool,
}

/// A multi-item request, checked: its lines (one per inventory, loose units
/// and kit lines' units summed, as they are judged and allocated), the
/// reservations they are taken for (loose ones first, then each kit line's
/// components) and the kit reservations.
#[derive(Debug, Clone)]
pub(crate) struct Taking {
    /// One per inventory, sorted by id.
    pub lines: Vec<Line>,
    /// One per reservation to write.
    pub parts: Vec<Part>,
    /// One per kit line.
    pub kits: Vec<KitPart>,
    /// The kits of its kit lines that are inactive.
    inactive: Vec<Uuid>,
}

impl Taking {
    /// Checks and merges loose `items` and kit lines `kits` (see [`merge`]:
    /// a kit line's component units count toward its inventory's sum and
    /// must choose locations as any other line of it does); at least one
    /// item or kit line.
    pub(crate) fn new(items: &[LineInput], kits: &[KitLine], max_quantity: i32) -> Result<Self, AppError> {
        if items.is_empty() && kits.is_empty() {
            return Err(AppError::bad_input("input.items", "a request must name at least one inventory or kit"));
        }
        let loose =
            merge(items.iter().enumerate().map(|(i, line)| (format!("input.items[{i}]"), line.clone())), max_quantity)?;
        let mut named: Vec<(String, LineInput)> =
            items.iter().enumerate().map(|(i, line)| (format!("input.items[{i}]"), line.clone())).collect();
        let mut kit_parts = Vec::new();
        let mut parts = Part::loose(&loose);
        for (i, kit) in kits.iter().enumerate() {
            let name = format!("input.kits[{i}]");
            validate::quantity(&format!("{name}.quantity"), kit.quantity, max_quantity)?;
            let id = Uuid::new_v4();
            kit_parts.push(KitPart { id, kit_id: kit.kit_id, quantity: kit.quantity });
            for &(inventory_id, per_kit) in &kit.components {
                let quantity = kit.quantity.checked_mul(per_kit).unwrap_or(i32::MAX);
                named.push((
                    name.clone(),
                    LineInput { inventory_id, quantity, expected_version: None, allocating: kit.allocating.clone() },
                ));
                parts.push(Part { id: Uuid::new_v4(), inventory_id, quantity, kit_reservation_id: Some(id) });
            }
        }
        let inactive = kits.iter().filter(|kit| !kit.active).map(|kit| kit.kit_id).collect();
        Ok(Self { lines: merge(named.into_iter(), max_quantity)?, parts, kits: kit_parts, inactive })
    }

    /// The kit lines whose kit is inactive, as `NOT_FOUND` items (the kit's
    /// id as their inventory's): what the request answers when it is not
    /// the replay of a key.
    pub(crate) fn inactive(&self) -> Vec<Unavailable> {
        self.inactive.iter().map(|&kit_id| Unavailable::missing_kit(kit_id)).collect()
    }

    /// The kit of the first kit line naming `inventory_id`, if any: what a
    /// short line names as its kit.
    pub(crate) fn kit_of(&self, inventory_id: Uuid) -> Option<Uuid> {
        let part = self.parts.iter().find(|p| p.inventory_id == inventory_id && p.kit_reservation_id.is_some())?;
        self.kits.iter().find(|k| Some(k.id) == part.kit_reservation_id).map(|k| k.kit_id)
    }
}

/// Why a line could not be served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum UnavailableReason {
    /// Not enough stock.
    SoldOut,
    /// The row is no longer at the expected version.
    Conflict,
    /// No inventory has that id.
    NotFound,
}

/// A line that could not be served, with the latest state of its inventory.
#[derive(Debug, Clone)]
pub(crate) struct Unavailable {
    /// The inventory the line named.
    pub inventory_id: Uuid,
    /// Why.
    pub reason: UnavailableReason,
    /// The latest committed row (none when not found).
    pub inventory: Option<InventoryRow>,
    /// What the line's eligible locations held (its sum, or without a
    /// split the largest), when it was sold out.
    pub available: Option<i32>,
    /// The kit of a kit line that named the inventory (the first), if any.
    pub kit_id: Option<Uuid>,
}

impl Unavailable {
    /// A kit line whose kit is unknown or inactive: `NOT_FOUND`, the kit's
    /// id as its inventory's and as its kit's.
    pub(crate) fn missing_kit(kit_id: Uuid) -> Self {
        Self {
            inventory_id: kit_id,
            reason: UnavailableReason::NotFound,
            inventory: None,
            available: None,
            kit_id: Some(kit_id),
        }
    }
}

/// Every line the locked rows cannot serve.
pub(crate) fn judge(lines: &[Line], locked: &[LockedLine]) -> Vec<Unavailable> {
    lines
        .iter()
        .filter_map(|line| {
            let row = locked.iter().find(|row| row.inventory.id == line.inventory_id);
            let (reason, available) = match row {
                None => (UnavailableReason::NotFound, None),
                // The same order of reasons as a single `reserve`: stock first.
                Some(row) if !row.feasible => (UnavailableReason::SoldOut, Some(row.eligible)),
                Some(row) if line.expected_version.is_some_and(|v| v != row.inventory.version) => {
                    (UnavailableReason::Conflict, None)
                }
                Some(_) => return None,
            };
            let inventory = row.map(|row| row.inventory.clone());
            Some(Unavailable { inventory_id: line.inventory_id, reason, inventory, available, kit_id: None })
        })
        .collect()
}

/// Every line as a conflict beside `latest`, the rows as they are now (a
/// line whose inventory is missing is not found): what a multi-item request
/// answers when its collision retries ran out.
pub(crate) fn in_conflict(lines: &[Line], latest: &[InventoryRow]) -> Vec<Unavailable> {
    lines
        .iter()
        .map(|line| {
            let inventory = latest.iter().find(|row| row.id == line.inventory_id).cloned();
            let reason = if inventory.is_some() { UnavailableReason::Conflict } else { UnavailableReason::NotFound };
            Unavailable { inventory_id: line.inventory_id, reason, inventory, available: None, kit_id: None }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input(id: Uuid, quantity: i32, expected_version: Option<i32>) -> LineInput {
        LineInput { inventory_id: id, quantity, expected_version, allocating: Allocating::default() }
    }

    /// The merged lines of a request of `items` and no kit line.
    fn lines(items: &[LineInput]) -> Result<Vec<Line>, AppError> {
        Taking::new(items, &[], 1000).map(|taking| taking.lines)
    }

    #[test]
    fn a_kit_line_and_a_loose_line_of_its_component_are_judged_as_one_line_and_kept_as_two_parts() {
        let (a, b, kit) = (Uuid::from_u128(1), Uuid::from_u128(2), Uuid::from_u128(9));
        let kit_line = KitLine {
            kit_id: kit,
            quantity: 2,
            allocating: Allocating::default(),
            components: vec![(a, 3), (b, 1)],
            active: true,
        };
        let taking = Taking::new(&[input(a, 1, None)], std::slice::from_ref(&kit_line), 1000).expect("taking");
        assert_eq!(taking.lines.iter().map(|l| (l.inventory_id, l.quantity)).collect::<Vec<_>>(), vec![(a, 7), (b, 2)]);
        let parts: Vec<(Uuid, i32, bool)> =
            taking.parts.iter().map(|p| (p.inventory_id, p.quantity, p.kit_reservation_id.is_some())).collect();
        assert_eq!(parts, vec![(a, 1, false), (a, 6, true), (b, 2, true)]);
        assert_eq!((taking.kit_of(a), taking.kit_of(b)), (Some(kit), Some(kit)));
        let too_many = KitLine { quantity: 400, ..kit_line };
        assert!(Taking::new(&[input(a, 1, None)], &[too_many], 1000).is_err(), "1201 units of a");
    }

    #[test]
    fn an_active_reservation_reads_expired_from_its_expiry_on() {
        let now = Utc::now();
        let row = |status, expires_at| ReservationRow {
            id: Uuid::nil(),
            inventory_id: Uuid::nil(),
            order_id: None,
            user_id: "alice".into(),
            quantity: 1,
            status,
            idempotency_key: None,
            request_fingerprint: None,
            created_at: now,
            expires_at,
            multi_item_id: None,
            location_ids: None,
            fewest_locations: None,
            allow_split: None,
            returned: 0,
            kit_reservation_id: None,
        };
        let (past, future) = (Some(now - chrono::Duration::seconds(1)), Some(now + chrono::Duration::seconds(1)));
        assert_eq!(status_at(&row(ReservationStatus::Active, past), now), ReservationStatus::Expired);
        assert_eq!(status_at(&row(ReservationStatus::Active, Some(now)), now), ReservationStatus::Expired);
        assert_eq!(status_at(&row(ReservationStatus::Active, future), now), ReservationStatus::Active);
        assert_eq!(status_at(&row(ReservationStatus::Active, None), now), ReservationStatus::Active);
        assert_eq!(status_at(&row(ReservationStatus::Released, past), now), ReservationStatus::Released);
    }

    #[test]
    fn lines_for_one_inventory_are_summed_and_sorted_by_id() {
        let (a, b) = (Uuid::from_u128(2), Uuid::from_u128(1));
        let merged = lines(&[input(a, 2, None), input(b, 1, Some(4)), input(a, 3, Some(7))]).expect("merge");
        assert_eq!(
            merged,
            vec![
                Line { inventory_id: b, quantity: 1, expected_version: Some(4), allocating: Allocating::default() },
                Line { inventory_id: a, quantity: 5, expected_version: Some(7), allocating: Allocating::default() },
            ]
        );
    }

    #[test]
    fn two_choices_of_locations_for_one_inventory_are_bad_input() {
        let a = Uuid::from_u128(1);
        let mut elsewhere = input(a, 1, None);
        elsewhere.allocating.location_ids = Some(vec![Uuid::from_u128(9)]);
        assert!(lines(&[input(a, 1, None), elsewhere]).is_err());
    }

    #[test]
    fn two_expected_versions_for_one_inventory_are_bad_input() {
        let a = Uuid::from_u128(1);
        assert!(lines(&[input(a, 1, Some(1)), input(a, 1, Some(2))]).is_err());
    }

    #[test]
    fn empty_requests_and_merged_sums_over_the_limit_are_bad_input() {
        let a = Uuid::from_u128(1);
        assert!(lines(&[]).is_err());
        assert!(lines(&[input(a, 600, None), input(a, 600, None)]).is_err());
    }
}
