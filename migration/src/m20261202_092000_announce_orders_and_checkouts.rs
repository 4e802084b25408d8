//! Live orders, and live stock states that change without a stock change.
//!
//! `orderChanged` is fed like `inventoryChanged`: a trigger NOTIFYs the
//! committed row inside the saving transaction, and only for orders someone
//! watches (a row in `order_watchers`, one per server process and order, tied
//! to the process's listening connection like `inventory_watchers`), because
//! PostgreSQL serializes the commits of every transaction that NOTIFYs.
//!
//! A checkout moves units from `reserved` to `committed` without touching the
//! inventory row (stock and version stay), so the inventory trigger does not
//! see it. A second trigger announces the inventory of each line a checkout
//! turns ORDERED, on a channel of its own and with the id alone: the
//! listener reads the row afresh, since a row read inside the checkout could
//! be older than a change another transaction commits first.

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
CREATE UNLOGGED TABLE order_watchers (
    process_id    uuid    NOT NULL,
    order_id      uuid    NOT NULL,
    listener_pid  integer NOT NULL,
    PRIMARY KEY (process_id, order_id)
);
CREATE INDEX order_watchers_order ON order_watchers (order_id);

CREATE FUNCTION notify_order_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM order_watchers WHERE order_id = NEW.id) THEN
        PERFORM pg_notify('order_changed', row_to_json(NEW)::text);
    END IF;
    RETURN NULL;
END
$$;
CREATE TRIGGER orders_notify AFTER UPDATE ON orders
    FOR EACH ROW EXECUTE FUNCTION notify_order_changed();

CREATE FUNCTION notify_inventory_states_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM inventory_watchers WHERE inventory_id = NEW.inventory_id) THEN
        PERFORM pg_notify('inventory_states_changed', NEW.inventory_id::text);
    END IF;
    RETURN NULL;
END
$$;
CREATE TRIGGER reservations_notify_checkout AFTER UPDATE OF status ON reservations
    FOR EACH ROW WHEN (OLD.status = 'ACTIVE' AND NEW.status = 'ORDERED')
    EXECUTE FUNCTION notify_inventory_states_changed();
"#,
            )
            .await?;
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .get_connection()
            .execute_unprepared(
                "DROP TRIGGER reservations_notify_checkout ON reservations; \
                 DROP FUNCTION notify_inventory_states_changed(); \
                 DROP TRIGGER orders_notify ON orders; DROP FUNCTION notify_order_changed(); \
                 DROP TABLE order_watchers;",
            )
            .await?;
        Ok(())
    }
}
