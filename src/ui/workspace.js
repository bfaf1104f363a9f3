// The workspaces list and one workspace: repositories, its board (tasks in the workspace's columns, moved
// with the mouse by dragging a card, or with the keyboard: Shift+Left / Shift+Right on a focused card, or
// its arrow buttons), archived tasks apart, session counts, task creation, a text filter; cards change as
// events arrive. What its agents spent in the last 30 days: a total, a bar a day, a row a model.
import { ApiError, get, getAll, post, request, uuid } from './api.js';
import { badge, clear, debounce, h, problemBox, time } from './dom.js';
import { Live, followPoint } from './live.js';
import { costChart, costText, count, usageLine, usageTable } from './usage.js';

export function renderWorkspaces(main, _id, { setCrumbs }) {
  setCrumbs([['Workspaces']]);
  const list = h('div', { class: 'list' }, h('p', { class: 'muted' }, 'Loading…'));
  clear(main, h('section', { class: 'card' }, h('h1', {}, 'Workspaces'), list));
  const load = async () => {
    try {
      const { items } = await getAll('/workspaces');
      if (!items.length) {
        clear(list, h('p', {}, 'No workspace yet. Create one through the API (', h('code', {}, 'POST /api/v1/workspaces'), ').'));
        return;
      }
      clear(
        list,
        h('ul', { class: 'plain' }, items.map((w) =>
          h('li', {}, h('a', { href: `#/w/${w.id}`, class: 'big' }, w.name), ' ', w.status !== 'active' ? badge(w.status) : null, ' ', h('span', { class: 'muted small' }, 'created ', time(w.created_at))),
        )),
      );
    } catch (err) {
      clear(list, problemBox(err, load));
    }
  };
  load();
}

/** Environment of a task, or null when it has none yet. */
async function environmentOf(taskId) {
  try {
    return await get(`/tasks/${taskId}/environment`);
  } catch (err) {
    if (err instanceof ApiError && err.status === 404) return null;
    throw err;
  }
}

/** Runs `fn` over `items` with at most `n` at once. */
async function pool(items, n, fn) {
  const out = new Array(items.length);
  let i = 0;
  await Promise.all(Array.from({ length: Math.min(n, items.length) }, async () => {
    while (i < items.length) {
      const k = i++;
      out[k] = await fn(items[k]);
    }
  }));
  return out;
}

function countsLine(c) {
  if (!c) return h('span', { class: 'muted small' }, 'no sessions');
  const parts = [`${c.open} open`, `${c.working} working`];
  if (c.recovering) parts.push(`${c.recovering} recovering`);
  if (c.error) parts.push(`${c.error} failed`);
  return h(
    'span',
    { class: 'small counts' },
    parts.join(' · '),
    c.attention ? h('span', { class: 'attention-mark', title: 'A session needs attention' }, ` · ● ${c.attention} attention`) : null,
  );
}

export function renderWorkspace(main, id, { setCrumbs }) {
  setCrumbs([['Workspaces', '#/'], ['Workspace']]);
  const state = { ws: null, repos: [], active: [], archived: [], columns: [], envs: new Map(), summary: null, filter: '', focus: null };
  const head = h('div', { class: 'head' }, h('h1', {}, 'Workspace'));
  const summary = h('div', { class: 'summary', 'aria-live': 'polite' });
  const repoArea = h('div', {});
  const active = h('div', { class: 'board', id: 'tasks-active' });
  const moveErr = h('div', { class: 'errors', 'aria-live': 'polite' });
  const archived = h('div', { class: 'cards', id: 'tasks-archived' });
  const errors = h('div', { class: 'errors' });
  const filter = h('input', { type: 'search', id: 'task-filter', placeholder: 'Filter tasks by title or branch', 'aria-label': 'Filter tasks' });
  filter.addEventListener('input', () => { state.filter = filter.value.trim().toLowerCase(); drawTasks(); });
  const createSlot = h('div', {});
  const usageArea = h('div', {}, h('p', { class: 'muted' }, 'Loading…'));

  clear(
    main,
    head,
    summary,
    errors,
    h('section', { class: 'card' }, h('h2', {}, 'Repositories'), repoArea),
    h('section', { class: 'card' },
      h('div', { class: 'row' }, h('h2', {}, 'Tasks'), h('span', { class: 'spacer' }), filter),
      createSlot,
      moveErr,
      active,
      h('details', { class: 'archived', open: true }, h('summary', {}, 'Archived tasks'), archived)),
    h('section', { class: 'card', id: 'usage' }, h('h2', {}, 'Cost'), usageArea),
  );

  function drawSummary() {
    const s = state.summary;
    if (!s) return clear(summary);
    const c = s.sessions;
    clear(summary,
      h('span', {}, h('strong', {}, s.tasks_active), ' active tasks'),
      h('span', {}, h('strong', {}, s.tasks_archived), ' archived'),
      h('span', {}, h('strong', {}, c.open), ' sessions open'),
      h('span', {}, h('strong', {}, c.working), ' working'),
      h('span', { class: c.attention ? 'attention-mark' : '' }, h('strong', {}, c.attention), ' need attention'),
      c.recovering ? h('span', {}, h('strong', {}, c.recovering), ' recovering') : null,
      c.error ? h('span', {}, h('strong', {}, c.error), ' failed') : null);
  }

  function drawRepos() {
    if (!state.repos.length) {
      clear(repoArea, h('p', { class: 'muted' }, 'No repository registered yet.'), registerForm());
      return;
    }
    clear(repoArea,
      h('table', {},
        h('thead', {}, h('tr', {}, h('th', {}, 'Name'), h('th', {}, 'Path'), h('th', {}, 'Default branch'), h('th', {}, 'Registered'))),
        h('tbody', {}, state.repos.map((r) => h('tr', {},
          h('td', {}, r.name), h('td', {}, h('code', {}, r.path)), h('td', {}, h('code', {}, r.default_branch)), h('td', {}, time(r.created_at)))))),
      registerForm());
  }

  function registerForm() {
    const path = h('input', { id: 'repo-path', required: true, placeholder: '/absolute/path/to/a/git/repository' });
    const err = h('div', { class: 'errors' });
    const form = h('form', { class: 'inline' }, h('label', { for: 'repo-path' }, 'Register a repository'), path, h('button', { type: 'submit' }, 'Register'), err);
    let key = null;
    form.addEventListener('submit', async (ev) => {
      ev.preventDefault();
      key ??= uuid();
      clear(err);
      try {
        await post(`/workspaces/${id}/repositories`, { path: path.value.trim() }, { key });
        key = null;
        path.value = '';
        reload();
      } catch (e) {
        clear(err, problemBox(e, () => form.requestSubmit()));
      }
    });
    return h('details', {}, h('summary', {}, 'Register a repository'), form);
  }

  /** The column a task is in (a task without one is in the first). */
  const columnOf = (t) => state.columns.find((c) => c.id === t.column_id) ?? state.columns[0];

  /** Moves a task to a column: a PATCH based on the task as berth has it now (If-Match). */
  async function move(taskId, columnId) {
    clear(moveErr);
    state.focus = taskId;
    try {
      const current = await request('GET', `/tasks/${taskId}`);
      if (current.body.column_id === columnId) return;
      await request('PATCH', `/tasks/${taskId}`, { column_id: columnId }, { ifMatch: current.headers.get('ETag') ?? undefined });
      const t = state.active.find((x) => x.id === taskId);
      if (t) t.column_id = columnId;
      drawTasks();
    } catch (e) {
      clear(moveErr, problemBox(e, () => move(taskId, columnId)));
    }
    soon();
  }

  function step(t, by) {
    const i = state.columns.indexOf(columnOf(t));
    const to = state.columns[i + by];
    if (to) move(t.id, to.id);
  }

  function card(t) {
    const env = state.envs.get(t.id);
    const counts = env ? state.summary?.directories?.find((d) => d.task_environment_id === env.id) : null;
    const branches = t.repositories.map((r) => r.branch || r.branch_slug).filter(Boolean);
    const cost = costText(t.usage);
    const col = t.archived_at ? null : columnOf(t);
    const i = col ? state.columns.indexOf(col) : -1;
    const left = state.columns[i - 1];
    const right = state.columns[i + 1];
    const el = h('article', {
      class: `task-card${counts?.attention ? ' needs-attention' : ''}`,
      dataset: { taskId: t.id },
      tabindex: col ? 0 : null,
      draggable: col ? 'true' : null,
      'aria-keyshortcuts': col ? 'Shift+ArrowLeft Shift+ArrowRight' : null,
      'aria-label': col ? `${t.title || '(untitled)'}, in ${col.name}` : null,
    },
      h('h4', {}, h('a', { href: `#/t/${t.id}` }, t.title || '(untitled)')),
      h('div', { class: 'meta' },
        branches.length ? branches.map((b) => h('code', { class: 'branch' }, b)) : h('span', { class: 'muted small' }, 'branch named by berth'),
        ' ',
        env ? badge(env.status) : t.archived_at ? null : h('span', { class: 'muted small' }, 'no environment yet'),
        cost ? h('span', { class: 'small muted card-cost', title: `What its agents spent (${count(t.usage.input_tokens)} input, ${count(t.usage.output_tokens)} output tokens)` }, cost) : null),
      t.archived_at ? h('div', { class: 'small muted' }, 'archived ', time(t.archived_at)) : h('div', {}, countsLine(counts), ' ', h('span', { class: 'muted small' }, `${t.session_count} sessions`)),
      (t.pull_requests ?? []).length ? h('div', { class: 'small pr-line' }, t.pull_requests.map((p) => [
        h('a', { href: p.url, rel: 'noreferrer', target: '_blank' }, `PR #${p.number}`), ' ', badge(p.draft && p.state === 'open' ? 'draft' : p.state), ' '])) : null,
      h('div', { class: 'row small muted' }, 'updated ', time(t.updated_at), h('span', { class: 'spacer' }),
        left ? h('button', { type: 'button', class: 'small move', 'aria-label': `Move to ${left.name}`, title: `Move to ${left.name}`, onclick: () => move(t.id, left.id) }, '←') : null,
        right ? h('button', { type: 'button', class: 'small move', 'aria-label': `Move to ${right.name}`, title: `Move to ${right.name}`, onclick: () => move(t.id, right.id) }, '→') : null));
    if (col) {
      el.addEventListener('dragstart', (ev) => {
        ev.dataTransfer.setData('text/plain', t.id);
        ev.dataTransfer.effectAllowed = 'move';
      });
      el.addEventListener('keydown', (ev) => {
        if (ev.target !== el || !ev.shiftKey) return;
        if (ev.key === 'ArrowLeft') { ev.preventDefault(); step(t, -1); }
        if (ev.key === 'ArrowRight') { ev.preventDefault(); step(t, 1); }
      });
    }
    return el;
  }

  function boardColumn(c, tasks) {
    const el = h('section', { class: 'board-column', dataset: { columnId: c.id }, 'aria-label': c.name },
      h('h3', {}, c.name, ' ', h('span', { class: 'muted small' }, String(tasks.length))),
      h('div', { class: 'cards' }, tasks.length ? tasks.map(card) : h('p', { class: 'muted small' }, state.filter ? 'No task matches.' : 'Empty')));
    el.addEventListener('dragover', (ev) => { ev.preventDefault(); el.classList.add('drop'); });
    el.addEventListener('dragleave', () => el.classList.remove('drop'));
    el.addEventListener('drop', (ev) => {
      ev.preventDefault();
      el.classList.remove('drop');
      const taskId = ev.dataTransfer.getData('text/plain');
      if (taskId) move(taskId, c.id);
    });
    return el;
  }

  function drawTasks() {
    const f = state.filter;
    const match = (t) => !f || t.title.toLowerCase().includes(f) || t.repositories.some((r) => (r.branch ?? r.branch_slug ?? '').toLowerCase().includes(f));
    const a = state.active.filter(match);
    const z = state.archived.filter(match);
    clear(active, state.columns.map((c) => boardColumn(c, a.filter((t) => columnOf(t) === c))));
    if (state.focus) active.querySelector(`.task-card[data-task-id="${state.focus}"]`)?.focus();
    clear(archived, z.length ? z.map(card) : h('p', { class: 'muted' }, f ? 'No archived task matches.' : 'No archived task.'));
  }

  function drawCreate() {
    if (createSlot.firstChild) return; // keep what the person typed
    const title = h('input', { id: 'task-title', required: true, maxlength: 500 });
    const desc = h('textarea', { id: 'task-description', rows: 2 });
    const repoRows = h('div', { class: 'repo-picks' });
    const err = h('div', { class: 'errors' });
    const submit = h('button', { type: 'submit', class: 'primary' }, 'Create task');
    const form = h('form', { class: 'stack', id: 'create-task' },
      h('label', { for: 'task-title' }, 'Title'), title,
      h('label', { for: 'task-description' }, 'Description (optional)'), desc,
      h('fieldset', {}, h('legend', {}, 'Repositories and branches'), repoRows),
      err, h('div', { class: 'row end' }, submit));
    const fillRepos = () => clear(repoRows, state.repos.length ? state.repos.map((r, i) => h('div', { class: 'row' },
      h('input', { type: 'checkbox', id: `pick-${i}`, dataset: { repo: r.id }, checked: state.repos.length === 1 }),
      h('label', { for: `pick-${i}` }, r.name),
      h('input', { id: `branch-${i}`, class: 'branch-input', placeholder: 'branch (optional: berth names one)', 'aria-label': `Branch for ${r.name}` }),
      h('input', { id: `base-${i}`, class: 'branch-input', placeholder: `base (default ${r.default_branch})`, 'aria-label': `Base branch for ${r.name}` }))) : h('p', { class: 'muted' }, 'Register a repository first.'));
    fillRepos();
    form.fillRepos = fillRepos;
    let key = null;
    form.addEventListener('submit', async (ev) => {
      ev.preventDefault();
      const repositories = state.repos.map((r, i) => ({ r, i })).filter(({ i }) => form.querySelector(`#pick-${i}`)?.checked).map(({ r, i }) => {
        const branch = form.querySelector(`#branch-${i}`).value.trim();
        const base = form.querySelector(`#base-${i}`).value.trim();
        return { repository_id: r.id, ...(branch ? { branch } : {}), ...(base ? { base_branch: base } : {}) };
      });
      const body = { title: title.value.trim(), repositories };
      if (desc.value.trim()) body.description = desc.value.trim();
      key ??= uuid();
      submit.disabled = true;
      clear(err);
      try {
        const t = await post(`/workspaces/${id}/tasks`, body, { key });
        key = null;
        location.hash = `#/t/${t.id}`;
      } catch (e) {
        clear(err, problemBox(e, () => form.requestSubmit()));
      } finally {
        submit.disabled = false;
      }
    });
    createSlot.append(h('details', { id: 'new-task' }, h('summary', {}, 'New task'), form));
  }

  let live = null;
  let stopped = false;

  async function load() {
    const [ws, repos, act, arch, sum, cols] = await Promise.all([
      get(`/workspaces/${id}`),
      getAll(`/workspaces/${id}/repositories`),
      getAll(`/workspaces/${id}/tasks?archived=false`),
      getAll(`/workspaces/${id}/tasks?archived=true`),
      get(`/workspaces/${id}/summary`),
      get(`/workspaces/${id}/columns`),
    ]);
    const envs = await pool(act.items.slice(0, 100), 4, (t) => environmentOf(t.id));
    Object.assign(state, { ws, repos: repos.items, active: act.items, archived: arch.items, summary: sum, columns: cols.items });
    state.envs = new Map(act.items.slice(0, 100).map((t, i) => [t.id, envs[i]]));
    return act.latest_seq;
  }

  /** The last 30 days (berth's default span), apart from the rest: a failure here leaves the board be. */
  async function loadUsage() {
    try {
      const [days, models] = await Promise.all([get(`/workspaces/${id}/usage?group_by=day`), get(`/workspaces/${id}/usage?group_by=model`)]);
      if (stopped) return;
      if (!days.groups.length) return clear(usageArea, h('p', { class: 'muted', id: 'usage-empty' }, 'No usage reported in the last 30 days.'));
      const table = usageTable(models, 'usage-models', 'Model');
      clear(usageArea,
        h('p', { class: 'muted small' }, 'The last 30 days, deleted sessions and tasks included.'),
        usageLine(days.total, 'usage-total'),
        costChart(days),
        table ? [h('h3', {}, 'By model'), table] : null);
    } catch (err) {
      if (!stopped) clear(usageArea, problemBox(err, loadUsage));
    }
  }

  function draw() {
    setCrumbs([['Workspaces', '#/'], [state.ws.name]]);
    clear(head, h('h1', {}, state.ws.name), ' ', state.ws.status !== 'active' ? badge(state.ws.status) : null);
    drawSummary();
    drawRepos();
    drawCreate();
    const repoKey = state.repos.map((r) => r.id).join();
    if (repoKey !== state.repoKey) {
      state.repoKey = repoKey;
      createSlot.querySelector('form')?.fillRepos?.();
    }
    drawTasks();
  }

  async function reload() {
    try {
      const seq = await load();
      if (stopped) return seq;
      clear(errors);
      draw();
      loadUsage();
      return seq;
    } catch (err) {
      clear(errors, problemBox(err, reload));
      throw err;
    }
  }
  const soon = debounce(() => { reload().catch(() => {}); }, 300);

  (async () => {
    try {
      const from = await followPoint();
      const seq = await reload();
      if (stopped) return;
      live = new Live({
        filter: { workspace_id: id },
        onEvent: (e) => { if (!e.type.startsWith('runtime.')) soon(); },
        onReset: () => reload(),
      }).start(seq ?? from);
    } catch {
      // shown in place by reload
    }
  })();

  return () => { stopped = true; live?.stop(); };
}

