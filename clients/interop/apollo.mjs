// Apollo Client 4 against Stockguard, two ways:
// - `useGETForQueries`, with the committed possibleTypes so that fragments
//   on unions match (../possible-types.json);
// - automatic persisted queries (PersistedQueryLink, hashed queries by GET):
//   the first client's hash-only request is not found and it sends the
//   query; a second client's hash-only request is then answered.
//   node apollo.mjs <graphql-url> <bearer-token> <inventory-id>
// Prints what it saw as JSON on stdout; exits 1 on any surprise.
import { createHash } from 'node:crypto';
import { readFile } from 'node:fs/promises';
import { ApolloClient, ApolloLink, HttpLink, InMemoryCache, gql } from '@apollo/client';
import { PersistedQueryLink } from '@apollo/client/link/persisted-queries';

const [url, token, inventoryId] = process.argv.slice(2);
const possibleTypes = JSON.parse(await readFile(new URL('../possible-types.json', import.meta.url), 'utf8'));
const requests = [];
const logged = (input, init) => {
  const target = new URL(typeof input === 'string' ? input : input.url);
  requests.push({ method: init?.method ?? 'GET', query: target.searchParams.has('query') || /"query"/.test(init?.body ?? '') });
  return fetch(input, init);
};
const headers = { authorization: `Bearer ${token}` };

const STOCK = gql`
  query Stock($id: UUID!) {
    inventory(id: $id) { id sku stock version }
  }
`;
const TAKE = gql`
  mutation Take($id: UUID!) {
    reserve(input: { inventoryId: $id, quantity: 1 }) {
      ...Outcome
    }
  }
  fragment Outcome on ReserveResult {
    __typename
    ... on Reserved { reservation { id status } inventory { id stock version } }
    ... on SoldOut { requested inventory { id stock } }
  }
`;

// 1. GET for queries.
const byGet = new ApolloClient({
  link: new HttpLink({ uri: url, headers, fetch: logged, useGETForQueries: true }),
  cache: new InMemoryCache({ possibleTypes }),
});
const read = await byGet.query({ query: STOCK, variables: { id: inventoryId } });
const take = await byGet.mutate({ mutation: TAKE, variables: { id: inventoryId } });
const getMethods = requests.splice(0).map((r) => r.method);

// 2. Persisted queries, twice with fresh clients.
const sha256 = (text) => createHash('sha256').update(text).digest('hex');
const persisted = () =>
  new ApolloClient({
    link: ApolloLink.from([
      new PersistedQueryLink({ sha256, useGETForHashedQueries: true }),
      new HttpLink({ uri: url, headers, fetch: logged }),
    ]),
    cache: new InMemoryCache({ possibleTypes }),
  });
const first = await persisted().query({ query: STOCK, variables: { id: inventoryId } });
const firstRequests = requests.splice(0);
const second = await persisted().query({ query: STOCK, variables: { id: inventoryId } });
const secondRequests = requests.splice(0);

const out = {
  getMethods,
  read: read.data,
  take: take.data?.reserve ?? null,
  persistedFirst: { data: first.data, requests: firstRequests },
  persistedSecond: { data: second.data, requests: secondRequests },
};
process.stdout.write(`${JSON.stringify(out)}\n`);
