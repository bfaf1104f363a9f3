// Small DOM helpers: element building (never innerHTML with data), times, problems, confirmations.

/** h('button', {class: 'x', onclick: fn}, 'text', child, [more]) */
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs ?? {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith('on') && typeof v === 'function') el.addEventListener(k.slice(2), v);
    else if (k === 'class') el.className = v;
    else if (k === 'dataset') Object.assign(el.dataset, v);
    else if (k === 'value') el.value = v;
    else if (k === 'checked') el.checked = !!v;
    else if (v === true) el.setAttribute(k, '');
    else el.setAttribute(k, String(v));
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const c of children) {
    if (c === undefined || c === null || c === false) continue;
    if (Array.isArray(c)) append(el, c);
    else if (c instanceof Node) el.appendChild(c);
    else el.appendChild(document.createTextNode(String(c)));
  }
}

export function clear(el, ...children) {
  el.replaceChildren();
  append(el, children);
  return el;
}

const UNITS = [
  ['year', 365 * 24 * 3600],
  ['month', 30 * 24 * 3600],
  ['day', 24 * 3600],
  ['hour', 3600],
  ['minute', 60],
  ['second', 1],
];
const fmt = new Intl.RelativeTimeFormat(undefined, { numeric: 'auto' });

export function relative(iso, now = Date.now()) {
  const t = Date.parse(iso);
  if (Number.isNaN(t)) return '';
  const secs = Math.round((t - now) / 1000);
  if (Math.abs(secs) < 10) return 'just now';
  for (const [unit, size] of UNITS) {
    if (Math.abs(secs) >= size || unit === 'second') return fmt.format(Math.round(secs / size), unit);
  }
  return '';
}

/** A <time> that reads "2 minutes ago" with the exact time on hover; kept fresh by `refreshTimes`. */
export function time(iso) {
  if (!iso) return h('span', { class: 'muted' }, '—');
  const exact = new Date(iso).toLocaleString();
  return h('time', { datetime: iso, title: exact }, relative(iso));
}

export function refreshTimes(root = document) {
  for (const el of root.querySelectorAll('time[datetime]')) el.textContent = relative(el.getAttribute('datetime'));
}

/** A state as a coloured badge (the colour comes from the class, the word is always shown). */
export function badge(state, extra = '') {
  return h('span', { class: `badge s-${state} ${extra}`.trim() }, String(state).replace(/_/g, ' '));
}

/**
 * An error in place: berth's problem title and detail, and a retry button when it is retryable
 * (or when the request never reached berth). `retry` is called with no argument.
 */
export function problemBox(err, retry) {
  const p = err?.problem;
  const title = p?.title ?? (err?.network ? 'berth could not be reached' : 'Something went wrong');
  const detail = p?.detail ?? err?.message ?? String(err);
  const box = h(
    'div',
    { class: 'problem', role: 'alert' },
    h('strong', {}, title),
    detail && detail !== title ? h('p', {}, detail) : null,
    p?.required_scope ? h('p', {}, `This token lacks the scope `, h('code', {}, p.required_scope), '.') : null,
    p?.errors?.length ? h('ul', {}, p.errors.map((e) => h('li', {}, `${e.field ?? ''} ${e.message ?? ''}`.trim()))) : null,
    p?.code ? h('p', { class: 'muted small' }, `code ${p.code}`, p.request_id ? ` · request ${p.request_id}` : '') : null,
  );
  if (retry && (p?.retryable || err?.network)) {
    const wait = p?.retry_after_ms ?? 0;
    const btn = h('button', { type: 'button', onclick: () => { box.remove(); retry(); } }, 'Retry');
    if (wait > 0) {
      btn.disabled = true;
      btn.textContent = `Retry (in ${Math.ceil(wait / 1000)} s)`;
      setTimeout(() => { btn.disabled = false; btn.textContent = 'Retry'; }, wait);
    }
    box.append(btn);
  }
  return box;
}

/** Shows `node` in `slot` (an error region next to the control that failed). */
export function showIn(slot, node) {
  clear(slot, node);
  return node;
}

/**
 * A modal confirmation (a <dialog>: focus moves into it, Escape cancels). Resolves true only when the
 * person presses the confirming button. `body` is text or nodes; `danger` colours the button.
 */
export function confirmDialog({ title, body, confirm = 'Confirm', danger = false, requireCheck = null }) {
  return new Promise((resolve) => {
    const check = requireCheck ? h('input', { type: 'checkbox', id: 'confirm-check' }) : null;
    const ok = h('button', { type: 'button', class: danger ? 'danger' : 'primary' }, confirm);
    const cancel = h('button', { type: 'button' }, 'Cancel');
    const dlg = h(
      'dialog',
      { class: 'confirm', 'aria-labelledby': 'confirm-title' },
      h('h2', { id: 'confirm-title' }, title),
      h('div', { class: 'confirm-body' }, body),
      check ? h('p', {}, h('label', { for: 'confirm-check' }, check, ' ', requireCheck)) : null,
      h('div', { class: 'row end' }, cancel, ok),
    );
    if (check) {
      ok.disabled = true;
      check.addEventListener('change', () => { ok.disabled = !check.checked; });
    }
    let answered = false;
    const done = (v) => {
      if (answered) return;
      answered = true;
      dlg.close();
      dlg.remove();
      resolve(v);
    };
    ok.addEventListener('click', () => done(true));
    cancel.addEventListener('click', () => done(false));
    dlg.addEventListener('close', () => done(false));
    document.body.append(dlg);
    dlg.showModal();
    cancel.focus();
  });
}

/** A button that copies `text`, saying so. */
export function copyButton(text, label = 'Copy') {
  const btn = h('button', { type: 'button', class: 'small', title: 'Copy to the clipboard' }, label);
  btn.addEventListener('click', async () => {
    try {
      await navigator.clipboard.writeText(text);
      btn.textContent = 'Copied';
    } catch {
      btn.textContent = 'Select and copy by hand';
    }
    setTimeout(() => { btn.textContent = label; }, 1500);
  });
  return btn;
}

/** Runs `fn` at most once per `ms`, trailing. */
export function debounce(fn, ms) {
  let t = null;
  return (...args) => {
    clearTimeout(t);
    t = setTimeout(() => fn(...args), ms);
  };
}

export function shortId(id) {
  return id ? String(id).slice(-8) : '';
}
