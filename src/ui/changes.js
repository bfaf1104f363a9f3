// What the agent did: an environment's diff per file (unified, additions and deletions marked, large
// files collapsed until opened), comments on its lines gathered into a review, and the review sent to a
// session's agent. The diff is re-read when the task changes, but redrawn only when it did (ETag), and
// the comments being written live outside it, so nothing typed is lost.
import { ApiError, post, request } from './api.js';
import { badge, clear, h, problemBox, shortId, time } from './dom.js';

const MARK = { added: 'A', modified: 'M', deleted: 'D', renamed: 'R', copied: 'C', type_changed: 'T', untracked: '?' };
/** A file whose patch has more lines than this starts collapsed. */
const LARGE = 400;
/** Session states that take messages. */
const TAKES = ['starting', 'running', 'idle', 'attention', 'recovering'];

/** The lines of a unified patch inside its hunks, numbered as the hunks number them. */
export function patchLines(patch) {
  const out = [];
  let oldN = 0;
  let newN = 0;
  let inHunk = false;
  for (const raw of patch.split('\n')) {
    const m = /^@@ -(\d+)(?:,\d+)? \+(\d+)(?:,\d+)? @@(.*)$/.exec(raw);
    if (m) {
      oldN = Number(m[1]);
      newN = Number(m[2]);
      inHunk = true;
      out.push({ kind: 'hunk', text: raw });
      continue;
    }
    if (!inHunk || raw === '') continue;
    const c = raw[0];
    const text = raw.slice(1);
    if (c === ' ') out.push({ kind: 'ctx', old: oldN++, new: newN++, text });
    else if (c === '-') out.push({ kind: 'del', old: oldN++, text });
    else if (c === '+') out.push({ kind: 'add', new: newN++, text });
    else if (c === '\\') out.push({ kind: 'note', text: raw });
    else inHunk = false;
  }
  return out;
}

/**
 * The files of a diff answer (`repositories[].files[]`), one collapsible block each. `onLine(ref)` (when
 * given) makes each line commentable: ref = {repository_id, path, line, side, quote}.
 */
export function diffFiles(repos, { repoName, onLine = null, idPrefix = 'diff' }) {
  const blocks = [];
  for (const r of repos) {
    for (const f of r.files) blocks.push(fileBlock(r, f, { repoName, onLine, idPrefix }));
  }
  if (!blocks.length) return h('p', { class: 'muted' }, 'No changes.');
  return h('div', { class: 'diff-files' }, blocks);
}

function fileBlock(repo, f, { repoName, onLine, idPrefix }) {
  const name = f.old_path && f.old_path !== f.path ? `${f.old_path} → ${f.path}` : f.path;
  const counts = f.binary ? h('span', { class: 'muted small' }, 'binary') : h('span', { class: 'small' },
    h('span', { class: 'adds' }, `+${f.additions ?? 0}`), ' ', h('span', { class: 'dels' }, `−${f.deletions ?? 0}`));
  const lines = f.patch_encoding === 'utf8' ? patchLines(f.patch) : null;
  const large = f.truncated || (lines && lines.length > LARGE);
  const body = h('div', { class: 'file-body' });
  const draw = () => {
    if (body.firstChild) return;
    if (f.binary) clear(body, h('p', { class: 'muted small' }, 'A binary file: no lines to show.'));
    else if (!lines) clear(body, h('p', { class: 'muted small' }, 'Not UTF-8 text: shown as bytes by the API (patch_encoding base64).'));
    else clear(body, lineTable(repo, f, lines, onLine), f.truncated ? h('p', { class: 'muted small' }, 'Cut here: the patch is longer than the server\'s limit per file.') : null);
  };
  const details = h('details', { class: 'file', dataset: { path: f.path, repositoryId: repo.repository_id }, id: `${idPrefix}-${repo.repository_id}-${f.path}` },
    h('summary', {},
      h('code', { class: `mark st-${f.status}`, title: f.status }, MARK[f.status] ?? '?'), ' ',
      h('code', { class: 'fname' }, name), ' ', counts,
      repoName ? h('span', { class: 'muted small' }, ` · ${repoName(repo.repository_id)}`) : null,
      large ? h('span', { class: 'muted small' }, ' · large: open to show') : null),
    body);
  details.addEventListener('toggle', () => { if (details.open) draw(); });
  if (!large) {
    details.open = true;
    draw();
  }
  return details;
}

function lineTable(repo, f, lines, onLine) {
  return h('table', { class: 'diff' }, h('tbody', {}, lines.map((l) => {
    if (l.kind === 'hunk' || l.kind === 'note') return h('tr', { class: l.kind }, h('td', { colspan: 4 }, l.text));
    const side = l.kind === 'del' ? 'old' : 'new';
    const number = side === 'old' ? l.old : l.new;
    const button = onLine ? h('button', {
      type: 'button',
      class: 'line-comment small',
      title: 'Comment on this line',
      'aria-label': `Comment on ${f.path} line ${number}${side === 'old' ? ' (old)' : ''}`,
      onclick: () => onLine({ repository_id: repo.repository_id, path: f.path, line: number, side, quote: l.text }),
    }, '+') : null;
    return h('tr', { class: l.kind, dataset: { side, line: String(number) } },
      h('td', { class: 'num' }, l.old ?? ''),
      h('td', { class: 'num' }, l.new ?? ''),
      h('td', { class: 'act' }, button),
      h('td', { class: 'code' }, h('span', { class: 'marker' }, l.kind === 'add' ? '+' : l.kind === 'del' ? '−' : ' '), l.text));
  })));
}

/**
 * The "Changes" card of a task: its environment's diff with commentable lines, the review being written,
 * and the reviews already made. `update({env, sessions, repoName})` is called on every refresh of the task.
 */
export function changesPanel() {
  const root = h('div', { id: 'changes' });
  const status = h('div', { class: 'errors' });
  const files = h('div', {});
  const review = h('section', { class: 'review', id: 'review', 'aria-label': 'Review' });
  const past = h('div', { class: 'small' });
  clear(root, status, files, review, past);
  const st = { env: null, sessions: [], repoName: null, etag: null, drafts: [], body: '', sent: null };

  async function loadDiff() {
    if (!st.env || !['ready', 'stopped'].includes(st.env.status)) {
      st.etag = null;
      clear(files, h('p', { class: 'muted' }, st.env ? `The environment is ${st.env.status}: its changes are shown once it is ready.` : 'No environment yet.'));
      return;
    }
    try {
      const r = await request('GET', `/environments/${st.env.id}/diff`, undefined, { ifNoneMatch: st.etag ?? undefined });
      st.etag = r.headers.get('ETag');
      const d = r.body;
      clear(status);
      clear(files,
        h('p', { class: 'muted small' }, `${d.total_files} changed file${d.total_files === 1 ? '' : 's'} since the base branch (committed, staged, unstaged and untracked).`,
          d.next_cursor ? ' More files than one page: the first are shown.' : ''),
        diffFiles(d.repositories, { repoName: st.repoName, onLine: addDraft }));
    } catch (e) {
      if (e instanceof ApiError && e.status === 304) return;
      clear(status, problemBox(e, loadDiff));
    }
  }

  function addDraft(ref) {
    const key = `${ref.repository_id}:${ref.path}:${ref.side}:${ref.line}`;
    let d = st.drafts.find((x) => x.key === key);
    if (!d) {
      d = { key, ...ref, body: '' };
      st.drafts.push(d);
      drawReview();
    }
    review.querySelector(`textarea[data-key="${CSS.escape(key)}"]`)?.focus();
  }

  function drawReview() {
    const sessions = st.sessions.filter((x) => x.task_environment_id === st.env?.id && TAKES.includes(x.state));
    const target = h('select', { id: 'review-session', 'aria-label': 'Send the review to' },
      sessions.map((x) => h('option', { value: x.id }, `${x.name || shortId(x.id)} (${x.state})`)),
      h('option', { value: '' }, 'nobody: keep the review'));
    const body = h('textarea', { id: 'review-body', rows: 2, placeholder: 'What you think of the change as a whole (optional with comments)', value: st.body });
    body.addEventListener('input', () => { st.body = body.value; });
    const err = h('div', { class: 'errors' });
    const send = h('button', { type: 'button', class: 'primary', id: 'send-review' }, 'Send review');
    send.disabled = !st.env;
    send.addEventListener('click', async () => {
      clear(err);
      send.disabled = true;
      const payload = {
        body: st.body,
        comments: st.drafts.map((d) => ({ repository_id: d.repository_id, path: d.path, line: d.line, side: d.side, body: d.body })),
      };
      if (target.value) payload.session_id = target.value;
      try {
        const r = await post(`/environments/${st.env.id}/reviews`, payload);
        st.drafts = [];
        st.body = '';
        st.sent = r;
        drawReview();
        loadPast();
      } catch (e) {
        clear(err, problemBox(e));
        send.disabled = false;
      }
    });
    clear(review,
      h('h3', {}, 'Review'),
      st.drafts.length ? h('ul', { class: 'drafts' }, st.drafts.map((d) => {
        const text = h('textarea', { rows: 2, dataset: { key: d.key }, 'aria-label': `Comment on ${d.path} line ${d.line}`, value: d.body });
        text.addEventListener('input', () => { d.body = text.value; });
        const drop = h('button', { type: 'button', class: 'small', 'aria-label': `Drop the comment on ${d.path} line ${d.line}` }, 'Drop');
        drop.addEventListener('click', () => { st.drafts = st.drafts.filter((x) => x !== d); drawReview(); });
        return h('li', {}, h('div', { class: 'row' }, h('code', {}, `${d.path}:${d.line}${d.side === 'old' ? ' (old)' : ''}`), h('span', { class: 'spacer' }), drop),
          h('pre', { class: 'quote' }, d.quote), text);
      })) : h('p', { class: 'muted small' }, 'Press + beside a line of the diff to comment on it.'),
      body,
      h('div', { class: 'row' }, h('label', { for: 'review-session' }, 'Send to'), target, h('span', { class: 'spacer' }), send),
      err,
      st.sent ? h('p', { class: 'small', id: 'review-sent' }, st.sent.session_id
        ? ['Sent to ', h('a', { href: `#/s/${st.sent.session_id}` }, `session ${shortId(st.sent.session_id)}`), ` as one message (${st.sent.comments.length} comment${st.sent.comments.length === 1 ? '' : 's'}).`]
        : 'Review kept.') : null);
  }

  async function loadPast() {
    if (!st.env) return clear(past);
    try {
      const { body } = await request('GET', `/environments/${st.env.id}/reviews`);
      const items = body.items;
      clear(past, items.length ? h('details', {}, h('summary', {}, `${items.length} review${items.length === 1 ? '' : 's'} made`),
        h('ul', { class: 'plain' }, items.slice().reverse().map((r) => h('li', {},
          time(r.created_at), ' ', r.session_id ? badge('sent') : badge('kept'), ' ', r.body ? h('span', {}, r.body) : null,
          h('ul', { class: 'files' }, r.comments.map((c) => h('li', {}, h('code', {}, `${c.path}:${c.line}`), ' ', c.body))))))) : null);
    } catch {
      clear(past);
    }
  }

  function update({ env, sessions, repoName }) {
    const envChanged = env?.id !== st.env?.id;
    Object.assign(st, { env, sessions, repoName });
    if (envChanged) {
      st.etag = null;
      st.drafts = [];
      loadPast();
    }
    if (!review.contains(document.activeElement)) drawReview();
    loadDiff();
  }

  return { root, update };
}
