//! The order aggregate and its rules, free of SQL: only PENDING orders can be
//! confirmed, cancelled or edited, and an order is CONFIRMED exactly when it
//! carries who confirmed it and when. Rows are checked again when loaded.

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::entity::{Model, OrderStatus};

/// Where an order goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShippingAddress {
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
pub struct Confirmation {
    /// When.
    pub at: DateTime<Utc>,
    /// The operator's user id.
    pub by: String,
}

/// An order as one unit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Order {
    /// Its id.
    pub id: Uuid,
    /// The customer.
    pub user_id: String,
    /// Life-cycle state.
    status: OrderStatus,
    /// Where it goes.
    address: ShippingAddress,
    /// Set exactly when CONFIRMED.
    confirmation: Option<Confirmation>,
    /// The version this value was read at (or will be saved as, after a save).
    pub version: i32,
    /// When it was placed.
    pub created_at: DateTime<Utc>,
}

/// A rule that forbids the change: the order is no longer PENDING.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the order is {0:?}, only PENDING orders can change")]
pub struct NotPending(pub OrderStatus);

/// A stored row that breaks the aggregate's rules.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("order {id} is inconsistent: status {status:?} with confirmed_at {at:?} and confirmed_by {by:?}")]
pub struct InconsistentOrder {
    /// The order.
    pub id: Uuid,
    /// Its status.
    pub status: OrderStatus,
    /// Its confirmed_at.
    pub at: Option<DateTime<Utc>>,
    /// Its confirmed_by.
    pub by: Option<String>,
}

impl Order {
    /// A new PENDING order at version 1.
    pub fn place(id: Uuid, user_id: String, address: ShippingAddress, now: DateTime<Utc>) -> Self {
        Self { id, user_id, status: OrderStatus::Pending, address, confirmation: None, version: 1, created_at: now }
    }

    /// The order a row describes, or why the row cannot be one.
    pub fn reconstitute(row: Model) -> Result<Self, InconsistentOrder> {
        let confirmation = match (row.status, row.confirmed_at, row.confirmed_by) {
            (OrderStatus::Confirmed, Some(at), Some(by)) => Some(Confirmation { at, by }),
            (OrderStatus::Pending | OrderStatus::Cancelled, None, None) => None,
            (status, at, by) => return Err(InconsistentOrder { id: row.id, status, at, by }),
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
            version: row.version,
            created_at: row.created_at,
        })
    }

    /// Life-cycle state.
    pub fn status(&self) -> OrderStatus {
        self.status
    }

    /// Where it goes.
    pub fn address(&self) -> &ShippingAddress {
        &self.address
    }

    /// Who confirmed it and when, if CONFIRMED.
    pub fn confirmation(&self) -> Option<&Confirmation> {
        self.confirmation.as_ref()
    }

    fn ensure_pending(&self) -> Result<(), NotPending> {
        if self.status == OrderStatus::Pending { Ok(()) } else { Err(NotPending(self.status)) }
    }

    /// Confirms a PENDING order on behalf of `operator`.
    pub fn confirm(&mut self, operator: &str, now: DateTime<Utc>) -> Result<(), NotPending> {
        self.ensure_pending()?;
        self.status = OrderStatus::Confirmed;
        self.confirmation = Some(Confirmation { at: now, by: operator.to_owned() });
        Ok(())
    }

    /// Cancels a PENDING order (its stock is returned by the same transaction).
    pub fn cancel(&mut self) -> Result<(), NotPending> {
        self.ensure_pending()?;
        self.status = OrderStatus::Cancelled;
        Ok(())
    }

    /// Sends a PENDING order elsewhere.
    pub fn change_shipping_address(&mut self, address: ShippingAddress) -> Result<(), NotPending> {
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
    fn a_pending_order_can_move() {
        let mut order = pending();
        order.change_shipping_address(address("Bob")).expect("edit");
        assert_eq!(order.address().name, "Bob");
    }

    fn row(status: OrderStatus, at: Option<DateTime<Utc>>, by: Option<&str>) -> Model {
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
}
