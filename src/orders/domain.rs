//! The order aggregate and its rules, free of SQL: only PENDING orders can be
//! confirmed, cancelled or edited, only CONFIRMED ones fulfilled; an order
//! carries who confirmed it and when exactly once it is confirmed (CONFIRMED
//! or FULFILLED), and who fulfilled it and when exactly when FULFILLED. Rows
//! are checked again when loaded.

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::entity::{Model, OrderStatus};

/// Where an order goes.
#[derive(Debug, Clone, PartialEq, Eq)]
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

/// Who confirmed an order, and when.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Confirmation {
    /// When.
    pub at: DateTime<Utc>,
    /// The operator's user id.
    pub by: String,
}

/// Who fulfilled an order (its units left the warehouse), and when.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Fulfilment {
    /// When.
    pub at: DateTime<Utc>,
    /// The operator's user id.
    pub by: String,
}

/// An order as one unit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Order {
    /// Its id.
    pub id: Uuid,
    /// The customer.
    pub user_id: String,
    /// Life-cycle state.
    status: OrderStatus,
    /// Where it goes.
    address: ShippingAddress,
    /// Set exactly when CONFIRMED or FULFILLED.
    confirmation: Option<Confirmation>,
    /// Set exactly when FULFILLED.
    fulfilment: Option<Fulfilment>,
    /// The version this value was read at (or will be saved as, after a save).
    pub version: i32,
    /// When it was placed.
    pub created_at: DateTime<Utc>,
}

/// A rule that forbids the change: the order is no longer PENDING.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the order is {0:?}, only PENDING orders can change")]
pub(crate) struct NotPending(pub OrderStatus);

/// A rule that forbids fulfilling: the order is not CONFIRMED.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the order is {0:?}, only CONFIRMED orders can be fulfilled")]
pub(crate) struct NotConfirmed(pub OrderStatus);

/// A stored row that breaks the aggregate's rules.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "order {id} is inconsistent: status {status:?} with confirmed_at {at:?}, confirmed_by {by:?}, \
     fulfilled_at {fulfilled_at:?} and fulfilled_by {fulfilled_by:?}"
)]
pub(crate) struct InconsistentOrder {
    /// The order.
    pub id: Uuid,
    /// Its status.
    pub status: OrderStatus,
    /// Its confirmed_at.
    pub at: Option<DateTime<Utc>>,
    /// Its confirmed_by.
    pub by: Option<String>,
    /// Its fulfilled_at.
    pub fulfilled_at: Option<DateTime<Utc>>,
    /// Its fulfilled_by.
    pub fulfilled_by: Option<String>,
}

impl Order {
    /// A new PENDING order at version 1.
    pub(crate) fn place(id: Uuid, user_id: String, address: ShippingAddress, now: DateTime<Utc>) -> Self {
        Self {
            id,
            user_id,
            status: OrderStatus::Pending,
            address,
            confirmation: None,
            fulfilment: None,
            version: 1,
            created_at: now,
        }
    }

    /// The order a row describes, or why the row cannot be one.
    pub(crate) fn reconstitute(row: Model) -> Result<Self, InconsistentOrder> {
        let (confirmation, fulfilment) =
            match (row.status, row.confirmed_at, row.confirmed_by, row.fulfilled_at, row.fulfilled_by) {
                (OrderStatus::Pending | OrderStatus::Cancelled, None, None, None, None) => (None, None),
                (OrderStatus::Confirmed, Some(at), Some(by), None, None) => (Some(Confirmation { at, by }), None),
                (OrderStatus::Fulfilled, Some(at), Some(by), Some(fulfilled_at), Some(fulfilled_by)) => {
                    (Some(Confirmation { at, by }), Some(Fulfilment { at: fulfilled_at, by: fulfilled_by }))
                }
                (status, at, by, fulfilled_at, fulfilled_by) => {
                    return Err(InconsistentOrder { id: row.id, status, at, by, fulfilled_at, fulfilled_by });
                }
            };
        Ok(Self {
            id: row.id,
            user_id: row.user_id,
            status: row.status,
            address: ShippingAddress {
                name: row.ship_name,
                line1: row.ship_line1,
                line2: row.ship_line2,
                city: row.ship_city,
                postal_code: row.ship_postal_code,
                country: row.ship_country,
            },
            confirmation,
            fulfilment,
            version: row.version,
            created_at: row.created_at,
        })
    }

    /// Life-cycle state.
    pub(crate) fn status(&self) -> OrderStatus {
        self.status
    }

    /// Where it goes.
    pub(crate) fn address(&self) -> &ShippingAddress {
        &self.address
    }

    /// Who confirmed it and when, once confirmed (CONFIRMED or FULFILLED).
    pub(crate) fn confirmation(&self) -> Option<&Confirmation> {
        self.confirmation.as_ref()
    }

    /// Who fulfilled it and when, if FULFILLED.
    pub(crate) fn fulfilment(&self) -> Option<&Fulfilment> {
        self.fulfilment.as_ref()
    }

    fn ensure_pending(&self) -> Result<(), NotPending> {
        if self.status == OrderStatus::Pending { Ok(()) } else { Err(NotPending(self.status)) }
    }

    /// Confirms a PENDING order on behalf of `operator`.
    pub(crate) fn confirm(&mut self, operator: &str, now: DateTime<Utc>) -> Result<(), NotPending> {
        self.ensure_pending()?;
        self.status = OrderStatus::Confirmed;
        self.confirmation = Some(Confirmation { at: now, by: operator.to_owned() });
        Ok(())
    }

    /// Cancels a PENDING order (its stock is returned by the same transaction).
    pub(crate) fn cancel(&mut self) -> Result<(), NotPending> {
        self.ensure_pending()?;
        self.status = OrderStatus::Cancelled;
        Ok(())
    }

    /// Records that a CONFIRMED order's units left the warehouse, on behalf
    /// of `operator` (its lines turn FULFILLED in the same transaction).
    pub(crate) fn fulfil(&mut self, operator: &str, now: DateTime<Utc>) -> Result<(), NotConfirmed> {
        if self.status != OrderStatus::Confirmed {
            return Err(NotConfirmed(self.status));
        }
        self.status = OrderStatus::Fulfilled;
        self.fulfilment = Some(Fulfilment { at: now, by: operator.to_owned() });
        Ok(())
    }

    /// Sends a PENDING order elsewhere.
    pub(crate) fn change_shipping_address(&mut self, address: ShippingAddress) -> Result<(), NotPending> {
        self.ensure_pending()?;
        self.address = address;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn address(name: &str) -> ShippingAddress {
        ShippingAddress {
            name: name.into(),
            line1: "1 Main St".into(),
            line2: None,
            city: "Osaka".into(),
            postal_code: "530-0001".into(),
            country: "JP".into(),
        }
    }

    fn pending() -> Order {
        Order::place(Uuid::nil(), "alice".into(), address("Alice"), Utc::now())
    }

    #[test]
    fn a_pending_order_can_be_confirmed_once() {
        let mut order = pending();
        let now = Utc::now();
        order.confirm("op", now).expect("confirm");
        assert_eq!(order.status(), OrderStatus::Confirmed);
        assert_eq!(order.confirmation(), Some(&Confirmation { at: now, by: "op".into() }));
        assert_eq!(order.confirm("op", now), Err(NotPending(OrderStatus::Confirmed)));
        assert_eq!(order.cancel(), Err(NotPending(OrderStatus::Confirmed)));
    }

    #[test]
    fn a_cancelled_order_can_be_neither_confirmed_nor_edited() {
        let mut order = pending();
        order.cancel().expect("cancel");
        assert_eq!(order.confirm("op", Utc::now()), Err(NotPending(OrderStatus::Cancelled)));
        assert_eq!(order.change_shipping_address(address("Bob")), Err(NotPending(OrderStatus::Cancelled)));
        assert_eq!(order.confirmation(), None);
    }

    #[test]
    fn only_a_confirmed_order_can_be_fulfilled_and_then_nothing_else() {
        let mut order = pending();
        assert_eq!(order.fulfil("op", Utc::now()), Err(NotConfirmed(OrderStatus::Pending)));
        let (confirmed, fulfilled) = (Utc::now(), Utc::now());
        order.confirm("op", confirmed).expect("confirm");
        order.fulfil("picker", fulfilled).expect("fulfil");
        assert_eq!(order.status(), OrderStatus::Fulfilled);
        assert_eq!(order.confirmation(), Some(&Confirmation { at: confirmed, by: "op".into() }), "still confirmed");
        assert_eq!(order.fulfilment(), Some(&Fulfilment { at: fulfilled, by: "picker".into() }));
        assert_eq!(order.fulfil("op", Utc::now()), Err(NotConfirmed(OrderStatus::Fulfilled)));
        assert_eq!(order.cancel(), Err(NotPending(OrderStatus::Fulfilled)));
        assert_eq!(order.change_shipping_address(address("Bob")), Err(NotPending(OrderStatus::Fulfilled)));

        let mut cancelled = pending();
        cancelled.cancel().expect("cancel");
        assert_eq!(cancelled.fulfil("op", Utc::now()), Err(NotConfirmed(OrderStatus::Cancelled)));
    }

    #[test]
    fn a_pending_order_can_move() {
        let mut order = pending();
        order.change_shipping_address(address("Bob")).expect("edit");
        assert_eq!(order.address().name, "Bob");
    }

    fn row(status: OrderStatus, at: Option<DateTime<Utc>>, by: Option<&str>) -> Model {
        fulfilled_row(status, at, by, None, None)
    }

    fn fulfilled_row(
        status: OrderStatus,
        at: Option<DateTime<Utc>>,
        by: Option<&str>,
        fulfilled_at: Option<DateTime<Utc>>,
        fulfilled_by: Option<&str>,
    ) -> Model {
        Model {
            id: Uuid::nil(),
            user_id: "alice".into(),
            status,
            ship_name: "Alice".into(),
            ship_line1: "1 Main St".into(),
            ship_line2: None,
            ship_city: "Osaka".into(),
            ship_postal_code: "530-0001".into(),
            ship_country: "JP".into(),
            confirmed_at: at,
            confirmed_by: by.map(str::to_owned),
            version: 3,
            created_at: Utc::now(),
            fulfilled_at,
            fulfilled_by: fulfilled_by.map(str::to_owned),
        }
    }

    #[test]
    fn rows_that_break_the_confirmation_rule_are_refused() {
        let now = Some(Utc::now());
        assert!(Order::reconstitute(row(OrderStatus::Confirmed, now, Some("op"))).is_ok());
        assert!(Order::reconstitute(row(OrderStatus::Confirmed, None, Some("op"))).is_err());
        assert!(Order::reconstitute(row(OrderStatus::Confirmed, now, None)).is_err());
        assert!(Order::reconstitute(row(OrderStatus::Pending, now, Some("op"))).is_err());
        assert!(Order::reconstitute(row(OrderStatus::Cancelled, None, Some("op"))).is_err());
        assert!(Order::reconstitute(row(OrderStatus::Pending, None, None)).is_ok());
    }

    #[test]
    fn rows_that_break_the_fulfilment_rule_are_refused() {
        let now = Some(Utc::now());
        let fulfilled =
            |at, by, f_at, f_by| Order::reconstitute(fulfilled_row(OrderStatus::Fulfilled, at, by, f_at, f_by));
        assert!(fulfilled(now, Some("op"), now, Some("picker")).is_ok());
        assert!(fulfilled(now, Some("op"), None, Some("picker")).is_err());
        assert!(fulfilled(now, Some("op"), now, None).is_err());
        assert!(fulfilled(None, None, now, Some("picker")).is_err(), "a fulfilled order was confirmed first");
        let confirmed = fulfilled_row(OrderStatus::Confirmed, now, Some("op"), now, Some("picker"));
        assert!(Order::reconstitute(confirmed).is_err(), "only FULFILLED carries a fulfilment");
        assert!(Order::reconstitute(row(OrderStatus::Fulfilled, now, Some("op"))).is_err());
    }
}
