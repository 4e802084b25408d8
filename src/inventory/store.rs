//! SQL for inventories. Every change of a row writes its stock-ledger entry in
//! the same statement, so the ledger can never disagree with the row.

use sea_orm::{
    ColumnTrait, ConnectionTrait, DatabaseConnection, DbBackend, DbErr, EntityTrait, FromQueryResult, QueryFilter,
    Statement,
};
use uuid::Uuid;

use super::entity::{Column, Entity, Model};
use crate::{
    db::{Attempted, Collisions, DbFailure, classify},
    error::AppError,
    pagination::{self, Page},
};

/// One inventory by id.
pub async fn find(db: &impl ConnectionTrait, id: Uuid) -> Result<Option<Model>, DbErr> {
    Entity::find_by_id(id).one(db).await
}

/// The inventories with these ids (missing ones are left out).
pub async fn find_many(db: &impl ConnectionTrait, ids: impl IntoIterator<Item = Uuid>) -> Result<Vec<Model>, DbErr> {
    Entity::find().filter(Column::Id.is_in(ids)).all(db).await
}

/// The inventories with these SKUs (missing ones are left out).
pub async fn find_by_skus(db: &DatabaseConnection, skus: &[String]) -> Result<Vec<Model>, DbErr> {
    Entity::find().filter(Column::Sku.is_in(skus.iter().cloned())).all(db).await
}

/// One page in `(created_at, id)` order, with one extra row when more follow.
pub async fn page(db: &DatabaseConnection, page: Page) -> Result<Vec<Model>, DbErr> {
    pagination::keyset(Entity::find(), Column::CreatedAt, Column::Id, page).all(db).await
}

/// A new inventory with its `CREATED` ledger entry, in one statement.
/// A taken SKU is bad input.
pub async fn create(db: &DatabaseConnection, sku: &str, name: &str, stock: i32) -> Result<Model, AppError> {
    const SQL: &str = r#"
WITH created AS (
    INSERT INTO inventories (id, sku, name, stock, version)
    VALUES ($1, $2, $3, $4, 1)
    RETURNING id, sku, name, stock, version, created_at, updated_at
), movement AS (
    INSERT INTO stock_movements (inventory_id, delta, reason, stock_after, version_after)
    SELECT id, stock, 'CREATED', stock, version FROM created
)
SELECT * FROM created"#;
    let stmt = Statement::from_sql_and_values(
        DbBackend::Postgres,
        SQL,
        [Uuid::new_v4().into(), sku.into(), name.into(), stock.into()],
    );
    match db.query_one_raw(stmt).await {
        Ok(Some(row)) => Ok(Model::from_query_result(&row, "")?),
        Ok(None) => Err(AppError::Internal),
        Err(err) if matches!(classify(&err), DbFailure::UniqueViolation(_)) => {
            Err(AppError::bad_input("input.sku", format!("an inventory with sku {sku:?} already exists")))
        }
        Err(err) => Err(err.into()),
    }
}

/// How a restock ended.
#[derive(Debug)]
pub enum RestockOutcome {
    /// Stock was added; the row as the statement left it.
    Restocked(Model),
    /// `expectedVersion` was stale (or collisions ran out); the latest row.
    Conflict {
        /// The version the client sent (or, without one, the version last seen).
        expected_version: i32,
        /// The latest committed row.
        inventory: Model,
    },
    /// No inventory has that id.
    NotFound,
}

/// Adds `quantity` units, optionally only if the row is still at `expected_version`.
pub async fn restock(
    db: &DatabaseConnection,
    collisions: &Collisions,
    id: Uuid,
    quantity: i32,
    expected_version: Option<i32>,
) -> Result<RestockOutcome, AppError> {
    // A conditional UPDATE: the version check (when given) is in the WHERE, so
    // two operators restocking from the same screen cannot both succeed; 0 rows
    // means "not found or version moved", told apart by one read below.
    const SQL: &str = r#"
WITH restocked AS (
    UPDATE inventories
       SET stock = stock + $2, version = version + 1, updated_at = now()
     WHERE id = $1 AND ($3::integer IS NULL OR version = $3)
 RETURNING id, sku, name, stock, version, created_at, updated_at
), movement AS (
    INSERT INTO stock_movements (inventory_id, delta, reason, stock_after, version_after)
    SELECT id, $2, 'RESTOCKED', stock, version FROM restocked
)
SELECT * FROM restocked"#;
    let run = || {
        db.query_one_raw(Statement::from_sql_and_values(
            DbBackend::Postgres,
            SQL,
            [id.into(), quantity.into(), expected_version.into()],
        ))
    };
    let row = match collisions.run(id, run).await {
        Ok(Attempted::Done(row)) => row,
        Ok(Attempted::Exhausted { .. }) => None,
        Err(err) if classify(&err) == DbFailure::OutOfRange => {
            return Err(AppError::bad_input("input.quantity", "stock would exceed the largest storable amount"));
        }
        Err(err) => return Err(err.into()),
    };
    if let Some(row) = row {
        return Ok(RestockOutcome::Restocked(Model::from_query_result(&row, "")?));
    }
    Ok(match find(db, id).await? {
        None => RestockOutcome::NotFound,
        Some(inventory) => {
            RestockOutcome::Conflict { expected_version: expected_version.unwrap_or(inventory.version), inventory }
        }
    })
}
