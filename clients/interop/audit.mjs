// The GraphQL-over-HTTP audit (graphql-http's serverAudits) against a
// running server: `node audit.mjs <graphql-url>`. Prints the counts and
// every audit that did not pass as JSON; exits 1 when a MUST fails.
import { auditServer } from 'graphql-http';

const url = process.argv[2];
if (!url) {
  process.stderr.write('usage: node audit.mjs <graphql-url>\n');
  process.exit(2);
}
const results = await auditServer({ url });
const count = (status) => results.filter((r) => r.status === status).length;
const failed = results
  .filter((r) => r.status !== 'ok')
  .map((r) => ({ id: r.id, name: r.name, status: r.status, reason: r.reason }));
process.stdout.write(
  `${JSON.stringify({ total: results.length, ok: count('ok'), warn: count('warn'), error: count('error'), failed })}\n`,
);
process.exit(count('error') > 0 ? 1 : 0);
