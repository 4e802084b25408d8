//! The event pump: turns the changes of newly committed transactions into
//! outbox rows, in delivery order.
//!
//! A pass reads the ledger rows and recorded events of exactly the
//! transactions that its snapshot shows as committed and the last pass's
//! snapshot did not (`pg_visible_in_snapshot`): each committed transaction
//! is pumped once, in whatever order transactions took their ids and
//! committed, so none is skipped (the failure of an outbox read by id or
//! sequence) and none is pumped twice. It makes one event per change
//! (`render.rs`) and numbers them in delivery order, per inventory and per
//! order by version: within a pass by sorting, and across passes because a
//! later version is written by a transaction that waited for the earlier
//! one's commit, so a snapshot that shows the later shows the earlier too.
//!
//! A pass is one REPEATABLE READ transaction, so its reads and the snapshot
//! it keeps are one snapshot, and it begins by locking the pump's row: one
//! process pumps at a time, a pass whose snapshot is older than another
//! process's committed pass fails to lock (a serialization failure) and
//! writes nothing, and a pass that is killed wrote nothing. It writes the
//! events up to 100 to an outbox row, keeps its snapshot, and deletes the
//! outbox rows every endpoint has been sent, so the outbox holds the
//! backlog, not the history. While no endpoint exists it reads nothing.
//!
//! The events are made in the server, not in SQL: made by a statement,
//! they cost PostgreSQL a dozen plan nodes and an outbox row written and
//! deleted per event, a third of the reserve path's throughput with one
//! endpoint (bench/results/decisions.md, "Events out: a body's events in
//! one row").

use std::{collections::HashMap, sync::LazyLock, time::Duration};

use sea_orm::{
    ConnectionTrait, DatabaseConnection, DatabaseTransaction, DbBackend, DbErr, IsolationLevel, QueryResult, Statement,
    TransactionTrait, Value,
};
use tokio::sync::watch;
use uuid::Uuid;

use super::{
    outbox,
    render::{Made, Move, Pass, Recorded, Units},
};
use crate::stock::{
    fragments,
    rows::{ReservationStatus, location, sql},
};

/// The ledger rows of the transactions committed since the last pass, and
/// where each lies (its partition and heap block, for [`summarize`]).
///
/// The horizon is a scalar (an InitPlan), so that it bounds the BRIN index
/// scan and prunes the partitions whatever the statistics: as a join with
/// the pump's row, an unanalyzed ledger was read whole by every pass.
pub const LEDGER_SQL: &str = "
SELECT m.id, m.inventory_id, m.version_after, m.reason, m.delta, m.location_id, m.stock_after,
       m.reservation_id, m.order_id, m.created_at, m.adjustment_reason, m.kit_reservation_id,
       m.tableoid::bigint AS partition, (m.ctid::text::point)[0]::bigint AS block
  FROM stock_movements m
 WHERE m.txid >= (SELECT pg_snapshot_xmin(seen)::text::bigint FROM event_pump)
   AND NOT pg_visible_in_snapshot(m.txid::text::xid8, (SELECT seen FROM event_pump))";

/// The events recorded by the transactions committed since the last pass.
const RECORDED_SQL: &str = "
SELECT e.id, e.type, e.subject_id, e.version, e.data::text AS data, e.occurred_at,
       (e.data->>'reservationId')::uuid AS reservation_id, (e.data->>'quantity')::bigint AS quantity,
       (e.data->>'returnNumber')::integer AS return_number
  FROM events e
 WHERE e.txid >= (SELECT pg_snapshot_xmin(seen)::text::bigint FROM event_pump)
   AND NOT pg_visible_in_snapshot(e.txid::text::xid8, (SELECT seen FROM event_pump))";

/// Each touched inventory's units on hand and committed: as the pump kept
/// them, or, for one it does not follow yet, as it holds them now (its
/// stock and its holding reservations), which the pass reads at the same
/// snapshot as the changes.
static UNITS_SQL: LazyLock<String> = LazyLock::new(|| {
    format!(
        "
SELECT t.id, s.on_hand AS kept_on_hand, s.committed AS kept_committed, h.on_hand AS held_on_hand,
       h.committed AS held_committed
  FROM unnest($1::uuid[]) AS t(id)
  LEFT JOIN event_stock s ON s.inventory_id = t.id
  LEFT JOIN LATERAL (
    SELECT i.stock + coalesce(sum(r.quantity), 0) AS on_hand,
           coalesce(sum(r.quantity) FILTER (WHERE r.status = {ordered}), 0) AS committed
      FROM inventories i
      LEFT JOIN reservations r ON r.inventory_id = i.id AND r.status IN {holding}
     WHERE i.id = t.id AND s.inventory_id IS NULL
     GROUP BY i.stock
  ) h ON true",
        ordered = sql(ReservationStatus::Ordered),
        holding = fragments::holding(),
    )
});

/// Writes a pass: its outbox rows (`$1`..`$7`, [`outbox::WRITE_ROWS`]),
/// the units that changed (`$8`..`$10`), and its snapshot (`$11`) and last
/// number (`$12`); deletes the recorded events it pumped, and the outbox
/// rows no endpoint needs ([`outbox::PRUNE`]).
static WRITE_SQL: LazyLock<String> = LazyLock::new(|| {
    format!(
        "
WITH written AS ({written}
), kept AS (
    INSERT INTO event_stock (inventory_id, on_hand, committed)
    SELECT * FROM unnest($8::uuid[], $9::bigint[], $10::bigint[])
        ON CONFLICT (inventory_id) DO UPDATE SET on_hand = excluded.on_hand, committed = excluded.committed
), pumped AS (
    DELETE FROM events e WHERE pg_visible_in_snapshot(e.txid::text::xid8, $11::text::pg_snapshot)
), {pruned}
UPDATE event_pump SET seen = $11::text::pg_snapshot, last_seq = $12",
        written = outbox::WRITE_ROWS,
        pruned = outbox::PRUNE.as_str(),
    )
});

/// Each touched inventory's units on hand and committed as this process's
/// last pass left them in `event_stock`, valid while the pump's row still
/// holds that pass's snapshot: no other pass (of any process) and no wake
/// (which forgets `event_stock`) has come since, as each moves the
/// snapshot. A pass reads the units of the inventories it does not hold
/// here, and writes the units that changed: at SPREAD, reading and writing
/// every touched inventory's units was a fifth of the pump's statements'
/// time, though a reservation changes neither (bench/results/decisions.md).
#[derive(Default)]
pub(crate) struct Kept {
    /// The snapshot the pump's row held after the pass that left `units`.
    seen: Option<String>,
    units: HashMap<Uuid, (i64, i64)>,
}

/// Most inventories [`Kept`] holds; past it, it starts again (memory).
const MOST_KEPT: usize = 200_000;

/// Runs one pass on `db`; how many events it numbered (0 when nothing was
/// committed since the last pass, or another process is pumping), or None
/// when no endpoint exists and it read nothing.
pub(crate) async fn pump_once(
    requests: &DatabaseConnection,
    db: &DatabaseConnection,
    kept: &mut Kept,
    ranges: &mut Summarized,
) -> Result<Option<i64>, DbErr> {
    // No endpoint, no pass: it would lock every day of the ledger for
    // nothing. Whoever creates the first endpoint moves the pump's snapshot
    // to that moment (src/webhooks/store.rs). An endpoint that is off still
    // counts: it is sent what it missed when it is turned on again. The
    // look goes through the requests' pool, which is open anyway, so that
    // an idle shop's processes hold no connection of the events' own.
    let any = "SELECT EXISTS (SELECT 1 FROM webhook_endpoints) AS any";
    let row = requests.query_one_raw(Statement::from_string(DbBackend::Postgres, any)).await?;
    if !row.map_or(Ok(false), |row| row.try_get::<bool>("", "any"))? {
        return Ok(None);
    }
    match pass(db, kept).await {
        // Another process's pass committed after this one's snapshot: it
        // pumped what this one would have.
        Err(err) if crate::db::classify(&err).is_collision() => Ok(Some(0)),
        Err(err) => Err(err),
        Ok((events, filling)) => {
            summarize(db, filling, ranges).await;
            Ok(Some(events))
        }
    }
}

/// One pass (see the module's comment): how many events it numbered, and
/// the lowest heap block of each ledger partition it read rows from.
async fn pass(db: &DatabaseConnection, kept: &mut Kept) -> Result<(i64, HashMap<i64, i64>), DbErr> {
    // REPEATABLE READ, not SERIALIZABLE: a serializable reader of the
    // ledger's newest rows would make every writer's insert a read-write
    // conflict.
    let txn = db.begin_with_config(Some(IsolationLevel::RepeatableRead), None).await?;
    let lock = "SELECT last_seq, seen::text AS seen, pg_current_snapshot()::text AS now_seen,
                       EXISTS (SELECT 1 FROM webhook_endpoints) AS wanted,
                       (SELECT id FROM locations WHERE code = $1) AS home
                  FROM event_pump FOR UPDATE SKIP LOCKED";
    let lock = Statement::from_sql_and_values(DbBackend::Postgres, lock, [location::DEFAULT_CODE.into()]);
    let Some(pump) = txn.query_one_raw(lock).await? else {
        txn.commit().await?;
        return Ok((0, HashMap::new()));
    };
    let last_seq: i64 = pump.try_get("", "last_seq")?;
    let now_seen: String = pump.try_get("", "now_seen")?;
    if kept.seen.as_deref() != Some(pump.try_get::<String>("", "seen")?.as_str()) || kept.units.len() > MOST_KEPT {
        kept.units.clear();
    }
    // The last endpoint may have gone since the look: the snapshot moves on
    // and nothing is made.
    let (ledger, recorded) = if pump.try_get::<bool>("", "wanted")? {
        (
            read(&txn, LEDGER_SQL, Vec::new(), read_ledger_row).await?,
            read(&txn, RECORDED_SQL, Vec::new(), read_recorded).await?,
        )
    } else {
        (Vec::new(), Vec::new())
    };
    let mut filling: HashMap<i64, i64> = HashMap::new();
    let moves: Vec<Move> = ledger
        .into_iter()
        .map(|(change, (partition, block))| {
            filling.entry(partition).and_modify(|lowest| *lowest = block.min(*lowest)).or_insert(block);
            change
        })
        .collect();
    let pass = Pass::new(&moves, &recorded, pump.try_get("", "home")?);
    let (known, unknown): (Vec<Uuid>, Vec<Uuid>) =
        pass.touched().into_iter().partition(|id| kept.units.contains_key(id));
    let mut units: HashMap<Uuid, Units> = if unknown.is_empty() {
        HashMap::new()
    } else {
        read(&txn, &UNITS_SQL, vec![unknown.into()], read_units).await?.into_iter().collect()
    };
    units.extend(known.into_iter().map(|id| (id, Units { kept: kept.units.get(&id).copied(), held: None })));
    let mut made = pass.make(last_seq, &units);
    let after = std::mem::take(&mut made.units);
    made.units =
        after.iter().copied().filter(|&(id, h, c)| units.get(&id).and_then(|u| u.kept) != Some((h, c))).collect();
    let events = made.events;
    let values = write_values(made, last_seq, now_seen.clone());
    txn.execute_raw(Statement::from_sql_and_values(DbBackend::Postgres, WRITE_SQL.as_str(), values)).await?;
    txn.commit().await?;
    kept.seen = Some(now_seen);
    kept.units.extend(after.into_iter().map(|(id, h, c)| (id, (h, c))));
    Ok((events, filling))
}

/// The rows of `sql` with `values`, each read by `each`.
async fn read<T>(
    txn: &DatabaseTransaction,
    sql: &str,
    values: Vec<Value>,
    each: fn(&QueryResult) -> Result<T, DbErr>,
) -> Result<Vec<T>, DbErr> {
    let rows = txn.query_all_raw(Statement::from_sql_and_values(DbBackend::Postgres, sql, values)).await?;
    rows.iter().map(each).collect()
}

/// A row of [`LEDGER_SQL`]: the change, and its partition and block.
fn read_ledger_row(row: &QueryResult) -> Result<(Move, (i64, i64)), DbErr> {
    let lies = (row.try_get("", "partition")?, row.try_get("", "block")?);
    Ok((read_move(row)?, lies))
}

fn read_move(row: &QueryResult) -> Result<Move, DbErr> {
    Ok(Move {
        id: row.try_get("", "id")?,
        inventory_id: row.try_get("", "inventory_id")?,
        version: row.try_get("", "version_after")?,
        reason: row.try_get("", "reason")?,
        delta: row.try_get("", "delta")?,
        location_id: row.try_get("", "location_id")?,
        stock_after: row.try_get("", "stock_after")?,
        reservation_id: row.try_get("", "reservation_id")?,
        order_id: row.try_get("", "order_id")?,
        created_at: row.try_get("", "created_at")?,
        adjustment_reason: row.try_get("", "adjustment_reason")?,
        kit_reservation_id: row.try_get("", "kit_reservation_id")?,
    })
}

fn read_recorded(row: &QueryResult) -> Result<Recorded, DbErr> {
    Ok(Recorded {
        id: row.try_get("", "id")?,
        kind: row.try_get("", "type")?,
        subject_id: row.try_get("", "subject_id")?,
        version: row.try_get("", "version")?,
        data: row.try_get("", "data")?,
        occurred_at: row.try_get("", "occurred_at")?,
        reservation_id: row.try_get("", "reservation_id")?,
        quantity: row.try_get("", "quantity")?,
        return_number: row.try_get("", "return_number")?,
    })
}

fn read_units(row: &QueryResult) -> Result<(Uuid, Units), DbErr> {
    let pair = |on_hand: Option<i64>, committed: Option<i64>| on_hand.zip(committed);
    Ok((
        row.try_get("", "id")?,
        Units {
            kept: pair(row.try_get("", "kept_on_hand")?, row.try_get("", "kept_committed")?),
            held: pair(row.try_get("", "held_on_hand")?, row.try_get("", "held_committed")?),
        },
    ))
}

/// The values of [`WRITE_SQL`] for `made` (its bodies moved, not copied).
fn write_values(mut made: Made, last_seq: i64, now_seen: String) -> Vec<Value> {
    let mut values = Vec::from(outbox::row_values(&mut made.rows, last_seq));
    values.extend([
        made.units.iter().map(|u| u.0).collect::<Vec<Uuid>>().into(),
        made.units.iter().map(|u| u.1).collect::<Vec<i64>>().into(),
        made.units.iter().map(|u| u.2).collect::<Vec<i64>>().into(),
        now_seen.into(),
        (last_seq + made.events).into(),
    ]);
    values
}

/// Summarizes the ranges of the ledger's BRIN index on `txid` that have
/// filled since the last pass, so that the next pass skips them, and never
/// the ones still filling: `$1` the partitions the pass read rows from,
/// `$2` the lowest block it read in each, `$3` the block below which this
/// process summarized each at its last pass (0 the first time). In those
/// partitions it summarizes the ranges from `$3`'s up to the one holding
/// `$2`'s block; every other partition (a past day's), whole.
///
/// Why not the ranges still filling: a summarized range must widen its
/// summary for every row inserted into it (transaction ids only grow), a
/// lock of the index page and a WAL record inside every reserve statement;
/// unsummarized, an insert leaves the index alone. Summarizing the ledger
/// with `brin_summarize_new_values`, which takes the last range too, every
/// 100 ms cost the HOT chain 4.6 % of its reservations on its own
/// (bench/results/decisions.md, "JIT"), and bought the pump nothing: the
/// range holding the newest rows is read by every pass either way.
///
/// Why at all: an unsummarized range is read by every pass, and autovacuum
/// summarizes (`autosummarize`) only when it visits: under load it did not
/// within a minute, every pass read the whole day's ledger again (132,295
/// rows for 2,404 new ones, 45 ms, under `bench --webhook`), and the pump
/// fell further behind the longer the load went on.
const SUMMARIZE_SQL: &str = "
SELECT coalesce(sum(CASE WHEN f.partition IS NULL THEN brin_summarize_new_values(h.inhrelid) ELSE (
           SELECT coalesce(sum(brin_summarize_range(h.inhrelid, b)), 0)
             FROM generate_series(f.done / r.pages * r.pages, f.lowest / r.pages * r.pages - r.pages, r.pages) AS b
       ) END), 0)::bigint AS ranges
  FROM pg_inherits h
  JOIN pg_index x ON x.indexrelid = h.inhrelid
  JOIN pg_class c ON c.oid = h.inhrelid
  CROSS JOIN LATERAL (
    SELECT coalesce((SELECT option_value::bigint FROM pg_options_to_table(c.reloptions)
                      WHERE option_name = 'pages_per_range'), 128) AS pages
  ) r
  LEFT JOIN unnest($1::bigint[], $2::bigint[], $3::bigint[]) AS f(partition, lowest, done)
    ON f.partition = x.indrelid::bigint
 WHERE h.inhparent = 'stock_movements_txid'::regclass";

/// Where this process's pump has summarized the ledger: the partitions
/// its last pass with rows read them from, each with the lowest block it
/// read there, below which every range is summarized (see [`summarize`]).
#[derive(Default)]
pub(crate) struct Summarized {
    below: HashMap<i64, i64>,
}

/// Summarizes the ranges below the ones still filling (see
/// [`SUMMARIZE_SQL`]); `filling`, the lowest block a pass read in each
/// partition. A pass that read no rows leaves the partitions of the last
/// one that did as they are (they are still filling: a pause in the load
/// is no reason to summarize the ranges the next reserves write to); a
/// pass that read rows summarizes whole every other partition (yesterday's,
/// after midnight). A lock it cannot have at once (a vacuum of the ledger)
/// skips the summary for this pass, so the pump never waits for it.
async fn summarize(db: &DatabaseConnection, filling: HashMap<i64, i64>, ranges: &mut Summarized) {
    let listed = if filling.is_empty() { ranges.below.clone() } else { filling };
    let (partitions, lowest): (Vec<i64>, Vec<i64>) = listed.iter().map(|(&p, &b)| (p, b)).unzip();
    let done: Vec<i64> = partitions.iter().map(|p| ranges.below.get(p).copied().unwrap_or(0)).collect();
    let summarized = async {
        let txn = db.begin().await?;
        txn.execute_unprepared("SET LOCAL lock_timeout = '20ms'").await?;
        let values: [Value; 3] = [partitions.into(), lowest.into(), done.into()];
        txn.query_one_raw(Statement::from_sql_and_values(DbBackend::Postgres, SUMMARIZE_SQL, values)).await?;
        txn.commit().await
    };
    match summarized.await {
        Ok(()) => ranges.below = listed,
        Err(err) => tracing::debug!(error = %err, "the ledger's filled BRIN ranges were not summarized this pass"),
    }
}

/// Pumps every `interval` until `stop` turns true; while no endpoint
/// exists it only looks once every [`IDLE`]. A failed pass wrote nothing
/// and is tried again.
pub(crate) async fn run(
    requests: DatabaseConnection,
    db: DatabaseConnection,
    interval: Duration,
    mut stop: watch::Receiver<bool>,
) {
    let (mut kept, mut ranges) = (Kept::default(), Summarized::default());
    loop {
        let pause = match pump_once(&requests, &db, &mut kept, &mut ranges).await {
            Ok(Some(_)) => interval,
            Ok(None) => IDLE.max(interval),
            Err(err) => {
                tracing::warn!(error = %err, "the event pump's pass failed; trying again");
                IDLE.max(interval)
            }
        };
        tokio::select! {
            _ = tokio::time::sleep(pause) => {}
            _ = stop.changed() => break,
        }
    }
}

/// How often an idle pump (no endpoint) looks for one.
pub(crate) const IDLE: Duration = Duration::from_secs(1);
