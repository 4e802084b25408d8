//! The inputs of taking stock: one reservation (`ReserveInput`) and the
//! lines of a multi-item request (`ReserveItemInput`, `ReserveManyInput`),
//! with the choice of locations both carry.

use async_graphql::{Enum, InputObject};
use uuid::Uuid;

use crate::{
    error::AppError,
    kits::graphql::KitLineInput,
    reservations::domain::{self, KitLine, LineInput, Taking},
    stock::allocating::Strategy,
};

/// A request to take stock of one inventory.
#[derive(InputObject)]
pub(crate) struct ReserveInput {
    /// The inventory to take from.
    pub inventory_id: Uuid,
    /// Units, 1 to the server's maximum quantity (STOCKGUARD_MAX_QUANTITY).
    #[graphql(default = 1)]
    pub quantity: i32,
    /// The version the client saw. Given: optimistic check (version AND stock).
    /// Omitted: conditional decrement only (hot items).
    pub expected_version: Option<i32>,
    /// Same key from the same user = same outcome, stock taken at most once (double clicks).
    pub idempotency_key: Option<String>,
    /// Take only from these locations, in this order of preference
    /// (overriding priority); omitted: every active location. Empty or
    /// unknown ids are `BAD_USER_INPUT`.
    pub location_ids: Option<Vec<Uuid>>,
    /// How the locations are chosen.
    #[graphql(default_with = "AllocationStrategy::Priority")]
    pub strategy: AllocationStrategy,
    /// False: the whole quantity from one location, or `SoldOut`.
    #[graphql(default = true)]
    pub allow_split: bool,
    /// True: the units may come from the levels' safety stock too
    /// (operators only; a customer giving true is `FORBIDDEN`). False: only
    /// sellable units, those above each level's `safetyStock`.
    #[graphql(default = false)]
    pub use_safety_stock: bool,
}

/// How the locations a reservation takes from are chosen (docs/locations.md).
#[derive(Enum, Copy, Clone, Eq, PartialEq, Debug)]
pub(crate) enum AllocationStrategy {
    /// Fill from the active locations in priority order, splitting when one is short.
    Priority,
    /// One location if any can give it all (by priority); else the fewest, largest first.
    FewestLocations,
}

impl From<AllocationStrategy> for Strategy {
    fn from(strategy: AllocationStrategy) -> Self {
        match strategy {
            AllocationStrategy::Priority => Self::Priority,
            AllocationStrategy::FewestLocations => Self::FewestLocations,
        }
    }
}

/// One line of a multi-item request.
#[derive(InputObject)]
pub(crate) struct ReserveItemInput {
    /// The inventory.
    pub inventory_id: Uuid,
    /// Units, 1 to the server's maximum quantity (STOCKGUARD_MAX_QUANTITY). Lines naming the same
    /// inventory are merged and their quantities summed.
    #[graphql(default = 1)]
    pub quantity: i32,
    /// The version the client saw, checked like `ReserveInput.expectedVersion`.
    pub expected_version: Option<i32>,
    /// Take only from these locations, in this order of preference, as
    /// `ReserveInput.locationIds`. Lines naming the same inventory must
    /// choose locations the same way.
    pub location_ids: Option<Vec<Uuid>>,
    /// How the locations are chosen.
    #[graphql(default_with = "AllocationStrategy::Priority")]
    pub strategy: AllocationStrategy,
    /// False: the line's whole quantity from one location.
    #[graphql(default = true)]
    pub allow_split: bool,
}

impl ReserveItemInput {
    /// Checks a request's lines and merges them with its kit lines (see
    /// `domain::Taking`).
    pub(crate) fn taking(items: &[Self], kits: &[KitLine], max_quantity: i32) -> Result<Taking, AppError> {
        let lines = items
            .iter()
            .enumerate()
            .map(|(i, item)| {
                let field = format!("input.items[{i}].locationIds");
                Ok(LineInput {
                    inventory_id: item.inventory_id,
                    quantity: item.quantity,
                    expected_version: item.expected_version,
                    allocating: domain::choice(
                        &field,
                        item.location_ids.clone(),
                        item.strategy.into(),
                        item.allow_split,
                    )?,
                })
            })
            .collect::<Result<Vec<LineInput>, AppError>>()?;
        Taking::new(&lines, kits, max_quantity)
    }
}

/// Several inventories at once: all or nothing.
#[derive(InputObject)]
pub(crate) struct ReserveManyInput {
    /// The lines (at most 100 inventories, kits' components included).
    #[graphql(default)]
    pub items: Vec<ReserveItemInput>,
    /// Kit lines: each takes kits × component quantity of every component
    /// of its kit, summed with the other lines of the same inventories
    /// before they are judged; each becomes a kit reservation.
    pub kits: Option<Vec<KitLineInput>>,
    /// Same key from the same user = same outcome, stock taken at most once.
    pub idempotency_key: Option<String>,
}
