//! Relay's global ids: which kinds of object have one, and the encoding
//! (the base64 of `<Type>:<uuid>`). Kept apart from the `node` query
//! (`node.rs`), which loads every kind and so imports every feature: the
//! features give their objects an id from here, without importing `node`.

use async_graphql::ID;
use base64::Engine as _;
use uuid::Uuid;

/// The kinds of object that have a global id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `Inventory`.
    Inventory,
    /// `Reservation`.
    Reservation,
    /// `Order`.
    Order,
    /// `StockMovement`.
    StockMovement,
    /// `Location`.
    Location,
    /// `WebhookEndpoint`.
    WebhookEndpoint,
    /// `Kit`.
    Kit,
    /// `KitReservation`.
    KitReservation,
    /// `WaitlistEntry`.
    WaitlistEntry,
}

impl Kind {
    const ALL: [Self; 9] = [
        Self::Inventory,
        Self::Reservation,
        Self::Order,
        Self::StockMovement,
        Self::Location,
        Self::WebhookEndpoint,
        Self::Kit,
        Self::KitReservation,
        Self::WaitlistEntry,
    ];

    fn type_name(self) -> &'static str {
        match self {
            Self::Inventory => "Inventory",
            Self::Reservation => "Reservation",
            Self::Order => "Order",
            Self::StockMovement => "StockMovement",
            Self::Location => "Location",
            Self::WebhookEndpoint => "WebhookEndpoint",
            Self::Kit => "Kit",
            Self::KitReservation => "KitReservation",
            Self::WaitlistEntry => "WaitlistEntry",
        }
    }
}

/// The global id of the `kind` object with `id`.
pub fn encode(kind: Kind, id: Uuid) -> ID {
    ID(base64::engine::general_purpose::STANDARD.encode(format!("{}:{id}", kind.type_name())))
}

/// The kind and UUID a global id names, if it is one.
pub(crate) fn decode(id: &str) -> Option<(Kind, Uuid)> {
    let text = String::from_utf8(base64::engine::general_purpose::STANDARD.decode(id).ok()?).ok()?;
    let (name, uuid) = text.split_once(':')?;
    let kind = Kind::ALL.into_iter().find(|kind| kind.type_name() == name)?;
    Some((kind, Uuid::parse_str(uuid).ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_global_id_names_its_kind_and_uuid_and_nothing_else_is_one() {
        let id = Uuid::new_v4();
        for kind in Kind::ALL {
            assert_eq!(decode(&encode(kind, id).0), Some((kind, id)));
        }
        assert_eq!(decode("not base64!"), None);
        assert_eq!(decode(&base64::engine::general_purpose::STANDARD.encode("Nope:1")), None);
        assert_eq!(decode(&base64::engine::general_purpose::STANDARD.encode(format!("Order:{id}x"))), None);
    }
}
