//! A scripted model server for the tests that run real agents offline: Pi and the Agent Client Protocol
//! agents (opencode, Claude Code, Codex, Gemini CLI). Plain tokio and hand-written HTTP/1.1 on
//! 127.0.0.1:0, one request per connection. One listener speaks four dialects, chosen by path:
//!
//! - OpenAI Chat Completions, `POST /v1/chat/completions` (Pi, opencode): [`openai`];
//! - OpenAI Responses, `POST /v1/responses` (Codex): [`responses`];
//! - Anthropic Messages, `POST /v1/messages` and `/v1/messages/count_tokens` (Claude Code): [`anthropic`];
//! - Gemini, `POST /v1beta/models/<model>:streamGenerateContent` (`?alt=sse`), `:generateContent` and
//!   `:countTokens` (Gemini CLI): [`gemini`].
//!
//! A reply streams as the dialect's server-sent events when the request asks for a stream, else it is one
//! JSON body. Any other route answers 404. Every request is recorded, whatever its route, with how its
//! reply went; [`ModelRequest`] reads the conversation out of any dialect's body.
//!
//! By default a reply echoes the last user text ("echo: <text>") in a few chunks. A test scripts the reply
//! to a user text ([`ModelServer::reply_to`]) or to every request ([`ModelServer::set_default`]): another
//! text, slow (a delay between chunks) or gated (held after its first chunk until the test releases it),
//! or a tool call writing a file ([`Reply::tool_write`]) whose result the next request brings back and
//! gets a final text. Every reply reports known token counts ([`Reply::usage`]). A client that drops the
//! connection mid-reply (an agent cancelling) is recorded as such; the server keeps serving.
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

mod anthropic;
mod gemini;
mod openai;
mod responses;
#[cfg(test)]
mod tests;

/// How a recorded request's reply went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The reply is being written (or, not streamed, prepared).
    Streaming,
    /// The first chunk went out (not streamed: nothing yet); the reply waits for its gate.
    Held,
    /// The whole reply went out (`[DONE]`, `message_stop`, `response.completed`, … included).
    Completed,
    /// The client closed the connection before the end of the reply (an agent aborting the request).
    Dropped,
}

/// The API a request spoke, from its path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    /// OpenAI Chat Completions: `/v1/chat/completions`.
    OpenAi,
    /// OpenAI Responses: `/v1/responses`.
    Responses,
    /// Anthropic Messages: `/v1/messages`, `/v1/messages/count_tokens`.
    Anthropic,
    /// Gemini: `/v1beta/models/<model>:<action>`.
    Gemini,
    /// Any other route (answered 404).
    Unknown,
}

/// Token counts a reply reports in its dialect's usage fields (prompt/input and completion/output).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    pub input: u64,
    pub output: u64,
}

/// What every reply reports unless its [`Reply::usage`] says otherwise.
pub const DEFAULT_USAGE: Usage = Usage { input: 11, output: 7 };

/// A tool call a reply made.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    /// The call's id as sent (`""` in Gemini, whose calls carry none).
    pub id: String,
    /// The tool's name as the request offered it.
    pub name: String,
    /// The arguments: an object for a function tool, the input text for a custom tool (Codex's `apply_patch`).
    pub arguments: Value,
    kind: ToolKind,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ToolKind {
    /// A JSON-schema function tool (every dialect).
    Function,
    /// A Responses free-form tool: its input is text.
    Custom,
    /// The Responses built-in `local_shell`.
    LocalShell,
}

/// A tool a request offers.
#[derive(Debug, Clone)]
struct Tool {
    name: String,
    schema: Value,
    kind: ToolKind,
}

/// One message of a conversation as the model was shown it: its role ("user", "assistant" or "tool" for a
/// tool result) and its text parts.
#[derive(Debug, Clone)]
struct Entry {
    role: String,
    parts: Vec<String>,
}

impl Entry {
    fn new(role: &str, parts: Vec<String>) -> Entry {
        Entry {
            role: role.to_string(),
            parts,
        }
    }

    fn text(&self) -> String {
        self.parts.concat()
    }
}

/// One request as received, with how its reply went.
#[derive(Debug, Clone)]
pub struct ModelRequest {
    pub dialect: Dialect,
    pub method: String,
    /// The path without its query (`/v1/messages`, `/v1beta/models/gemini-2.5-flash:streamGenerateContent`).
    pub path: String,
    /// The query, without `?` (`alt=sse`, `beta=true`), or "".
    pub query: String,
    /// The HTTP status answered (404 for an unknown route, 400 for a body that is not JSON).
    pub status: u16,
    /// The JSON body (`Null` when empty, the text when it is not JSON).
    pub body: Value,
    /// Whether the reply was streamed (server-sent events, or Gemini's streamed JSON array).
    pub stream: bool,
    pub outcome: Outcome,
    /// The text the reply carries (all of it, even when the client dropped the connection early); "" for a
    /// tool call.
    pub reply: String,
    /// The tool call the reply made, if it made one.
    pub tool_call: Option<ToolCall>,
    /// The token counts the reply reported.
    pub usage: Usage,
}

impl ModelRequest {
    /// `(role, text)` for every message but the system prompt, in order: what the model was shown of the
    /// conversation, in any dialect. Roles are "user", "assistant" (Gemini's "model" too) and "tool" for a
    /// tool result (its text); text parts are joined. An assistant message holding only tool calls is left out.
    pub fn conversation(&self) -> Vec<(String, String)> {
        self.entries()
            .into_iter()
            .map(|e| {
                let text = e.text();
                (e.role, text)
            })
            .collect()
    }

    /// The text of the last user message (what an echo reply repeats). Tool results are not user messages,
    /// nor is the context Codex sends as one (`<environment_context>`, `<user_instructions>`, AGENTS.md).
    pub fn last_user_text(&self) -> String {
        self.last_user().map(|e| e.text()).unwrap_or_default()
    }

    /// Whether any message of the conversation sent holds exactly this text, whole or as one of its parts.
    pub fn mentions(&self, text: &str) -> bool {
        self.entries()
            .iter()
            .any(|e| e.text() == text || e.parts.iter().any(|p| p == text))
    }

    /// Whether any user message contains this text (agents that prefix the user's text with context).
    pub fn mentions_substring(&self, text: &str) -> bool {
        self.entries()
            .iter()
            .any(|e| e.role == "user" && e.text().contains(text))
    }

    /// The names of the tools the request offers.
    pub fn tool_names(&self) -> Vec<String> {
        self.tools().into_iter().map(|t| t.name).collect()
    }

    /// Whether the last message is a tool result (the request after a tool call).
    pub fn brings_tool_result(&self) -> bool {
        self.tool_result().is_some()
    }

    fn entries(&self) -> Vec<Entry> {
        match self.dialect {
            Dialect::OpenAi => openai::entries(&self.body),
            Dialect::Responses => responses::entries(&self.body),
            Dialect::Anthropic => anthropic::entries(&self.body),
            Dialect::Gemini => gemini::entries(&self.body),
            Dialect::Unknown => Vec::new(),
        }
    }

    fn tools(&self) -> Vec<Tool> {
        match self.dialect {
            Dialect::OpenAi => openai::tools(&self.body),
            Dialect::Responses => responses::tools(&self.body),
            Dialect::Anthropic => anthropic::tools(&self.body),
            Dialect::Gemini => gemini::tools(&self.body),
            Dialect::Unknown => Vec::new(),
        }
    }

    /// When the last message is a tool result: the id of the call it answers ("" when it names none).
    fn tool_result(&self) -> Option<String> {
        match self.dialect {
            Dialect::OpenAi => openai::tool_result(&self.body),
            Dialect::Responses => responses::tool_result(&self.body),
            Dialect::Anthropic => anthropic::tool_result(&self.body),
            Dialect::Gemini => gemini::tool_result(&self.body),
            Dialect::Unknown => None,
        }
    }

    fn last_user(&self) -> Option<Entry> {
        const CONTEXT: [&str; 3] = [
            "<environment_context>",
            "<user_instructions>",
            "# AGENTS.md instructions",
        ];
        self.entries()
            .into_iter()
            .rev()
            .find(|e| e.role == "user" && !CONTEXT.iter().any(|c| e.text().trim_start().starts_with(c)))
    }

    /// Whether the last user message is this text, whole or as one of its parts (trimmed): what a scripted
    /// reply matches, so that an agent adding context parts to the user's text still matches.
    fn said(&self, text: &str) -> bool {
        self.last_user()
            .is_some_and(|e| e.text() == text || e.parts.iter().any(|p| p.trim() == text.trim()))
    }
}

/// The text of a message content: a string as it is, else its parts' texts joined.
fn text_of(content: &Value) -> String {
    parts_of(content).concat()
}

/// The text parts of a message content: a string is one part; an array gives each part's `text` (or the
/// part itself when it is a string).
fn parts_of(content: &Value) -> Vec<String> {
    match content {
        Value::String(s) => vec![s.clone()],
        Value::Array(parts) => parts
            .iter()
            .filter_map(|p| p.as_str().or_else(|| p["text"].as_str()))
            .map(str::to_string)
            .collect(),
        _ => Vec::new(),
    }
}

/// Holds a gated reply after its first chunk until `release` (then and for every later reply using it).
#[derive(Debug, Clone)]
pub struct Gate(Arc<tokio::sync::watch::Sender<bool>>);

impl Default for Gate {
    fn default() -> Gate {
        Gate(Arc::new(tokio::sync::watch::channel(false).0))
    }
}

impl Gate {
    pub fn new() -> Gate {
        Gate::default()
    }

    pub fn release(&self) {
        self.0.send_replace(true);
    }

    async fn opened(&self) {
        let mut rx = self.0.subscribe();
        let _ = rx.wait_for(|open| *open).await;
    }
}

/// How the server answers one request.
#[derive(Debug, Clone)]
pub struct Reply {
    /// `None`: "echo: <last user text>".
    text: Option<String>,
    chunks: usize,
    delay: Duration,
    gate: Option<Gate>,
    usage: Usage,
    /// A tool call writing `(path, content)` instead of a text.
    write: Option<(String, String)>,
    /// The reply to the request that brings the tool call's result back.
    then: Option<Box<Reply>>,
}

impl Reply {
    /// "echo: <last user text>" in four chunks, at once.
    pub fn echo() -> Reply {
        Reply {
            text: None,
            chunks: 4,
            delay: Duration::ZERO,
            gate: None,
            usage: DEFAULT_USAGE,
            write: None,
            then: None,
        }
    }

    /// This text instead of the echo.
    pub fn text(text: &str) -> Reply {
        Reply {
            text: Some(text.to_string()),
            ..Reply::echo()
        }
    }

    /// A tool call that writes `content` to the file `path` (absolute), with a tool the request offers:
    /// a write-file tool (`write`, `Write`, `write_file`, `create_file`, …, arguments filled from its JSON
    /// schema: path-like and content-like properties), else a shell tool (`shell`, `bash`,
    /// `run_shell_command`, `exec_command`, …: `printf '%s' '<content>' > '<path>'`), else Codex's
    /// `apply_patch`. A request offering none of them does not take this reply (a scripted one waits for
    /// the next request; a default one falls back to the echo). The request that brings the tool's result
    /// back gets the [`then`](Reply::then) reply, "done" unless set. A tool call is one chunk: `slow` does
    /// not apply, `gated` holds it before the end of the reply.
    pub fn tool_write(path: &str, content: &str) -> Reply {
        Reply {
            write: Some((path.to_string(), content.to_string())),
            ..Reply::echo()
        }
    }

    /// The reply to the tool result after a [`tool_write`](Reply::tool_write) (default `Reply::text("done")`).
    pub fn then(self, reply: Reply) -> Reply {
        Reply {
            then: Some(Box::new(reply)),
            ..self
        }
    }

    /// The token counts the reply reports (default [`DEFAULT_USAGE`]).
    pub fn usage(self, input: u64, output: u64) -> Reply {
        Reply {
            usage: Usage { input, output },
            ..self
        }
    }

    /// In `chunks` chunks with `delay` after each but the last (a turn that lasts long enough to act in).
    pub fn slow(self, chunks: usize, delay: Duration) -> Reply {
        Reply {
            chunks: chunks.max(1),
            delay,
            ..self
        }
    }

    /// The first chunk goes out (the agent is streaming), then the reply holds until `gate` is released.
    pub fn gated(self, gate: &Gate) -> Reply {
        Reply {
            gate: Some(gate.clone()),
            ..self
        }
    }
}

#[derive(Default)]
struct Shared {
    requests: Mutex<Vec<ModelRequest>>,
    /// One-shot replies for a request whose last user text is the key, first match wins.
    scripted: Mutex<Vec<(String, Reply)>>,
    default: Mutex<Option<Reply>>,
    /// The replies owed to tool results: `(call id, reply)` for every tool call sent whose result has not
    /// come back yet.
    owed: Mutex<Vec<(String, Reply)>>,
    /// Numbers the replies' ids (`chatcmpl-3`, `msg_3`, `call_3`, …).
    ids: AtomicUsize,
    /// Scripted replies go only to requests that offer tools (an agent's turn, not its side calls).
    scripts_need_tools: std::sync::atomic::AtomicBool,
}

pub struct ModelServer {
    port: u16,
    shared: Arc<Shared>,
    accept: tokio::task::AbortHandle,
}

impl ModelServer {
    pub async fn start() -> ModelServer {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind the model server");
        let port = listener.local_addr().unwrap().port();
        let shared = Arc::new(Shared::default());
        let accept = {
            let shared = shared.clone();
            tokio::spawn(async move {
                loop {
                    let Ok((stream, _)) = listener.accept().await else {
                        continue;
                    };
                    // One task per connection: a client that drops one never stops the others.
                    tokio::spawn(serve(shared.clone(), stream));
                }
            })
            .abort_handle()
        };
        ModelServer { port, shared, accept }
    }

    /// The OpenAI-compatible base URL (`.../v1`), as a provider's `baseUrl` (Pi, opencode, Codex).
    pub fn base_url(&self) -> String {
        format!("{}/v1", self.origin())
    }

    /// `127.0.0.1:<port>`: the endpoint a boxed agent's profile lists to reach this server.
    pub fn endpoint(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// `http://127.0.0.1:<port>`, without a path: the base URL Anthropic's and Gemini's clients take
    /// (`ANTHROPIC_BASE_URL`, `GOOGLE_GEMINI_BASE_URL`).
    pub fn origin(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The next request whose last user text is `user_text` gets `reply` (once). The text matches the
    /// whole last user message or one of its parts (agents add context parts around the user's text).
    pub fn reply_to(&self, user_text: &str, reply: Reply) {
        self.shared
            .scripted
            .lock()
            .unwrap()
            .push((user_text.to_string(), reply));
    }

    /// From now on, scripted replies go only to requests that offer tools: the agents of the Agent Client
    /// Protocol make side calls without tools (a title for the conversation) that carry the user's text.
    pub fn scripts_need_tools(&self) {
        self.shared
            .scripts_need_tools
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// Every request without a scripted reply gets this one (instead of `Reply::echo()`).
    pub fn set_default(&self, reply: Reply) {
        *self.shared.default.lock().unwrap() = Some(reply);
    }

    /// The requests received so far, oldest first.
    pub fn requests(&self) -> Vec<ModelRequest> {
        self.shared.requests.lock().unwrap().clone()
    }

    /// Waits (with `within` as the deadline) until exactly `n` requests came, every one completed.
    pub async fn wait_completed(&self, n: usize, within: Duration) -> Vec<ModelRequest> {
        self.wait_until(&format!("{n} completed requests"), within, |r| {
            r.len() == n && r.iter().all(|r| r.outcome == Outcome::Completed)
        })
        .await
    }

    /// Polls the requests until `pred` holds; panics with `what` and the requests after `within`.
    pub async fn wait_until(
        &self,
        what: &str,
        within: Duration,
        pred: impl Fn(&[ModelRequest]) -> bool,
    ) -> Vec<ModelRequest> {
        let every = Duration::from_millis(20);
        let what = format!("the model server to see {what}");
        crate::helpers::wait_until_every(&what, within, every, || async {
            let requests = self.requests();
            if pred(&requests) {
                return Ok(requests);
            }
            let so_far: Vec<_> = requests
                .iter()
                .map(|r| (&r.path, r.outcome, r.conversation()))
                .collect();
            Err(format!("requests so far: {so_far:#?}"))
        })
        .await
    }

    /// Waits for request number `n` (1-based) to reach `outcome` and returns it.
    pub async fn wait_request(&self, n: usize, outcome: Outcome, within: Duration) -> ModelRequest {
        let what = format!("request #{n} {outcome:?}");
        self.wait_until(&what, within, |r| r.len() >= n && r[n - 1].outcome == outcome)
            .await
            .swap_remove(n - 1)
    }
}

impl Drop for ModelServer {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// What a reply says: a text (split into chunks by the dialect) or a tool call.
#[derive(Debug, Clone)]
enum Answer {
    Text(String),
    Tool(ToolCall),
}

/// What the dialects need besides the answer to write a reply.
struct Ctx {
    /// Numbers the reply's ids.
    id: usize,
    model: String,
    usage: Usage,
    chunks: usize,
}

/// The reply to `request`: owed to a tool result, else scripted for its user text, else the default, else the
/// echo; with its answer. A tool call sent makes its follow-up owed.
fn choose(shared: &Shared, request: &ModelRequest, id: usize) -> (Reply, Answer) {
    let tools = request.tools();
    let answer_to = |reply: &Reply| answer(reply, request, &tools, id);
    let (reply, answer) = 'chosen: {
        if let Some(call) = request.tool_result() {
            let mut owed = shared.owed.lock().unwrap();
            // By the call's id; Gemini's results name their own, so else the latest call.
            let i = owed
                .iter()
                .position(|(id, _)| *id == call)
                .or(owed.len().checked_sub(1));
            let reply = i.map(|i| owed.remove(i).1).unwrap_or_else(|| Reply::text("done"));
            drop(owed);
            if let Some(answer) = answer_to(&reply) {
                break 'chosen (reply, answer);
            }
        }
        let mut scripted = shared.scripted.lock().unwrap();
        // An agent's side calls (a title, a summary) offer no tools: with `scripts_need_tools` they never
        // take a scripted reply meant for the turn.
        let side_call = shared.scripts_need_tools.load(std::sync::atomic::Ordering::Relaxed) && tools.is_empty();
        let found = scripted.iter().enumerate().find_map(|(i, (text, reply))| {
            if side_call || !request.said(text) {
                return None;
            }
            answer_to(reply).map(|answer| (i, answer))
        });
        if let Some((i, answer)) = found {
            break 'chosen (scripted.remove(i).1, answer);
        }
        drop(scripted);
        let default = shared.default.lock().unwrap().clone();
        if let Some(reply) = default
            && let Some(answer) = answer_to(&reply)
        {
            break 'chosen (reply, answer);
        }
        let reply = Reply::echo();
        let answer = answer_to(&reply).expect("an echo always answers");
        (reply, answer)
    };
    if let Answer::Tool(call) = &answer {
        let then = reply.then.as_deref().cloned().unwrap_or_else(|| Reply::text("done"));
        shared.owed.lock().unwrap().push((call.id.clone(), then));
    }
    (reply, answer)
}

/// The reply's answer to this request, `None` for a tool call the request offers no tool for.
fn answer(reply: &Reply, request: &ModelRequest, tools: &[Tool], id: usize) -> Option<Answer> {
    let Some((path, content)) = &reply.write else {
        let text = reply
            .text
            .clone()
            .unwrap_or_else(|| format!("echo: {}", request.last_user_text()));
        return Some(Answer::Text(text));
    };
    let (tool, arguments) = write_call(tools, path, content)?;
    let id = match request.dialect {
        Dialect::Anthropic => format!("toolu_{id}"),
        Dialect::Gemini => String::new(),
        _ => format!("call_{id}"),
    };
    Some(Answer::Tool(ToolCall {
        id,
        name: tool.name.clone(),
        arguments,
        kind: tool.kind,
    }))
}

/// Write-file tools, by name (lowercased), in order of preference.
const WRITE_TOOLS: [&str; 5] = ["write", "write_file", "mcp__acp__write", "writefile", "create_file"];
/// Shell tools, by name (lowercased), in order of preference.
const SHELL_TOOLS: [&str; 6] = [
    "shell",
    "shell_command",
    "exec_command",
    "bash",
    "run_shell_command",
    "local_shell",
];

/// The tool to write `content` to `path` with, and its arguments.
fn write_call<'t>(tools: &'t [Tool], path: &str, content: &str) -> Option<(&'t Tool, Value)> {
    let named = |name: &str| tools.iter().find(|t| t.name.to_lowercase() == name);
    for name in WRITE_TOOLS {
        if let Some(tool) = named(name)
            && tool.kind == ToolKind::Function
            && let Some(arguments) = write_arguments(&tool.schema, path, content)
        {
            return Some((tool, arguments));
        }
    }
    if let Some(tool) = SHELL_TOOLS.iter().find_map(|name| named(name)) {
        return Some((tool, shell_arguments(tool, path, content)));
    }
    let tool = named("apply_patch")?;
    let added: String = content.lines().map(|l| format!("+{l}\n")).collect();
    let patch = format!("*** Begin Patch\n*** Add File: {path}\n{added}*** End Patch\n");
    match tool.kind {
        ToolKind::Custom => Some((tool, Value::String(patch))),
        _ => Some((tool, json!({ "input": patch }))),
    }
}

/// A write tool's arguments from its JSON schema: path-like properties get the path, content-like ones the
/// content, other required ones a placeholder. `None` when the schema has no place for either.
fn write_arguments(schema: &Value, path: &str, content: &str) -> Option<Value> {
    let properties = schema["properties"].as_object()?;
    let mut arguments = required_placeholders(schema);
    let (mut has_path, mut has_content) = (false, false);
    for key in properties.keys() {
        let k = key.to_lowercase();
        if k.contains("path") || ["file", "filename", "file_name"].contains(&k.as_str()) {
            arguments[key] = json!(path);
            has_path = true;
        } else if k.contains("content") || k == "text" {
            arguments[key] = json!(content);
            has_content = true;
        }
    }
    (has_path && has_content).then_some(arguments)
}

/// A shell tool's arguments: the command (a string, or `["bash", "-lc", …]` where the schema wants an
/// array), Codex's working directory and its escalation (which makes Codex ask the client's permission).
fn shell_arguments(tool: &Tool, path: &str, content: &str) -> Value {
    let script = format!("printf '%s' {} > {}", quoted(content), quoted(path));
    let argv = json!(["bash", "-lc", script]);
    if tool.kind == ToolKind::LocalShell {
        return json!({ "command": argv });
    }
    let properties = &tool.schema["properties"];
    let mut arguments = required_placeholders(&tool.schema);
    let wants_array = |key: &str| {
        properties[key]["type"]
            .as_str()
            .is_some_and(|t| t.eq_ignore_ascii_case("array"))
    };
    if properties.get("command").is_some() {
        arguments["command"] = if wants_array("command") { argv } else { json!(script) };
    } else if properties.get("cmd").is_some() {
        arguments["cmd"] = json!(script);
    } else {
        arguments["command"] = json!(script);
    }
    if properties.get("workdir").is_some()
        && let Some((dir, _)) = path.rsplit_once('/')
    {
        arguments["workdir"] = json!(if dir.is_empty() { "/" } else { dir });
    }
    if properties.get("sandbox_permissions").is_some() {
        arguments["sandbox_permissions"] = json!("require_escalated");
        arguments["justification"] = json!(format!("Write {path}?"));
    }
    arguments
}

/// `text` as one single-quoted shell word.
fn quoted(text: &str) -> String {
    format!("'{}'", text.replace('\'', r"'\''"))
}

/// An object with a placeholder for every required property of `schema` (by its type).
fn required_placeholders(schema: &Value) -> Value {
    let mut arguments = json!({});
    for key in schema["required"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
    {
        let kind = schema["properties"][key]["type"]
            .as_str()
            .unwrap_or("string")
            .to_lowercase();
        arguments[key] = match kind.as_str() {
            "integer" | "number" => json!(0),
            "boolean" => json!(false),
            "array" => json!([]),
            "object" => json!({}),
            _ => json!("x"),
        };
    }
    arguments
}

/// `text` in `n` pieces of about equal length (on char boundaries; never an empty piece but for "").
fn split(text: &str, n: usize) -> Vec<String> {
    let chars: Vec<char> = text.chars().collect();
    if chars.is_empty() {
        return vec![String::new()];
    }
    let size = chars.len().div_ceil(n.max(1));
    chars.chunks(size).map(|c| c.iter().collect()).collect()
}

/// One server-sent event: `event: <name>` when named, and the data.
fn sse(event: Option<&str>, data: &Value) -> String {
    match event {
        Some(name) => format!("event: {name}\ndata: {data}\n\n"),
        None => format!("data: {data}\n\n"),
    }
}

/// A streamed reply as server-sent events: `head` goes out with the response head, then each piece (a text
/// chunk; a tool call is one piece), then `tail`. A gated reply holds after its first piece; a slow one
/// waits after each piece but the last.
#[derive(Default)]
struct Frames {
    head: Vec<String>,
    pieces: Vec<Vec<String>>,
    tail: Vec<String>,
}

/// Where a request goes, from its method and path.
#[derive(Clone, Copy)]
enum Route {
    /// A model call; `stream` from the path (Gemini) or else from the body.
    Generate {
        dialect: Dialect,
        stream: Option<bool>,
    },
    CountTokens(Dialect),
    NotFound,
}

fn route(method: &str, path: &str) -> Route {
    if method != "POST" {
        return Route::NotFound;
    }
    match path {
        "/v1/chat/completions" => Route::Generate {
            dialect: Dialect::OpenAi,
            stream: None,
        },
        "/v1/responses" => Route::Generate {
            dialect: Dialect::Responses,
            stream: None,
        },
        "/v1/messages" => Route::Generate {
            dialect: Dialect::Anthropic,
            stream: None,
        },
        "/v1/messages/count_tokens" => Route::CountTokens(Dialect::Anthropic),
        _ => match gemini::action(path) {
            Some((_, "streamGenerateContent")) => Route::Generate {
                dialect: Dialect::Gemini,
                stream: Some(true),
            },
            Some((_, "generateContent")) => Route::Generate {
                dialect: Dialect::Gemini,
                stream: Some(false),
            },
            Some((_, "countTokens")) => Route::CountTokens(Dialect::Gemini),
            _ => Route::NotFound,
        },
    }
}

const MAX_HEAD: usize = 64 * 1024;
const MAX_BODY: usize = 32 * 1024 * 1024;

/// One request per connection (answered with `connection: close`).
async fn serve(shared: Arc<Shared>, stream: TcpStream) {
    let (mut rd, mut wr) = stream.into_split();
    let Some((method, target, raw)) = read_request(&mut rd).await else {
        return;
    };
    let (path, query) = target.split_once('?').unwrap_or((&target, ""));
    let body = if raw.is_empty() {
        Ok(Value::Null)
    } else {
        serde_json::from_slice::<Value>(&raw).map_err(|e| e.to_string())
    };
    let route = route(&method, path);
    let dialect = match route {
        Route::Generate { dialect, .. } | Route::CountTokens(dialect) => dialect,
        Route::NotFound => Dialect::Unknown,
    };
    let mut record = ModelRequest {
        dialect,
        method,
        path: path.to_string(),
        query: query.to_string(),
        status: 200,
        body: body
            .clone()
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&raw).into_owned())),
        stream: false,
        outcome: Outcome::Streaming,
        reply: String::new(),
        tool_call: None,
        usage: Usage { input: 0, output: 0 },
    };
    let (status, answer) = match (&route, &body) {
        (Route::NotFound, _) => (
            404,
            json!({"error": {"message": format!("no such route: {} {}", record.method, record.path)}}),
        ),
        (_, Err(e)) => (400, json!({"error": {"message": e}})),
        (Route::CountTokens(dialect), Ok(_)) => {
            record.usage = Usage {
                input: DEFAULT_USAGE.input,
                output: 0,
            };
            let count = match dialect {
                Dialect::Gemini => json!({ "totalTokens": DEFAULT_USAGE.input }),
                _ => json!({ "input_tokens": DEFAULT_USAGE.input }),
            };
            (200, count)
        }
        (Route::Generate { stream, .. }, Ok(_)) => {
            record.stream = stream.unwrap_or(record.body["stream"] == true);
            return generate(&shared, &mut rd, &mut wr, record).await;
        }
    };
    record.status = status;
    let index = push(&shared, record);
    let written = respond(&mut wr, status, &answer).await;
    set_outcome(
        &shared,
        index,
        if written.is_ok() {
            Outcome::Completed
        } else {
            Outcome::Dropped
        },
    );
    let _ = wr.shutdown().await;
}

fn push(shared: &Shared, record: ModelRequest) -> usize {
    let mut requests = shared.requests.lock().unwrap();
    requests.push(record);
    requests.len() - 1
}

fn set_outcome(shared: &Shared, index: usize, outcome: Outcome) {
    shared.requests.lock().unwrap()[index].outcome = outcome;
}

/// Chooses, records and writes the reply to a model call.
async fn generate(
    shared: &Shared,
    rd: &mut (impl AsyncRead + Unpin),
    wr: &mut (impl AsyncWriteExt + Unpin),
    mut record: ModelRequest,
) {
    let id = shared.ids.fetch_add(1, Ordering::Relaxed);
    let (reply, answer) = match gemini::json_schema(&record) {
        // Gemini CLI's side calls (next speaker, model routing) want JSON: an example of the schema, unscripted.
        Some(schema) => {
            let text = gemini::example(&schema).to_string();
            (Reply::text(&text).slow(1, Duration::ZERO), Answer::Text(text))
        }
        None => choose(shared, &record, id),
    };
    match &answer {
        Answer::Text(text) => record.reply = text.clone(),
        Answer::Tool(call) => record.tool_call = Some(call.clone()),
    }
    record.usage = reply.usage;
    let model = match record.dialect {
        Dialect::Gemini => gemini::action(&record.path).map(|(model, _)| model.to_string()),
        _ => record.body["model"].as_str().map(str::to_string),
    };
    let ctx = Ctx {
        id,
        model: model.unwrap_or_else(|| "scripted".to_string()),
        usage: reply.usage,
        chunks: reply.chunks,
    };
    let (dialect, stream, sse) = (record.dialect, record.stream, record.query.contains("alt=sse"));
    let index = push(shared, record);
    let set = |outcome: Outcome| set_outcome(shared, index, outcome);
    let outcome = if stream && (dialect != Dialect::Gemini || sse) {
        let frames = match dialect {
            Dialect::OpenAi => openai::frames(&answer, &ctx),
            Dialect::Responses => responses::frames(&answer, &ctx),
            Dialect::Anthropic => anthropic::frames(&answer, &ctx),
            _ => gemini::frames(&answer, &ctx),
        };
        stream_frames(rd, wr, &reply, frames, &set).await
    } else {
        let body = match dialect {
            Dialect::OpenAi => openai::whole(&answer, &ctx),
            Dialect::Responses => responses::whole(&answer, &ctx),
            Dialect::Anthropic => anthropic::whole(&answer, &ctx),
            // Gemini's stream without `alt=sse` is one JSON array of the chunks.
            _ if stream => Value::Array(gemini::chunks(&answer, &ctx)),
            _ => gemini::whole(&answer, &ctx),
        };
        let pieces = match &answer {
            Answer::Text(text) => split(text, reply.chunks).len(),
            Answer::Tool(_) => 1,
        };
        let mut held = true;
        for i in 0..pieces {
            held = held && pause(rd, &reply, i, pieces, &set).await;
        }
        match held && respond(wr, 200, &body).await.is_ok() {
            true => Outcome::Completed,
            false => Outcome::Dropped,
        }
    };
    set(outcome);
    let _ = wr.shutdown().await;
}

async fn stream_frames(
    rd: &mut (impl AsyncRead + Unpin),
    wr: &mut (impl AsyncWriteExt + Unpin),
    reply: &Reply,
    frames: Frames,
    set: &impl Fn(Outcome),
) -> Outcome {
    let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n\
                connection: close\r\n\r\n";
    if write(wr, &(head.to_string() + &frames.head.concat())).await.is_err() {
        return Outcome::Dropped;
    }
    let n = frames.pieces.len();
    for (i, piece) in frames.pieces.iter().enumerate() {
        if write(wr, &piece.concat()).await.is_err() || !pause(rd, reply, i, n, set).await {
            return Outcome::Dropped;
        }
    }
    if write(wr, &frames.tail.concat()).await.is_err() {
        return Outcome::Dropped;
    }
    Outcome::Completed
}

/// After piece `i` of `n`: the gate after the first, the delay after each but the last. `false` when the
/// client closed the connection meanwhile.
async fn pause(rd: &mut (impl AsyncRead + Unpin), reply: &Reply, i: usize, n: usize, set: &impl Fn(Outcome)) -> bool {
    if i == 0
        && let Some(gate) = &reply.gate
    {
        set(Outcome::Held);
        tokio::select! {
            _ = gate.opened() => set(Outcome::Streaming),
            _ = closed(rd) => return false,
        }
    }
    if i + 1 < n && !reply.delay.is_zero() {
        tokio::select! {
            _ = tokio::time::sleep(reply.delay) => {}
            _ = closed(rd) => return false,
        }
    }
    true
}

async fn write(wr: &mut (impl AsyncWriteExt + Unpin), text: &str) -> std::io::Result<()> {
    wr.write_all(text.as_bytes()).await?;
    wr.flush().await
}

/// Resolves when the peer closes its side (it sends nothing more after its request).
async fn closed(rd: &mut (impl AsyncRead + Unpin)) {
    let mut buf = [0u8; 512];
    loop {
        match rd.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
    }
}

async fn respond(wr: &mut (impl AsyncWriteExt + Unpin), status: u16, body: &Value) -> std::io::Result<()> {
    let reason = match status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        _ => "",
    };
    let body = body.to_string();
    let head = format!(
        "HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\
         connection: close\r\n\r\n",
        body.len()
    );
    write(wr, &(head + &body)).await
}

/// Reads one request: method, target and body (by `content-length` or chunked). `None` on a broken request.
async fn read_request(rd: &mut (impl AsyncRead + Unpin)) -> Option<(String, String, Vec<u8>)> {
    let mut buf = Vec::new();
    let mut tmp = [0u8; 8192];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i;
        }
        if buf.len() > MAX_HEAD {
            return None;
        }
        let n = rd.read(&mut tmp).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&tmp[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let mut rest = buf.split_off(head_end + 4);
    let mut lines = head.split("\r\n");
    let mut request_line = lines.next()?.split(' ');
    let method = request_line.next()?.to_string();
    let target = request_line.next()?.to_string();
    let mut length = None;
    let mut chunked = false;
    for line in lines {
        let (name, value) = line.split_once(':')?;
        let value = value.trim();
        match name.trim().to_ascii_lowercase().as_str() {
            "content-length" => length = value.parse::<usize>().ok(),
            "transfer-encoding" => chunked = value.to_ascii_lowercase().contains("chunked"),
            _ => {}
        }
    }
    let body = if chunked {
        read_chunked(rd, rest).await?
    } else {
        let length = length.unwrap_or(0);
        if length > MAX_BODY {
            return None;
        }
        while rest.len() < length {
            let n = rd.read(&mut tmp).await.ok()?;
            if n == 0 {
                return None;
            }
            rest.extend_from_slice(&tmp[..n]);
        }
        rest.truncate(length);
        rest
    };
    Some((method, target, body))
}

async fn read_chunked(rd: &mut (impl AsyncRead + Unpin), mut buf: Vec<u8>) -> Option<Vec<u8>> {
    let mut body = Vec::new();
    let mut tmp = [0u8; 8192];
    let mut pos = 0;
    loop {
        // A size line, then that many bytes and CRLF; size 0 ends the body (trailers are not expected).
        let line_end = loop {
            if let Some(i) = buf[pos..].windows(2).position(|w| w == b"\r\n") {
                break pos + i;
            }
            let n = rd.read(&mut tmp).await.ok()?;
            if n == 0 {
                return None;
            }
            buf.extend_from_slice(&tmp[..n]);
        };
        let size_text = String::from_utf8_lossy(&buf[pos..line_end]).into_owned();
        let size = usize::from_str_radix(size_text.split(';').next()?.trim(), 16).ok()?;
        if body.len() + size > MAX_BODY {
            return None;
        }
        let data_start = line_end + 2;
        while buf.len() < data_start + size + 2 {
            let n = rd.read(&mut tmp).await.ok()?;
            if n == 0 {
                return None;
            }
            buf.extend_from_slice(&tmp[..n]);
        }
        if size == 0 {
            return Some(body);
        }
        body.extend_from_slice(&buf[data_start..data_start + size]);
        pos = data_start + size + 2;
    }
}
