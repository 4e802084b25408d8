// What every response's `extensions.cost` holds (docs/operations.md, "Fair
// share"), and how a client waits when it is THROTTLED. Extensions are not
// part of the schema, so codegen cannot type them: this is their type.

/** The caller's cost bucket after the request. */
export interface ThrottleStatus {
  maximumAvailable: number;
  currentlyAvailable: number;
  restoreRate: number;
}

/** `extensions.cost` of every Stockguard response. */
export interface Cost {
  /** The complexity measured before the request ran (0 if it was refused before that). */
  requestedQueryCost: number;
  /** One point per field really resolved. */
  actualQueryCost: number;
  throttleStatus: ThrottleStatus;
}

/** A GraphQL response as Stockguard sends it, with its cost. */
export interface CostedResponse<TData> {
  data?: TData | null;
  errors?: ReadonlyArray<{ message: string; extensions?: { code?: string; retryAfterMs?: number } }>;
  extensions?: { cost?: Cost };
}

/** How long to wait before retrying, when the request was THROTTLED. */
export function retryAfterMs(response: CostedResponse<unknown>): number | undefined {
  const throttled = response.errors?.find((error) => error.extensions?.code === 'THROTTLED');
  return throttled?.extensions?.retryAfterMs;
}

/** How many more requests of `cost` the bucket holds right now. */
export function affordable(response: CostedResponse<unknown>, cost: number): number {
  const status = response.extensions?.cost?.throttleStatus;
  return status && cost > 0 ? Math.floor(status.currentlyAvailable / cost) : 0;
}
