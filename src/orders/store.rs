//! The one place orders are read and written. `save` is the only way to
//! change an order, and it always checks the version it was read at, so no
//! caller can forget the check.

use std::{
    sync::{Arc, LazyLock},
    time::Duration,
};

use sea_orm::{
    ActiveEnum, ActiveModelTrait, ActiveValue::Set, ColumnTrait, ConnectionTrait, DatabaseConnection,
    DatabaseTransaction, DbBackend, DbErr, EntityTrait, FromQueryResult, QueryFilter, Statement, Value,
};
use uuid::Uuid;

use super::{
    domain::Order,
    entity::{ActiveModel, Column, Entity, Model, OrderStatus},
    service::Cart,
};
use crate::{
    idempotency::Key,
    live,
    pagination::{self, Page},
    stock::{
        self, fragments, returning,
        rows::{ReservationRow, ReservationStatus, reservation as reservations, sql},
        shipping,
    },
};

/// A row that cannot be an order is a broken database, never the client's fault.
fn to_order(row: Model) -> Result<Order, DbErr> {
    Order::reconstitute(row).map_err(|err| DbErr::Custom(err.to_string()))
}

/// The latest committed order.
pub(crate) async fn find(db: &impl ConnectionTrait, id: Uuid) -> Result<Option<Order>, DbErr> {
    Entity::find_by_id(id).one(db).await?.map(to_order).transpose()
}

/// The orders with these ids (missing ones are left out).
pub(crate) async fn find_many(db: &impl ConnectionTrait, ids: &[Uuid]) -> Result<Vec<Order>, DbErr> {
    Entity::find().filter(Column::Id.is_in(ids.iter().copied())).all(db).await?.into_iter().map(to_order).collect()
}

/// The order, locked for the rest of `txn`.
///
/// This locks the row for the duration of the transaction so that a
/// concurrent confirm or cancel waits here instead of racing to `save`; the
/// wait is bounded by `lock_timeout` (SQLSTATE 55P03 when it runs out).
pub(crate) async fn find_for_update(
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
pub(crate) async fn insert(txn: &DatabaseTransaction, order: &Order) -> Result<(), DbErr> {
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
        fulfilled_at: Set(None),
        fulfilled_by: Set(None),
    }
    .insert(txn)
    .await?;
    Ok(())
}

/// Saves `order` if the row is still at `seen`, the version it was read at.
/// Returns whether it was saved; `false` means modified concurrently.
pub(crate) async fn save(db: &impl ConnectionTrait, order: &Order, seen: i32) -> Result<bool, DbErr> {
    // The version condition is the whole point: 0 rows means someone saved
    // after we read, and their change must not be overwritten.
    const SQL: &str = r#"
UPDATE orders
   SET status = $3, ship_name = $4, ship_line1 = $5, ship_line2 = $6, ship_city = $7,
       ship_postal_code = $8, ship_country = $9, confirmed_at = $10, confirmed_by = $11,
       fulfilled_at = $12, fulfilled_by = $13, version = version + 1
 WHERE id = $1 AND version = $2"#;
    let address = order.address();
    let (confirmation, fulfilment) = (order.confirmation(), order.fulfilment());
    let result = db
        .execute_raw(Statement::from_sql_and_values(
            DbBackend::Postgres,
            SQL,
            [
                order.id.into(),
                seen.into(),
                order.status().to_value().into(),
                address.name.clone().into(),
                address.line1.clone().into(),
                address.line2.clone().into(),
                address.city.clone().into(),
                address.postal_code.clone().into(),
                address.country.clone().into(),
                confirmation.map(|c| c.at).into(),
                confirmation.map(|c| c.by.clone()).into(),
                fulfilment.map(|f| f.at).into(),
                fulfilment.map(|f| f.by.clone()).into(),
            ],
        ))
        .await?;
    Ok(result.rows_affected() == 1)
}

/// Gives back the stock of a cancelled order's lines, in `txn`: the lines
/// turn RELEASED and each inventory and the ledger change in one statement,
/// after its inventories are locked in id order (see `stock::returning`).
pub(crate) async fn return_stock(txn: &DatabaseTransaction, order_id: Uuid) -> Result<(), DbErr> {
    move_lines(txn, order_id, returning::cancel_order(order_id)).await
}

/// Ships a fulfilled order's lines, in `txn`: they turn FULFILLED and each
/// inventory and the ledger change in one statement, after its inventories
/// are locked in id order (see `stock::shipping`).
pub(crate) async fn ship(txn: &DatabaseTransaction, order_id: Uuid) -> Result<(), DbErr> {
    move_lines(txn, order_id, shipping::fulfil_order(order_id)).await
}

/// Runs `statement`, which moves the order's lines, after locking their
/// inventories in id order (`stock::lock_order`).
async fn move_lines(txn: &DatabaseTransaction, order_id: Uuid, statement: Statement) -> Result<(), DbErr> {
    txn.execute_raw(stock::lock_order(order_id)).await?;
    txn.execute_raw(statement).await?;
    Ok(())
}

/// Checks out the caller's `cart` (its reservations and its kit
/// reservations, each list sorted, without repeats) into the new PENDING
/// `order`, in one statement: the order row, every reservation and every
/// component of every kit reservation turned ORDERED with the order's id
/// and no expiry, and the claim of the idempotency key, all or nothing. No
/// stock moves: the units were taken when the reservations were made.
/// Returns the order's lines, or none when nothing was written.
///
/// The kit reservations' rows are locked first, in id order, as every
/// statement that changes a kit's components does (`stock::kitting`): a
/// kit is ordered whole or not at all, and only while every component is
/// ACTIVE. A kit's component named alone never counts (it is checked out
/// with its kit).
///
/// This locks the listed reservations in id order for the statement
/// (`lines`), so two checkouts of overlapping carts queue instead of
/// deadlocking. Only rows that are the caller's, ACTIVE and unexpired lock
/// and count, and a row a concurrent writer changed is judged again as it
/// committed: a release, an expiry by the sweeper (which skips rows locked
/// here, so a line is never both ordered and expired), or another checkout
/// that won leaves it out, an extension keeps it in. The order is inserted
/// only when every listed row counted; 0 rows means some line was
/// unavailable, and one read afterwards tells which and why.
pub(crate) async fn checkout(
    db: &DatabaseConnection,
    order: &Order,
    cart: &Cart,
    key: Option<&Key>,
) -> Result<Vec<ReservationRow>, DbErr> {
    static SQL: LazyLock<String> = LazyLock::new(|| {
        format!(
            r#"
WITH kit AS MATERIALIZED (
    SELECT id FROM kit_reservations WHERE id = ANY($14) AND user_id = $2 ORDER BY id FOR UPDATE
), lines AS (
    SELECT id FROM reservations
     WHERE ((id = ANY($1) AND kit_reservation_id IS NULL) OR kit_reservation_id IN (SELECT id FROM kit))
       AND user_id = $2 AND {active_unexpired}
     ORDER BY id
       FOR UPDATE
), placed AS (
    INSERT INTO orders (id, user_id, status, ship_name, ship_line1, ship_line2, ship_city, ship_postal_code,
                        ship_country, version, created_at)
    SELECT $3, $2, {pending}, $4, $5, $6, $7, $8, $9, $10, $11
     WHERE (SELECT count(*) FROM lines)
           = cardinality($1::uuid[])
             + (SELECT count(*) FROM reservations WHERE kit_reservation_id IN (SELECT id FROM kit))
       AND (SELECT count(*) FROM kit) = cardinality($14::uuid[])
 RETURNING id
), ordered AS (
    UPDATE reservations r SET status = {ordered}, order_id = p.id, expires_at = NULL
      FROM placed p, lines l
     WHERE r.id = l.id
 RETURNING r.*
), claimed AS (
    INSERT INTO idempotency_keys (user_id, idempotency_key, request_fingerprint, order_id)
    SELECT $2, $12, $13, id FROM placed WHERE $12::text IS NOT NULL
)
SELECT * FROM ordered ORDER BY id"#,
            active_unexpired = fragments::active_unexpired(),
            pending = sql(OrderStatus::Pending),
            ordered = sql(ReservationStatus::Ordered),
        )
    });
    let address = order.address();
    let values: Vec<Value> = vec![
        Value::from(cart.reservation_ids.clone()),
        order.user_id.as_str().into(),
        order.id.into(),
        address.name.as_str().into(),
        address.line1.as_str().into(),
        address.line2.clone().into(),
        address.city.as_str().into(),
        address.postal_code.as_str().into(),
        address.country.as_str().into(),
        order.version.into(),
        order.created_at.into(),
        key.map(|k| k.key.clone()).into(),
        key.map(|k| k.fingerprint.clone()).into(),
        Value::from(cart.kit_reservation_ids.clone()),
    ];
    let statement = Statement::from_sql_and_values(DbBackend::Postgres, SQL.as_str(), values);
    ReservationRow::find_by_statement(statement).all(db).await
}

/// One page of orders in `(created_at, id)` order, with one extra row when
/// more follow; only `user_id`'s when given, only `status` when given.
pub(crate) async fn page(
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
pub(crate) async fn lines(db: &impl ConnectionTrait, order_ids: &[Uuid]) -> Result<Vec<ReservationRow>, DbErr> {
    reservations::Entity::find().filter(reservations::Column::OrderId.is_in(order_ids.iter().copied())).all(db).await
}

impl live::Followed for Order {
    fn id(&self) -> Uuid {
        self.id
    }

    fn version(&self) -> i32 {
        self.version
    }

    fn is_final(&self) -> bool {
        matches!(self.status(), OrderStatus::Cancelled | OrderStatus::Fulfilled)
    }
}

/// The orders as the live feed follows them: the trigger announces a
/// changed row as JSON on `order_changed` (see the migrations); a row that
/// breaks the order rules is not announced to anyone.
pub(crate) fn live_source() -> live::Source<Order> {
    live::Source {
        watchers: "order_watchers",
        key: "order_id",
        rows: "order_changed",
        ids: None,
        parse: |payload| {
            let row: Model = serde_json::from_str(payload).map_err(|err| err.to_string())?;
            Order::reconstitute(row).map_err(|err| format!("an announced order breaks the order rules: {err}"))
        },
        read: Arc::new(|db, ids| Box::pin(async move { find_many(&db, &ids).await })),
    }
}
