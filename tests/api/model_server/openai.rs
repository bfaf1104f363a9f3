//! OpenAI Chat Completions, `POST /v1/chat/completions` (Pi, opencode through `@ai-sdk/openai-compatible`).
//! Request: `messages` (`system`/`developer`, `user`, `assistant` with `tool_calls`, `tool` with
//! `tool_call_id`), `tools: [{type: function, function: {name, parameters}}]`. Streamed reply: `data:`
//! `chat.completion.chunk`s (the first delta carries the role), a last chunk with `finish_reason` and
//! `usage`, then `data: [DONE]`.
use serde_json::{Value, json};

use super::{Answer, Ctx, Entry, Frames, Tool, ToolKind, parts_of, split, sse, text_of};

pub(super) fn entries(body: &Value) -> Vec<Entry> {
    let mut out = Vec::new();
    for m in body["messages"].as_array().into_iter().flatten() {
        let role = m["role"].as_str().unwrap_or_default();
        let parts = parts_of(&m["content"]);
        match role {
            "system" | "developer" => {}
            "assistant" if text_of(&m["content"]).is_empty() && m["tool_calls"].is_array() => {}
            _ => out.push(Entry::new(role, parts)),
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
                name: t["function"]["name"].as_str()?.to_string(),
                schema: t["function"]["parameters"].clone(),
                kind: ToolKind::Function,
            })
        })
        .collect()
}

pub(super) fn tool_result(body: &Value) -> Option<String> {
    let last = body["messages"].as_array()?.last()?;
    (last["role"] == "tool").then(|| last["tool_call_id"].as_str().unwrap_or_default().to_string())
}

fn usage(ctx: &Ctx) -> Value {
    let u = ctx.usage;
    json!({"prompt_tokens": u.input, "completion_tokens": u.output, "total_tokens": u.input + u.output})
}

fn chunk(ctx: &Ctx, delta: Value, finish: Option<&str>) -> Value {
    json!({
        "id": format!("chatcmpl-{}", ctx.id), "object": "chat.completion.chunk", "created": 0, "model": ctx.model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    })
}

pub(super) fn frames(answer: &Answer, ctx: &Ctx) -> Frames {
    let (pieces, finish) = match answer {
        Answer::Text(text) => {
            let pieces = split(text, ctx.chunks).into_iter().enumerate().map(|(i, piece)| {
                let mut delta = json!({ "content": piece });
                if i == 0 {
                    delta["role"] = json!("assistant");
                }
                vec![sse(None, &chunk(ctx, delta, None))]
            });
            (pieces.collect(), "stop")
        }
        Answer::Tool(call) => {
            let start = json!({"role": "assistant", "content": null, "tool_calls": [{
                "index": 0, "id": call.id, "type": "function",
                "function": {"name": call.name, "arguments": ""},
            }]});
            let mut piece = vec![sse(None, &chunk(ctx, start, None))];
            for part in split(&call.arguments.to_string(), 2) {
                let delta = json!({"tool_calls": [{"index": 0, "function": {"arguments": part}}]});
                piece.push(sse(None, &chunk(ctx, delta, None)));
            }
            (vec![piece], "tool_calls")
        }
    };
    let mut last = chunk(ctx, json!({}), Some(finish));
    last["usage"] = usage(ctx);
    Frames {
        head: Vec::new(),
        pieces,
        tail: vec![sse(None, &last), "data: [DONE]\n\n".to_string()],
    }
}

pub(super) fn whole(answer: &Answer, ctx: &Ctx) -> Value {
    let (message, finish) = match answer {
        Answer::Text(text) => (json!({"role": "assistant", "content": text}), "stop"),
        Answer::Tool(call) => (
            json!({"role": "assistant", "content": null, "tool_calls": [{
                "id": call.id, "type": "function",
                "function": {"name": call.name, "arguments": call.arguments.to_string()},
            }]}),
            "tool_calls",
        ),
    };
    json!({
        "id": format!("chatcmpl-{}", ctx.id), "object": "chat.completion", "created": 0, "model": ctx.model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": usage(ctx),
    })
}
