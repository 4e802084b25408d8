//! How a request chooses the locations its units come from, what each
//! level offers it (its units above the level's safety stock, [`offered`]),
//! and what the eligible locations hold when they cannot give them.
//!
//! The rules themselves live in one place, the database function
//! `allocate(available, wanted, fewest, split)` that every taking statement
//! calls on the levels it has locked (migration
//! `m20261207_090000_keep_stock_per_location`; docs/locations.md), so a
//! decision and the write it leads to are made in one statement over the
//! same rows. [`model`] is the same rules in Rust, for the tests that
//! compare outcomes against them.

use std::sync::LazyLock;

use sea_orm::{DbBackend, Statement, Value};
use uuid::Uuid;

/// How the locations are chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Strategy {
    /// Fill from the eligible locations in order of preference, splitting
    /// when one is short.
    #[default]
    Priority,
    /// One location if any can give it all (by preference); else the
    /// fewest, largest first.
    FewestLocations,
}

/// A request's choice of locations. The default (every active location, by
/// priority then code, PRIORITY, splitting allowed) is what a request that
/// names no location gets, and what a reservation stores as NULLs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allocating {
    /// Only these locations, in this order of preference; `None`: every
    /// active location, by priority then code.
    pub location_ids: Option<Vec<Uuid>>,
    /// How to choose among them.
    pub strategy: Strategy,
    /// Whether the units may come from several locations.
    pub allow_split: bool,
}

impl Default for Allocating {
    /// Every active location, by priority, splitting allowed.
    fn default() -> Self {
        Self { location_ids: None, strategy: Strategy::Priority, allow_split: true }
    }
}

impl Allocating {
    /// Whether this is the default choice (what a request naming no
    /// location gets).
    pub(crate) fn is_default(&self) -> bool {
        *self == Self::default()
    }

    /// Whether this takes from any active location, however it splits: a
    /// request that may take from anywhere takes from an inventory with one
    /// level directly (every strategy chooses that level).
    pub(crate) fn is_anywhere(&self) -> bool {
        self.location_ids.is_none()
    }

    /// The choice a reservation row stored.
    pub(crate) fn stored(location_ids: Option<Vec<Uuid>>, fewest: Option<bool>, allow_split: Option<bool>) -> Self {
        Self {
            location_ids,
            strategy: if fewest == Some(true) { Strategy::FewestLocations } else { Strategy::Priority },
            allow_split: allow_split.unwrap_or(true),
        }
    }

    /// The three values a statement binds and a reservation stores:
    /// `location_ids`, `fewest_locations`, `allow_split`, each NULL when
    /// it is the default, so a plain reservation stores nothing more.
    pub(crate) fn columns(&self) -> (Option<Vec<Uuid>>, Option<bool>, Option<bool>) {
        (
            self.location_ids.clone(),
            (self.strategy == Strategy::FewestLocations).then_some(true),
            (!self.allow_split).then_some(false),
        )
    }

    /// The values bound for [`available`]'s parameters (`ids`, `fewest`, `split`).
    pub(crate) fn values(&self) -> [Value; 3] {
        let (ids, fewest, split) = self.columns();
        [Value::from(ids), Value::from(fewest.unwrap_or(false)), Value::from(split.unwrap_or(true))]
    }
}

/// The condition of a level that a request may take from, given the
/// request's location ids as the `uuid[]` expression `ids` (NULL: any): its
/// location is active and, when ids are given, among them. It names the
/// columns `location_id` (the level's) and `active` (its location's)
/// unqualified, so it reads a level joined to its location and a row of
/// both alike.
pub(crate) fn eligible(ids: &str) -> String {
    format!("active AND ({ids} IS NULL OR location_id = ANY({ids}))")
}

/// The order of preference among levels for a request whose location ids
/// are the `uuid[]` expression `ids`: the list's order when given, else
/// priority then code (columns `location_id`, `priority`, `code`, unqualified
/// as in [`eligible`]).
pub(crate) fn preference(ids: &str) -> String {
    format!("array_position({ids}, location_id), priority, code")
}

/// What a level offers a request: its available units above its safety
/// stock (`greatest(available - safety_stock, 0)`, its sellable units),
/// or, when `use_safety` (a boolean expression: an operator's
/// `useSafetyStock`) is true, all of them. `None`: the request is a
/// customer's, which never takes safety stock. The one home of that rule:
/// every statement that takes stock for a reservation or an order line
/// allocates what this offers, never `available` itself, so no customer
/// path can take a level's last `safety_stock` units. It names the columns
/// `available` and `safety_stock` of the level aliased `alias` (`""`,
/// `"v."`), as [`eligible`] names its columns.
pub fn offered(alias: &str, use_safety: Option<&str>) -> String {
    let sellable = format!("greatest({alias}available - {alias}safety_stock, 0)");
    match use_safety {
        None => sellable,
        Some(flag) => format!("CASE WHEN {flag} THEN {alias}available ELSE {sellable} END"),
    }
}

/// The safety stock of the one level of an inventory held in one place
/// (`sole_location_id`), read by key through the inventory row aliased
/// `alias` (`"inventories."`, `"i."`: qualified, since it is read in a
/// subquery); NULL for an inventory held in several places.
/// Unlocked: a statement that takes from the row alone decides with it
/// instead of locking the level first, so a change of it that commits while
/// such a statement runs applies from the next statement on
/// (docs/stock-operations.md, "Safety stock").
pub fn sole_safety_stock(alias: &str) -> String {
    format!(
        "(SELECT safety_stock FROM stock_levels WHERE inventory_id = {alias}id AND location_id = {alias}sole_location_id)"
    )
}

/// [`offered`] for an inventory held in one place, whose units are all at
/// its one level, through its row aliased `alias`: its `stock` less that
/// level's safety stock ([`sole_safety_stock`]), unless `use_safety` (a
/// boolean expression) is true. Not floored at 0: it is compared with a
/// quantity of at least 1.
pub fn sole_offered(alias: &str, use_safety: &str) -> String {
    format!("({alias}stock - CASE WHEN {use_safety} THEN 0 ELSE {} END)", sole_safety_stock(alias))
}

/// What the eligible levels hold for a request, as an aggregate over them
/// of what each offers it (`offered`, an expression of [`offered`]), given
/// whether it may split (`split`, a boolean expression): their sum, or with
/// no split allowed the largest of them, since one level must then give it
/// all; 0 for none. What a refused request is told (`SoldOut.available`),
/// and what [`super::lines::lock_lines`] says of each line.
pub fn held(split: &str, offered: &str) -> String {
    format!("coalesce(CASE WHEN {split} THEN sum({offered}) ELSE max({offered}) END, 0)::integer")
}

/// What the eligible levels of `inventory_id` offer a request choosing by
/// `allocating` ([`held`]), a customer's or, with `use_safety`, an
/// operator's taking safety stock too, read after it could not be served.
/// One row, `available`.
pub fn available(inventory_id: Uuid, allocating: &Allocating, use_safety: bool) -> Statement {
    let [ids, _fewest, split] = allocating.values();
    static SQL: LazyLock<String> = LazyLock::new(|| {
        format!(
            "SELECT {} AS available \
               FROM stock_levels l JOIN locations c ON c.id = l.location_id \
              WHERE inventory_id = $1 AND {}",
            held("$3", &offered("l.", Some("$4::boolean"))),
            eligible("$2::uuid[]")
        )
    });
    Statement::from_sql_and_values(
        DbBackend::Postgres,
        SQL.as_str(),
        [inventory_id.into(), ids, split, use_safety.into()],
    )
}

/// Which of `ids` name no location: one row (`id`) per unknown id, none
/// when all are known.
pub(crate) fn unknown(ids: &[Uuid]) -> Statement {
    Statement::from_sql_and_values(
        DbBackend::Postgres,
        "SELECT u.id FROM unnest($1::uuid[]) AS u(id) WHERE NOT EXISTS (SELECT 1 FROM locations WHERE id = u.id)",
        [Value::from(ids.to_vec())],
    )
}

/// The allocation rules in Rust, as the database function applies them:
/// what to take from each of `available` (the eligible levels, in order of
/// preference), or `None` when they cannot give `wanted`. For the tests
/// that compare outcomes against a model; the server never decides here.
pub fn model(available: &[i32], wanted: i32, strategy: Strategy, allow_split: bool) -> Option<Vec<i32>> {
    let fewest = strategy == Strategy::FewestLocations;
    let mut take = vec![0; available.len()];
    if wanted <= 0 {
        return None;
    }
    if fewest || !allow_split {
        if let Some(i) = available.iter().position(|&a| a >= wanted) {
            take[i] = wanted;
            return Some(take);
        }
        if !allow_split {
            return None;
        }
    }
    let mut order: Vec<usize> = (0..available.len()).collect();
    if fewest {
        // Largest first; the sort is stable, so ties keep their preference.
        order.sort_by_key(|&i| std::cmp::Reverse(available[i]));
    }
    let mut missing = wanted;
    for i in order {
        if missing == 0 {
            break;
        }
        take[i] = available[i].min(missing).max(0);
        missing -= take[i];
    }
    (missing == 0).then_some(take)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn priority_fills_in_order_with_a_running_remainder() {
        assert_eq!(model(&[2, 0, 5, 9], 6, Strategy::Priority, true), Some(vec![2, 0, 4, 0]));
        assert_eq!(model(&[2, 3], 6, Strategy::Priority, true), None);
    }

    #[test]
    fn fewest_prefers_one_location_then_the_largest() {
        assert_eq!(model(&[2, 7, 9], 6, Strategy::FewestLocations, true), Some(vec![0, 6, 0]));
        assert_eq!(model(&[2, 4, 4], 7, Strategy::FewestLocations, true), Some(vec![0, 4, 3]));
    }

    #[test]
    fn without_a_split_one_location_gives_all_or_nothing() {
        assert_eq!(model(&[5, 5], 6, Strategy::Priority, false), None);
        assert_eq!(model(&[5, 6], 6, Strategy::Priority, false), Some(vec![0, 6]));
    }

    #[test]
    fn a_default_choice_stores_nothing() {
        assert_eq!(Allocating::default().columns(), (None, None, None));
    }
}
