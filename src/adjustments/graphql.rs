//! GraphQL types and resolvers of adjustments and safety stock:
//! `adjustStock` and `setSafetyStock` (operators), and what they answer.
//! The resolvers check the caller, parse the input and call the
//! [`AdjustmentService`].

use async_graphql::{Context, Enum, InputObject, Object, SimpleObject, Union};
use uuid::Uuid;

use super::{
    domain,
    service::{AdjustOutcome, AdjustmentService},
};
use crate::{
    context::Parts,
    error::{GqlResult, IntoGql},
    inventory::graphql::{Conflict, Inventory, InventoryNotFound},
    locations::graphql::{LocationNotFound, StockLevel, units},
    reservations::graphql::SoldOut,
    stock::{correcting::Adjustment, rows},
    telemetry, validate,
};

/// Why an operator adjusted stock.
#[derive(Enum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdjustmentReason {
    /// A count of the location found another number than the books (`countedOnHand`).
    CycleCount,
    /// Units damaged beyond sale.
    Damaged,
    /// Units lost or stolen.
    Shrinkage,
    /// Units found that the books did not have.
    Found,
    /// A mistake in an earlier change put right.
    Correction,
    /// Units sent back to their supplier.
    ReturnToSupplier,
    /// Any other reason (the note says which).
    Other,
}

impl From<AdjustmentReason> for rows::AdjustmentReason {
    fn from(reason: AdjustmentReason) -> Self {
        match reason {
            AdjustmentReason::CycleCount => Self::CycleCount,
            AdjustmentReason::Damaged => Self::Damaged,
            AdjustmentReason::Shrinkage => Self::Shrinkage,
            AdjustmentReason::Found => Self::Found,
            AdjustmentReason::Correction => Self::Correction,
            AdjustmentReason::ReturnToSupplier => Self::ReturnToSupplier,
            AdjustmentReason::Other => Self::Other,
        }
    }
}

impl From<rows::AdjustmentReason> for AdjustmentReason {
    fn from(reason: rows::AdjustmentReason) -> Self {
        use rows::AdjustmentReason as Ledger;
        match reason {
            Ledger::CycleCount => Self::CycleCount,
            Ledger::Damaged => Self::Damaged,
            Ledger::Shrinkage => Self::Shrinkage,
            Ledger::Found => Self::Found,
            Ledger::Correction => Self::Correction,
            Ledger::ReturnToSupplier => Self::ReturnToSupplier,
            Ledger::Other => Self::Other,
        }
    }
}

/// A change of one level's units for a reason other than a sale.
#[derive(InputObject)]
pub(crate) struct AdjustStockInput {
    /// The inventory.
    pub inventory_id: Uuid,
    /// The location; omitted: the default location.
    pub location_id: Option<Uuid>,
    /// A signed change of the level's available units, not 0, at most
    /// 1,000,000,000 either way; a negative one takes only available units.
    /// Exactly one of `delta` and `countedOnHand`.
    pub delta: Option<i32>,
    /// What a count found on hand at the location (0 to 1,000,000,000): on
    /// hand becomes this, the difference taken from or added to available.
    /// A count below what reservations hold there is `CountBelowHeld`; one
    /// that matches writes nothing.
    pub counted_on_hand: Option<i32>,
    /// Why.
    pub reason: AdjustmentReason,
    /// At most 500 characters, kept on the ledger row (trimmed; blank: none).
    pub note: Option<String>,
    /// The inventory's version the operator saw; given, the adjustment
    /// happens only if the row is still at that version.
    pub expected_version: Option<i32>,
    /// Same key from the same operator = same outcome, the units changed at most once.
    pub idempotency_key: Option<String>,
}

/// Stock adjusted: one change of the inventory (version + 1) with one
/// `ADJUSTED` ledger row, or a count that matched (nothing written).
#[derive(SimpleObject)]
pub(crate) struct StockAdjusted {
    /// The inventory as the adjustment left it (for a replayed key: the latest row).
    pub inventory: Inventory,
    /// The level as the adjustment left it (for a replayed key: the latest);
    /// after a `delta`, its reserved and committed units as read right after
    /// it (a change of available units moves none of them).
    pub level: StockLevel,
    /// The change of the level's units as applied; 0 for a count that matched.
    pub delta: i32,
}

/// The count is below what reservations hold at the location (reserved +
/// committed): those units are promised, and a count cannot take them.
/// Nothing was written.
#[derive(SimpleObject)]
pub(crate) struct CountBelowHeld {
    /// The level as judged.
    pub level: StockLevel,
    /// Its reserved and committed units.
    pub held: i32,
}

/// How an adjustment ended.
#[derive(Union)]
pub(crate) enum AdjustStockResult {
    /// Adjusted (or a count that matched).
    StockAdjusted(StockAdjusted),
    /// A negative `delta` beyond the level's available units
    /// (`available` is the level's); nothing written.
    SoldOut(SoldOut),
    /// A count below what is held there; nothing written.
    CountBelowHeld(CountBelowHeld),
    /// `expectedVersion` was stale; nothing written.
    Conflict(Conflict),
    /// No such inventory.
    InventoryNotFound(InventoryNotFound),
    /// No such location.
    LocationNotFound(LocationNotFound),
}

/// A level's safety stock.
#[derive(InputObject)]
pub(crate) struct SetSafetyStockInput {
    /// The inventory.
    pub inventory_id: Uuid,
    /// The location; omitted: the default location.
    pub location_id: Option<Uuid>,
    /// The last available units there that no customer may take, 0 to 1,000,000,000.
    pub quantity: i32,
}

/// Adjustment mutations; operators.
#[derive(Default)]
pub(crate) struct AdjustmentMutation;

#[Object]
impl AdjustmentMutation {
    /// Changes one level's units for a reason other than a sale (operators),
    /// by a signed `delta` or to a `countedOnHand`, in one statement: one
    /// change of the inventory (version + 1) with one `ADJUSTED` ledger row
    /// carrying the reason, the note and the operator. A decrease takes only
    /// available units, never reserved or committed ones.
    async fn adjust_stock(
        &self,
        ctx: &Context<'_>,
        #[graphql(desc = "Which level, a change or a count, why, and how to guard it.")] input: AdjustStockInput,
    ) -> GqlResult<AdjustStockResult> {
        let user = ctx.operator()?;
        let change = domain::change(input.delta, input.counted_on_hand).gql()?;
        let note = validate::note("input.note", input.note.as_deref()).gql()?;
        let key = validate::idempotency_key("input.idempotencyKey", input.idempotency_key.as_deref()).gql()?;
        let adjustment = Adjustment {
            inventory_id: input.inventory_id,
            location_id: input.location_id,
            change,
            reason: input.reason.into(),
            note: note.as_deref(),
            expected_version: input.expected_version,
            operator: &user.id,
            key: None,
        };
        let outcome = ctx.part::<AdjustmentService>()?.adjust(adjustment, key).await.gql()?;
        let result = match outcome {
            AdjustOutcome::Adjusted { inventory, level, delta } => AdjustStockResult::StockAdjusted(StockAdjusted {
                inventory: Inventory(inventory),
                level: StockLevel(level),
                delta,
            }),
            AdjustOutcome::SoldOut { requested, available, inventory } => {
                AdjustStockResult::SoldOut(SoldOut { requested, available, inventory: Inventory(inventory) })
            }
            AdjustOutcome::CountBelowHeld { level, held } => {
                AdjustStockResult::CountBelowHeld(CountBelowHeld { level: StockLevel(level), held: units(held)? })
            }
            AdjustOutcome::Conflict { expected_version, inventory } => {
                AdjustStockResult::Conflict(Conflict { expected_version, inventory: Inventory(inventory) })
            }
            AdjustOutcome::InventoryNotFound => {
                AdjustStockResult::InventoryNotFound(InventoryNotFound { inventory_id: input.inventory_id })
            }
            AdjustOutcome::LocationNotFound(location_id) => {
                AdjustStockResult::LocationNotFound(LocationNotFound { location_id })
            }
        };
        Ok(telemetry::counted("adjustStock", result))
    }

    /// Sets a level's safety stock (operators): its last `quantity`
    /// available units that no customer's reserve, cart line or quantity
    /// increase may take. Moves no units, writes no ledger row, changes no
    /// version. Null when the inventory or the location is unknown.
    async fn set_safety_stock(
        &self,
        ctx: &Context<'_>,
        #[graphql(desc = "Which level, and its safety stock.")] input: SetSafetyStockInput,
    ) -> GqlResult<Option<StockLevel>> {
        ctx.operator()?;
        let quantity = domain::safety_stock(input.quantity).gql()?;
        let service = ctx.part::<AdjustmentService>()?;
        let level = service.set_safety_stock(input.inventory_id, input.location_id, quantity).await.gql()?;
        Ok(level.map(StockLevel))
    }
}
