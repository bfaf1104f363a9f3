// What an agent tells about itself and its turn (agents speaking the Agent Client Protocol): who it is,
// its mode and options with selectors, its plan, the turn's tool calls with their status and paths; and
// a permission question's options as buttons.
import { enc, put } from './api.js';
import { badge, clear, h, problemBox } from './dom.js';

/** A select over `choices` ([{value, label}]) showing `current`; `pick(value)` on change. */
function selector(id, label, choices, current, pick) {
  const select = h('select', { id, 'aria-label': label },
    choices.map((c) => h('option', { value: c.value, selected: c.value === current }, c.label)));
  select.addEventListener('change', () => pick(select.value));
  return h('label', { class: 'stack small' }, label, select);
}

/** A config option's values, flat (ACP allows groups: `{group, name, options: [...]}`). */
function optionValues(option) {
  const out = [];
  for (const o of option.options ?? []) {
    if (Array.isArray(o.options)) out.push(...o.options);
    else out.push(o);
  }
  return out.map((o) => ({ value: String(o.value ?? o.id), label: o.name ?? String(o.value ?? o.id) }));
}

/**
 * The agent card: nothing when the agent tells nothing of this. `changed()` after a setting was taken
 * (the snapshot is reloaded).
 */
export function agentPanel(snap, sessionId, changed) {
  const a = snap.agent ?? {};
  const options = (a.config_options ?? []).filter((o) => o.type === 'select' && Array.isArray(o.options));
  // An agent offering its mode as a config option too: one selector (ACP's options supersede its modes).
  const modes = options.some((o) => o.category === 'mode') ? [] : (a.modes ?? []);
  const plan = a.plan ?? [];
  const tools = a.tool_calls ?? [];
  if (!a.identity?.name && !modes.length && !options.length && !plan.length && !tools.length) return null;
  const err = h('div', { class: 'errors' });
  const live = ['idle', 'running', 'attention'].includes(snap.state);
  const set = (path, body) => async () => {
    clear(err);
    try {
      await put(`/sessions/${sessionId}/${path}`, body);
      changed();
    } catch (e) {
      clear(err, problemBox(e));
      changed();
    }
  };
  const identity = a.identity?.name
    ? h('p', { class: 'small muted', id: 'agent-identity' }, a.identity.title ?? a.identity.name,
      a.identity.version ? ` ${a.identity.version}` : '', a.identity.steering ? ' · takes steering' : '')
    : null;
  const selectors = live ? [
    modes.length ? selector('agent-mode', 'Mode', modes.map((m) => ({ value: m.id, label: m.name ?? m.id })), a.mode,
      (v) => set('mode', { mode_id: v })()) : null,
    options.map((o) => selector(`agent-option-${o.id}`, o.name ?? o.id, optionValues(o), String(o.currentValue),
      (v) => set(`config-options/${enc(o.id)}`, { value: v })())),
  ] : [
    a.mode ? h('p', { class: 'small' }, 'Mode ', h('code', {}, a.mode)) : null,
  ];
  return h('section', { class: 'card', id: 'agent' },
    h('h2', {}, 'Agent'), identity, h('div', { class: 'stack' }, selectors), err,
    plan.length ? [h('h3', {}, 'Plan'), h('ol', { class: 'plan', id: 'agent-plan' },
      plan.map((p) => h('li', { dataset: { status: p.status ?? '' } }, badge(p.status ?? 'pending'), ' ', p.content ?? '')))] : null,
    tools.length ? [h('h3', {}, 'Tool calls'), h('ul', { class: 'queue', id: 'tool-calls' },
      tools.map((t) => h('li', { dataset: { status: t.status ?? '' } },
        badge(t.status ?? 'pending'), ' ', h('span', {}, t.title ?? t.kind ?? 'tool'),
        (t.paths ?? []).length ? h('div', { class: 'small' }, t.paths.map((p) => [h('code', {}, p), ' '])) : null)))] : null);
}

/** A permission question's options as buttons (allowing ones first-class), and what the tool touches. */
export function permissionInputs(r, answer) {
  const call = r.tool_call ?? {};
  const paths = (call.locations ?? []).map((l) => l.path).filter(Boolean);
  return h('div', { class: 'stack' },
    call.kind || paths.length ? h('p', { class: 'small' }, call.kind ? [h('code', {}, call.kind), ' '] : null,
      paths.map((p) => [h('code', {}, p), ' '])) : null,
    h('div', { class: 'row wrap' }, (r.options ?? []).map((o) => h('button', {
      type: 'button',
      class: String(o.kind).startsWith('allow') ? 'primary' : (String(o.kind).startsWith('reject') ? 'danger' : ''),
      dataset: { kind: o.kind ?? '', option: o.optionId },
      onclick: answer({ option_id: o.optionId }),
    }, o.name ?? o.optionId))));
}
