// Landing a task's work: commit what is in its worktrees, merge the task branch into its base (a
// conflict is shown by path, and nothing changed), push it, open a pull request; the task's pull
// requests with their state.
import { ApiError, post } from './api.js';
import { badge, clear, h, problemBox, shortId } from './dom.js';

export function landingPanel() {
  const root = h('div', { id: 'landing' });
  const out = h('div', { class: 'errors', 'aria-live': 'polite', id: 'landing-result' });
  const body = h('div', {});
  const prs = h('div', { id: 'pull-requests' });
  clear(root, body, out, prs);
  const st = { env: null, task: null, repoName: (id) => shortId(id), busy: false, drawnFor: null };

  const say = (...nodes) => clear(out, h('p', { class: 'small' }, ...nodes));
  async function run(button, fn) {
    clear(out);
    button.disabled = true;
    try {
      await fn();
    } catch (e) {
      if (e instanceof ApiError && e.code === 'merge_conflict') {
        clear(out, h('div', { class: 'problem', id: 'merge-conflict' },
          h('strong', {}, 'Merge conflict: nothing was changed'),
          h('p', {}, 'Both branches changed these files:'),
          h('ul', { class: 'files' }, (e.problem.conflicting_paths ?? []).map((p) => h('li', {}, h('code', {}, p))))));
      } else {
        clear(out, problemBox(e));
      }
    } finally {
      button.disabled = false;
    }
  }

  function draw() {
    const e = st.env;
    if (!e || !['ready', 'stopped'].includes(e.status) || e.executor_type !== 'worktree') {
      clear(body, h('p', { class: 'muted' }, e ? 'Work is landed from a ready worktree environment.' : 'No environment yet.'));
      return;
    }
    const message = h('input', { id: 'commit-message', placeholder: 'Commit message', 'aria-label': 'Commit message' });
    const commit = h('button', { type: 'button', id: 'commit' }, 'Commit');
    commit.addEventListener('click', () => run(commit, async () => {
      const r = await post(`/environments/${e.id}/commits`, { message: message.value });
      message.value = '';
      say(`Committed ${r.commits.map((c) => `${st.repoName(c.repository_id)} ${c.commit.slice(0, 10)}`).join(', ')}.`);
    }));
    const rows = [...e.repos].sort((a, b) => a.position - b.position).map((r) => {
      const strategy = h('select', { 'aria-label': `Merge strategy for ${st.repoName(r.repository_id)}`, class: 'merge-strategy' },
        h('option', { value: 'merge' }, 'merge commit'), h('option', { value: 'squash' }, 'squash'), h('option', { value: 'fast_forward' }, 'fast-forward'));
      const merge = h('button', { type: 'button', class: 'merge' }, 'Merge');
      merge.addEventListener('click', () => run(merge, async () => {
        const m = await post(`/environments/${e.id}/merge`, { repository_id: r.repository_id, strategy: strategy.value });
        say(`Merged into ${m.into}: ${m.commit.slice(0, 10)}`, m.checkout_updated ? ' (its clean checkout moved with it).' : '.');
      }));
      const push = h('button', { type: 'button', class: 'push' }, 'Push');
      push.addEventListener('click', () => run(push, async () => {
        const p = await post(`/environments/${e.id}/push`, { repository_id: r.repository_id });
        say(`Pushed ${p.branch} to ${p.remote} (${p.commit.slice(0, 10)}).`);
      }));
      const title = h('input', { class: 'pr-title', placeholder: 'Pull request title', 'aria-label': `Pull request title for ${st.repoName(r.repository_id)}`, value: st.task?.title ?? '' });
      const open = h('button', { type: 'button', class: 'open-pr' }, 'Open pull request');
      open.addEventListener('click', () => run(open, async () => {
        const p = await post(`/environments/${e.id}/pull-requests`, { repository_id: r.repository_id, title: title.value });
        say('Opened ', h('a', { href: p.url, rel: 'noreferrer', target: '_blank' }, `pull request #${p.number}`), '.');
      }));
      return h('tr', { dataset: { repositoryId: r.repository_id } },
        h('td', {}, st.repoName(r.repository_id), ' ', h('code', {}, r.worktree_branch ?? '')),
        h('td', {}, h('div', { class: 'row' }, strategy, merge)),
        h('td', {}, h('div', { class: 'row' }, push)),
        h('td', {}, h('div', { class: 'row' }, title, open)));
    });
    clear(body,
      h('div', { class: 'row' }, message, commit),
      h('table', { class: 'landing' },
        h('thead', {}, h('tr', {}, h('th', {}, 'Repository'), h('th', {}, 'Merge into its base'), h('th', {}, 'Push'), h('th', {}, 'Pull request'))),
        h('tbody', {}, rows)));
  }

  function drawPrs() {
    const items = st.task?.pull_requests ?? [];
    clear(prs, items.length ? h('ul', { class: 'plain' }, items.map((p) => h('li', { dataset: { number: String(p.number) } },
      h('a', { href: p.url, rel: 'noreferrer', target: '_blank' }, `#${p.number}`), ' ', badge(p.draft && p.state === 'open' ? 'draft' : p.state), ' ',
      h('code', {}, p.head), ' → ', h('code', {}, p.base), ' ', h('span', { class: 'muted small' }, st.repoName(p.repository_id))))) : null);
  }

  function update({ env, task, repoName }) {
    Object.assign(st, { env, task, repoName });
    const key = `${env?.id}:${env?.status}`;
    // Redrawn when the environment changes, never under what the person is typing.
    if (key !== st.drawnFor && !body.contains(document.activeElement)) {
      st.drawnFor = key;
      draw();
    }
    drawPrs();
  }

  return { root, update };
}
