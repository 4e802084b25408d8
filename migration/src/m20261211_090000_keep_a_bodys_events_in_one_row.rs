//! The outbox keeps the events of one body in one row: the pump numbers and
//! writes its events in the server and stores them up to 100 to a row,
//! where it wrote (and later deleted) a row per event, built by a dozen
//! plan nodes each in PostgreSQL (bench/results/decisions.md, "Events out:
//! a body's events in one row").
//!
//! A row holds the events numbered `first_seq` to `seq` (its key is the last
//! one, so that "the rows after an endpoint's cursor" stays `seq >
//! sent_through`), their ids and types in order, and their bodies as one
//! text, joined with commas, with where each ends (`ends`, in characters)
//! so that an endpoint subscribed to some of the types is sent only those.
//! Each existing row becomes a row of its one event, so every cursor and
//! every delivery still falls on a row's boundary.
//!
//! A row's body (about 37 kB for 100 events), and its ids and types (about
//! 4 kB together, so the row is still too long for a page once the body
//! is moved out), are stored compressed out of line, and so are a
//! delivery's seqs and event ids (2.5 kB for 100 events): with lz4 where
//! PostgreSQL has it rather than pglz, which was a tenth of PostgreSQL's
//! CPU under `bench --webhook`.

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
ALTER TABLE outbox ADD COLUMN first_seq bigint, ADD COLUMN ids uuid[], ADD COLUMN types text[], ADD COLUMN ends integer[];
UPDATE outbox SET first_seq = seq, ids = ARRAY[id], types = ARRAY[type], ends = ARRAY[length(body)];
ALTER TABLE outbox DROP COLUMN id, DROP COLUMN type,
    ALTER COLUMN first_seq SET NOT NULL, ALTER COLUMN ids SET NOT NULL,
    ALTER COLUMN types SET NOT NULL, ALTER COLUMN ends SET NOT NULL;
DO $$ BEGIN
    ALTER TABLE outbox ALTER COLUMN body SET COMPRESSION lz4, ALTER COLUMN ids SET COMPRESSION lz4,
        ALTER COLUMN types SET COMPRESSION lz4, ALTER COLUMN ends SET COMPRESSION lz4;
    ALTER TABLE webhook_deliveries ALTER COLUMN seqs SET COMPRESSION lz4,
        ALTER COLUMN event_ids SET COMPRESSION lz4;
EXCEPTION WHEN feature_not_supported THEN
    NULL; -- built without lz4: pglz, PostgreSQL's default
END $$;
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
ALTER TABLE outbox ALTER COLUMN body SET COMPRESSION default;
ALTER TABLE webhook_deliveries ALTER COLUMN seqs SET COMPRESSION default,
    ALTER COLUMN event_ids SET COMPRESSION default;
CREATE TABLE outbox_events AS
SELECT o.first_seq + u.i - 1 AS seq, u.id, u.type,
       substr(o.body, CASE WHEN u.i = 1 THEN 1 ELSE o.ends[u.i - 1] + 2 END,
              o.ends[u.i] - CASE WHEN u.i = 1 THEN 0 ELSE o.ends[u.i - 1] + 1 END) AS body,
       o.created_at
  FROM outbox o, unnest(o.ids, o.types) WITH ORDINALITY AS u(id, type, i);
DELETE FROM outbox;
ALTER TABLE outbox DROP COLUMN first_seq, DROP COLUMN ids, DROP COLUMN types, DROP COLUMN ends,
    ADD COLUMN id uuid NOT NULL, ADD COLUMN type text NOT NULL;
INSERT INTO outbox (seq, id, type, body, created_at) SELECT seq, id, type, body, created_at FROM outbox_events;
DROP TABLE outbox_events;
"#,
            )
            .await?;
        Ok(())
    }
}
