// What agents spent (issue 42): tokens and cost as text, a line of them for a session or a task, and a
// workspace's cost per day as a small bar chart (SVG attributes only: the CSP allows no inline style).
import { h } from './dom.js';

/** An amount with two significant digits below 1 ($0.0042), cents above ($12.30). */
export function money(amount, currency) {
  const a = Math.abs(amount);
  const digits = a >= 1 || a === 0 ? 2 : Math.min(9, 1 - Math.floor(Math.log10(a)));
  const n = amount.toFixed(digits);
  return currency === 'USD' ? `$${n}` : `${n} ${currency}`;
}

/** Every currency's cost ("$0.0042", "$1.20 + 3.0 EUR"); '' when none was reported or all are zero. */
export function costText(usage) {
  const costs = (usage?.cost ?? []).filter((c) => c.amount);
  return costs.map((c) => money(c.amount, c.currency)).join(' + ');
}

export const count = (n) => Number(n ?? 0).toLocaleString();

const KINDS = [['input', 'input_tokens', 'in'], ['output', 'output_tokens', 'out'], ['cache-read', 'cache_read_tokens', 'cache read'], ['cache-write', 'cache_write_tokens', 'cache write']];

/** "Cost $0.0042 · 1,200 in · 340 out · 0 cache read · 0 cache write tokens", each figure findable. */
export function usageLine(usage, id) {
  const u = usage ?? {};
  return h('p', { class: 'small usage', id },
    'Cost ', h('strong', { class: 'cost' }, costText(u) || '—'), ' · ',
    KINDS.map(([kind, field, label], i) => [i ? ' · ' : '', h('span', { dataset: { kind, value: String(u[field] ?? 0) } }, count(u[field]), ` ${label}`)]),
    ' tokens', u.reports ? h('span', { class: 'muted' }, ` (${u.reports} report${u.reports === 1 ? '' : 's'})`) : null);
}

const SVG = 'http://www.w3.org/2000/svg';
function s(tag, attrs = {}, ...children) {
  const el = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) if (v !== undefined && v !== null) el.setAttribute(k, String(v));
  for (const c of children.flat()) if (c !== null && c !== undefined) el.append(c);
  return el;
}

const DAY = 24 * 3600 * 1000;
const dayStart = (iso) => Math.floor(Date.parse(iso) / DAY) * DAY;

/** The currency the chart draws: US dollars when reported, else the first named; null when no cost. */
function chartCurrency(total) {
  const named = (total?.cost ?? []).filter((c) => c.amount);
  return (named.find((c) => c.currency === 'USD') ?? named[0])?.currency ?? null;
}

/**
 * Cost per UTC day from `r` (a `group_by=day` rollup with reports): one bar per day with reports, placed
 * on the span's days; each bar says its day and amount (title and aria-label). Tokens when no cost was
 * reported.
 */
export function costChart(r) {
  const currency = chartCurrency(r.total);
  const value = (u) => (currency ? (u.cost.find((c) => c.currency === currency)?.amount ?? 0) : u.input_tokens + u.output_tokens);
  const say = (v) => (currency ? money(v, currency) : `${count(v)} tokens`);
  const first = dayStart(r.from);
  const days = Math.max(1, Math.round((dayStart(r.to) - first) / DAY) + 1);
  const [W, H, TOP, BOTTOM, LEFT] = [Math.max(240, days * 12 + 8), 110, 14, 18, 4];
  const step = (W - LEFT * 2) / days;
  const max = Math.max(...r.groups.map((g) => value(g.usage)), 0) || 1;
  const bars = r.groups.map((g) => {
    const v = value(g.usage);
    const x = LEFT + Math.round((dayStart(`${g.key}T00:00:00Z`) - first) / DAY) * step;
    const height = Math.max(2, (v / max) * (H - TOP - BOTTOM));
    const label = `${g.key}: ${say(v)}${currency ? `, ${count(g.usage.input_tokens + g.usage.output_tokens)} tokens` : ''}`;
    return s('g', { role: 'listitem', 'aria-label': label },
      s('title', {}, label),
      s('rect', { class: 'bar', 'data-day': g.key, x: x + 1, y: H - BOTTOM - height, width: Math.max(2, step - 2), height, fill: 'currentColor', rx: 1 }));
  });
  const lastDay = new Date(first + (days - 1) * DAY).toISOString().slice(0, 10);
  return h('figure', { class: 'muted', id: 'usage-chart' },
    s('svg', { width: W, height: H, viewBox: `0 0 ${W} ${H}`, role: 'list', 'aria-label': `${currency ? 'Cost' : 'Tokens'} per day (UTC)` },
      s('line', { x1: LEFT, x2: W - LEFT, y1: H - BOTTOM + 0.5, y2: H - BOTTOM + 0.5, stroke: 'currentColor', 'stroke-width': 1 }),
      s('text', { x: LEFT, y: 10, 'font-size': 10, fill: 'currentColor', 'aria-hidden': 'true' }, `max ${say(max)} a day`),
      s('text', { x: LEFT, y: H - 4, 'font-size': 10, fill: 'currentColor', 'aria-hidden': 'true' }, new Date(first).toISOString().slice(0, 10)),
      s('text', { x: W - LEFT, y: H - 4, 'font-size': 10, fill: 'currentColor', 'text-anchor': 'end', 'aria-hidden': 'true' }, lastDay),
      bars),
    h('figcaption', { class: 'small' }, `${currency ? 'Cost' : 'Tokens'} per day, UTC; hover a bar for its day and amount.`));
}

/** A `group_by=model` (or agent_profile) rollup as a table, largest cost first as berth sorts it. */
export function usageTable(r, id, keyLabel) {
  if (!r.groups.length) return null;
  return h('table', { id },
    h('thead', {}, h('tr', {}, [keyLabel, 'Cost', 'Input', 'Output', 'Cache read', 'Cache write', 'Reports'].map((t) => h('th', {}, t)))),
    h('tbody', {}, r.groups.map((g) => h('tr', { dataset: { key: g.key } },
      h('td', {}, g.key ? h('code', {}, g.key) : h('span', { class: 'muted' }, 'not named')),
      h('td', { class: 'cost' }, costText(g.usage) || '—'),
      [g.usage.input_tokens, g.usage.output_tokens, g.usage.cache_read_tokens, g.usage.cache_write_tokens, g.usage.reports].map((n) => h('td', {}, count(n)))))));
}
