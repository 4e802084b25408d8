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
use crate::{error::AppError, inventory::InventoryRow, stock::taking::Line, validate};

/// `reservation`'s status as it reads at `now`: an ACTIVE one past its
/// expiry is EXPIRED at once, whether or not the sweeper has returned its
/// stock yet (those units count as held until it has).
pub fn status_at(reservation: &ReservationRow, now: DateTime<Utc>) -> ReservationStatus {
    match (reservation.status, reservation.expires_at) {
        (ReservationStatus::Active, Some(at)) if at <= now => ReservationStatus::Expired,
        (status, _) => status,
    }
}

/// Most lines in one request, after merging.
pub const MAX_LINES: usize = 100;

/// A line as the client sent it.
#[derive(Debug, Clone)]
pub struct LineInput {
    /// The inventory.
    pub inventory_id: Uuid,
    /// Units.
    pub quantity: i32,
    /// The version the client saw.
    pub expected_version: Option<i32>,
}

/// Checks and merges lines: each quantity and each merged sum in
/// `1..=max_quantity`, at most [`MAX_LINES`], one expected version per
/// inventory. The result is sorted by inventory id, the locking order.
pub fn merge(lines: &[LineInput], max_quantity: i32) -> Result<Vec<Line>, AppError> {
    if lines.is_empty() {
        return Err(AppError::bad_input("input.items", "input.items must name at least one inventory"));
    }
    let mut merged: BTreeMap<Uuid, Line> = BTreeMap::new();
    for (i, input) in lines.iter().enumerate() {
        let field = format!("input.items[{i}].quantity");
        validate::quantity(&field, input.quantity, max_quantity)?;
        let line = merged.entry(input.inventory_id).or_insert(Line {
            inventory_id: input.inventory_id,
            quantity: 0,
            expected_version: None,
        });
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
pub enum UnavailableReason {
    /// Not enough stock.
    SoldOut,
    /// The row is no longer at the expected version.
    Conflict,
    /// No inventory has that id.
    NotFound,
}

/// A line that could not be served, with the latest state of its inventory.
#[derive(Debug, Clone)]
pub struct Unavailable {
    /// The inventory the line named.
    pub inventory_id: Uuid,
    /// Why.
    pub reason: UnavailableReason,
    /// The latest committed row (none when not found).
    pub inventory: Option<InventoryRow>,
}

/// Every line the locked rows cannot serve.
pub fn judge(lines: &[Line], locked: &[InventoryRow]) -> Vec<Unavailable> {
    lines
        .iter()
        .filter_map(|line| {
            let row = locked.iter().find(|row| row.id == line.inventory_id);
            let reason = match row {
                None => UnavailableReason::NotFound,
                // The same order of reasons as a single `reserve`: stock first.
                Some(row) if row.stock < line.quantity => UnavailableReason::SoldOut,
                Some(row) if line.expected_version.is_some_and(|v| v != row.version) => UnavailableReason::Conflict,
                Some(_) => return None,
            };
            Some(Unavailable { inventory_id: line.inventory_id, reason, inventory: row.cloned() })
        })
        .collect()
}

/// Every line as a conflict beside `latest`, the rows as they are now (a
/// line whose inventory is missing is not found): what a multi-item request
/// answers when its collision retries ran out.
pub fn in_conflict(lines: &[Line], latest: &[InventoryRow]) -> Vec<Unavailable> {
    lines
        .iter()
        .map(|line| {
            let inventory = latest.iter().find(|row| row.id == line.inventory_id).cloned();
            let reason = if inventory.is_some() { UnavailableReason::Conflict } else { UnavailableReason::NotFound };
            Unavailable { inventory_id: line.inventory_id, reason, inventory }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input(id: Uuid, quantity: i32, expected_version: Option<i32>) -> LineInput {
        LineInput { inventory_id: id, quantity, expected_version }
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
                Line { inventory_id: b, quantity: 1, expected_version: Some(4) },
                Line { inventory_id: a, quantity: 5, expected_version: Some(7) },
            ]
        );
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
