// urql with its default options against Stockguard: queries go by GET when
// they fit in a URL (@urql/core 6's default), mutations by POST.
//   node urql.mjs <graphql-url> <bearer-token> <inventory-id>
// Prints what it saw as JSON on stdout; exits 1 on any surprise.
import { Client, fetchExchange, gql } from '@urql/core';

const [url, token, inventoryId] = process.argv.slice(2);
const methods = [];
const client = new Client({
  url,
  exchanges: [fetchExchange],
  fetchOptions: () => ({ headers: { authorization: `Bearer ${token}` } }),
  fetch: (input, init) => {
    methods.push(init?.method ?? 'GET');
    return fetch(input, init);
  },
});

const read = await client
  .query(gql`query Stock($id: UUID!) { inventory(id: $id) { sku stock version } }`, { id: inventoryId })
  .toPromise();
const reserved = await client
  .mutation(
    gql`mutation Take($id: UUID!) {
      reserve(input: { inventoryId: $id, quantity: 1 }) {
        __typename
        ... on Reserved { reservation { id status } inventory { stock version } }
        ... on SoldOut { requested }
      }
    }`,
    { id: inventoryId },
  )
  .toPromise();
const out = {
  methods,
  read: read.data ?? null,
  readError: read.error?.message ?? null,
  reserve: reserved.data?.reserve ?? null,
  reserveError: reserved.error?.message ?? null,
};
process.stdout.write(`${JSON.stringify(out)}\n`);
process.exit(read.error || reserved.error ? 1 : 0);
