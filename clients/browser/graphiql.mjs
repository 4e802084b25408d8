#!/usr/bin/env node
// Drives Stockguard's GraphiQL page in a real (Debian) Chromium, as a person
// would: the page must open on Stockguard's example operations (a fresh
// browser has no stored tabs), then the bearer token typed into the Headers
// tab, a `reserve` mutation
// typed into the query editor, the run button clicked, the answer read back
// from the result pane.
//
//   node graphiql.mjs <server-url> <token> <inventory-id> <screenshot.png>
//
// or the same four through GRAPHIQL_URL, GRAPHIQL_TOKEN, GRAPHIQL_INVENTORY_ID
// and GRAPHIQL_SCREENSHOT. CHROMIUM_PATH overrides /usr/bin/chromium.
//
// The page must need nothing but the server: every request for anywhere
// else is refused and fails the run, and so does any Content-Security-Policy
// violation the browser reports.
//
// Success: the result pane's JSON on stdout, exit 0. Failure: a message on
// stderr, exit 1.

import { mkdir } from 'node:fs/promises';
import { dirname, resolve } from 'node:path';
import { chromium } from 'playwright-core';

const [argUrl, argToken, argId, argShot] = process.argv.slice(2);
const serverUrl = argUrl ?? process.env.GRAPHIQL_URL;
const token = argToken ?? process.env.GRAPHIQL_TOKEN;
const inventoryId = argId ?? process.env.GRAPHIQL_INVENTORY_ID;
const screenshot = argShot ?? process.env.GRAPHIQL_SCREENSHOT;
const executablePath = process.env.CHROMIUM_PATH ?? '/usr/bin/chromium';
// Everything, Chromium's start included, must finish within this.
const overallMs = Number(process.env.GRAPHIQL_TIMEOUT_MS ?? 90_000);
// One step (the page rendering, the answer arriving) within this.
const stepMs = 30_000;

function fail(message) {
  process.stderr.write(`graphiql.mjs: ${message}\n`);
  process.exit(1);
}

if (!serverUrl || !token || !inventoryId || !screenshot) {
  fail('usage: node graphiql.mjs <server-url> <token> <inventory-id> <screenshot.png>');
}

const origin = new URL(serverUrl).origin;
const headersText = `{"Authorization": "Bearer ${token}"}`;
const queryText =
  `mutation { reserve(input: {inventoryId: "${inventoryId}", quantity: 1}) ` +
  '{ __typename ... on Reserved { reservation { id quantity } inventory { stock version } } } }';

// CodeMirror 5 keeps its instance on the wrapper element.
function editorValue(page, selector) {
  return page.evaluate((sel) => {
    const el = document.querySelector(sel);
    return el?.CodeMirror ? el.CodeMirror.getValue() : el?.innerText ?? null;
  }, selector);
}

// Types `text` into a CodeMirror as a person would (click, select all, type).
// CodeMirror's bracket closing may change what lands; if it did, the value is
// set through the CodeMirror instance instead, so the run never depends on
// editor quirks. Returns how the text got there.
async function enter(page, selector, text) {
  const editor = page.locator(selector).first();
  await editor.waitFor({ state: 'visible', timeout: stepMs });
  await editor.click();
  await page.keyboard.press('ControlOrMeta+A');
  await page.keyboard.type(text);
  const norm = (s) => (s ?? '').replace(/\s+/g, ' ').trim();
  if (norm(await editorValue(page, selector)) === norm(text)) return 'typed';
  await page.evaluate(
    ([sel, value]) => document.querySelector(sel).CodeMirror.setValue(value),
    [selector, text],
  );
  if (norm(await editorValue(page, selector)) !== norm(text)) {
    throw new Error(`could not put the text into ${selector}`);
  }
  return 'set';
}

async function main() {
  await mkdir(dirname(resolve(screenshot)), { recursive: true });
  const browser = await chromium.launch({
    executablePath,
    args: [
      '--headless',
      '--no-sandbox',
      '--disable-gpu',
      '--disable-quic',
      '--no-first-run',
      '--disable-background-networking',
      '--disable-component-update',
      '--disable-sync',
    ],
  });
  try {
    const context = await browser.newContext({ viewport: { width: 1400, height: 900 } });
    const page = await context.newPage();
    const problems = [];
    page.on('pageerror', (error) => problems.push(`page error: ${error.message}`));
    page.on('console', (msg) => {
      if (msg.type() !== 'error') return;
      const text = msg.text().split('\n')[0];
      process.stderr.write(`browser console: ${text}\n`);
      if (/Content Security Policy|Refused to/i.test(text)) problems.push(`CSP: ${text}`);
    });

    // Nothing but the server: anything else is refused and counted.
    const outside = [];
    await context.route('**/*', async (route) => {
      const url = new URL(route.request().url());
      if (url.origin === origin || url.protocol === 'data:') return route.continue();
      outside.push(url.href);
      return route.abort('blockedbyclient');
    });

    await page.goto(new URL('/', serverUrl).href, { waitUntil: 'load', timeout: stepMs });

    const query = '.graphiql-query-editor .CodeMirror';
    const run = '.graphiql-execute-button';
    try {
      await page.locator(query).waitFor({ state: 'visible', timeout: stepMs });
      await page.locator(run).waitFor({ state: 'visible', timeout: stepMs });
    } catch (error) {
      throw new Error(`GraphiQL did not render (${[...problems, error.message].join('; ')})`);
    }

    // A fresh browser opens on Stockguard's examples, not GraphiQL's welcome text.
    const opened = (await editorValue(page, query)) ?? '';
    for (const operation of ['query ListStock', 'mutation TransferStock', 'mutation ReserveAcrossLocations']) {
      if (!opened.includes(operation)) {
        throw new Error(`the query editor did not open on the examples (no ${operation}): ${opened.slice(0, 200)}`);
      }
    }

    // The Headers tab, then its editor (the visible one under the tabs).
    await page.locator('.graphiql-editor-tools button', { hasText: /^Headers$/ }).click();
    const headers = 'section.graphiql-editor-tool[aria-label="Headers"] .graphiql-editor:not(.hidden) .CodeMirror';
    const headersHow = await enter(page, headers, headersText);
    const queryHow = await enter(page, query, queryText);
    process.stderr.write(`headers ${headersHow}, query ${queryHow}\n`);
    // Prettify (query, variables and headers), as a person would before a
    // screenshot, and show each editor from its start.
    const prettify = page.locator('.graphiql-toolbar-button[aria-label^="Prettify"]');
    if (await prettify.count()) await prettify.first().click();
    await page.evaluate((sels) => {
      for (const sel of sels) document.querySelector(sel)?.CodeMirror?.scrollTo(0, 0);
    }, [query, headers]);

    // The pane may already show something (GraphiQL shows the schema fetch's
    // error there): wait for this request's answer, then for the pane to
    // show exactly that answer.
    const result = '.result-window .CodeMirror';
    const answered = page.waitForResponse(
      (r) => r.url().startsWith(origin) && (r.request().postData() ?? '').includes('reserve('),
      { timeout: stepMs },
    );
    // GraphiQL takes in an edit after a pause, then saves its tabs; until
    // it has, it still holds the examples' several operations and a click
    // on run only offers to pick one. Its saved tabs holding the typed
    // query say it has taken the edit in.
    await page.waitForFunction(
      (id) => Object.keys(localStorage).some((k) => k.includes('tabState') && localStorage.getItem(k).includes(id)),
      inventoryId,
      { timeout: stepMs, polling: 50 },
    );
    await page.locator(run).click();
    let answer;
    try {
      answer = await answered;
    } catch {
      throw new Error(`no reserve request answered within ${stepMs} ms (${problems.join('; ') || 'no page errors'})`);
    }
    const sentAuthorization = (await answer.request().allHeaders()).authorization ?? null;
    const expected = JSON.stringify(await answer.json());
    try {
      await page.waitForFunction(
        ([sel, want]) => {
          const el = document.querySelector(sel);
          const text = el?.CodeMirror ? el.CodeMirror.getValue() : el?.innerText ?? '';
          try {
            return JSON.stringify(JSON.parse(text)) === want;
          } catch {
            return false;
          }
        },
        [result, expected],
        { timeout: stepMs, polling: 100 },
      );
    } catch {
      const shown = (await editorValue(page, result)) ?? '(no result pane)';
      throw new Error(`the result pane never showed the answer ${expected}; it shows: ${shown.replace(/\s+/g, ' ')}`);
    }
    const shown = (await editorValue(page, result)) ?? '';
    if (!/"__typename":\s*"Reserved"/.test(shown)) {
      await page.screenshot({ path: screenshot, fullPage: true }).catch(() => {});
      throw new Error(`the result pane does not say Reserved; it shows: ${shown.replace(/\s+/g, ' ')}`);
    }
    if (sentAuthorization !== `Bearer ${token}`) {
      throw new Error(`the reserve request carried Authorization ${JSON.stringify(sentAuthorization)}, not the typed token`);
    }

    let body;
    try {
      body = JSON.parse(shown);
    } catch (error) {
      throw new Error(`the result pane is not JSON (${error.message}): ${shown}`);
    }
    if (outside.length > 0) throw new Error(`the page asked for outside addresses: ${outside.join(', ')}`);
    if (problems.length > 0) throw new Error(problems.join('; '));
    await page.screenshot({ path: screenshot, fullPage: true });
    process.stdout.write(`${JSON.stringify(body)}\n`);
  } finally {
    await browser.close();
  }
}

const timer = setTimeout(() => fail(`gave up after ${overallMs} ms`), overallMs);
timer.unref();
main().then(
  () => process.exit(0),
  (error) => fail(error?.message ?? String(error)),
);
