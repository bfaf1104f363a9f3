// Each turn of a task's sessions: the prompt, when it ran, how many files it changed, its own diff, and
// "Restore to here", which puts the environment's worktrees back to how that turn left them (after
// asking: what changed since is discarded).
import { get, post } from './api.js';
import { clear, confirmDialog, h, problemBox, shortId, time } from './dom.js';
import { diffFiles } from './changes.js';

export function turnsPanel() {
  const root = h('div', { id: 'turns' });
  const st = { env: null, sessions: [], repoName: null, open: null, turns: new Map(), note: null };
  const list = h('div', {});
  const shown = h('div', { id: 'turn-diff' });
  const note = h('div', { class: 'errors', 'aria-live': 'polite' });
  clear(root, note, list, shown);

  async function load() {
    const mine = st.sessions.filter((x) => x.task_environment_id && x.task_environment_id === st.env?.id);
    const all = await Promise.all(mine.map(async (x) => {
      try {
        return [x, (await get(`/sessions/${x.id}/turns`)).items];
      } catch {
        return [x, []];
      }
    }));
    st.turns = new Map(all);
    draw();
  }

  function draw() {
    const rows = [];
    for (const [x, items] of st.turns) {
      for (const t of items) rows.push({ session: x, t });
    }
    if (!rows.length) {
      clear(list, h('p', { class: 'muted' }, 'No turn yet: each prompt a session\'s agent takes is one.'));
      return;
    }
    clear(list, h('table', { class: 'turns' },
      h('thead', {}, h('tr', {}, h('th', {}, 'Session'), h('th', {}, 'Turn'), h('th', {}, 'Prompt'), h('th', {}, 'Started'), h('th', {}, 'Files'), h('th', {}, ''))),
      h('tbody', {}, rows.map(({ session, t }) => {
        const key = `${session.id}/${t.number}`;
        const show = h('button', { type: 'button', class: 'small', 'aria-pressed': String(st.open === key) }, st.open === key ? 'Hide diff' : 'Show diff');
        show.addEventListener('click', () => toggle(session, t, key));
        const restore = h('button', { type: 'button', class: 'small danger', title: 'Put the worktrees back to how this turn left them' }, 'Restore to here…');
        restore.disabled = !t.end_checkpoint_id;
        restore.addEventListener('click', () => restoreTo(session, t));
        return h('tr', { dataset: { turn: String(t.number), sessionId: session.id } },
          h('td', {}, h('a', { href: `#/s/${session.id}` }, session.name || shortId(session.id))),
          h('td', {}, String(t.number)),
          h('td', { class: 'prompt' }, t.prompt.length > 120 ? `${t.prompt.slice(0, 120)}…` : t.prompt),
          h('td', {}, time(t.started_at), t.settled_at ? null : h('span', { class: 'muted small' }, ' (running)')),
          h('td', {}, t.files_changed ?? '—'),
          h('td', {}, h('div', { class: 'row' }, show, restore)));
      }))));
  }

  async function toggle(session, t, key) {
    if (st.open === key) {
      st.open = null;
      clear(shown);
      draw();
      return;
    }
    st.open = key;
    draw();
    clear(shown, h('p', { class: 'muted' }, 'Loading…'));
    try {
      const d = await get(`/sessions/${session.id}/turns/${t.number}/diff`);
      if (st.open !== key) return;
      clear(shown, h('h3', {}, `What turn ${t.number} changed`), diffFiles(d.repositories, { repoName: st.repoName, idPrefix: `turn-${t.number}` }));
    } catch (e) {
      clear(shown, problemBox(e, () => { st.open = null; toggle(session, t, key); }));
    }
  }

  async function restoreTo(session, t) {
    const ok = await confirmDialog({
      title: `Restore to the end of turn ${t.number}?`,
      body: [
        h('p', {}, 'The environment\'s worktrees are put back to how this turn left them: files are written as they were then, files made since are removed. Ignored files, the index and the branches are left alone.'),
        h('p', {}, 'Whatever changed since, by the agent or by hand, is discarded, unless a later turn\'s checkpoint holds it (then restore to that turn to get it back).'),
      ],
      confirm: 'Restore',
      danger: true,
      requireCheck: 'I understand what changed since this turn will be lost.',
    });
    if (!ok) return;
    clear(note);
    try {
      await post(`/environments/${st.env.id}/restore`, { checkpoint_id: t.end_checkpoint_id, discard_worktree_changes: true });
      clear(note, h('p', { class: 'small', id: 'restored' }, `Restored to the end of turn ${t.number} of ${session.name || shortId(session.id)}.`));
      st.onRestored?.();
    } catch (e) {
      clear(note, problemBox(e));
    }
  }

  function update({ env, sessions, repoName, onRestored }) {
    Object.assign(st, { env, sessions, repoName, onRestored });
    if (!env) {
      clear(list, h('p', { class: 'muted' }, 'No environment yet.'));
      return;
    }
    load();
  }

  return { root, update };
}
