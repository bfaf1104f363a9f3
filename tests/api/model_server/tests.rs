//! The server on its own, through a plain HTTP client, in every dialect.
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::*;

const WAIT: Duration = Duration::from_secs(20);
const DIALECTS: [Dialect; 4] = [Dialect::OpenAi, Dialect::Responses, Dialect::Anthropic, Dialect::Gemini];

/// A request with one user message, as `dialect`'s client sends it (streamed): `(url, body)`.
fn ask_in(server: &ModelServer, dialect: Dialect, text: &str) -> (String, Value) {
    match dialect {
        Dialect::OpenAi => (
            format!("{}/chat/completions", server.base_url()),
            json!({"model": "gpt-x", "stream": true, "messages": [
                {"role": "system", "content": "sys"},
                {"role": "user", "content": [{"type": "text", "text": text}]},
            ]}),
        ),
        Dialect::Responses => (
            format!("{}/responses", server.base_url()),
            json!({"model": "gpt-x", "stream": true, "instructions": "sys", "input": [
                {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "dev"}]},
                {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]},
            ]}),
        ),
        Dialect::Anthropic => (
            format!("{}/v1/messages?beta=true", server.origin()),
            json!({"model": "claude-x", "stream": true, "max_tokens": 100, "system": [{"type": "text", "text": "sys"}],
                   "messages": [{"role": "user", "content": [{"type": "text", "text": text}]}]}),
        ),
        _ => (
            format!(
                "{}/v1beta/models/gemini-x:streamGenerateContent?alt=sse",
                server.origin()
            ),
            json!({"systemInstruction": {"parts": [{"text": "sys"}]},
                   "contents": [{"role": "user", "parts": [{"text": text}]}]}),
        ),
    }
}

/// Offers these tools (`(name, JSON schema)`) in `dialect`'s shape.
fn offer(dialect: Dialect, body: &mut Value, tools: &[(&str, Value)]) {
    let each = tools.iter().map(|(name, schema)| match dialect {
        Dialect::OpenAi => json!({"type": "function", "function": {"name": name, "parameters": schema}}),
        Dialect::Responses => json!({"type": "function", "name": name, "parameters": schema}),
        Dialect::Anthropic => json!({"name": name, "input_schema": schema}),
        _ => json!({"name": name, "parametersJsonSchema": schema}),
    });
    body["tools"] = match dialect {
        Dialect::Gemini => json!([{ "functionDeclarations": each.collect::<Vec<_>>() }]),
        _ => Value::Array(each.collect()),
    };
}

/// Appends the model's tool call and its result (`output`) to the conversation, as `dialect`'s client does.
fn answer_call(dialect: Dialect, body: &mut Value, call: &ToolCall, output: &str) {
    let args = call.arguments.to_string();
    let (key, added) = match dialect {
        Dialect::OpenAi => (
            "messages",
            [
                json!({"role": "assistant", "content": null, "tool_calls": [
                    {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": args}}]}),
                json!({"role": "tool", "tool_call_id": call.id, "content": output}),
            ],
        ),
        Dialect::Responses => (
            "input",
            [
                json!({"type": "function_call", "call_id": call.id, "name": call.name, "arguments": args}),
                json!({"type": "function_call_output", "call_id": call.id, "output": output}),
            ],
        ),
        Dialect::Anthropic => (
            "messages",
            [
                json!({"role": "assistant", "content": [
                    {"type": "tool_use", "id": call.id, "name": call.name, "input": call.arguments}]}),
                json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id,
                                                    "content": [{"type": "text", "text": output}]}]}),
            ],
        ),
        _ => (
            "contents",
            [
                json!({"role": "model", "parts": [{"functionCall": {"name": call.name, "args": call.arguments}}]}),
                json!({"role": "user", "parts": [{"functionResponse": {
                    "id": "gemini-own-id", "name": call.name, "response": {"output": output}}}]}),
            ],
        ),
    };
    body[key].as_array_mut().unwrap().extend(added);
}

/// Server-sent events: `(event name or "", data)`, the data as JSON when it is JSON (else a string: `[DONE]`).
fn events(sse: &str) -> Vec<(String, Value)> {
    let frames = sse.split("\n\n").filter(|f| !f.trim().is_empty());
    frames
        .map(|frame| {
            let (mut name, mut data) = (String::new(), String::new());
            for line in frame.lines() {
                if let Some(n) = line.strip_prefix("event: ") {
                    name = n.to_string();
                } else if let Some(d) = line.strip_prefix("data: ") {
                    data.push_str(d);
                }
            }
            let data = serde_json::from_str(&data).unwrap_or(Value::String(data));
            (name, data)
        })
        .collect()
}

/// What a streamed reply in `dialect` says: its text pieces, its tool call `(name, arguments)` if it makes
/// one, its usage `(input, output)`, and whether it ended as the dialect ends a reply.
#[derive(Debug, Default)]
struct Heard {
    pieces: Vec<String>,
    call: Option<(String, Value)>,
    usage: Option<(u64, u64)>,
    ended: bool,
}

fn hear(dialect: Dialect, sse: &str) -> Heard {
    let mut heard = Heard::default();
    let (mut name, mut args) = (String::new(), String::new());
    let n = |v: &Value| v.as_u64().unwrap();
    for (event, data) in events(sse) {
        match dialect {
            Dialect::OpenAi => {
                if data == "[DONE]" {
                    heard.ended = true;
                    continue;
                }
                let delta = &data["choices"][0]["delta"];
                if let Some(text) = delta["content"].as_str() {
                    heard.pieces.push(text.to_string());
                }
                if let Some(call) = delta["tool_calls"].get(0) {
                    name.push_str(call["function"]["name"].as_str().unwrap_or_default());
                    args.push_str(call["function"]["arguments"].as_str().unwrap_or_default());
                }
                if let Some(u) = data.get("usage") {
                    heard.usage = Some((n(&u["prompt_tokens"]), n(&u["completion_tokens"])));
                }
            }
            Dialect::Responses => {
                assert_eq!(event, data["type"], "the event is named as its type");
                match event.as_str() {
                    "response.output_text.delta" => heard.pieces.push(data["delta"].as_str().unwrap().to_string()),
                    "response.output_item.done" if data["item"]["type"] == "function_call" => {
                        name = data["item"]["name"].as_str().unwrap().to_string();
                        args = data["item"]["arguments"].as_str().unwrap().to_string();
                    }
                    "response.completed" => {
                        let u = &data["response"]["usage"];
                        heard.usage = Some((n(&u["input_tokens"]), n(&u["output_tokens"])));
                        heard.ended = true;
                    }
                    _ => {}
                }
            }
            Dialect::Anthropic => {
                assert_eq!(event, data["type"], "the event is named as its type");
                match event.as_str() {
                    "message_start" => heard.usage = Some((n(&data["message"]["usage"]["input_tokens"]), 0)),
                    "content_block_start" if data["content_block"]["type"] == "tool_use" => {
                        name = data["content_block"]["name"].as_str().unwrap().to_string();
                    }
                    "content_block_delta" => match data["delta"]["type"].as_str().unwrap() {
                        "text_delta" => heard.pieces.push(data["delta"]["text"].as_str().unwrap().to_string()),
                        _ => args.push_str(data["delta"]["partial_json"].as_str().unwrap()),
                    },
                    "message_delta" => {
                        let input = heard.usage.unwrap().0;
                        heard.usage = Some((input, n(&data["usage"]["output_tokens"])));
                    }
                    "message_stop" => heard.ended = true,
                    _ => {}
                }
            }
            _ => {
                let candidate = &data["candidates"][0];
                for part in candidate["content"]["parts"].as_array().unwrap() {
                    if let Some(text) = part["text"].as_str() {
                        heard.pieces.push(text.to_string());
                    }
                    if let Some(call) = part.get("functionCall") {
                        name = call["name"].as_str().unwrap().to_string();
                        args = call["args"].to_string();
                    }
                }
                let u = &data["usageMetadata"];
                heard.usage = Some((n(&u["promptTokenCount"]), n(&u["candidatesTokenCount"])));
                heard.ended = candidate["finishReason"] == "STOP";
            }
        }
    }
    if !name.is_empty() {
        heard.call = Some((
            name,
            serde_json::from_str(&args).expect("the tool call's arguments are JSON"),
        ));
    }
    heard
}

async fn post(url: &str, body: &Value) -> reqwest::Response {
    crate::helpers::client().post(url).json(body).send().await.unwrap()
}

/// Reads a streamed response until its text so far contains `needle`.
async fn read_until(r: &mut reqwest::Response, needle: &str) -> String {
    let mut got = String::new();
    while !got.contains(needle) {
        let chunk = tokio::time::timeout(WAIT, r.chunk()).await.unwrap().unwrap();
        got.push_str(&String::from_utf8_lossy(&chunk.expect("the stream ended early")));
    }
    got
}

/// The Chat Completions dialect as Pi uses it: the echo streamed in chunks, the scripted, slow and gated
/// replies, requests recorded in order, and a client dropping a gated reply leaves the server serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_model_server_streams_scripts_and_survives_a_dropped_request() {
    let server = ModelServer::start().await;
    let client = crate::helpers::client();
    let url = format!("{}/chat/completions", server.base_url());
    let ask = |text: &str| ask_in(&server, Dialect::OpenAi, text).1;
    let deltas = |sse: &str| {
        let heard = hear(Dialect::OpenAi, sse);
        (heard.pieces, heard.ended)
    };

    let r = client.post(&url).json(&ask("hello there")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-type"], "text/event-stream");
    let (pieces, done) = deltas(&r.text().await.unwrap());
    assert_eq!(pieces.concat(), "echo: hello there");
    assert_eq!(pieces.len(), 4, "streamed in several chunks: {pieces:?}");
    assert!(done);

    server.reply_to(
        "script me",
        Reply::text("scripted answer").slow(3, Duration::from_millis(30)),
    );
    let started = Instant::now();
    let r = client.post(&url).json(&ask("script me")).send().await.unwrap();
    let (pieces, _) = deltas(&r.text().await.unwrap());
    assert_eq!(pieces.concat(), "scripted answer");
    assert_eq!(pieces.len(), 3);
    assert!(
        started.elapsed() >= Duration::from_millis(60),
        "two delays between three chunks"
    );
    // One-shot: the same text is echoed the next time.
    let r = client.post(&url).json(&ask("script me")).send().await.unwrap();
    assert_eq!(deltas(&r.text().await.unwrap()).0.concat(), "echo: script me");

    // Gated: the first chunk, then nothing until released.
    let gate = Gate::new();
    server.reply_to("wait for it", Reply::echo().gated(&gate));
    let mut r = client.post(&url).json(&ask("wait for it")).send().await.unwrap();
    let first = r.chunk().await.unwrap().unwrap();
    assert!(String::from_utf8_lossy(&first).contains("\"role\":\"assistant\""));
    server.wait_request(4, Outcome::Held, WAIT).await;
    assert!(
        tokio::time::timeout(Duration::from_millis(200), r.chunk())
            .await
            .is_err(),
        "a held reply sends nothing more"
    );
    gate.release();
    let mut rest = String::new();
    while let Some(c) = r.chunk().await.unwrap() {
        rest.push_str(&String::from_utf8_lossy(&c));
    }
    assert!(rest.contains("[DONE]"));
    server.wait_request(4, Outcome::Completed, WAIT).await;

    // The client drops a held reply (as Pi's abort does): recorded, and the server keeps serving.
    let held = Gate::new();
    server.reply_to("dropped", Reply::echo().gated(&held));
    let mut r = client.post(&url).json(&ask("dropped")).send().await.unwrap();
    r.chunk().await.unwrap().unwrap();
    server.wait_request(5, Outcome::Held, WAIT).await;
    drop(r);
    server.wait_request(5, Outcome::Dropped, WAIT).await;
    let r = client.post(&url).json(&ask("still here")).send().await.unwrap();
    assert_eq!(deltas(&r.text().await.unwrap()).0.concat(), "echo: still here");

    let requests = server.requests();
    let said: Vec<String> = requests.iter().map(ModelRequest::last_user_text).collect();
    assert_eq!(
        said,
        [
            "hello there",
            "script me",
            "script me",
            "wait for it",
            "dropped",
            "still here"
        ]
    );
    assert_eq!(
        requests[0].conversation(),
        [("user".to_string(), "hello there".to_string())],
        "the system prompt is left out of the conversation"
    );
    assert!(
        requests
            .iter()
            .all(|r| r.dialect == Dialect::OpenAi && r.stream && r.status == 200)
    );
    assert_eq!(requests[0].path, "/v1/chat/completions");
    // A non-streaming request gets one JSON body; anything but a known route is a 404; both are recorded.
    let mut plain = ask("no stream");
    plain["stream"] = json!(false);
    let r = client.post(&url).json(&plain).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let whole: Value = r.json().await.unwrap();
    assert_eq!(whole["choices"][0]["message"]["content"], "echo: no stream");
    assert_eq!(whole["usage"]["prompt_tokens"], DEFAULT_USAGE.input);
    let r = client
        .get(format!("{}/models", server.base_url()))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    let requests = server.requests();
    assert_eq!(requests.len(), 8);
    assert!(!requests[6].stream);
    assert_eq!(
        (
            requests[7].dialect,
            requests[7].method.as_str(),
            requests[7].path.as_str(),
            requests[7].status
        ),
        (Dialect::Unknown, "GET", "/v1/models", 404)
    );
    // A default for every request without a scripted reply.
    server.set_default(Reply::text("always this").slow(2, Duration::ZERO));
    let r = client.post(&url).json(&ask("anything")).send().await.unwrap();
    assert_eq!(deltas(&r.text().await.unwrap()).0, ["always", " this"]);
}

/// Every dialect streams a scripted text in its chunks with the usage asked for, the echo with the default
/// usage, and records the request as the same conversation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_dialect_streams_a_text_with_its_usage() {
    let server = ModelServer::start().await;
    for dialect in DIALECTS {
        let said = format!("hello in {dialect:?}");
        server.reply_to(&said, Reply::text("aaa bbb ccc").slow(3, Duration::ZERO).usage(5, 3));
        let (url, body) = ask_in(&server, dialect, &said);
        let r = post(&url, &body).await;
        assert_eq!(r.status(), 200, "{dialect:?}");
        assert_eq!(r.headers()["content-type"], "text/event-stream");
        let heard = hear(dialect, &r.text().await.unwrap());
        assert_eq!(heard.pieces, ["aaa ", "bbb ", "ccc"], "{dialect:?}");
        assert_eq!(heard.usage, Some((5, 3)), "{dialect:?}");
        assert!(heard.ended && heard.call.is_none(), "{dialect:?}: {heard:?}");

        let (url, body) = ask_in(&server, dialect, "again");
        let heard = hear(dialect, &post(&url, &body).await.text().await.unwrap());
        assert_eq!(heard.pieces.concat(), "echo: again", "{dialect:?}");
        assert_eq!(heard.usage, Some((DEFAULT_USAGE.input, DEFAULT_USAGE.output)));

        let requests = server.requests();
        let [.., scripted, echoed] = &requests[..] else {
            unreachable!()
        };
        assert_eq!(scripted.dialect, dialect);
        assert!(scripted.stream);
        assert_eq!(scripted.outcome, Outcome::Completed);
        assert_eq!(scripted.reply, "aaa bbb ccc");
        assert_eq!(scripted.usage, Usage { input: 5, output: 3 });
        assert_eq!(
            scripted.conversation(),
            [("user".to_string(), said.clone())],
            "{dialect:?}"
        );
        assert_eq!(echoed.last_user_text(), "again");
        assert_eq!(echoed.reply, "echo: again");
    }
    let paths: Vec<_> = server
        .requests()
        .iter()
        .map(|r| (r.path.clone(), r.query.clone()))
        .step_by(2)
        .collect();
    assert_eq!(
        paths,
        [
            ("/v1/chat/completions", ""),
            ("/v1/responses", ""),
            ("/v1/messages", "beta=true"),
            ("/v1beta/models/gemini-x:streamGenerateContent", "alt=sse"),
        ]
        .map(|(p, q)| (p.to_string(), q.to_string()))
    );
}

/// The tools each agent offers for writing a file, by dialect (as they name and describe them).
fn agent_tools(dialect: Dialect) -> Vec<(&'static str, Value)> {
    let file = |path: &str| {
        json!({"type": "object", "required": [path, "content"],
               "properties": {path: {"type": "string"}, "content": {"type": "string"}}})
    };
    let todo = json!({"type": "object", "required": ["todos"], "properties": {"todos": {"type": "array"}}});
    match dialect {
        // opencode
        Dialect::OpenAi => vec![("todowrite", todo), ("write", file("filePath"))],
        // Codex: a shell taking an argv, in a working directory, with an escalation to ask for.
        Dialect::Responses => vec![(
            "shell",
            json!({"type": "object", "required": ["command"], "properties": {
                "command": {"type": "array", "items": {"type": "string"}}, "workdir": {"type": "string"},
                "timeout_ms": {"type": "number"}, "sandbox_permissions": {"type": "string"},
                "justification": {"type": "string"}}}),
        )],
        // Claude Code
        Dialect::Anthropic => vec![("Bash", json!({"type": "object"})), ("Write", file("file_path"))],
        // Gemini CLI
        _ => vec![("read_file", file("file_path")), ("write_file", file("file_path"))],
    }
}

/// A `tool_write` reply, in every dialect: the tool call (with the agent's own write tool, filled from its
/// schema), a side call without tools that does not take it, and the follow-up text to the tool's result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_dialect_calls_a_write_tool_then_answers_its_result() {
    let server = ModelServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    for dialect in DIALECTS {
        let path = dir.path().join(format!("{dialect:?}.txt")).display().to_string();
        let said = format!("write in {dialect:?}");
        server.reply_to(
            &said,
            Reply::tool_write(&path, "it's\nwritten\n")
                .usage(20, 2)
                .then(Reply::text("wrote it").usage(30, 4)),
        );
        // A title request (no tools) with the same text does not take the tool call.
        let (url, side) = ask_in(&server, dialect, &said);
        let heard = hear(dialect, &post(&url, &side).await.text().await.unwrap());
        assert_eq!(heard.pieces.concat(), format!("echo: {said}"), "{dialect:?}");

        let (url, mut body) = ask_in(&server, dialect, &said);
        offer(dialect, &mut body, &agent_tools(dialect));
        let heard = hear(dialect, &post(&url, &body).await.text().await.unwrap());
        let offered: Vec<_> = agent_tools(dialect).into_iter().map(|(name, _)| name).collect();
        assert_eq!(server.requests().last().unwrap().tool_names(), offered);
        assert!(heard.ended, "{dialect:?}: {heard:?}");
        assert_eq!(heard.usage, Some((20, 2)), "{dialect:?}");
        assert!(heard.pieces.concat().is_empty(), "{dialect:?}: {heard:?}");
        let (name, arguments) = heard.call.expect("a tool call");
        let expected = match dialect {
            Dialect::OpenAi => ("write", json!({"filePath": path, "content": "it's\nwritten\n"})),
            Dialect::Responses => {
                let script = format!("printf '%s' 'it'\\''s\nwritten\n' > '{path}'");
                let args = json!({"command": ["bash", "-lc", script], "workdir": dir.path(),
                                  "sandbox_permissions": "require_escalated", "justification": format!("Write {path}?")});
                ("shell", args)
            }
            Dialect::Anthropic => ("Write", json!({"file_path": path, "content": "it's\nwritten\n"})),
            _ => ("write_file", json!({"file_path": path, "content": "it's\nwritten\n"})),
        };
        assert_eq!((name.as_str(), &arguments), (expected.0, &expected.1), "{dialect:?}");

        let call = server
            .requests()
            .last()
            .unwrap()
            .tool_call
            .clone()
            .expect("the call is recorded");
        assert_eq!((call.name.as_str(), &call.arguments), (expected.0, &expected.1));
        assert_eq!(server.requests().last().unwrap().reply, "");
        answer_call(dialect, &mut body, &call, "the file is written");
        let heard = hear(dialect, &post(&url, &body).await.text().await.unwrap());
        assert_eq!(heard.pieces.concat(), "wrote it", "{dialect:?}");
        assert_eq!(heard.usage, Some((30, 4)), "{dialect:?}");
        let followup = server.requests().pop().unwrap();
        assert!(followup.brings_tool_result());
        assert_eq!(
            followup.conversation(),
            [("user", said.as_str()), ("tool", "the file is written")].map(|(r, t)| (r.to_string(), t.to_string())),
            "{dialect:?}: the assistant's tool call alone is no message"
        );
        assert_eq!(followup.last_user_text(), said);
        // Without a `then`, the answer to a tool result is "done".
        server.reply_to(&said, Reply::tool_write(&path, "x"));
        post(&url, &{
            let mut b = ask_in(&server, dialect, &said).1;
            offer(dialect, &mut b, &agent_tools(dialect));
            b
        })
        .await
        .text()
        .await
        .unwrap();
        let heard = hear(dialect, &post(&url, &body).await.text().await.unwrap());
        assert_eq!(heard.pieces.concat(), "done", "{dialect:?}");
    }
    // Codex's shell command does write the file, quotes and all.
    let path = dir.path().join("Responses.txt");
    let call = server
        .requests()
        .into_iter()
        .find_map(|r| r.tool_call.filter(|c| c.name == "shell"))
        .unwrap();
    let argv: Vec<String> = serde_json::from_value(call.arguments["command"].clone()).unwrap();
    let status = std::process::Command::new(&argv[0]).args(&argv[1..]).status().unwrap();
    assert!(status.success());
    assert_eq!(std::fs::read_to_string(path).unwrap(), "it's\nwritten\n");
}

/// Which tool a `tool_write` takes and with what arguments, for the tool lists the agents offer.
#[test]
fn a_tool_write_picks_the_offered_tool_and_fills_its_schema() {
    let tool = |name: &str, kind: ToolKind, schema: Value| Tool {
        name: name.to_string(),
        schema,
        kind,
    };
    let object =
        |properties: Value, required: Value| json!({"type": "object", "properties": properties, "required": required});
    let call = |tools: &[Tool]| write_call(tools, "/w/a.txt", "hi\n").map(|(t, args)| (t.name.clone(), args));

    // Gemini CLI offers its shell when its write tool is not there: a string command, placeholders for the
    // other required properties (uppercase types, as Gemini's `parameters` spell them).
    let shell = tool(
        "run_shell_command",
        ToolKind::Function,
        object(
            json!({"command": {"type": "STRING"}, "description": {"type": "STRING"}, "dir_path": {"type": "STRING"}}),
            json!(["command", "description"]),
        ),
    );
    assert_eq!(
        call(std::slice::from_ref(&shell)),
        Some((
            "run_shell_command".to_string(),
            json!({"command": "printf '%s' 'hi\n' > '/w/a.txt'", "description": "x"})
        ))
    );
    // A write tool comes first, whatever the order; extra required properties get placeholders.
    let write = tool(
        "write_file",
        ToolKind::Function,
        object(
            json!({"file_path": {"type": "string"}, "content": {"type": "string"}, "overwrite": {"type": "boolean"}}),
            json!(["file_path", "content", "overwrite"]),
        ),
    );
    assert_eq!(
        call(&[shell.clone(), write]),
        Some((
            "write_file".to_string(),
            json!({"file_path": "/w/a.txt", "content": "hi\n", "overwrite": false})
        ))
    );
    // A write tool without a place for the path is no write tool; todowrite is not one either.
    let odd = tool(
        "write",
        ToolKind::Function,
        object(json!({"content": {"type": "string"}}), json!([])),
    );
    let todo = tool(
        "todowrite",
        ToolKind::Function,
        object(json!({"todos": {"type": "array"}}), json!([])),
    );
    assert_eq!(call(&[odd.clone(), todo.clone()]), None);
    assert_eq!(call(&[odd, todo, shell]).unwrap().0, "run_shell_command");
    // Codex's free-form apply_patch, and its built-in local shell.
    let patch = tool("apply_patch", ToolKind::Custom, Value::Null);
    assert_eq!(
        call(&[patch]),
        Some((
            "apply_patch".to_string(),
            json!("*** Begin Patch\n*** Add File: /w/a.txt\n+hi\n*** End Patch\n")
        ))
    );
    let local = tool("local_shell", ToolKind::LocalShell, Value::Null);
    assert_eq!(
        call(&[local]).unwrap().1,
        json!({"command": ["bash", "-lc", "printf '%s' 'hi\n' > '/w/a.txt'"]})
    );
    assert_eq!(call(&[]), None);
}

/// The same conversation in every dialect's shape reads the same: the system prompt left out, the
/// assistant's tool call no message, its result a "tool" message, Gemini's "model" an assistant.
#[test]
fn every_dialect_reads_as_the_same_conversation() {
    let call = json!({"id": "c1", "type": "function", "function": {"name": "write", "arguments": "{}"}});
    let bodies = [
        (
            Dialect::OpenAi,
            json!({"messages": [
                {"role": "system", "content": "sys"},
                {"role": "user", "content": "first"},
                {"role": "assistant", "content": "echo: first"},
                {"role": "assistant", "content": null, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "c1", "content": "wrote"},
                {"role": "assistant", "content": [{"type": "text", "text": "done"}]},
                {"role": "user", "content": [{"type": "text", "text": "sec"}, {"type": "text", "text": "ond"}]},
            ]}),
        ),
        (
            Dialect::Responses,
            json!({"instructions": "sys", "input": [
                {"type": "message", "role": "developer", "content": "dev"},
                {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "first"}]},
                {"role": "assistant", "content": [{"type": "output_text", "text": "echo: first"}]},
                {"type": "reasoning", "summary": []},
                {"type": "function_call", "call_id": "c1", "name": "shell", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c1", "output": "wrote"},
                {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "done"}]},
                {"type": "message", "role": "user",
                 "content": [{"type": "input_text", "text": "sec"}, {"type": "input_text", "text": "ond"}]},
            ]}),
        ),
        (
            Dialect::Anthropic,
            json!({"system": "sys", "messages": [
                {"role": "user", "content": "first"},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "hm"}, {"type": "text", "text": "echo: first"},
                    {"type": "tool_use", "id": "c1", "name": "Write", "input": {}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "c1", "content": "wrote"}]},
                {"role": "assistant", "content": [{"type": "text", "text": "done"}]},
                {"role": "user", "content": [{"type": "text", "text": "sec"}, {"type": "text", "text": "ond"}]},
            ]}),
        ),
        (
            Dialect::Gemini,
            json!({"systemInstruction": {"parts": [{"text": "sys"}]}, "contents": [
                {"role": "user", "parts": [{"text": "first"}]},
                {"role": "model", "parts": [{"text": "hm", "thought": true}, {"text": "echo: first"},
                                            {"functionCall": {"name": "write_file", "args": {}}}]},
                {"role": "user", "parts": [{"functionResponse": {"name": "write_file", "response": {"output": "wrote"}}}]},
                {"role": "model", "parts": [{"text": "done"}]},
                {"role": "user", "parts": [{"text": "sec"}, {"text": "ond"}]},
            ]}),
        ),
    ];
    let expected = [
        ("user", "first"),
        ("assistant", "echo: first"),
        ("tool", "wrote"),
        ("assistant", "done"),
        ("user", "second"),
    ]
    .map(|(r, t)| (r.to_string(), t.to_string()));
    for (dialect, body) in bodies {
        let request = recorded(dialect, body);
        assert_eq!(request.conversation(), expected, "{dialect:?}");
        assert_eq!(request.last_user_text(), "second");
        assert!(request.mentions("echo: first") && request.mentions("sec") && !request.mentions("secon"));
        assert!(request.mentions_substring("secon") && !request.mentions_substring("echo"));
        assert!(request.said("second") && request.said("ond") && !request.said("first"));
        assert!(!request.brings_tool_result(), "{dialect:?}");
    }
    // Codex's context is a user message, never the last user text; an agent's prefix is a part of its own.
    let codex = recorded(
        Dialect::Responses,
        json!({"input": [
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "do it"}]},
            {"type": "message", "role": "user",
             "content": [{"type": "input_text", "text": "<environment_context>\n  <cwd>/w</cwd>\n</environment_context>"}]},
        ]}),
    );
    assert_eq!(codex.last_user_text(), "do it");
    assert_eq!(codex.conversation().len(), 2);
    let claude = recorded(
        Dialect::Anthropic,
        json!({"messages": [{"role": "user", "content": [
            {"type": "text", "text": "<system-reminder>\nBe nice.\n</system-reminder>"}, {"type": "text", "text": "do it\n"}]}]}),
    );
    assert!(claude.said("do it") && claude.mentions_substring("do it") && !claude.mentions("do it"));
    // The responses input can be one string.
    let plain = recorded(Dialect::Responses, json!({"input": "just this"}));
    assert_eq!(plain.conversation(), [("user".to_string(), "just this".to_string())]);
}

fn recorded(dialect: Dialect, body: Value) -> ModelRequest {
    ModelRequest {
        dialect,
        method: "POST".to_string(),
        path: String::new(),
        query: String::new(),
        status: 200,
        body,
        stream: true,
        outcome: Outcome::Completed,
        reply: String::new(),
        tool_call: None,
        usage: DEFAULT_USAGE,
    }
}

/// In every streaming dialect a gated reply holds after its first text chunk, a slow one takes its
/// delays, and a client dropping a held reply is recorded while the server keeps serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_dialect_holds_a_gated_reply_and_records_a_drop() {
    let server = ModelServer::start().await;
    for dialect in DIALECTS {
        let n = server.requests().len();
        let gate = Gate::new();
        server.reply_to(
            "hold",
            Reply::text("first-piece second-piece")
                .slow(2, Duration::ZERO)
                .gated(&gate),
        );
        let (url, body) = ask_in(&server, dialect, "hold");
        let mut r = post(&url, &body).await;
        let first = read_until(&mut r, "first-piece").await;
        server.wait_request(n + 1, Outcome::Held, WAIT).await;
        assert!(
            tokio::time::timeout(Duration::from_millis(200), r.chunk())
                .await
                .is_err(),
            "{dialect:?}: a held reply sends nothing more"
        );
        gate.release();
        let mut rest = String::new();
        while let Some(c) = r.chunk().await.unwrap() {
            rest.push_str(&String::from_utf8_lossy(&c));
        }
        let heard = hear(dialect, &(first + &rest));
        assert_eq!(heard.pieces, ["first-piece ", "second-piece"], "{dialect:?}");
        assert!(heard.ended);
        server.wait_request(n + 1, Outcome::Completed, WAIT).await;

        let held = Gate::new();
        server.reply_to("drop", Reply::text("never-finished reply").gated(&held));
        let (url, body) = ask_in(&server, dialect, "drop");
        let mut r = post(&url, &body).await;
        read_until(&mut r, "never").await;
        server.wait_request(n + 2, Outcome::Held, WAIT).await;
        drop(r);
        let dropped = server.wait_request(n + 2, Outcome::Dropped, WAIT).await;
        assert_eq!(dropped.reply, "never-finished reply");

        // Slow: dropped during a delay too.
        server.reply_to("slow", Reply::text("a b c d").slow(4, Duration::from_secs(30)));
        let (url, body) = ask_in(&server, dialect, "slow");
        let mut r = post(&url, &body).await;
        read_until(&mut r, "a ").await;
        drop(r);
        server.wait_request(n + 3, Outcome::Dropped, WAIT).await;

        server.reply_to("slow", Reply::text("a b c").slow(3, Duration::from_millis(40)));
        let started = Instant::now();
        let (url, body) = ask_in(&server, dialect, "slow");
        let heard = hear(dialect, &post(&url, &body).await.text().await.unwrap());
        assert_eq!(heard.pieces.concat(), "a b c");
        assert!(
            started.elapsed() >= Duration::from_millis(80),
            "{dialect:?}: two delays"
        );
        server.wait_request(n + 4, Outcome::Completed, WAIT).await;
    }
}

/// The non-streamed variants (side calls: titles, token counts, Gemini's JSON checks), Gemini's stream
/// without `alt=sse`, and what is not a model call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_streamed_calls_token_counts_and_unknown_routes() {
    let server = ModelServer::start().await;
    let whole = |dialect: Dialect, text: &str| {
        let (url, mut body) = ask_in(&server, dialect, text);
        body["stream"] = json!(false);
        let url = url.replace(":streamGenerateContent?alt=sse", ":generateContent");
        (url, body)
    };
    let text_of = |dialect: Dialect, v: &Value| match dialect {
        Dialect::OpenAi => v["choices"][0]["message"]["content"].clone(),
        Dialect::Responses => v["output"][0]["content"][0]["text"].clone(),
        Dialect::Anthropic => v["content"][0]["text"].clone(),
        _ => v["candidates"][0]["content"]["parts"][0]["text"].clone(),
    };
    let usage_of = |dialect: Dialect, v: &Value| match dialect {
        Dialect::OpenAi => (
            v["usage"]["prompt_tokens"].clone(),
            v["usage"]["completion_tokens"].clone(),
        ),
        Dialect::Responses | Dialect::Anthropic => {
            (v["usage"]["input_tokens"].clone(), v["usage"]["output_tokens"].clone())
        }
        _ => (
            v["usageMetadata"]["promptTokenCount"].clone(),
            v["usageMetadata"]["candidatesTokenCount"].clone(),
        ),
    };
    for dialect in DIALECTS {
        server.reply_to("title?", Reply::text("A title").usage(3, 2));
        let (url, body) = whole(dialect, "title?");
        let r = post(&url, &body).await;
        assert_eq!(r.headers()["content-type"], "application/json");
        let v: Value = r.json().await.unwrap();
        assert_eq!(text_of(dialect, &v), "A title", "{dialect:?}: {v}");
        assert_eq!(usage_of(dialect, &v), (json!(3), json!(2)), "{dialect:?}");
        let request = server.requests().pop().unwrap();
        assert_eq!(
            (request.dialect, request.stream, request.outcome),
            (dialect, false, Outcome::Completed)
        );

        // A non-streamed tool call.
        server.reply_to("tool?", Reply::tool_write("/w/x", "y"));
        let (url, mut body) = whole(dialect, "tool?");
        offer(dialect, &mut body, &agent_tools(dialect));
        let v: Value = post(&url, &body).await.json().await.unwrap();
        let name = match dialect {
            Dialect::OpenAi => &v["choices"][0]["message"]["tool_calls"][0]["function"]["name"],
            Dialect::Responses => &v["output"][0]["name"],
            Dialect::Anthropic => &v["content"][0]["name"],
            _ => &v["candidates"][0]["content"]["parts"][0]["functionCall"]["name"],
        };
        assert_eq!(
            name,
            ["write", "shell", "Write", "write_file"][request_index(dialect)],
            "{dialect:?}: {v}"
        );
    }
    // Gemini streamed without `alt=sse`: one JSON array of the chunks.
    let (url, body) = ask_in(&server, Dialect::Gemini, "array");
    let v: Value = post(&url.replace("?alt=sse", ""), &body).await.json().await.unwrap();
    let texts: Vec<_> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["candidates"][0]["content"]["parts"][0]["text"].clone())
        .collect();
    assert_eq!(texts.len(), 4);
    assert_eq!(
        texts.iter().map(|t| t.as_str().unwrap()).collect::<String>(),
        "echo: array"
    );
    // Gemini CLI's JSON side calls get an example of their schema and leave the script alone.
    server.reply_to("check", Reply::text("scripted"));
    let (url, mut body) = whole(Dialect::Gemini, "check");
    body["generationConfig"] = json!({"responseMimeType": "application/json", "responseJsonSchema": {
        "type": "object", "required": ["reasoning", "next_speaker"], "properties": {
            "reasoning": {"type": "string"}, "next_speaker": {"type": "string", "enum": ["model", "user"]}}}});
    let v: Value = post(&url, &body).await.json().await.unwrap();
    let answer: Value =
        serde_json::from_str(v["candidates"][0]["content"]["parts"][0]["text"].as_str().unwrap()).unwrap();
    assert_eq!(answer, json!({"reasoning": "scripted", "next_speaker": "user"}));
    body.as_object_mut().unwrap().remove("generationConfig");
    let v: Value = post(&url, &body).await.json().await.unwrap();
    assert_eq!(v["candidates"][0]["content"]["parts"][0]["text"], "scripted");
    // Token counts.
    let (url, body) = ask_in(&server, Dialect::Anthropic, "count");
    let v: Value = post(
        &url.replace("/v1/messages?beta=true", "/v1/messages/count_tokens?beta=true"),
        &body,
    )
    .await
    .json()
    .await
    .unwrap();
    assert_eq!(v, json!({"input_tokens": DEFAULT_USAGE.input}));
    let (url, body) = ask_in(&server, Dialect::Gemini, "count");
    let v: Value = post(&url.replace(":streamGenerateContent?alt=sse", ":countTokens"), &body)
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(v, json!({"totalTokens": DEFAULT_USAGE.input}));
    let counted = server.requests();
    let [.., anthropic, gemini] = &counted[..] else {
        unreachable!()
    };
    assert_eq!(
        (anthropic.dialect, anthropic.path.as_str()),
        (Dialect::Anthropic, "/v1/messages/count_tokens")
    );
    assert_eq!(
        (gemini.dialect, gemini.path.as_str()),
        (Dialect::Gemini, "/v1beta/models/gemini-x:countTokens")
    );
    assert!(anthropic.mentions("count"));
    // Not JSON: a 400; an unknown route: a 404 naming it; both recorded.
    let client = crate::helpers::client();
    let url = format!("{}/chat/completions", server.base_url());
    let r = client.post(&url).body("{not json").send().await.unwrap();
    assert_eq!(r.status(), 400);
    let r = client
        .post(format!("{}/v1/embeddings", server.origin()))
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["message"], "no such route: POST /v1/embeddings");
    let requests = server.requests();
    let [.., bad, unknown] = &requests[..] else {
        unreachable!()
    };
    assert_eq!(
        (bad.status, bad.dialect, &bad.body),
        (400, Dialect::OpenAi, &json!("{not json"))
    );
    assert_eq!((unknown.status, unknown.dialect), (404, Dialect::Unknown));
}

fn request_index(dialect: Dialect) -> usize {
    DIALECTS.iter().position(|d| *d == dialect).unwrap()
}
