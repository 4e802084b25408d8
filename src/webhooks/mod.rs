//! Webhooks, as operators see them: the endpoints events are sent to (a
//! URL, the event types it takes, a signing secret shown once), their
//! deliveries and what became of each, replaying the failed ones, and the
//! egress rules every URL must pass, at creation and again at delivery
//! (`egress.rs`). Sending is the event pump's and dispatcher's, in
//! `src/events/`; docs/webhooks.md is the integrators' side.

pub mod egress;
pub mod graphql;
pub mod service;
pub mod store;

/// The types of event an endpoint may take, as `webhook_endpoints.events`,
/// `outbox.types` and a body's `type` spell them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventType {
    /// A change of an inventory's stock (one ledger change).
    StockChanged,
    /// A change of a reservation's status.
    ReservationChanged,
    /// A new version of an order.
    OrderChanged,
}

impl EventType {
    /// Every type, in the order the API lists them.
    pub const ALL: [Self; 3] = [Self::StockChanged, Self::ReservationChanged, Self::OrderChanged];

    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::StockChanged => "STOCK_CHANGED",
            Self::ReservationChanged => "RESERVATION_CHANGED",
            Self::OrderChanged => "ORDER_CHANGED",
        }
    }

    /// The type stored as `name`, if it is one.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|kind| kind.as_str() == name)
    }
}

/// Where a delivery (one body of 1 to 100 events to one endpoint) stands,
/// as `webhook_deliveries.status` spells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeliveryStatus {
    /// Not yet answered with a 2xx; sent (again) at `next_attempt_at`.
    Pending,
    /// Answered with a 2xx.
    Delivered,
    /// Every attempt of the retry schedule failed; `redeliverFailed` makes it PENDING again.
    Failed,
}

impl DeliveryStatus {
    /// Every status.
    pub const ALL: [Self; 3] = [Self::Pending, Self::Delivered, Self::Failed];

    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "PENDING",
            Self::Delivered => "DELIVERED",
            Self::Failed => "FAILED",
        }
    }

    /// The status stored as `name`, if it is one.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|status| status.as_str() == name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stored_names_read_back_as_what_they_name() {
        for kind in EventType::ALL {
            assert_eq!(EventType::parse(kind.as_str()), Some(kind));
        }
        for status in DeliveryStatus::ALL {
            assert_eq!(DeliveryStatus::parse(status.as_str()), Some(status));
        }
        assert_eq!(EventType::parse("stock_changed"), None);
        assert_eq!(DeliveryStatus::parse("LOST"), None);
    }
}
