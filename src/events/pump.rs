//! The event pump: turns the changes of newly committed transactions into
//! outbox rows, in delivery order.
//!
//! A pass reads the ledger rows and recorded events of exactly the
//! transactions that its snapshot shows as committed and the last pass's
//! snapshot did not (`pg_visible_in_snapshot`): each committed transaction
//! is pumped once, in whatever order transactions took their ids and
//! committed, so none is skipped (the failure of an outbox read by id or
//! sequence) and none is pumped twice. It makes one event per change: one
//! `STOCK_CHANGED` per inventory version (whatever number of locations it
//! touched), one `RESERVATION_CHANGED` per status change a ledger row
//! records, and the recorded `ORDER_CHANGED` and checkout events. They are
//! numbered in delivery order, per inventory and per order by version:
//! within a pass by sorting, and across passes because a later version is
//! written by a transaction that waited for the earlier one's commit, so a
//! snapshot that shows the later shows the earlier too. The pass writes
//! the outbox rows and keeps its snapshot in one statement, after locking
//! the pump's row (so its snapshot is newer than any pass before), so one
//! process pumps at a time, and a pass that is killed wrote nothing. It
//! also deletes the outbox rows every endpoint has been sent, so the outbox
//! holds the backlog, not the history. While no endpoint exists it reads
//! nothing.

use std::{sync::LazyLock, time::Duration};

use sea_orm::{ConnectionTrait, DatabaseConnection, DbBackend, DbErr, IsolationLevel, Statement, TransactionTrait};
use tokio::{sync::watch, task::JoinHandle};

use crate::stock::{
    fragments,
    rows::{ReservationStatus, sql},
};

/// One pass; how many events it numbered (0 when nothing was committed
/// since the last pass). Run with the pump's row locked.
///
/// A `STOCK_CHANGED` event carries the inventory's units after its
/// version: `available` from its ledger rows, and `onHand` and `committed`
/// kept per inventory in `event_stock` from pass to pass (each version
/// adds what its ledger rows changed of them: receipts, transfers and
/// shipments the units on hand, orders, cancellations and shipments the
/// committed ones), so a pass reads no reservation of an inventory it
/// already follows, however many it holds; `reserved` is the rest. An
/// inventory the pump does not follow yet starts from what it holds now,
/// less what the pass changed. A checkout moves units from reserved to
/// committed without a version of the inventory (no stock moves), and
/// commit order is not known: it counts from the first version after its
/// reservation's last change that the same pass numbers (see
/// `checkouts`), so no event shows units committed before they were
/// reserved, or shipped before they were committed.
pub static PUMP_SQL: LazyLock<String> = LazyLock::new(|| {
    format!(
        r#"
WITH pump AS MATERIALIZED (
    SELECT seen, last_seq FROM event_pump
), now_seen AS MATERIALIZED (
    SELECT pg_current_snapshot() AS seen FROM pump
), wanted AS MATERIALIZED (
    SELECT EXISTS (SELECT 1 FROM webhook_endpoints) AS yes
), moves AS MATERIALIZED (
    -- The horizon as a scalar (an InitPlan), so that it bounds the index
    -- scan and prunes the partitions whatever the statistics: as a join
    -- with `pump`, an unanalyzed ledger was read whole by every pass.
    SELECT m.* FROM stock_movements m
     WHERE (SELECT yes FROM wanted) AND m.txid >= (SELECT pg_snapshot_xmin(seen)::text::bigint FROM pump)
       AND NOT pg_visible_in_snapshot(m.txid::text::xid8, (SELECT seen FROM pump))
), recorded AS MATERIALIZED (
    SELECT e.subject_id AS key, e.version, CASE WHEN e.type = 'ORDER_CHANGED' THEN 0 ELSE 2 END AS rank, e.id,
           e.type, e.data, e.occurred_at
      FROM events e
     WHERE (SELECT yes FROM wanted) AND e.txid >= (SELECT pg_snapshot_xmin(seen)::text::bigint FROM pump)
       AND NOT pg_visible_in_snapshot(e.txid::text::xid8, (SELECT seen FROM pump))
), home AS (
    SELECT id FROM locations WHERE code = 'default'
), versions AS MATERIALIZED (
    SELECT inventory_id, version_after AS version, (array_agg(id ORDER BY id))[1] AS id,
           CASE WHEN count(*) > 1 AND bool_and(reason IN ('TRANSFERRED_OUT', 'TRANSFERRED_IN'))
                THEN 'TRANSFERRED' ELSE min(reason) END AS reason,
           sum(delta) AS delta,
           '[' || string_agg('{{"locationId":"' || coalesce(location_id, (SELECT id FROM home)) || '","delta":' || delta
                             || '}}', ',' ORDER BY location_id) || ']' AS locations,
           min(stock_after) AS available,
           {on_hand} AS on_hand_delta,
           {committed} AS committed_delta,
           (array_agg(reservation_id))[1] AS reservation_id, (array_agg(order_id))[1] AS order_id,
           max(created_at) AS occurred_at
      FROM moves
     GROUP BY inventory_id, version_after
), checkouts AS (
    -- A checkout counts right after its reservation's last change in this
    -- pass (taken, or its quantity changed), or before the pass's versions
    -- when there is none: never before the units it commits were
    -- reserved, and before the order's cancellation or shipment.
    SELECT c.key AS inventory_id, (c.data->>'quantity')::bigint AS units,
           coalesce((SELECT max(m.version_after) FROM moves m
                      WHERE m.reservation_id = (c.data->>'reservationId')::uuid
                        AND m.reason IN ('RESERVED', 'QUANTITY_CHANGED')), 0) AS version
      FROM recorded c WHERE c.type = 'RESERVATION_CHANGED'
), touched AS (
    SELECT inventory_id, coalesce(p.on_hand, 0) AS on_hand_delta,
           coalesce(p.committed, 0) + coalesce(c.units, 0) AS committed_delta
      FROM (SELECT inventory_id, sum(on_hand_delta) AS on_hand, sum(committed_delta) AS committed
              FROM versions GROUP BY inventory_id) p
      FULL JOIN (SELECT inventory_id, sum(units) AS units FROM checkouts GROUP BY inventory_id) c USING (inventory_id)
), before AS MATERIALIZED (
    -- Each touched inventory's units on hand and committed before this pass.
    SELECT t.*, coalesce(s.on_hand, h.on_hand - t.on_hand_delta) AS on_hand,
           coalesce(s.committed, h.committed - t.committed_delta) AS committed
      FROM touched t
      LEFT JOIN event_stock s USING (inventory_id)
      LEFT JOIN LATERAL (
        SELECT i.stock + coalesce(sum(r.quantity), 0) AS on_hand,
               coalesce(sum(r.quantity) FILTER (WHERE r.status = {ordered}), 0) AS committed
          FROM inventories i
          LEFT JOIN reservations r ON r.inventory_id = i.id AND r.status IN {holding}
         WHERE i.id = t.inventory_id AND s.inventory_id IS NULL
         GROUP BY i.stock
      ) h ON true
), kept AS (
    INSERT INTO event_stock (inventory_id, on_hand, committed)
    SELECT inventory_id, on_hand + on_hand_delta, committed + committed_delta FROM before
        ON CONFLICT (inventory_id) DO UPDATE SET on_hand = excluded.on_hand, committed = excluded.committed
), stock AS (
    SELECT v.inventory_id AS key, v.version, 0 AS rank, v.id, 'STOCK_CHANGED' AS type,
           '{{"reason":"' || v.reason || '","delta":' || v.delta || ',"locations":' || v.locations
           || ',"available":' || v.available
           || ',"reserved":' || coalesce((u.on_hand - v.available - u.committed)::text, 'null')
           || ',"committed":' || coalesce(u.committed::text, 'null')
           || ',"onHand":' || coalesce(u.on_hand::text, 'null')
           || ',"reservationId":' || coalesce('"' || v.reservation_id || '"', 'null')
           || ',"orderId":' || coalesce('"' || v.order_id || '"', 'null') || '}}' AS data,
           v.occurred_at
      FROM versions v
      JOIN (SELECT s.inventory_id, s.version, b.on_hand + sum(s.on_hand_delta) OVER w AS on_hand,
                   b.committed + sum(s.committed_delta) OVER w AS committed, s.checkout
              FROM (SELECT inventory_id, version, false AS checkout, on_hand_delta, committed_delta FROM versions
                    UNION ALL
                    SELECT inventory_id, version, true, 0, units FROM checkouts) s
              JOIN before b USING (inventory_id)
            WINDOW w AS (PARTITION BY s.inventory_id ORDER BY s.version, s.checkout
                         ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)) u
        ON u.inventory_id = v.inventory_id AND u.version = v.version AND NOT u.checkout
), reservation AS (
    SELECT inventory_id AS key, version_after AS version, 1 AS rank,
           md5((array_agg(id ORDER BY id))[1]::text || '/reservation')::uuid AS id, 'RESERVATION_CHANGED' AS type,
           '{{"reservationId":"' || reservation_id || '","status":"'
           || CASE min(reason) WHEN 'RESERVED' THEN 'ACTIVE' WHEN 'ORDER_CANCELLED' THEN 'RELEASED' ELSE min(reason) END
           || '","quantity":' || abs(sum(delta))
           || ',"orderId":' || coalesce('"' || (array_agg(order_id))[1] || '"', 'null') || '}}' AS data,
           max(created_at) AS occurred_at
      FROM moves
     WHERE reservation_id IS NOT NULL
       AND reason IN ('RESERVED', 'RELEASED', 'EXPIRED', 'ORDERED', 'ORDER_CANCELLED', 'FULFILLED')
     GROUP BY inventory_id, version_after, reservation_id
), every AS (
    SELECT *, 'inventoryId' AS subject FROM stock
    UNION ALL SELECT *, 'inventoryId' FROM reservation
    UNION ALL SELECT key, version, rank, id, type, data::text, occurred_at,
                     CASE WHEN type = 'ORDER_CHANGED' THEN 'orderId' ELSE 'inventoryId' END
                FROM recorded
), numbered AS (
    -- Text put together, not `jsonb` or `json_build_object`: the body is
    -- only ever sent, and building it was most of a pass (`jsonb` sorts
    -- and encodes every object and copies the whole at every `||`;
    -- `json_build_object` looks up every argument's type at every call),
    -- bench/results/decisions.md. Every value is a number, a uuid, a
    -- timestamp, one of a few fixed words or JSON already, so none needs
    -- escaping; keys come in the documented order (docs/webhooks.md).
    SELECT pump.last_seq + row_number() OVER (ORDER BY e.key, e.version, e.rank, e.id) AS seq, e.id, e.type,
           ('{{"id":"' || e.id || '","type":"' || e.type || '","occurredAt":' || to_json(e.occurred_at)
            || ',"' || e.subject || '":"' || e.key || '"'
            || CASE WHEN e.version < 2147483647 THEN ',"version":' || e.version ELSE '' END
            || ',"data":' || e.data || '}}') AS body
      FROM every e, pump
), written AS (
    INSERT INTO outbox (seq, id, type, body) SELECT seq, id, type, body FROM numbered
), pumped AS (
    -- What this pass (or an earlier one) has pumped; later passes skip it.
    DELETE FROM events e USING now_seen WHERE pg_visible_in_snapshot(e.txid::text::xid8, now_seen.seen)
), needed AS (
    -- The first event some endpoint still needs: after its cursor (on or
    -- off), or in a delivery not yet DELIVERED (to be sent, sent again, or
    -- replayed). A body is cut, and the cursor moved past it, in one
    -- statement, so this snapshot sees either the old cursor or the new
    -- delivery.
    SELECT least((SELECT min(sent_through) FROM webhook_endpoints) + 1,
                 (SELECT min(seqs[1]) FROM webhook_deliveries WHERE status <> 'DELIVERED')) AS seq
), pruned AS (
    DELETE FROM outbox o USING needed, pump WHERE o.seq < needed.seq
)
UPDATE event_pump p
   SET seen = now_seen.seen, last_seq = p.last_seq + (SELECT count(*) FROM numbered)
  FROM now_seen
RETURNING (SELECT count(*) FROM numbered)::bigint AS pumped"#,
        on_hand = fragments::ledger_on_hand(),
        committed = fragments::ledger_committed(),
        ordered = sql(ReservationStatus::Ordered),
        holding = fragments::holding(),
    )
});

/// Runs one pass on `db` at READ COMMITTED whatever the pool's default (a
/// serializable reader of the ledger's newest rows would make every
/// writer's insert a read-write conflict); how many events it numbered, or
/// None when no endpoint exists and it read nothing.
pub async fn pump_once(requests: &DatabaseConnection, db: &DatabaseConnection) -> Result<Option<i64>, DbErr> {
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
    summarize(db).await;
    let txn = db.begin_with_config(Some(IsolationLevel::ReadCommitted), None).await?;
    txn.execute_unprepared(PASS_SETTINGS).await?;
    // The pump's row is locked by a statement of its own, before the pass
    // takes its snapshot: locked inside the pass, a pass whose snapshot was
    // taken before another process's pass committed would still get the
    // row after it and write its older snapshot back, and the next pass
    // would number those transactions' events a second time.
    let lock = "SELECT true AS mine FROM event_pump FOR UPDATE SKIP LOCKED";
    if txn.query_one_raw(Statement::from_string(DbBackend::Postgres, lock)).await?.is_none() {
        txn.commit().await?;
        return Ok(Some(0));
    }
    let statement = Statement::from_string(DbBackend::Postgres, PUMP_SQL.as_str());
    let row = txn.query_one_raw(statement).await?;
    txn.commit().await?;
    row.map_or(Ok(Some(0)), |row| row.try_get("", "pumped").map(Some))
}

/// The settings a pass runs with (public so that a test can plan the pass
/// as the pump does).
///
/// - No JIT: the pass plans as costly enough to be compiled, which took
///   PostgreSQL two seconds of CPU per pass for a statement that runs in
///   milliseconds.
/// - No sequential scans: the pass is planned once per connection, often
///   while the day's ledger partition is still empty, and a plan that
///   scans it whole read every row written since (40,006 rows, 40 ms, for
///   a pass that found none, under `bench load reserve`). With the ledger's
///   horizon a scalar, its BRIN index bounds the read whatever the
///   statistics said when the plan was made.
pub const PASS_SETTINGS: &str = "SELECT set_config('jit', 'off', true), set_config('enable_seqscan', 'off', true)";

/// Summarizes the filled ledger ranges of the BRIN index on `txid` that no
/// one has summarized yet, in every partition; `ranges`, how many (public
/// so that a test can count what a pass left).
pub const SUMMARIZE_SQL: &str = "SELECT coalesce(sum(brin_summarize_new_values(i.inhrelid)), 0)::bigint AS ranges
  FROM pg_inherits i WHERE i.inhparent = 'stock_movements_txid'::regclass";

/// Summarizes the ledger's BRIN ranges on `txid` that have filled since
/// the last pass, so that the next pass skips them. An unsummarized range
/// is read by every pass, and autovacuum summarizes (`autosummarize`) only
/// when it visits: under load it did not within a minute, every pass read
/// the whole day's ledger again (132,295 rows for 2,404 new ones, 45 ms,
/// under `bench --webhook`), and the pump fell further behind the longer
/// the load went on. A range still filling is always read; a lock it cannot
/// have at once (a vacuum of the ledger) skips the summary for this pass,
/// so the pump never waits for it.
async fn summarize(db: &DatabaseConnection) {
    let summarized = async {
        let txn = db.begin().await?;
        txn.execute_unprepared("SET LOCAL lock_timeout = '20ms'").await?;
        txn.query_one_raw(Statement::from_string(DbBackend::Postgres, SUMMARIZE_SQL)).await?;
        txn.commit().await
    };
    if let Err(err) = summarized.await {
        tracing::debug!(error = %err, "the ledger's new BRIN ranges were not summarized this pass");
    }
}

/// Pumps every `interval` until `stop` turns true; while no endpoint
/// exists it only looks once every [`IDLE`]. A failed pass wrote nothing
/// and is tried again.
pub fn spawn(
    requests: DatabaseConnection,
    db: DatabaseConnection,
    interval: Duration,
    mut stop: watch::Receiver<bool>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            let pause = match pump_once(&requests, &db).await {
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
    })
}

/// How often an idle pump (no endpoint) looks for one.
pub const IDLE: Duration = Duration::from_secs(1);
