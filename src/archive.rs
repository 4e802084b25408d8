//! Retention: `stockguard archive --older-than 90d` gives old rows a home.
//!
//! A shop keeps months of released and expired reservations and ledger
//! rows that no request reads again, and idempotency keys that no client
//! will replay. The archive deletes those older than the cutoff, one time
//! slice per statement (each its own short transaction, so it is safe to run
//! under load and to stop at any point), oldest first: idempotency keys,
//! each forgotten whole (its claim and its done reservations go, its other
//! reservations lose the key), then reservations that are done with and
//! carry no key (with their allocations), and ledger rows, whose sums go to
//! their inventory's and their levels' checkpoints in the same statement so
//! `stockguard check` stays true throughout. A slice's length
//! adapts to aim at `batch` rows per statement. Nothing newer than the
//! cutoff is touched; ACTIVE, ORDERED and FULFILLED lines are never touched.
//! Then the ledger's day partitions that the run emptied are dropped, so
//! a year of days leaves no year of empty tables for reads to visit. Last,
//! events and webhook deliveries older than the cutoff go
//! (`events::retention`), so they never outlive the ledger.

use std::time::Duration;

use chrono::{DateTime, Utc};
use sea_orm::{ConnectionTrait, DatabaseConnection, DbErr};

use crate::{
    db::{Attempted, Collisions},
    events::retention,
    stock::archiving,
};

/// The shortest retention the archive accepts: a day, so nothing a client
/// may still replay (the contract remembers a key for at least 24 h) or a
/// person may still look up today goes.
pub(crate) const MIN_AGE: Duration = Duration::from_secs(24 * 3600);

/// A retention age as the command line writes it: a whole number and a unit
/// (`90d`, `36h`, `2w`), at least [`MIN_AGE`].
pub(crate) fn parse_age(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: u64 = number.parse().map_err(|_| format!("{text:?}: expected a whole number and a unit, e.g. 90d"))?;
    let unit_secs = match unit {
        "h" => 3600,
        "d" => 24 * 3600,
        "w" => 7 * 24 * 3600,
        _ => return Err(format!("{text:?}: the unit must be h, d or w (e.g. 90d)")),
    };
    let age = number.checked_mul(unit_secs).map(Duration::from_secs).ok_or_else(|| format!("{text:?}: too long"))?;
    if age < MIN_AGE {
        return Err(format!("{text:?}: the archive keeps at least a day (1d)"));
    }
    Ok(age)
}

/// What an archive run deleted.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Archived {
    /// Idempotency keys forgotten.
    pub keys: u64,
    /// Reservations deleted (those of forgotten keys among them).
    pub reservations: u64,
    /// Ledger rows folded into checkpoints.
    pub ledger_rows: u64,
    /// Statements run.
    pub statements: u64,
    /// The ledger's day partitions dropped, empty.
    pub partitions: u64,
    /// Events and webhook deliveries aged out with the ledger.
    pub events: retention::Aged,
}

/// Archives what is older than `age`, aiming at `batch` rows per statement.
pub async fn archive(
    db: &DatabaseConnection,
    collisions: &Collisions,
    age: Duration,
    batch: u64,
) -> Result<Archived, DbErr> {
    let cutoff = Utc::now() - chrono::Duration::from_std(age).map_err(|e| DbErr::Custom(e.to_string()))?;
    let mut archived = Archived::default();
    for table in [Table::Keys, Table::Reservations, Table::Ledger] {
        let Some(oldest) = oldest(db, table).await? else { continue };
        let mut from = oldest;
        let mut slice = chrono::Duration::minutes(10);
        while from < cutoff {
            let until = (from + slice).min(cutoff);
            let run = || async {
                let statement = match table {
                    Table::Keys => archiving::forget_keys(from, until),
                    Table::Reservations => archiving::archive_reservations(from, until),
                    Table::Ledger => archiving::archive_ledger(from, until),
                };
                let row = db.query_one_raw(statement).await?;
                let count = |column| -> Result<u64, DbErr> {
                    let n = row.as_ref().map(|r| r.try_get::<i64>("", column)).transpose()?;
                    Ok(n.unwrap_or(0).max(0) as u64)
                };
                let reservations = if let Table::Keys = table { count("reservations")? } else { 0 };
                Ok((count("archived")?, reservations))
            };
            let (rows, reservations) = match collisions.run(uuid::Uuid::nil(), run).await? {
                Attempted::Done(rows) => rows,
                Attempted::Exhausted { attempts } => {
                    return Err(DbErr::Custom(format!("archive: a slice collided {attempts} times")));
                }
            };
            archived.statements += 1;
            archived.reservations += reservations;
            match table {
                Table::Keys => archived.keys += rows,
                Table::Reservations => archived.reservations += rows,
                Table::Ledger => archived.ledger_rows += rows,
            }
            from = until;
            // Aim at `batch` rows: a sparse slice doubles, a dense one halves.
            if rows < batch / 2 {
                slice = (slice * 2).min(chrono::Duration::days(7));
            } else if rows > batch * 2 {
                slice = (slice / 2).max(chrono::Duration::seconds(1));
            }
        }
    }
    let row = db.query_one_raw(archiving::drop_empty_partitions(cutoff)).await?;
    archived.partitions = row.map(|r| r.try_get::<i32>("", "dropped")).transpose()?.unwrap_or(0).max(0) as u64;
    archived.statements += 1;
    archived.events = retention::archive(db, cutoff, batch).await?;
    archived.statements += archived.events.statements;
    Ok(archived)
}

/// The tables the archive thins.
#[derive(Debug, Clone, Copy)]
enum Table {
    Keys,
    Reservations,
    Ledger,
}

/// When the oldest row of `table` the archive may delete was made.
async fn oldest(db: &DatabaseConnection, table: Table) -> Result<Option<DateTime<Utc>>, DbErr> {
    let statement = match table {
        Table::Keys => archiving::oldest_key(),
        Table::Reservations => archiving::oldest_reservation(),
        Table::Ledger => archiving::oldest_ledger_row(),
    };
    let row = db.query_one_raw(statement).await?;
    Ok(row.and_then(|r| r.try_get_by_index::<Option<DateTime<Utc>>>(0).ok().flatten()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_read_as_a_number_and_a_unit_of_at_least_a_day() {
        assert_eq!(parse_age("90d"), Ok(Duration::from_secs(90 * 24 * 3600)));
        assert_eq!(parse_age("36h"), Ok(Duration::from_secs(36 * 3600)));
        assert_eq!(parse_age("2w"), Ok(Duration::from_secs(14 * 24 * 3600)));
        for bad in ["", "d", "90", "90x", "-3d", "1.5d", "0d", "23h", "99999999999999999w"] {
            assert!(parse_age(bad).is_err(), "{bad:?} is refused");
        }
    }
}
