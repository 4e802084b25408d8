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
        lines::{Line, LockedLine},
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

/// Checks and merges lines: each quantity and each merged sum in
/// `1..=max_quantity`, at most [`MAX_LINES`], one expected version and one
/// choice of locations per inventory. The result is sorted by inventory
/// id, the locking order.
pub(crate) fn merge(lines: &[LineInput], max_quantity: i32) -> Result<Vec<Line>, AppError> {
    if lines.is_empty() {
        return Err(AppError::bad_input("input.items", "input.items must name at least one inventory"));
    }
    let mut merged: BTreeMap<Uuid, Line> = BTreeMap::new();
    for (i, input) in lines.iter().enumerate() {
        let field = format!("input.items[{i}].quantity");
        validate::quantity(&field, input.quantity, max_quantity)?;
        let line = merged.entry(input.inventory_id).or_insert_with(|| Line {
            inventory_id: input.inventory_id,
            quantity: 0,
            expected_version: None,
            allocating: input.allocating.clone(),
        });
        if line.allocating != input.allocating {
            return Err(AppError::bad_input(
                format!("input.items[{i}].locationIds"),
                format!("inventory {} is named with two different choices of locations", input.inventory_id),
            ));
        }
        line.quantity = validate::quantity(&field, line.quantity + input.quantity, max_quantity)?;
        match (line.expected_version, input.expected_version) {
            (Some(a), Some(b)) if a != b => {
                return Err(AppError::bad_input(
                    format!("input.items[{i}].expectedVersion"),
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
            Some(Unavailable { inventory_id: line.inventory_id, reason, inventory, available })
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
            Unavailable { inventory_id: line.inventory_id, reason, inventory, available: None }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input(id: Uuid, quantity: i32, expected_version: Option<i32>) -> LineInput {
        LineInput { inventory_id: id, quantity, expected_version, allocating: Allocating::default() }
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
        let merged = merge(&[input(a, 2, None), input(b, 1, Some(4)), input(a, 3, Some(7))], 1000).expect("merge");
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
        assert!(merge(&[input(a, 1, None), elsewhere], 1000).is_err());
    }

    #[test]
    fn two_expected_versions_for_one_inventory_are_bad_input() {
        let a = Uuid::from_u128(1);
        assert!(merge(&[input(a, 1, Some(1)), input(a, 1, Some(2))], 1000).is_err());
    }

    #[test]
    fn empty_requests_and_merged_sums_over_the_limit_are_bad_input() {
        let a = Uuid::from_u128(1);
        assert!(merge(&[], 1000).is_err());
        assert!(merge(&[input(a, 600, None), input(a, 600, None)], 1000).is_err());
    }
}
