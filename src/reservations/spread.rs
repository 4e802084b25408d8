//! What this process has learnt of which inventories are held in several
//! places, to send their reservations the short way: a caller alone
//! straight across the levels, a batch naming one to the statement that
//! takes across levels.

use std::{
    collections::HashSet,
    sync::{Mutex, MutexGuard, PoisonError},
};

use uuid::Uuid;

use crate::inventory::InventoryRow;

/// The inventories this process has seen held in several places, so that
/// a request that may take from anywhere goes to one of them straight
/// across its levels instead of first trying its one level, failing and
/// reading why. What it remembers stays true: an inventory's levels are
/// never removed, so once held in two places it never is in one again
/// (`sole_location_id` never comes back). Bounded: past [`MAX_SPREAD`] it
/// learns no more, and requests for the rest take the longer way.
#[derive(Debug, Default)]
pub(crate) struct Spread(Mutex<HashSet<Uuid>>);

/// Most inventories a [`Spread`] remembers.
pub(crate) const MAX_SPREAD: usize = 100_000;

impl Spread {
    fn held(&self) -> MutexGuard<'_, HashSet<Uuid>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether `inventory_id` is known to be held in several places.
    pub(crate) fn contains(&self, inventory_id: Uuid) -> bool {
        self.held().contains(&inventory_id)
    }

    /// Remembers `inventory` when it is held in several places.
    pub(super) fn learn(&self, inventory: &InventoryRow) {
        if inventory.sole_location_id.is_none() {
            let mut held = self.held();
            if held.len() < MAX_SPREAD {
                held.insert(inventory.id);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use chrono::Utc;

    use super::*;

    fn inventory(sole_location_id: Option<Uuid>) -> InventoryRow {
        let now = Utc::now();
        InventoryRow {
            id: Uuid::new_v4(),
            sku: "SKU".into(),
            name: "item".into(),
            stock: 1,
            version: 1,
            created_at: now,
            updated_at: now,
            sole_location_id,
        }
    }

    #[test]
    fn only_inventories_held_in_several_places_are_remembered() {
        let spread = Spread::default();
        let (one_place, several) = (inventory(Some(Uuid::new_v4())), inventory(None));
        spread.learn(&one_place);
        spread.learn(&several);
        assert!(!spread.contains(one_place.id));
        assert!(spread.contains(several.id));
    }

    #[test]
    fn it_stops_learning_at_its_bound() {
        let spread = Spread::default();
        spread.held().extend((0..MAX_SPREAD as u128).map(Uuid::from_u128));
        let late = inventory(None);
        spread.learn(&late);
        assert!(!spread.contains(late.id));
    }
}
