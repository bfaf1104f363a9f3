//! The Agent Client Protocol, version 1 (agentclientprotocol.com): JSON-RPC 2.0, one message per line,
//! over the agent's stdio. berth is the client: it opens the connection (`initialize`), starts or loads
//! the session's one conversation (`session/new`, `session/load`, `session/resume`), sends each message as
//! a `session/prompt` whose answer (`stopReason`) ends the turn, cancels with `session/cancel`, answers
//! `session/request_permission` with the option a person chose, and serves `fs/read_text_file` and
//! `fs/write_text_file` inside the admitted worktree only. It offers no terminal.
//!
//! What berth records of an ACP agent is the agent's own messages (without `jsonrpc`): each
//! `session/update`, each permission request, and the answer to each prompt. Message and thought chunks
//! of one run are coalesced into one `session/update` with the text joined and `coalesced` counting the
//! chunks. Chunks and tool calls outside a turn are what `session/load` replays: never recorded again.
use std::collections::HashMap;

use serde_json::{Map, Value, json};

use super::fs;
use super::types::{
    Answer, Command, Inbound, Introduction, Notice, Outgoing, Reply, Run, Signal, Unsupported, UsageReport,
};
use crate::config::{McpServer, McpTransport};

/// The protocol version berth speaks.
pub const PROTOCOL_VERSION: u64 = 1;
/// The steering extension's request: a message into the running turn.
const STEER_METHOD: &str = "_session/steering";
/// ACP's "authentication required" error code.
pub const AUTH_REQUIRED: i64 = -32000;
/// The most tool calls of one turn kept for the snapshot (the events hold all of them).
const TOOL_CALLS_SHOWN: usize = 50;
/// The most text of one turn kept for its transcript entry (the events hold all of it).
const TURN_TEXT_CAP: usize = 1024 * 1024;

/// One agent's side of the protocol.
#[derive(Debug, Default)]
pub struct Wire {
    /// Whether berth offers `fs/read_text_file` (it always offers writes).
    offer_reads: bool,
    /// The profile's MCP servers, in the protocol's shape, for every conversation opened or loaded.
    mcp_servers: Vec<Value>,
    /// The agent's id of the conversation, once `session/new`, `session/load` or `session/resume` named it.
    conversation: Option<String>,
    /// berth's requests waiting for their answer, by id.
    asked: HashMap<String, Asked>,
    /// The agent's permission requests waiting for a person: berth's id of each, and the agent's own.
    questions: HashMap<String, Value>,
    /// The prompt in flight, if any: its turn.
    turn: Option<Turn>,
    /// The tool calls of the current (or last) turn, as shown: `{id, title, kind, status, paths}`.
    tool_calls: Vec<Value>,
    introduction: Option<Introduction>,
    /// The model the agent last named with its usage (Claude's `_meta["_claude/model"]`).
    usage_model: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Asked {
    Initialize,
    Conversation,
    Prompt,
    Mode(String),
    Option,
    Steer,
}

#[derive(Debug, Default)]
struct Turn {
    id: String,
    text: String,
    thought: String,
}

/// The one `session/update` that stands for a run of chunks: its kind (`agent_message_chunk`,
/// `agent_thought_chunk`), conversation and message id (when the agent gives one), the text joined.
pub fn render(run: &Run, text: &str, count: usize) -> Value {
    let mut update = json!({"sessionUpdate": run.kind, "content": {"type": "text", "text": text}});
    if !run.block.is_null() {
        update["messageId"] = run.block.clone();
    }
    json!({"method": "session/update", "params": {"sessionId": run.conversation, "update": update}, "coalesced": count})
}

/// An MCP server as ACP names it: stdio without a `type`, `env` and `headers` as name/value lists.
fn mcp_server(server: &McpServer) -> Value {
    let pairs = |m: &std::collections::BTreeMap<String, String>| -> Vec<Value> {
        m.iter().map(|(k, v)| json!({"name": k, "value": v})).collect()
    };
    match server {
        McpServer::Stdio {
            name,
            command,
            args,
            env,
        } => {
            json!({"name": name, "command": command, "args": args, "env": pairs(env)})
        }
        McpServer::Remote {
            name,
            url,
            transport,
            headers,
        } => {
            let kind = match transport {
                McpTransport::Http => "http",
                McpTransport::Sse => "sse",
            };
            json!({"type": kind, "name": name, "url": url, "headers": pairs(headers)})
        }
    }
}

fn request(id: &str, method: &str, params: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})
}

impl Wire {
    pub fn new(offer_reads: bool, mcp_servers: &[McpServer]) -> Wire {
        Wire {
            offer_reads,
            mcp_servers: mcp_servers.iter().map(mcp_server).collect(),
            ..Default::default()
        }
    }

    pub fn introduction(&self) -> Option<&Introduction> {
        self.introduction.as_ref()
    }

    pub fn encode(&mut self, command: &Command, id: String) -> Result<Outgoing, Unsupported> {
        let awaited = |wire: &mut Wire, asked: Asked, method: &str, params: Value| {
            wire.asked.insert(id.clone(), asked);
            Ok(Outgoing {
                lines: vec![request(&id, method, params)],
                awaits: Some(id.clone()),
                ..Default::default()
            })
        };
        let conversation = self.conversation.clone().unwrap_or_default();
        match command {
            Command::Initialize => awaited(
                self,
                Asked::Initialize,
                "initialize",
                json!({
                    "protocolVersion": PROTOCOL_VERSION,
                    "clientCapabilities": {"fs": {"readTextFile": self.offer_reads, "writeTextFile": true}, "terminal": false},
                    "clientInfo": {"name": "berth", "title": "berth", "version": crate::version::VERSION},
                }),
            ),
            Command::NewConversation { cwd } => awaited(
                self,
                Asked::Conversation,
                "session/new",
                json!({"cwd": cwd, "mcpServers": self.mcp_servers}),
            ),
            Command::LoadConversation { id: conv, cwd } | Command::ResumeConversation { id: conv, cwd } => {
                let method = if matches!(command, Command::LoadConversation { .. }) {
                    "session/load"
                } else {
                    "session/resume"
                };
                self.conversation = Some(conv.clone());
                awaited(
                    self,
                    Asked::Conversation,
                    method,
                    json!({"sessionId": conv, "cwd": cwd, "mcpServers": self.mcp_servers}),
                )
            }
            Command::Prompt(text) => {
                if self.conversation.is_none() {
                    return Err(Unsupported::Command);
                }
                // Delivered once written: the answer comes when the turn ends.
                self.asked.insert(id.clone(), Asked::Prompt);
                self.turn = Some(Turn {
                    id: id.clone(),
                    ..Default::default()
                });
                let mut signals = vec![Signal::TurnStarted];
                if !self.tool_calls.is_empty() {
                    self.tool_calls.clear();
                    signals.push(learned("tool_calls", &json!([])));
                }
                let params = json!({"sessionId": conversation, "prompt": [{"type": "text", "text": text}]});
                Ok(Outgoing {
                    lines: vec![request(&id, "session/prompt", params)],
                    awaits: None,
                    working: Some(true),
                    signals,
                })
            }
            // The steering extension (`_session/steering`) where the agent advertises it. berth opts in to
            // `promptRequired`: a steer that finds no running turn comes back to berth, which then sends
            // it as the next prompt (never a turn the agent starts on its own).
            Command::Steer(text) if self.introduction.as_ref().is_some_and(|i| i.steering) => awaited(
                self,
                Asked::Steer,
                STEER_METHOD,
                json!({
                    "sessionId": conversation,
                    "prompt": [{"type": "text", "text": text}],
                    "_meta": {"steering": {"idleBehavior": "promptRequired"}},
                }),
            ),
            Command::Steer(_) => Err(Unsupported::Steer),
            Command::Abort => {
                // The protocol requires every pending permission request be answered `cancelled`.
                let mut lines =
                    vec![json!({"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": conversation}})];
                for (_, agent_id) in self.questions.drain() {
                    lines.push(answer(agent_id, &Answer::Cancelled));
                }
                Ok(Outgoing {
                    lines,
                    signals: vec![Signal::QuestionsCleared],
                    ..Default::default()
                })
            }
            Command::Answer { request_id, answer: a } => {
                let agent_id = self.questions.remove(request_id).ok_or(Unsupported::Command)?;
                Ok(Outgoing {
                    lines: vec![answer(agent_id, a)],
                    ..Default::default()
                })
            }
            Command::SetMode(mode) => awaited(
                self,
                Asked::Mode(mode.clone()),
                "session/set_mode",
                json!({"sessionId": conversation, "modeId": mode}),
            ),
            Command::SetOption { option_id, value } => awaited(
                self,
                Asked::Option,
                "session/set_config_option",
                json!({"sessionId": conversation, "configId": option_id, "value": value}),
            ),
            Command::AskState | Command::AskCommands | Command::AskModels => Err(Unsupported::Command),
        }
    }

    pub fn decode(&mut self, mut line: Value) -> Inbound {
        if let Some(o) = line.as_object_mut() {
            o.remove("jsonrpc");
        }
        let method = line["method"].as_str().map(str::to_string);
        let has_id = line.get("id").is_some_and(|id| !id.is_null());
        match (method, has_id) {
            (None, true) => self.answered(line),
            (Some(method), true) => self.asked_of_berth(&method, line),
            (Some(method), false) if method == "session/update" => self.update(line),
            // Other notifications (`_meta` traffic, an auth status) are the agent's to tell: recorded.
            _ => Inbound {
                record: Some(line),
                ..Default::default()
            },
        }
    }

    /// The answer to one of berth's requests.
    fn answered(&mut self, line: Value) -> Inbound {
        let id = match &line["id"] {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        let Some(asked) = self.asked.remove(&id) else {
            return Inbound {
                record: Some(line),
                ..Default::default()
            };
        };
        let reply = match line.get("error") {
            Some(e) => Reply::Refused {
                reason: refusal(e),
                code: e["code"].as_i64(),
            },
            None => Reply::Ok(line["result"].clone()),
        };
        let mut inbound = Inbound::default();
        match asked {
            Asked::Prompt => {
                let turn = self.turn.take_if(|t| t.id == id).unwrap_or_default();
                let stop_reason = match &reply {
                    Reply::Ok(r) => r["stopReason"].as_str().unwrap_or("end_turn").to_string(),
                    _ => "error".to_string(),
                };
                let mut content = Vec::new();
                if !turn.thought.is_empty() {
                    content.push(json!({"type": "thinking", "thinking": turn.thought}));
                }
                content.push(json!({"type": "text", "text": turn.text}));
                inbound.signals = vec![Signal::QuestionsCleared, Signal::ToolEnded];
                // The turn's tokens (the prompt response's `usage`); its cost comes by `usage_update`.
                if let Reply::Ok(r) = &reply
                    && r["usage"].is_object()
                {
                    let u = &r["usage"];
                    inbound.signals.push(Signal::Usage(UsageReport {
                        model: self.usage_model.clone(),
                        input: u["inputTokens"].clone(),
                        output: u["outputTokens"].clone(),
                        cache_read: u["cachedReadTokens"].clone(),
                        cache_write: u["cachedWriteTokens"].clone(),
                        ..Default::default()
                    }));
                }
                inbound.signals.extend([
                    Signal::Assistant(json!({"role": "assistant", "content": content, "stopReason": stop_reason})),
                    Signal::TurnSettled {
                        stop_reason: Some(stop_reason),
                    },
                ]);
                self.questions.clear();
                inbound.record = Some(line);
                return inbound;
            }
            Asked::Initialize => {
                if let Reply::Ok(r) = &reply {
                    let caps = &r["agentCapabilities"];
                    let intro = Introduction {
                        info: r["agentInfo"].clone(),
                        can_load: caps["loadSession"] == true,
                        can_resume: caps["sessionCapabilities"]["resume"].is_object(),
                        auth_methods: r["authMethods"].as_array().cloned().unwrap_or_default(),
                        steering: steering(r),
                    };
                    let mut facts = Map::new();
                    facts.insert(
                        "identity".into(),
                        json!({
                            "name": r["agentInfo"]["name"],
                            "title": r["agentInfo"]["title"],
                            "version": r["agentInfo"]["version"],
                            "protocol_version": r["protocolVersion"],
                            "capabilities": caps,
                            "auth_methods": intro.auth_methods,
                            "steering": intro.steering,
                        }),
                    );
                    inbound.signals.push(Signal::Notice(Notice::Learned(facts)));
                    self.introduction = Some(intro);
                }
            }
            Asked::Conversation => {
                if let Reply::Ok(r) = &reply {
                    if let Some(conv) = r["sessionId"].as_str() {
                        self.conversation = Some(conv.to_string());
                    }
                    let facts = conversation_facts(r);
                    if !facts.is_empty() {
                        inbound.signals.push(Signal::Notice(Notice::Learned(facts)));
                    }
                }
            }
            Asked::Steer => {
                // Taken into the turn; or the turn had ended (berth sends it as a prompt); or not taken.
                let reply = match (&reply, reply_outcome(&reply)) {
                    (Reply::Ok(_), Some("promptRequired")) => Reply::Busy,
                    (Reply::Ok(_), Some("failed")) => Reply::Refused {
                        reason: "the agent could not take the message into its turn".into(),
                        code: None,
                    },
                    _ => reply,
                };
                inbound.record = Some(line);
                inbound.reply = Some((id, reply));
                return inbound;
            }
            // A mode or an option taken: what the agent now says about its options (it may also report
            // the change as an update).
            Asked::Mode(_) | Asked::Option => {
                if let Reply::Ok(r) = &reply {
                    let mut facts = conversation_facts(r);
                    if let Asked::Mode(mode) = &asked {
                        facts.insert("mode".into(), mode.clone().into());
                    }
                    if !facts.is_empty() {
                        inbound.signals.push(Signal::Notice(Notice::Learned(facts)));
                    }
                }
            }
        }
        inbound.reply = Some((id, reply));
        inbound
    }

    /// A request of the agent's: a permission question, a file berth serves, or something not offered.
    fn asked_of_berth(&mut self, method: &str, line: Value) -> Inbound {
        let agent_id = line["id"].clone();
        let params = &line["params"];
        match method {
            "session/request_permission" => {
                let shown = match &agent_id {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                };
                self.questions.insert(shown.clone(), agent_id);
                let request = json!({
                    "id": shown,
                    "method": "request_permission",
                    "title": params["toolCall"]["title"],
                    "tool_call": params["toolCall"],
                    "options": params["options"],
                });
                Inbound {
                    signals: vec![Signal::Question {
                        request,
                        timeout_ms: None,
                    }],
                    record: Some(line),
                    ..Default::default()
                }
            }
            "fs/read_text_file" | "fs/write_text_file" if method != "fs/read_text_file" || self.offer_reads => {
                let path = params["path"].as_str().unwrap_or_default().to_string();
                let op = if method == "fs/read_text_file" {
                    fs::Op::Read {
                        path: path.clone(),
                        line: params["line"].as_u64(),
                        limit: params["limit"].as_u64(),
                    }
                } else {
                    fs::Op::Write {
                        path: path.clone(),
                        content: params["content"].as_str().map(str::to_string),
                    }
                };
                // Recorded without the file's content: which file, and that it was asked for.
                let record = json!({"id": agent_id, "method": method, "params": {"path": path}});
                Inbound {
                    record: Some(record),
                    serve: Some(fs::Request { id: agent_id, op }),
                    ..Default::default()
                }
            }
            _ => Inbound {
                send: vec![json!({"jsonrpc": "2.0", "id": agent_id,
                    "error": {"code": -32601, "message": format!("berth does not offer {method}")}})],
                record: Some(line),
                ..Default::default()
            },
        }
    }
}

fn learned(key: &str, value: &Value) -> Signal {
    let mut facts = Map::new();
    facts.insert(key.to_string(), value.clone());
    Signal::Notice(Notice::Learned(facts))
}

/// Whether an `initialize` answer advertises the steering extension (`_meta.steering.supported`).
pub fn steering(initialized: &Value) -> bool {
    initialized["_meta"]["steering"]["supported"] == true
}

fn reply_outcome(reply: &Reply) -> Option<&str> {
    match reply {
        Reply::Ok(r) => r["outcome"].as_str(),
        _ => None,
    }
}

/// A JSON-RPC error as a reason: its message, with the details agents put in `data` (gemini-cli answers
/// "Internal error" and says why there).
fn refusal(e: &Value) -> String {
    let message = e["message"].as_str().unwrap_or("refused by the agent");
    let details = match &e["data"] {
        Value::String(d) => Some(d.clone()),
        Value::Object(o) => o
            .get("details")
            .or(o.get("message"))
            .and_then(Value::as_str)
            .map(str::to_string),
        _ => None,
    };
    match details {
        Some(d) if !d.is_empty() && d != message => format!("{message}: {d}"),
        _ => message.to_string(),
    }
}

/// The modes, models and options a conversation offers, as `session/new` (or a load) tells them.
fn conversation_facts(result: &Value) -> Map<String, Value> {
    let mut facts = Map::new();
    if let Some(modes) = result.get("modes").filter(|m| m.is_object()) {
        facts.insert("modes".into(), modes["availableModes"].clone());
        facts.insert("mode".into(), modes["currentModeId"].clone());
    }
    if let Some(models) = result.get("models").filter(|m| m.is_object()) {
        facts.insert("models".into(), models["availableModels"].clone());
        facts.insert("model".into(), models["currentModelId"].clone());
    }
    if let Some(options) = result.get("configOptions").filter(|o| o.is_array()) {
        facts.insert("config_options".into(), options.clone());
    }
    facts
}

/// The answer to a permission request.
fn answer(agent_id: Value, answer: &Answer) -> Value {
    let outcome = match answer {
        Answer::Option(option) => json!({"outcome": "selected", "optionId": option}),
        _ => json!({"outcome": "cancelled"}),
    };
    json!({"jsonrpc": "2.0", "id": agent_id, "result": {"outcome": outcome}})
}

/// A permission question is answered with one of its options, or cancelled.
pub(super) fn fits(request: &Value, answer: &Answer) -> Result<(), (&'static str, String)> {
    match answer {
        Answer::Cancelled => Ok(()),
        Answer::Option(o) => {
            let offered = request["options"]
                .as_array()
                .is_some_and(|opts| opts.iter().any(|opt| opt["optionId"] == o.as_str()));
            if offered {
                Ok(())
            } else {
                Err(("option_id", "not one of the options the agent offered".into()))
            }
        }
        _ => Err(("option_id", "a permission request is answered with option_id".into())),
    }
}

/// The answer to a file request berth served.
pub(super) fn served(id: Value, result: Result<Value, fs::Failure>) -> Value {
    match result {
        Ok(r) => json!({"jsonrpc": "2.0", "id": id, "result": r}),
        Err(f) => json!({"jsonrpc": "2.0", "id": id, "error": {"code": f.code, "message": f.message}}),
    }
}

mod updates;

#[cfg(test)]
mod tests;
