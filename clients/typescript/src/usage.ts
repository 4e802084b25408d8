// What a frontend does with the results, typed by the generated src/gql/.
// Every switch over `__typename` ends in a `never` check, so tsc proves each
// result union is handled exhaustively: a member added to the schema makes
// `npm run check` fail here.
import type {
  ChangeReservationQuantityMutation,
  ChangeReservationQuantityMutationVariables,
  ChangeShippingAddressMutation,
  ChangeShippingAddressMutationVariables,
  CheckoutMutation,
  CheckoutMutationVariables,
  FulfillOrderMutation,
  FulfillOrderMutationVariables,
  InventoryChangedSubscription,
  InventoryChangedSubscriptionVariables,
  OrderChangedSubscription,
  OrderChangedSubscriptionVariables,
  PlaceOrderMutation,
  PlaceOrderMutationVariables,
  ReserveMutation,
  ReserveMutationVariables,
} from './gql/graphql';
// The schema's enums are TypeScript enums: values, not only types.
import { OrderStatus, UnavailableReservationReason } from './gql/graphql';

function unhandled(value: never): never {
  throw new Error(`unhandled result: ${JSON.stringify(value)}`);
}

export function describeReserve(result: ReserveMutation['reserve']): string {
  switch (result.__typename) {
    case 'Reserved': {
      const { reservation, inventory } = result;
      const expires: string = reservation.expiresAt ?? 'never';
      return `reserved ${reservation.quantity} (${reservation.id}, ${reservation.status}, expires ${expires}); ` +
        `${inventory.id} now ${inventory.stock} at version ${inventory.version}`;
    }
    case 'Conflict':
      return `expected version ${result.expectedVersion}, latest is ${result.inventory.version}`;
    case 'SoldOut':
      return `asked for ${result.requested}, only ${result.inventory.stock} left`;
    case 'InventoryNotFound': {
      const id: string = result.inventoryId;
      return `no inventory ${id}`;
    }
    default:
      return unhandled(result);
  }
}

export function describePlaceOrder(result: PlaceOrderMutation['placeOrder']): string {
  switch (result.__typename) {
    case 'OrderPlaced':
      return `order ${result.order.id} ${result.order.status} at version ${result.order.version}`;
    case 'ItemsUnavailable':
      return result.items
        .map((item) => `${item.inventoryId}: ${item.reason} (stock ${item.inventory?.stock ?? 'n/a'})`)
        .join('; ');
    default:
      return unhandled(result);
  }
}

export function describeAddressChange(result: ChangeShippingAddressMutation['changeShippingAddress']): string {
  switch (result.__typename) {
    case 'ShippingAddressChanged':
      return `now ${result.order.shippingAddress.line1} at version ${result.order.version}`;
    case 'OrderVersionConflict':
      return `you sent version ${result.expectedVersion} (${result.submitted.line1}), the order is at ${result.current.version}`;
    case 'OrderNotEditable':
      return `order is ${result.order.status}`;
    case 'OrderNotFound':
      return `no order ${result.orderId}`;
    default:
      return unhandled(result);
  }
}

// What a cart screen says about a line it could not check out; a reason
// added to the schema fails tsc here.
function unavailableBecause(reason: UnavailableReservationReason): string {
  switch (reason) {
    case UnavailableReservationReason.NotFound:
      return 'no longer in your cart';
    case UnavailableReservationReason.Expired:
      return 'your hold ran out';
    case UnavailableReservationReason.Released:
      return 'you removed it';
    case UnavailableReservationReason.Ordered:
      return 'already ordered';
    default:
      return unhandled(reason);
  }
}

export function describeCheckout(result: CheckoutMutation['checkout']): string {
  switch (result.__typename) {
    case 'OrderPlaced': {
      const { order } = result;
      const lines = order.items.map((item) => `${item.quantity} of ${item.inventory.id}`).join(', ');
      return `order ${order.id} ${order.status} at version ${order.version}: ${lines}`;
    }
    case 'ReservationsUnavailable':
      return result.reservations
        .map((r) => `${r.reservationId}: ${unavailableBecause(r.reason)} (${r.reservation?.status ?? 'unknown'})`)
        .join('; ');
    default:
      return unhandled(result);
  }
}

export function describeQuantityChange(
  result: ChangeReservationQuantityMutation['changeReservationQuantity'],
): string {
  switch (result.__typename) {
    case 'ReservationChanged': {
      const { reservation, inventory } = result;
      return `now ${reservation.quantity} held; ${inventory.available} available, ${inventory.reserved} reserved ` +
        `at version ${inventory.version}`;
    }
    case 'SoldOut':
      return `needs ${result.requested} more, only ${result.inventory.stock} left`;
    case 'ReservationNotActive':
      return `reservation ${result.reservation.id} is ${result.reservation.status}`;
    case 'ReservationNotFound':
      return `no reservation ${result.reservationId}`;
    default:
      return unhandled(result);
  }
}

export function describeFulfilment(result: FulfillOrderMutation['fulfillOrder']): string {
  switch (result.__typename) {
    case 'OrderFulfilled':
      return `order ${result.order.id} shipped at ${result.order.fulfilledAt ?? '?'} by ${result.order.fulfilledBy ?? '?'}`;
    case 'OrderCannotBeFulfilled':
      return `order is ${result.order.status}`;
    case 'OrderNotFound':
      return `no order ${result.orderId}`;
    case 'OrderModifiedConcurrently':
      return `order ${result.orderId} changed under us ${result.attempts} times; try again`;
    default:
      return unhandled(result);
  }
}

// A status added to the schema fails tsc here.
function statusLine(status: OrderStatus): string {
  switch (status) {
    case OrderStatus.Pending:
      return 'waiting for confirmation';
    case OrderStatus.Confirmed:
      return 'confirmed, being packed';
    case OrderStatus.Cancelled:
      return 'cancelled';
    case OrderStatus.Fulfilled:
      return 'on its way';
    default:
      return unhandled(status);
  }
}

export function describeOrderChange(event: OrderChangedSubscription): string {
  const { id, status, version } = event.orderChanged;
  return `order ${id}: ${statusLine(status)} (version ${version})`;
}

export function describeInventoryChange(event: InventoryChangedSubscription): string {
  const { id, stock, version, available, reserved, committed, onHand } = event.inventoryChanged;
  return `${id}: stock ${stock} at version ${version}; ${available} available + ${reserved} reserved + ` +
    `${committed} committed = ${onHand} on hand`;
}

// Variables are typed too: input names, required fields and scalars.
export const examples = {
  reserve: { input: { inventoryId: '00000000-0000-0000-0000-000000000001', quantity: 1, expectedVersion: 3 } },
  placeOrder: {
    input: {
      items: [{ inventoryId: '00000000-0000-0000-0000-000000000001', quantity: 2 }],
      shippingAddress: { name: 'Alice', line1: '1 Main St', city: 'Osaka', postalCode: '530-0001', country: 'JP' },
      idempotencyKey: 'checkout-1',
    },
  },
  changeShippingAddress: {
    input: {
      orderId: '00000000-0000-0000-0000-000000000002',
      expectedVersion: 1,
      shippingAddress: { name: 'Alice', line1: '2 Harbor Rd', city: 'Kobe', postalCode: '650-0042', country: 'JP' },
    },
  },
  inventoryChanged: { id: '00000000-0000-0000-0000-000000000001' },
  checkout: {
    input: {
      reservationIds: ['00000000-0000-0000-0000-000000000003', '00000000-0000-0000-0000-000000000004'],
      shippingAddress: { name: 'Alice', line1: '1 Main St', city: 'Osaka', postalCode: '530-0001', country: 'JP' },
      idempotencyKey: 'cart-1',
    },
  },
  changeReservationQuantity: { input: { reservationId: '00000000-0000-0000-0000-000000000003', quantity: 2 } },
  fulfillOrder: { id: '00000000-0000-0000-0000-000000000002' },
  orderChanged: { id: '00000000-0000-0000-0000-000000000002' },
} satisfies {
  reserve: ReserveMutationVariables;
  placeOrder: PlaceOrderMutationVariables;
  changeShippingAddress: ChangeShippingAddressMutationVariables;
  inventoryChanged: InventoryChangedSubscriptionVariables;
  checkout: CheckoutMutationVariables;
  changeReservationQuantity: ChangeReservationQuantityMutationVariables;
  fulfillOrder: FulfillOrderMutationVariables;
  orderChanged: OrderChangedSubscriptionVariables;
};
