//! Adjustments and safety stock (`adjustStock`, `setSafetyStock`,
//! docs/stock-operations.md).
//!
//! A level keeps a safety stock: its last `safety_stock` available units
//! are not sellable, so no customer's reserve takes them (every reserving
//! statement offers a level's `greatest(available - safety_stock, 0)`
//! units, or all of them to an operator's `useSafetyStock`). Setting it
//! moves no unit and changes no version.
//!
//! An adjustment is one `ADJUSTED` ledger row, carrying why
//! (`adjustment_reason`, the `AdjustmentReason` spellings), the operator's
//! note and their `sub` as `actor`. The table holds the rule that the
//! reason is set exactly on `ADJUSTED` rows. A keyed adjustment keeps the
//! delta it applied beside its key's claim (`idempotency_keys.adjusted`),
//! which a replay answers.
//!
//! The ledger's `note` and `actor` are added only if missing: the returns'
//! migration (m20261214) adds them too.

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .get_connection()
            .execute_unprepared(
                r#"
-- No table rewrite: a constant default is kept in the catalogue. The check
-- is validated after it is added, so writers wait only for the scan, not
-- for the lock of adding it.
ALTER TABLE stock_levels ADD COLUMN safety_stock integer NOT NULL DEFAULT 0;
ALTER TABLE stock_levels
    ADD CONSTRAINT stock_levels_safety_stock_check CHECK (safety_stock >= 0) NOT VALID;
ALTER TABLE stock_levels VALIDATE CONSTRAINT stock_levels_safety_stock_check;

ALTER TABLE stock_movements
    ADD COLUMN IF NOT EXISTS note text,
    ADD COLUMN IF NOT EXISTS actor text,
    ADD COLUMN adjustment_reason text,
    ADD CONSTRAINT stock_movements_adjustment_reason_check CHECK (
        (reason = 'ADJUSTED') = (adjustment_reason IS NOT NULL)
        AND adjustment_reason IN ('CYCLE_COUNT', 'DAMAGED', 'SHRINKAGE', 'FOUND', 'CORRECTION',
                                  'RETURN_TO_SUPPLIER', 'OTHER'));

-- A keyed adjustStock replays the delta it applied.
ALTER TABLE idempotency_keys ADD COLUMN adjusted integer;
"#,
            )
            .await?;
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .get_connection()
            .execute_unprepared(
                r#"
ALTER TABLE idempotency_keys DROP COLUMN adjusted;
ALTER TABLE stock_movements
    DROP CONSTRAINT stock_movements_adjustment_reason_check,
    DROP COLUMN adjustment_reason;
ALTER TABLE stock_levels DROP COLUMN safety_stock;
"#,
            )
            .await?;
        Ok(())
    }
}
