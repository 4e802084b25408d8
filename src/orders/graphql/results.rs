//! The members of the orders' result unions: what each order mutation can
//! answer, each with what a screen needs to show it.

use async_graphql::{Enum, OutputType, SimpleObject, Union};
use uuid::Uuid;

use super::{Order, ShippingAddress};
use crate::{
    orders::service::{self, TransitionOutcome},
    reservations::graphql::{ItemsUnavailable, Reservation},
};

/// The order was placed: stock taken (or, for a checkout, kept from the
/// cart), lines ORDERED.
#[derive(SimpleObject)]
pub(crate) struct OrderPlaced {
    /// The order (for a replayed idempotency key: the first one, as it is now).
    pub order: Order,
}

/// Why a reservation of a cart cannot be checked out.
#[derive(Enum, Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum UnavailableReservationReason {
    /// No such reservation, or someone else's.
    NotFound,
    /// Past its expiry, whether or not the sweeper has returned its stock yet.
    Expired,
    /// Given back.
    Released,
    /// Already a line of an order (this one's, another checkout's, or a fulfilled one's).
    Ordered,
    /// A component of a kit reservation, which is checked out whole (`kitReservationIds`).
    PartOfKit,
}

impl From<service::UnavailableReservationReason> for UnavailableReservationReason {
    fn from(reason: service::UnavailableReservationReason) -> Self {
        match reason {
            service::UnavailableReservationReason::NotFound => Self::NotFound,
            service::UnavailableReservationReason::Expired => Self::Expired,
            service::UnavailableReservationReason::Released => Self::Released,
            service::UnavailableReservationReason::Ordered => Self::Ordered,
            service::UnavailableReservationReason::PartOfKit => Self::PartOfKit,
        }
    }
}

/// A reservation of the cart that cannot be checked out.
#[derive(SimpleObject)]
pub(crate) struct UnavailableReservation {
    /// The reservation the request named.
    pub reservation_id: Uuid,
    /// Why it cannot be checked out.
    pub reason: UnavailableReservationReason,
    /// Its latest state; null when NOT_FOUND (unknown, or someone else's).
    pub reservation: Option<Reservation>,
}

/// Nothing was written: every reservation of the cart that cannot be
/// checked out, and why.
#[derive(SimpleObject)]
pub(crate) struct ReservationsUnavailable {
    /// Only the failing ones.
    pub reservations: Vec<UnavailableReservation>,
}

/// How a checkout ended.
#[derive(Union)]
pub(crate) enum CheckoutResult {
    /// The order was placed; its lines are the cart's reservations.
    OrderPlaced(OrderPlaced),
    /// Nothing was written.
    ReservationsUnavailable(ReservationsUnavailable),
}

/// How `placeOrder` ended.
#[derive(Union)]
pub(crate) enum PlaceOrderResult {
    /// Placed.
    OrderPlaced(OrderPlaced),
    /// Nothing was written.
    ItemsUnavailable(ItemsUnavailable),
}

/// The order was confirmed.
#[derive(SimpleObject)]
pub(crate) struct OrderConfirmed {
    /// The order, CONFIRMED.
    pub order: Order,
}

/// The order was cancelled and its stock returned.
#[derive(SimpleObject)]
pub(crate) struct OrderCancelled {
    /// The order, CANCELLED.
    pub order: Order,
}

/// The order is not PENDING (e.g. already cancelled); nothing changed.
#[derive(SimpleObject)]
pub(crate) struct OrderCannotBeConfirmed {
    /// The order as it is.
    pub order: Order,
}

/// The order is not PENDING (e.g. already confirmed or fulfilled); nothing changed.
#[derive(SimpleObject)]
pub(crate) struct OrderCannotBeCancelled {
    /// The order as it is.
    pub order: Order,
}

/// The order's units left the warehouse.
#[derive(SimpleObject)]
pub(crate) struct OrderFulfilled {
    /// The order, FULFILLED.
    pub order: Order,
}

/// The order is not CONFIRMED (pending, cancelled or already fulfilled); nothing changed.
#[derive(SimpleObject)]
pub(crate) struct OrderCannotBeFulfilled {
    /// The order as it is.
    pub order: Order,
}

/// No order with this id is visible to the caller.
#[derive(SimpleObject)]
pub(crate) struct OrderNotFound {
    /// The id that was asked for.
    pub order_id: Uuid,
}

/// Every attempt lost a race with another writer, or the lock wait ran out;
/// nothing changed. Safe to retry.
#[derive(SimpleObject)]
pub(crate) struct OrderModifiedConcurrently {
    /// The order.
    pub order_id: Uuid,
    /// Attempts made.
    pub attempts: i32,
}

/// How `confirmOrder` ended.
#[derive(Union)]
pub(crate) enum ConfirmOrderResult {
    /// Confirmed.
    OrderConfirmed(OrderConfirmed),
    /// Not PENDING.
    OrderCannotBeConfirmed(OrderCannotBeConfirmed),
    /// Not found.
    OrderNotFound(OrderNotFound),
    /// Retries or lock wait exhausted.
    OrderModifiedConcurrently(OrderModifiedConcurrently),
}

/// How `cancelOrder` ended.
#[derive(Union)]
pub(crate) enum CancelOrderResult {
    /// Cancelled; stock returned.
    OrderCancelled(OrderCancelled),
    /// Not PENDING.
    OrderCannotBeCancelled(OrderCannotBeCancelled),
    /// Not found (or not the caller's).
    OrderNotFound(OrderNotFound),
    /// Retries or lock wait exhausted.
    OrderModifiedConcurrently(OrderModifiedConcurrently),
}

/// How `fulfillOrder` ended.
#[derive(Union)]
pub(crate) enum FulfillOrderResult {
    /// Fulfilled; the lines shipped.
    OrderFulfilled(OrderFulfilled),
    /// Not CONFIRMED.
    OrderCannotBeFulfilled(OrderCannotBeFulfilled),
    /// Not found.
    OrderNotFound(OrderNotFound),
    /// Retries or lock wait exhausted.
    OrderModifiedConcurrently(OrderModifiedConcurrently),
}

/// A union that tells how a confirm, cancel or fulfilment ended: one member
/// per [`TransitionOutcome`].
pub(super) trait TransitionResult: OutputType + From<OrderNotFound> + From<OrderModifiedConcurrently> {
    /// Done; the order as saved.
    fn done(order: Order) -> Self;
    /// The order's status does not allow the change.
    fn not_allowed(order: Order) -> Self;

    /// The union member of `outcome` for order `id`.
    fn of(outcome: TransitionOutcome, id: Uuid) -> Self {
        match outcome {
            TransitionOutcome::Done(order) => Self::done(Order(order)),
            TransitionOutcome::NotAllowed(order) => Self::not_allowed(Order(order)),
            TransitionOutcome::NotFound => Self::from(OrderNotFound { order_id: id }),
            TransitionOutcome::ModifiedConcurrently { attempts } => {
                Self::from(OrderModifiedConcurrently { order_id: id, attempts: attempts as i32 })
            }
        }
    }
}

impl TransitionResult for ConfirmOrderResult {
    fn done(order: Order) -> Self {
        Self::OrderConfirmed(OrderConfirmed { order })
    }

    fn not_allowed(order: Order) -> Self {
        Self::OrderCannotBeConfirmed(OrderCannotBeConfirmed { order })
    }
}

impl TransitionResult for CancelOrderResult {
    fn done(order: Order) -> Self {
        Self::OrderCancelled(OrderCancelled { order })
    }

    fn not_allowed(order: Order) -> Self {
        Self::OrderCannotBeCancelled(OrderCannotBeCancelled { order })
    }
}

impl TransitionResult for FulfillOrderResult {
    fn done(order: Order) -> Self {
        Self::OrderFulfilled(OrderFulfilled { order })
    }

    fn not_allowed(order: Order) -> Self {
        Self::OrderCannotBeFulfilled(OrderCannotBeFulfilled { order })
    }
}

/// The address was changed.
#[derive(SimpleObject)]
pub(crate) struct ShippingAddressChanged {
    /// The order as saved.
    pub order: Order,
}

/// The order changed since the client saw it; nothing was written.
#[derive(SimpleObject)]
pub(crate) struct OrderVersionConflict {
    /// The version the client sent.
    pub expected_version: i32,
    /// The order as it is now.
    pub current: Order,
    /// The address the client submitted, to show beside the current one.
    pub submitted: ShippingAddress,
}

/// The order is no longer PENDING; nothing was written.
#[derive(SimpleObject)]
pub(crate) struct OrderNotEditable {
    /// The order as it is.
    pub order: Order,
}

/// How `changeShippingAddress` ended.
#[derive(Union)]
pub(crate) enum ChangeShippingAddressResult {
    /// Changed.
    ShippingAddressChanged(ShippingAddressChanged),
    /// Stale `expectedVersion`.
    OrderVersionConflict(OrderVersionConflict),
    /// Not PENDING.
    OrderNotEditable(OrderNotEditable),
    /// Not found (or not the caller's).
    OrderNotFound(OrderNotFound),
}
