//! Archiving the ledger: old `stock_movements` rows go, and what they
//! added up to stays in their inventory's checkpoint row
//! (`ledger_checkpoints`), so the ledger still adds up to every inventory's
//! stock, version, received and fulfilled units; the day partitions they
//! leave empty go too.

use chrono::{DateTime, Utc};
use sea_orm::{DbBackend, Statement};

/// Deletes the ledger rows made in `[from, until)` and adds them to their
/// inventories' checkpoints, in one statement; one row, how many it archived.
///
/// The rows of one slice go and their sums arrive in the same statement, so
/// a check (one snapshot) sees either both or neither. A concurrent change
/// of an inventory writes a new row (never in an archived slice, which ends
/// in the past) and leaves its checkpoint alone. Two archives of one slice
/// cannot count a row twice: a row is in the `RETURNING` of the statement
/// that deleted it only, and the checkpoint is added to under its row lock
/// (`ON CONFLICT DO UPDATE`).
pub fn archive_ledger(from: DateTime<Utc>, until: DateTime<Utc>) -> Statement {
    const SQL: &str = r#"
WITH old AS (
    DELETE FROM stock_movements
     WHERE created_at >= $1 AND created_at < $2
 RETURNING inventory_id, delta, reason, version_after, created_at
), sums AS (
    SELECT inventory_id,
           count(*) AS changes,
           coalesce(sum(delta) FILTER (WHERE reason <> 'FULFILLED'), 0) AS stock,
           coalesce(sum(delta) FILTER (WHERE reason IN ('CREATED', 'RESTOCKED')), 0) AS received,
           coalesce(-sum(delta) FILTER (WHERE reason = 'FULFILLED'), 0) AS fulfilled,
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
)
SELECT count(*) AS archived FROM old"#;
    Statement::from_sql_and_values(DbBackend::Postgres, SQL, [from.into(), until.into()])
}

/// Drops the ledger's day partitions that end by `before` and hold no row
/// (the archive has emptied them); one row, how many it dropped. It waits
/// at most a moment for the table's lock and leaves the rest for the next
/// run when it cannot have it.
pub fn drop_empty_partitions(before: DateTime<Utc>) -> Statement {
    Statement::from_sql_and_values(
        DbBackend::Postgres,
        "SELECT drop_empty_ledger_partitions($1) AS dropped",
        [before.into()],
    )
}
