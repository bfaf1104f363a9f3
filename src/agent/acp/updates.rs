//! `session/update` notifications: text and thought chunks of the turn, tool calls, and what the agent
//! tells about itself (plan, commands, mode, options, title, usage).
use serde_json::{Value, json};

use super::{TOOL_CALLS_SHOWN, TURN_TEXT_CAP, Wire, learned};
use crate::agent::types::{Delta, Inbound, Protocol, Run, Signal, UsageReport};

impl Wire {
    /// A `session/update` notification.
    pub(super) fn update(&mut self, line: Value) -> Inbound {
        let update = &line["params"]["update"];
        let kind = update["sessionUpdate"].as_str().unwrap_or_default().to_string();
        let mut inbound = Inbound::default();
        match kind.as_str() {
            "agent_message_chunk" | "agent_thought_chunk" => {
                // Outside a turn it is history that `session/load` replays: recorded when it was said.
                let Some(turn) = self.turn.as_mut() else {
                    return inbound;
                };
                let text = update["content"]["text"].as_str().unwrap_or_default();
                let kept = if kind == "agent_message_chunk" {
                    &mut turn.text
                } else {
                    &mut turn.thought
                };
                if kept.len() + text.len() <= TURN_TEXT_CAP {
                    kept.push_str(text);
                }
                if let Some(delta) = chunk(&line, &kind) {
                    inbound.delta = Some(delta);
                    return inbound;
                }
            }
            "user_message_chunk" => return inbound,
            "tool_call" | "tool_call_update" => {
                if self.turn.is_none() {
                    return inbound;
                }
                let status = update["status"].as_str().unwrap_or_default();
                if kind == "tool_call" && !matches!(status, "completed" | "failed") {
                    let title = update["title"].as_str().or(update["kind"].as_str()).unwrap_or("tool");
                    inbound.signals.push(Signal::ToolStarted(title.to_string()));
                } else if matches!(status, "completed" | "failed") {
                    inbound.signals.push(Signal::ToolEnded);
                }
                if self.shown_tool(update) {
                    inbound
                        .signals
                        .push(learned("tool_calls", &Value::Array(self.tool_calls.clone())));
                }
            }
            "plan" => inbound.signals.push(learned("plan", &update["entries"])),
            "available_commands_update" => inbound.signals.push(learned("commands", &update["availableCommands"])),
            "current_mode_update" => inbound.signals.push(learned("mode", &update["currentModeId"])),
            "config_option_update" => inbound
                .signals
                .push(learned("config_options", &update["configOptions"])),
            "session_info_update" if update["title"].is_string() => {
                inbound.signals.push(learned("session_name", &update["title"]));
            }
            "usage_update" => {
                if let Some(model) = update["_meta"]["_claude/model"].as_str() {
                    self.usage_model = Some(model.to_string());
                }
                // The cost is the conversation's running total; berth records its steps.
                if update["cost"].is_object() {
                    inbound.signals.push(Signal::Usage(UsageReport {
                        model: self.usage_model.clone(),
                        cost: update["cost"]["amount"].clone(),
                        currency: update["cost"]["currency"].as_str().map(str::to_string),
                        cumulative: true,
                        ..Default::default()
                    }));
                }
                inbound.signals.push(learned(
                    "usage",
                    &json!({"used": update["used"], "size": update["size"], "cost": update["cost"]}),
                ))
            }
            _ => {}
        }
        inbound.record = Some(line);
        inbound
    }

    /// A tool call or its update merged into the turn's list (by `toolCallId`); whether the list changed.
    fn shown_tool(&mut self, update: &Value) -> bool {
        let Some(id) = update["toolCallId"].as_str() else {
            return false;
        };
        let at = match self.tool_calls.iter().position(|t| t["id"] == id) {
            Some(at) => at,
            None => {
                if self.tool_calls.len() == TOOL_CALLS_SHOWN {
                    self.tool_calls.remove(0);
                }
                self.tool_calls
                    .push(json!({"id": id, "title": null, "kind": null, "status": "pending", "paths": []}));
                self.tool_calls.len() - 1
            }
        };
        let before = self.tool_calls[at].clone();
        let shown = &mut self.tool_calls[at];
        for key in ["title", "kind", "status"] {
            if update[key].is_string() {
                shown[key] = update[key].clone();
            }
        }
        if let Some(locations) = update["locations"].as_array() {
            shown["paths"] = locations
                .iter()
                .map(|l| l["path"].clone())
                .filter(Value::is_string)
                .collect();
        }
        *shown != before
    }
}

/// A text chunk that carries nothing beyond its kind, text and message id merges with its run; anything
/// richer is recorded as it came.
fn chunk(line: &Value, kind: &str) -> Option<Delta> {
    let params = line["params"].as_object()?;
    let update = params.get("update")?.as_object()?;
    let content = update.get("content")?.as_object()?;
    let only_known = line
        .as_object()?
        .keys()
        .all(|k| matches!(k.as_str(), "method" | "params"))
        && params.keys().all(|k| matches!(k.as_str(), "sessionId" | "update"))
        && update
            .keys()
            .all(|k| matches!(k.as_str(), "sessionUpdate" | "content" | "messageId"))
        && content.keys().all(|k| matches!(k.as_str(), "type" | "text"))
        && content.get("type")? == "text";
    if !only_known {
        return None;
    }
    Some(Delta {
        run: Run {
            protocol: Protocol::Acp,
            kind: Some(kind.to_string()),
            block: update.get("messageId").cloned().unwrap_or(Value::Null),
            conversation: params.get("sessionId").cloned().unwrap_or(Value::Null),
        },
        text: content.get("text")?.as_str()?.to_string(),
    })
}
