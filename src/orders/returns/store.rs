//! SQL for returns: running the return statement (`stock::taking_back`)
//! and reading returns with their lines. `service.rs` decides what a
//! result means.

use std::collections::HashMap;

use sea_orm::{ConnectionTrait, DatabaseConnection, DbBackend, DbErr, FromQueryResult, Statement, Value};
use uuid::Uuid;

use crate::{
    db::{Attempted, Collisions},
    orders::entity::OrderStatus,
    stock::{
        rows::{ReturnLineRow, ReturnRow},
        taking_back::{self, OrderReturn},
    },
};

/// How the return statement judged one asked inventory.
#[derive(Debug, Clone, PartialEq, Eq, FromQueryResult)]
pub(crate) struct Judged {
    /// The inventory.
    pub inventory_id: Uuid,
    /// Units asked for.
    pub requested: i32,
    /// Units its FULFILLED lines shipped; none when the order has none of it.
    pub fulfilled: Option<i64>,
    /// Units of those lines returned before this return.
    pub returned: Option<i64>,
    /// The return made; none when nothing was written.
    pub return_id: Option<Uuid>,
    /// The order's status; none when there is no such order.
    pub order_status: Option<OrderStatus>,
}

/// Runs a return (see `stock::taking_back::return_order`), re-run on
/// collisions; one row per asked inventory.
pub(crate) async fn return_order(
    db: &DatabaseConnection,
    collisions: &Collisions,
    r: OrderReturn<'_>,
) -> Result<Attempted<Vec<Judged>>, DbErr> {
    let run = || Judged::find_by_statement(taking_back::return_order(r)).all(db);
    collisions.run(r.order_id, run).await
}

/// A return with its lines.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ReturnRecord {
    /// The return.
    pub row: ReturnRow,
    /// Its lines, by inventory, RESTOCK before WRITE_OFF, then by location
    /// priority and code.
    pub lines: Vec<ReturnLineRow>,
}

/// The returns of these orders, each order's in the order they were made.
pub(crate) async fn of_orders(db: &impl ConnectionTrait, order_ids: &[Uuid]) -> Result<Vec<ReturnRecord>, DbErr> {
    let statement = Statement::from_sql_and_values(
        DbBackend::Postgres,
        "SELECT id, order_id, number, note, created_by, created_at FROM returns
          WHERE order_id = ANY($1) ORDER BY order_id, number",
        [Value::from(order_ids.to_vec())],
    );
    with_lines(db, ReturnRow::find_by_statement(statement).all(db).await?).await
}

/// The return with this id, if any.
pub(crate) async fn find(db: &impl ConnectionTrait, id: Uuid) -> Result<Option<ReturnRecord>, DbErr> {
    let statement = Statement::from_sql_and_values(
        DbBackend::Postgres,
        "SELECT id, order_id, number, note, created_by, created_at FROM returns WHERE id = $1",
        [id.into()],
    );
    Ok(with_lines(db, ReturnRow::find_by_statement(statement).all(db).await?).await?.pop())
}

/// The lines of returns as the API shows them: the order's lines of one
/// inventory summed, per disposition and location ('RESTOCK' sorts before
/// 'WRITE_OFF').
const LINES_SQL: &str = "
SELECT r.return_id, r.inventory_id, r.disposition, r.location_id, sum(r.quantity) AS quantity
  FROM return_lines r LEFT JOIN locations l ON l.id = r.location_id
 WHERE r.return_id = ANY($1)
 GROUP BY r.return_id, r.inventory_id, r.disposition, r.location_id, l.priority, l.code
 ORDER BY r.return_id, r.inventory_id, r.disposition, l.priority, l.code";

/// `returns` with their lines, in the same order.
async fn with_lines(db: &impl ConnectionTrait, returns: Vec<ReturnRow>) -> Result<Vec<ReturnRecord>, DbErr> {
    if returns.is_empty() {
        return Ok(Vec::new());
    }
    let ids: Vec<Uuid> = returns.iter().map(|r| r.id).collect();
    let statement = Statement::from_sql_and_values(DbBackend::Postgres, LINES_SQL, [Value::from(ids)]);
    let mut lines: HashMap<Uuid, Vec<ReturnLineRow>> = HashMap::new();
    for line in ReturnLineRow::find_by_statement(statement).all(db).await? {
        lines.entry(line.return_id).or_default().push(line);
    }
    Ok(returns.into_iter().map(|row| ReturnRecord { lines: lines.remove(&row.id).unwrap_or_default(), row }).collect())
}
