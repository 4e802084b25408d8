//! Live stock is announced once per statement instead of once per row.
//!
//! The row trigger ran a PL/pgSQL call and a lookup of `inventory_watchers`
//! for every inventory a statement changed: on a catalogue, where one
//! coalesced statement changes a row per caller, that was about a tenth of
//! the reserving backend's CPU (bench/results/decisions.md). A statement
//! trigger sees every changed row at once through its transition table and
//! announces the watched ones with one query: the same payload per changed
//! watched row, sent at the same moment (after the statement, in its
//! transaction), so nothing changes for a listener.

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
CREATE FUNCTION notify_inventories_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('inventory_changed', json_build_object(
            'id', c.id, 'sku', c.sku, 'name', c.name, 'stock', c.stock,
            'version', c.version, 'created_at', c.created_at, 'updated_at', c.updated_at)::text)
       FROM changed c
      WHERE EXISTS (SELECT 1 FROM inventory_watchers w WHERE w.inventory_id = c.id);
    RETURN NULL;
END
$$;
DROP TRIGGER inventories_notify ON inventories;
DROP FUNCTION notify_inventory_changed();
CREATE TRIGGER inventories_notify AFTER UPDATE ON inventories
    REFERENCING NEW TABLE AS changed
    FOR EACH STATEMENT EXECUTE FUNCTION notify_inventories_changed();
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
CREATE FUNCTION notify_inventory_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM inventory_watchers WHERE inventory_id = NEW.id) THEN
        PERFORM pg_notify('inventory_changed', json_build_object(
            'id', NEW.id, 'sku', NEW.sku, 'name', NEW.name, 'stock', NEW.stock,
            'version', NEW.version, 'created_at', NEW.created_at, 'updated_at', NEW.updated_at)::text);
    END IF;
    RETURN NULL;
END
$$;
DROP TRIGGER inventories_notify ON inventories;
DROP FUNCTION notify_inventories_changed();
CREATE TRIGGER inventories_notify AFTER UPDATE ON inventories
    FOR EACH ROW EXECUTE FUNCTION notify_inventory_changed();
"#,
            )
            .await?;
        Ok(())
    }
}
