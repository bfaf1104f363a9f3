// Live events for a screen. With stream tickets (`POST /events/tickets`) it follows
// `/api/v1/events/stream?ticket=..&after=N` in an EventSource: on `error` the EventSource is closed
// (its URL's ticket is single use), a new ticket is minted and the stream reopens after the last seq
// seen; on `event: reset` the screen reloads its snapshot and the stream starts again from the new
// follow point. A berth without tickets is followed by polling the replay (`GET /events?after=N`).
import { ApiError, get, post } from './api.js';

let ticketsMissing = false;
const statusListeners = new Set();
let currentStatus = '';

export function onLiveStatus(fn) {
  statusListeners.add(fn);
  fn(currentStatus);
}

function setStatus(s) {
  currentStatus = s;
  for (const fn of statusListeners) fn(s);
}

/** The seq a screen follows from when its lists do not say (`latest_seq` of the replay). */
export async function followPoint() {
  const page = await get('/events?limit=1');
  return page.latest_seq ?? 0;
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

export class Live {
  /**
   * filter: {workspace_id?, task_id?, session_id?}; onEvent(event); onReset(): Promise<seq> reloads the
   * screen's snapshot and returns its follow point.
   */
  constructor({ filter = {}, types = [], onEvent, onReset }) {
    this.filter = filter;
    // Event types or prefixes ending in `.` (`cleanup_job.`): the stream narrows to them, and so does this.
    this.types = types;
    this.onEvent = onEvent;
    this.onReset = onReset;
    this.last = 0;
    this.stopped = false;
    this.source = null;
    this.failures = 0;
  }

  start(after) {
    this.last = after ?? 0;
    this.run();
    return this;
  }

  stop() {
    this.stopped = true;
    this.source?.close();
    this.source = null;
  }

  matches(e) {
    const typed = !this.types.length || this.types.some((t) => (t.endsWith('.') ? e.type.startsWith(t) : e.type === t));
    return typed && Object.entries(this.filter).every(([k, v]) => !v || e[k] === v);
  }

  deliver(e) {
    if (e.seq <= this.last) return; // never twice
    this.last = e.seq;
    if (this.matches(e)) {
      try {
        this.onEvent(e);
      } catch (err) {
        console.warn('board: handling an event failed', err);
      }
    }
  }

  async reset() {
    setStatus('reloading');
    try {
      this.last = await this.onReset();
    } catch {
      await sleep(1000);
    }
  }

  async run() {
    if (!ticketsMissing) {
      try {
        const t = await post('/events/tickets', {});
        if (this.stopped) return;
        this.open(t.ticket);
        return;
      } catch (err) {
        if (this.stopped) return;
        if (err instanceof ApiError && (err.status === 404 || err.status === 405)) {
          ticketsMissing = true;
        } else {
          return this.retryLater();
        }
      }
    }
    return this.poll();
  }

  retryLater() {
    this.failures += 1;
    setStatus('reconnecting');
    const wait = Math.min(10_000, 500 * 2 ** Math.min(this.failures, 5));
    setTimeout(() => { if (!this.stopped) this.run(); }, wait);
  }

  open(ticket) {
    const q = new URLSearchParams({ ticket, after: String(this.last) });
    for (const [k, v] of Object.entries(this.filter)) if (v) q.set(k, v);
    if (this.types.length) q.set('types', this.types.join(','));
    const es = new EventSource(`/api/v1/events/stream?${q}`);
    this.source = es;
    es.onmessage = (m) => {
      let e;
      try {
        e = JSON.parse(m.data);
      } catch {
        return;
      }
      this.deliver(e);
    };
    es.addEventListener('ready', () => {
      this.failures = 0;
      setStatus('live');
    });
    es.addEventListener('reset', async () => {
      es.close();
      this.source = null;
      await this.reset();
      if (!this.stopped) this.run();
    });
    es.onerror = () => {
      // The browser would reconnect with the same (spent) ticket: close, and mint a new one.
      es.close();
      if (this.source === es) this.source = null;
      if (!this.stopped) this.retryLater();
    };
  }

  async poll() {
    setStatus('live (polling)');
    while (!this.stopped) {
      let page;
      try {
        page = await get(`/events?after=${this.last}&limit=500`);
      } catch {
        setStatus('reconnecting');
        await sleep(2000);
        continue;
      }
      if (this.stopped) return;
      setStatus('live (polling)');
      if (page.truncated) {
        await this.reset();
        continue;
      }
      for (const e of page.events) this.deliver(e);
      if (page.events.length < 500) await sleep(700);
    }
  }
}
