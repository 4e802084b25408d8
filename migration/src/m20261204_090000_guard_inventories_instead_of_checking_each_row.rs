//! The reserve path checked two foreign keys per reservation: a reservation
//! and its ledger row each ran a lookup of their inventory (`FOR KEY SHARE`)
//! through the foreign key's trigger, about a tenth of PostgreSQL's CPU per
//! reservation in a coalesced batch (bench/results/decisions.md). Neither
//! lookup can fail: every statement that writes a reservation or a ledger
//! row takes the inventory id from the inventory row it has just locked or
//! changed, so the row exists, and the only way to make an orphan later was
//! to delete an inventory, which nothing in Stockguard does.
//!
//! So the two foreign keys go, and the one thing they still guarded is
//! refused outright: no inventory is ever deleted or truncated away (a
//! statement-level trigger, which costs the reserve path nothing). The keys
//! of rarer writes stay (`orders`, `ledger_checkpoints`).

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
ALTER TABLE reservations DROP CONSTRAINT reservations_inventory_id_fkey;
ALTER TABLE stock_movements DROP CONSTRAINT stock_movements_inventory_id_fkey;

CREATE FUNCTION refuse_to_remove_inventories() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'inventories are never removed: their reservations and ledger rows refer to them'
        USING ERRCODE = 'restrict_violation';
END
$$;
CREATE TRIGGER inventories_never_deleted BEFORE DELETE ON inventories
    FOR EACH STATEMENT EXECUTE FUNCTION refuse_to_remove_inventories();
CREATE TRIGGER inventories_never_truncated BEFORE TRUNCATE ON inventories
    FOR EACH STATEMENT EXECUTE FUNCTION refuse_to_remove_inventories();
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
DROP TRIGGER inventories_never_truncated ON inventories;
DROP TRIGGER inventories_never_deleted ON inventories;
DROP FUNCTION refuse_to_remove_inventories();
ALTER TABLE stock_movements ADD CONSTRAINT stock_movements_inventory_id_fkey
    FOREIGN KEY (inventory_id) REFERENCES inventories (id);
ALTER TABLE reservations ADD CONSTRAINT reservations_inventory_id_fkey
    FOREIGN KEY (inventory_id) REFERENCES inventories (id);
"#,
            )
            .await?;
        Ok(())
    }
}
