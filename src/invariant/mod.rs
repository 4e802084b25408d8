//! The invariant of docs/design.md, extended by the checkout contract
//! (docs/checkout.md) and by locations (docs/locations.md), checked straight
//! from the tables. For every inventory row:
//!
//! - `stock >= 0` (`stock` is `available`);
//! - `received - fulfilled = available + reserved + committed`, where
//!   `received` is its initial stock plus restocks plus the units returned
//!   to stock (RESTOCK lines of returns, `RETURNED`) plus operators'
//!   adjustments (`ADJUSTED`, signed), `fulfilled` the units of
//!   its FULFILLED lines, `reserved` the units of its ACTIVE reservations and
//!   `committed` those of its ORDERED ones (lines of PENDING and CONFIRMED
//!   orders). An ACTIVE reservation past its expiry counts as `reserved`
//!   until the sweeper returns its stock: its units are not `available`
//!   before that, so counting them anywhere else would break the sum;
//! - `version` = 1 + its committed changes = its number of distinct ledger
//!   versions (one change writes one ledger row per location it touches,
//!   all at the change's version);
//! - the ledger agrees: the deltas of every change of available stock add up
//!   to `stock`, and the FULFILLED entries to minus the fulfilled lines' units;
//! - its levels' `available` add up to `stock`; while it has a sole location
//!   (`sole_location_id`), that location's level is its only one;
//! - the allocations of each of its ACTIVE, ORDERED and FULFILLED lines add
//!   up to the line's quantity (so a line has at least one).
//!
//! And for every inventory and every location its levels, ledger rows or
//! holding allocations name (a ledger row without a location is the default
//! location's):
//!
//! - the level exists and `available >= 0`;
//! - `on hand = available + reserved + committed`, where `on hand` is the
//!   ledger's received, transferred, fulfilled, returned and adjusted units there, and `reserved`
//!   / `committed` the allocations there of ACTIVE / ORDERED lines;
//! - `available` = the ledger's deltas there of every change of available stock.
//!
//! And for every order line with returns: `0 <= returned <= quantity`
//! (never more back than shipped), `returned` is the sum of its return
//! lines, and only a FULFILLED line has any.
//!
//! And for every kit reservation: exactly one reservation per component of
//! its kit, each of kits × the component's quantity, all in one status
//! with one expiry (docs/kits.md).
//!
//! Entries archived by `stockguard archive` count through their inventory's
//! checkpoint rows (`ledger_checkpoints`, `ledger_checkpoint_levels`), which
//! hold their sums.
//!
//! One snapshot for every number, so the check holds at every moment, not
//! only when writers are idle: one REPEATABLE READ transaction, which reads
//! one bounded part of the history per statement ([`sums`]: the ledger a
//! partition at a time, the reservations a range of blocks at a time, then
//! the inventories a batch at a time), so no statement grows with the
//! history and the server's `statement_timeout` (meant for requests) is not
//! the check's: it has its own time limit, or none. What the archive folded
//! into checkpoints is read as one row per inventory and level, so the
//! ledger's part of the work is what the archive has not yet taken; the
//! FULFILLED lines are kept for good and read every time. It writes only
//! temporary tables of partial sums (on the server, a few rows per
//! inventory and level), and hands each batch's drifts on as it finds them.
//! `stockguard check`, every concurrency test and the benchmark use this
//! one check.

mod sums;

use std::time::{Duration, Instant};

use sea_orm::{
    AccessMode, ConnectionTrait, DatabaseConnection, DatabaseTransaction, DbBackend, DbErr, IsolationLevel, Statement,
    TransactionTrait,
};
use serde::Deserialize;
use uuid::Uuid;

use crate::db::{DbFailure, classify};

/// What does not add up: an inventory's own numbers, one of its levels,
/// or an order line's returns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Drift {
    /// The inventory's numbers, summed over its locations.
    Inventory(InventoryDrift),
    /// Its numbers at one location.
    Level(LevelDrift),
    /// An order line's returned units.
    Line(LineDrift),
    /// A kit reservation that is not whole.
    Kit(KitDrift),
    /// A waiting list entry whose held or offered units are not its own.
    Entry(EntryDrift),
}

/// One inventory whose numbers do not add up.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct InventoryDrift {
    /// The inventory.
    pub id: Uuid,
    /// Its SKU.
    pub sku: String,
    /// Units available (the `stock` column).
    pub stock: i64,
    /// Its version.
    pub version: i64,
    /// Units held by ACTIVE reservations.
    pub(crate) reserved: i64,
    /// Units held by ORDERED reservations (order lines not yet fulfilled).
    pub(crate) committed: i64,
    /// Units of FULFILLED lines.
    pub fulfilled: i64,
    /// Initial stock, restocks, units returned to stock and adjustments
    /// (signed), from the ledger.
    pub received: i64,
    /// Number of distinct ledger versions (should equal `version`).
    pub changes: i64,
    /// Sum of the ledger's deltas of available stock (should equal `stock`).
    pub ledger_stock: i64,
    /// Minus the sum of the ledger's FULFILLED deltas (should equal `fulfilled`).
    pub(crate) ledger_fulfilled: i64,
    /// Sum of its levels' available units (should equal `stock`).
    pub levels_available: i64,
    /// The locations of its levels.
    pub(crate) level_locations: Vec<Uuid>,
    /// Its sole location, if any (should be its only level's).
    pub sole_location_id: Option<Uuid>,
    /// Its ACTIVE, ORDERED and FULFILLED lines whose allocations do not add
    /// up to their quantity (should be 0).
    pub misallocated: i64,
}

/// One inventory's numbers at one location that do not add up.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct LevelDrift {
    /// The inventory.
    pub(crate) inventory_id: Uuid,
    /// Its SKU.
    pub(crate) sku: String,
    /// The location.
    pub location_id: Uuid,
    /// Its code; none when no location has this id.
    pub code: Option<String>,
    /// The level's available units; none when there is no level.
    pub available: Option<i64>,
    /// Units there of ACTIVE reservations' allocations.
    pub reserved: i64,
    /// Units there of ORDERED reservations' allocations.
    pub committed: i64,
    /// Received, transferred, fulfilled and returned units there, from the
    /// ledger (should equal available + reserved + committed).
    pub on_hand: i64,
    /// Sum of the ledger's deltas of available stock there (should equal `available`).
    pub ledger_stock: i64,
}

/// One order line whose returned units do not add up.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct LineDrift {
    /// The line (a reservation).
    pub reservation_id: Uuid,
    /// Its order.
    pub(crate) order_id: Option<Uuid>,
    /// Its inventory.
    pub(crate) inventory_id: Uuid,
    /// The inventory's SKU.
    pub(crate) sku: String,
    /// The line's status (should be FULFILLED when it has returns).
    pub status: String,
    /// Units it shipped.
    pub quantity: i64,
    /// Its `returned` counter (should be between 0 and `quantity`).
    pub returned: i64,
    /// Sum of its return lines (should equal `returned`).
    pub return_lines: i64,
}

/// A kit reservation whose components are not its kit's, or not in one
/// status and expiry (or a reservation naming a kit reservation that does
/// not exist: then only its id is known).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct KitDrift {
    /// The kit reservation.
    pub kit_reservation_id: Uuid,
    /// Its kit (none when the kit reservation does not exist).
    pub(crate) kit_id: Option<Uuid>,
    /// The kit's SKU.
    pub(crate) sku: String,
    /// Kits held.
    pub quantity: i64,
    /// The distinct statuses of its reservations (should be one).
    pub statuses: Vec<String>,
    /// The distinct expiries of its reservations (should be at most one).
    pub expiries: i64,
    /// Its kit's components.
    pub components: i64,
    /// Its reservations (should equal `components`).
    pub parts: i64,
    /// Those holding kits × their component's quantity (should equal `components`).
    pub matching: i64,
}

/// A waiting list entry whose units do not add up: a WAITING entry whose
/// hold is not an ACTIVE, unexpiring reservation of exactly its `held`
/// units that no customer owns (or that has units while it holds none, or
/// holds its whole quantity without being offered); an OFFERED entry whose
/// offer is not an ACTIVE reservation of its customer for its quantity; a
/// settled entry (CLAIMED, EXPIRED, LEFT) whose hold is still ACTIVE; a
/// WAITING entry with a level of its inventory not flagged `waiting`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct EntryDrift {
    /// The entry.
    pub entry_id: Uuid,
    /// Its inventory (an inventory's entry).
    pub(crate) inventory_id: Option<Uuid>,
    /// Its kit (a kit's entry).
    pub(crate) kit_id: Option<Uuid>,
    /// The inventory's or the kit's SKU.
    pub(crate) sku: String,
    /// The entry's status.
    pub status: String,
    /// Units it wants.
    pub quantity: i64,
    /// Units it counts as held for it.
    pub held: i64,
    /// Its hold's (or offer's) status; none without one.
    pub hold_status: Option<String>,
    /// Its hold's (or offer's) units.
    pub hold_quantity: i64,
    /// Levels of its inventory not flagged `waiting` while it waits (should
    /// be 0: their freed units would not reach the line).
    pub unflagged_levels: i64,
}

impl std::fmt::Display for Drift {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Inventory(d) => write!(
                f,
                "{} ({}): received {} - fulfilled {} vs available {} + reserved {} + committed {}; \
                 version {} vs {} ledger versions; ledger sums to {} available and {} fulfilled; \
                 levels hold {} available at {:?} (sole location {:?}); \
                 lines whose allocations do not add up to their quantity: {}",
                d.sku,
                d.id,
                d.received,
                d.fulfilled,
                d.stock,
                d.reserved,
                d.committed,
                d.version,
                d.changes,
                d.ledger_stock,
                d.ledger_fulfilled,
                d.levels_available,
                d.level_locations,
                d.sole_location_id,
                d.misallocated
            ),
            Self::Line(d) => write!(
                f,
                "{} ({}) line {} of order {:?}, {}: returned {} of {} shipped, return lines {}",
                d.sku, d.inventory_id, d.reservation_id, d.order_id, d.status, d.returned, d.quantity, d.return_lines
            ),
            Self::Kit(d) => write!(
                f,
                "kit {} ({:?}) reservation {} of {} kits: {} reservations for {} components, {} of them right, \
                 statuses {:?}, {} expiries",
                d.sku,
                d.kit_id,
                d.kit_reservation_id,
                d.quantity,
                d.parts,
                d.components,
                d.matching,
                d.statuses,
                d.expiries
            ),
            Self::Entry(d) => write!(
                f,
                "{} ({:?}) waiting list entry {}, {}: {} of {} held, its hold {:?} of {} units; \
                 {} levels not flagged waiting",
                d.sku,
                d.inventory_id.or(d.kit_id),
                d.entry_id,
                d.status,
                d.held,
                d.quantity,
                d.hold_status,
                d.hold_quantity,
                d.unflagged_levels
            ),
            Self::Level(d) => {
                let available = d.available.map_or_else(|| "no level".to_owned(), |n| n.to_string());
                write!(
                    f,
                    "{} ({}) at {} ({}): on hand {} vs available {} + reserved {} + committed {}; \
                     ledger sums to {} available",
                    d.sku,
                    d.inventory_id,
                    d.code.as_deref().unwrap_or("no such location"),
                    d.location_id,
                    d.on_hand,
                    available,
                    d.reserved,
                    d.committed,
                    d.ledger_stock
                )
            }
        }
    }
}

/// How a check runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Options {
    /// How long the whole check may take before it gives up with
    /// [`CheckError::OutOfTime`]; none: as long as it needs.
    pub time_limit: Option<Duration>,
    /// Inventories judged per statement (with their levels), and so the
    /// most drifts held at once before they are handed on.
    pub batch: u64,
}

/// The time limit of [`Options::default`] and of `stockguard check`.
pub(crate) const DEFAULT_TIME_LIMIT: Duration = Duration::from_secs(3600);

/// The batch of [`Options::default`] and of `stockguard check`.
pub(crate) const DEFAULT_BATCH: u64 = 1000;

impl Default for Options {
    fn default() -> Self {
        Self { time_limit: Some(DEFAULT_TIME_LIMIT), batch: DEFAULT_BATCH }
    }
}

/// Blocks of reservations (8 kB each) read per statement.
const RESERVATION_SLICE: u32 = 1024;

/// What a check reports as it goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Found {
    /// How far it has come.
    Progress(Progress),
    /// An inventory or a level that does not add up, as soon as its batch
    /// is judged (by SKU, then the inventory before its levels).
    Drift(Drift),
}

/// How far a check has come: `done` of `of` units of `step`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Progress {
    /// What it is doing.
    pub step: Step,
    /// Units done.
    pub done: u64,
    /// Units in all.
    pub of: u64,
}

/// The steps of a check, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Summing the ledger, a partition at a time, then the checkpoints
    /// (units: partitions that hold rows, plus one for the checkpoints).
    Ledger,
    /// Summing the reservation lines that count, a range of the table's
    /// blocks at a time (units: blocks).
    Lines,
    /// Judging the inventories and their levels, a batch at a time (units:
    /// inventories).
    Inventories,
}

impl std::fmt::Display for Progress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (what, units) = match self.step {
            Step::Ledger => ("summing the ledger", "parts"),
            Step::Lines => ("summing the reservations", "blocks"),
            Step::Inventories => ("judging", "inventories"),
        };
        write!(f, "{what}: {} of {} {units}", self.done, self.of)
    }
}

/// What a finished check went through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Checked {
    /// Inventories judged.
    pub inventories: u64,
    /// Drifts found (inventories and levels).
    pub drifts: u64,
}

/// Why a check gave no verdict.
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    /// Its time limit ran out first.
    #[error("the check did not finish within its time limit of {} s", .0.as_secs_f64())]
    OutOfTime(Duration),
    /// The database failed it.
    #[error("the check failed: {0}")]
    Database(#[from] DbErr),
}

/// Every inventory, and every level, that breaks the invariant, by SKU;
/// empty when all is well. With the default [`Options`].
pub async fn check(db: &DatabaseConnection) -> Result<Vec<Drift>, CheckError> {
    let mut drifts = Vec::new();
    check_with(db, &Options::default(), |found| {
        if let Found::Drift(drift) = found {
            drifts.push(drift);
        }
    })
    .await?;
    Ok(drifts)
}

/// Checks every inventory and every level, handing each drift and each
/// step of progress to `found` as it comes. Reads one snapshot and writes
/// nothing but temporary tables; the transaction is rolled back at the end.
pub async fn check_with(
    db: &DatabaseConnection,
    options: &Options,
    mut found: impl FnMut(Found),
) -> Result<Checked, CheckError> {
    let clock = Clock { started: Instant::now(), limit: options.time_limit };
    let txn = db.begin_with_config(Some(IsolationLevel::RepeatableRead), Some(AccessMode::ReadWrite)).await?;
    let checked = run(&txn, options, &clock, &mut found).await;
    let rolled_back = txn.rollback().await;
    let checked = checked.map_err(|err| clock.explain(err))?;
    rolled_back?;
    Ok(checked)
}

/// The check's time limit, kept by the server: before each statement the
/// transaction's `statement_timeout` is set to the time left.
struct Clock {
    started: Instant,
    limit: Option<Duration>,
}

impl Clock {
    /// Lets the next statement run for the time left (or without a limit).
    async fn arm(&self, txn: &DatabaseTransaction) -> Result<(), CheckError> {
        let ms = match self.limit {
            None => 0,
            Some(limit) => {
                let left = limit.saturating_sub(self.started.elapsed());
                if left.is_zero() {
                    return Err(CheckError::OutOfTime(limit));
                }
                // 0 would mean no limit at all.
                left.as_millis().max(1)
            }
        };
        txn.execute_unprepared(&format!("SET LOCAL statement_timeout = {ms}")).await?;
        Ok(())
    }

    /// A statement cancelled once the time was up ran out of time; any
    /// other cancellation (an operator's `pg_cancel_backend`) is the
    /// database's doing.
    fn explain(&self, err: CheckError) -> CheckError {
        match (err, self.limit) {
            (CheckError::Database(err), Some(limit))
                if classify(&err) == DbFailure::StatementTimeout && self.started.elapsed() >= limit =>
            {
                CheckError::OutOfTime(limit)
            }
            (err, _) => err,
        }
    }
}

/// The check's statements, in the transaction `txn`.
async fn run(
    txn: &DatabaseTransaction,
    options: &Options,
    clock: &Clock,
    found: &mut impl FnMut(Found),
) -> Result<Checked, CheckError> {
    let query = |sql: &str| Statement::from_string(DbBackend::Postgres, sql);
    // Each step reports what it starts on, and once that it is done.
    let progress = |found: &mut dyn FnMut(Found), step, done, of| found(Found::Progress(Progress { step, done, of }));

    // Before the snapshot is taken (by the next statement): no partition this
    // snapshot sees can be dropped under the check, since dropping one locks
    // the whole ledger (the archive drops the ones it emptied, and waits
    // only a moment for that lock). The ledger alone, not its partitions:
    // the check locks only those it reads, so a new day, whose attaching
    // takes the default partition's strongest lock, is not kept waiting
    // (with every reader of the ledger queued behind it) by a check that
    // never read the default partition.
    clock.arm(txn).await?;
    txn.execute_unprepared("LOCK TABLE ONLY stock_movements IN ACCESS SHARE MODE").await?;
    txn.execute_unprepared(sums::TEMP_TABLES).await?;
    let parts = txn.query_all_raw(query(sums::LEDGER_PARTS)).await?;

    let parts = parts.iter().map(|row| row.try_get::<String>("", "part")).collect::<Result<Vec<_>, _>>()?;
    let of = parts.len() as u64 + 1;
    for (done, part) in parts.iter().enumerate() {
        progress(found, Step::Ledger, done as u64, of);
        clock.arm(txn).await?;
        txn.execute_unprepared(&sums::ledger_part(part)).await?;
    }
    progress(found, Step::Ledger, of - 1, of);
    clock.arm(txn).await?;
    txn.execute_unprepared(sums::CHECKPOINTS).await?;
    progress(found, Step::Ledger, of, of);

    let blocks = one::<i64>(txn, query(sums::RESERVATION_BLOCKS), "blocks").await?;
    let blocks = u32::try_from(blocks.max(0)).unwrap_or(sums::PAST_LAST_BLOCK);
    let mut from: u32 = 0;
    loop {
        if from < blocks {
            progress(found, Step::Lines, from.into(), blocks.into());
        }
        let until = from.saturating_add(RESERVATION_SLICE);
        let last = until >= blocks;
        clock.arm(txn).await?;
        txn.execute_raw(sums::lines(from, if last { sums::PAST_LAST_BLOCK } else { until })).await?;
        if last {
            break;
        }
        from = until;
    }
    progress(found, Step::Lines, blocks.into(), blocks.into());
    clock.arm(txn).await?;
    txn.execute_unprepared(sums::TOTALS).await?;

    let inventories = one::<i64>(txn, query(sums::INVENTORIES), "n").await?.max(0) as u64;
    let mut checked = Checked { inventories: 0, drifts: 0 };
    let mut after: Option<String> = None;
    loop {
        clock.arm(txn).await?;
        let end = txn.query_one_raw(sums::batch_end(after.as_deref(), options.batch.max(1))).await?;
        let Some(last) = end.as_ref().map(|row| row.try_get::<Option<String>>("", "last")).transpose()?.flatten()
        else {
            break;
        };
        let n = end.map(|row| row.try_get::<i64>("", "n")).transpose()?.unwrap_or(0);
        progress(found, Step::Inventories, checked.inventories, inventories);
        clock.arm(txn).await?;
        for row in txn.query_all_raw(sums::drifts(after.as_deref(), &last)).await? {
            found(Found::Drift(drift(&row)?));
            checked.drifts += 1;
        }
        checked.inventories += n.max(0) as u64;
        after = Some(last);
    }
    // The order lines with returns (few beside the inventories, found
    // through the partial index of lines with returned units and the return
    // lines themselves), the kit reservations and the waiting lists' open
    // entries and holds, a statement each after the inventories' batches.
    for statement in [sums::RETURNED_LINES.as_str(), sums::KIT_RESERVATIONS, sums::WAITLIST_ENTRIES] {
        clock.arm(txn).await?;
        for row in txn.query_all_raw(query(statement)).await? {
            found(Found::Drift(drift(&row)?));
            checked.drifts += 1;
        }
    }
    progress(found, Step::Inventories, checked.inventories, inventories);
    Ok(checked)
}

/// The one value `column` of the one row `statement` returns.
async fn one<T: sea_orm::TryGetable>(
    txn: &DatabaseTransaction,
    statement: Statement,
    column: &str,
) -> Result<T, DbErr> {
    let row = txn.query_one_raw(statement).await?;
    row.ok_or_else(|| DbErr::RecordNotFound(column.to_owned()))?.try_get("", column)
}

/// A drift row of [`sums::drifts`]: its kind, and its numbers as JSON.
fn drift(row: &sea_orm::QueryResult) -> Result<Drift, DbErr> {
    let kind: String = row.try_get("", "kind")?;
    let detail: serde_json::Value = row.try_get("", "detail")?;
    let read = |err: serde_json::Error| DbErr::Type(format!("a {kind} drift: {err}"));
    match kind.as_str() {
        "inventory" => serde_json::from_value(detail).map(Drift::Inventory).map_err(read),
        "line" => serde_json::from_value(detail).map(Drift::Line).map_err(read),
        "kit" => serde_json::from_value(detail).map(Drift::Kit).map_err(read),
        "entry" => serde_json::from_value(detail).map(Drift::Entry).map_err(read),
        _ => serde_json::from_value(detail).map(Drift::Level).map_err(read),
    }
}
