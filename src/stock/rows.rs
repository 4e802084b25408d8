//! The rows the stock statements write and return, and the states they
//! write into them: an inventory ([`InventoryRow`]), a reservation or order
//! line ([`ReservationRow`], [`ReservationStatus`]), a return of an order
//! and its lines ([`ReturnRow`], [`ReturnLineRow`], [`ReturnDisposition`])
//! and why the ledger moved ([`MovementReason`], and for an operator's
//! adjustment [`AdjustmentReason`]). They live here, below the features that read them,
//! so the statements that make them need no feature; the features re-export
//! them.
//!
//! Each status is spelled once, by its enum; a statement's text takes it
//! from there with [`sql`].

pub(crate) mod allocation;
pub(crate) mod inventory;
pub(crate) mod location;
pub(crate) mod reservation;
pub(crate) mod returns;

use sea_orm::{ActiveEnum, DeriveActiveEnum, EnumIter};

pub(crate) use allocation::Model as AllocationRow;
pub(crate) use inventory::Model as InventoryRow;
pub(crate) use location::Model as LocationRow;
pub(crate) use reservation::{Model as ReservationRow, ReservationStatus};
pub use returns::ReturnDisposition;
pub(crate) use returns::{ReturnLineRow, ReturnRow};

/// Why stock changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, EnumIter, DeriveActiveEnum)]
#[sea_orm(rs_type = "String", db_type = "Text")]
pub(crate) enum MovementReason {
    /// The inventory was created with its initial stock.
    #[sea_orm(string_value = "CREATED")]
    Created,
    /// A reservation took stock.
    #[sea_orm(string_value = "RESERVED")]
    Reserved,
    /// A reservation was released and its stock returned.
    #[sea_orm(string_value = "RELEASED")]
    Released,
    /// A reservation expired and the sweeper returned its stock.
    #[sea_orm(string_value = "EXPIRED")]
    Expired,
    /// An operator added stock.
    #[sea_orm(string_value = "RESTOCKED")]
    Restocked,
    /// An order line took stock.
    #[sea_orm(string_value = "ORDERED")]
    Ordered,
    /// An order was cancelled and its line's stock returned.
    #[sea_orm(string_value = "ORDER_CANCELLED")]
    OrderCancelled,
    /// An order line's units left the warehouse: `delta` is the change of
    /// on-hand units (available stock does not move, `stockAfter` is unchanged).
    #[sea_orm(string_value = "FULFILLED")]
    Fulfilled,
    /// A reservation's quantity was changed; `delta` is the change of available stock.
    #[sea_orm(string_value = "QUANTITY_CHANGED")]
    QuantityChanged,
    /// Units left this location for another of the same inventory.
    #[sea_orm(string_value = "TRANSFERRED_OUT")]
    TransferredOut,
    /// Units arrived at this location from another of the same inventory.
    #[sea_orm(string_value = "TRANSFERRED_IN")]
    TransferredIn,
    /// Units of a fulfilled order's line came back to available stock at
    /// this location (`returnOrder`, RESTOCK): on hand and available grow by `delta`.
    #[sea_orm(string_value = "RETURNED")]
    Returned,
    /// An operator changed the units at this location for a reason other
    /// than a sale (`adjustStock`, a count or a signed change): on hand and
    /// available change by `delta`; the row carries its [`AdjustmentReason`].
    #[sea_orm(string_value = "ADJUSTED")]
    Adjusted,
}

/// Why an operator adjusted stock (`adjustStock`): the `adjustment_reason`
/// of an `ADJUSTED` ledger row, set on those rows and no others.
#[derive(Debug, Clone, Copy, PartialEq, Eq, EnumIter, DeriveActiveEnum)]
#[sea_orm(rs_type = "String", db_type = "Text")]
pub enum AdjustmentReason {
    /// A count of the location found another number than the books.
    #[sea_orm(string_value = "CYCLE_COUNT")]
    CycleCount,
    /// Units damaged beyond sale.
    #[sea_orm(string_value = "DAMAGED")]
    Damaged,
    /// Units lost or stolen.
    #[sea_orm(string_value = "SHRINKAGE")]
    Shrinkage,
    /// Units found that the books did not have.
    #[sea_orm(string_value = "FOUND")]
    Found,
    /// A mistake in an earlier change put right.
    #[sea_orm(string_value = "CORRECTION")]
    Correction,
    /// Units sent back to their supplier.
    #[sea_orm(string_value = "RETURN_TO_SUPPLIER")]
    ReturnToSupplier,
    /// Any other reason (the note says which).
    #[sea_orm(string_value = "OTHER")]
    Other,
}

/// `value` as an SQL string literal (`'ACTIVE'`), to be written into a
/// statement's text. Text rather than a bind parameter: PostgreSQL uses a
/// partial index (`reservations_held`, `reservations_due`) only when it can
/// see at planning time that the statement's condition implies the index's,
/// and a generic plan cannot see through a parameter.
pub(crate) fn sql<E: ActiveEnum<Value = String>>(value: E) -> String {
    format!("'{}'", value.to_value())
}

/// `values` as an SQL list of literals (`('ACTIVE', 'ORDERED')`), for `IN`.
pub(crate) fn sql_list<E: ActiveEnum<Value = String>>(values: impl IntoIterator<Item = E>) -> String {
    format!("({})", values.into_iter().map(sql).collect::<Vec<_>>().join(", "))
}

#[cfg(test)]
mod tests {
    use sea_orm::Iterable as _;

    use super::*;

    #[test]
    fn statuses_are_written_as_the_table_spells_them() {
        assert_eq!(sql(ReservationStatus::Active), "'ACTIVE'");
        assert_eq!(sql(MovementReason::OrderCancelled), "'ORDER_CANCELLED'");
        let held = sql_list([ReservationStatus::Active, ReservationStatus::Ordered]);
        assert_eq!(held, "('ACTIVE', 'ORDERED')");
    }

    #[test]
    fn adjustment_reasons_are_the_spellings_the_ledger_checks() {
        // The migration m20261215 spells them out in the ledger's check.
        let spelled: Vec<String> = AdjustmentReason::iter().map(|reason| reason.to_value()).collect();
        let expected = ["CYCLE_COUNT", "DAMAGED", "SHRINKAGE", "FOUND", "CORRECTION", "RETURN_TO_SUPPLIER", "OTHER"];
        assert_eq!(spelled, expected);
    }
}
