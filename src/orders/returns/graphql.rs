//! GraphQL types and the resolver of returns: `returnOrder` (operators),
//! what it answers, and the returns an order shows (`Order.returns`). The
//! resolver checks the caller, parses the input and calls the
//! [`ReturnService`].

use async_graphql::{Context, Enum, ErrorExtensions, InputObject, Object, SimpleObject, Union};
use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::{
    domain::ReturnRequest,
    loader::ReturnsLoader,
    service::{ReturnOutcome, ReturnService},
    store::ReturnRecord,
};
use crate::{
    context::Parts,
    error::{AppError, GqlResult, IntoGql},
    inventory::graphql::{Inventory, load as load_inventory},
    locations::graphql::{self as locations, Location},
    orders::graphql::{Order, OrderNotFound},
    stock::{
        rows::{self, ReturnLineRow},
        taking_back,
    },
    telemetry, validate,
};

/// What happens to returned units.
#[derive(Enum, Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReturnDisposition {
    /// Back to available stock: at the line's `locationId`, or where the
    /// order line shipped them from, most preferred location first.
    Restock,
    /// Counted as returned (`OrderItem.returned`); no unit moves and no
    /// ledger row is written (damaged, not resellable).
    WriteOff,
}

impl From<ReturnDisposition> for rows::ReturnDisposition {
    fn from(disposition: ReturnDisposition) -> Self {
        match disposition {
            ReturnDisposition::Restock => Self::Restock,
            ReturnDisposition::WriteOff => Self::WriteOff,
        }
    }
}

impl From<rows::ReturnDisposition> for ReturnDisposition {
    fn from(disposition: rows::ReturnDisposition) -> Self {
        match disposition {
            rows::ReturnDisposition::Restock => Self::Restock,
            rows::ReturnDisposition::WriteOff => Self::WriteOff,
        }
    }
}

/// Units of one inventory of the order coming back.
#[derive(InputObject)]
pub(crate) struct ReturnLineInput {
    /// An inventory the order has a line of; each inventory once per return.
    pub inventory_id: Uuid,
    /// Units, 1 to the server's maximum quantity (STOCKGUARD_MAX_QUANTITY);
    /// with what was returned of the inventory's lines before, at most what
    /// they shipped.
    pub quantity: i32,
    /// Restocked or written off.
    pub disposition: ReturnDisposition,
    /// RESTOCK only: the location the units go back to (an inactive one
    /// too). Omitted: the locations the line shipped them from, most
    /// preferred first (priority, then code), each at most what it gave
    /// less what earlier returns of the line put back there.
    pub location_id: Option<Uuid>,
}

/// A return of a FULFILLED order.
#[derive(InputObject)]
pub(crate) struct ReturnOrderInput {
    /// The order.
    pub order_id: Uuid,
    /// 1 to 100 lines, one per inventory.
    pub lines: Vec<ReturnLineInput>,
    /// Why, for the record: at most 500 characters (blank = none); kept on
    /// the return and on its `RETURNED` ledger rows.
    pub note: Option<String>,
    /// Same key from the same operator = the same return, made at most
    /// once. One key space with every keyed mutation.
    pub idempotency_key: Option<String>,
}

/// A return as the API shows it.
pub(crate) struct OrderReturn(pub ReturnRecord);

/// Units of a fulfilled order that came back, restocked or written off.
#[Object]
impl OrderReturn {
    /// The return's id.
    async fn id(&self) -> Uuid {
        self.0.row.id
    }

    /// What came back, per inventory, disposition and location: by
    /// inventory id, RESTOCK before WRITE_OFF, then by location priority and code.
    async fn lines(&self) -> Vec<ReturnLine> {
        self.0.lines.iter().cloned().map(ReturnLine).collect()
    }

    /// The operator's note, if any.
    async fn note(&self) -> Option<&str> {
        self.0.row.note.as_deref()
    }

    /// When it was made.
    async fn created_at(&self) -> DateTime<Utc> {
        self.0.row.created_at
    }

    /// The operator who made it (their token's `sub`).
    async fn created_by(&self) -> &str {
        &self.0.row.created_by
    }
}

/// A line of a return as the API shows it.
pub(crate) struct ReturnLine(ReturnLineRow);

/// Units of one inventory a return restocked at one location, or wrote off.
#[Object]
impl ReturnLine {
    /// The inventory (batched per request).
    async fn inventory(&self, ctx: &Context<'_>) -> GqlResult<Inventory> {
        load_inventory(ctx, self.0.inventory_id)
            .await?
            .ok_or_else(|| AppError::internal(anyhow::anyhow!("a returned inventory is missing")).extend())
    }

    /// Units.
    async fn quantity(&self) -> GqlResult<i32> {
        units(self.0.quantity)
    }

    /// Restocked or written off.
    async fn disposition(&self) -> ReturnDisposition {
        self.0.disposition.into()
    }

    /// Where RESTOCK units went back (batched per request); null for WRITE_OFF.
    async fn location(&self, ctx: &Context<'_>) -> GqlResult<Option<Location>> {
        let Some(id) = self.0.location_id else { return Ok(None) };
        locations::load(ctx, id)
            .await?
            .map(Some)
            .ok_or_else(|| AppError::internal(anyhow::anyhow!("a return's location is missing")).extend())
    }
}

/// A count of units as a GraphQL `Int`; one past `i32::MAX` is a broken
/// database, not a client's fault.
fn units(n: i64) -> GqlResult<i32> {
    i32::try_from(n).map_err(|_| AppError::internal(anyhow::anyhow!("{n} units do not fit in an Int")).extend())
}

/// The return was made: RESTOCK units are available again, every line counts in `OrderItem.returned`.
#[derive(SimpleObject)]
pub(crate) struct OrderReturned {
    /// The order as it is now: still FULFILLED, its version unchanged.
    pub order: Order,
    /// The return (for a replayed idempotency key: the first one).
    #[graphql(name = "return")]
    pub made: OrderReturn,
}

/// A line would return more units than its order lines shipped; nothing
/// was written.
#[derive(SimpleObject)]
pub(crate) struct ReturnExceedsFulfilled {
    /// The inventory of the line.
    pub inventory_id: Uuid,
    /// Units the order's lines of it shipped.
    pub fulfilled: i32,
    /// Units of them returned before.
    pub returned: i32,
    /// Units the line asked to return.
    pub requested: i32,
}

/// The order is not FULFILLED (PENDING, CONFIRMED or CANCELLED); nothing was written.
#[derive(SimpleObject)]
pub(crate) struct OrderCannotBeReturned {
    /// The order as it is.
    pub order: Order,
}

/// How `returnOrder` ended.
#[derive(Union)]
pub(crate) enum ReturnOrderResult {
    /// Returned.
    OrderReturned(OrderReturned),
    /// More than shipped; nothing written.
    ReturnExceedsFulfilled(ReturnExceedsFulfilled),
    /// Not FULFILLED.
    OrderCannotBeReturned(OrderCannotBeReturned),
    /// No such order.
    OrderNotFound(OrderNotFound),
}

/// The returns of order `order_id`, in the order they were made, through
/// the request's DataLoader.
pub(crate) async fn of_order(ctx: &Context<'_>, order_id: Uuid) -> GqlResult<Vec<OrderReturn>> {
    let loader = ctx.loader::<ReturnsLoader>()?;
    Ok(loader.load_one(order_id).await.gql()?.unwrap_or_default().into_iter().map(OrderReturn).collect())
}

/// Return mutations; operators.
#[derive(Default)]
pub(crate) struct ReturnMutation;

#[Object]
impl ReturnMutation {
    /// Takes back units of a FULFILLED order (operators), all lines or
    /// none, in one statement: RESTOCK units go back to available stock
    /// (one change of each inventory, one `RETURNED` ledger row per
    /// location), WRITE_OFF units are only counted. No line's returned
    /// units ever exceed what it shipped, whatever returns race. The order
    /// stays FULFILLED at its version.
    async fn return_order(
        &self,
        ctx: &Context<'_>,
        #[graphql(desc = "The order, its lines coming back, a note and an optional idempotency key.")]
        input: ReturnOrderInput,
    ) -> GqlResult<ReturnOrderResult> {
        let user = ctx.operator()?;
        let service = ctx.part::<ReturnService>()?;
        let lines = input
            .lines
            .iter()
            .map(|line| taking_back::ReturnLine {
                inventory_id: line.inventory_id,
                quantity: line.quantity,
                disposition: line.disposition.into(),
                location_id: line.location_id,
            })
            .collect();
        let request =
            ReturnRequest::check(input.order_id, lines, input.note.as_deref(), service.limits().max_quantity).gql()?;
        let key = validate::idempotency_key("input.idempotencyKey", input.idempotency_key.as_deref()).gql()?;
        let outcome = service.return_order(&user.id, &request, key).await.gql()?;
        let result = match outcome {
            ReturnOutcome::Returned { order, record } => {
                ReturnOrderResult::OrderReturned(OrderReturned { order: Order(order), made: OrderReturn(record) })
            }
            ReturnOutcome::ExceedsFulfilled { inventory_id, fulfilled, returned, requested } => {
                ReturnOrderResult::ReturnExceedsFulfilled(ReturnExceedsFulfilled {
                    inventory_id,
                    fulfilled: units(fulfilled)?,
                    returned: units(returned)?,
                    requested,
                })
            }
            ReturnOutcome::CannotBeReturned(order) => {
                ReturnOrderResult::OrderCannotBeReturned(OrderCannotBeReturned { order: Order(order) })
            }
            ReturnOutcome::OrderNotFound => {
                ReturnOrderResult::OrderNotFound(OrderNotFound { order_id: input.order_id })
            }
        };
        Ok(telemetry::counted("returnOrder", result))
    }
}
