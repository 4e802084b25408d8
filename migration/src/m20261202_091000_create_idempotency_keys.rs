//! One table for every idempotency key a user has used.
//!
//! Until now every key lived on the first reservation its request wrote, so
//! the unique index `reservations_user_idempotency_key` was the whole key
//! space. A checkout writes no reservation (it changes existing ones), so its
//! key needs a home of its own, and the key space must stay one: a key used
//! by a `reserve` must be refused for a `checkout` and the other way round,
//! even when both arrive at once. Only a unique index decides that without a
//! race, so every key is claimed here: a checkout inserts its own, and a
//! trigger claims the key of every reservation written with one, in the same
//! statement (a second use fails on this primary key and is rolled back whole).
//! The keys already stored are copied over.

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
CREATE TABLE idempotency_keys (
    user_id             text        NOT NULL,
    idempotency_key     text        NOT NULL,
    request_fingerprint text        NOT NULL,
    -- The order the request placed (placeOrder, checkout), if any.
    order_id            uuid        REFERENCES orders (id),
    created_at          timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (user_id, idempotency_key)
);

INSERT INTO idempotency_keys (user_id, idempotency_key, request_fingerprint, order_id, created_at)
SELECT user_id, idempotency_key, request_fingerprint, order_id, created_at
  FROM reservations WHERE idempotency_key IS NOT NULL;

CREATE FUNCTION claim_idempotency_key() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO idempotency_keys (user_id, idempotency_key, request_fingerprint, order_id)
    VALUES (NEW.user_id, NEW.idempotency_key, NEW.request_fingerprint, NEW.order_id);
    RETURN NULL;
END
$$;
CREATE TRIGGER reservations_claim_key AFTER INSERT ON reservations
    FOR EACH ROW WHEN (NEW.idempotency_key IS NOT NULL) EXECUTE FUNCTION claim_idempotency_key();
"#,
            )
            .await?;
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .get_connection()
            .execute_unprepared(
                "DROP TRIGGER reservations_claim_key ON reservations; DROP FUNCTION claim_idempotency_key(); \
                 DROP TABLE idempotency_keys;",
            )
            .await?;
        Ok(())
    }
}
