// What agents spent, and browser notifications (issue 42 item 4), in a real browser and offline.
//
// Through the API: a workspace, a repository, a task and an idle session of the test agent. Then, in the
// board, with the notification permission granted and `window.Notification` replaced by a recorder (a
// headless Chromium shows none): the workspace page says nothing was spent; the session page shows no
// usage; the message `usage 1200 340 0.0042` makes the test agent report 1200 input and 340 output tokens
// costing $0.0042 (model `liar-1`), and the session page shows them once the turn ends; the task page
// shows the cost in its header; the workspace page shows it on the task's card, as its 30 days' total, as
// one bar of the cost chart (named by its day and amount) and as the row of `liar-1` in the table by
// model. Then `hello`, sent through the API while the workspace page shows, ends a turn: a notification
// names the session and its task, and its click opens the session page; `ask` makes one saying the
// session needs attention. The "Enable notifications" button stays hidden (the permission is granted).
//
// Environment: as board.mjs (BERTH_URL, BERTH_TOKEN, BOARD_REPO_DIR); USAGE_TIMEOUT_MS (default 120000).
import { randomBytes } from 'node:crypto';
import { BERTH_URL, REPO_DIR, TOKEN, api, inBrowser, logger, makeRepository, run } from './common.mjs';

const DEADLINE_MS = Number(process.env.USAGE_TIMEOUT_MS || 120_000);
const TURN_MS = 30_000;

if (!BERTH_URL || !TOKEN || !REPO_DIR) {
  console.error('usage.mjs: BERTH_URL, BERTH_TOKEN and BOARD_REPO_DIR must be set');
  process.exit(2);
}
const log = logger('usage');

/** Waits until `probe()` returns something truthy, or fails naming `what`. */
async function until(what, probe, ms = TURN_MS) {
  const end = Date.now() + ms;
  for (;;) {
    const v = await probe();
    if (v) return v;
    if (Date.now() > end) throw new Error(`never: ${what}`);
    await new Promise((r) => setTimeout(r, 150));
  }
}

/** In the page, before its scripts: every notification it makes lands in `window.__notes`. */
function recordNotifications() {
  window.__notes = [];
  class Recorded extends EventTarget {
    static permission = 'granted';
    static requestPermission() {
      return Promise.resolve('granted');
    }
    constructor(title, options = {}) {
      super();
      Object.assign(this, { title, body: options.body ?? '', tag: options.tag ?? '', onclick: null, closed: false });
      window.__notes.push(this);
    }
    close() {
      this.closed = true;
    }
  }
  window.Notification = Recorded;
}

async function main() {
  const suffix = randomBytes(4).toString('hex');
  const ws = await api('POST', '/workspaces', { name: `usage-${suffix}` });
  const repo = await api('POST', `/workspaces/${ws.id}/repositories`, { path: await makeRepository(`usage-${suffix}`) });
  const task = await api('POST', `/workspaces/${ws.id}/tasks`, { title: 'Usage task', repositories: [{ repository_id: repo.id }] });
  const session = await api('POST', `/tasks/${task.id}/sessions`, { executor_type: 'worktree', agent_profile: 'test', name: 'spender' });
  await until('the session is idle', async () => (await api('GET', `/sessions/${session.id}`)).state === 'idle');
  log(`task ${task.id}, session ${session.id} of the test agent, idle (through the API)`);

  await inBrowser('usage', log, async ({ context, page, shot }) => {
    await context.grantPermissions(['notifications'], { origin: BERTH_URL });
    await page.addInitScript(recordNotifications);
    await page.goto(`${BERTH_URL}/ui#/w/${ws.id}`, { waitUntil: 'load' });
    await page.locator('#token').fill(TOKEN);
    await page.getByRole('button', { name: 'Sign in' }).click();
    await page.getByRole('heading', { name: ws.name, level: 1 }).waitFor();
    await page.locator('#usage-empty', { hasText: 'No usage reported in the last 30 days.' }).waitFor();
    if (!(await page.locator('#notify').isHidden())) throw new Error('"Enable notifications" shows though the permission is granted');

    // 1. The session page: nothing spent yet; after the usage turn, its tokens and cost.
    await page.evaluate((id) => { location.hash = `#/s/${id}`; }, session.id);
    await page.getByRole('heading', { name: 'spender', level: 1 }).waitFor();
    const usage = page.locator('#session-usage');
    await usage.locator('[data-kind="input"][data-value="0"]').waitFor();
    await page.locator('#message-text').fill('usage 1200 340 0.0042');
    await page.getByRole('button', { name: 'Send', exact: true }).click();
    await usage.locator('[data-kind="input"][data-value="1200"]').waitFor({ timeout: TURN_MS });
    const input = await usage.locator('[data-kind="input"]').innerText();
    if (!/^1\D?200 in$/.test(input)) throw new Error(`the input tokens read "${input}"`);
    await usage.locator('[data-kind="output"][data-value="340"]').waitFor();
    await usage.locator('.cost', { hasText: '$0.0042' }).waitFor();
    const told = await api('GET', `/sessions/${session.id}`);
    if (told.usage?.input_tokens !== 1200) throw new Error(`berth's session usage: ${JSON.stringify(told.usage)}`);
    await shot('1-session');
    log('the session page shows 1200 input and 340 output tokens and $0.0042');

    // 2. The task page: the cost in its header.
    await page.evaluate((id) => { location.hash = `#/t/${id}`; }, task.id);
    await page.getByRole('heading', { name: 'Usage task', level: 1 }).waitFor();
    await page.locator('#task-usage .cost', { hasText: '$0.0042' }).waitFor();
    await page.locator('#task-usage [data-kind="input"][data-value="1200"]').waitFor();
    await shot('2-task');
    log('the task page shows $0.0042');

    // 3. The workspace page: the card's label, the 30 days' total, one bar for the day, a row for liar-1.
    const days = await api('GET', `/workspaces/${ws.id}/usage`);
    if (days.groups.length !== 1) throw new Error(`berth's days: ${JSON.stringify(days.groups)}`);
    const day = days.groups[0].key;
    await page.evaluate((id) => { location.hash = `#/w/${id}`; }, ws.id);
    await page.getByRole('heading', { name: ws.name, level: 1 }).waitFor();
    await page.locator(`.task-card[data-task-id="${task.id}"] .card-cost`, { hasText: '$0.0042' }).waitFor();
    await page.locator('#usage-total .cost', { hasText: '$0.0042' }).waitFor();
    const bar = page.locator(`#usage-chart rect.bar[data-day="${day}"]`);
    await bar.waitFor();
    const bars = await page.locator('#usage-chart rect.bar').count();
    if (bars !== 1) throw new Error(`the chart has ${bars} bars`);
    const said = await page.locator('#usage-chart g[role="listitem"]').getAttribute('aria-label');
    const titled = await page.locator('#usage-chart g[role="listitem"] title').textContent();
    if (!said.startsWith(`${day}: $0.0042`) || titled !== said) throw new Error(`the bar says "${said}", its title "${titled}"`);
    const row = page.locator('#usage-models tbody tr[data-key="liar-1"]');
    await row.locator('td.cost', { hasText: '$0.0042' }).waitFor();
    await row.scrollIntoViewIfNeeded();
    await shot('3-workspace');
    log(`the workspace page shows the cost on the card, one bar (${day}) and liar-1's row`);

    // 4. A turn that ends while the workspace shows: a notification, whose click opens the session. (The
    // usage turn made one already: it is forgotten first, so the one awaited is hello's.)
    await page.waitForFunction(() => window.__notes.length > 0);
    await page.evaluate(() => { window.__notes.length = 0; });
    await api('POST', `/sessions/${session.id}/messages`, { text: 'hello' });
    await page.waitForFunction(() => window.__notes.some((n) => /finished its turn/.test(n.title)), null, { timeout: TURN_MS });
    const note = await page.evaluate(() => {
      const n = window.__notes.find((x) => /finished its turn/.test(x.title));
      return { title: n.title, body: n.body, tag: n.tag };
    });
    if (note.title !== 'spender finished its turn' || !note.body.includes('Usage task')) throw new Error(`the notification: ${JSON.stringify(note)}`);
    await page.evaluate(() => window.__notes.find((x) => /finished its turn/.test(x.title)).onclick());
    await page.waitForFunction((id) => location.hash === `#/s/${id}`, session.id);
    await page.getByRole('heading', { name: 'spender', level: 1 }).waitFor();
    await shot('4-notified');
    log(`notified: "${note.title}" (${note.body}); its click opened the session`);

    // 5. A question from the agent: a notification that the session needs attention.
    await api('POST', `/sessions/${session.id}/messages`, { text: 'ask' });
    await page.waitForFunction(() => window.__notes.some((n) => n.title === 'spender needs your attention'), null, { timeout: TURN_MS });
    log('notified: "spender needs your attention"');
  });
}

run('usage', DEADLINE_MS, main, 'the session, task and workspace pages show the tokens and cost the test agent reported (a bar for the day, a row for liar-1); a finished turn made a notification that opens the session, a question one of its own, offline');
