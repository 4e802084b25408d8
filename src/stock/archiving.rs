//! Archiving: old idempotency keys are forgotten, old reservations that
//! are done with go, and old ledger rows (`stock_movements`) go while what
//! they added up to stays in their inventory's checkpoint row
//! (`ledger_checkpoints`), so the ledger still adds up to every inventory's
//! stock, version, received and fulfilled units (and, in
//! `ledger_checkpoint_levels`, to each level's available and on-hand
//! units); the day partitions they leave empty go too. `archive.rs` runs
//! these slice by slice.

use std::sync::LazyLock;

use chrono::{DateTime, Utc};
use sea_orm::{DbBackend, Statement};

use super::{
    fragments::{ledger_fulfilled, ledger_location, ledger_on_hand, ledger_received, ledger_stock},
    rows::{ReservationStatus, sql_list},
};

/// The reservations the archive may delete: done with (RELEASED or
/// EXPIRED) and without an idempotency key.
///
/// Nothing counts them any more: the invariant sums only ACTIVE, ORDERED and
/// FULFILLED lines, and no statement changes a RELEASED or EXPIRED row, so
/// deleting them takes no lock another writer waits for. A keyed one stays
/// while its key is remembered, so a replay of the key still finds its
/// first outcome; it goes when the key is forgotten ([`forget_keys`]).
fn archivable() -> String {
    format!("status IN {} AND idempotency_key IS NULL", done())
}

/// The statuses of reservations that are done with, `('RELEASED', 'EXPIRED')`.
fn done() -> String {
    sql_list([ReservationStatus::Released, ReservationStatus::Expired])
}

/// When the oldest idempotency key was claimed; one row, NULL when there is
/// none.
pub(crate) fn oldest_key() -> Statement {
    Statement::from_string(DbBackend::Postgres, "SELECT min(created_at) FROM idempotency_keys")
}

/// Forgets the idempotency keys claimed in `[from, until)`, whole, in one
/// statement: the claim goes, and with it the key's RELEASED and EXPIRED
/// reservations (and their allocations); its other reservations stay
/// without the key, and so does a kit's component, which goes with its
/// kit reservation ([`archive_reservations`]). Nothing then remembers the key, so the same key is a
/// new request, which the unique indexes on keys let in. One row: how many
/// keys it forgot (`archived`) and how many reservations it deleted
/// (`reservations`).
///
/// A request writes its keyed reservation in the statement that claims the
/// key, so the two share a slice. A line that is not done as the statement
/// sees it loses its key even if it is released meanwhile (the update
/// picks it by id, whatever its status has become): it is then a done line
/// without a key, which the archive deletes like any other, never a keyed
/// one whose key nothing remembers. A new request with the key waits for
/// this statement on the unique indexes, and finds the key free. A replay
/// that read the claim just before it went finds no line, and is told the
/// key was forgotten meanwhile (see `idempotency::first_use`).
pub(crate) fn forget_keys(from: DateTime<Utc>, until: DateTime<Utc>) -> Statement {
    static SQL: LazyLock<String> = LazyLock::new(|| {
        format!(
            r#"
WITH forgotten AS (
    DELETE FROM idempotency_keys WHERE created_at >= $1 AND created_at < $2
 RETURNING user_id, idempotency_key
), keyed AS (
    SELECT r.id, r.status IN {done} AND r.kit_reservation_id IS NULL AS done
      FROM reservations r JOIN forgotten f ON f.user_id = r.user_id AND f.idempotency_key = r.idempotency_key
     WHERE r.idempotency_key IS NOT NULL
), gone AS (
    DELETE FROM reservations WHERE id IN (SELECT id FROM keyed WHERE done)
 RETURNING id
), unallocated AS (
    DELETE FROM allocations WHERE reservation_id IN (SELECT id FROM gone)
), kept AS (
    UPDATE reservations SET idempotency_key = NULL, request_fingerprint = NULL
     WHERE id IN (SELECT id FROM keyed WHERE NOT done)
)
SELECT (SELECT count(*) FROM forgotten) AS archived, (SELECT count(*) FROM gone) AS reservations"#,
            done = done(),
        )
    });
    Statement::from_sql_and_values(DbBackend::Postgres, SQL.as_str(), [from.into(), until.into()])
}

/// When the oldest reservation the archive may delete was made; one row,
/// NULL when there is none.
pub(crate) fn oldest_reservation() -> Statement {
    static SQL: LazyLock<String> =
        LazyLock::new(|| format!("SELECT min(created_at) FROM reservations WHERE {}", archivable()));
    Statement::from_string(DbBackend::Postgres, SQL.as_str())
}

/// Deletes the reservations made in `[from, until)` that the archive may
/// delete, and their allocations, in one statement; one row, how many
/// reservations it deleted. A kit reservation goes whole, its row with
/// every component, once every component may go (its components share its
/// `created_at`, so they are in its slice); never one component alone,
/// which would leave the kit reservation not whole.
///
/// Nothing reads the allocations of a reservation that is done with, and
/// an allocation without its reservation would be read by nothing ever
/// again; they go together, so no check sees one without the other.
pub(crate) fn archive_reservations(from: DateTime<Utc>, until: DateTime<Utc>) -> Statement {
    static SQL: LazyLock<String> = LazyLock::new(|| {
        format!(
            r#"
WITH gone AS (
    DELETE FROM reservations
     WHERE created_at >= $1 AND created_at < $2 AND {archivable} AND kit_reservation_id IS NULL
 RETURNING id
), kits_gone AS (
    DELETE FROM kit_reservations k
     WHERE k.created_at >= $1 AND k.created_at < $2
       AND NOT EXISTS (SELECT 1 FROM reservations r WHERE r.kit_reservation_id = k.id AND NOT ({archivable}))
 RETURNING id
), parts_gone AS (
    DELETE FROM reservations WHERE kit_reservation_id IN (SELECT id FROM kits_gone)
 RETURNING id
), unallocated AS (
    DELETE FROM allocations WHERE reservation_id IN (SELECT id FROM gone UNION ALL SELECT id FROM parts_gone)
)
SELECT (SELECT count(*) FROM gone) + (SELECT count(*) FROM parts_gone) AS archived"#,
            archivable = archivable()
        )
    });
    Statement::from_sql_and_values(DbBackend::Postgres, SQL.as_str(), [from.into(), until.into()])
}

/// When the oldest ledger row was made; one row, NULL when there is none.
pub(crate) fn oldest_ledger_row() -> Statement {
    Statement::from_string(DbBackend::Postgres, "SELECT min(created_at) FROM stock_movements")
}

/// Deletes the ledger rows made in `[from, until)` and adds them to their
/// inventories' checkpoints (`ledger_checkpoints`) and, per location (a row
/// without one is the default location's), to their levels' checkpoints
/// (`ledger_checkpoint_levels`), in one statement; one row, how many it
/// archived.
///
/// `changes` counts distinct versions: one change writes a ledger row per
/// location it touches, all at its version. Those rows are written by one
/// statement, so they share `created_at` (the transaction's `now()`) and
/// always fall in one slice: a version is never counted in two.
///
/// The rows of one slice go and their sums arrive in the same statement, so
/// a check (one snapshot) sees either both or neither. A concurrent change
/// of an inventory writes a new row (never in an archived slice, which ends
/// in the past) and leaves its checkpoint alone. Two archives of one slice
/// cannot count a row twice: a row is in the `RETURNING` of the statement
/// that deleted it only, and the checkpoint is added to under its row lock
/// (`ON CONFLICT DO UPDATE`).
pub(crate) fn archive_ledger(from: DateTime<Utc>, until: DateTime<Utc>) -> Statement {
    static SQL: LazyLock<String> = LazyLock::new(|| {
        format!(
            r#"
WITH old AS (
    DELETE FROM stock_movements
     WHERE created_at >= $1 AND created_at < $2
 RETURNING inventory_id, location_id, delta, reason, version_after, created_at
), sums AS (
    SELECT inventory_id,
           count(DISTINCT version_after) AS changes,
           {stock} AS stock,
           {received} AS received,
           {fulfilled} AS fulfilled,
           max(version_after) AS version_after,
           max(created_at) AS archived_until
      FROM old GROUP BY inventory_id
), saved AS (
    INSERT INTO ledger_checkpoints AS c
           (inventory_id, changes, stock, received, fulfilled, version_after, archived_until)
    SELECT * FROM sums
        ON CONFLICT (inventory_id) DO UPDATE
       SET changes = c.changes + excluded.changes,
           stock = c.stock + excluded.stock,
           received = c.received + excluded.received,
           fulfilled = c.fulfilled + excluded.fulfilled,
           version_after = greatest(c.version_after, excluded.version_after),
           archived_until = greatest(c.archived_until, excluded.archived_until)
    RETURNING 1
), saved_levels AS (
    INSERT INTO ledger_checkpoint_levels AS c (inventory_id, location_id, stock, on_hand)
    SELECT inventory_id, {location}, {stock}, {on_hand} FROM old GROUP BY 1, 2
        ON CONFLICT (inventory_id, location_id) DO UPDATE
       SET stock = c.stock + excluded.stock,
           on_hand = c.on_hand + excluded.on_hand
    RETURNING 1
)
SELECT count(*) AS archived FROM old"#,
            stock = ledger_stock(),
            received = ledger_received(),
            fulfilled = ledger_fulfilled(),
            location = ledger_location(""),
            on_hand = ledger_on_hand(),
        )
    });
    Statement::from_sql_and_values(DbBackend::Postgres, SQL.as_str(), [from.into(), until.into()])
}

/// Drops the ledger's day partitions that end by `before` and hold no row
/// (the archive has emptied them); one row, how many it dropped. It waits
/// at most a moment for the table's lock and leaves the rest for the next
/// run when it cannot have it.
pub(crate) fn drop_empty_partitions(before: DateTime<Utc>) -> Statement {
    Statement::from_sql_and_values(
        DbBackend::Postgres,
        "SELECT drop_empty_ledger_partitions($1) AS dropped",
        [before.into()],
    )
}
