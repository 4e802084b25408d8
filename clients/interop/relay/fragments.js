// The fragments a Relay app writes against Stockguard: refetchable
// inventories and orders (through `node(id:)`), and the ledger of an
// inventory paginated as a Relay connection. `npm run relay` compiles them
// against ../../schema.graphql; relay.mjs runs the generated queries.
import { graphql } from 'relay-runtime';

export const inventory = graphql`
  fragment fragments_inventory on Inventory @refetchable(queryName: "InventoryRefetchQuery") {
    sku
    stock
    version
  }
`;

export const movements = graphql`
  fragment fragments_movements on Inventory
  @argumentDefinitions(count: { type: "Int", defaultValue: 2 }, cursor: { type: "String" })
  @refetchable(queryName: "InventoryMovementsPaginationQuery") {
    movements(first: $count, after: $cursor) @connection(key: "fragments_movements") {
      edges {
        node {
          delta
          reason
          versionAfter
        }
      }
    }
  }
`;

export const order = graphql`
  fragment fragments_order on Order @refetchable(queryName: "OrderRefetchQuery") {
    status
    version
    items {
      quantity
    }
  }
`;
