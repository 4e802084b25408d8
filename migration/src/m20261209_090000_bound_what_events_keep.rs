//! What events keep, and for how long (docs/webhooks.md, "Retention"),
//! and the units a STOCK_CHANGED event reports.
//!
//! The outbox keeps an event while some endpoint still needs it: after the
//! cursor of any endpoint (active or not), or in a delivery that is not
//! DELIVERED. The pump deletes the rest in its pass; `stockguard archive`
//! deletes whatever is older than the ledger's retention, delivered or
//! not, so neither a forgotten endpoint nor a FAILED delivery keeps a
//! growing backlog alive for longer than the ledger itself is kept. An
//! endpoint whose delivery spends its whole schedule is turned off
//! (`disabled_at`), as Shopify and Stripe turn off endpoints that keep
//! failing: it stops being sent anything (each further body would wait
//! out the whole schedule too), keeps its cursor, and `redeliverFailed`
//! turns it on again from where it stopped.

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
ALTER TABLE webhook_endpoints ADD COLUMN disabled_at timestamptz;

-- The pump now runs while any endpoint exists, on or off; until now it
-- stood still while none was on, so it starts from this moment.
UPDATE event_pump SET seen = pg_current_snapshot()
 WHERE NOT EXISTS (SELECT 1 FROM webhook_endpoints WHERE active);

-- The first event a delivery still to be sent (or sent again) needs: the
-- pump keeps every outbox row from the least of these.
CREATE INDEX webhook_deliveries_undelivered ON webhook_deliveries ((seqs[1])) WHERE status <> 'DELIVERED';
-- What the archive deletes, oldest first.
CREATE INDEX webhook_deliveries_created ON webhook_deliveries (created_at);
CREATE INDEX events_occurred ON events (occurred_at);

-- Each inventory's units on hand and committed as of the last version the
-- pump numbered, so that its STOCK_CHANGED events carry them without
-- summing the inventory's reservations at every pass.
CREATE TABLE event_stock (
    inventory_id  uuid    PRIMARY KEY,
    on_hand       bigint  NOT NULL,
    committed     bigint  NOT NULL
);
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
DROP TABLE event_stock;
DROP INDEX events_occurred;
DROP INDEX webhook_deliveries_created;
DROP INDEX webhook_deliveries_undelivered;
ALTER TABLE webhook_endpoints DROP COLUMN disabled_at;
"#,
            )
            .await?;
        Ok(())
    }
}
