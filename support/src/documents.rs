//! Every GraphQL document the tests send (but the hostile ones they make
//! up), each with the union members spelled out that the tests read; the
//! examples' lean ones are in [`brief`].

pub mod brief;

/// The fields of an order every order test reads.
macro_rules! order_fields {
    () => {
        "fragment OrderFields on Order {
           id status userId version confirmedAt confirmedBy fulfilledAt fulfilledBy createdAt
           items { inventory { id stock } quantity }
           shippingAddress { name line1 line2 city postalCode country }
         }"
    };
}

pub const CREATE_INVENTORY: &str = "mutation($input: CreateInventoryInput!) { createInventory(input: $input) { id } }";

pub const RESTOCK: &str = "mutation($input: RestockInput!) { restock(input: $input) { __typename } }";

pub const RESERVE: &str = r#"
mutation($input: ReserveInput!) {
  reserve(input: $input) {
    __typename
    ... on Reserved { reservation { id quantity status userId } inventory { id stock version } }
    ... on Conflict { expectedVersion inventory { id stock version } }
    ... on SoldOut { requested inventory { id stock version } }
    ... on InventoryNotFound { inventoryId }
  }
}"#;

pub const RESERVE_MANY: &str = "mutation($input: ReserveManyInput!) { reserveMany(input: $input) { __typename
   ... on ReservedAll { reservations { id quantity status userId inventory { id } } }
   ... on ItemsUnavailable { items { inventoryId reason inventory { id stock version } } }
 } }";

pub const RELEASE: &str = "mutation($id: UUID!) { releaseReservation(id: $id) { __typename
   ... on ReservationReleased { reservation { id status } inventory { id stock version } }
   ... on ReservationNotFound { reservationId }
   ... on ReservationNotActive { reservation { id status } }
 } }";

pub const EXTEND: &str = "mutation($id: UUID!, $s: Int!) { extendReservation(id: $id, seconds: $s) { __typename
    ... on ReservationExtended { reservation { expiresAt } }
    ... on ReservationNotActive { reservation { status } } } }";

pub const PLACE_ORDER: &str = concat!(
    "mutation($input: PlaceOrderInput!) { placeOrder(input: $input) { __typename
       ... on OrderPlaced { order { ...OrderFields } }
       ... on ItemsUnavailable { items { inventoryId reason inventory { id stock version } } }
     } }",
    order_fields!()
);

pub const CONFIRM_ORDER: &str = concat!(
    "mutation($id: UUID!) { confirmOrder(id: $id) { __typename
       ... on OrderConfirmed { order { ...OrderFields } }
       ... on OrderCannotBeConfirmed { order { ...OrderFields } }
       ... on OrderNotFound { orderId }
       ... on OrderModifiedConcurrently { orderId attempts }
     } }",
    order_fields!()
);

pub const CANCEL_ORDER: &str = concat!(
    "mutation($id: UUID!) { cancelOrder(id: $id) { __typename
       ... on OrderCancelled { order { ...OrderFields } }
       ... on OrderCannotBeCancelled { order { ...OrderFields } }
       ... on OrderNotFound { orderId }
       ... on OrderModifiedConcurrently { orderId attempts }
     } }",
    order_fields!()
);

pub const CHANGE_ADDRESS: &str = concat!(
    "mutation($input: ChangeShippingAddressInput!) { changeShippingAddress(input: $input) { __typename
       ... on ShippingAddressChanged { order { ...OrderFields } }
       ... on OrderVersionConflict {
         expectedVersion
         current { ...OrderFields }
         submitted { name line1 line2 city postalCode country }
       }
       ... on OrderNotEditable { order { ...OrderFields } }
       ... on OrderNotFound { orderId }
     } }",
    order_fields!()
);

pub const ORDER: &str = "query($id: UUID!) { order(id: $id) { id userId status } }";

pub const ORDERS: &str =
    "query($status: OrderStatus) { orders(first: 100, status: $status) { nodes { id userId status } } }";

pub const RESERVATION_STATUS: &str = "query($id: UUID!) { reservation(id: $id) { status expiresAt } }";

pub const MY_RESERVATIONS: &str =
    "query($f: Int) { myReservations(first: $f) { nodes { id inventory { sku stock } } } }";

pub const INVENTORIES: &str = "query($f: Int, $after: String) { inventories(first: $f, after: $after) {
   nodes { id sku stock version } pageInfo { hasNextPage endCursor } } }";

pub const MOVEMENTS: &str = "query($id: UUID!, $first: Int, $after: String) { inventory(id: $id) { stock version
   movements(first: $first, after: $after) { nodes { delta reason stockAfter versionAfter reservationId }
   pageInfo { hasNextPage endCursor } } } }";

pub const CHECKOUT: &str = concat!(
    "mutation($input: CheckoutInput!) { checkout(input: $input) { __typename
       ... on OrderPlaced { order { ...OrderFields } }
       ... on ReservationsUnavailable {
         reservations { reservationId reason reservation { id status quantity expiresAt } }
       }
     } }",
    order_fields!()
);

pub const CHANGE_QUANTITY: &str = "mutation($input: ChangeReservationQuantityInput!) {
  changeReservationQuantity(input: $input) { __typename
    ... on ReservationChanged { reservation { id quantity status } inventory { id stock version } }
    ... on SoldOut { requested inventory { id stock version } }
    ... on ReservationNotActive { reservation { id quantity status } }
    ... on ReservationNotFound { reservationId }
  } }";

pub const FULFILL_ORDER: &str = concat!(
    "mutation($id: UUID!) { fulfillOrder(id: $id) { __typename
       ... on OrderFulfilled { order { ...OrderFields } }
       ... on OrderCannotBeFulfilled { order { ...OrderFields } }
       ... on OrderNotFound { orderId }
       ... on OrderModifiedConcurrently { orderId attempts }
     } }",
    order_fields!()
);

pub const RETURN_ORDER: &str = "mutation($input: ReturnOrderInput!) { returnOrder(input: $input) { __typename
   ... on OrderReturned {
     order { id status version items { inventory { id } quantity returned } }
     return { id note createdBy createdAt
              lines { inventory { id } quantity disposition location { id code } } }
   }
   ... on ReturnExceedsFulfilled { inventoryId fulfilled returned requested }
   ... on OrderCannotBeReturned { order { id status } }
   ... on OrderNotFound { orderId }
 } }";

pub const ORDER_RETURNS: &str = "query($id: UUID!) { order(id: $id) { id status version
   items { inventory { id } quantity returned }
   returns { id note createdBy lines { inventory { id } quantity disposition location { code } } } } }";

pub const STOCK_STATES: &str =
    "query($id: UUID!) { inventory(id: $id) { stock version available reserved committed onHand } }";

pub const INVENTORY_STATES_PAGE: &str =
    "query($f: Int) { inventories(first: $f) { nodes { id available reserved committed onHand } } }";

/// The flood of issue 45: the most expensive read the limits admit, 100
/// inventories with their stock states and 100 of the caller's reservations
/// with their items (about 1,400 points of the 2,000 `STOCKGUARD_MAX_COMPLEXITY` allows).
pub const FLOOD_READ: &str = "{ inventories(first: 100) { nodes { id sku stock available reserved committed onHand } }
  myReservations(first: 100) { nodes { id quantity status inventory { id sku } } } }";

/// The small read another customer keeps making during a flood.
pub const SMALL_READ: &str = "query($id: UUID!) { inventory(id: $id) { id stock } }";

pub const ADJUST_STOCK: &str = "mutation($input: AdjustStockInput!) { adjustStock(input: $input) { __typename
   ... on StockAdjusted { delta inventory { id stock version onHand }
                          level { location { id code } available reserved committed onHand safetyStock sellable } }
   ... on SoldOut { requested available inventory { id stock version } }
   ... on CountBelowHeld { held level { location { code } available reserved committed onHand } }
   ... on Conflict { expectedVersion inventory { id stock version } }
   ... on InventoryNotFound { inventoryId }
   ... on LocationNotFound { locationId }
 } }";

pub const SET_SAFETY_STOCK: &str = "mutation($input: SetSafetyStockInput!) { setSafetyStock(input: $input) {
   location { id code } available reserved committed onHand safetyStock sellable } }";

/// `reserve` answering what a sold-out request was offered.
pub const RESERVE_OFFERED: &str = "mutation($input: ReserveInput!) { reserve(input: $input) { __typename
   ... on Reserved { reservation { id quantity allocations { location { code } quantity } } inventory { id stock version } }
   ... on SoldOut { requested available inventory { id stock version } }
   ... on Conflict { expectedVersion }
   ... on InventoryNotFound { inventoryId }
 } }";

pub const SAFETY_STATES: &str = "query($id: UUID!) { inventory(id: $id) { stock version available reserved committed
   onHand safetyStock sellable levels { location { code } available safetyStock sellable } } }";

pub const ADJUSTED_MOVEMENTS: &str = "query($id: UUID!) { inventory(id: $id) {
   movements(first: 100) { nodes { delta reason adjustmentReason note actor stockAfter versionAfter location { code } } } } }";

/// `reserveMany` answering what each short line was offered.
pub const RESERVE_MANY_OFFERED: &str = "mutation($input: ReserveManyInput!) { reserveMany(input: $input) { __typename
   ... on ReservedAll { reservations { id quantity inventory { id } } }
   ... on ItemsUnavailable { items { inventoryId reason available } }
 } }";

/// `placeOrder` answering what each short line was offered.
pub const PLACE_ORDER_OFFERED: &str = "mutation($input: PlaceOrderInput!) { placeOrder(input: $input) { __typename
   ... on OrderPlaced { order { id items { inventory { id } quantity } } }
   ... on ItemsUnavailable { items { inventoryId reason available } }
 } }";

/// `changeReservationQuantity` answering what a refused increase was offered.
pub const CHANGE_QUANTITY_OFFERED: &str = "mutation($input: ChangeReservationQuantityInput!) {
  changeReservationQuantity(input: $input) { __typename
    ... on ReservationChanged { reservation { id quantity } }
    ... on SoldOut { requested available }
    ... on ReservationNotActive { reservation { status } }
    ... on ReservationNotFound { reservationId }
  } }";

/// `createKit`, answering the kit with its flattened components.
pub const CREATE_KIT: &str = "mutation($input: CreateKitInput!) { createKit(input: $input) {
   id nodeId sku name active available components { inventory { id sku } quantity } } }";

/// `updateKit`.
pub const UPDATE_KIT: &str = "mutation($input: UpdateKitInput!) { updateKit(input: $input) { id name active } }";

/// A kit by id with what it offers.
pub const KIT: &str = "query($id: UUID!) { kit(id: $id) { id sku name active available
   components { inventory { id sku } quantity } } }";

/// A page of kits with what each offers.
pub const KITS: &str = "query($first: Int, $after: String) { kits(first: $first, after: $after) {
   nodes { id sku available } pageInfo { hasNextPage endCursor } } }";

/// `reserveKit`, answering the kit reservation or what was short.
pub const RESERVE_KIT: &str = "mutation($input: ReserveKitInput!) { reserveKit(input: $input) { __typename
   ... on KitReserved { kitReservation { id nodeId quantity status expiresAt userId kit { id }
       reservations { id quantity status expiresAt inventory { id } allocations { location { code } quantity }
                      kitReservation { id } } } }
   ... on KitSoldOut { kit { id } requested available components { inventoryId reason available } }
   ... on KitNotFound { kitId }
 } }";

/// `releaseKitReservation`.
pub const RELEASE_KIT: &str = "mutation($id: UUID!) { releaseKitReservation(id: $id) { __typename
   ... on KitReservationReleased { kitReservation { id status reservations { status } } }
   ... on ReservationNotFound { reservationId }
   ... on ReservationNotActive { reservation { id status } }
 } }";

/// `extendKitReservation`.
pub const EXTEND_KIT: &str = "mutation($id: UUID!, $seconds: Int!) { extendKitReservation(id: $id, seconds: $seconds) {
   __typename
   ... on ReservationExtended { reservation { id expiresAt } }
   ... on ReservationNotFound { reservationId }
   ... on ReservationNotActive { reservation { id status } }
 } }";

/// A kit reservation by id.
pub const KIT_RESERVATION: &str =
    "query($id: UUID!) { kitReservation(id: $id) { id status expiresAt reservations { id status expiresAt } } }";

/// `releaseReservation` of one reservation, answering a kit's refusal too.
pub const RELEASE_ONE: &str = "mutation($id: UUID!) { releaseReservation(id: $id) { __typename
   ... on ReservationReleased { reservation { id status } }
   ... on ReservationNotFound { reservationId }
   ... on ReservationNotActive { reservation { id status } }
   ... on ReservationPartOfKit { reservation { id status } kitReservation { id } }
 } }";

/// `extendReservation` of one reservation, answering a kit's refusal too.
pub const EXTEND_ONE: &str = "mutation($id: UUID!, $seconds: Int!) { extendReservation(id: $id, seconds: $seconds) {
   __typename
   ... on ReservationExtended { reservation { id } }
   ... on ReservationNotFound { reservationId }
   ... on ReservationNotActive { reservation { id } }
   ... on ReservationPartOfKit { reservation { id } kitReservation { id } }
 } }";

/// `changeReservationQuantity` of one reservation, answering a kit's refusal too.
pub const CHANGE_ONE: &str = "mutation($input: ChangeReservationQuantityInput!) {
  changeReservationQuantity(input: $input) { __typename
    ... on ReservationChanged { reservation { id quantity } }
    ... on SoldOut { requested available }
    ... on ReservationNotActive { reservation { status } }
    ... on ReservationNotFound { reservationId }
    ... on ReservationPartOfKit { reservation { id } kitReservation { id } }
  } }";

/// `checkout` of reservations and kit reservations, answering each line's kit.
pub const CHECKOUT_KITS: &str = "mutation($input: CheckoutInput!) { checkout(input: $input) { __typename
   ... on OrderPlaced { order { id status items { inventory { id } quantity kit { id } } } }
   ... on ReservationsUnavailable { reservations { reservationId reason } }
 } }";
