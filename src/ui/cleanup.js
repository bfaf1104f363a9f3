// Cleanup jobs: every job with its trigger, state, attempts and last error, and retry/cancel where berth
// allows them (retry from `failed`, cancel from `prepared`, `pending` or `retry_wait`).
import { getAll, post, uuid } from './api.js';
import { badge, clear, debounce, h, problemBox, shortId, time } from './dom.js';
import { Live, followPoint } from './live.js';

const CANCELLABLE = new Set(['prepared', 'pending', 'retry_wait']);
const STATES = ['', 'prepared', 'pending', 'running', 'retry_wait', 'succeeded', 'failed', 'cancelled'];

/** What a job that is not over waits for: its node, down (and since when, if known). */
function waiting(j) {
  const w = j.waiting_for;
  if (!w) return null;
  return h('div', { class: 'small warn', dataset: { waitingFor: w.reason } },
    `waiting for node ${w.node_id}`, w.since ? h('span', {}, ', down since ', time(w.since)) : ', down');
}

/** A job a decommission ended: how many worktrees it would have removed on the node given up. */
function abandoned(j) {
  const a = j.would_have_removed;
  if (!a) return null;
  const n = a.worktree_paths.length;
  return h('div', { class: 'small muted', title: a.worktree_paths.join('\n') },
    `node ${a.node_id} given up: ${n} worktree${n === 1 ? '' : 's'} left on its disk`);
}

/** A table of jobs; `changed()` is called after a retry or cancel went through. */
export function jobsTable(jobs, changed, { showTask = true } = {}) {
  if (!jobs.length) return h('p', { class: 'muted' }, 'No cleanup job.');
  const err = h('div', { class: 'errors' });
  const act = (job, verb) => {
    const key = uuid();
    const run = async () => {
      clear(err);
      try {
        await post(`/cleanup-jobs/${job.id}/${verb}`, undefined, { key });
        changed();
      } catch (e) {
        clear(err, problemBox(e, run));
      }
    };
    return run;
  };
  return h('div', {},
    err,
    h('table', { class: 'jobs' },
      h('thead', {}, h('tr', {},
        h('th', {}, 'Job'), h('th', {}, 'Trigger'), h('th', {}, 'State'), h('th', {}, 'Attempts'),
        showTask ? h('th', {}, 'Task') : null, h('th', {}, 'Last error'), h('th', {}, 'Created'), h('th', {}, 'Finished'), h('th', {}, 'Actions'))),
      h('tbody', {}, jobs.map((j) => h('tr', { dataset: { jobId: j.id, state: j.state } },
        h('td', {}, h('code', { title: j.id }, shortId(j.id))),
        h('td', {}, j.trigger.replace(/_/g, ' ')),
        h('td', {}, badge(j.state), j.state === 'retry_wait' && j.next_attempt_at ? h('span', { class: 'small muted' }, ' next ', time(j.next_attempt_at)) : null, waiting(j)),
        h('td', {}, `${j.attempts} / ${j.max_attempts}`),
        showTask ? h('td', {}, h('a', { href: `#/t/${j.task_id}` }, shortId(j.task_id))) : null,
        h('td', { class: 'error-text' }, j.last_error ?? '', abandoned(j)),
        h('td', {}, time(j.created_at)),
        h('td', {}, j.completed_at ? time(j.completed_at) : ''),
        h('td', {},
          j.state === 'failed' ? h('button', { type: 'button', class: 'small', onclick: act(j, 'retry') }, 'Retry job') : null,
          CANCELLABLE.has(j.state) ? h('button', { type: 'button', class: 'small', onclick: act(j, 'cancel') }, 'Cancel job') : null))))));
}

export function renderCleanup(main, taskId, { setCrumbs }) {
  setCrumbs([['Workspaces', '#/'], ['Cleanup jobs']]);
  const stateSel = h('select', { id: 'job-state', 'aria-label': 'Show jobs in state' }, STATES.map((s) => h('option', { value: s }, s ? s.replace(/_/g, ' ') : 'every state')));
  const area = h('div', {}, h('p', { class: 'muted' }, 'Loading…'));
  clear(main, h('section', { class: 'card' },
    h('div', { class: 'row' }, h('h1', {}, 'Cleanup jobs'), h('span', { class: 'spacer' }),
      taskId ? h('span', {}, 'for task ', h('a', { href: `#/t/${taskId}` }, shortId(taskId)), ' · ', h('a', { href: '#/cleanup' }, 'all jobs')) : null,
      h('label', { for: 'job-state' }, 'State '), stateSel),
    h('p', { class: 'muted small' }, 'berth removes files only through these jobs. A failed job keeps its files until it is retried.'),
    area));
  let stopped = false;
  const load = async () => {
    const q = new URLSearchParams();
    if (stateSel.value) q.set('state', stateSel.value);
    if (taskId) q.set('task_id', taskId);
    try {
      const { items, latest_seq } = await getAll(`/cleanup-jobs?${q}`);
      if (!stopped) clear(area, jobsTable(items, () => load()));
      return latest_seq;
    } catch (e) {
      clear(area, problemBox(e, load));
      return null;
    }
  };
  stateSel.addEventListener('change', load);
  const soon = debounce(load, 300);
  let live = null;
  (async () => {
    const from = await followPoint().catch(() => 0);
    const seq = await load();
    if (stopped) return;
    live = new Live({
      filter: taskId ? { task_id: taskId } : {},
      types: ['cleanup_job.'],
      onEvent: () => soon(),
      onReset: async () => (await load()) ?? followPoint(),
    }).start(seq ?? from);
  })();
  return () => { stopped = true; live?.stop(); };
}
