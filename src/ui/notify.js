// Browser notifications (issue 42 item 4): on any screen, once the person allowed them, a session that
// needs attention, failed or finished a turn says so, and a click opens it. Permission is asked only from
// the header's button (a user gesture). The screens' streams follow their own subject, so this follows
// one of its own through live.js, narrowed to `session.state_changed` across everything the token sees.
import { get } from './api.js';
import { shortId } from './dom.js';
import { Live, followPoint } from './live.js';

const supported = typeof window.Notification === 'function';
const granted = () => supported && Notification.permission === 'granted';

let button = null;
let signedIn = false;
let live = null;
let following = false;
let generation = 0; // a start that finishes after a stop (or a newer start) does nothing
const last = new Map(); // session id -> the state its previous event named
const names = new Map(); // session id -> Promise<{label, task}>

/** What a move from `from` to `to` tells the person, or null when it is not worth a notification. */
function news(from, to) {
  if (to === 'attention' && from !== 'attention') return 'needs your attention';
  if (to === 'failed' && from !== 'failed') return 'failed';
  if (to === 'idle' && from === 'running') return 'finished its turn';
  return null;
}

/** The session's name and its task's title, asked once per session when a notification is due. */
function describe(e) {
  if (!names.has(e.session_id)) {
    names.set(e.session_id, Promise.all([
      get(`/sessions/${e.session_id}`).catch(() => null),
      e.task_id ? get(`/tasks/${e.task_id}`).catch(() => null) : null,
    ]).then(([s, t]) => ({ label: s?.name || `session ${shortId(e.session_id)}`, task: t?.title || null })));
  }
  return names.get(e.session_id);
}

async function notify(e, what) {
  const { label, task } = await describe(e);
  if (!signedIn || !granted()) return;
  try {
    const n = new Notification(`${label} ${what}`, {
      body: task ? `Task: ${task}` : 'berth board',
      tag: `berth-session-${e.session_id}`,
      data: { session_id: e.session_id },
    });
    n.onclick = () => {
      window.focus();
      location.hash = `#/s/${e.session_id}`;
      n.close();
    };
  } catch (err) {
    // Some browsers (Android's Chrome) show notifications only through a service worker.
    console.warn('board: a notification could not be shown', err);
  }
}

function onEvent(e) {
  if (!e.session_id) return;
  // `data.state` is the new state; `from` is remembered here (or taken from the event if it says).
  const to = e.data?.to ?? e.data?.state;
  const from = e.data?.from ?? last.get(e.session_id);
  last.set(e.session_id, to);
  const what = news(from, to);
  if (what) notify(e, what);
}

function start() {
  following = true;
  const mine = ++generation;
  followPoint().then((from) => {
    if (mine === generation) live = new Live({ types: ['session.state_changed'], onEvent, onReset: () => followPoint() }).start(from);
  }, () => {
    // No events for this token, or berth away: the next screen change tries again.
    if (mine === generation) following = false;
  });
}

function stop() {
  following = false;
  generation += 1;
  live?.stop();
  live = null;
}

/** Follows, or stops, as the sign-in and the permission stand now; shows the button where it helps. */
export function syncNotifications(isSignedIn) {
  signedIn = isSignedIn;
  if (button) button.hidden = !signedIn || !supported || Notification.permission !== 'default';
  const want = signedIn && granted();
  if (want && !following) start();
  else if (!want && following) stop();
}

/** Wires the header's "Enable notifications" button (hidden when unsupported or already decided). */
export function setupNotifications(el) {
  button = el;
  button.addEventListener('click', async () => {
    button.disabled = true;
    try {
      await Notification.requestPermission();
    } finally {
      button.disabled = false;
      syncNotifications(signedIn);
    }
  });
}
