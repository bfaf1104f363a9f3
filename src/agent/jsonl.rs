//! berth's minimal JSON-lines protocol (README, "Bring your own agent"): an agent reads one JSON object
//! per line on stdin and writes one per line on stdout. berth sends `{"type": "prompt" | "steer",
//! "message": ..}`, `{"type": "abort"}` and `{"type": "extension_ui_response", "id", ...}`, and expects no
//! answer to any of them. It reads Pi's event names, the subset any agent can print: `agent_start` and
//! `agent_end` around a turn, `message_end` with an assistant `message`, `message_update` with a `delta`,
//! `tool_execution_start`/`_end`, `extension_ui_request` for a question, `queue_update`. Anything else is
//! recorded as it came. An agent that prints neither `agent_start` nor `agent_end` never leaves `idle`:
//! its output is still recorded.
use serde_json::{Value, json};

use super::types::{Command, Inbound, Outgoing, Unsupported};

#[derive(Debug, Default)]
pub struct Wire;

impl Wire {
    pub fn encode(&mut self, command: &Command) -> Result<Outgoing, Unsupported> {
        let line = match command {
            Command::Prompt(text) => json!({"type": "prompt", "message": text}),
            Command::Steer(text) => json!({"type": "steer", "message": text}),
            Command::Abort => json!({"type": "abort"}),
            Command::Answer { request_id, answer } => super::pi::answer_line(request_id, answer),
            _ => return Err(Unsupported::Command),
        };
        // A `/command` runs outside any turn (as Pi does): it does not make the agent look busy.
        let working = matches!(command, Command::Prompt(t) if !t.starts_with('/')).then_some(true);
        Ok(Outgoing {
            lines: vec![line],
            awaits: None,
            working,
            signals: Vec::new(),
        })
    }

    pub fn decode(&mut self, line: Value) -> Inbound {
        super::pi::decode(line)
    }
}
