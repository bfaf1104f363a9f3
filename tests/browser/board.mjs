// The board at /ui, in a real browser and offline (issue 16, item 7).
//
// Headless Debian Chromium (driven by playwright-core, no downloaded browser) with every non-loopback
// request aborted. Through the API the script creates a workspace and registers a git repository it
// made itself; then, in the board: paste the token, open the workspace, create a task, start a session
// with the `test` agent profile (berth-test-agent), send a message and watch the agent's text grow live
// in the transcript (a streaming bubble holding part of the text before the whole of it), answer the
// agent's confirm question in place, stop and delete the session, archive the task and see its cleanup
// job succeed. A `#token=` fragment is taken and removed from the address bar at once; nothing lands in
// local storage. Fails on any request beyond loopback, any console error or uncaught page error. A
// screenshot of each screen goes to ${ARTIFACT_DIR:-target/ci-artifacts}/board-*.png (on failure:
// board-failed.png).
//
// Environment: BERTH_URL, BERTH_TOKEN (admin), BOARD_REPO_DIR (a directory inside BERTH_REPO_ROOTS for
// the repository), optionally ARTIFACT_DIR, CHROMIUM (default /usr/bin/chromium) and BOARD_TIMEOUT_MS
// (the whole run's deadline, default 180000). Usually run by .ci/browser, which starts a server with an
// agent profile `test` and mints the token.

import { execFileSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { stat } from 'node:fs/promises';
import { join } from 'node:path';
import { BERTH_URL, REPO_DIR, STEP_MS, TOKEN, api, inBrowser, logger, makeRepository, run, within } from './common.mjs';

const DEADLINE_MS = Number(process.env.BOARD_TIMEOUT_MS || 180_000);
const JOB_MS = 60_000; // a cleanup job until it succeeds

if (!BERTH_URL || !TOKEN || !REPO_DIR) {
  console.error('board.mjs: BERTH_URL, BERTH_TOKEN and BOARD_REPO_DIR must be set');
  process.exit(2);
}
const log = logger('board');

/** A task whose worktree holds an uncommitted file (`dirty.txt`): a session whose agent wrote it, stopped. */
async function dirty(ws, repo, title) {
  const task = await api('POST', `/workspaces/${ws.id}/tasks`, { title, repositories: [{ repository_id: repo.id }] });
  const writer = await api('POST', `/tasks/${task.id}/sessions`, { executor_type: 'worktree', agent_profile: 'test', prompt: 'write dirty.txt uncommitted' });
  const until = Date.now() + 30_000;
  for (;;) {
    const snap = await api('GET', `/sessions/${writer.id}/snapshot`);
    if (snap.state === 'idle' && snap.transcript.some((t) => t.role === 'assistant')) break;
    if (Date.now() > until) throw new Error(`the writing session did not finish: ${snap.state}`);
    await new Promise((r) => setTimeout(r, 200));
  }
  await api('POST', `/sessions/${writer.id}/stop`);
  return task;
}

/** Points an environment at a node no instance holds, in the server's SQLite database (step 11). */
function movedToGoneNode(environmentId) {
  const db = join(process.env.BERTH_DATA_DIR, 'berth.db');
  const script = [
    'import sqlite3, sys',
    'c = sqlite3.connect(sys.argv[1], timeout=30)',
    'hexid = sys.argv[2].replace("-", "").upper()',
    'n = c.execute("UPDATE task_environments SET node_id = \'node-gone\' WHERE id = ? OR hex(id) = ?", (sys.argv[2], hexid)).rowcount',
    'c.commit()',
    'sys.exit(0 if n == 1 else 1)',
  ].join('\n');
  execFileSync('python3', ['-c', script, db, environmentId], { stdio: 'inherit' });
}

async function main() {
  const suffix = randomBytes(4).toString('hex');
  const ws = await api('POST', '/workspaces', { name: `board-${suffix}` });
  const repoPath = await makeRepository(`repo-${suffix}`);
  const repo = await api('POST', `/workspaces/${ws.id}/repositories`, { path: repoPath });
  log(`workspace ${ws.name} with repository ${repo.name} (through the API)`);

  await inBrowser('board', log, async ({ context, page, shot }) => {
    // 1. Sign in: a wrong token is refused in place, then the real one is accepted.
    const resp = await page.goto(`${BERTH_URL}/ui`, { waitUntil: 'load' });
    if (!resp || !resp.ok()) throw new Error(`GET /ui: ${resp ? resp.status() : 'no response'}`);
    const csp = resp.headers()['content-security-policy'] ?? '';
    if (!csp.includes("default-src 'self'")) throw new Error(`/ui Content-Security-Policy: ${csp}`);
    await page.locator('#token').fill('not-a-token');
    await page.getByRole('button', { name: 'Sign in' }).click();
    await page.locator('.problem', { hasText: 'does not accept this token' }).waitFor();
    await shot('1-sign-in');
    await page.locator('#token').fill(TOKEN);
    await page.getByRole('button', { name: 'Sign in' }).click();
    await page.getByRole('heading', { name: 'Workspaces' }).waitFor();
    log('signed in with the pasted token');

    // 2. Workspace: the repository, then a new task.
    await page.getByRole('link', { name: ws.name }).click();
    await page.getByRole('heading', { name: ws.name, level: 1 }).waitFor();
    await page.locator('td', { hasText: repo.name }).first().waitFor();
    await page.locator('#new-task summary').click();
    await page.locator('#task-title').fill('Board task');
    if (!(await page.locator('#pick-0').isChecked())) await page.locator('#pick-0').check();
    await page.locator('#branch-0').fill(`board-${suffix}`);
    await shot('2-workspace');
    await page.getByRole('button', { name: 'Create task' }).click();
    await page.getByRole('heading', { name: 'Board task', level: 1 }).waitFor();
    const taskId = page.url().match(/#\/t\/([0-9a-f-]+)/)?.[1];
    if (!taskId) throw new Error(`not on a task page: ${page.url()}`);
    log(`created task ${taskId} in the board`);

    // 3. Task: a session with the test agent.
    await page.locator('#new-session summary').click();
    await page.locator('#session-profile').selectOption('test');
    await page.locator('#session-executor').selectOption('worktree');
    await page.locator('#session-name').fill('board session');
    await page.getByRole('button', { name: 'Start session' }).click();
    await page.getByRole('heading', { name: 'board session', level: 1 }).waitFor();
    await page.locator('#session-state .badge', { hasText: 'idle' }).waitFor({ timeout: 30_000 });
    log('the session runs the test agent and is idle');

    // 4. Session: the agent's text streams in live (40 deltas at 10 a second: about 4 s).
    await page.locator('#message-text').fill('deltas 40 10');
    await page.getByRole('button', { name: 'Send', exact: true }).click();
    const streaming = page.locator('#transcript .msg.streaming .part.text');
    await page.waitForFunction(() => {
      const el = document.querySelector('#transcript .msg.streaming .part.text');
      return el && /delta 2 /.test(el.textContent) && !/delta 39 /.test(el.textContent);
    }, null, { timeout: 30_000 });
    const partial = (await streaming.textContent()).trim();
    log(`streaming, part of the text so far: ${JSON.stringify(partial.slice(0, 60))}…`);
    await shot('3-session-streaming');
    await page.locator('#transcript .msg.assistant:not(.streaming)', { hasText: 'delta 39' }).waitFor({ timeout: 30_000 });
    const grown = await page.locator('#transcript .msg.assistant', { hasText: 'delta 39' }).count();
    if (grown !== 1) throw new Error(`the finished message shows ${grown} times`);
    log('the whole text arrived, once');

    // 5. An attention request, answered in place.
    await page.locator('#session-state .badge', { hasText: 'idle' }).waitFor();
    await page.locator('#message-text').fill('ask');
    await page.getByRole('button', { name: 'Send', exact: true }).click();
    const question = page.locator('#attention .attention', { hasText: 'Proceed?' });
    await question.waitFor({ timeout: 30_000 });
    await page.locator('#session-state .badge', { hasText: 'attention' }).waitFor();
    await shot('4-session-attention');
    await question.getByRole('button', { name: 'Yes' }).click();
    await page.locator('#transcript .msg.assistant', { hasText: 'answered true' }).waitFor({ timeout: 30_000 });
    await page.locator('#attention .attention').waitFor({ state: 'detached' });
    log('answered the confirm question in place; the agent replied');

    // 6. Stop and delete the session (with a confirmation).
    await page.locator('#session-state .badge', { hasText: 'idle' }).waitFor();
    await page.getByRole('button', { name: 'Stop session' }).click();
    await page.locator('#session-state .badge', { hasText: 'stopped' }).waitFor({ timeout: 30_000 });
    await page.getByRole('button', { name: 'Delete session…' }).click();
    await page.locator('dialog.confirm').getByRole('button', { name: 'Delete session' }).click();
    await page.getByRole('heading', { name: 'Board task', level: 1 }).waitFor();
    await page.locator('text=No session yet.').waitFor();
    log('deleted the session; back on the task');

    // 7. Archive the task; its cleanup job succeeds.
    await page.locator('table.slots').waitFor();
    await shot('5-task');
    await page.getByRole('button', { name: 'Archive task…' }).click();
    const dlg = page.locator('dialog.confirm');
    await dlg.locator('text=branches are kept').waitFor();
    await dlg.getByRole('button', { name: 'Archive task' }).click();
    await page.locator('h1 .badge', { hasText: 'archived' }).waitFor();
    await page.locator('table.jobs tr[data-state="succeeded"]', { hasText: 'archive' }).waitFor({ timeout: JOB_MS });
    log('archived; the cleanup job succeeded');
    await page.getByRole('link', { name: 'Cleanup jobs', exact: true }).click();
    await page.getByRole('heading', { name: 'Cleanup jobs', level: 1 }).waitFor();
    await page.locator('table.jobs tr[data-state="succeeded"]').first().waitFor();
    await shot('6-cleanup-jobs');

    // 8. The workspace shows the task among the archived.
    await page.locator('#crumbs').getByRole('link', { name: 'Workspaces' }).click();
    await page.getByRole('link', { name: ws.name }).click();
    await page.locator('#tasks-archived .task-card', { hasText: 'Board task' }).waitFor();

    // 9. Deleting a task whose worktree holds changes asks for explicit consent, naming the files. The
    // change is made through the API: a session whose agent writes a file, then stopped.
    const dirtyTask = await dirty(ws, repo, 'Dirty task');
    await page.goto(`${BERTH_URL}/ui#/t/${dirtyTask.id}`);
    await page.getByRole('heading', { name: 'Dirty task', level: 1 }).waitFor();
    await page.getByRole('button', { name: 'Delete task…' }).click();
    await page.locator('dialog.confirm').getByRole('button', { name: 'Delete task' }).click();
    const consent = page.locator('dialog.confirm', { hasText: 'uncommitted changes' });
    await consent.locator('code', { hasText: 'dirty.txt' }).waitFor();
    const discard = consent.getByRole('button', { name: 'Delete and discard the changes' });
    if (await discard.isEnabled()) throw new Error('discarding needs no explicit consent');
    await shot('7-delete-consent');
    // The task screen left behind must not draw over the workspace the person went to. Made to happen
    // every time: the delete answers only once the task screen's own refresh (woken by the deletion's
    // events) has asked for the task, and that refresh's 404 comes back only after the workspace is drawn.
    const taskPath = `/api/v1/tasks/${dirtyTask.id}`;
    let deleted = false;
    let staleAsked;
    const staleSeen = new Promise((r) => { staleAsked = r; });
    let releaseStale;
    const staleHeld = new Promise((r) => { releaseStale = r; });
    const isTask = (u) => u.pathname === taskPath;
    await page.route(isTask, async (route) => {
      const req = route.request();
      if (req.method() === 'DELETE') {
        const res = await route.fetch();
        deleted = res.ok();
        if (deleted) await within(staleSeen, STEP_MS, 'the task screen did not refresh after the deletion\'s events');
        return route.fulfill({ response: res });
      }
      if (req.method() === 'GET' && deleted) {
        staleAsked();
        await staleHeld;
      }
      return route.continue();
    });
    await consent.getByRole('checkbox').check();
    await discard.click();
    const wsHeading = page.getByRole('heading', { name: ws.name, level: 1 });
    await wsHeading.waitFor();
    const staleDone = page.waitForEvent('requestfinished', (r) => new URL(r.url()).pathname === taskPath && r.method() === 'GET');
    releaseStale();
    await staleDone;
    // Its answer handled (a few turns of the page's event loop), the workspace is still what shows.
    await page.evaluate(() => new Promise((r) => setTimeout(r, 100)));
    if (await page.getByText('This task is gone').count()) throw new Error('the deleted task\'s screen drew over the workspace');
    await wsHeading.waitFor({ timeout: 1_000 });
    await page.unroute(isTask);
    await api('GET', `/tasks/${dirtyTask.id}`).then(
      () => { throw new Error('the dirty task still exists'); },
      (e) => { if (!/ 404 /.test(e.message)) throw e; },
    );
    log('deleting the dirty task asked for consent, named dirty.txt, then deleted it');

    // 10. Resetting an environment whose worktree holds changes asks for consent the same way; with it, the
    // reset's job removes the worktree and the next session gets a fresh one.
    const resetTask = await dirty(ws, repo, 'Reset task');
    const before = await api('GET', `/tasks/${resetTask.id}/environment`);
    await page.goto(`${BERTH_URL}/ui#/t/${resetTask.id}`);
    await page.getByRole('heading', { name: 'Reset task', level: 1 }).waitFor();
    await page.getByRole('button', { name: 'Reset environment…' }).click();
    const resetDialog = page.locator('dialog.confirm', { hasText: 'Reset the environment?' });
    await resetDialog.locator('text=asks again before discarding').waitFor();
    await resetDialog.getByRole('button', { name: 'Reset environment' }).click();
    const resetConsent = page.locator('dialog.confirm', { hasText: 'uncommitted changes' });
    await resetConsent.locator('code', { hasText: 'dirty.txt' }).waitFor();
    const resetDiscard = resetConsent.getByRole('button', { name: 'Reset and discard the changes' });
    if (await resetDiscard.isEnabled()) throw new Error('a reset discards changes without explicit consent');
    await shot('8-reset-consent');
    await resetConsent.getByRole('checkbox').check();
    await resetDiscard.click();
    await page.locator('table.jobs tr[data-state="succeeded"]', { hasText: 'environment reset' }).waitFor({ timeout: JOB_MS });
    const worktree = before.repos[0].worktree_path;
    const until = Date.now() + JOB_MS;
    while ((await stat(worktree).then(() => true, () => false))) {
      if (Date.now() > until) throw new Error(`the reset left ${worktree}`);
      await new Promise((r) => setTimeout(r, 200));
    }
    log('resetting the dirty environment asked for consent, named dirty.txt; the job removed the worktree');

    // 11. A session whose node is down says so, and what still works (issue 39). The server here is one
    // node on SQLite, so the session's environment is pointed, in its database, at a node no instance
    // holds: what the API then answers (`node.state: down`, a launch refused `503 node_unavailable`) is
    // what the board draws. A node really killed on its own disk is tests/api/fleet.rs.
    const downTask = await api('POST', `/workspaces/${ws.id}/tasks`, { title: 'Down task', repositories: [{ repository_id: repo.id }] });
    const downSession = await api('POST', `/tasks/${downTask.id}/sessions`, { executor_type: 'worktree', start: false });
    movedToGoneNode(downSession.task_environment_id);
    const seen = await api('GET', `/sessions/${downSession.id}`);
    if (seen.node?.state !== 'down') throw new Error(`the session's node is not shown down: ${JSON.stringify(seen.node)}`);
    await page.goto(`${BERTH_URL}/ui#/s/${downSession.id}`);
    const banner = page.locator('#node-down', { hasText: 'node node-gone is down' });
    await banner.waitFor();
    await banner.locator('text=Deleting the session or the task is accepted').waitFor();
    await page.getByRole('button', { name: 'Launch agent' }).click();
    const refused = page.locator('.problem[role="alert"]', { hasText: 'code node_unavailable' });
    await refused.waitFor();
    await refused.getByRole('button', { name: /Retry/ }).waitFor();
    await shot('9-node-down');
    log('a session on a down node shows the banner; its launch is refused in place, retryable');

    // Nothing in local storage; the token only in session storage.
    const storage = await page.evaluate(() => ({ local: localStorage.length, session: sessionStorage.getItem('berth.token') }));
    if (storage.local !== 0) throw new Error(`local storage holds ${storage.local} items`);
    if (storage.session !== TOKEN) throw new Error('the token is not in session storage');

    // A token in the URL fragment signs in and leaves the address bar at once.
    const fresh = await context.newPage();
    await fresh.goto(`${BERTH_URL}/ui#token=${encodeURIComponent(TOKEN)}`, { waitUntil: 'load' });
    await fresh.getByRole('heading', { name: 'Workspaces' }).waitFor();
    if (fresh.url().includes('token')) throw new Error(`the token stayed in the address bar: ${fresh.url()}`);
    await fresh.close();
    log('a #token= fragment signs in and is removed from the address bar');
  });
}

run('board', DEADLINE_MS, main, 'signed in, created a task and a session, watched the agent stream, answered it, deleted the session, archived the task and saw its cleanup succeed, deleted and reset dirty environments with consent, saw a down node\'s banner and refusal, offline');
