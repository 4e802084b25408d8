//! SQL for kits: making a kit with its components in one statement,
//! renaming or deactivating it, reading kits, their components and what
//! they offer, and running the kit reservation statements of
//! `stock::kitting` (re-run on collisions). `service.rs` decides what a
//! result means.

use std::{collections::HashMap, sync::LazyLock};

use sea_orm::{
    ActiveModelTrait, ActiveValue::Set, ColumnTrait, ConnectionTrait, DatabaseConnection, DbBackend, DbErr,
    EntityTrait, FromQueryResult, IntoActiveModel, QueryFilter, QueryOrder, QueryResult, Statement, Value,
};
use uuid::Uuid;

use super::rows::{ComponentRow, KitReservationRow, KitRow, component, kit, kit_reservation};
use crate::{
    db::{Attempted, Collisions},
    pagination::{self, Page},
    stock::{
        allocating::{eligible, offered},
        kitting::{self, KitReserve},
        lines::LockedLine,
        rows::{ReservationRow, reservation},
    },
};

/// Makes a kit and its (flattened) components in one statement: both or
/// neither. A duplicate sku fails on `kits_sku_key`, an unknown inventory
/// on the components' foreign key.
pub(crate) async fn create(
    db: &DatabaseConnection,
    id: Uuid,
    sku: &str,
    name: &str,
    components: &[(Uuid, i32)],
) -> Result<KitRow, DbErr> {
    const SQL: &str = r#"
WITH kit AS (
    INSERT INTO kits (id, sku, name) VALUES ($1, $2, $3) RETURNING *
), component AS (
    INSERT INTO kit_components (kit_id, inventory_id, quantity)
    SELECT kit.id, c.inventory_id, c.quantity FROM kit, unnest($4::uuid[], $5::integer[]) AS c(inventory_id, quantity)
)
SELECT * FROM kit"#;
    let values: Vec<Value> = vec![
        id.into(),
        sku.into(),
        name.into(),
        Value::from(components.iter().map(|c| c.0).collect::<Vec<Uuid>>()),
        Value::from(components.iter().map(|c| c.1).collect::<Vec<i32>>()),
    ];
    let statement = Statement::from_sql_and_values(DbBackend::Postgres, SQL, values);
    KitRow::find_by_statement(statement)
        .one(db)
        .await?
        .ok_or_else(|| DbErr::Custom("making a kit returned no row".into()))
}

/// Renames or (de)activates a kit; the kit as saved, none when unknown.
pub(crate) async fn update(
    db: &DatabaseConnection,
    id: Uuid,
    name: Option<String>,
    active: Option<bool>,
) -> Result<Option<KitRow>, DbErr> {
    let Some(found) = kit::Entity::find_by_id(id).one(db).await? else { return Ok(None) };
    let mut row = found.into_active_model();
    if let Some(name) = name {
        row.name = Set(name);
    }
    if let Some(active) = active {
        row.active = Set(active);
    }
    Ok(Some(row.update(db).await?))
}

/// The kits with these ids (missing ones are left out).
pub(crate) async fn find_many(db: &impl ConnectionTrait, ids: &[Uuid]) -> Result<Vec<KitRow>, DbErr> {
    kit::Entity::find().filter(kit::Column::Id.is_in(ids.iter().copied())).all(db).await
}

/// The kits with these skus (missing ones are left out).
pub(crate) async fn find_by_skus(db: &impl ConnectionTrait, skus: &[String]) -> Result<Vec<KitRow>, DbErr> {
    kit::Entity::find().filter(kit::Column::Sku.is_in(skus.iter().cloned())).all(db).await
}

/// One page of kits in `(created_at, id)` order, with one extra row when more follow.
pub(crate) async fn page(db: &DatabaseConnection, page: Page) -> Result<Vec<KitRow>, DbErr> {
    pagination::keyset(kit::Entity::find(), kit::Column::CreatedAt, kit::Column::Id, page).all(db).await
}

/// The components of these kits, each kit's by inventory id.
pub(crate) async fn components(db: &impl ConnectionTrait, kit_ids: &[Uuid]) -> Result<Vec<ComponentRow>, DbErr> {
    component::Entity::find()
        .filter(component::Column::KitId.is_in(kit_ids.iter().copied()))
        .order_by_asc(component::Column::KitId)
        .order_by_asc(component::Column::InventoryId)
        .all(db)
        .await
}

/// What each of these kits offers a customer now, read in one statement
/// (one snapshot): min over its components of ⌊sellable ÷ quantity⌋, the
/// sellable units ([`offered`]) of every active location summed, as
/// `reserveKit` with the default choice takes them; 0 for an inactive kit,
/// which cannot be reserved. Kits without a row here do not exist.
pub(crate) async fn available(db: &impl ConnectionTrait, kit_ids: &[Uuid]) -> Result<HashMap<Uuid, i32>, DbErr> {
    static SQL: LazyLock<String> = LazyLock::new(|| {
        format!(
            r#"
SELECT k.kit_id, CASE WHEN bool_and(t.active) THEN min(coalesce(s.sellable, 0) / k.quantity) ELSE 0 END::integer
           AS available
  FROM kit_components k
  JOIN kits t ON t.id = k.kit_id
  LEFT JOIN (SELECT l.inventory_id, sum({offered}) AS sellable
               FROM stock_levels l JOIN locations c ON c.id = l.location_id
              WHERE l.inventory_id IN (SELECT inventory_id FROM kit_components WHERE kit_id = ANY($1))
                AND {eligible}
              GROUP BY l.inventory_id) s ON s.inventory_id = k.inventory_id
 WHERE k.kit_id = ANY($1)
 GROUP BY k.kit_id"#,
            offered = offered("l.", None),
            eligible = eligible("NULL::uuid[]"),
        )
    });
    let statement = Statement::from_sql_and_values(DbBackend::Postgres, SQL.as_str(), [Value::from(kit_ids.to_vec())]);
    let rows = db.query_all_raw(statement).await?;
    rows.iter().map(|row| Ok((row.try_get("", "kit_id")?, row.try_get("", "available")?))).collect()
}

/// The kit reservations with these ids (missing ones are left out).
pub(crate) async fn kit_reservations(db: &impl ConnectionTrait, ids: &[Uuid]) -> Result<Vec<KitReservationRow>, DbErr> {
    kit_reservation::Entity::find().filter(kit_reservation::Column::Id.is_in(ids.iter().copied())).all(db).await
}

/// The component reservations of these kit reservations, by inventory id.
pub(crate) async fn parts(
    db: &impl ConnectionTrait,
    kit_reservation_ids: &[Uuid],
) -> Result<Vec<ReservationRow>, DbErr> {
    reservation::Entity::find()
        .filter(reservation::Column::KitReservationId.is_in(kit_reservation_ids.iter().copied()))
        .order_by_asc(reservation::Column::InventoryId)
        .all(db)
        .await
}

/// What [`kitting::reserve_kit`] said of one component.
#[derive(Debug)]
pub(crate) struct Taken {
    /// Its inventory as locked, and whether its locations could give it.
    pub line: LockedLine,
    /// The reservation written, when the kit was taken.
    pub reservation: Option<ReservationRow>,
}

impl Taken {
    fn from_row(row: &QueryResult) -> Result<Self, DbErr> {
        let written = row.try_get::<Option<Uuid>>("", "r_id")?.is_some();
        let reservation = written.then(|| ReservationRow::from_query_result(row, "r_")).transpose()?;
        Ok(Self { line: LockedLine::from_row(row)?, reservation })
    }
}

/// Runs the kit reservation statement, re-run on collisions: one row per component.
pub(crate) async fn reserve(
    db: &DatabaseConnection,
    collisions: &Collisions,
    request: KitReserve<'_>,
) -> Result<Attempted<Vec<Taken>>, DbErr> {
    let run = || async { db.query_all_raw(kitting::reserve_kit(request)).await?.iter().map(Taken::from_row).collect() };
    collisions.run(request.lines[0].inventory_id, run).await
}

/// Runs the release of a kit reservation of `owner`'s, re-run on
/// collisions: how many components it released (0: nothing matched).
pub(crate) async fn release(
    db: &DatabaseConnection,
    collisions: &Collisions,
    id: Uuid,
    owner: &str,
) -> Result<Attempted<i64>, DbErr> {
    let run = || async {
        let row = db.query_one_raw(kitting::release_kit(id, owner)).await?;
        row.map_or(Ok(0), |row| row.try_get_by_index::<i64>(0))
    };
    collisions.run(id, run).await
}

/// Runs the extension of a kit reservation of `owner`'s, re-run on
/// collisions: its components as saved (none: nothing matched).
pub(crate) async fn extend(
    db: &DatabaseConnection,
    collisions: &Collisions,
    id: Uuid,
    owner: &str,
    seconds: i32,
    max_ttl_secs: i32,
) -> Result<Attempted<Vec<ReservationRow>>, DbErr> {
    let run = || ReservationRow::find_by_statement(kitting::extend_kit(id, owner, seconds, max_ttl_secs)).all(db);
    collisions.run(id, run).await
}
