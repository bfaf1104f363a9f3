// A scripted OpenAI Chat Completions server on loopback, for the board's real-agent test (acp.mjs): the
// model opencode talks to, offline. Streams (`data:` chunks, usage last), and logs every request it was
// sent. The script, by the last message:
//   - a request offering no tools (opencode's title and summary calls): a short title;
//   - the user asking to "write <absolute path>": a `todowrite` call (opencode's plan), then, on its
//     result, a `write` call for that path, then, on that result, "I wrote it.";
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

/** Starts the server on a free loopback port: `{url, requests, close}` (`url` ends in `/v1`). */
export async function startModel() {
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
      if (req.method === 'POST' && req.url.endsWith('/chat/completions')) return stream(res, answer(body));
      res.writeHead(404, { 'Content-Type': 'application/json' });
      res.end('{"error":{"message":"not scripted"}}');
    });
  });
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address();
  return {
    url: `http://127.0.0.1:${port}/v1`,
    requests,
    close: () => new Promise((resolve) => { server.closeAllConnections?.(); server.close(resolve); }),
  };
}
