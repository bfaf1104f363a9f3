// One task: its environment (slots with branch, ahead/behind, changed files), sessions and cleanup jobs;
// what changed (the diff, with a review to send to a session) and each turn with its own diff and a
// restore; what its agents spent; new session, archive, unarchive, reset and delete (with explicit
// consent for dirty worktrees).
import { ApiError, del, get, getAll, post, uuid } from './api.js';
import { badge, clear, confirmDialog, copyButton, debounce, h, problemBox, shortId, time } from './dom.js';
import { Live, followPoint } from './live.js';
import { jobsTable } from './cleanup.js';
import { changesPanel } from './changes.js';
import { turnsPanel } from './turns.js';
import { landingPanel } from './landing.js';
import { usageLine } from './usage.js';

async function orNull(promise, ...statuses) {
  try {
    return await promise;
  } catch (err) {
    if (err instanceof ApiError && statuses.includes(err.status)) return null;
    throw err;
  }
}

const FILE_MARK = { added: 'A', modified: 'M', deleted: 'D', renamed: 'R', typechange: 'T', untracked: '?', conflict: 'U', unmodified: ' ' };

function fileList(files) {
  if (!files?.length) return h('span', { class: 'muted small' }, 'clean');
  return h('details', {}, h('summary', {}, `${files.length} changed file${files.length === 1 ? '' : 's'}`),
    h('ul', { class: 'files' }, files.map((f) => h('li', {},
      h('code', { class: 'mark', title: `index ${f.index_status}, worktree ${f.worktree_status}` }, `${FILE_MARK[f.index_status] ?? '?'}${FILE_MARK[f.worktree_status] ?? '?'}`),
      ' ', h('code', {}, f.path)))));
}

export function renderTask(main, id, { setCrumbs }) {
  setCrumbs([['Workspaces', '#/'], ['Task']]);
  const s = { task: null, ws: null, env: null, git: [], sessions: [], jobs: null, repos: new Map(), profiles: null };
  const head = h('div', { class: 'head' }, h('h1', {}, 'Task'));
  const actions = h('div', { class: 'row actions' });
  const actionErr = h('div', { class: 'errors' });
  const errors = h('div', { class: 'errors' });
  const envArea = h('div', {});
  const sessArea = h('div', {});
  const newSession = h('div', {});
  const jobArea = h('div', {});
  const changes = changesPanel();
  const turns = turnsPanel();
  const landing = landingPanel();
  clear(main, head, errors, actions, actionErr,
    h('section', { class: 'card' }, h('h2', {}, 'Environment'), envArea),
    h('section', { class: 'card' }, h('h2', {}, 'Changes'), changes.root),
    h('section', { class: 'card' }, h('h2', {}, 'Turns'), turns.root),
    h('section', { class: 'card' }, h('h2', {}, 'Land the work'), landing.root),
    h('section', { class: 'card' }, h('h2', {}, 'Sessions'), newSession, sessArea),
    h('section', { class: 'card' }, h('div', { class: 'row' }, h('h2', {}, 'Cleanup jobs'), h('span', { class: 'spacer' }), h('a', { href: `#/cleanup/t/${id}` }, 'All of this task\'s jobs')), jobArea));

  let stopped = false;
  let live = null;

  async function load() {
    const task = await get(`/tasks/${id}`);
    const [ws, env, sessions, jobs, repos] = await Promise.all([
      get(`/workspaces/${task.workspace_id}`),
      orNull(get(`/tasks/${id}/environment`), 404),
      getAll(`/tasks/${id}/sessions`),
      orNull(getAll(`/cleanup-jobs?task_id=${id}`), 403),
      getAll(`/workspaces/${task.workspace_id}/repositories`),
    ]);
    const git = env ? (await orNull(get(`/environments/${env.id}/git-status`), 404, 403))?.items ?? [] : [];
    if (!s.profiles) s.profiles = (await orNull(get('/agent-profiles'), 403))?.items ?? [];
    Object.assign(s, { task, ws, env, git, sessions: sessions.items, jobs: jobs?.items ?? null });
    s.repos = new Map(repos.items.map((r) => [r.id, r]));
    return sessions.latest_seq;
  }

  const repoName = (rid) => s.repos.get(rid)?.name ?? shortId(rid);

  function drawHead() {
    const t = s.task;
    setCrumbs([['Workspaces', '#/'], [s.ws.name, `#/w/${s.ws.id}`], [t.title || 'Task']]);
    clear(head,
      h('h1', {}, t.title || '(untitled)', ' ', t.archived_at ? badge('archived') : null),
      t.description ? h('p', {}, t.description) : null,
      h('p', { class: 'muted small' }, `${t.kind.replace('_', ' ')} · created `, time(t.created_at), ' · updated ', time(t.updated_at),
        t.archived_at ? [' · archived ', time(t.archived_at)] : null),
      usageLine(t.usage, 'task-usage'));
  }

  function act(label, fn, cls = '') {
    return h('button', { type: 'button', class: cls, onclick: fn }, label);
  }

  /** An action with one Idempotency-Key across its retries; errors land next to the buttons. */
  function runAction(fn) {
    const key = uuid();
    const run = async () => {
      clear(actionErr);
      try {
        await fn(key);
        refresh();
      } catch (e) {
        if (e) clear(actionErr, problemBox(e, run));
      }
    };
    return run();
  }

  const keptBranches = () => (s.env?.repos ?? []).filter((r) => r.worktree_branch).map((r) => `${repoName(r.repository_id)}: ${r.worktree_branch}`);

  function keptLine() {
    const b = keptBranches();
    return b.length ? h('p', {}, 'These branches are kept: ', b.map((x, i) => [i ? ', ' : '', h('code', {}, x)])) : null;
  }

  async function archive() {
    const ok = await confirmDialog({
      title: 'Archive this task?',
      body: [h('p', {}, 'Its running agents are stopped and its open sessions cancelled. A cleanup job then removes its worktrees; a worktree holding uncommitted changes is not removed (the job fails and says which): commit or discard them first.'), keptLine(), h('p', {}, 'Unarchive brings the task back (its worktrees are recreated from the kept branches).')],
      confirm: 'Archive task',
    });
    if (ok) runAction((key) => post(`/tasks/${id}/archive`, undefined, { key }));
  }

  async function unarchive() {
    runAction(async (key) => {
      const r = await post(`/tasks/${id}/unarchive`, undefined, { key });
      const missing = (r.recovery ?? []).filter((x) => x.branch_status === 'missing');
      if (missing.length) clear(actionErr, h('div', { class: 'problem' }, h('strong', {}, 'Unarchived, but some branches are gone'), h('p', {}, missing.map((m) => repoName(m.repository_id)).join(', '))));
    });
  }

  async function reset() {
    const ok = await confirmDialog({
      title: 'Reset the environment?',
      body: [h('p', {}, 'A cleanup job removes the current worktrees; the next session materializes a fresh environment. If a worktree holds uncommitted changes, berth refuses and asks again before discarding them.'), keptLine()],
      confirm: 'Reset environment',
      danger: true,
    });
    if (!ok) return;
    const attempt = async (discard, key) => {
      clear(actionErr);
      try {
        await post(`/tasks/${id}/environment/reset${discard ? '?discard_worktree_changes=true' : ''}`, undefined, { key });
        refresh();
      } catch (e) {
        if (e instanceof ApiError && e.code === 'task_delete_dirty_worktree' && !discard) return consentToDiscard(e, attempt, 'Reset and discard the changes');
        clear(actionErr, problemBox(e, () => attempt(discard, key)));
      }
    };
    attempt(false, uuid());
  }

  async function remove() {
    const ok = await confirmDialog({
      title: 'Delete this task?',
      body: [h('p', {}, 'The task, its sessions and its environment go; a cleanup job removes its worktrees. This cannot be undone.'), keptLine()],
      confirm: 'Delete task',
      danger: true,
    });
    if (!ok) return;
    const key = uuid();
    const attempt = async (discard, k) => {
      clear(actionErr);
      try {
        await del(`/tasks/${id}${discard ? '?discard_worktree_changes=true' : ''}`, { key: k });
        location.hash = `#/w/${s.task.workspace_id}`;
      } catch (e) {
        if (e instanceof ApiError && e.code === 'task_delete_dirty_worktree' && !discard) return consentToDiscard(e, attempt, 'Delete and discard the changes');
        clear(actionErr, problemBox(e, () => attempt(discard, k)));
      }
    };
    attempt(false, key);
  }

  /** berth refused: worktrees hold changes. Show which files, then ask for explicit consent. */
  async function consentToDiscard(err, attempt, confirm) {
    const dirty = err.problem.repositories ?? [];
    const files = new Map(s.git.map((g) => [g.repository_id, g.files]));
    if (s.env) {
      try {
        const fresh = await post(`/environments/${s.env.id}/git-status/refresh`, undefined);
        for (const g of fresh.items) files.set(g.repository_id, g.files);
      } catch {
        // the last known status is shown
      }
    }
    const ok = await confirmDialog({
      title: 'Worktrees hold uncommitted changes',
      body: [
        h('p', {}, err.problem.detail),
        h('ul', { class: 'dirty' }, dirty.map((d) => h('li', {},
          h('strong', {}, repoName(d.repository_id)), ` — ${d.dirty_file_count} changed file${d.dirty_file_count === 1 ? '' : 's'}`,
          (files.get(d.repository_id) ?? []).length ? h('ul', { class: 'files' }, files.get(d.repository_id).map((f) => h('li', {}, h('code', {}, f.path)))) : null))),
        keptLine(),
      ],
      confirm,
      danger: true,
      requireCheck: 'I understand these changes will be lost.',
    });
    if (ok) attempt(true, uuid());
  }

  function drawActions() {
    const t = s.task;
    const busy = s.sessions.some((x) => ['starting', 'running', 'recovering', 'stopping'].includes(x.state));
    clear(actions,
      t.archived_at ? act('Unarchive task', unarchive) : act('Archive task…', archive),
      !t.archived_at && s.env ? act('Reset environment…', reset) : null,
      act('Delete task…', remove, 'danger'),
      busy ? h('span', { class: 'muted small' }, 'A session is working: archive, reset and delete wait until it stops.') : null);
  }

  function drawEnv() {
    const e = s.env;
    if (!e) {
      clear(envArea, h('p', { class: 'muted' }, s.task.archived_at ? 'Archived: the task has no environment now.' : 'No environment yet: the first session materializes it.'));
      return;
    }
    const byRepo = new Map(s.git.map((g) => [g.repository_id, g]));
    const refresh = h('button', { type: 'button', class: 'small' }, 'Refresh git status');
    const refreshErr = h('div', { class: 'errors' });
    refresh.addEventListener('click', async () => {
      clear(refreshErr);
      refresh.disabled = true;
      try {
        const r = await post(`/environments/${e.id}/git-status/refresh`, undefined);
        s.git = r.items;
        drawEnv();
      } catch (err) {
        clear(refreshErr, problemBox(err));
        refresh.disabled = false;
      }
    });
    clear(envArea,
      h('p', {}, badge(e.status), ' ', h('span', {}, `${e.executor_type} executor`), ' · created ', time(e.created_at)),
      e.error_message ? h('p', { class: 'problem' }, e.error_message) : null,
      e.workspace_path ? h('p', { class: 'row' }, h('span', {}, 'Workspace'), h('code', { class: 'path' }, e.workspace_path), copyButton(e.workspace_path, 'Copy path')) : null,
      h('table', { class: 'slots' },
        h('thead', {}, h('tr', {}, h('th', {}, 'Repository'), h('th', {}, 'Branch'), h('th', {}, 'Slot'), h('th', {}, 'Ahead / behind'), h('th', {}, 'Changes'), h('th', {}, 'Observed'))),
        h('tbody', {}, [...e.repos].sort((a, b) => a.position - b.position).map((r) => {
          const g = byRepo.get(r.repository_id);
          return h('tr', {},
            h('td', {}, repoName(r.repository_id)),
            h('td', {}, h('code', {}, g?.branch ?? r.worktree_branch ?? '—')),
            h('td', {}, badge(r.status), r.error_message ? h('div', { class: 'error-text small' }, r.error_message) : null),
            h('td', {}, g ? `↑${g.ahead} ↓${g.behind}` : '—'),
            h('td', {}, g ? fileList(g.files) : h('span', { class: 'muted small' }, 'not observed yet')),
            h('td', {}, g ? [time(g.observed_at), h('span', { class: 'small muted' }, ` (${g.kind})`)] : ''));
        }))),
      h('div', { class: 'row' }, refresh, refreshErr));
  }

  function drawSessions() {
    if (!s.sessions.length) {
      clear(sessArea, h('p', { class: 'muted' }, 'No session yet.'));
      return;
    }
    clear(sessArea, h('table', { class: 'sessions' },
      h('thead', {}, h('tr', {}, h('th', {}, 'Session'), h('th', {}, 'State'), h('th', {}, 'Agent'), h('th', {}, 'Executor'), h('th', {}, 'Created'), h('th', {}, 'Last error'))),
      h('tbody', {}, s.sessions.map((x) => h('tr', { dataset: { sessionId: x.id } },
        h('td', {}, h('a', { href: `#/s/${x.id}` }, x.name || shortId(x.id)), x.is_primary ? h('span', { class: 'small muted' }, ' primary') : null),
        h('td', {}, badge(x.state)),
        h('td', {}, x.agent_profile ?? '—'),
        h('td', {}, x.executor_type),
        h('td', {}, time(x.created_at)),
        h('td', { class: 'error-text' }, x.last_error ? `${x.last_error.code}: ${x.last_error.message}` : ''))))));
  }

  function drawNewSession() {
    if (newSession.firstChild || s.task.archived_at) {
      if (s.task.archived_at) clear(newSession);
      return;
    }
    const executor = h('select', { id: 'session-executor' }, h('option', { value: 'worktree' }, 'worktree (one git worktree per repository)'), h('option', { value: 'local' }, 'local (the registered repository itself)'));
    if (s.env) executor.value = s.env.executor_type;
    const profile = h('select', { id: 'session-profile' }, h('option', { value: '' }, '(default)'), (s.profiles ?? []).map((p) => h('option', { value: p.name }, `${p.name} — ${p.command}`)));
    const name = h('input', { id: 'session-name', placeholder: 'optional' });
    const prompt = h('textarea', { id: 'session-prompt', rows: 3, placeholder: 'optional: what the agent should do first' });
    const err = h('div', { class: 'errors' });
    const submit = h('button', { type: 'submit', class: 'primary' }, 'Start session');
    const form = h('form', { class: 'stack', id: 'new-session-form' },
      h('label', { for: 'session-executor' }, 'Executor'), executor,
      h('label', { for: 'session-profile' }, 'Agent profile'), profile,
      h('label', { for: 'session-name' }, 'Name'), name,
      h('label', { for: 'session-prompt' }, 'First prompt'), prompt,
      err, h('div', { class: 'row end' }, submit));
    let key = null;
    form.addEventListener('submit', async (ev) => {
      ev.preventDefault();
      const body = { executor_type: executor.value };
      if (profile.value) body.agent_profile = profile.value;
      if (name.value.trim()) body.name = name.value.trim();
      if (prompt.value.trim()) body.prompt = prompt.value.trim();
      key ??= uuid();
      submit.disabled = true;
      clear(err);
      try {
        const created = await post(`/tasks/${id}/sessions`, body, { key });
        key = null;
        location.hash = `#/s/${created.id}`;
      } catch (e) {
        clear(err, problemBox(e, () => form.requestSubmit()));
      } finally {
        submit.disabled = false;
      }
    });
    newSession.append(h('details', { id: 'new-session' }, h('summary', {}, 'New session'), form));
  }

  function drawJobs() {
    if (s.jobs === null) clear(jobArea, h('p', { class: 'muted' }, 'This token may not read cleanup jobs (cleanup:read).'));
    else clear(jobArea, jobsTable(s.jobs, () => refresh(), { showTask: false }));
  }

  async function refresh() {
    try {
      const seq = await load();
      if (stopped) return seq;
      clear(errors);
      drawHead();
      drawActions();
      drawEnv();
      drawNewSession();
      drawSessions();
      changes.update({ env: s.env, sessions: s.sessions, repoName });
      turns.update({ env: s.env, sessions: s.sessions, repoName, onRestored: () => refresh() });
      landing.update({ env: s.env, task: s.task, repoName });
      drawJobs();
      return seq;
    } catch (e) {
      // A refresh still in flight when the person left this screen (after deleting the task, say) must
      // not draw over the screen they went to.
      if (stopped) throw e;
      if (e instanceof ApiError && e.status === 404) {
        clear(main, h('div', { class: 'card' }, h('h1', {}, 'This task is gone'), h('p', {}, 'It was deleted, or this token may not see it. ', h('a', { href: '#/' }, 'Back to the workspaces'))));
        live?.stop();
      } else {
        clear(errors, problemBox(e, refresh));
      }
      throw e;
    }
  }
  const soon = debounce(() => { refresh().catch(() => {}); }, 300);

  (async () => {
    try {
      const from = await followPoint();
      const seq = await refresh();
      if (stopped) return;
      live = new Live({
        filter: { task_id: id },
        onEvent: (e) => { if (e.type !== 'runtime.output') soon(); },
        onReset: () => refresh(),
      }).start(seq ?? from);
    } catch {
      // shown in place
    }
  })();
  return () => { stopped = true; live?.stop(); };
}
