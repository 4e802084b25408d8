//! Live stock: committed inventory changes are announced with NOTIFY from a
//! trigger, so the announcement is part of the changing transaction and only
//! committed states are ever pushed.
//!
//! PostgreSQL serializes the commits of every transaction that NOTIFYs (to
//! keep the queue in commit order), which would cap all writes at one commit
//! per WAL flush. So the trigger only notifies for inventories that someone is
//! watching: each live subscription holds a row in `inventory_watchers`.

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
-- Unlogged: watchers are a cache of live connections, not data worth WAL.
CREATE UNLOGGED TABLE inventory_watchers (
    id            uuid        PRIMARY KEY,
    inventory_id  uuid        NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX inventory_watchers_inventory ON inventory_watchers (inventory_id);

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
CREATE TRIGGER inventories_notify AFTER UPDATE ON inventories
    FOR EACH ROW EXECUTE FUNCTION notify_inventory_changed();

-- The sweeper's claim query: due ACTIVE reservations, oldest expiry first.
CREATE INDEX reservations_due ON reservations (expires_at) WHERE status = 'ACTIVE' AND expires_at IS NOT NULL;
"#,
            )
            .await?;
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .get_connection()
            .execute_unprepared(
                "DROP INDEX reservations_due; DROP TRIGGER inventories_notify ON inventories; \
                 DROP FUNCTION notify_inventory_changed(); DROP TABLE inventory_watchers;",
            )
            .await?;
        Ok(())
    }
}
