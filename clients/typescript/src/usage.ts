// What a frontend does with the results, typed by the generated src/gql/.
// Every switch over `__typename` ends in a `never` check, so tsc proves each
// result union is handled exhaustively: a member added to the schema makes
// `npm run check` fail here.
import type {
  ChangeShippingAddressMutation,
  ChangeShippingAddressMutationVariables,
  InventoryChangedSubscription,
  InventoryChangedSubscriptionVariables,
  PlaceOrderMutation,
  PlaceOrderMutationVariables,
  ReserveMutation,
  ReserveMutationVariables,
} from './gql/graphql';

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

export function describeInventoryChange(event: InventoryChangedSubscription): string {
  const { id, stock, version } = event.inventoryChanged;
  return `${id}: stock ${stock} at version ${version}`;
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
} satisfies {
  reserve: ReserveMutationVariables;
  placeOrder: PlaceOrderMutationVariables;
  changeShippingAddress: ChangeShippingAddressMutationVariables;
  inventoryChanged: InventoryChangedSubscriptionVariables;
};
