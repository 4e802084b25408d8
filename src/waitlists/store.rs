//! The waiting lists' statements. Leaving locks the inventory's row before
//! the entry's, the order the freeing statements take them in (they change
//! the inventory, then the trigger locks the head entry), so the two never
//! wait for each other in a circle; joining locks the inventory's levels,
//! which every freeing statement changes, and no entry.

use chrono::{DateTime, Utc};
use sea_orm::{ConnectionTrait, DatabaseTransaction, DbBackend, DbErr, FromQueryResult, Statement, TransactionTrait};
use uuid::Uuid;

use crate::{
    db::{Attempted, Collisions},
    stock::{kitting, returning},
};

/// Where an entry stands, as `waitlist_entries.status` spells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, async_graphql::Enum)]
pub(crate) enum WaitlistStatus {
    /// In line: freed units are held for it until its whole quantity is there.
    Waiting,
    /// Its whole quantity is held for its customer as an ACTIVE reservation, `offer`.
    Offered,
    /// The offer was checked out.
    Claimed,
    /// The offer expired before it was checked out.
    Expired,
    /// The customer left the line or released the offer.
    Left,
}

impl WaitlistStatus {
    fn parse(status: &str) -> Result<Self, DbErr> {
        Ok(match status {
            "WAITING" => Self::Waiting,
            "OFFERED" => Self::Offered,
            "CLAIMED" => Self::Claimed,
            "EXPIRED" => Self::Expired,
            "LEFT" => Self::Left,
            other => return Err(DbErr::Type(format!("unknown waiting list status {other}"))),
        })
    }
}

/// What an entry waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Item {
    /// Units of an inventory.
    Inventory(Uuid),
    /// Kits: every component's units, offered together.
    Kit(Uuid),
}

impl Item {
    /// The entry's column naming it and its id.
    fn column(self) -> (&'static str, Uuid) {
        match self {
            Self::Inventory(id) => ("inventory_id", id),
            Self::Kit(id) => ("kit_id", id),
        }
    }
}

/// One entry, with its place in line while it waits.
#[derive(Debug, Clone)]
pub(crate) struct EntryRow {
    pub id: Uuid,
    /// Its place in the order of the line (every entry of every inventory).
    pub seq: i64,
    pub item: Item,
    pub user_id: String,
    pub quantity: i32,
    pub status: WaitlistStatus,
    /// 1 for the next to be offered; only while WAITING.
    pub position: Option<i32>,
    pub created_at: DateTime<Utc>,
    pub offered_at: Option<DateTime<Utc>>,
    /// An inventory's entry: the held units' reservation, the offer once OFFERED.
    pub reservation_id: Option<Uuid>,
    /// A kit's entry: its offer once OFFERED.
    pub kit_reservation_id: Option<Uuid>,
    idempotency_key: Option<String>,
    request_fingerprint: Option<String>,
}

#[derive(FromQueryResult)]
struct Raw {
    id: Uuid,
    seq: i64,
    inventory_id: Option<Uuid>,
    kit_id: Option<Uuid>,
    user_id: String,
    quantity: i32,
    status: String,
    position: Option<i64>,
    created_at: DateTime<Utc>,
    offered_at: Option<DateTime<Utc>>,
    reservation_id: Option<Uuid>,
    kit_reservation_id: Option<Uuid>,
    idempotency_key: Option<String>,
    request_fingerprint: Option<String>,
}

impl TryFrom<Raw> for EntryRow {
    type Error = DbErr;

    fn try_from(raw: Raw) -> Result<Self, DbErr> {
        Ok(Self {
            id: raw.id,
            seq: raw.seq,
            item: match (raw.inventory_id, raw.kit_id) {
                (Some(inventory), None) => Item::Inventory(inventory),
                (None, Some(kit)) => Item::Kit(kit),
                _ => return Err(DbErr::Type(format!("waiting list entry {} waits for no one item", raw.id))),
            },
            user_id: raw.user_id,
            quantity: raw.quantity,
            status: WaitlistStatus::parse(&raw.status)?,
            position: raw.position.map(|p| i32::try_from(p).unwrap_or(i32::MAX)),
            created_at: raw.created_at,
            offered_at: raw.offered_at,
            reservation_id: raw.reservation_id,
            kit_reservation_id: raw.kit_reservation_id,
            idempotency_key: raw.idempotency_key,
            request_fingerprint: raw.request_fingerprint,
        })
    }
}

impl EntryRow {
    /// Whether a join with `key` and `fingerprint` is this entry's replay.
    pub(crate) fn same_request(&self, fingerprint: &str) -> bool {
        self.request_fingerprint.as_deref() == Some(fingerprint) && self.idempotency_key.is_some()
    }
}

/// The columns of [`Raw`] from the entry aliased `e`, its position counted
/// among the WAITING entries of its item (the partial indexes of the lines).
const COLUMNS: &str = "e.id, e.seq, e.inventory_id, e.kit_id, e.user_id, e.quantity, e.status, e.created_at, \
     e.offered_at, e.reservation_id, e.kit_reservation_id, e.idempotency_key, e.request_fingerprint, \
     CASE WHEN e.status = 'WAITING' THEN (SELECT count(*) FROM waitlist_entries w \
        WHERE (w.inventory_id = e.inventory_id OR w.kit_id = e.kit_id) AND w.status = 'WAITING' AND w.seq <= e.seq) \
     END AS position";

async fn rows(db: &impl ConnectionTrait, statement: Statement) -> Result<Vec<EntryRow>, DbErr> {
    Raw::find_by_statement(statement).all(db).await?.into_iter().map(EntryRow::try_from).collect()
}

async fn row(db: &impl ConnectionTrait, statement: Statement) -> Result<Option<EntryRow>, DbErr> {
    Raw::find_by_statement(statement).one(db).await?.map(EntryRow::try_from).transpose()
}

/// One entry by id.
pub(crate) async fn find(db: &impl ConnectionTrait, id: Uuid) -> Result<Option<EntryRow>, DbErr> {
    let sql = format!("SELECT {COLUMNS} FROM waitlist_entries e WHERE e.id = $1");
    row(db, Statement::from_sql_and_values(DbBackend::Postgres, sql, [id.into()])).await
}

/// The entry `user` made with idempotency key `key`, if any.
pub(crate) async fn find_by_key(db: &impl ConnectionTrait, user: &str, key: &str) -> Result<Option<EntryRow>, DbErr> {
    let sql = format!("SELECT {COLUMNS} FROM waitlist_entries e WHERE e.user_id = $1 AND e.idempotency_key = $2");
    row(db, Statement::from_sql_and_values(DbBackend::Postgres, sql, [user.into(), key.into()])).await
}

/// `user`'s WAITING or OFFERED entry for `item`, if any.
pub(crate) async fn find_open(db: &impl ConnectionTrait, item: Item, user: &str) -> Result<Option<EntryRow>, DbErr> {
    let (column, id) = item.column();
    let sql = format!(
        "SELECT {COLUMNS} FROM waitlist_entries e
          WHERE e.{column} = $1 AND e.user_id = $2 AND e.status IN ('WAITING', 'OFFERED')"
    );
    row(db, Statement::from_sql_and_values(DbBackend::Postgres, sql, [id.into(), user.into()])).await
}

/// What a join asks for.
#[derive(Debug, Clone)]
pub(crate) struct Join {
    pub id: Uuid,
    pub item: Item,
    pub user_id: String,
    pub quantity: i32,
    pub location_ids: Option<Vec<Uuid>>,
    pub offer_secs: i32,
    pub idempotency_key: Option<String>,
    pub fingerprint: String,
}

/// What the joining statement found.
#[derive(Debug, FromQueryResult)]
pub(crate) struct Joined {
    /// Whether the inventory (or the active kit) exists.
    pub found: bool,
    /// Its sellable units (or kits) at the entry's locations when judged.
    pub sellable: i64,
    /// Whether the entry was written.
    pub joined: bool,
}

/// Writes the entry when the inventory's sellable units at its locations
/// are fewer than it asks for, in one statement, and flags every level of
/// the inventory `waiting` (so their freed units reach the trigger). The
/// levels are locked first, so a release racing the join either lands
/// before it (and the join sees the unit) or after (and the trigger sees
/// the entry); an open entry of the user, or one with the key, keeps it
/// from being written (`ON CONFLICT`), which the caller then reads.
pub(crate) async fn join(db: &impl ConnectionTrait, join: &Join) -> Result<Joined, DbErr> {
    // An inventory's entry: its levels; a kit's: its components' levels,
    // and the kits they make together (each component's sellable units
    // over its quantity, the fewest).
    const INVENTORY: &str = r#"
WITH item AS (
    SELECT id FROM inventories WHERE id = $2
), components AS (
    SELECT $2::uuid AS inventory_id, 1 AS quantity
), "#;
    const KIT: &str = r#"
WITH item AS (
    SELECT id FROM kits WHERE id = $2 AND active
), components AS (
    SELECT inventory_id, quantity FROM kit_components WHERE kit_id = $2
), "#;
    const REST: &str = r#"levels AS MATERIALIZED (
    SELECT inventory_id, location_id, available, safety_stock FROM stock_levels
     WHERE inventory_id IN (SELECT inventory_id FROM components)
     ORDER BY inventory_id, location_id
       FOR UPDATE
), sellable AS (
    SELECT coalesce(min(s.n / c.quantity), 0)::bigint AS n
      FROM components c
      CROSS JOIN LATERAL (
        SELECT coalesce(sum(greatest(l.available - l.safety_stock, 0)), 0) AS n FROM levels l
         WHERE l.inventory_id = c.inventory_id AND ($5::uuid[] IS NULL OR l.location_id = ANY ($5::uuid[]))) s
), joined AS (
    INSERT INTO waitlist_entries (id, inventory_id, kit_id, user_id, quantity, status, location_ids, offer_secs,
                                  idempotency_key, request_fingerprint)
    SELECT $1, $9, $10, $3, $4, 'WAITING', $5, $6, $7, $8
      FROM item WHERE (SELECT n FROM sellable) < $4
    ON CONFLICT DO NOTHING
    RETURNING id
), flagged AS (
    UPDATE stock_levels SET waiting = true
     WHERE inventory_id IN (SELECT inventory_id FROM components) AND NOT waiting AND EXISTS (SELECT 1 FROM joined)
)
SELECT EXISTS (SELECT 1 FROM item) AS found, (SELECT n FROM sellable) AS sellable,
       EXISTS (SELECT 1 FROM joined) AS joined"#;
    let (head, id, inventory, kit) = match join.item {
        Item::Inventory(id) => (INVENTORY, id, Some(id), None),
        Item::Kit(id) => (KIT, id, None, Some(id)),
    };
    let key = join.idempotency_key.clone();
    let fingerprint = key.as_ref().map(|_| join.fingerprint.clone());
    let statement = Statement::from_sql_and_values(
        DbBackend::Postgres,
        format!("{head}{REST}"),
        [
            join.id.into(),
            id.into(),
            join.user_id.clone().into(),
            join.quantity.into(),
            join.location_ids.clone().into(),
            join.offer_secs.into(),
            key.into(),
            fingerprint.into(),
            inventory.into(),
            kit.into(),
        ],
    );
    Joined::find_by_statement(statement).one(db).await?.ok_or_else(|| DbErr::RecordNotFound("the join's row".into()))
}

/// How many of `ids` name active locations.
pub(crate) async fn active_locations(db: &impl ConnectionTrait, ids: &[Uuid]) -> Result<usize, DbErr> {
    let statement = Statement::from_sql_and_values(
        DbBackend::Postgres,
        "SELECT count(*) AS n FROM locations WHERE id = ANY ($1) AND active",
        [ids.to_vec().into()],
    );
    let row = db.query_one_raw(statement).await?.ok_or_else(|| DbErr::RecordNotFound("a count".into()))?;
    Ok(usize::try_from(row.try_get::<i64>("", "n")?).unwrap_or(0))
}

/// Takes `owner`'s entry `id` out of the line, in one transaction re-run
/// on collisions: the inventory is locked, then the entry; an entry with
/// held units releases their reservation (whose trigger makes the entry
/// LEFT, and whose freed units go to the next in line), one without is
/// made LEFT here. An entry not WAITING or OFFERED is left as it is; an
/// offer past its expiry too (it is the sweeper's, and will be EXPIRED).
/// The entry afterwards; none when it is not `owner`'s.
pub(crate) async fn leave(
    db: &sea_orm::DatabaseConnection,
    collisions: &Collisions,
    id: Uuid,
    owner: &str,
) -> Result<Attempted<Option<EntryRow>>, DbErr> {
    let run = || async {
        let txn = db.begin().await?;
        let left = leave_in(&txn, id, owner).await?;
        txn.commit().await?;
        Ok(left)
    };
    collisions.run(id, run).await
}

async fn leave_in(txn: &DatabaseTransaction, id: Uuid, owner: &str) -> Result<Option<EntryRow>, DbErr> {
    // Its inventory, or its kit's components, in id order.
    let lock = Statement::from_sql_and_values(
        DbBackend::Postgres,
        "SELECT 1 FROM inventories WHERE id IN (
             SELECT inventory_id FROM waitlist_entries WHERE id = $1 AND user_id = $2
             UNION ALL
             SELECT c.inventory_id FROM kit_components c JOIN waitlist_entries e ON e.kit_id = c.kit_id
              WHERE e.id = $1 AND e.user_id = $2)
          ORDER BY id
            FOR UPDATE",
        [id.into(), owner.into()],
    );
    if txn.query_all_raw(lock).await?.is_empty() {
        return Ok(None);
    }
    let entry = Statement::from_sql_and_values(
        DbBackend::Postgres,
        "SELECT status, reservation_id, kit_reservation_id FROM waitlist_entries WHERE id = $1 FOR UPDATE",
        [id.into()],
    );
    let Some(entry) = txn.query_one_raw(entry).await? else { return Ok(None) };
    let status: String = entry.try_get("", "status")?;
    let (offer, kit_offer): (Option<Uuid>, Option<Uuid>) =
        (entry.try_get("", "reservation_id")?, entry.try_get("", "kit_reservation_id")?);
    match status.as_str() {
        "WAITING" => {
            // Its holds (one, or one per component of a kit), each released
            // to the next in line; the first makes the entry LEFT.
            let holds = Statement::from_sql_and_values(
                DbBackend::Postgres,
                "SELECT id FROM reservations WHERE waitlist_entry_id = $1 AND status = 'ACTIVE' ORDER BY inventory_id",
                [id.into()],
            );
            let holds: Vec<Uuid> =
                txn.query_all_raw(holds).await?.iter().map(|row| row.try_get("", "id")).collect::<Result<_, _>>()?;
            for hold in &holds {
                txn.query_one_raw(returning::release(*hold, &hold_owner(id))).await?;
            }
            if holds.is_empty() {
                txn.execute_raw(Statement::from_sql_and_values(
                    DbBackend::Postgres,
                    "UPDATE waitlist_entries SET status = 'LEFT', version = version + 1 WHERE id = $1",
                    [id.into()],
                ))
                .await?;
            }
        }
        "OFFERED" => {
            if let Some(offer) = offer {
                txn.query_one_raw(returning::release(offer, owner)).await?;
            }
            if let Some(kit_offer) = kit_offer {
                txn.query_all_raw(kitting::release_kit(kit_offer, owner)).await?;
            }
        }
        _ => {}
    }
    find(txn, id).await
}

/// Who holds the units of an entry still waiting: a subject no customer's
/// token carries, so no customer can release or check out a hold that is
/// not yet an offer (the trigger writes it as `'waitlist:' || id`).
fn hold_owner(entry: Uuid) -> String {
    format!("waitlist:{entry}")
}

/// A page of `user`'s entries, newest first (by their place in the order
/// of joining), before the entry whose place is `before`.
pub(crate) async fn mine(
    db: &impl ConnectionTrait,
    user: &str,
    first: u64,
    before: Option<i64>,
) -> Result<Vec<EntryRow>, DbErr> {
    let sql = format!(
        "SELECT {COLUMNS} FROM waitlist_entries e WHERE e.user_id = $1 AND e.seq < $2
          ORDER BY e.seq DESC LIMIT $3"
    );
    let limit = i64::try_from(first).unwrap_or(i64::MAX).saturating_add(1);
    let values = [user.into(), before.unwrap_or(i64::MAX).into(), limit.into()];
    rows(db, Statement::from_sql_and_values(DbBackend::Postgres, sql, values)).await
}

/// A page of the WAITING and OFFERED entries of `item` in offer order
/// (first joined first), after the entry whose place in line is `after`.
pub(crate) async fn line(
    db: &impl ConnectionTrait,
    item: Item,
    first: u64,
    after: Option<i64>,
) -> Result<Vec<EntryRow>, DbErr> {
    let (column, id) = item.column();
    let sql = format!(
        "SELECT {COLUMNS} FROM waitlist_entries e
          WHERE e.{column} = $1 AND e.status IN ('WAITING', 'OFFERED') AND e.seq > $2
          ORDER BY e.seq LIMIT $3"
    );
    let limit = i64::try_from(first).unwrap_or(i64::MAX).saturating_add(1);
    let values = [id.into(), after.unwrap_or(0).into(), limit.into()];
    rows(db, Statement::from_sql_and_values(DbBackend::Postgres, sql, values)).await
}

/// Units (or kits) wanted by the WAITING entries of each of `items`, all
/// inventories or all kits.
pub(crate) async fn waiting(db: &impl ConnectionTrait, kits: bool, items: &[Uuid]) -> Result<Vec<(Uuid, i64)>, DbErr> {
    let column = if kits { "kit_id" } else { "inventory_id" };
    let statement = Statement::from_sql_and_values(
        DbBackend::Postgres,
        format!(
            "SELECT {column} AS item, sum(quantity)::bigint AS n FROM waitlist_entries
              WHERE {column} = ANY ($1) AND status = 'WAITING' GROUP BY {column}"
        ),
        [items.to_vec().into()],
    );
    let found = db.query_all_raw(statement).await?;
    found.iter().map(|r| Ok((r.try_get("", "item")?, r.try_get("", "n")?))).collect()
}
