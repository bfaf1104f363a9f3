// The board with a real agent speaking the Agent Client Protocol (issue 37, item 9): opencode, pinned in
// tests/acp/opencode, offline against the scripted model in model.mjs. Through the board: the session's
// Agent card names the agent and offers its modes and options as selectors; a message asking for a file
// shows the agent's plan, its tool call with status and path, and its permission question with the
// agent's own options as buttons; allowing writes the file into the worktree; the tool call ends
// `completed`; the mode selector changes the agent's mode. Claude Code (tests/acp/claude) on the same
// task shows its plan (it renders its TodoWrite as the ACP plan; opencode 1.18 sends none). Same rules as
// board.mjs: loopback only, no console error.
//
// Environment: as board.mjs, plus OPENCODE_CONFIG_FILE (the opencode.json the server's `opencode` profile
// points OPENCODE_CONFIG at; written here), MODEL_PORT (the loopback port the scripted model listens on,
// which the server's `claude` profile names in ANTHROPIC_BASE_URL) and optionally ACP_TIMEOUT_MS
// (default 240000).
import { randomBytes } from 'node:crypto';
import { existsSync, readFileSync } from 'node:fs';
import { mkdir, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { BERTH_URL, REPO_DIR, TOKEN, api, inBrowser, logger, makeRepository, run } from './common.mjs';
import { startModel } from './model.mjs';

const DEADLINE_MS = Number(process.env.ACP_TIMEOUT_MS || 240_000);
const CONFIG = process.env.OPENCODE_CONFIG_FILE ?? '';
const MODEL_PORT = Number(process.env.MODEL_PORT || 0);
const AGENT_MS = 90_000; // a real agent starting or answering on a loaded machine

if (!BERTH_URL || !TOKEN || !REPO_DIR || !CONFIG || !MODEL_PORT) {
  console.error('acp.mjs: BERTH_URL, BERTH_TOKEN, BOARD_REPO_DIR, OPENCODE_CONFIG_FILE and MODEL_PORT must be set');
  process.exit(2);
}
const log = logger('acp');

async function main() {
  const model = await startModel(MODEL_PORT);
  try {
    await mkdir(path.dirname(CONFIG), { recursive: true });
    await writeFile(CONFIG, JSON.stringify({
      $schema: 'https://opencode.ai/config.json',
      autoupdate: false,
      share: 'disabled',
      model: 'mock/mock-model',
      small_model: 'mock/mock-model',
      enabled_providers: ['mock'],
      provider: { mock: {
        npm: '@ai-sdk/openai-compatible',
        name: 'Mock',
        options: { baseURL: model.url, apiKey: 'dummy' },
        models: { 'mock-model': { name: 'Mock Model', tool_call: true, limit: { context: 128000, output: 4096 } } },
      } },
      permission: { edit: 'ask', bash: 'ask', webfetch: 'deny' },
      lsp: false,
      formatter: false,
    }));
    await board(model);
  } finally {
    await model.close();
  }
}

async function board(model) {
  const suffix = randomBytes(4).toString('hex');
  const ws = await api('POST', '/workspaces', { name: `acp-${suffix}` });
  const repo = await api('POST', `/workspaces/${ws.id}/repositories`, { path: await makeRepository(`acp-${suffix}`) });
  const task = await api('POST', `/workspaces/${ws.id}/tasks`, { title: 'ACP task', repositories: [{ repository_id: repo.id }] });
  const session = await api('POST', `/tasks/${task.id}/sessions`, { executor_type: 'worktree', agent_profile: 'opencode', name: 'opencode session' });
  const target = path.join(session.workspace_path, 'greeting.txt');
  log(`session ${session.id} on opencode in ${session.workspace_path}`);

  await inBrowser('acp', log, async ({ page, shot }) => {
    await page.goto(`${BERTH_URL}/ui#token=${encodeURIComponent(TOKEN)}`, { waitUntil: 'load' });
    await page.getByRole('heading', { name: 'Workspaces' }).waitFor();
    await page.goto(`${BERTH_URL}/ui#/s/${session.id}`);
    await page.getByRole('heading', { name: 'opencode session', level: 1 }).waitFor();
    await page.locator('#session-state .badge', { hasText: 'idle' }).waitFor({ timeout: AGENT_MS });

    // The agent card: who the agent is, its mode (opencode offers it as a config option, category `mode`)
    // and its model as selectors.
    const card = page.locator('#agent');
    await card.locator('#agent-identity', { hasText: 'OpenCode' }).waitFor();
    const offered = (await api('GET', `/sessions/${session.id}/snapshot`)).agent;
    const modeOption = offered.config_options.find((o) => o.category === 'mode');
    const modeSelect = modeOption ? page.locator(`#agent-option-${modeOption.id}`) : page.locator('#agent-mode');
    const modes = await modeSelect.locator('option').evaluateAll((os) => os.map((o) => o.value));
    if (modes.length < 2) throw new Error(`the mode selector offers ${JSON.stringify(modes)}: ${JSON.stringify(offered)}`);
    log(`the agent card names OpenCode and offers the modes ${JSON.stringify(modes)}`);

    // A message asking for a file: the plan, the tool call, the permission question with the agent's options.
    await page.locator('#message-text').fill(`Please write ${target} with a greeting.`);
    await page.getByRole('button', { name: 'Send', exact: true }).click();
    const question = page.locator('#attention .attention');
    await question.waitFor({ timeout: AGENT_MS });
    await page.locator('#session-state .badge', { hasText: 'attention' }).waitFor();
    const buttons = question.locator('button[data-option]');
    const kinds = await buttons.evaluateAll((bs) => bs.map((b) => b.dataset.kind));
    if (!kinds.includes('allow_once') || !kinds.some((k) => k.startsWith('reject'))) {
      throw new Error(`the permission question offers ${JSON.stringify(kinds)}`);
    }
    await question.locator('h2', { hasText: 'greeting.txt' }).waitFor();
    await page.locator('#tool-calls li', { hasText: 'greeting.txt' }).first().waitFor();
    await shot('1-permission');
    if (existsSync(target)) throw new Error('the file was written before permission was given');
    log(`the tool call and the question naming the file with the options ${JSON.stringify(kinds)} show`);

    await question.locator('button[data-kind="allow_once"]').click();
    await page.locator('#transcript .msg.assistant', { hasText: 'I wrote it.' }).waitFor({ timeout: AGENT_MS });
    await page.locator('#attention .attention').waitFor({ state: 'detached' });
    await page.locator('#tool-calls li[data-status="completed"]', { hasText: 'greeting.txt' }).first().waitFor();
    const written = readFileSync(target, 'utf8');
    if (written !== 'hello from the board\n') throw new Error(`the file holds ${JSON.stringify(written)}`);
    await page.locator('#session-state .badge', { hasText: 'idle' }).waitFor({ timeout: AGENT_MS });
    await shot('2-written');
    log('allowed in the board: the file is in the worktree, the tool call completed');

    // The mode selector changes the agent's mode.
    const current = await modeSelect.inputValue();
    const other = modes.find((v) => v !== current);
    await modeSelect.selectOption(other);
    const mode = (agent) => (modeOption ? agent.config_options.find((o) => o.id === modeOption.id)?.currentValue : agent.mode);
    const until = Date.now() + AGENT_MS;
    for (;;) {
      const snap = await api('GET', `/sessions/${session.id}/snapshot`);
      if (mode(snap.agent) === other) break;
      if (Date.now() > until) throw new Error(`the mode stayed ${mode(snap.agent)}, not ${other}`);
      await new Promise((r) => setTimeout(r, 200));
    }
    await page.waitForFunction(([sel, v]) => document.querySelector(sel)?.value === v,
      [modeOption ? `#agent-option-${modeOption.id}` : '#agent-mode', other]);
    await shot('3-mode');
    log(`the mode selector moved the agent from ${current} to ${other}`);
    const asked = model.requests.filter((r) => r.path.endsWith('/chat/completions')).length;
    log(`the model was asked ${asked} times`);
    await api('POST', `/sessions/${session.id}/stop`);

    // Claude Code on the same task: its plan in the agent card.
    const claude = await api('POST', `/tasks/${task.id}/sessions`, { executor_type: 'worktree', agent_profile: 'claude', name: 'claude session' });
    await page.goto(`${BERTH_URL}/ui#/s/${claude.id}`);
    await page.getByRole('heading', { name: 'claude session', level: 1 }).waitFor();
    await page.locator('#session-state .badge', { hasText: 'idle' }).waitFor({ timeout: AGENT_MS });
    await page.locator('#agent-identity').waitFor();
    await page.locator('#message-text').fill('Make a plan, please.');
    await page.getByRole('button', { name: 'Send', exact: true }).click();
    await page.locator('#agent-plan li[data-status="in_progress"]', { hasText: 'greeting file' }).waitFor({ timeout: AGENT_MS });
    await page.locator('#agent-plan li[data-status="pending"]', { hasText: 'Say it is done' }).waitFor();
    await page.locator('#transcript .msg.assistant', { hasText: 'Planned.' }).waitFor({ timeout: AGENT_MS });
    const modeSelectors = await page.locator('#agent select').evaluateAll((ss) => ss.filter((s) => /^mode$/i.test(s.getAttribute("aria-label"))).length);
    if (modeSelectors !== 1) throw new Error(`the agent card shows ${modeSelectors} mode selectors: ${JSON.stringify((await api('GET', `/sessions/${claude.id}/snapshot`)).agent)}`);
    await shot('4-plan');
    log('Claude Code\'s plan shows in the agent card with each entry\'s status');
    await api('POST', `/sessions/${claude.id}/stop`);
  });
}

run('acp', DEADLINE_MS, main, 'opencode and Claude Code in the board: agent card, tool call, permission buttons, mode selector, plan, offline');
