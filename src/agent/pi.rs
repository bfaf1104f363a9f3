//! The Pi coding agent's RPC mode (`pi --mode rpc`): commands and events as JSON lines. Berth's own
//! commands carry an `id` Pi answers with a `response`; a prompt is accepted (or refused) at once and
//! the turn runs between `agent_start` and `agent_end` (a newer Pi adds `agent_settled`). Questions are
//! `extension_ui_request` dialogs; notices are the same message with a fire-and-forget method.
use std::path::Path;

use serde_json::{Value, json};

use super::types::{
    Answer, Command, Delta, Inbound, Notice, Outgoing, Protocol, Reply, Run, Signal, Unsupported, UsageReport,
};

/// The `id` prefix of berth's own commands, whose responses are routed back instead of recorded.
pub const REQUEST_PREFIX: &str = "berth-";

/// The `extension_ui_request` methods that only tell the user something (a notification, a status
/// line, a widget, a title, the editor's text): no answer is awaited, so they never make a session wait.
pub const FIRE_AND_FORGET_UI: [&str; 5] = ["notify", "setStatus", "setWidget", "setTitle", "set_editor_text"];

/// The kinds of `assistantMessageEvent` that carry a piece of a content block.
const DELTA_KINDS: [&str; 3] = ["text_delta", "thinking_delta", "toolcall_delta"];

#[derive(Debug, Default)]
pub struct Wire {
    /// Berth's prompts waiting for Pi's answer (a refusal because a turn runs means "wait").
    prompts: std::collections::HashSet<String>,
}

/// The one `message_update` that stands for a run of deltas: Pi's block shape (`assistantMessageEvent`
/// with its kind and `contentIndex`), or the plain `{"type":"message_update","delta":..}`.
pub fn render(run: &Run, text: &str, count: usize) -> Value {
    match &run.kind {
        Some(kind) => {
            let mut piece = json!({"type": kind, "delta": text});
            if !run.block.is_null() {
                piece["contentIndex"] = run.block.clone();
            }
            json!({"type": "message_update", "assistantMessageEvent": piece, "coalesced": count})
        }
        None => json!({"type": "message_update", "delta": text, "coalesced": count}),
    }
}

fn run(kind: Option<String>, block: Value) -> Run {
    Run {
        protocol: Protocol::Pi,
        kind,
        block,
        conversation: Value::Null,
    }
}

impl Wire {
    pub fn encode(&mut self, command: &Command, id: String) -> Result<Outgoing, Unsupported> {
        let awaited = |mut line: Value, working: Option<bool>| {
            line["id"] = id.clone().into();
            Ok(Outgoing {
                lines: vec![line],
                awaits: Some(id.clone()),
                working,
                signals: Vec::new(),
            })
        };
        match command {
            // Pi runs an extension command (`/name`) at once, outside any turn (no agent_start/agent_end),
            // and answers its prompt only when the command is done (after a dialog is answered, say): it
            // is handed over without waiting, and does not make the agent look busy.
            Command::Prompt(text) if text.starts_with('/') => Ok(Outgoing {
                lines: vec![json!({"type": "prompt", "message": text})],
                ..Default::default()
            }),
            Command::Prompt(text) => {
                self.prompts.insert(id.clone());
                awaited(json!({"type": "prompt", "message": text}), Some(true))
            }
            Command::Steer(text) => awaited(json!({"type": "steer", "message": text}), None),
            Command::Abort => awaited(json!({"type": "abort"}), None),
            Command::Answer { request_id, answer } => Ok(Outgoing {
                lines: vec![answer_line(request_id, answer)],
                ..Default::default()
            }),
            Command::AskState => awaited(json!({"type": "get_state"}), None),
            Command::AskCommands => awaited(json!({"type": "get_commands"}), None),
            Command::AskModels => awaited(json!({"type": "get_available_models"}), None),
            _ => Err(Unsupported::Command),
        }
    }

    pub fn decode(&mut self, line: Value) -> Inbound {
        let mut inbound = decode(line);
        if let Some((id, reply)) = &mut inbound.reply {
            let prompt = self.prompts.remove(id.as_str());
            if let Reply::Refused { reason, .. } = reply
                && prompt
                && is_busy_refusal(reason)
            {
                *reply = Reply::Busy;
            }
        }
        inbound
    }
}

/// Pi's and the JSON-lines protocol's output vocabulary.
pub(super) fn decode(line: Value) -> Inbound {
    let mut inbound = Inbound::default();
    match line["type"].as_str() {
        // An answer to one of berth's own commands goes to whoever waits for it, not to the log.
        Some("response") if line["id"].as_str().is_some_and(|id| id.starts_with(REQUEST_PREFIX)) => {
            let id = line["id"].as_str().unwrap_or_default().to_string();
            let reply = if line["success"] == true {
                Reply::Ok(line["data"].clone())
            } else {
                let reason = line["error"].as_str().unwrap_or("refused by the agent").to_string();
                Reply::Refused { reason, code: None }
            };
            inbound.reply = Some((id, reply));
            return inbound;
        }
        Some("queue_update") => {
            let len = |k: &str| line[k].as_array().map_or(0, Vec::len);
            inbound.signals.push(Signal::Queue(len("steering") + len("followUp")));
        }
        Some("agent_start") => inbound.signals.push(Signal::TurnStarted),
        Some("agent_end" | "agent_settled") => {
            // Requests expire when the agent ends its turn (it timed them out or was aborted).
            inbound.signals.push(Signal::QuestionsCleared);
            inbound.signals.push(Signal::TurnSettled { stop_reason: None });
        }
        Some("tool_execution_start") => {
            let name = line["toolName"].as_str().or(line["tool"].as_str()).unwrap_or("tool");
            inbound.signals.push(Signal::ToolStarted(name.to_string()));
        }
        Some("tool_execution_end") => inbound.signals.push(Signal::ToolEnded),
        Some("message_end") if line["message"]["role"] == "assistant" => {
            let message = &line["message"];
            if message["usage"].is_object() {
                inbound.signals.push(Signal::Usage(usage(message)));
            }
            inbound.signals.push(Signal::Assistant(message.clone()));
        }
        Some("message_update") => {
            if let Some(delta) = delta(&line) {
                inbound.delta = Some(delta);
                return inbound;
            }
        }
        Some("extension_ui_request") if line["id"].is_string() && is_dialog(&line) => {
            inbound.signals.push(Signal::Question {
                request: line.clone(),
                timeout_ms: line["timeout"].as_u64(),
            });
        }
        Some("extension_ui_request") => {
            if let Some(notice) = notice(&line) {
                inbound.signals.push(Signal::Notice(notice));
            }
        }
        _ => {}
    }
    inbound.record = Some(line);
    inbound
}

/// What berth records when a question's own timeout passed (the agent resolved it with its default).
pub fn expired(id: &Value) -> Value {
    json!({ "type": "extension_ui_expired", "id": id })
}

/// Pi refuses a plain prompt while it streams ("Agent is already processing. Specify streamingBehavior").
fn is_busy_refusal(reason: &str) -> bool {
    reason.contains("already processing") || reason.contains("streamingBehavior")
}

/// Whether an agent's output line is a question waiting for an answer (`select`, `confirm`, `input`,
/// `editor`, or any method not known to be fire-and-forget: a question is never ignored).
pub fn is_dialog(event: &Value) -> bool {
    event["type"] == "extension_ui_request"
        && !event["method"]
            .as_str()
            .is_some_and(|m| FIRE_AND_FORGET_UI.contains(&m))
}

fn notice(line: &Value) -> Option<Notice> {
    match line["method"].as_str()? {
        "setStatus" => Some(Notice::Status {
            key: line["statusKey"].as_str().unwrap_or("status").to_string(),
            text: line["statusText"].as_str().map(str::to_string),
        }),
        "setTitle" => Some(Notice::Title(line["title"].clone())),
        "notify" => Some(Notice::Notify {
            message: line["message"].clone(),
            kind: line["notifyType"].as_str().unwrap_or("info").to_string(),
        }),
        _ => None,
    }
}

pub(super) fn answer_line(request_id: &str, answer: &Answer) -> Value {
    let mut line = match answer {
        Answer::Value(v) => json!({ "value": v }),
        Answer::Confirmed(c) => json!({ "confirmed": c }),
        // Pi's dialogs have no options; `fits` refuses one before it gets here.
        Answer::Option(v) => json!({ "value": v }),
        Answer::Cancelled => json!({ "cancelled": true }),
    };
    line["type"] = "extension_ui_response".into();
    line["id"] = request_id.into();
    line
}

/// A wrong shape for the question's method is refused (and the question stays pending).
pub(super) fn fits(request: &Value, answer: &Answer) -> Result<(), (&'static str, String)> {
    match (request["method"].as_str(), answer) {
        (_, Answer::Cancelled) => Ok(()),
        (_, Answer::Option(_)) => Err((
            "option_id",
            "this question has no options; answer with value or confirmed".into(),
        )),
        (Some("confirm"), Answer::Confirmed(_)) => Ok(()),
        (Some("confirm"), _) => Err(("confirmed", "a confirm question is answered with confirmed".into())),
        (Some("select" | "input" | "editor"), Answer::Value(_)) => Ok(()),
        (Some(m @ ("select" | "input" | "editor")), _) => {
            Err(("value", format!("a {m} question is answered with a value")))
        }
        // A method this berth does not know: the agent judges the answer.
        _ => Ok(()),
    }
}

/// Pi continues the conversation in the file it is given.
pub(super) fn launch_args(conversation: &Path) -> Vec<String> {
    vec!["--session".into(), conversation.display().to_string()]
}

/// Whether a Pi conversation file's header names the conversation berth recorded.
pub fn header_names(header: &Value, recorded: &str) -> bool {
    header["type"] == "session" && header["id"] == recorded
}

/// What Pi's `get_state` (and with it `get_commands`, `get_available_models`) say, as facts for snapshots,
/// and the conversation's identity.
pub fn learned(
    state: &Value,
    commands: Option<&Value>,
    models: Option<&Value>,
) -> (serde_json::Map<String, Value>, Option<String>) {
    let mut facts = serde_json::Map::new();
    facts.insert("model".into(), state["model"].clone());
    facts.insert("thinking_level".into(), state["thinkingLevel"].clone());
    facts.insert("session_name".into(), state["sessionName"].clone());
    if let Some(c) = commands {
        facts.insert("commands".into(), c["commands"].clone());
    }
    if let Some(m) = models {
        facts.insert("models".into(), m["models"].clone());
    }
    (facts, state["sessionId"].as_str().map(str::to_string))
}

/// The run and text of a streamed delta; `None` for any other line, and for a delta that carries more
/// than its kind, block and text (merging would lose the rest; it is recorded as it came).
fn delta(event: &Value) -> Option<Delta> {
    let line = event.as_object()?;
    if event["type"] != "message_update" {
        return None;
    }
    if let Some(piece) = line.get("assistantMessageEvent") {
        let piece = piece.as_object()?;
        let kind = piece.get("type")?.as_str()?;
        let only_known = line
            .keys()
            .all(|k| matches!(k.as_str(), "type" | "assistantMessageEvent"))
            && piece
                .keys()
                .all(|k| matches!(k.as_str(), "type" | "contentIndex" | "delta"));
        if !DELTA_KINDS.contains(&kind) || !only_known {
            return None;
        }
        return Some(Delta {
            run: run(
                Some(kind.to_string()),
                piece.get("contentIndex").cloned().unwrap_or(Value::Null),
            ),
            text: piece.get("delta")?.as_str()?.to_string(),
        });
    }
    if !line.keys().all(|k| matches!(k.as_str(), "type" | "delta")) {
        return None;
    }
    Some(Delta {
        run: run(None, Value::Null),
        text: line.get("delta")?.as_str()?.to_string(),
    })
}

/// Pi's usage of one assistant message: `usage {input, output, cacheRead, cacheWrite, cost {total}}`
/// beside the message's `model`. Pi prices calls from its model table, in US dollars.
fn usage(message: &Value) -> UsageReport {
    let u = &message["usage"];
    UsageReport {
        model: message["model"].as_str().map(str::to_string),
        input: u["input"].clone(),
        output: u["output"].clone(),
        cache_read: u["cacheRead"].clone(),
        cache_write: u["cacheWrite"].clone(),
        cost: u["cost"]["total"].clone(),
        currency: u["cost"]["total"].is_number().then(|| "USD".to_string()),
        cumulative: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn signals(line: Value) -> Vec<Signal> {
        decode(line).signals
    }

    #[test]
    fn output_lines_that_move_a_session() {
        assert_eq!(signals(json!({"type": "agent_start"})), [Signal::TurnStarted]);
        for end in ["agent_end", "agent_settled"] {
            assert_eq!(
                signals(json!({"type": end})),
                [Signal::QuestionsCleared, Signal::TurnSettled { stop_reason: None }]
            );
        }
        assert!(signals(json!({"type": "message_end"})).is_empty());
        // Notices are never questions.
        for method in FIRE_AND_FORGET_UI {
            let s = signals(json!({"type": "extension_ui_request", "id": "n", "method": method}));
            assert!(!s.iter().any(|s| matches!(s, Signal::Question { .. })), "{method}");
        }
        for method in ["select", "confirm", "input", "editor", "something_new"] {
            let s = signals(json!({"type": "extension_ui_request", "id": "q", "method": method}));
            assert!(matches!(s[..], [Signal::Question { .. }]), "{method}");
        }
    }

    #[test]
    fn responses_to_berth_are_replies_and_busy_prompts_wait() {
        let d = decode(json!({"type": "response", "id": "berth-1", "success": true, "data": {"a": 1}}));
        assert_eq!(d.reply, Some(("berth-1".into(), Reply::Ok(json!({"a": 1})))));
        assert!(d.record.is_none());
        let mut w = Wire::default();
        let busy = json!({"type": "response", "id": "berth-2", "success": false,
            "error": "Agent is already processing. Specify streamingBehavior"});
        w.encode(&Command::Prompt("hi".into()), "berth-2".into()).unwrap();
        assert_eq!(w.decode(busy.clone()).reply.unwrap().1, Reply::Busy);
        w.encode(&Command::Steer("hi".into()), "berth-2".into()).unwrap();
        assert!(
            matches!(w.decode(busy).reply.unwrap().1, Reply::Refused { .. }),
            "only a prompt waits"
        );
        // Someone else's response is the agent's output.
        assert!(decode(json!({"type": "response", "id": "other"})).record.is_some());
    }

    #[test]
    fn only_plain_deltas_merge() {
        for line in [
            json!({"type": "message_update", "assistantMessageEvent": {"type": "text_start", "contentIndex": 0}}),
            json!({"type": "message_update", "assistantMessageEvent": {"type": "text_end", "contentIndex": 0, "content": "Hi"}}),
            json!({"type": "message_update", "assistantMessageEvent": {"type": "text_delta", "contentIndex": 0, "delta": "x", "extra": 1}}),
            json!({"type": "message_update", "delta": "x", "id": "keep-me"}),
            json!({"type": "message_update", "delta": 5}),
            json!({"type": "message_end", "delta": "x"}),
            json!("message_update"),
        ] {
            assert!(delta(&line).is_none(), "{line}");
        }
        let d = delta(&json!({"type": "message_update", "assistantMessageEvent": {"type": "toolcall_delta", "contentIndex": 2, "delta": "{"}})).unwrap();
        assert_eq!(
            render(&d.run, "{}", 2),
            json!({"type": "message_update", "assistantMessageEvent": {"type": "toolcall_delta", "contentIndex": 2, "delta": "{}"}, "coalesced": 2})
        );
        assert!(
            delta(&json!({"type": "message_update", "assistantMessageEvent": {"type": "text_delta", "delta": "x"}}))
                .is_some()
        );
    }

    #[test]
    fn answers_fit_their_question() {
        let q = |m: &str| json!({"method": m});
        assert!(fits(&q("confirm"), &Answer::Confirmed(true)).is_ok());
        assert!(fits(&q("confirm"), &Answer::Value("x".into())).is_err());
        assert!(fits(&q("select"), &Answer::Value("x".into())).is_ok());
        assert!(fits(&q("select"), &Answer::Option("x".into())).is_err());
        assert!(fits(&q("anything"), &Answer::Cancelled).is_ok());
    }
}
