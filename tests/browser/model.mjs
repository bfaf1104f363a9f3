// A scripted model server on loopback, for the board's real-agent test (acp.mjs), offline: OpenAI Chat
// Completions (`/v1/chat/completions`, opencode) and Anthropic Messages (`/v1/messages`, Claude Code),
// both streaming, logging every request. The script, by the last message:
//   - a request offering no tools (title and summary calls): a short title;
//   - OpenAI, the user asking to "write <absolute path>": a `todowrite` call, then, on its result, a
//     `write` call for that path, then, on that result, "I wrote it.";
//   - Anthropic, the user asking for "a plan": a `TodoWrite` call (which Claude Code shows as its plan),
//     then, on its result, "Planned.";
//   - anything else: "Hello from the model.".
import http from 'node:http';

const TITLE = 'Board title';

function sse(res, body) {
  res.write(`data: ${JSON.stringify(body)}\n\n`);
}

function stream(res, { text, tool }) {
  res.writeHead(200, { 'Content-Type': 'text/event-stream', 'Cache-Control': 'no-cache' });
  const chunk = (delta, finish = null) => ({
    id: 'chatcmpl-board', object: 'chat.completion.chunk', created: 0, model: 'mock-model',
    choices: [{ index: 0, delta, finish_reason: finish }],
  });
  if (tool) {
    sse(res, chunk({ role: 'assistant', content: null, tool_calls: [{ index: 0, id: tool.id, type: 'function', function: { name: tool.name, arguments: '' } }] }));
    sse(res, chunk({ tool_calls: [{ index: 0, function: { arguments: JSON.stringify(tool.arguments) } }] }));
  } else {
    // A few pieces, so the board streams.
    const words = text.split(/(?<= )/);
    words.forEach((w, i) => sse(res, chunk(i === 0 ? { role: 'assistant', content: w } : { content: w })));
  }
  const last = chunk({}, tool ? 'tool_calls' : 'stop');
  last.usage = { prompt_tokens: 120, completion_tokens: 12, total_tokens: 132 };
  sse(res, last);
  res.end('data: [DONE]\n\n');
}

const textOf = (content) => (typeof content === 'string' ? content : (content ?? []).map((p) => p.text ?? '').join(''));

/** What the model answers to `body`. */
export function answer(body) {
  const messages = body.messages ?? [];
  if (!(body.tools ?? []).length) return { text: TITLE };
  const last = messages[messages.length - 1] ?? {};
  const asked = textOf([...messages].reverse().find((m) => m.role === 'user')?.content);
  const target = asked.match(/write (\/\S+)/i)?.[1];
  if (last.role === 'tool') {
    if (last.tool_call_id === 'call_plan' && target) {
      return { tool: { id: 'call_write', name: 'write', arguments: { filePath: target, content: 'hello from the board\n' } } };
    }
    return { text: 'I wrote it.' };
  }
  if (target) {
    return {
      tool: {
        id: 'call_plan',
        name: 'todowrite',
        arguments: { todos: [
          { id: '1', content: 'Write the greeting file', status: 'in_progress', priority: 'high' },
          { id: '2', content: 'Say it is done', status: 'pending', priority: 'low' },
        ] },
      },
    };
  }
  return { text: 'Hello from the model.' };
}

const PLAN = [
  { content: 'Write the greeting file', status: 'in_progress', activeForm: 'Writing the greeting file' },
  { content: 'Say it is done', status: 'pending', activeForm: 'Saying it is done' },
];

/** What the model answers to an Anthropic Messages `body`. */
export function answerAnthropic(body) {
  const messages = body.messages ?? [];
  if (!(body.tools ?? []).length) return { text: TITLE };
  const blocks = (m) => (Array.isArray(m?.content) ? m.content : [{ type: 'text', text: m?.content ?? '' }]);
  const last = messages[messages.length - 1];
  if (blocks(last).some((b) => b.type === 'tool_result')) return { text: 'Planned.' };
  const asked = blocks(last).map((b) => b.text ?? '').join('');
  if (/a plan/i.test(asked)) return { tool: { id: 'toolu_plan', name: 'TodoWrite', arguments: { todos: PLAN } } };
  return { text: 'Hello from the model.' };
}

function streamAnthropic(res, { text, tool }) {
  res.writeHead(200, { 'Content-Type': 'text/event-stream', 'Cache-Control': 'no-cache' });
  const event = (type, data) => res.write(`event: ${type}\ndata: ${JSON.stringify({ type, ...data })}\n\n`);
  event('message_start', { message: { id: 'msg_board', type: 'message', role: 'assistant', model: 'claude-sonnet-4-5', content: [],
    stop_reason: null, stop_sequence: null, usage: { input_tokens: 120, output_tokens: 1 } } });
  if (tool) {
    event('content_block_start', { index: 0, content_block: { type: 'tool_use', id: tool.id, name: tool.name, input: {} } });
    event('content_block_delta', { index: 0, delta: { type: 'input_json_delta', partial_json: JSON.stringify(tool.arguments) } });
  } else {
    event('content_block_start', { index: 0, content_block: { type: 'text', text: '' } });
    for (const w of text.split(/(?<= )/)) event('content_block_delta', { index: 0, delta: { type: 'text_delta', text: w } });
  }
  event('content_block_stop', { index: 0 });
  event('message_delta', { delta: { stop_reason: tool ? 'tool_use' : 'end_turn', stop_sequence: null }, usage: { output_tokens: 12 } });
  event('message_stop', {});
  res.end();
}

/** Starts the server on loopback (`port`, or a free one): `{url, requests, close}` (`url` ends in `/v1`). */
export async function startModel(port = 0) {
  const requests = [];
  const server = http.createServer((req, res) => {
    let raw = '';
    req.on('data', (d) => { raw += d; });
    req.on('end', () => {
      let body = {};
      try {
        body = raw ? JSON.parse(raw) : {};
      } catch {
        body = {};
      }
      requests.push({ method: req.method, path: req.url, body });
      const route = req.url.split('?')[0];
      if (req.method === 'POST' && route.endsWith('/chat/completions')) return stream(res, answer(body));
      if (req.method === 'POST' && route === '/v1/messages/count_tokens') {
        res.writeHead(200, { 'Content-Type': 'application/json' });
        return res.end('{"input_tokens":120}');
      }
      if (req.method === 'POST' && route === '/v1/messages') return streamAnthropic(res, answerAnthropic(body));
      res.writeHead(404, { 'Content-Type': 'application/json' });
      res.end('{"error":{"message":"not scripted"}}');
    });
  });
  await new Promise((resolve) => server.listen(port, '127.0.0.1', resolve));
  const bound = server.address().port;
  return {
    url: `http://127.0.0.1:${bound}/v1`,
    requests,
    close: () => new Promise((resolve) => { server.closeAllConnections?.(); server.close(resolve); }),
  };
}
