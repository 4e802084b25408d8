//! SQL for adjustments and safety stock: running their statements
//! (`stock::correcting`) and reading what they left. `service.rs` decides
//! what a result means.

use sea_orm::{ConnectionTrait, DatabaseConnection, DbErr, FromQueryResult, QueryResult};
use uuid::Uuid;

use crate::{
    db::{Attempted, Collisions},
    locations::store::LevelState,
    stock::{
        correcting::{self, Adjustment},
        fragments,
        rows::InventoryRow,
    },
};

/// How an adjustment's statement judged it, from its own row.
#[derive(Debug)]
pub(crate) struct Judged {
    /// The inventory exists.
    pub found: bool,
    /// The location exists.
    pub located: bool,
    /// The inventory is at the expected version (or none was given).
    pub current: bool,
    /// The change was written.
    pub applied: bool,
    /// The change judged: the delta given, or the count less what was on hand.
    pub delta: i32,
    /// The inventory as the statement left it (as locked when nothing was applied).
    pub inventory: Option<InventoryRow>,
    /// The level as the statement left it (nothing there: an empty level).
    pub level: Option<Level>,
}

impl Judged {
    fn from_row(row: &QueryResult) -> Result<Self, DbErr> {
        let found: bool = row.try_get("", "found")?;
        Ok(Self {
            found,
            located: row.try_get("", "located")?,
            current: row.try_get("", "current")?,
            applied: row.try_get("", "applied")?,
            delta: row.try_get("", "delta")?,
            inventory: found.then(|| InventoryRow::from_query_result(row, "")).transpose()?,
            level: level(row)?,
        })
    }
}

/// A level as a statement of `stock::correcting` left it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Level {
    /// The location.
    pub location_id: Uuid,
    /// Its available units.
    pub available: i64,
    /// Its safety stock.
    pub safety_stock: i32,
    /// Its reserved and committed units, when the statement read them (a count).
    pub held: Option<(i64, i64)>,
}

impl Level {
    /// This level of `inventory_id`, with the reserved and committed units
    /// the statement read, or else `held`.
    pub(crate) fn state(self, inventory_id: Uuid, held: (i64, i64)) -> LevelState {
        let (reserved, committed) = self.held.unwrap_or(held);
        let Self { location_id, available, safety_stock, .. } = self;
        LevelState { inventory_id, location_id, available, reserved, committed, safety_stock }
    }
}

/// The level a statement of `stock::correcting` returns (`l_*`), if it judged one.
fn level(row: &QueryResult) -> Result<Option<Level>, DbErr> {
    let (Some(location_id), Some(available)) =
        (row.try_get::<Option<Uuid>>("", "l_location_id")?, row.try_get::<Option<i64>>("", "l_available")?)
    else {
        return Ok(None);
    };
    let held = |column: &str| row.try_get::<Option<i64>>("", column);
    Ok(Some(Level {
        location_id,
        available,
        safety_stock: row.try_get("", "l_safety_stock")?,
        held: held("l_reserved")?.zip(held("l_committed")?),
    }))
}

/// Runs an adjustment (see `stock::correcting::adjust`), re-run on collisions.
pub(crate) async fn adjust(
    db: &DatabaseConnection,
    collisions: &Collisions,
    adjustment: Adjustment<'_>,
) -> Result<Attempted<Judged>, DbErr> {
    let run = || async {
        let row = db.query_one_raw(correcting::adjust(adjustment)).await?;
        Judged::from_row(&row.ok_or_else(|| DbErr::Custom("an adjustment returned no row".into()))?)
    };
    collisions.run(adjustment.inventory_id, run).await
}

/// Runs a change of safety stock (see `stock::correcting::set_safety_stock`),
/// re-run on collisions: the level as left (without what is held there),
/// none when the inventory or the location does not exist.
pub(crate) async fn set_safety_stock(
    db: &DatabaseConnection,
    collisions: &Collisions,
    inventory_id: Uuid,
    location_id: Option<Uuid>,
    quantity: i32,
) -> Result<Attempted<Option<Level>>, DbErr> {
    let run = || async {
        let statement = correcting::set_safety_stock(inventory_id, location_id, quantity);
        let row = db.query_one_raw(statement).await?;
        let row = row.ok_or_else(|| DbErr::Custom("a change of safety stock returned no row".into()))?;
        if !(row.try_get::<bool>("", "found")? && row.try_get::<bool>("", "located")?) {
            return Ok(None);
        }
        level(&row)
    };
    collisions.run(inventory_id, run).await
}

/// What reservations hold of `inventory_id` at `location_id`: reserved and
/// committed units, 0 each where it has no level.
pub(crate) async fn held(
    db: &impl ConnectionTrait,
    inventory_id: Uuid,
    location_id: Uuid,
) -> Result<(i64, i64), DbErr> {
    let levels = crate::locations::store::levels(db, &[inventory_id]).await?;
    let level = levels.into_iter().find(|level| level.location_id == location_id);
    Ok(level.map_or((0, 0), |level| (level.reserved, level.committed)))
}

/// The id of the location `location_id` names, or of the default location
/// when none; none when it names no location.
pub(crate) async fn location(db: &impl ConnectionTrait, location_id: Option<Uuid>) -> Result<Option<Uuid>, DbErr> {
    let sql = fragments::location_or_default("$1");
    let statement = sea_orm::Statement::from_sql_and_values(sea_orm::DbBackend::Postgres, sql, [location_id.into()]);
    db.query_one_raw(statement).await?.map(|row| row.try_get("", "id")).transpose()
}
