// The workspaces list and one workspace: repositories, tasks by state with their session counts, task
// creation, a text filter; cards change as events arrive.
import { ApiError, get, getAll, post, uuid } from './api.js';
import { badge, clear, debounce, h, problemBox, time } from './dom.js';
import { Live, followPoint } from './live.js';

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
  const state = { ws: null, repos: [], active: [], archived: [], envs: new Map(), summary: null, filter: '' };
  const head = h('div', { class: 'head' }, h('h1', {}, 'Workspace'));
  const summary = h('div', { class: 'summary', 'aria-live': 'polite' });
  const repoArea = h('div', {});
  const active = h('div', { class: 'cards', id: 'tasks-active' });
  const archived = h('div', { class: 'cards', id: 'tasks-archived' });
  const errors = h('div', { class: 'errors' });
  const filter = h('input', { type: 'search', id: 'task-filter', placeholder: 'Filter tasks by title or branch', 'aria-label': 'Filter tasks' });
  filter.addEventListener('input', () => { state.filter = filter.value.trim().toLowerCase(); drawTasks(); });
  const createSlot = h('div', {});

  clear(
    main,
    head,
    summary,
    errors,
    h('section', { class: 'card' }, h('h2', {}, 'Repositories'), repoArea),
    h('section', { class: 'card' },
      h('div', { class: 'row' }, h('h2', {}, 'Tasks'), h('span', { class: 'spacer' }), filter),
      createSlot,
      h('div', { class: 'columns' },
        h('div', { class: 'column' }, h('h3', {}, 'Active'), active),
        h('div', { class: 'column' }, h('h3', {}, 'Archived'), archived))),
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

  function card(t) {
    const env = state.envs.get(t.id);
    const counts = env ? state.summary?.directories?.find((d) => d.task_environment_id === env.id) : null;
    const branches = t.repositories.map((r) => r.branch || r.branch_slug).filter(Boolean);
    return h('article', { class: `task-card${counts?.attention ? ' needs-attention' : ''}`, dataset: { taskId: t.id } },
      h('h4', {}, h('a', { href: `#/t/${t.id}` }, t.title || '(untitled)')),
      h('div', { class: 'meta' },
        branches.length ? branches.map((b) => h('code', { class: 'branch' }, b)) : h('span', { class: 'muted small' }, 'branch named by berth'),
        ' ',
        env ? badge(env.status) : t.archived_at ? null : h('span', { class: 'muted small' }, 'no environment yet')),
      t.archived_at ? h('div', { class: 'small muted' }, 'archived ', time(t.archived_at)) : h('div', {}, countsLine(counts), ' ', h('span', { class: 'muted small' }, `${t.session_count} sessions`)),
      h('div', { class: 'small muted' }, 'updated ', time(t.updated_at)));
  }

  function drawTasks() {
    const f = state.filter;
    const match = (t) => !f || t.title.toLowerCase().includes(f) || t.repositories.some((r) => (r.branch ?? r.branch_slug ?? '').toLowerCase().includes(f));
    const a = state.active.filter(match);
    const z = state.archived.filter(match);
    clear(active, a.length ? a.map(card) : h('p', { class: 'muted' }, f ? 'No active task matches.' : 'No active task.'));
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
    const [ws, repos, act, arch, sum] = await Promise.all([
      get(`/workspaces/${id}`),
      getAll(`/workspaces/${id}/repositories`),
      getAll(`/workspaces/${id}/tasks?archived=false`),
      getAll(`/workspaces/${id}/tasks?archived=true`),
      get(`/workspaces/${id}/summary`),
    ]);
    const envs = await pool(act.items.slice(0, 100), 4, (t) => environmentOf(t.id));
    Object.assign(state, { ws, repos: repos.items, active: act.items, archived: arch.items, summary: sum });
    state.envs = new Map(act.items.slice(0, 100).map((t, i) => [t.id, envs[i]]));
    return act.latest_seq;
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

