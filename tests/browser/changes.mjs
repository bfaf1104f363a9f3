// The board shows what an agent did (issue 40 item 5), in a real browser and offline.
//
// Through the API: a workspace, a repository, a task and a session of the test agent, which writes
// notes.txt in its first turn and changes it in its second. Then, in the board: the task sits in the
// workspace's "In progress" column (a started session moved it); it moves one column right with the
// keyboard (Shift+ArrowRight on the focused card) and back with the mouse (dragged onto the column); the
// task page shows the worktree's diff per file, both turns with their own diffs (turn 1 added "one", turn
// 2 replaced it with "two"); a comment on the changed line, sent as a review to the session, reaches the
// agent as its next prompt naming the file and line; "Restore to here" on turn 1, after consent, puts
// notes.txt back to "one" on disk; the work is committed from the board, a conflicting merge names the
// file and changes nothing, a clean one moves the user's checkout; a push reaches git's HTTP server and a
// pull request opened on Prism (GitHub's description) shows on the task card. Every column move is checked
// through the API, the files on disk.
//
// Environment: as board.mjs (BERTH_URL, BERTH_TOKEN, BOARD_REPO_DIR); CHANGES_TIMEOUT_MS (default 180000).
import { randomBytes } from 'node:crypto';
import { execFileSync } from 'node:child_process';
import { readFile, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { BERTH_URL, REPO_DIR, TOKEN, api, inBrowser, logger, makeRepository, run } from './common.mjs';

const DEADLINE_MS = Number(process.env.CHANGES_TIMEOUT_MS || 180_000);
const TURN_MS = 30_000;

if (!BERTH_URL || !TOKEN || !REPO_DIR) {
  console.error('changes.mjs: BERTH_URL, BERTH_TOKEN and BOARD_REPO_DIR must be set');
  process.exit(2);
}
const log = logger('changes');
const gitOut = (cwd, ...args) => execFileSync('git', args, { cwd, encoding: 'utf8' }).trim();

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

/** The session's turns once `n` of them have settled with their end checkpoint. */
const settled = (session, n) => until(`${n} settled turns`, async () => {
  const t = (await api('GET', `/sessions/${session}/turns`)).items;
  return t.length === n && t.every((x) => x.end_checkpoint_id) ? t : null;
});

async function main() {
  const suffix = randomBytes(4).toString('hex');
  const ws = await api('POST', '/workspaces', { name: `changes-${suffix}` });
  const repoPath = await makeRepository(`changes-${suffix}`);
  const repo = await api('POST', `/workspaces/${ws.id}/repositories`, { path: repoPath });
  // Its origin: git's own HTTP server (started by .ci/browser), as acme/<name>.git.
  const bare = join(process.env.GIT_SERVER_ROOT, 'acme', `changes-${suffix}.git`);
  gitOut(repoPath, 'init', '-q', '--bare', '-b', 'main', bare);
  gitOut(bare, 'config', 'http.receivepack', 'true');
  gitOut(repoPath, 'push', '-q', bare, 'main');
  gitOut(repoPath, 'remote', 'add', 'origin', `${process.env.GIT_SERVER_URL}/acme/changes-${suffix}.git`);
  const task = await api('POST', `/workspaces/${ws.id}/tasks`, { title: 'Changes task', repositories: [{ repository_id: repo.id }] });
  const session = await api('POST', `/tasks/${task.id}/sessions`, { executor_type: 'worktree', agent_profile: 'test', name: 'writer' });
  await until('the session is idle', async () => (await api('GET', `/sessions/${session.id}`)).state === 'idle');
  await api('POST', `/sessions/${session.id}/messages`, { text: 'write notes.txt one\n' });
  await settled(session.id, 1);
  await api('POST', `/sessions/${session.id}/messages`, { text: 'write notes.txt two\n' });
  await settled(session.id, 2);
  const notes = join(session.workspace_path, 'notes.txt');
  if ((await readFile(notes, 'utf8')) !== 'two\n') throw new Error('the agent did not write notes.txt');
  const columns = (await api('GET', `/workspaces/${ws.id}/columns`)).items;
  const named = (name) => columns.find((c) => c.name === name);
  log(`task ${task.id}: the test agent wrote notes.txt over two turns (through the API)`);

  await inBrowser('changes', log, async ({ page, shot }) => {
    await page.goto(`${BERTH_URL}/ui#/w/${ws.id}`, { waitUntil: 'load' });
    await page.locator('#token').fill(TOKEN);
    await page.getByRole('button', { name: 'Sign in' }).click();
    await page.getByRole('heading', { name: ws.name, level: 1 }).waitFor();

    // 1. The board: the task is in "In progress"; moved with the keyboard, then with the mouse.
    const column = (name) => page.locator('.board-column', { has: page.getByRole('heading', { name }) });
    const card = (name) => column(name).locator(`.task-card[data-task-id="${task.id}"]`);
    await card('In progress').waitFor();
    await shot('1-board');
    await card('In progress').focus();
    await page.keyboard.press('Shift+ArrowRight');
    await card('In review').waitFor();
    await until('the task is in review (API)', async () => (await api('GET', `/tasks/${task.id}`)).column_id === named('In review').id);
    log('moved to In review with the keyboard');
    await card('In review').dragTo(column('In progress'));
    await card('In progress').waitFor();
    await until('the task is in progress again (API)', async () => (await api('GET', `/tasks/${task.id}`)).column_id === named('In progress').id);
    log('dragged back to In progress with the mouse');

    // 2. The task page: the diff per file, and each turn with its own diff.
    await card('In progress').getByRole('link', { name: 'Changes task' }).click();
    await page.getByRole('heading', { name: 'Changes task', level: 1 }).waitFor();
    const file = page.locator('#changes details.file[data-path="notes.txt"]');
    await file.locator('tr.add', { hasText: 'two' }).waitFor();
    const turns = page.locator('#turns table.turns tbody tr');
    await until('both turns listed', async () => (await turns.count()) === 2);
    await page.locator('#turns tr[data-turn="1"]').getByRole('button', { name: 'Show diff' }).click();
    await page.locator('#turn-diff tr.add', { hasText: 'one' }).waitFor();
    await page.locator('#turns tr[data-turn="2"]').getByRole('button', { name: 'Show diff' }).click();
    await page.locator('#turn-diff tr.del', { hasText: 'one' }).waitFor();
    await page.locator('#turn-diff tr.add', { hasText: 'two' }).waitFor();
    await shot('2-turn-diff');
    log('the task page shows the diff and both turns\' own diffs');

    // 3. A comment on the changed line, sent as a review to the session, reaches the agent.
    await file.getByRole('button', { name: 'Comment on notes.txt line 1' }).click();
    await page.getByRole('textbox', { name: 'Comment on notes.txt line 1' }).fill('spell it as a digit');
    await page.locator('#review-body').fill('One change, please.');
    await page.locator('#review-session').selectOption(session.id);
    await shot('3-review');
    await page.locator('#send-review').click();
    await page.locator('#review-sent').waitFor();
    const third = await settled(session.id, 3);
    const prompt = third[2].prompt;
    if (!prompt.includes('notes.txt line 1:\n> two\nspell it as a digit')) throw new Error(`the agent's prompt does not quote the line: ${prompt}`);
    log('the review reached the agent, naming notes.txt line 1');

    // 4. Restore to the end of turn 1 (with consent): notes.txt is "one" again.
    await page.locator('#turns tr[data-turn="1"]').getByRole('button', { name: 'Restore to here…' }).click();
    const dialog = page.locator('dialog.confirm');
    await dialog.waitFor();
    await dialog.getByRole('checkbox').check();
    await dialog.getByRole('button', { name: 'Restore' }).click();
    await page.locator('#restored').waitFor();
    await until('notes.txt is back to turn 1', async () => (await readFile(notes, 'utf8')) === 'one\n');
    await page.locator('#changes details.file[data-path="notes.txt"] tr.add', { hasText: 'one' }).waitFor();
    await shot('4-restored');
    log('restored to the end of turn 1: notes.txt holds "one"');

    // 5. Land it: commit from the board; a merge that conflicts names the file and changes nothing; once
    // the user takes their change back, the merge goes through and the user's clean checkout moves.
    await page.locator('#commit-message').fill('Notes from the agent');
    await page.locator('#commit').click();
    await page.locator('#landing-result', { hasText: 'Committed' }).waitFor();
    const mainBefore = gitOut(repoPath, 'rev-parse', 'main');
    await writeFile(join(repoPath, 'notes.txt'), 'theirs\n');
    gitOut(repoPath, 'add', 'notes.txt');
    gitOut(repoPath, '-c', 'user.name=u', '-c', 'user.email=u@e', 'commit', '-q', '-m', 'theirs');
    const theirs = gitOut(repoPath, 'rev-parse', 'main');
    await page.locator('#landing button.merge').click();
    await page.locator('#merge-conflict', { hasText: 'notes.txt' }).waitFor();
    if (gitOut(repoPath, 'rev-parse', 'main') !== theirs) throw new Error('a conflicting merge moved main');
    await shot('5-merge-conflict');
    gitOut(repoPath, 'reset', '-q', '--hard', mainBefore);
    await page.locator('#landing button.merge').click();
    await page.locator('#landing-result', { hasText: 'Merged into main' }).waitFor();
    if ((await readFile(join(repoPath, 'notes.txt'), 'utf8')) !== 'one\n') throw new Error('the user\'s checkout did not move with main');
    log('committed, saw the conflict by path, merged; the user\'s checkout moved');

    // 6. Push, and open a pull request on GitHub (Prism, which refuses any request GitHub's description
    // does not allow); the task card shows it with its state.
    await page.locator('#landing button.push').click();
    await page.locator('#landing-result', { hasText: 'Pushed' }).waitFor();
    const branch = gitOut(session.workspace_path, 'branch', '--show-current');
    if (gitOut(bare, 'rev-parse', `refs/heads/${branch}`) !== gitOut(session.workspace_path, 'rev-parse', 'HEAD')) throw new Error('the push did not reach the server');
    await page.locator('#landing input.pr-title').fill('Notes, by an agent');
    await page.locator('#landing button.open-pr').click();
    await page.locator('#landing-result', { hasText: 'Opened' }).waitFor();
    await page.locator('#pull-requests li').first().waitFor();
    await shot('6-pull-request');
    await page.evaluate((id) => { location.hash = `#/w/${id}`; }, ws.id);
    await page.locator(`.task-card[data-task-id="${task.id}"] .pr-line a`, { hasText: 'PR #' }).waitFor();
    log('pushed through git http-backend, opened a pull request; the task card shows it');
  });
}

run('changes', DEADLINE_MS, main, 'columns moved by keyboard and mouse, diffs per file and per turn, a review reached the agent, a restore put the file back, a commit, a merge conflict by path, a merge, a push and a pull request on the card');
