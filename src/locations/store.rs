//! SQL for locations: reads of locations, of an inventory's levels with what
//! is held at each, and of reservations' allocations; creating and
//! changing a location; and running the transfer statement
//! (`stock::moving`). `service.rs` decides what a result means.

use std::sync::LazyLock;

use async_graphql::connection::CursorType;
use sea_orm::{
    ColumnTrait, Condition, ConnectionTrait, DatabaseConnection, DbBackend, DbErr, EntityTrait, FromQueryResult,
    QueryFilter, QueryOrder, QuerySelect, Statement, Value,
};
use uuid::Uuid;

use super::LocationRow;
use crate::{
    db::{Attempted, Collisions},
    pagination::Page,
    stock::{
        fragments, moving,
        rows::{
            AllocationRow, InventoryRow, ReservationStatus,
            location::{Column, Entity},
        },
    },
};

/// A position in the list of locations, ordered by priority, then code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LocationCursor {
    /// The location's priority.
    pub priority: i32,
    /// The location's code, unique, which breaks ties.
    pub code: String,
}

impl CursorType for LocationCursor {
    type Error = &'static str;

    /// `<priority>:<code>`: the priority has no colon, so the first one ends it.
    fn decode_cursor(s: &str) -> Result<Self, Self::Error> {
        let (priority, code) = s.split_once(':').ok_or("malformed cursor")?;
        Ok(Self { priority: priority.parse().map_err(|_| "malformed cursor")?, code: code.to_owned() })
    }

    fn encode_cursor(&self) -> String {
        format!("{}:{}", self.priority, self.code)
    }
}

/// The locations with these ids (missing ones are left out).
pub(crate) async fn find_many(db: &impl ConnectionTrait, ids: &[Uuid]) -> Result<Vec<LocationRow>, DbErr> {
    Entity::find().filter(Column::Id.is_in(ids.iter().copied())).all(db).await
}

/// One page in `(priority, code)` order, with one extra row when more follow.
pub(crate) async fn page(db: &DatabaseConnection, page: Page<LocationCursor>) -> Result<Vec<LocationRow>, DbErr> {
    let mut query = Entity::find();
    if let Some(after) = page.after {
        query = query.filter(
            Condition::any()
                .add(Column::Priority.gt(after.priority))
                .add(Condition::all().add(Column::Priority.eq(after.priority)).add(Column::Code.gt(after.code))),
        );
    }
    query.order_by_asc(Column::Priority).order_by_asc(Column::Code).limit(page.first + 1).all(db).await
}

/// A new location; a taken code fails on its unique index.
pub(crate) async fn create(
    db: &DatabaseConnection,
    code: &str,
    name: &str,
    priority: i32,
) -> Result<LocationRow, DbErr> {
    let statement = Statement::from_sql_and_values(
        DbBackend::Postgres,
        "INSERT INTO locations (id, code, name, priority) VALUES ($1, $2, $3, $4) RETURNING *",
        [Uuid::new_v4().into(), code.into(), name.into(), priority.into()],
    );
    LocationRow::find_by_statement(statement).one(db).await?.ok_or_else(|| DbErr::RecordNotInserted)
}

/// Changes the given fields of location `id` (the others stay); the row as
/// left, or none when no location has that id.
pub(crate) async fn update(
    db: &DatabaseConnection,
    id: Uuid,
    name: Option<&str>,
    priority: Option<i32>,
    active: Option<bool>,
) -> Result<Option<LocationRow>, DbErr> {
    let statement = Statement::from_sql_and_values(
        DbBackend::Postgres,
        "UPDATE locations
            SET name = coalesce($2, name), priority = coalesce($3, priority), active = coalesce($4, active)
          WHERE id = $1
      RETURNING *",
        [id.into(), name.map(str::to_owned).into(), priority.into(), active.into()],
    );
    LocationRow::find_by_statement(statement).one(db).await
}

/// One inventory's units at one location.
#[derive(Debug, Clone, PartialEq, Eq, FromQueryResult)]
pub struct LevelState {
    /// The inventory.
    pub(crate) inventory_id: Uuid,
    /// The location.
    pub(crate) location_id: Uuid,
    /// Free to reserve there.
    pub(crate) available: i64,
    /// Allocated there to ACTIVE reservations.
    pub reserved: i64,
    /// Allocated there to ORDERED reservations (order lines).
    pub committed: i64,
    /// The last available units there that no customer may take.
    pub safety_stock: i32,
}

impl LevelState {
    /// The level of an inventory at a location that never held it: nothing.
    pub fn empty(inventory_id: Uuid, location_id: Uuid) -> Self {
        Self { inventory_id, location_id, available: 0, reserved: 0, committed: 0, safety_stock: 0 }
    }

    /// Units a customer may take there: available above the safety stock.
    pub fn sellable(&self) -> i64 {
        (self.available - i64::from(self.safety_stock)).max(0)
    }
}

/// The statement of [`levels`], over `$1`, the inventories' ids (public so
/// that a test can plan it as the server's connections do).
pub static LEVELS_SQL: LazyLock<String> = LazyLock::new(|| {
    format!(
        r#"
SELECT l.inventory_id, l.location_id, l.available::bigint AS available,
       coalesce(h.reserved, 0)::bigint AS reserved, coalesce(h.committed, 0)::bigint AS committed, l.safety_stock
  FROM stock_levels l
  JOIN locations loc ON loc.id = l.location_id
  LEFT JOIN (
    SELECT inventory_id, location_id, {reserved} AS reserved, {committed} AS committed
      FROM (
        SELECT r.inventory_id, r.status, a.location_id, a.quantity
          FROM reservations r
         CROSS JOIN LATERAL (
            -- Each holding reservation's allocations by its key. OFFSET 0
            -- keeps the join a lookup per reservation: flattened, it became
            -- a hash join over every allocation whenever the table had not
            -- been analyzed lately (a parallel scan, 30-65 ms a call, under
            -- the benchmark's load).
            SELECT a.location_id, a.quantity FROM allocations a WHERE a.reservation_id = r.id OFFSET 0
         ) a
         WHERE r.inventory_id = ANY($1) AND r.status IN {holding}
      ) held
     GROUP BY inventory_id, location_id
  ) h ON h.inventory_id = l.inventory_id AND h.location_id = l.location_id
 WHERE l.inventory_id = ANY($1)
 ORDER BY l.inventory_id, loc.priority, loc.code"#,
        reserved = fragments::units(ReservationStatus::Active),
        committed = fragments::units(ReservationStatus::Ordered),
        holding = fragments::holding(),
    )
});

/// The levels of these inventories with what is held at each, by priority
/// then code, in one statement (one snapshot). Only holding reservations
/// are joined (`reservations_held`: the statuses are written into the text,
/// so even a generic plan sees the index's condition), however many
/// released and expired ones an inventory has had. Levels are never
/// removed, so every location that ever held an inventory has one.
pub async fn levels(db: &impl ConnectionTrait, inventory_ids: &[Uuid]) -> Result<Vec<LevelState>, DbErr> {
    let statement =
        Statement::from_sql_and_values(DbBackend::Postgres, LEVELS_SQL.as_str(), [Value::from(inventory_ids.to_vec())]);
    LevelState::find_by_statement(statement).all(db).await
}

/// The allocations of these reservations, each reservation's by its
/// locations' priority then code.
pub(crate) async fn allocations(
    db: &impl ConnectionTrait,
    reservation_ids: &[Uuid],
) -> Result<Vec<AllocationRow>, DbErr> {
    let statement = Statement::from_sql_and_values(
        DbBackend::Postgres,
        "SELECT a.reservation_id, a.location_id, a.quantity
           FROM allocations a JOIN locations l ON l.id = a.location_id
          WHERE a.reservation_id = ANY($1)
          ORDER BY a.reservation_id, l.priority, l.code",
        [Value::from(reservation_ids.to_vec())],
    );
    AllocationRow::find_by_statement(statement).all(db).await
}

/// What a transfer left: the inventory, and the available units of its
/// source and target levels.
#[derive(Debug, Clone)]
pub(crate) struct Moved {
    /// The inventory as the statement left it.
    pub inventory: InventoryRow,
    /// The source level's available units after it.
    pub from_available: i32,
    /// The target level's available units after it.
    pub to_available: i32,
}

/// A transfer as the service asks for it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Transfer<'a> {
    /// The inventory.
    pub inventory_id: Uuid,
    /// The source location.
    pub from: Uuid,
    /// The target location.
    pub to: Uuid,
    /// Units, 1 or more.
    pub quantity: i32,
    /// The inventory's version the operator saw, if given.
    pub expected_version: Option<i32>,
    /// The caller, whose key space the key is in.
    pub user_id: &'a str,
    /// The idempotency key and the request's fingerprint, if given.
    pub key: Option<(&'a str, &'a str)>,
}

/// Runs a transfer (`stock::moving::transfer`), re-run on collisions; what
/// it left when it moved stock.
pub(crate) async fn transfer(
    db: &DatabaseConnection,
    collisions: &Collisions,
    t: Transfer<'_>,
) -> Result<Attempted<Option<Moved>>, DbErr> {
    let run = || async {
        let statement =
            moving::transfer(t.inventory_id, t.from, t.to, t.quantity, t.expected_version, t.user_id, t.key);
        let Some(row) = db.query_one_raw(statement).await? else { return Ok(None) };
        Ok(Some(Moved {
            inventory: InventoryRow::from_query_result(&row, "")?,
            from_available: row.try_get("", "from_available")?,
            to_available: row.try_get("", "to_available")?,
        }))
    };
    collisions.run(t.inventory_id, run).await
}
