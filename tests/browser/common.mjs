// What the board's browser checks share (board.mjs, acp.mjs): the API with the admin token, a deadline
// per step, a git repository of their own, and a headless Chromium that may not leave loopback and
// whose console errors fail the run.
import { execFileSync } from 'node:child_process';
import { mkdtemp, mkdir, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { chromium } from 'playwright-core';
import { guardOffline } from './offline.mjs';

export const BERTH_URL = (process.env.BERTH_URL ?? '').replace(/\/+$/, '');
export const TOKEN = process.env.BERTH_TOKEN ?? '';
export const REPO_DIR = process.env.BOARD_REPO_DIR ?? '';
const CHROMIUM = process.env.CHROMIUM || '/usr/bin/chromium';
export const ARTIFACT_DIR = process.env.ARTIFACT_DIR || 'target/ci-artifacts';
export const STEP_MS = 20_000; // any single UI step

const started = Date.now();
export const logger = (name) => (msg) => console.log(`[${name} ${((Date.now() - started) / 1000).toFixed(1)}s] ${msg}`);

// Chromium reports an aborted request (recorded separately) as a console error; a 4xx the board shows in
// place (a 409 it answers with the consent flow, say, or a 503 node_unavailable it offers to retry) is
// logged as "Failed to load resource".
const IGNORED_CONSOLE = [/net::ERR_FAILED/, /net::ERR_BLOCKED_BY_CLIENT/, /Failed to load resource: the server responded with a status of (4\d\d|503)/];

export async function api(method, p, body) {
  const res = await fetch(`${BERTH_URL}/api/v1${p}`, {
    method,
    headers: { Authorization: `Bearer ${TOKEN}`, 'Content-Type': 'application/json' },
    body: body === undefined ? undefined : JSON.stringify(body),
    signal: AbortSignal.timeout(STEP_MS),
  });
  const text = await res.text();
  if (!res.ok) throw new Error(`${method} ${p}: ${res.status} ${text}`);
  return text ? JSON.parse(text) : null;
}

/** `promise`, or a failure naming `what` after `ms`. */
export function within(promise, ms, what) {
  let timer;
  const late = new Promise((_, reject) => { timer = setTimeout(() => reject(new Error(`${what} (within ${ms} ms)`)), ms); });
  return Promise.race([promise, late]).finally(() => clearTimeout(timer));
}

function git(cwd, ...args) {
  execFileSync('git', args, {
    cwd,
    stdio: ['ignore', 'ignore', 'inherit'],
    env: { ...process.env, GIT_AUTHOR_NAME: 'ci', GIT_AUTHOR_EMAIL: 'ci@localhost', GIT_COMMITTER_NAME: 'ci', GIT_COMMITTER_EMAIL: 'ci@localhost' },
  });
}

/** A git repository with one commit on `main`, inside BOARD_REPO_DIR. */
export async function makeRepository(name) {
  const dir = path.join(REPO_DIR, name);
  await mkdir(dir, { recursive: true });
  git(dir, 'init', '-q', '-b', 'main');
  await writeFile(path.join(dir, 'README.md'), '# board test\n');
  git(dir, 'add', 'README.md');
  git(dir, 'commit', '-q', '-m', 'first');
  return dir;
}

/**
 * Runs `body(browser)` in a fresh headless Chromium: `browser` has `context`, `page`, `shot(name)` (a
 * screenshot `<prefix>-<name>.png`), `external` (requests beyond loopback, all blocked) and
 * `consoleErrors`. Fails when `body` does, when the page tried to leave loopback or logged an error; on
 * failure it prints what the page showed and keeps a `<prefix>-failed.png`.
 */
export async function inBrowser(prefix, log, body) {
  await mkdir(ARTIFACT_DIR, { recursive: true });
  const userDataDir = await mkdtemp(path.join(tmpdir(), 'berth-chromium-'));
  const external = new Set();
  const consoleErrors = [];
  const ignoredConsole = [];
  const context = await chromium.launchPersistentContext(userDataDir, {
    executablePath: CHROMIUM,
    headless: true,
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-background-networking', '--disable-quic', '--no-first-run', '--disable-component-update', '--disable-sync'],
    viewport: { width: 1280, height: 800 },
    serviceWorkers: 'block',
    timeout: STEP_MS,
  });
  const b = { context, page: null, external, consoleErrors };
  b.shot = async (name) => {
    const file = path.join(ARTIFACT_DIR, `${prefix}-${name}.png`);
    await b.page.screenshot({ path: file, fullPage: true });
    log(`screenshot: ${file}`);
  };
  let ok = false;
  try {
    // Abort everything that would leave the machine, and remember it: the page must work offline.
    await guardOffline(context, external);
    b.page = context.pages()[0] ?? (await context.newPage());
    b.page.setDefaultTimeout(STEP_MS);
    b.page.on('console', (msg) => {
      if (msg.type() !== 'error') return;
      const text = `${msg.text()} @ ${msg.location()?.url ?? '?'}`;
      (IGNORED_CONSOLE.some((re) => re.test(text)) ? ignoredConsole : consoleErrors).push(text);
    });
    b.page.on('pageerror', (err) => consoleErrors.push(`uncaught: ${err.message}`));
    b.page.on('dialog', (d) => {
      consoleErrors.push(`the page opened a ${d.type()} dialog: ${d.message()}`);
      d.dismiss().catch(() => {});
    });
    await body(b);
    await b.page.waitForLoadState('networkidle', { timeout: 3_000 }).catch(() => {});
    if (external.size) throw new Error(`the page tried to reach beyond loopback (blocked):\n  ${[...external].join('\n  ')}`);
    if (consoleErrors.length) throw new Error(`console errors:\n  ${consoleErrors.join('\n  ')}`);
    if (ignoredConsole.length) log(`ignored console messages:\n  ${ignoredConsole.join('\n  ')}`);
    ok = true;
  } finally {
    if (!ok) {
      if (external.size) console.error(`non-loopback requests (blocked):\n  ${[...external].join('\n  ')}`);
      if (consoleErrors.length) console.error(`console errors:\n  ${consoleErrors.join('\n  ')}`);
      if (b.page) {
        // What the page showed (a problem box says why an action failed), for a run without the picture.
        const shown = await b.page.locator('main').innerText({ timeout: 2_000 }).catch(() => '(unreadable)');
        console.error(`the page showed:\n  ${shown.slice(0, 1500).replace(/\n+/g, '\n  ')}`);
        const file = path.join(ARTIFACT_DIR, `${prefix}-failed.png`);
        await b.page.screenshot({ path: file, fullPage: true }).then(() => console.error(`failure screenshot: ${file}`), () => {});
      }
    }
    await context.close().catch(() => {});
    await rm(userDataDir, { recursive: true, force: true }).catch(() => {});
  }
}

/** Runs `main` under a whole-run deadline; exits 0 with `pass` or 1 with the failure. */
export function run(name, deadlineMs, main, pass) {
  const deadline = setTimeout(() => {
    console.error(`${name}: FAILED: no result within ${deadlineMs} ms`);
    process.exit(1);
  }, deadlineMs);
  deadline.unref();
  main().then(
    () => {
      logger(name)(`PASS: ${pass}`);
      process.exit(0);
    },
    (err) => {
      console.error(`${name}: FAILED: ${err.stack ?? err}`);
      process.exit(1);
    },
  );
}
