// Relay's runtime against Stockguard: the queries relay-compiler generated
// from relay/fragments.js (run `npm run relay` first) refetch an inventory
// and an order through `node(id:)`, and page through an inventory's ledger.
//   node relay.mjs <graphql-url> <operator-token> <inventory-node-id> <order-node-id>
// Prints the server's answers to those queries as JSON on stdout (the
// runtime masks fragment data, so the answers are read from the network).
import { createRequire } from 'node:module';
import { Environment, Network, RecordSource, Store, fetchQuery } from 'relay-runtime';

const require = createRequire(import.meta.url);
const [url, token, inventoryNodeId, orderNodeId] = process.argv.slice(2);
const answers = {};
const network = Network.create(async (operation, variables) => {
  const response = await fetch(url, {
    method: 'POST',
    headers: { 'content-type': 'application/json', accept: 'application/graphql-response+json', authorization: `Bearer ${token}` },
    body: JSON.stringify({ query: operation.text, variables }),
  });
  const answer = await response.json();
  (answers[operation.name] ??= []).push(answer);
  return answer;
});
const environment = new Environment({ network, store: new Store(new RecordSource()) });
const run = (name, variables) =>
  fetchQuery(environment, require(`./relay/__generated__/${name}.graphql.js`), variables).toPromise();

await run('InventoryRefetchQuery', { nodeId: inventoryNodeId });
await run('OrderRefetchQuery', { nodeId: orderNodeId });
await run('InventoryMovementsPaginationQuery', { nodeId: inventoryNodeId, count: 1 });
const [firstPage] = answers.InventoryMovementsPaginationQuery;
const cursor = firstPage.data.node.movements.pageInfo.endCursor;
await run('InventoryMovementsPaginationQuery', { nodeId: inventoryNodeId, count: 1, cursor });
process.stdout.write(`${JSON.stringify(answers)}\n`);
