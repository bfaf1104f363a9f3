//! Anthropic Messages, `POST /v1/messages` (Claude Code through claude-agent-acp; `?beta=true` in the query),
//! and `POST /v1/messages/count_tokens`. Request: `system` (apart), `messages` whose `content` is a string or
//! blocks (`text`, `tool_use`, `tool_result` with `tool_use_id` and `content`, `thinking`, …), `tools: [{name,
//! input_schema}]`. Streamed reply: named events `message_start` (usage with the input tokens),
//! `content_block_start`, `content_block_delta` (`text_delta` or `input_json_delta`), `content_block_stop`,
//! `message_delta` (stop reason, usage with the output tokens) and `message_stop`.
use serde_json::{Value, json};

use super::{Answer, Ctx, Entry, Frames, Tool, ToolKind, parts_of, split, sse};

pub(super) fn entries(body: &Value) -> Vec<Entry> {
    let mut out = Vec::new();
    for m in body["messages"].as_array().into_iter().flatten() {
        let role = m["role"].as_str().unwrap_or_default();
        let Some(blocks) = m["content"].as_array() else {
            out.push(Entry::new(role, parts_of(&m["content"])));
            continue;
        };
        let mut parts = Vec::new();
        let mut calls = false;
        for block in blocks {
            match block["type"].as_str().unwrap_or_default() {
                "text" => parts.push(block["text"].as_str().unwrap_or_default().to_string()),
                "tool_result" => {
                    calls = true;
                    out.push(Entry::new("tool", parts_of(&block["content"])));
                }
                "tool_use" => calls = true,
                _ => {}
            }
        }
        if !parts.is_empty() || !calls {
            out.push(Entry::new(role, parts));
        }
    }
    out
}

pub(super) fn tools(body: &Value) -> Vec<Tool> {
    body["tools"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|t| {
            Some(Tool {
                name: t["name"].as_str()?.to_string(),
                schema: t["input_schema"].clone(),
                kind: ToolKind::Function,
            })
        })
        .collect()
}

pub(super) fn tool_result(body: &Value) -> Option<String> {
    let last = body["messages"].as_array()?.last()?;
    let blocks = last["content"].as_array()?;
    let result = blocks.iter().rev().find(|b| b["type"] == "tool_result")?;
    (last["role"] == "user").then(|| result["tool_use_id"].as_str().unwrap_or_default().to_string())
}

fn event(data: Value) -> String {
    let name = data["type"].as_str().unwrap_or_default().to_string();
    sse(Some(&name), &data)
}

pub(super) fn frames(answer: &Answer, ctx: &Ctx) -> Frames {
    let start = event(json!({"type": "message_start", "message": {
        "id": format!("msg_{}", ctx.id), "type": "message", "role": "assistant", "model": ctx.model,
        "content": [], "stop_reason": null, "stop_sequence": null,
        "usage": {"input_tokens": ctx.usage.input, "output_tokens": 0,
                  "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0},
    }}));
    let delta = |delta: Value| event(json!({"type": "content_block_delta", "index": 0, "delta": delta}));
    let (head, pieces, stop) = match answer {
        Answer::Text(text) => {
            let block = event(json!({"type": "content_block_start", "index": 0,
                                     "content_block": {"type": "text", "text": ""}}));
            let pieces = split(text, ctx.chunks)
                .into_iter()
                .map(|piece| vec![delta(json!({"type": "text_delta", "text": piece}))]);
            (vec![start, block], pieces.collect(), "end_turn")
        }
        Answer::Tool(call) => {
            let block = event(json!({"type": "content_block_start", "index": 0,
                                     "content_block": {"type": "tool_use", "id": call.id, "name": call.name, "input": {}}}));
            let mut piece = vec![block];
            for part in split(&call.arguments.to_string(), 2) {
                piece.push(delta(json!({"type": "input_json_delta", "partial_json": part})));
            }
            (vec![start], vec![piece], "tool_use")
        }
    };
    let tail = vec![
        event(json!({"type": "content_block_stop", "index": 0})),
        event(
            json!({"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": null},
                     "usage": {"output_tokens": ctx.usage.output}}),
        ),
        event(json!({"type": "message_stop"})),
    ];
    Frames { head, pieces, tail }
}

pub(super) fn whole(answer: &Answer, ctx: &Ctx) -> Value {
    let (block, stop) = match answer {
        Answer::Text(text) => (json!({"type": "text", "text": text}), "end_turn"),
        Answer::Tool(call) => (
            json!({"type": "tool_use", "id": call.id, "name": call.name, "input": call.arguments}),
            "tool_use",
        ),
    };
    json!({
        "id": format!("msg_{}", ctx.id), "type": "message", "role": "assistant", "model": ctx.model,
        "content": [block], "stop_reason": stop, "stop_sequence": null,
        "usage": {"input_tokens": ctx.usage.input, "output_tokens": ctx.usage.output},
    })
}
