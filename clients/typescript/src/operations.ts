// Operations a frontend sends, written against ../../schema.graphql. Each
// selects every member of its result union, so renaming or removing a member
// in the schema fails codegen (the document no longer validates), and adding
// one fails tsc in usage.ts (the exhaustive switches miss it).
import { graphql } from './gql';

export const Reserve = graphql(`
  mutation Reserve($input: ReserveInput!) {
    reserve(input: $input) {
      __typename
      ... on Reserved {
        reservation { id quantity status expiresAt allocations { location { code name } quantity } }
        inventory { id stock version }
      }
      ... on Conflict { expectedVersion inventory { version } }
      ... on SoldOut { requested available inventory { stock } }
      ... on InventoryNotFound { inventoryId }
    }
  }
`);

export const PlaceOrder = graphql(`
  mutation PlaceOrder($input: PlaceOrderInput!) {
    placeOrder(input: $input) {
      __typename
      ... on OrderPlaced {
        order { id status version items { quantity inventory { id } kit { sku } allocations { location { code } quantity } } }
      }
      ... on ItemsUnavailable { items { inventoryId reason available kitId inventory { stock } } }
    }
  }
`);

// A cart of loose lines and kit lines (docs/kits.md#kits-in-a-cart): each kit
// line becomes a kit reservation; `reservations` holds the loose lines only.
export const ReserveMany = graphql(`
  mutation ReserveMany($input: ReserveManyInput!) {
    reserveMany(input: $input) {
      __typename
      ... on ReservedAll {
        reservations { id quantity status expiresAt inventory { id sku } allocations { location { code } quantity } }
        kitReservations {
          id quantity status expiresAt
          kit { id sku }
          reservations { id quantity inventory { id sku } allocations { location { code } quantity } }
        }
      }
      ... on ItemsUnavailable { items { inventoryId reason available kitId inventory { sku stock } } }
    }
  }
`);

export const ChangeShippingAddress = graphql(`
  mutation ChangeShippingAddress($input: ChangeShippingAddressInput!) {
    changeShippingAddress(input: $input) {
      __typename
      ... on ShippingAddressChanged { order { id version shippingAddress { line1 } } }
      ... on OrderVersionConflict { expectedVersion current { version } submitted { line1 } }
      ... on OrderNotEditable { order { status } }
      ... on OrderNotFound { orderId }
    }
  }
`);

export const Checkout = graphql(`
  mutation Checkout($input: CheckoutInput!) {
    checkout(input: $input) {
      __typename
      ... on OrderPlaced {
        order { id status version items { quantity inventory { id reserved committed } kit { sku } } }
      }
      ... on ReservationsUnavailable {
        reservations {
          reservationId reason
          reservation { id status quantity expiresAt kitReservation { id kit { sku } } }
        }
      }
    }
  }
`);

export const ChangeReservationQuantity = graphql(`
  mutation ChangeReservationQuantity($input: ChangeReservationQuantityInput!) {
    changeReservationQuantity(input: $input) {
      __typename
      ... on ReservationChanged {
        reservation { id quantity expiresAt }
        inventory { id stock version available reserved }
      }
      ... on SoldOut { requested available inventory { stock } }
      ... on ReservationNotActive { reservation { id status } }
      ... on ReservationNotFound { reservationId }
      ... on ReservationPartOfKit { reservation { id } kitReservation { id kit { sku } } }
    }
  }
`);

// A kit's component answers ReservationPartOfKit to the one-reservation
// mutations: the kit reservation is released and extended whole (below).
export const ReleaseReservation = graphql(`
  mutation ReleaseReservation($id: UUID!) {
    releaseReservation(id: $id) {
      __typename
      ... on ReservationReleased { reservation { id status } inventory { id available version } }
      ... on ReservationNotFound { reservationId }
      ... on ReservationNotActive { reservation { id status } }
      ... on ReservationPartOfKit { reservation { id } kitReservation { id kit { sku } } }
    }
  }
`);

export const ExtendReservation = graphql(`
  mutation ExtendReservation($id: UUID!, $seconds: Int!) {
    extendReservation(id: $id, seconds: $seconds) {
      __typename
      ... on ReservationExtended { reservation { id expiresAt } }
      ... on ReservationNotFound { reservationId }
      ... on ReservationNotActive { reservation { id status } }
      ... on ReservationPartOfKit { reservation { id } kitReservation { id kit { sku } } }
    }
  }
`);

export const FulfillOrder = graphql(`
  mutation FulfillOrder($id: UUID!) {
    fulfillOrder(id: $id) {
      __typename
      ... on OrderFulfilled { order { id status fulfilledAt fulfilledBy version } }
      ... on OrderCannotBeFulfilled { order { status } }
      ... on OrderNotFound { orderId }
      ... on OrderModifiedConcurrently { orderId attempts }
    }
  }
`);

export const OrderChanged = graphql(`
  subscription OrderChanged($id: UUID!) {
    orderChanged(id: $id) { id status version confirmedAt fulfilledAt }
  }
`);

export const InventoryChanged = graphql(`
  subscription InventoryChanged($id: UUID!) {
    inventoryChanged(id: $id) {
      id stock version available reserved committed onHand
      levels { location { id code active } available reserved committed onHand }
    }
  }
`);

export const Locations = graphql(`
  query Locations($first: Int, $after: String) {
    locations(first: $first, after: $after) {
      nodes { id code name priority active }
      pageInfo { hasNextPage endCursor }
    }
  }
`);

export const InventoryLevels = graphql(`
  query InventoryLevels($id: UUID!) {
    inventory(id: $id) {
      id sku stock version available reserved committed onHand safetyStock sellable
      levels { location { id code name priority active } available reserved committed onHand safetyStock sellable }
    }
  }
`);

export const InventoryMovements = graphql(`
  query InventoryMovements($id: UUID!, $first: Int, $after: String) {
    inventory(id: $id) {
      movements(first: $first, after: $after) {
        nodes { delta reason adjustmentReason note actor stockAfter versionAfter location { code } }
        pageInfo { hasNextPage endCursor }
      }
    }
  }
`);

export const CreateLocation = graphql(`
  mutation CreateLocation($input: CreateLocationInput!) {
    createLocation(input: $input) { id code name priority active }
  }
`);

export const UpdateLocation = graphql(`
  mutation UpdateLocation($input: UpdateLocationInput!) {
    updateLocation(input: $input) { id code name priority active }
  }
`);

export const TransferStock = graphql(`
  mutation TransferStock($input: TransferStockInput!) {
    transferStock(input: $input) {
      __typename
      ... on StockTransferred {
        inventory { id stock version }
        from { location { code } available onHand }
        to { location { code } available onHand }
      }
      ... on SoldOut { requested available inventory { version } }
      ... on Conflict { expectedVersion inventory { version } }
      ... on InventoryNotFound { inventoryId }
      ... on LocationNotFound { locationId }
    }
  }
`);

// Returns of fulfilled orders (operators; docs/stock-operations.md).
export const ReturnOrder = graphql(`
  mutation ReturnOrder($input: ReturnOrderInput!) {
    returnOrder(input: $input) {
      __typename
      ... on OrderReturned {
        order { id status version items { inventory { id sku } quantity returned } }
        return {
          id note createdAt createdBy
          lines { inventory { id sku } quantity disposition location { code } }
        }
      }
      ... on ReturnExceedsFulfilled { inventoryId fulfilled returned requested }
      ... on OrderCannotBeReturned { order { id status } }
      ... on OrderNotFound { orderId }
    }
  }
`);

// Adjustments and safety stock (operators; docs/stock-operations.md).
export const AdjustStock = graphql(`
  mutation AdjustStock($input: AdjustStockInput!) {
    adjustStock(input: $input) {
      __typename
      ... on StockAdjusted {
        delta
        inventory { id stock version onHand }
        level { location { code } available reserved committed onHand safetyStock sellable }
      }
      ... on SoldOut { requested available inventory { version } }
      ... on CountBelowHeld { held level { location { code } onHand } }
      ... on Conflict { expectedVersion inventory { version } }
      ... on InventoryNotFound { inventoryId }
      ... on LocationNotFound { locationId }
    }
  }
`);

export const SetSafetyStock = graphql(`
  mutation SetSafetyStock($input: SetSafetyStockInput!) {
    setSafetyStock(input: $input) { location { code } available safetyStock sellable }
  }
`);

export const OrderReturns = graphql(`
  query OrderReturns($id: UUID!) {
    order(id: $id) {
      id status
      items { inventory { sku } quantity returned }
      returns { id createdAt createdBy note lines { inventory { sku } quantity disposition location { code } } }
    }
  }
`);

// Webhooks (operators; docs/webhooks.md).
export const CreateWebhook = graphql(`
  mutation CreateWebhook($input: CreateWebhookInput!) {
    createWebhook(input: $input) { secret endpoint { id nodeId url events active createdAt } }
  }
`);

export const UpdateWebhook = graphql(`
  mutation UpdateWebhook($input: UpdateWebhookInput!) {
    updateWebhook(input: $input) { id url events active }
  }
`);

export const DeleteWebhook = graphql(`
  mutation DeleteWebhook($id: UUID!) { deleteWebhook(id: $id) }
`);

export const RedeliverFailed = graphql(`
  mutation RedeliverFailed($endpointId: UUID!) { redeliverFailed(endpointId: $endpointId) }
`);

export const WebhookEndpoints = graphql(`
  query WebhookEndpoints($first: Int, $after: String, $status: DeliveryStatus) {
    webhookEndpoints(first: $first, after: $after) {
      nodes {
        id url events active disabledAt createdAt
        deliveries(first: 10, status: $status) {
          nodes { id eventIds status attempts lastAttemptAt lastResponseStatus lastError nextAttemptAt deliveredAt }
          pageInfo { hasNextPage endCursor }
        }
      }
      pageInfo { hasNextPage endCursor }
    }
  }
`);

// Kits (docs/kits.md): operators make them, anyone reads them, customers
// reserve them; a kit reservation is released and extended whole.
export const CreateKit = graphql(`
  mutation CreateKit($input: CreateKitInput!) {
    createKit(input: $input) {
      id nodeId sku name active available
      components { inventory { id sku } quantity }
    }
  }
`);

export const Kit = graphql(`
  query Kit($id: UUID!) {
    kit(id: $id) {
      id sku name active available
      components { inventory { id sku sellable } quantity }
    }
  }
`);

export const ReserveKit = graphql(`
  mutation ReserveKit($input: ReserveKitInput!) {
    reserveKit(input: $input) {
      __typename
      ... on KitReserved {
        kitReservation {
          id quantity status expiresAt
          kit { sku }
          reservations {
            id quantity
            inventory { id sku }
            allocations { location { code } quantity }
          }
        }
      }
      ... on KitSoldOut {
        requested available
        kit { sku }
        components { inventoryId reason available inventory { sku } }
      }
      ... on KitNotFound { kitId }
    }
  }
`);

export const ReleaseKitReservation = graphql(`
  mutation ReleaseKitReservation($id: UUID!) {
    releaseKitReservation(id: $id) {
      __typename
      ... on KitReservationReleased { kitReservation { id status quantity kit { sku } } }
      ... on ReservationNotFound { reservationId }
      ... on ReservationNotActive { reservation { id status } }
    }
  }
`);

export const ExtendKitReservation = graphql(`
  mutation ExtendKitReservation($id: UUID!, $seconds: Int!) {
    extendKitReservation(id: $id, seconds: $seconds) {
      __typename
      ... on ReservationExtended { reservation { id expiresAt } }
      ... on ReservationNotFound { reservationId }
      ... on ReservationNotActive { reservation { id status } }
      ... on ReservationPartOfKit { reservation { id } kitReservation { id kit { sku } } }
    }
  }
`);

export const JoinWaitlist = graphql(`
  mutation JoinWaitlist($input: JoinWaitlistInput!) {
    joinWaitlist(input: $input) {
      __typename
      ... on WaitlistJoined { entry { id status position quantity inventory { sku } } }
      ... on NotSoldOut { available }
      ... on InventoryNotFound { inventoryId }
      ... on KitNotFound { kitId }
    }
  }
`);

export const MyWaitlistEntries = graphql(`
  query MyWaitlistEntries($first: Int, $after: String) {
    myWaitlistEntries(first: $first, after: $after) {
      nodes {
        id status position quantity createdAt offeredAt
        inventory { sku }
        offer { id status expiresAt }
      }
      pageInfo { hasNextPage endCursor }
    }
  }
`);

export const LeaveWaitlist = graphql(`
  mutation LeaveWaitlist($id: UUID!) {
    leaveWaitlist(id: $id) { id status }
  }
`);
