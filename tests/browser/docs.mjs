// The Swagger UI at /docs, in a real browser and offline.
//
// Headless Debian Chromium (driven by playwright-core, no downloaded browser) opens ${BERTH_URL}/docs with
// every non-loopback request aborted, authorizes with ${BERTH_TOKEN}, runs "Try it out" on
// GET /api/v1/workspaces and waits for a 200 whose body names the workspace created beforehand through
// the API. Fails if the page tried to reach anything beyond loopback, or logged a significant console
// error. A full-page screenshot goes to ${ARTIFACT_DIR:-target/ci-artifacts}/docs-try-it-out.png (on
// failure: docs-try-it-out-failed.png).
//
// Environment: BERTH_URL (e.g. http://127.0.0.1:8080), BERTH_TOKEN (a token with tasks:read and
// tasks:write, e.g. admin), optionally ARTIFACT_DIR, CHROMIUM (default /usr/bin/chromium) and
// DOCS_TIMEOUT_MS (the whole run's deadline, default 90000).
//
// Usually run by .ci/browser, which starts a server and mints the token.

import { mkdtemp, mkdir, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { randomBytes } from 'node:crypto';
import { chromium } from 'playwright-core';
import { guardOffline } from './offline.mjs';

const BERTH_URL = (process.env.BERTH_URL ?? '').replace(/\/+$/, '');
const TOKEN = process.env.BERTH_TOKEN ?? '';
const CHROMIUM = process.env.CHROMIUM || '/usr/bin/chromium';
const ARTIFACT_DIR = process.env.ARTIFACT_DIR || 'target/ci-artifacts';
const DEADLINE_MS = Number(process.env.DOCS_TIMEOUT_MS || 90_000);
const STEP_MS = 15_000; // any single UI step (a click, a dialog, the page load)
const RESPONSE_MS = 30_000; // "Execute" until the live response shows its status

if (!BERTH_URL || !TOKEN) {
  console.error('docs.mjs: BERTH_URL and BERTH_TOKEN must be set');
  process.exit(2);
}

const started = Date.now();
const log = (msg) => console.log(`[docs ${((Date.now() - started) / 1000).toFixed(1)}s] ${msg}`);


// Console messages that are not a defect of the page: none are expected, but Chromium reports an
// aborted request (ours, recorded separately as an external request) as a console error.
const IGNORED_CONSOLE = [/net::ERR_FAILED/, /net::ERR_BLOCKED_BY_CLIENT/];

// Creates a workspace through the API (not the UI) so the list the UI fetches is non-empty.
async function createWorkspace(name) {
  const res = await fetch(`${BERTH_URL}/api/v1/workspaces`, {
    method: 'POST',
    headers: { Authorization: `Bearer ${TOKEN}`, 'Content-Type': 'application/json' },
    body: JSON.stringify({ name }),
    signal: AbortSignal.timeout(STEP_MS),
  });
  const body = await res.text();
  if (res.status !== 201) throw new Error(`POST /api/v1/workspaces: ${res.status} ${body}`);
  return JSON.parse(body);
}

async function main() {
  const wsName = `ci-browser-${randomBytes(4).toString('hex')}`;
  const ws = await createWorkspace(wsName);
  log(`created workspace ${wsName} (${ws.id}) through the API`);

  await mkdir(ARTIFACT_DIR, { recursive: true });
  const userDataDir = await mkdtemp(path.join(tmpdir(), 'berth-chromium-'));
  const external = new Set(); // non-loopback requests the page tried (all aborted)
  const consoleErrors = []; // significant console errors and uncaught page errors
  const ignoredConsole = [];
  const apiRequests = []; // what "Execute" actually sent

  const context = await chromium.launchPersistentContext(userDataDir, {
    executablePath: CHROMIUM,
    headless: true,
    args: [
      '--headless',
      '--no-sandbox',
      '--disable-gpu',
      '--disable-background-networking',
      '--disable-quic',
      '--no-first-run',
      '--disable-component-update',
      '--disable-sync',
    ],
    viewport: { width: 1280, height: 900 },
    serviceWorkers: 'block',
    timeout: STEP_MS,
  });
  let page;
  let ok = false;
  try {
    // Abort everything that would leave the machine, and remember it: the page must work offline.
    await guardOffline(context, external);

    page = context.pages()[0] ?? (await context.newPage());
    page.setDefaultTimeout(STEP_MS);
    page.on('console', (msg) => {
      if (msg.type() !== 'error') return;
      const text = `${msg.text()} @ ${msg.location()?.url ?? '?'}`;
      (IGNORED_CONSOLE.some((re) => re.test(text)) ? ignoredConsole : consoleErrors).push(text);
    });
    page.on('pageerror', (err) => consoleErrors.push(`uncaught: ${err.message}`));
    page.on('request', (req) => {
      const u = new URL(req.url());
      if (u.pathname === '/api/v1/workspaces' && req.method() === 'GET') {
        apiRequests.push({ url: req.url(), authorization: req.headers()['authorization'] ?? null });
      }
    });

    // The page and the spec.
    const docs = `${BERTH_URL}/docs`;
    const resp = await page.goto(docs, { waitUntil: 'load' });
    if (!resp || !resp.ok()) throw new Error(`GET ${docs}: ${resp ? resp.status() : 'no response'}`);
    log(`opened ${page.url()}`);
    const op = page.locator('#operations-workspaces-listWorkspaces');
    await op.waitFor({ state: 'visible' });
    log('the spec rendered (GET /api/v1/workspaces is listed)');

    // Authorize with the bearer token.
    await page.locator('.auth-wrapper button.authorize').click();
    const modal = page.locator('.dialog-ux .modal-ux');
    await modal.waitFor({ state: 'visible' });
    // The bearer scheme's form (the spec also describes the stream's `ticket` query scheme).
    const bearer = modal.locator('.auth-container', { hasText: 'bearer' }).first();
    await bearer.locator('input').first().fill(TOKEN);
    await bearer.locator('button.modal-btn.authorize').click();
    // Once authorized the dialog offers "Logout" instead of "Authorize".
    await modal.locator('button.modal-btn.auth', { hasText: 'Logout' }).waitFor({ state: 'visible' });
    await modal.locator('button.btn-done').first().click();
    await modal.waitFor({ state: 'detached' });
    await page.locator('.auth-wrapper button.authorize.locked').waitFor({ state: 'visible' });
    log('authorized');

    // Try it out.
    await op.locator('.opblock-summary-control').click();
    await op.locator('button.try-out__btn').click();
    await op.locator('button.execute').click();
    log('executed GET /api/v1/workspaces');
    const status = op.locator('.live-responses-table .response .response-col_status').first();
    await status.waitFor({ state: 'visible', timeout: RESPONSE_MS });
    // The status cell may render before its final text; wait for a number.
    await page.waitForFunction(
      (el) => /\d{3}/.test(el.textContent ?? ''),
      await status.elementHandle(),
      { timeout: RESPONSE_MS },
    );
    const statusText = (await status.textContent()).trim();
    const body = (await op.locator('.live-responses-table .response .response-col_description').first().innerText()).trim();
    if (!/^200\b/.test(statusText)) {
      throw new Error(`"Try it out" showed status ${JSON.stringify(statusText)}; body: ${body.slice(0, 2000)}`);
    }
    if (!body.includes(wsName)) throw new Error(`the 200 body does not name ${wsName}: ${body.slice(0, 2000)}`);
    log(`response status ${statusText}; body names ${wsName}`);

    // What "Execute" sent: the spec's server is this origin, and the token went along.
    if (apiRequests.length === 0) throw new Error('no GET /api/v1/workspaces request was seen');
    const sent = apiRequests.at(-1);
    if (!sent.url.startsWith(`${BERTH_URL}/api/v1/workspaces`)) throw new Error(`request went to ${sent.url}`);
    if (sent.authorization !== `Bearer ${TOKEN}`) {
      throw new Error(`request Authorization header: ${sent.authorization === null ? 'missing' : 'not the token'}`);
    }
    log(`request went to ${sent.url} with the bearer token`);

    // Let anything the page would still fetch (badges, fonts, late scripts) show up, then judge.
    await page.waitForLoadState('networkidle', { timeout: 5_000 }).catch(() => {});
    if (external.size) {
      throw new Error(`the page tried to reach beyond loopback (blocked):\n  ${[...external].join('\n  ')}`);
    }
    if (consoleErrors.length) throw new Error(`console errors:\n  ${consoleErrors.join('\n  ')}`);
    if (ignoredConsole.length) log(`ignored console errors:\n  ${ignoredConsole.join('\n  ')}`);

    const shot = path.join(ARTIFACT_DIR, 'docs-try-it-out.png');
    await status.scrollIntoViewIfNeeded();
    await page.screenshot({ path: shot, fullPage: true });
    log(`screenshot: ${shot}`);
    ok = true;
  } finally {
    if (!ok) {
      if (external.size) console.error(`non-loopback requests (blocked):\n  ${[...external].join('\n  ')}`);
      if (consoleErrors.length) console.error(`console errors:\n  ${consoleErrors.join('\n  ')}`);
      if (page) {
        const shot = path.join(ARTIFACT_DIR, 'docs-try-it-out-failed.png');
        await page.screenshot({ path: shot, fullPage: true }).then(
          () => console.error(`failure screenshot: ${shot}`),
          () => {},
        );
      }
    }
    await context.close().catch(() => {});
    await rm(userDataDir, { recursive: true, force: true }).catch(() => {});
  }
}

const deadline = setTimeout(() => {
  console.error(`docs.mjs: FAILED: no result within ${DEADLINE_MS} ms`);
  process.exit(1);
}, DEADLINE_MS);
deadline.unref();

main().then(
  () => {
    log('PASS: /docs authorized and ran GET /api/v1/workspaces offline with a 200');
    process.exit(0);
  },
  (err) => {
    console.error(`docs.mjs: FAILED: ${err.stack ?? err}`);
    process.exit(1);
  },
);
