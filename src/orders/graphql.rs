//! GraphQL types and resolvers for orders; the members of their result
//! unions are in `results`. Resolvers check the caller, parse the input and
//! call the [`OrderService`].

use async_graphql::{Context, Enum, ErrorExtensions, ID, InputObject, Object, SimpleObject, Subscription};
use chrono::{DateTime, Utc};
use futures::{StreamExt, stream::BoxStream};
use uuid::Uuid;

use super::{
    domain::{self, Order as OrderValue},
    entity,
    loader::{OrderLinesLoader, OrderLoader},
    returns::graphql::{self as returns, OrderReturn},
    service::{AddressOutcome, CheckoutOutcome, OrderService, PlaceOutcome, Transition},
};
use crate::{
    auth::User,
    context::Parts,
    error::{AppError, GqlResult, IntoGql},
    global_id,
    inventory::graphql::{Inventory, load as load_inventory},
    kits::graphql::{self as kits, Kit},
    live::Feed,
    locations::graphql::{self as locations, Allocation},
    pagination::{self, Connection, Cursor, connection},
    reservations::{
        ReservationRow,
        graphql::{ItemsUnavailable, Reservation, ReserveItemInput},
    },
    telemetry, validate,
};

mod results;
pub(crate) use results::*;

/// Where an order is in its life.
#[derive(Enum, Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OrderStatus {
    /// Placed; may be confirmed, cancelled or edited.
    Pending,
    /// Confirmed by an operator; may be fulfilled, no longer cancelled.
    Confirmed,
    /// Cancelled; its stock went back. Final.
    Cancelled,
    /// Its units left the warehouse (operators). Final.
    Fulfilled,
}

impl From<entity::OrderStatus> for OrderStatus {
    fn from(status: entity::OrderStatus) -> Self {
        match status {
            entity::OrderStatus::Pending => Self::Pending,
            entity::OrderStatus::Confirmed => Self::Confirmed,
            entity::OrderStatus::Cancelled => Self::Cancelled,
            entity::OrderStatus::Fulfilled => Self::Fulfilled,
        }
    }
}

impl From<OrderStatus> for entity::OrderStatus {
    fn from(status: OrderStatus) -> Self {
        match status {
            OrderStatus::Pending => Self::Pending,
            OrderStatus::Confirmed => Self::Confirmed,
            OrderStatus::Cancelled => Self::Cancelled,
            OrderStatus::Fulfilled => Self::Fulfilled,
        }
    }
}

/// An order as the API shows it.
pub(crate) struct Order(pub OrderValue);

/// An order: its lines hold stock until it is cancelled or fulfilled.
#[Object]
impl Order {
    /// The order's id.
    async fn id(&self) -> Uuid {
        self.0.id
    }

    /// The order's global id, for `node(id:)` (Relay).
    pub(crate) async fn node_id(&self) -> ID {
        global_id::encode(global_id::Kind::Order, self.0.id)
    }

    /// Life-cycle state.
    async fn status(&self) -> OrderStatus {
        self.0.status().into()
    }

    /// The customer who placed it.
    async fn user_id(&self) -> &str {
        &self.0.user_id
    }

    /// The lines, one per inventory (batched per request).
    async fn items(&self, ctx: &Context<'_>) -> GqlResult<Vec<OrderItem>> {
        let loader = ctx.loader::<OrderLinesLoader>()?;
        let lines = loader.load_one(self.0.id).await.gql()?;
        Ok(lines.unwrap_or_default().into_iter().map(OrderItem).collect())
    }

    /// Where it goes.
    async fn shipping_address(&self) -> ShippingAddress {
        ShippingAddress::from(self.0.address())
    }

    /// When it was confirmed; set exactly when CONFIRMED, and kept when it
    /// is then FULFILLED.
    async fn confirmed_at(&self) -> Option<DateTime<Utc>> {
        self.0.confirmation().map(|c| c.at)
    }

    /// The operator who confirmed it; set exactly when CONFIRMED, and kept
    /// when it is then FULFILLED.
    async fn confirmed_by(&self) -> Option<&str> {
        self.0.confirmation().map(|c| c.by.as_str())
    }

    /// 1 when placed, +1 with every change. Send it back as
    /// `expectedVersion` to change the address only if nobody changed the order since.
    async fn version(&self) -> i32 {
        self.0.version
    }

    /// When it was placed.
    async fn created_at(&self) -> DateTime<Utc> {
        self.0.created_at
    }

    /// When its units left the warehouse; set exactly when FULFILLED.
    async fn fulfilled_at(&self) -> Option<DateTime<Utc>> {
        self.0.fulfilment().map(|f| f.at)
    }

    /// The operator who fulfilled it; set exactly when FULFILLED.
    async fn fulfilled_by(&self) -> Option<&str> {
        self.0.fulfilment().map(|f| f.by.as_str())
    }

    /// Units that came back after it was fulfilled, in the order they were
    /// made (`returnOrder`; batched per request); empty until then.
    async fn returns(&self, ctx: &Context<'_>) -> GqlResult<Vec<OrderReturn>> {
        returns::of_order(ctx, self.0.id).await
    }
}

/// A line of an order as the API shows it.
pub(crate) struct OrderItem(ReservationRow);

/// One line of an order.
#[Object]
impl OrderItem {
    /// The inventory (batched per request).
    async fn inventory(&self, ctx: &Context<'_>) -> GqlResult<Inventory> {
        load_inventory(ctx, self.0.inventory_id)
            .await?
            .ok_or_else(|| AppError::internal(anyhow::anyhow!("an order line's inventory is missing")).extend())
    }

    /// Units.
    async fn quantity(&self) -> i32 {
        self.0.quantity
    }

    /// Which locations gave its units (adding up to `quantity`), by priority then code.
    async fn allocations(&self, ctx: &Context<'_>) -> GqlResult<Vec<Allocation>> {
        locations::allocations(ctx, self.0.id).await
    }

    /// Units of it returned since it was fulfilled, restocked or written
    /// off; never more than `quantity`, 0 until a return.
    async fn returned(&self) -> i32 {
        self.0.returned
    }
    /// The kit this line came from, when it is a component of a kit
    /// reservation checked out (`kitReservationIds`); null otherwise.
    async fn kit(&self, ctx: &Context<'_>) -> GqlResult<Option<Kit>> {
        let Some(kit_reservation) = kits::of(ctx, &self.0).await? else { return Ok(None) };
        kits::load(ctx, kit_reservation.0.kit_id).await
    }
}

/// Where an order goes.
#[derive(SimpleObject, Clone)]
pub(crate) struct ShippingAddress {
    /// Recipient.
    pub name: String,
    /// Street address.
    pub line1: String,
    /// More of the address.
    pub line2: Option<String>,
    /// City.
    pub city: String,
    /// Postal code.
    pub postal_code: String,
    /// Country.
    pub country: String,
}

impl From<&domain::ShippingAddress> for ShippingAddress {
    fn from(a: &domain::ShippingAddress) -> Self {
        Self {
            name: a.name.clone(),
            line1: a.line1.clone(),
            line2: a.line2.clone(),
            city: a.city.clone(),
            postal_code: a.postal_code.clone(),
            country: a.country.clone(),
        }
    }
}

/// Where an order should go.
#[derive(InputObject)]
pub(crate) struct ShippingAddressInput {
    /// Recipient, 1 to 200 characters.
    pub name: String,
    /// Street address, 1 to 200 characters.
    pub line1: String,
    /// More of the address, up to 200 characters (blank = none).
    pub line2: Option<String>,
    /// City, 1 to 100 characters.
    pub city: String,
    /// Postal code, 1 to 20 characters.
    pub postal_code: String,
    /// Country, 1 to 56 characters.
    pub country: String,
}

impl ShippingAddressInput {
    /// Checks every field; `field` is where the address sits in the input.
    fn parse(&self, field: &str) -> Result<domain::ShippingAddress, AppError> {
        let f = |name: &str| format!("{field}.{name}");
        let line2 = match self.line2.as_deref().map(str::trim) {
            None | Some("") => None,
            Some(line2) => Some(validate::text(&f("line2"), line2, 200)?),
        };
        Ok(domain::ShippingAddress {
            name: validate::text(&f("name"), &self.name, 200)?,
            line1: validate::text(&f("line1"), &self.line1, 200)?,
            line2,
            city: validate::text(&f("city"), &self.city, 100)?,
            postal_code: validate::text(&f("postalCode"), &self.postal_code, 20)?,
            country: validate::text(&f("country"), &self.country, 56)?,
        })
    }
}

/// A new order.
#[derive(InputObject)]
pub(crate) struct PlaceOrderInput {
    /// The lines (at most 100 inventories); same-inventory lines are merged.
    pub items: Vec<ReserveItemInput>,
    /// Where it goes.
    pub shipping_address: ShippingAddressInput,
    /// Same key from the same user = same order, stock taken at most once.
    pub idempotency_key: Option<String>,
}

/// A new address for a PENDING order.
#[derive(InputObject)]
pub(crate) struct ChangeShippingAddressInput {
    /// The order.
    pub order_id: Uuid,
    /// The version the client saw; the change is made only at that version.
    pub expected_version: i32,
    /// The new address.
    pub shipping_address: ShippingAddressInput,
}

/// A cart to check out.
#[derive(InputObject)]
pub(crate) struct CheckoutInput {
    /// The caller's ACTIVE reservations (at most 100; repeats count once).
    /// Each becomes a line of the order with its quantity.
    #[graphql(default)]
    pub reservation_ids: Vec<Uuid>,
    /// The caller's ACTIVE kit reservations (at most 100; repeats count
    /// once), each checked out whole: every component becomes a line of the
    /// order, with `OrderItem.kit` set.
    pub kit_reservation_ids: Option<Vec<Uuid>>,
    /// Where the order goes.
    pub shipping_address: ShippingAddressInput,
    /// Same key from the same user = same order, the cart checked out at
    /// most once. One key space with `reserve`, `reserveMany` and `placeOrder`.
    pub idempotency_key: Option<String>,
}

/// Runs a confirm, cancel or fulfilment for `user` and answers with its union member,
/// counted under `field`.
async fn transition<R: TransitionResult>(
    ctx: &Context<'_>,
    user: &User,
    id: Uuid,
    transition: Transition,
    field: &'static str,
) -> GqlResult<R> {
    let outcome = ctx.part::<OrderService>()?.transition(user, id, transition).await.gql()?;
    Ok(telemetry::counted(field, R::of(outcome, id)))
}

/// The order with `id` if the caller may see it (their own, or any for
/// operators), through the request's DataLoader; `UNAUTHENTICATED` without
/// a token.
pub(crate) async fn visible(ctx: &Context<'_>, id: Uuid) -> GqlResult<Option<Order>> {
    let user = ctx.user()?;
    let loader = ctx.loader::<OrderLoader>()?;
    let order = loader.load_one(id).await.gql()?;
    Ok(order.filter(|order| user.may_see(&order.user_id)).map(Order))
}

/// Order queries; signed-in users.
#[derive(Default)]
pub(crate) struct OrderQuery;

#[Object]
impl OrderQuery {
    /// One order: the caller's own, or any for operators; others read as null.
    async fn order(
        &self,
        ctx: &Context<'_>,
        #[graphql(desc = "The order's id.")] id: Uuid,
    ) -> GqlResult<Option<Order>> {
        visible(ctx, id).await
    }

    /// Orders, oldest first: the caller's own, or all for operators.
    #[graphql(complexity = "crate::pagination::page_cost(first, child_complexity)")]
    async fn orders(
        &self,
        ctx: &Context<'_>,
        #[graphql(
            default_with = "Some(pagination::DEFAULT_PAGE_SIZE)",
            desc = "Page size, 1 to the server's maximum page size (STOCKGUARD_MAX_PAGE_SIZE)."
        )]
        first: Option<i32>,
        #[graphql(desc = "The `endCursor` of the previous page.")] after: Option<String>,
        #[graphql(desc = "Only orders in this status.")] status: Option<OrderStatus>,
    ) -> GqlResult<Connection<Cursor, Order>> {
        let user = ctx.user()?;
        let service = ctx.part::<OrderService>()?;
        let status = status.map(entity::OrderStatus::from);
        let (page, orders) = service.page(user, status, first, after.as_deref()).await.gql()?;
        Ok(connection(page, orders, |o| Cursor { created_at: o.created_at, id: o.id }, Order))
    }
}

/// Order mutations.
#[derive(Default)]
pub(crate) struct OrderMutation;

#[Object]
impl OrderMutation {
    /// Takes the stock of every line and creates the order: all or nothing.
    async fn place_order(
        &self,
        ctx: &Context<'_>,
        #[graphql(desc = "The lines, the address and an optional idempotency key.")] input: PlaceOrderInput,
    ) -> GqlResult<PlaceOrderResult> {
        let user = ctx.user()?;
        let service = ctx.part::<OrderService>()?;
        let lines = ReserveItemInput::merge(&input.items, service.limits().max_quantity).gql()?;
        let address = input.shipping_address.parse("input.shippingAddress").gql()?;
        let key = validate::idempotency_key("input.idempotencyKey", input.idempotency_key.as_deref()).gql()?;
        let outcome = service.place_order(&user.id, &lines, address, key).await.gql()?;
        Ok(telemetry::counted(
            "placeOrder",
            match outcome {
                PlaceOutcome::Placed(order) => PlaceOrderResult::OrderPlaced(OrderPlaced { order: Order(order) }),
                PlaceOutcome::ItemsUnavailable(items) => {
                    PlaceOrderResult::ItemsUnavailable(ItemsUnavailable::new(items))
                }
            },
        ))
    }

    /// Confirms a PENDING order (operators). Re-reads and retries a lost race.
    async fn confirm_order(
        &self,
        ctx: &Context<'_>,
        #[graphql(desc = "The order's id.")] id: Uuid,
    ) -> GqlResult<ConfirmOrderResult> {
        let user = ctx.operator()?;
        transition(ctx, user, id, Transition::Confirm, "confirmOrder").await
    }

    /// Cancels a PENDING order and returns its stock (the owner or an
    /// operator). Re-reads and retries a lost race.
    async fn cancel_order(
        &self,
        ctx: &Context<'_>,
        #[graphql(desc = "The order's id.")] id: Uuid,
    ) -> GqlResult<CancelOrderResult> {
        let user = ctx.user()?;
        transition(ctx, user, id, Transition::Cancel, "cancelOrder").await
    }

    /// Changes the address of the caller's PENDING order at the version the
    /// client saw. Never retried: a stale version returns the current order.
    async fn change_shipping_address(
        &self,
        ctx: &Context<'_>,
        #[graphql(desc = "The order, the version the client saw, and the new address.")]
        input: ChangeShippingAddressInput,
    ) -> GqlResult<ChangeShippingAddressResult> {
        let user = ctx.user()?;
        let service = ctx.part::<OrderService>()?;
        let address = input.shipping_address.parse("input.shippingAddress").gql()?;
        let submitted = ShippingAddress::from(&address);
        let outcome =
            service.change_shipping_address(user, input.order_id, input.expected_version, address).await.gql()?;
        Ok(telemetry::counted(
            "changeShippingAddress",
            match outcome {
                AddressOutcome::Changed(order) => {
                    ChangeShippingAddressResult::ShippingAddressChanged(ShippingAddressChanged { order: Order(order) })
                }
                AddressOutcome::VersionConflict(current) => {
                    ChangeShippingAddressResult::OrderVersionConflict(OrderVersionConflict {
                        expected_version: input.expected_version,
                        current: Order(current),
                        submitted,
                    })
                }
                AddressOutcome::NotEditable(order) => {
                    ChangeShippingAddressResult::OrderNotEditable(OrderNotEditable { order: Order(order) })
                }
                AddressOutcome::NotFound => {
                    ChangeShippingAddressResult::OrderNotFound(OrderNotFound { order_id: input.order_id })
                }
            },
        ))
    }

    /// Checks out the caller's cart: its ACTIVE, unexpired reservations
    /// become the lines of one new PENDING order, all or nothing, without
    /// taking stock again (their units move from `reserved` to
    /// `committed`). Any reservation that is unknown, someone else's,
    /// expired (swept or not), released or already ordered writes nothing
    /// and is listed with why.
    async fn checkout(
        &self,
        ctx: &Context<'_>,
        #[graphql(desc = "The cart's reservations, the address and an optional idempotency key.")] input: CheckoutInput,
    ) -> GqlResult<CheckoutResult> {
        let user = ctx.user()?;
        let service = ctx.part::<OrderService>()?;
        let cart =
            super::service::cart(&input.reservation_ids, input.kit_reservation_ids.as_deref().unwrap_or_default())
                .gql()?;
        let address = input.shipping_address.parse("input.shippingAddress").gql()?;
        let key = validate::idempotency_key("input.idempotencyKey", input.idempotency_key.as_deref()).gql()?;
        let outcome = service.checkout(&user.id, &cart, address, key).await.gql()?;
        Ok(telemetry::counted(
            "checkout",
            match outcome {
                CheckoutOutcome::Placed(order) => CheckoutResult::OrderPlaced(OrderPlaced { order: Order(order) }),
                CheckoutOutcome::ReservationsUnavailable(unavailable) => {
                    CheckoutResult::ReservationsUnavailable(ReservationsUnavailable {
                        reservations: unavailable
                            .into_iter()
                            .map(|u| UnavailableReservation {
                                reservation_id: u.reservation_id,
                                reason: u.reason.into(),
                                reservation: u.reservation.map(Reservation),
                            })
                            .collect(),
                    })
                }
            },
        ))
    }

    /// Records that a CONFIRMED order's units left the warehouse
    /// (operators): it turns FULFILLED and its lines leave `committed` and
    /// `onHand` (`available` does not move). Re-reads and retries a lost race.
    async fn fulfill_order(
        &self,
        ctx: &Context<'_>,
        #[graphql(desc = "The CONFIRMED order.")] id: Uuid,
    ) -> GqlResult<FulfillOrderResult> {
        let user = ctx.operator()?;
        transition(ctx, user, id, Transition::Fulfil, "fulfillOrder").await
    }
}

/// Live orders; the owner or an operator.
#[derive(Default)]
pub(crate) struct OrderSubscription;

#[Subscription]
impl OrderSubscription {
    /// Every committed change of one order from now on, in commit order
    /// (graphql-transport-ws or graphql-ws at `/graphql/ws`); it completes
    /// after the order is CANCELLED or FULFILLED (at once when it already
    /// is). The owner's or, for operators, any order; for anyone else the
    /// order reads as absent: an error, as for an unknown id.
    async fn order_changed(
        &self,
        ctx: &Context<'_>,
        #[graphql(desc = "The order to follow.")] id: Uuid,
    ) -> async_graphql::Result<BoxStream<'static, Order>> {
        let user = ctx.user()?;
        // The schema that serves introspection alone has no live feeds, and
        // runs no subscription.
        let live = ctx.part::<Feed<OrderValue>>()?;
        let Some(changes) = ctx.part::<OrderService>()?.watch(live, user, id).await.gql()? else {
            return Err(AppError::bad_input("id", "no order has this id").extend());
        };
        Ok(changes.map(Order).boxed())
    }
}
