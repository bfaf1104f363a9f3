// One session: the transcript growing live, its state, the message queue, attention requests answered in
// place, a message box (send, steer, follow up) and abort/stop/resume.
import { ApiError, del, enc, get, post, uuid } from './api.js';
import { badge, clear, confirmDialog, debounce, h, problemBox, time } from './dom.js';
import { Live } from './live.js';
import { agentPanel, permissionInputs } from './agent.js';
import { usageLine } from './usage.js';

/** The text of a transcript entry or agent message, as parts: [{kind: text|thinking|tool, text}]. */
function parts(content) {
  if (content == null) return [];
  if (typeof content === 'string') return [{ kind: 'text', text: content }];
  if (typeof content.text === 'string' && !Array.isArray(content.content)) return [{ kind: 'text', text: content.text }];
  const body = Array.isArray(content) ? content : content.content;
  if (typeof body === 'string') return [{ kind: 'text', text: body }];
  if (!Array.isArray(body)) return [{ kind: 'text', text: JSON.stringify(content) }];
  return body.map((p) => {
    if (p.type === 'text') return { kind: 'text', text: p.text ?? '' };
    if (p.type === 'thinking') return { kind: 'thinking', text: p.thinking ?? p.text ?? '' };
    if (p.type === 'toolCall' || p.type === 'tool_use') return { kind: 'tool', text: `⚙ ${p.name ?? 'tool'} ${p.arguments ? JSON.stringify(p.arguments).slice(0, 300) : ''}` };
    return { kind: 'tool', text: JSON.stringify(p).slice(0, 300) };
  });
}

function bubble(role, ps, at, extra = '') {
  return h('li', { class: `msg ${role} ${extra}`.trim() },
    h('div', { class: 'who' }, role === 'user' ? 'You' : 'Agent', at ? [' · ', time(at)] : null),
    ps.map((p) => h('div', { class: `part ${p.kind}` }, p.text)));
}

const OPEN = new Set(['starting', 'running', 'idle', 'attention', 'recovering']);
const HINTS = {
  failed: 'Resume relaunches the agent in the same environment; if the environment is unusable, reset it from the task.',
  stopped: 'Resume relaunches the agent and continues the conversation.',
  recovering: 'berth is relaunching the agent; it continues by itself.',
  attention: 'The agent asked a question: answer it below.',
  cancelled: 'The session was cancelled before it ran.',
};

export function renderSession(main, id, { setCrumbs }) {
  setCrumbs([['Workspaces', '#/'], ['Session']]);
  const st = { snap: null, task: null, ws: null, messages: [], partial: null, thinking: null, snapSeq: 0 };
  const head = h('div', { class: 'head' }, h('h1', {}, 'Session'));
  const controls = h('div', { class: 'row actions' });
  const controlErr = h('div', { class: 'errors' });
  const errors = h('div', { class: 'errors' });
  const attention = h('div', { id: 'attention', 'aria-live': 'assertive' });
  const transcript = h('ol', { class: 'transcript', id: 'transcript', 'aria-live': 'polite', 'aria-label': 'Transcript' });
  const scroller = h('div', { class: 'transcript-box', tabindex: '0' }, transcript);
  const queue = h('div', { id: 'queue' });
  const agentBox = h('div', { id: 'agent-box' });
  const text = h('textarea', { id: 'message-text', rows: 3, placeholder: 'Message the agent (Ctrl+Enter sends)' });
  const msgErr = h('div', { class: 'errors' });
  const send = (delivery) => sendMessage(delivery);
  const box = h('form', { class: 'stack', id: 'message-form' },
    h('label', { for: 'message-text' }, 'Message'), text, msgErr,
    h('div', { class: 'row end' },
      h('button', { type: 'button', id: 'steer', onclick: () => send('steer'), title: 'Read by the working agent before its next model call' }, 'Steer'),
      h('button', { type: 'button', onclick: () => send('follow_up'), title: 'Delivered after the current turn' }, 'Follow up'),
      h('button', { type: 'submit', class: 'primary', title: 'A prompt when the agent is idle, the next prompt after the turn while it works' }, 'Send')));
  box.addEventListener('submit', (ev) => { ev.preventDefault(); send('auto'); });
  text.addEventListener('keydown', (ev) => { if (ev.key === 'Enter' && (ev.ctrlKey || ev.metaKey)) { ev.preventDefault(); send('auto'); } });

  clear(main, head, errors, controls, controlErr, attention,
    h('div', { class: 'session-grid' },
      h('section', { class: 'card' }, h('h2', {}, 'Transcript'), scroller, box),
      h('aside', { class: 'stack' }, agentBox, h('section', { class: 'card' }, h('h2', {}, 'Queue'), queue))));

  let stopped = false;
  let live = null;
  let sendKey = null;

  async function sendMessage(delivery) {
    const body = { text: text.value };
    if (!body.text.trim()) return text.focus();
    if (delivery !== 'auto') body.delivery = delivery;
    sendKey ??= uuid();
    clear(msgErr);
    try {
      await post(`/sessions/${id}/messages`, body, { key: sendKey });
      sendKey = null;
      text.value = '';
      soon();
    } catch (e) {
      clear(msgErr, problemBox(e, () => sendMessage(delivery)));
    }
  }

  function nearBottom() {
    return scroller.scrollHeight - scroller.scrollTop - scroller.clientHeight < 80;
  }

  function drawTranscript() {
    const stick = nearBottom();
    const items = (st.snap?.transcript ?? []).map((e) => bubble(e.role, parts(e.content), e.created_at));
    if (st.partial !== null || st.thinking) {
      const ps = [];
      if (st.thinking) ps.push({ kind: 'thinking', text: st.thinking });
      ps.push({ kind: 'text', text: st.partial ?? '' });
      items.push(bubble('assistant', ps, null, 'streaming'));
    }
    clear(transcript, items.length ? items : h('li', { class: 'muted' }, 'Nothing said yet.'));
    if (stick) scroller.scrollTop = scroller.scrollHeight;
  }

  function drawPartial() {
    const stick = nearBottom();
    const el = transcript.querySelector('.msg.streaming');
    if (!el) return drawTranscript();
    const textPart = el.querySelector('.part.text');
    textPart.textContent = st.partial ?? '';
    if (stick) scroller.scrollTop = scroller.scrollHeight;
  }

  function control(label, path, cls = '') {
    const key = uuid();
    const run = async () => {
      clear(controlErr);
      try {
        await post(`/sessions/${id}/${path}`, path === 'launch' ? {} : undefined, { key });
        reload();
      } catch (e) {
        clear(controlErr, problemBox(e, run));
      }
    };
    return h('button', { type: 'button', class: cls, onclick: run }, label);
  }

  async function deleteSession() {
    const ok = await confirmDialog({
      title: 'Delete this session?',
      body: h('p', {}, 'Its transcript and queue go. The task, its environment and worktrees stay (they belong to the task). A running session must be stopped first.'),
      confirm: 'Delete session',
      danger: true,
    });
    if (!ok) return;
    const key = uuid();
    const run = async () => {
      clear(controlErr);
      try {
        await del(`/sessions/${id}`, { key });
        location.hash = `#/t/${st.snap.session.task_id}`;
      } catch (e) {
        clear(controlErr, problemBox(e, run));
      }
    };
    run();
  }

  function drawHead() {
    const snap = st.snap;
    const s = snap.session;
    setCrumbs([['Workspaces', '#/'], [st.ws?.name ?? 'Workspace', `#/w/${st.task?.workspace_id}`], [st.task?.title ?? 'Task', `#/t/${s.task_id}`], [snap.label]]);
    const stats = snap.statistics;
    clear(head,
      h('h1', {}, snap.label, ' ', h('span', { id: 'session-state' }, badge(snap.state))),
      h('p', { class: 'muted small' },
        `${s.agent_profile ?? 'no agent profile'} · ${s.executor_type} · ${stats.turns} turns · last activity `, time(snap.last_activity_at),
        snap.active_tool ? [' · running ', h('code', {}, snap.active_tool)] : null,
        snap.agent?.model?.id ? [' · model ', h('code', {}, snap.agent.model.id)] : null),
      usageLine(snap.usage, 'session-usage'),
      s.last_error ? h('div', { class: 'problem' }, h('strong', {}, s.last_error.code), h('p', {}, s.last_error.message)) : null,
      // Issue 39: the node that holds this session's work is not reachable: say so, and what still works.
      s.node && s.node.state !== 'up'
        ? h('div', { class: 'problem', id: 'node-down' }, h('strong', {}, `node ${s.node.id} is ${s.node.state}`),
          h('p', {}, s.node.state === 'down'
            ? 'Its agent and its disk cannot be reached: stop, messages and launches answer "node unavailable" until it is back. Deleting the session or the task is accepted; what that owes the node waits for it.'
            : 'It was given up: this session\'s workspace is lost. A new session of the task gets a new environment.'))
        : null,
      HINTS[snap.state] ? h('p', { class: 'hint' }, HINTS[snap.state]) : null);
    // An agent that said who it is and did not offer steering cannot take a steer (berth would refuse it).
    const identity = snap.agent?.identity;
    box.querySelector('#steer').hidden = Boolean(identity?.name) && !identity.steering;
    const state = snap.state;
    clear(controls,
      state === 'created' ? control('Launch agent', 'launch', 'primary') : null,
      ['running', 'starting'].includes(state) ? control('Abort turn', 'abort') : null,
      OPEN.has(state) ? control('Stop session', 'stop') : null,
      ['stopped', 'failed', 'cancelled'].includes(state) ? control('Resume session', 'resume', 'primary') : null,
      h('button', { type: 'button', class: 'danger', onclick: deleteSession }, 'Delete session…'));
  }

  function drawAttention() {
    const reqs = st.snap.attention_requests ?? [];
    if (!reqs.length) return clear(attention);
    clear(attention, reqs.map((r) => {
      const err = h('div', { class: 'errors' });
      const answer = (body) => {
        const key = uuid();
        const run = async () => {
          clear(err);
          try {
            await post(`/sessions/${id}/attention/${enc(String(r.id))}`, body, { key });
            card.classList.add('answered');
            clear(card, h('p', {}, 'Answered.'));
            reload();
          } catch (e) {
            clear(err, problemBox(e, run));
          }
        };
        return run;
      };
      let inputs;
      if (r.method === 'request_permission') {
        inputs = permissionInputs(r, answer);
      } else if (r.method === 'confirm') {
        inputs = h('div', { class: 'row' },
          h('button', { type: 'button', class: 'primary', onclick: answer({ confirmed: true }) }, 'Yes'),
          h('button', { type: 'button', onclick: answer({ confirmed: false }) }, 'No'));
      } else if (r.method === 'select' && Array.isArray(r.options)) {
        inputs = h('div', { class: 'row wrap' }, r.options.map((o) => {
          const label = typeof o === 'string' ? o : (o.label ?? o.value ?? JSON.stringify(o));
          return h('button', { type: 'button', onclick: answer({ value: typeof o === 'string' ? o : (o.value ?? o) }) }, label);
        }));
      } else {
        const field = r.method === 'editor' ? h('textarea', { rows: 5, 'aria-label': 'Answer' }) : h('input', { 'aria-label': 'Answer' });
        if (typeof r.options === 'string') field.value = r.options;
        const f = h('form', { class: 'row' }, field, h('button', { type: 'submit', class: 'primary' }, 'Answer'));
        f.addEventListener('submit', (ev) => { ev.preventDefault(); answer({ value: field.value })(); });
        inputs = f;
      }
      const card = h('div', { class: 'attention card', role: 'group', 'aria-label': 'The agent asks' },
        h('h2', {}, '● The agent asks: ', r.title ?? r.method),
        r.message ? h('p', {}, typeof r.message === 'string' ? r.message : JSON.stringify(r.message)) : null,
        inputs,
        h('div', { class: 'row end' }, h('button', { type: 'button', class: 'small', onclick: answer({ cancelled: true }) }, 'Dismiss without answering')),
        err);
      return card;
    }));
    attention.querySelector('button')?.focus({ preventScroll: false });
  }

  function drawQueue() {
    const waiting = st.messages.filter((m) => m.state === 'queued');
    const recent = st.messages.filter((m) => m.state !== 'queued').slice(-8).reverse();
    const err = h('div', { class: 'errors' });
    const cancel = (m) => async () => {
      clear(err);
      try {
        await del(`/sessions/${id}/messages/${m.id}`);
        loadMessages();
      } catch (e) {
        clear(err, problemBox(e));
      }
    };
    const row = (m) => h('li', { dataset: { state: m.state } },
      badge(m.state), ' ', m.delivery !== 'auto' ? h('span', { class: 'small muted' }, m.delivery.replace('_', ' '), ' ') : null,
      h('span', { class: 'qtext' }, m.text.length > 200 ? `${m.text.slice(0, 200)}…` : m.text), ' ', time(m.created_at),
      m.reason ? h('div', { class: 'small error-text' }, m.reason) : null,
      m.state === 'queued' ? h('button', { type: 'button', class: 'small', onclick: cancel(m) }, 'Take back') : null);
    clear(queue,
      h('p', {}, `${st.snap?.queue_length ?? waiting.length} waiting`),
      err,
      waiting.length ? h('ul', { class: 'queue' }, waiting.map(row)) : h('p', { class: 'muted small' }, 'No message waiting.'),
      recent.length ? [h('h3', {}, 'Recent'), h('ul', { class: 'queue' }, recent.map(row))] : null);
  }

  async function loadMessages() {
    try {
      st.messages = (await get(`/sessions/${id}/messages`)).items;
      if (!stopped) drawQueue();
    } catch (e) {
      if (!stopped) clear(queue, problemBox(e, loadMessages));
    }
  }

  async function reload() {
    try {
      const snap = await get(`/sessions/${id}/snapshot`);
      if (stopped) return snap.latest_seq;
      if (!st.task || st.task.id !== snap.session.task_id) {
        st.task = await get(`/tasks/${snap.session.task_id}`);
        st.ws = await get(`/workspaces/${st.task.workspace_id}`).catch(() => null);
      }
      st.snap = snap;
      st.snapSeq = snap.latest_seq;
      if (!['running', 'starting'].includes(snap.state)) {
        st.partial = null;
        st.thinking = null;
      }
      clear(errors);
      drawHead();
      clear(agentBox, agentPanel(snap, id, soon));
      drawAttention();
      drawTranscript();
      loadMessages();
      return snap.latest_seq;
    } catch (e) {
      if (e instanceof ApiError && e.status === 404) {
        gone();
        return 0;
      }
      clear(errors, problemBox(e, reload));
      throw e;
    }
  }
  const soon = debounce(() => { reload().catch(() => {}); }, 150);

  function gone() {
    // A reload or event still in flight when the person left this screen (after deleting the session, say)
    // must not draw over the screen they went to.
    if (stopped) return;
    live?.stop();
    const back = st.snap ? h('a', { href: `#/t/${st.snap.session.task_id}` }, 'Back to the task') : h('a', { href: '#/' }, 'Back to the workspaces');
    clear(main, h('div', { class: 'card' }, h('h1', {}, 'This session is gone'), h('p', {}, 'It was deleted, or this token may not see it. ', back)));
  }

  /** A line of an agent speaking the Agent Client Protocol: chunks stream in, the rest reloads. */
  function onAcp(ev) {
    const u = ev.params?.update ?? {};
    if (u.sessionUpdate === 'agent_message_chunk' || u.sessionUpdate === 'agent_thought_chunk') {
      const piece = u.content?.text ?? '';
      if (u.sessionUpdate === 'agent_thought_chunk') {
        st.thinking = (st.thinking ?? '') + piece;
        return drawTranscript();
      }
      const wasNull = st.partial === null;
      st.partial = (st.partial ?? '') + piece;
      return wasNull ? drawTranscript() : drawPartial();
    }
    // Tool calls, the plan, modes and options, a permission question, the turn's end: the snapshot has them.
    if (ev.method || ev.result?.stopReason) soon();
  }

  function onOutput(e) {
    const ev = e.data?.event ?? {};
    if (ev.type === undefined) return onAcp(ev); // ACP lines carry no `type`
    const role = ev.message?.role;
    switch (ev.type) {
      case 'agent_start':
      case 'message_start':
        if (role === 'assistant' || ev.type === 'agent_start') {
          if (st.partial === null) st.partial = '';
          drawTranscript();
        }
        break;
      case 'message_update': {
        const a = ev.assistantMessageEvent;
        if (a && a.type === 'thinking_delta') {
          st.thinking = (st.thinking ?? '') + (a.delta ?? '');
          drawTranscript();
        } else if (a ? a.type === 'text_delta' : typeof ev.delta === 'string') {
          const wasNull = st.partial === null;
          st.partial = (st.partial ?? '') + ((a ? a.delta : ev.delta) ?? '');
          if (wasNull) drawTranscript();
          else drawPartial();
        }
        break;
      }
      case 'message_end':
        if (role === 'assistant') {
          st.partial = null;
          st.thinking = null;
          // Already in the snapshot when the snapshot was taken after it.
          if (e.seq > st.snapSeq && st.snap) st.snap.transcript.push({ role: 'assistant', content: ev.message, created_at: e.created_at });
          drawTranscript();
        }
        break;
      case 'extension_ui_request':
      case 'agent_end':
        soon();
        break;
      default:
    }
  }

  (async () => {
    try {
      const seq = await reload();
      if (stopped || !st.snap) return;
      live = new Live({
        filter: { session_id: id },
        onEvent: (e) => {
          if (e.type === 'runtime.output') onOutput(e);
          else if (e.type === 'session.deleted') gone();
          else if (e.type === 'session.message_updated') { loadMessages(); soon(); }
          else soon();
        },
        onReset: () => reload(),
      }).start(seq);
    } catch {
      // shown in place
    }
  })();
  return () => { stopped = true; live?.stop(); };
}


