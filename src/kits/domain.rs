//! The rules of kits that need no database: a new kit's components
//! flattened (a component given as a kit is replaced by that kit's
//! components, a component named by two sub-kits counted once with the
//! summed quantity) and checked, and the lines a kit reservation takes.

use std::collections::{BTreeMap, HashSet};

use uuid::Uuid;

use crate::{
    error::AppError,
    stock::{allocating::Allocating, lines::Line},
};

/// Most inventories in a kit, after flattening.
pub(crate) const MAX_COMPONENTS: usize = 50;

/// Most units of one inventory in one kit, given or flattened.
pub(crate) const MAX_COMPONENT_QUANTITY: i32 = 1000;

/// A component as the operator gave it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Part {
    /// Units of an inventory.
    Inventory(Uuid),
    /// Whole kits, flattened into their components.
    Kit(Uuid),
}

/// A component given: what, and how many per kit.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ComponentInput {
    /// An inventory or a kit.
    pub part: Part,
    /// Per kit, 1 to [`MAX_COMPONENT_QUANTITY`].
    pub quantity: i32,
}

/// Flattens and checks a new kit's components: `sub_kits` gives the
/// components (inventory, quantity) of each kit named. Empty lists, a part
/// named twice, a quantity out of range (given, or once flattened) and
/// more than [`MAX_COMPONENTS`] inventories are `BAD_USER_INPUT`; unknown
/// kits are the caller's to find (they are missing from `sub_kits`).
/// Sorted by inventory id.
pub(crate) fn flatten(
    components: &[ComponentInput],
    sub_kits: &BTreeMap<Uuid, Vec<(Uuid, i32)>>,
) -> Result<Vec<(Uuid, i32)>, AppError> {
    if components.is_empty() {
        return Err(AppError::bad_input("input.components", "a kit needs at least one component"));
    }
    let mut named = HashSet::new();
    let mut flat: BTreeMap<Uuid, i32> = BTreeMap::new();
    for (i, component) in components.iter().enumerate() {
        let field = format!("input.components[{i}]");
        let quantity =
            crate::validate::within(&format!("{field}.quantity"), component.quantity, 1..=MAX_COMPONENT_QUANTITY)?;
        if !named.insert(component.part) {
            return Err(AppError::bad_input(&field, format!("{field} names a component given before")));
        }
        let parts = match component.part {
            Part::Inventory(id) => vec![(id, 1)],
            Part::Kit(id) => sub_kits
                .get(&id)
                .cloned()
                .ok_or_else(|| AppError::bad_input(&field, format!("no active or inactive kit has id {id}")))?,
        };
        for (inventory_id, per_part) in parts {
            let total = flat.entry(inventory_id).or_default();
            *total = total.saturating_add(per_part.saturating_mul(quantity));
            if *total > MAX_COMPONENT_QUANTITY {
                return Err(AppError::bad_input(
                    &field,
                    format!("inventory {inventory_id} would be {MAX_COMPONENT_QUANTITY}+ units of one kit"),
                ));
            }
        }
    }
    if flat.len() > MAX_COMPONENTS {
        return Err(AppError::bad_input(
            "input.components",
            format!("a kit holds at most {MAX_COMPONENTS} inventories once flattened, this one {}", flat.len()),
        ));
    }
    Ok(flat.into_iter().collect())
}

/// The lines a reservation of `quantity` kits takes: kits × component
/// quantity of every component (sorted by inventory id, as components are
/// read), each choosing locations by `allocating`; `BAD_USER_INPUT` when a
/// line would exceed `max_quantity`.
pub(crate) fn lines(
    components: &[(Uuid, i32)],
    quantity: i32,
    allocating: &Allocating,
    max_quantity: i32,
) -> Result<Vec<Line>, AppError> {
    components
        .iter()
        .map(|&(inventory_id, per_kit)| {
            let units = quantity.checked_mul(per_kit).filter(|units| *units <= max_quantity).ok_or_else(|| {
                AppError::bad_input(
                    "input.quantity",
                    format!("{quantity} kits take more than {max_quantity} units of inventory {inventory_id}"),
                )
            })?;
            Ok(Line { inventory_id, quantity: units, expected_version: None, allocating: allocating.clone() })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: u128) -> Uuid {
        Uuid::from_u128(n)
    }

    fn given(part: Part, quantity: i32) -> ComponentInput {
        ComponentInput { part, quantity }
    }

    #[test]
    fn a_component_shared_by_two_sub_kits_counts_once_with_the_summed_quantity() {
        let sub_kits = BTreeMap::from([(id(10), vec![(id(1), 1), (id(2), 2)]), (id(11), vec![(id(2), 1)])]);
        let flat = flatten(
            &[given(Part::Kit(id(10)), 2), given(Part::Kit(id(11)), 1), given(Part::Inventory(id(3)), 4)],
            &sub_kits,
        )
        .expect("flatten");
        assert_eq!(flat, vec![(id(1), 2), (id(2), 5), (id(3), 4)]);
    }

    #[test]
    fn empty_twice_named_unknown_and_oversized_components_are_bad_input() {
        let none = BTreeMap::new();
        assert!(flatten(&[], &none).is_err());
        assert!(flatten(&[given(Part::Inventory(id(1)), 1), given(Part::Inventory(id(1)), 2)], &none).is_err());
        assert!(flatten(&[given(Part::Kit(id(9)), 1)], &none).is_err());
        assert!(flatten(&[given(Part::Inventory(id(1)), 0)], &none).is_err());
        assert!(flatten(&[given(Part::Inventory(id(1)), 1001)], &none).is_err());
        let big = BTreeMap::from([(id(10), vec![(id(1), 600)])]);
        assert!(flatten(&[given(Part::Kit(id(10)), 2)], &big).is_err());
        let many: Vec<ComponentInput> = (0..51).map(|n| given(Part::Inventory(id(n)), 1)).collect();
        assert!(flatten(&many, &none).is_err());
    }

    #[test]
    fn a_kit_line_takes_kits_times_the_component_quantity() {
        let lines = lines(&[(id(1), 2), (id(2), 1)], 3, &Allocating::default(), 1000).expect("lines");
        assert_eq!(lines.iter().map(|l| l.quantity).collect::<Vec<_>>(), vec![6, 3]);
        assert!(super::lines(&[(id(1), 600)], 2, &Allocating::default(), 1000).is_err());
    }
}
