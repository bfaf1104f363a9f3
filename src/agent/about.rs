//! What an agent says about itself when asked (`berth agents check`): the question each protocol has
//! for it, and the answer as `(label, value)` pairs to print.
use serde_json::Value;

use super::{Command, Protocol};

/// What an agent said about itself: `(label, value)` pairs to print.
pub type Facts = Vec<(&'static str, String)>;

/// The command that asks the agent who it is; `None` when the protocol has no handshake.
pub fn question(protocol: Protocol) -> Option<Command> {
    match protocol {
        Protocol::Acp => Some(Command::Initialize),
        Protocol::Pi => Some(Command::AskState),
        Protocol::JsonLines => None,
    }
}

/// What is known of an agent whose protocol has no handshake, once its command started.
pub fn started(protocol: Protocol) -> Facts {
    vec![(
        "protocol",
        format!("{} (no handshake: the command started)", name(protocol)),
    )]
}

fn name(protocol: Protocol) -> &'static str {
    match protocol {
        Protocol::Acp => "acp",
        Protocol::Pi => "pi",
        Protocol::JsonLines => "jsonl",
    }
}

/// What to print of the agent's answer to [`question`].
pub fn facts(protocol: Protocol, result: &Value) -> Facts {
    let text = |v: &Value| v.as_str().map(str::to_string).unwrap_or_else(|| v.to_string());
    match protocol {
        Protocol::Acp => {
            let info = &result["agentInfo"];
            let methods: Vec<String> = result["authMethods"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|m| match m["name"].as_str() {
                    Some(name) if name != m["id"] => format!("{} ({name})", text(&m["id"])),
                    _ => text(&m["id"]),
                })
                .collect();
            vec![
                ("protocol", format!("acp, version {}", text(&result["protocolVersion"]))),
                ("name", text(&info["name"])),
                ("version", text(&info["version"])),
                ("capabilities", result["agentCapabilities"].to_string()),
                (
                    "auth methods",
                    if methods.is_empty() {
                        "none".into()
                    } else {
                        methods.join(", ")
                    },
                ),
            ]
        }
        _ => {
            let data = if result["data"].is_null() {
                result
            } else {
                &result["data"]
            };
            let model = &data["model"];
            vec![
                ("protocol", "pi".into()),
                (
                    "model",
                    match (model["provider"].as_str(), model["id"].as_str()) {
                        (Some(p), Some(m)) => format!("{p}/{m}"),
                        _ => "none configured".into(),
                    },
                ),
                ("thinking level", text(&data["thinkingLevel"])),
            ]
        }
    }
}
