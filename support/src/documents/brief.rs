//! The documents of the examples' load: each reads back only what a
//! client under load keeps (the union member, an id, a version).

/// `reserve` reading back only the union member: the measured loop's request.
pub const RESERVE_TYPENAME: &str = "mutation($i: ReserveInput!) { reserve(input: $i) { __typename } }";

/// `reserveKit` reading back only the union member: the KIT cells' measured request.
pub const RESERVE_KIT_TYPENAME: &str = "mutation($i: ReserveKitInput!) { reserveKit(input: $i) { __typename } }";

/// `reserve` with what a client keeps: the reservation and the inventory's version.
pub const RESERVE: &str = r#"mutation($i: ReserveInput!) { reserve(input: $i) { __typename
  ... on Reserved { reservation { id } inventory { id version } }
  ... on Conflict { inventory { id version } }
  ... on SoldOut { inventory { id version } } } }"#;

pub const RESERVE_MANY: &str = r#"mutation($i: ReserveManyInput!) { reserveMany(input: $i) { __typename
  ... on ReservedAll { reservations { id } } } }"#;

pub const RELEASE: &str = r#"mutation($id: UUID!) { releaseReservation(id: $id) { __typename
  ... on ReservationNotActive { reservation { status } } } }"#;

pub const EXTEND: &str = r#"mutation($id: UUID!, $s: Int!) { extendReservation(id: $id, seconds: $s) { __typename
  ... on ReservationNotActive { reservation { status } } } }"#;

pub const INVENTORY_VERSION: &str = "query($id: UUID!) { inventory(id: $id) { __typename version } }";

pub const PLACE_ORDER: &str = r#"mutation($i: PlaceOrderInput!) { placeOrder(input: $i) { __typename
  ... on OrderPlaced { order { id version } } } }"#;

pub const ORDER_VERSION: &str = "query($id: UUID!) { order(id: $id) { version } }";

pub const CONFIRM: &str = "mutation($id: UUID!) { confirmOrder(id: $id) { __typename } }";

pub const CANCEL: &str = r#"mutation($id: UUID!) { cancelOrder(id: $id) { __typename
  ... on OrderCannotBeCancelled { order { status } } } }"#;

pub const CHANGE_ADDRESS: &str = r#"mutation($i: ChangeShippingAddressInput!) { changeShippingAddress(input: $i) {
  __typename
  ... on ShippingAddressChanged { order { version } }
  ... on OrderVersionConflict { current { version } } } }"#;

pub const CHECKOUT: &str = r#"mutation($i: CheckoutInput!) { checkout(input: $i) { __typename
  ... on OrderPlaced { order { id } }
  ... on ReservationsUnavailable { reservations { reason } } } }"#;

pub const CREATE_LOCATION: &str = "mutation($i: CreateLocationInput!) { createLocation(input: $i) { id } }";

pub const TRANSFER_STOCK: &str = "mutation($i: TransferStockInput!) { transferStock(input: $i) { __typename } }";
