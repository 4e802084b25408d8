//! The one place orders are read and written. `save` is the only way to
//! change an order, and it always checks the version it was read at, so no
//! caller can forget the check.

use std::time::Duration;

use sea_orm::{
    ActiveModelTrait, ActiveValue::Set, ColumnTrait, ConnectionTrait, DatabaseConnection, DatabaseTransaction,
    DbBackend, DbErr, EntityTrait, FromQueryResult, QueryFilter, Statement,
};
use uuid::Uuid;

use super::{
    domain::Order,
    entity::{ActiveModel, Column, Entity, Model, OrderStatus},
};
use crate::{
    pagination::{self, Page},
    reservations::{ReservationRow, entity as reservations},
    stock::returning,
};

/// A row that cannot be an order is a broken database, never the client's fault.
fn to_order(row: Model) -> Result<Order, DbErr> {
    Order::reconstitute(row).map_err(|err| DbErr::Custom(err.to_string()))
}

/// The latest committed order.
pub async fn find(db: &impl ConnectionTrait, id: Uuid) -> Result<Option<Order>, DbErr> {
    Entity::find_by_id(id).one(db).await?.map(to_order).transpose()
}

/// The orders with these ids (missing ones are left out).
pub async fn find_many(db: &impl ConnectionTrait, ids: &[Uuid]) -> Result<Vec<Order>, DbErr> {
    Entity::find().filter(Column::Id.is_in(ids.iter().copied())).all(db).await?.into_iter().map(to_order).collect()
}

/// The order, locked for the rest of `txn`.
///
/// This locks the row for the duration of the transaction so that a
/// concurrent confirm or cancel waits here instead of racing to `save`; the
/// wait is bounded by `lock_timeout` (SQLSTATE 55P03 when it runs out).
pub async fn find_for_update(
    txn: &DatabaseTransaction,
    id: Uuid,
    lock_timeout: Duration,
) -> Result<Option<Order>, DbErr> {
    // SET cannot take bind parameters; these are integers from the configuration.
    let ms = lock_timeout.as_millis();
    txn.execute_unprepared(&format!("SET LOCAL lock_timeout = '{ms}ms'; SET LOCAL statement_timeout = '{}ms'", ms * 2))
        .await?;
    let row = Model::find_by_statement(Statement::from_sql_and_values(
        DbBackend::Postgres,
        "SELECT * FROM orders WHERE id = $1 FOR UPDATE",
        [id.into()],
    ))
    .one(txn)
    .await?;
    row.map(to_order).transpose()
}

/// Writes a newly placed order.
pub async fn insert(txn: &DatabaseTransaction, order: &Order) -> Result<(), DbErr> {
    let address = order.address();
    ActiveModel {
        id: Set(order.id),
        user_id: Set(order.user_id.clone()),
        status: Set(order.status()),
        ship_name: Set(address.name.clone()),
        ship_line1: Set(address.line1.clone()),
        ship_line2: Set(address.line2.clone()),
        ship_city: Set(address.city.clone()),
        ship_postal_code: Set(address.postal_code.clone()),
        ship_country: Set(address.country.clone()),
        confirmed_at: Set(None),
        confirmed_by: Set(None),
        version: Set(order.version),
        created_at: Set(order.created_at),
    }
    .insert(txn)
    .await?;
    Ok(())
}

/// Saves `order` if the row is still at `seen`, the version it was read at.
/// Returns whether it was saved; `false` means modified concurrently.
pub async fn save(db: &impl ConnectionTrait, order: &Order, seen: i32) -> Result<bool, DbErr> {
    // The version condition is the whole point: 0 rows means someone saved
    // after we read, and their change must not be overwritten.
    const SQL: &str = r#"
UPDATE orders
   SET status = $3, ship_name = $4, ship_line1 = $5, ship_line2 = $6, ship_city = $7,
       ship_postal_code = $8, ship_country = $9, confirmed_at = $10, confirmed_by = $11,
       version = version + 1
 WHERE id = $1 AND version = $2"#;
    let address = order.address();
    let confirmation = order.confirmation();
    let status = match order.status() {
        OrderStatus::Pending => "PENDING",
        OrderStatus::Confirmed => "CONFIRMED",
        OrderStatus::Cancelled => "CANCELLED",
    };
    let result = db
        .execute_raw(Statement::from_sql_and_values(
            DbBackend::Postgres,
            SQL,
            [
                order.id.into(),
                seen.into(),
                status.into(),
                address.name.clone().into(),
                address.line1.clone().into(),
                address.line2.clone().into(),
                address.city.clone().into(),
                address.postal_code.clone().into(),
                address.country.clone().into(),
                confirmation.map(|c| c.at).into(),
                confirmation.map(|c| c.by.clone()).into(),
            ],
        ))
        .await?;
    Ok(result.rows_affected() == 1)
}

/// Gives back the stock of a cancelled order's lines, in `txn`: the lines
/// turn RELEASED and each inventory and the ledger change in one statement,
/// after its inventories are locked in id order (see `stock::returning`).
pub async fn return_stock(txn: &DatabaseTransaction, order_id: Uuid) -> Result<(), DbErr> {
    txn.execute_raw(returning::lock_order(order_id)).await?;
    txn.execute_raw(returning::cancel_order(order_id)).await?;
    Ok(())
}

/// One page of orders in `(created_at, id)` order, with one extra row when
/// more follow; only `user_id`'s when given, only `status` when given.
pub async fn page(
    db: &DatabaseConnection,
    user_id: Option<&str>,
    status: Option<OrderStatus>,
    page: Page,
) -> Result<Vec<Order>, DbErr> {
    let mut query = Entity::find();
    if let Some(user_id) = user_id {
        query = query.filter(Column::UserId.eq(user_id));
    }
    if let Some(status) = status {
        query = query.filter(Column::Status.eq(status));
    }
    let rows = pagination::keyset(query, Column::CreatedAt, Column::Id, page).all(db).await?;
    rows.into_iter().map(to_order).collect()
}

/// The lines (reservations) of these orders.
pub async fn lines(db: &DatabaseConnection, order_ids: &[Uuid]) -> Result<Vec<ReservationRow>, DbErr> {
    reservations::Entity::find().filter(reservations::Column::OrderId.is_in(order_ids.iter().copied())).all(db).await
}
