// What a frontend does with the results, typed by the generated src/gql/.
// Every switch over `__typename` ends in a `never` check, so tsc proves each
// result union is handled exhaustively: a member added to the schema makes
// `npm run check` fail here.
import type {
  AdjustStockMutation,
  AdjustStockMutationVariables,
  ChangeReservationQuantityMutation,
  ChangeReservationQuantityMutationVariables,
  ChangeShippingAddressMutation,
  ChangeShippingAddressMutationVariables,
  CheckoutMutation,
  CheckoutMutationVariables,
  CreateLocationMutation,
  CreateLocationMutationVariables,
  CreateKitMutation,
  CreateKitMutationVariables,
  CreateWebhookMutation,
  CreateWebhookMutationVariables,
  DeleteWebhookMutation,
  DeleteWebhookMutationVariables,
  ExtendKitReservationMutation,
  ExtendKitReservationMutationVariables,
  ExtendReservationMutation,
  ExtendReservationMutationVariables,
  FulfillOrderMutation,
  FulfillOrderMutationVariables,
  InventoryChangedSubscription,
  InventoryChangedSubscriptionVariables,
  InventoryLevelsQuery,
  InventoryLevelsQueryVariables,
  InventoryMovementsQuery,
  InventoryMovementsQueryVariables,
  JoinWaitlistMutation,
  JoinWaitlistMutationVariables,
  KitQuery,
  KitQueryVariables,
  LeaveWaitlistMutationVariables,
  LocationsQuery,
  LocationsQueryVariables,
  MyWaitlistEntriesQuery,
  MyWaitlistEntriesQueryVariables,
  OrderChangedSubscription,
  OrderChangedSubscriptionVariables,
  OrderReturnsQuery,
  OrderReturnsQueryVariables,
  PlaceOrderMutation,
  PlaceOrderMutationVariables,
  RedeliverFailedMutation,
  RedeliverFailedMutationVariables,
  ReleaseKitReservationMutation,
  ReleaseKitReservationMutationVariables,
  ReleaseReservationMutation,
  ReleaseReservationMutationVariables,
  ReserveKitMutation,
  ReserveKitMutationVariables,
  ReserveManyMutation,
  ReserveManyMutationVariables,
  ReserveMutation,
  ReserveMutationVariables,
  ReturnOrderMutation,
  ReturnOrderMutationVariables,
  SetSafetyStockMutation,
  SetSafetyStockMutationVariables,
  TransferStockMutation,
  TransferStockMutationVariables,
  UpdateLocationMutation,
  UpdateLocationMutationVariables,
  UpdateWebhookMutation,
  UpdateWebhookMutationVariables,
  WebhookEndpointsQuery,
  WebhookEndpointsQueryVariables,
} from './gql/graphql';
// The schema's enums are TypeScript enums: values, not only types.
import {
  AdjustmentReason,
  AllocationStrategy,
  DeliveryStatus,
  EventType,
  MovementReason,
  OrderStatus,
  ReturnDisposition,
  UnavailableReason,
  UnavailableReservationReason,
} from './gql/graphql';

function unhandled(value: never): never {
  throw new Error(`unhandled result: ${JSON.stringify(value)}`);
}

// Where a reservation's or order line's units come from, as a packing
// screen shows it: `b 4, default 1` (the server sends them by priority).
function allocated(allocations: ReadonlyArray<{ location: { code: string }; quantity: number }>): string {
  return allocations.map((a) => `${a.location.code} ${a.quantity}`).join(', ');
}

export function describeReserve(result: ReserveMutation['reserve']): string {
  switch (result.__typename) {
    case 'Reserved': {
      const { reservation, inventory } = result;
      const expires: string = reservation.expiresAt ?? 'never';
      return `reserved ${reservation.quantity} (${reservation.id}, ${reservation.status}, expires ${expires}) ` +
        `from ${allocated(reservation.allocations)}; ${inventory.id} now ${inventory.stock} at version ${inventory.version}`;
    }
    case 'Conflict':
      return `expected version ${result.expectedVersion}, latest is ${result.inventory.version}`;
    case 'SoldOut':
      // `available` is what the request could have had (its locations, its
      // split setting); `inventory.stock` counts every location, so it may
      // be more than the request could take.
      return `asked for ${result.requested}, only ${result.available} can be reserved ` +
        `(${result.inventory.stock} in stock everywhere)`;
    case 'InventoryNotFound': {
      const id: string = result.inventoryId;
      return `no inventory ${id}`;
    }
    default:
      return unhandled(result);
  }
}

// What an order form says about a line it could not place; a reason added
// to the schema fails tsc here.
function unavailableItem(item: { reason: UnavailableReason; available?: number | null }): string {
  switch (item.reason) {
    case UnavailableReason.SoldOut:
      return `only ${item.available ?? 0} can be had where you asked`;
    case UnavailableReason.Conflict:
      return 'changed since you looked; reload';
    case UnavailableReason.NotFound:
      return 'no longer sold';
    default:
      return unhandled(item.reason);
  }
}

// A short line of a cart or an order. `kitId` is set when a kit line named
// the inventory (the first such kit): the line is then that kit's short
// component, or, with reason NOT_FOUND and `inventoryId` the kit's own id,
// the kit itself is unknown or no longer sold.
function unavailableLine(item: {
  inventoryId: string;
  reason: UnavailableReason;
  available?: number | null;
  kitId?: string | null;
  inventory?: { stock: number } | null;
}): string {
  if (item.kitId && item.kitId === item.inventoryId && item.reason === UnavailableReason.NotFound) {
    return `kit ${item.kitId}: no such kit on sale`;
  }
  const kit = item.kitId ? ` (a component of kit ${item.kitId})` : '';
  return `${item.inventoryId}${kit}: ${unavailableItem(item)} (stock ${item.inventory?.stock ?? 'n/a'})`;
}

export function describePlaceOrder(result: PlaceOrderMutation['placeOrder']): string {
  switch (result.__typename) {
    case 'OrderPlaced': {
      const { order } = result;
      // A kit line is one order line per component, each naming its kit; an
      // inventory named loose and by a kit is two lines.
      const lines = order.items
        .map((item) => `${item.quantity} of ${item.inventory.id}${item.kit ? ` (kit ${item.kit.sku})` : ''} ` +
          `from ${allocated(item.allocations)}`)
        .join('; ');
      return `order ${order.id} ${order.status} at version ${order.version}: ${lines}`;
    }
    case 'ItemsUnavailable':
      // Nothing was placed: loose units and kits' units of one inventory were judged together.
      return result.items.map(unavailableLine).join('; ');
    default:
      return unhandled(result);
  }
}

export function describeReserveMany(result: ReserveManyMutation['reserveMany']): string {
  switch (result.__typename) {
    case 'ReservedAll': {
      // `reservations` are the loose lines only; a kit line's components are
      // its kit reservation's, released, extended and checked out whole.
      const loose = result.reservations.map(
        (r) => `${r.quantity} × ${r.inventory.sku} (${r.id}, expires ${r.expiresAt ?? 'never'}) from ${allocated(r.allocations)}`,
      );
      const kits = result.kitReservations.map((held) => {
        const parts = held.reservations.map((r) => `${r.quantity} × ${r.inventory.sku} from ${allocated(r.allocations)}`);
        return `${held.quantity} × kit ${held.kit.sku} (${held.id}, ${held.status}): ${parts.join(', ')}`;
      });
      return `cart held: ${[...loose, ...kits].join('; ')}`;
    }
    case 'ItemsUnavailable':
      return `nothing held: ${result.items.map(unavailableLine).join('; ')}`;
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
    case UnavailableReservationReason.PartOfKit:
      return 'part of a kit: the kit is checked out whole';
    default:
      return unhandled(reason);
  }
}

export function describeCheckout(result: CheckoutMutation['checkout']): string {
  switch (result.__typename) {
    case 'OrderPlaced': {
      const { order } = result;
      // A kit reservation checked out whole is one line per component, each naming its kit.
      const lines = order.items
        .map((item) => `${item.quantity} of ${item.inventory.id}${item.kit ? ` (kit ${item.kit.sku})` : ''}`)
        .join(', ');
      return `order ${order.id} ${order.status} at version ${order.version}: ${lines}`;
    }
    case 'ReservationsUnavailable':
      return result.reservations
        .map((r) => {
          const kit = r.reservation?.kitReservation;
          const whole = kit ? ` (kit ${kit.kit.sku}, ${kit.id})` : '';
          return `${r.reservationId}: ${unavailableBecause(r.reason)}${whole} (${r.reservation?.status ?? 'unknown'})`;
        })
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
      return `needs ${result.requested} more, only ${result.available} can be added`;
    case 'ReservationNotActive':
      return `reservation ${result.reservation.id} is ${result.reservation.status}`;
    case 'ReservationNotFound':
      return `no reservation ${result.reservationId}`;
    case 'ReservationPartOfKit':
      return partOfKit(result);
    default:
      return unhandled(result);
  }
}

// A kit's component is never released, extended or changed alone: the
// screen offers the kit reservation instead (nothing was written).
function partOfKit(result: { reservation: { id: string }; kitReservation: { id: string; kit: { sku: string } } }): string {
  return `reservation ${result.reservation.id} is part of kit ${result.kitReservation.kit.sku} ` +
    `(${result.kitReservation.id}): act on the kit reservation; nothing changed`;
}

export function describeRelease(result: ReleaseReservationMutation['releaseReservation']): string {
  switch (result.__typename) {
    case 'ReservationReleased':
      return `reservation ${result.reservation.id} ${result.reservation.status}; ${result.inventory.id} now ` +
        `${result.inventory.available} available at version ${result.inventory.version}`;
    case 'ReservationNotFound':
      return `no reservation ${result.reservationId}`;
    case 'ReservationNotActive':
      return `reservation ${result.reservation.id} is ${result.reservation.status}: nothing returned again`;
    case 'ReservationPartOfKit':
      return partOfKit(result);
    default:
      return unhandled(result);
  }
}

// Both extendReservation and extendKitReservation answer an ExtendResult;
// for a kit, the reservation is its first component (all share the expiry).
export function describeExtend(
  result: ExtendReservationMutation['extendReservation'] | ExtendKitReservationMutation['extendKitReservation'],
): string {
  switch (result.__typename) {
    case 'ReservationExtended':
      return `held until ${result.reservation.expiresAt ?? 'never'}`;
    case 'ReservationNotFound':
      return `no reservation ${result.reservationId}`;
    case 'ReservationNotActive':
      return `reservation ${result.reservation.id} is ${result.reservation.status}: too late to extend`;
    case 'ReservationPartOfKit':
      return partOfKit(result);
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

// What a returns desk shows for a line; a disposition added to the schema fails tsc here.
function returnLine(line: {
  inventory: { sku: string };
  quantity: number;
  disposition: ReturnDisposition;
  location?: { code: string } | null;
}): string {
  switch (line.disposition) {
    case ReturnDisposition.Restock:
      return `${line.quantity} × ${line.inventory.sku} back in stock at ${line.location?.code ?? '?'}`;
    case ReturnDisposition.WriteOff:
      return `${line.quantity} × ${line.inventory.sku} written off`;
    default:
      return unhandled(line.disposition);
  }
}

export function describeReturn(result: ReturnOrderMutation['returnOrder']): string {
  switch (result.__typename) {
    case 'OrderReturned': {
      const { order, return: made } = result;
      const counted = order.items.map((i) => `${i.inventory.sku} ${i.returned}/${i.quantity}`).join(', ');
      return `return ${made.id} by ${made.createdBy} at ${made.createdAt}: ${made.lines.map(returnLine).join('; ')}` +
        `${made.note ? ` (${made.note})` : ''}; returned so far: ${counted}`;
    }
    case 'ReturnExceedsFulfilled':
      return `only ${result.fulfilled - result.returned} of ${result.inventoryId} can still come back ` +
        `(${result.fulfilled} shipped, ${result.returned} returned, ${result.requested} asked); nothing recorded`;
    case 'OrderCannotBeReturned':
      return `order ${result.order.id} is ${result.order.status}: only a fulfilled order takes returns`;
    case 'OrderNotFound':
      return `no order ${result.orderId}`;
    default:
      return unhandled(result);
  }
}

export function describeReturns(result: OrderReturnsQuery): string {
  const order = result.order;
  if (!order) return 'no such order';
  return order.returns
    .map((r) => `${r.createdAt} ${r.createdBy}: ${r.lines.map(returnLine).join('; ')}${r.note ? ` (${r.note})` : ''}`)
    .join('\n');
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

// One level as a stock screen shows it.
function levelLine(level: {
  location: { code: string; active: boolean };
  available: number;
  reserved: number;
  committed: number;
  onHand: number;
  safetyStock?: number;
  sellable?: number;
}): string {
  const inactive = level.location.active ? '' : ' (inactive: not allocated from)';
  const kept = level.safetyStock ? `; ${level.sellable ?? '?'} sellable, ${level.safetyStock} kept` : '';
  return `${level.location.code}${inactive}: ${level.available} available + ${level.reserved} reserved + ` +
    `${level.committed} committed = ${level.onHand} on hand${kept}`;
}

export function describeInventoryChange(event: InventoryChangedSubscription): string {
  const { id, stock, version, available, reserved, committed, onHand, levels } = event.inventoryChanged;
  return `${id}: stock ${stock} at version ${version}; ${available} available + ${reserved} reserved + ` +
    `${committed} committed = ${onHand} on hand; ${levels.map(levelLine).join('; ')}`;
}

export function describeLocations(result: LocationsQuery): string {
  const { nodes, pageInfo } = result.locations;
  const rows = nodes.map((l) => `${l.code} (${l.name}, priority ${l.priority}${l.active ? '' : ', inactive'}) ${l.id}`);
  return rows.join('\n') + (pageInfo.hasNextPage ? `\nmore after ${pageInfo.endCursor ?? '?'}` : '');
}

export function describeLevels(result: InventoryLevelsQuery): string {
  const inventory = result.inventory;
  if (!inventory) return 'no such inventory';
  return `${inventory.sku}: ${inventory.onHand} on hand, ${inventory.available} available at version ` +
    `${inventory.version}\n` + inventory.levels.map(levelLine).join('\n');
}

// A ledger screen's wording; a reason added to the schema fails tsc here.
function movementLine(reason: MovementReason): string {
  switch (reason) {
    case MovementReason.Created:
      return 'created';
    case MovementReason.Reserved:
      return 'reserved';
    case MovementReason.Released:
      return 'released';
    case MovementReason.Expired:
      return 'expired';
    case MovementReason.Restocked:
      return 'restocked';
    case MovementReason.Ordered:
      return 'ordered';
    case MovementReason.OrderCancelled:
      return 'order cancelled';
    case MovementReason.Fulfilled:
      return 'shipped';
    case MovementReason.QuantityChanged:
      return 'quantity changed';
    case MovementReason.TransferredOut:
      return 'transferred out';
    case MovementReason.TransferredIn:
      return 'transferred in';
    case MovementReason.Returned:
      return 'returned to stock';
    case MovementReason.Adjusted:
      return 'adjusted';
    default:
      return unhandled(reason);
  }
}

// An adjustment screen's reasons; a reason added to the schema fails tsc here.
export function adjustmentReasonLabel(reason: AdjustmentReason): string {
  switch (reason) {
    case AdjustmentReason.CycleCount:
      return 'counted';
    case AdjustmentReason.Damaged:
      return 'damaged';
    case AdjustmentReason.Shrinkage:
      return 'lost or stolen';
    case AdjustmentReason.Found:
      return 'found';
    case AdjustmentReason.Correction:
      return 'correction';
    case AdjustmentReason.ReturnToSupplier:
      return 'returned to supplier';
    case AdjustmentReason.Other:
      return 'other';
    default:
      return unhandled(reason);
  }
}

export function describeAdjustment(result: AdjustStockMutation['adjustStock']): string {
  switch (result.__typename) {
    case 'StockAdjusted': {
      const { delta, inventory, level } = result;
      if (delta === 0) return `the count matched: ${level.onHand} on hand at ${level.location.code}, nothing recorded`;
      return `${delta > 0 ? '+' : ''}${delta} at ${level.location.code}: ${level.onHand} on hand, ${level.sellable} ` +
        `sellable; ${inventory.id} now ${inventory.onHand} on hand at version ${inventory.version}`;
    }
    case 'SoldOut':
      return `only ${result.available} available there, ${result.requested} asked: held units are never adjusted away`;
    case 'CountBelowHeld':
      return `${result.held} units are held at ${result.level.location.code} (${result.level.onHand} on hand): ` +
        'count again, or release them first';
    case 'Conflict':
      return `expected version ${result.expectedVersion}, latest is ${result.inventory.version}: count again`;
    case 'InventoryNotFound':
      return `no inventory ${result.inventoryId}`;
    case 'LocationNotFound':
      return `no location ${result.locationId}`;
    default:
      return unhandled(result);
  }
}

export function describeSafetyStock(result: SetSafetyStockMutation): string {
  const level = result.setSafetyStock;
  if (!level) return 'no such inventory or location';
  return `${level.location.code}: ${level.safetyStock} kept back, ${level.sellable} of ${level.available} sellable`;
}

export function describeMovements(result: InventoryMovementsQuery): string {
  const movements = result.inventory?.movements;
  if (!movements) return 'no such inventory';
  return movements.nodes
    .map((m) => {
      // Rows from before locations were all at `default`.
      const where = m.location?.code ?? 'default';
      const why = m.adjustmentReason ? ` (${adjustmentReasonLabel(m.adjustmentReason)})` : '';
      const who = m.actor ? ` by ${m.actor}${m.note ? `: ${m.note}` : ''}` : '';
      return `v${m.versionAfter} ${movementLine(m.reason)}${why} ${m.delta > 0 ? '+' : ''}${m.delta} at ${where} ` +
        `(stock ${m.stockAfter})${who}`;
    })
    .join('\n');
}

// A strategy picker's labels; a strategy added to the schema fails tsc here.
export function strategyLabel(strategy: AllocationStrategy): string {
  switch (strategy) {
    case AllocationStrategy.Priority:
      return 'nearest first, split when short';
    case AllocationStrategy.FewestLocations:
      return 'fewest parcels';
    default:
      return unhandled(strategy);
  }
}

export function describeCreatedLocation(result: CreateLocationMutation): string {
  const { id, code, priority } = result.createLocation;
  return `location ${code} (${id}) at priority ${priority}`;
}

export function describeUpdatedLocation(result: UpdateLocationMutation): string {
  const location = result.updateLocation;
  if (!location) return 'no such location';
  return `location ${location.code}: ${location.name}, priority ${location.priority}, ` +
    (location.active ? 'active' : 'inactive: no new allocations, existing ones stay');
}

export function describeTransfer(result: TransferStockMutation['transferStock']): string {
  switch (result.__typename) {
    case 'StockTransferred': {
      const { inventory, from, to } = result;
      return `now ${from.location.code} ${from.available} available, ${to.location.code} ${to.available} available; ` +
        `${inventory.id} still ${inventory.stock} in stock at version ${inventory.version}`;
    }
    case 'SoldOut':
      return `asked to move ${result.requested}, the source has ${result.available} available`;
    case 'Conflict':
      return `expected version ${result.expectedVersion}, latest is ${result.inventory.version}`;
    case 'InventoryNotFound':
      return `no inventory ${result.inventoryId}`;
    case 'LocationNotFound':
      return `no location ${result.locationId}`;
    default:
      return unhandled(result);
  }
}

// A webhook screen's wording; a type or status added to the schema fails tsc here.
export function eventTypeLabel(type: EventType): string {
  switch (type) {
    case EventType.StockChanged:
      return 'stock';
    case EventType.ReservationChanged:
      return 'reservations';
    case EventType.OrderChanged:
      return 'orders';
    case EventType.WaitlistChanged:
      return 'waiting lists';
    default:
      return unhandled(type);
  }
}

function deliveryLine(status: DeliveryStatus, attempts: number, next: string | null | undefined): string {
  switch (status) {
    case DeliveryStatus.Pending:
      return `pending after ${attempts} attempts, next at ${next ?? '?'}`;
    case DeliveryStatus.Delivered:
      return 'delivered';
    case DeliveryStatus.Failed:
      return `failed after ${attempts} attempts: redeliverFailed sends it again`;
    default:
      return unhandled(status);
  }
}

// The secret is in this answer only: store it with the receiver now.
export function describeCreatedWebhook(result: CreateWebhookMutation): { summary: string; secret: string } {
  const { endpoint, secret } = result.createWebhook;
  return { summary: `webhook ${endpoint.id} to ${endpoint.url} for ${endpoint.events.map(eventTypeLabel).join(', ')}`, secret };
}

export function describeUpdatedWebhook(result: UpdateWebhookMutation): string {
  const endpoint = result.updateWebhook;
  if (!endpoint) return 'no such webhook';
  return `webhook to ${endpoint.url}: ${endpoint.active ? 'active' : 'paused'}, ${endpoint.events.map(eventTypeLabel).join(', ')}`;
}

export function describeDeletedWebhook(result: DeleteWebhookMutation): string {
  return result.deleteWebhook ? 'webhook deleted with its deliveries' : 'no such webhook';
}

export function describeRedelivered(result: RedeliverFailedMutation): string {
  return `${result.redeliverFailed} failed deliveries sent again`;
}

export function describeWebhooks(result: WebhookEndpointsQuery): string {
  const { nodes, pageInfo } = result.webhookEndpoints;
  const rows = nodes.map((endpoint) => {
    const deliveries = endpoint.deliveries.nodes.map(
      (d) => `  ${d.id} (${d.eventIds.length} events): ${deliveryLine(d.status, d.attempts, d.nextAttemptAt)}` +
        (d.lastError ? `; last error ${d.lastError}` : '') +
        (d.lastResponseStatus != null ? `; last answer ${d.lastResponseStatus}` : ''),
    );
    return [`${endpoint.url} (${endpoint.active ? 'active' : 'paused'}, since ${endpoint.createdAt})`, ...deliveries].join('\n');
  });
  return rows.join('\n') + (pageInfo.hasNextPage ? `\nmore after ${pageInfo.endCursor ?? '?'}` : '');
}

// A shop page's kit: `available` is exact (that many one-kit reserveKit
// succeed one after another from this state), so no arithmetic here.
export function describeKit(result: KitQuery): string {
  const kit = result.kit;
  if (!kit) return 'no such kit';
  const parts = kit.components.map((c) => `${c.quantity} × ${c.inventory.sku} (${c.inventory.sellable} sellable)`);
  return `${kit.sku} ${kit.name}: ${kit.active ? `${kit.available} available` : 'not sold any more'}; ` +
    parts.join(', ');
}

export function describeCreatedKit(result: CreateKitMutation): string {
  const { id, sku, available, components } = result.createKit;
  // Flattened: sub-kits replaced by their components, each inventory once.
  const parts = components.map((c) => `${c.quantity} × ${c.inventory.sku}`).join(', ');
  return `kit ${sku} (${id}) of ${parts}; ${available} available now`;
}

export function describeReserveKit(result: ReserveKitMutation['reserveKit']): string {
  switch (result.__typename) {
    case 'KitReserved': {
      const { kitReservation: held } = result;
      const parts = held.reservations
        .map((r) => `${r.quantity} × ${r.inventory.sku} from ${allocated(r.allocations)}`)
        .join('; ');
      return `${held.quantity} × ${held.kit.sku} held (${held.id}, ${held.status}, expires ${held.expiresAt ?? 'never'}): ` +
        parts;
    }
    case 'KitSoldOut': {
      // Nothing was taken, not even the components that were there.
      const short = result.components
        .map((c) => `${c.inventory?.sku ?? c.inventoryId}: ${unavailableItem(c)}`)
        .join('; ');
      return `asked for ${result.requested} × ${result.kit.sku}, only ${result.available} can be reserved; short: ${short}`;
    }
    case 'KitNotFound':
      return `no kit ${result.kitId} on sale`;
    default:
      return unhandled(result);
  }
}

export function describeJoinWaitlist(result: JoinWaitlistMutation['joinWaitlist']): string {
  switch (result.__typename) {
    case 'WaitlistJoined': {
      const { entry } = result;
      // Each freed unit is held for the head of the line; the offer comes as a WAITLIST_CHANGED event.
      return `in line for ${entry.quantity} × ${entry.inventory?.sku ?? '?'} (${entry.id}, ${entry.status}, position ${entry.position ?? '-'})`;
    }
    case 'NotSoldOut':
      // Nothing written: reserve instead.
      return `${result.available} can be reserved now`;
    case 'InventoryNotFound':
      return `no inventory ${result.inventoryId}`;
    case 'KitNotFound':
      return `no kit ${result.kitId}`;
    default:
      return unhandled(result);
  }
}

export function describeWaitlistEntries(result: MyWaitlistEntriesQuery): string[] {
  return result.myWaitlistEntries.nodes.map((entry) => {
    const offer = entry.offer ? `, offer ${entry.offer.id} ${entry.offer.status} until ${entry.offer.expiresAt ?? 'never'}` : '';
    return `${entry.quantity} × ${entry.inventory?.sku ?? '?'}: ${entry.status}${offer}`;
  });
}

export function describeReleaseKit(result: ReleaseKitReservationMutation['releaseKitReservation']): string {
  switch (result.__typename) {
    case 'KitReservationReleased': {
      const { kitReservation: released } = result;
      return `${released.quantity} × ${released.kit.sku} given back (${released.id}, ${released.status}), every component at once`;
    }
    case 'ReservationNotFound':
      return `no kit reservation ${result.reservationId}`;
    case 'ReservationNotActive':
      // Its first component, as it is: every component shares its status.
      return `kit reservation is ${result.reservation.status} already: nothing returned again`;
    default:
      return unhandled(result);
  }
}

// Variables are typed too: input names, required fields and scalars.
export const examples = {
  reserve: { input: { inventoryId: '00000000-0000-0000-0000-000000000001', quantity: 1, expectedVersion: 3 } },
  // Only from these two, the second one first, whole from one of them.
  reserveAcrossLocations: {
    input: {
      inventoryId: '00000000-0000-0000-0000-000000000001',
      quantity: 3,
      locationIds: ['00000000-0000-0000-0000-000000000006', '00000000-0000-0000-0000-000000000005'],
      strategy: AllocationStrategy.FewestLocations,
      allowSplit: false,
    },
  },
  placeOrder: {
    input: {
      items: [
        { inventoryId: '00000000-0000-0000-0000-000000000001', quantity: 2 },
        {
          inventoryId: '00000000-0000-0000-0000-000000000007',
          quantity: 1,
          locationIds: ['00000000-0000-0000-0000-000000000005'],
          strategy: AllocationStrategy.Priority,
        },
      ],
      shippingAddress: { name: 'Alice', line1: '1 Main St', city: 'Osaka', postalCode: '530-0001', country: 'JP' },
      idempotencyKey: 'checkout-1',
    },
  },
  // A kit line and a loose unit of one of its components: summed per inventory
  // before they are judged, so together they never take more than is there.
  reserveMany: {
    input: {
      items: [{ inventoryId: '00000000-0000-0000-0000-000000000007', quantity: 1 }],
      kits: [{ kitId: '00000000-0000-0000-0000-000000000009', quantity: 2 }],
      idempotencyKey: 'kit-cart-2',
    },
  },
  // An order straight from kit lines only (`items` defaults to []).
  placeOrderKits: {
    input: {
      kits: [{ kitId: '00000000-0000-0000-0000-000000000009', strategy: AllocationStrategy.FewestLocations }],
      shippingAddress: { name: 'Alice', line1: '1 Main St', city: 'Osaka', postalCode: '530-0001', country: 'JP' },
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
  // A kit reservation checked out whole beside a loose reservation.
  checkoutKit: {
    input: {
      reservationIds: ['00000000-0000-0000-0000-000000000003'],
      kitReservationIds: ['00000000-0000-0000-0000-00000000000b'],
      shippingAddress: { name: 'Alice', line1: '1 Main St', city: 'Osaka', postalCode: '530-0001', country: 'JP' },
      idempotencyKey: 'cart-2',
    },
  },
  changeReservationQuantity: { input: { reservationId: '00000000-0000-0000-0000-000000000003', quantity: 2 } },
  fulfillOrder: { id: '00000000-0000-0000-0000-000000000002' },
  orderChanged: { id: '00000000-0000-0000-0000-000000000002' },
  locations: { first: 50 },
  inventoryLevels: { id: '00000000-0000-0000-0000-000000000001' },
  inventoryMovements: { id: '00000000-0000-0000-0000-000000000001', first: 20 },
  createLocation: { input: { code: 'osaka-2', name: 'Osaka warehouse 2', priority: 20 } },
  updateLocation: { input: { id: '00000000-0000-0000-0000-000000000005', active: false } },
  createWebhook: {
    input: { url: 'https://erp.example.com/stockguard', events: [EventType.StockChanged, EventType.OrderChanged] },
  },
  updateWebhook: { input: { id: '00000000-0000-0000-0000-000000000008', active: false } },
  deleteWebhook: { id: '00000000-0000-0000-0000-000000000008' },
  redeliverFailed: { endpointId: '00000000-0000-0000-0000-000000000008' },
  webhookEndpoints: { first: 20, status: DeliveryStatus.Failed },
  transferStock: {
    input: {
      inventoryId: '00000000-0000-0000-0000-000000000001',
      fromLocationId: '00000000-0000-0000-0000-000000000005',
      toLocationId: '00000000-0000-0000-0000-000000000006',
      quantity: 4,
      expectedVersion: 7,
      idempotencyKey: 'move-1',
    },
  },
  // Two back in stock where they shipped from, one damaged.
  returnOrder: {
    input: {
      orderId: '00000000-0000-0000-0000-000000000002',
      lines: [
        { inventoryId: '00000000-0000-0000-0000-000000000001', quantity: 2, disposition: ReturnDisposition.Restock },
        { inventoryId: '00000000-0000-0000-0000-000000000007', quantity: 1, disposition: ReturnDisposition.WriteOff },
      ],
      note: 'Parcel refused; one box crushed',
      idempotencyKey: 'rma-1042',
    },
  },
  orderReturns: { id: '00000000-0000-0000-0000-000000000002' },
  // A count of the shelf; the server works out the delta.
  adjustStock: {
    input: {
      inventoryId: '00000000-0000-0000-0000-000000000001',
      locationId: '00000000-0000-0000-0000-000000000005',
      countedOnHand: 17,
      reason: AdjustmentReason.CycleCount,
      note: 'Evening count, aisle 4',
      expectedVersion: 12,
      idempotencyKey: 'count-2026-12-14-aisle-4',
    },
  },
  setSafetyStock: { input: { inventoryId: '00000000-0000-0000-0000-000000000001', quantity: 5 } },
  // An operator selling from the shop's own safety stock.
  reserveSafetyStock: {
    input: { inventoryId: '00000000-0000-0000-0000-000000000001', quantity: 2, useSafetyStock: true },
  },
  // Two kits from north or south only, each component whole from one location.
  reserveKit: {
    input: {
      kitId: '00000000-0000-0000-0000-000000000009',
      quantity: 2,
      locationIds: ['00000000-0000-0000-0000-000000000005', '00000000-0000-0000-0000-000000000006'],
      allowSplit: false,
      idempotencyKey: 'kit-cart-1',
    },
  },
  // A camera kit: a body, a lens kit (flattened into its components) and two batteries.
  createKit: {
    input: {
      sku: 'CAM-STARTER',
      name: 'Camera starter kit',
      components: [
        { inventoryId: '00000000-0000-0000-0000-000000000001', quantity: 1 },
        { kitId: '00000000-0000-0000-0000-00000000000a', quantity: 1 },
        { inventoryId: '00000000-0000-0000-0000-000000000007', quantity: 2 },
      ],
    },
  },
  kit: { id: '00000000-0000-0000-0000-000000000009' },
  releaseReservation: { id: '00000000-0000-0000-0000-000000000003' },
  extendReservation: { id: '00000000-0000-0000-0000-000000000003', seconds: 300 },
  releaseKitReservation: { id: '00000000-0000-0000-0000-00000000000b' },
  extendKitReservation: { id: '00000000-0000-0000-0000-00000000000b', seconds: 300 },
  // Two units of a sold-out item, offered together when both are freed.
  joinWaitlist: {
    input: { inventoryId: '00000000-0000-0000-0000-000000000001', quantity: 2, idempotencyKey: 'wl-1' },
  },
  myWaitlistEntries: { first: 20 },
  leaveWaitlist: { id: '00000000-0000-0000-0000-00000000000c' },
} satisfies {
  reserve: ReserveMutationVariables;
  reserveAcrossLocations: ReserveMutationVariables;
  placeOrder: PlaceOrderMutationVariables;
  reserveMany: ReserveManyMutationVariables;
  placeOrderKits: PlaceOrderMutationVariables;
  changeShippingAddress: ChangeShippingAddressMutationVariables;
  inventoryChanged: InventoryChangedSubscriptionVariables;
  checkout: CheckoutMutationVariables;
  checkoutKit: CheckoutMutationVariables;
  changeReservationQuantity: ChangeReservationQuantityMutationVariables;
  fulfillOrder: FulfillOrderMutationVariables;
  orderChanged: OrderChangedSubscriptionVariables;
  locations: LocationsQueryVariables;
  inventoryLevels: InventoryLevelsQueryVariables;
  inventoryMovements: InventoryMovementsQueryVariables;
  createLocation: CreateLocationMutationVariables;
  updateLocation: UpdateLocationMutationVariables;
  transferStock: TransferStockMutationVariables;
  createWebhook: CreateWebhookMutationVariables;
  updateWebhook: UpdateWebhookMutationVariables;
  deleteWebhook: DeleteWebhookMutationVariables;
  redeliverFailed: RedeliverFailedMutationVariables;
  webhookEndpoints: WebhookEndpointsQueryVariables;
  returnOrder: ReturnOrderMutationVariables;
  orderReturns: OrderReturnsQueryVariables;
  adjustStock: AdjustStockMutationVariables;
  setSafetyStock: SetSafetyStockMutationVariables;
  reserveSafetyStock: ReserveMutationVariables;
  reserveKit: ReserveKitMutationVariables;
  createKit: CreateKitMutationVariables;
  kit: KitQueryVariables;
  releaseReservation: ReleaseReservationMutationVariables;
  extendReservation: ExtendReservationMutationVariables;
  releaseKitReservation: ReleaseKitReservationMutationVariables;
  extendKitReservation: ExtendKitReservationMutationVariables;
  joinWaitlist: JoinWaitlistMutationVariables;
  myWaitlistEntries: MyWaitlistEntriesQueryVariables;
  leaveWaitlist: LeaveWaitlistMutationVariables;
};
