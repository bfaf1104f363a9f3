// The board: a hash router over five screens (sign in, workspace, task, session, cleanup jobs), and the
// browser notifications that follow the person across them.
import { ApiError, get, setUnauthenticatedHandler, token } from './api.js';
import { clear, h, problemBox, refreshTimes } from './dom.js';
import { onLiveStatus } from './live.js';
import { renderWorkspace, renderWorkspaces } from './workspace.js';
import { renderTask } from './task.js';
import { renderSession } from './session.js';
import { renderCleanup } from './cleanup.js';
import { setupNotifications, syncNotifications } from './notify.js';

// A token in the URL fragment (`/ui#token=...`) is taken and removed from the address bar at once, so it
// stays out of history, bookmarks and screenshots.
const fragment = location.hash.match(/^#token=([^&]+)/);
if (fragment) {
  history.replaceState(null, '', `${location.pathname}${location.search}#/`);
  token.set(decodeURIComponent(fragment[1]));
}

const main = document.getElementById('main');
const crumbs = document.getElementById('crumbs');
const signout = document.getElementById('signout');
const cleanupLink = document.getElementById('cleanup-link');
setupNotifications(document.getElementById('notify'));
let teardown = null;
let signInReason = null;

onLiveStatus((s) => {
  const el = document.getElementById('live');
  el.textContent = s;
  el.dataset.state = s.startsWith('live') ? 'live' : s ? 'busy' : '';
});

setUnauthenticatedHandler(() => {
  token.clear();
  signInReason = 'berth no longer accepts the token (it expired or was revoked). Paste a new one.';
  route();
});

signout.addEventListener('click', () => {
  token.clear();
  signInReason = null;
  route();
});

/** Screens call this with [label, href] pairs (the last is the current page). */
function setCrumbs(items) {
  clear(
    crumbs,
    h(
      'ol',
      {},
      items.map(([label, href], i) =>
        h('li', {}, i === items.length - 1 || !href ? h('span', { 'aria-current': 'page' }, label) : h('a', { href }, label)),
      ),
    ),
  );
  document.title = `${items.at(-1)?.[0] ?? 'berth'} · berth board`;
}

function signIn() {
  setCrumbs([['Sign in']]);
  signout.hidden = true;
  cleanupLink.hidden = true;
  const input = h('textarea', {
    id: 'token',
    name: 'token',
    rows: 4,
    autocomplete: 'off',
    spellcheck: 'false',
    required: true,
    placeholder: 'eyJhbGciOi...',
  });
  const errors = h('div', { class: 'errors' });
  const submit = h('button', { type: 'submit', class: 'primary' }, 'Sign in');
  const form = h(
    'form',
    { class: 'card signin', 'aria-labelledby': 'signin-title' },
    h('h1', { id: 'signin-title' }, 'Sign in to berth'),
    h('p', {}, 'Paste a bearer token (from ', h('code', {}, 'berth token --sub NAME --scope "..."'), '). It is kept in this tab only (session storage) and sent to this berth alone.'),
    signInReason ? h('p', { class: 'problem', role: 'alert' }, signInReason) : null,
    h('label', { for: 'token' }, 'Token'),
    input,
    errors,
    h('div', { class: 'row end' }, submit),
  );
  form.addEventListener('submit', async (ev) => {
    ev.preventDefault();
    const t = input.value.trim().replace(/^Bearer\s+/i, '');
    if (!t) return;
    submit.disabled = true;
    clear(errors);
    try {
      await get('/workspaces?limit=1', { token: t });
      token.set(t);
      signInReason = null;
      route();
    } catch (err) {
      let node;
      if (err instanceof ApiError && err.status === 401) {
        node = problemBox({ problem: { ...err.problem, title: 'berth does not accept this token', detail: `${err.problem?.detail ?? ''} Check that it is complete, not expired, and signed for this berth (issuer and audience).`.trim() } });
      } else if (err instanceof ApiError && err.status === 403) {
        node = problemBox({ problem: { ...err.problem, title: 'The token may not read workspaces', detail: `The board needs at least ${err.problem?.required_scope ?? 'tasks:read'}; sessions:read, events:read and cleanup:read show the rest.` } });
      } else {
        node = problemBox(err, () => form.requestSubmit());
      }
      clear(errors, node);
    } finally {
      submit.disabled = false;
    }
  });
  clear(main, form);
  input.focus();
}

const ROUTES = [
  [/^#?\/?$/, () => renderWorkspaces],
  [/^#\/w\/([^/]+)$/, () => renderWorkspace],
  [/^#\/t\/([^/]+)$/, () => renderTask],
  [/^#\/s\/([^/]+)$/, () => renderSession],
  [/^#\/cleanup(?:\/t\/([^/]+))?$/, () => renderCleanup],
];

function route() {
  teardown?.();
  teardown = null;
  syncNotifications(Boolean(token.get()));
  if (!token.get()) return signIn();
  signout.hidden = false;
  cleanupLink.hidden = false;
  const hash = location.hash || '#/';
  for (const [re, screen] of ROUTES) {
    const m = hash.match(re);
    if (m) {
      clear(main);
      teardown = screen()(main, m[1] ? decodeURIComponent(m[1]) : null, { setCrumbs }) ?? null;
      main.focus({ preventScroll: true });
      return;
    }
  }
  setCrumbs([['Not found']]);
  clear(main, h('div', { class: 'card' }, h('h1', {}, 'No such page'), h('p', {}, h('a', { href: '#/' }, 'Back to the workspaces'))));
}

window.addEventListener('hashchange', route);
setInterval(() => refreshTimes(), 15_000);
route();
