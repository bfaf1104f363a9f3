// The board's only way to talk to berth: the public API under /api/v1, with the token from session
// storage (never local storage). Errors come back as ApiError carrying the problem+json body.

const KEY = 'berth.token';

export const token = {
  get: () => sessionStorage.getItem(KEY),
  set: (t) => sessionStorage.setItem(KEY, t),
  clear: () => sessionStorage.removeItem(KEY),
};

export class ApiError extends Error {
  constructor(status, problem, message, network = false) {
    super(message ?? problem?.detail ?? problem?.title ?? `HTTP ${status}`);
    this.status = status;
    this.problem = problem;
    this.network = network;
  }
  get code() {
    return this.problem?.code;
  }
}

/** A random UUID, also outside a secure context (where crypto.randomUUID is missing). */
export function uuid() {
  if (crypto.randomUUID) return crypto.randomUUID();
  const b = crypto.getRandomValues(new Uint8Array(16));
  b[6] = (b[6] & 0x0f) | 0x40;
  b[8] = (b[8] & 0x3f) | 0x80;
  const x = [...b].map((v) => v.toString(16).padStart(2, '0')).join('');
  return `${x.slice(0, 8)}-${x.slice(8, 12)}-${x.slice(12, 16)}-${x.slice(16, 20)}-${x.slice(20)}`;
}

let onUnauthenticated = () => {};
/** Called when berth answers 401 (the token expired or was revoked): the app shows sign-in. */
export function setUnauthenticatedHandler(fn) {
  onUnauthenticated = fn;
}

/**
 * One request. `opts.key` is the Idempotency-Key of the person's action (the same key on a retry of the
 * same action, so berth replays rather than repeats it); creating POSTs and DELETEs get a fresh one when
 * none is given; `opts.ifMatch` / `opts.ifNoneMatch` send those headers. Resolves to `{status, body,
 * headers}`; rejects with ApiError (a 304 too: its status says the caller's copy is current).
 */
export async function request(method, path, body, opts = {}) {
  const headers = { Accept: 'application/json, application/problem+json' };
  const t = opts.token ?? token.get();
  if (t) headers.Authorization = `Bearer ${t}`;
  if (body !== undefined) headers['Content-Type'] = 'application/json';
  if (method === 'POST' || method === 'DELETE') headers['Idempotency-Key'] = opts.key ?? uuid();
  if (opts.ifMatch) headers['If-Match'] = opts.ifMatch;
  if (opts.ifNoneMatch) headers['If-None-Match'] = opts.ifNoneMatch;
  let res;
  try {
    res = await fetch(`/api/v1${path}`, {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
      signal: opts.signal,
      cache: 'no-store',
    });
  } catch (e) {
    if (e.name === 'AbortError') throw e;
    throw new ApiError(0, null, 'The request did not reach berth (network error).', true);
  }
  const text = await res.text();
  let parsed = null;
  if (text) {
    try {
      parsed = JSON.parse(text);
    } catch {
      parsed = null;
    }
  }
  if (!res.ok) {
    const problem = parsed && typeof parsed === 'object' && parsed.code ? parsed : null;
    const err = new ApiError(res.status, problem, problem ? undefined : `HTTP ${res.status}`);
    if (res.status === 401 && !opts.token) onUnauthenticated(err);
    throw err;
  }
  return { status: res.status, body: parsed, headers: res.headers };
}

export const get = async (path, opts) => (await request('GET', path, undefined, opts)).body;
export const post = async (path, body, opts) => (await request('POST', path, body, opts)).body;
export const put = async (path, body, opts) => (await request('PUT', path, body, opts)).body;
export const patch = async (path, body, opts) => (await request('PATCH', path, body, opts)).body;
export const del = async (path, opts) => (await request('DELETE', path, undefined, opts)).body;

/** Every page of a list (bounded: at most `max` items). */
export async function getAll(path, max = 2000) {
  const items = [];
  let cursor = null;
  let latest = null;
  do {
    const sep = path.includes('?') ? '&' : '?';
    const page = await get(`${path}${sep}limit=500${cursor ? `&cursor=${encodeURIComponent(cursor)}` : ''}`);
    items.push(...page.items);
    if (latest === null && typeof page.latest_seq === 'number') latest = page.latest_seq;
    cursor = page.next_cursor;
  } while (cursor && items.length < max);
  return { items, latest_seq: latest };
}

export const enc = encodeURIComponent;
