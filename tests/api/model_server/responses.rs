//! OpenAI Responses, `POST /v1/responses` (Codex, `wire_api = "responses"`). Request: `input` (a string, or
//! items: `message` with `input_text`/`output_text` parts, `function_call`, `function_call_output`,
//! `custom_tool_call_output`, `reasoning`, …), `instructions` (the system prompt), `tools` (`function` with
//! `parameters`, `custom`, `local_shell`). Streamed reply: named events `response.created`,
//! `response.output_item.added`, `response.output_text.delta`…, `response.output_item.done` and
//! `response.completed` whose `response.usage` holds the token counts.
use serde_json::{Value, json};

use super::{Answer, Ctx, Entry, Frames, Tool, ToolCall, ToolKind, parts_of, split, sse};

pub(super) fn entries(body: &Value) -> Vec<Entry> {
    if let Some(text) = body["input"].as_str() {
        return vec![Entry::new("user", vec![text.to_string()])];
    }
    let mut out = Vec::new();
    for item in body["input"].as_array().into_iter().flatten() {
        let kind = item["type"].as_str().unwrap_or("message");
        match kind {
            "message" => match item["role"].as_str().unwrap_or_default() {
                "system" | "developer" => {}
                role => out.push(Entry::new(role, parts_of(&item["content"]))),
            },
            _ if kind.ends_with("_call_output") => {
                let output = &item["output"];
                let parts = match output {
                    Value::String(_) | Value::Array(_) => parts_of(output),
                    Value::Null => Vec::new(),
                    other => vec![other.to_string()],
                };
                out.push(Entry::new("tool", parts));
            }
            _ => {}
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
            let (name, kind) = match t["type"].as_str()? {
                "function" => (t["name"].as_str()?, ToolKind::Function),
                "custom" => (t["name"].as_str()?, ToolKind::Custom),
                "local_shell" => ("local_shell", ToolKind::LocalShell),
                _ => return None,
            };
            Some(Tool {
                name: name.to_string(),
                schema: t["parameters"].clone(),
                kind,
            })
        })
        .collect()
}

pub(super) fn tool_result(body: &Value) -> Option<String> {
    let last = body["input"].as_array()?.last()?;
    last["type"]
        .as_str()?
        .ends_with("_call_output")
        .then(|| last["call_id"].as_str().unwrap_or_default().to_string())
}

fn response(ctx: &Ctx, status: &str, output: Vec<Value>) -> Value {
    let mut response = json!({
        "id": format!("resp_{}", ctx.id), "object": "response", "created_at": 0, "status": status,
        "model": ctx.model, "output": output,
    });
    if status == "completed" {
        let u = ctx.usage;
        response["usage"] = json!({
            "input_tokens": u.input, "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": u.output, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": u.input + u.output,
        });
    }
    response
}

fn message(ctx: &Ctx, status: &str, text: Option<&str>) -> Value {
    let content = match text {
        Some(text) => json!([{"type": "output_text", "text": text, "annotations": []}]),
        None => json!([]),
    };
    json!({"type": "message", "id": format!("msg_{}", ctx.id), "role": "assistant", "status": status, "content": content})
}

fn call_item(call: &ToolCall) -> Value {
    match call.kind {
        ToolKind::Function => json!({
            "type": "function_call", "id": format!("fc_{}", call.id), "status": "completed",
            "call_id": call.id, "name": call.name, "arguments": call.arguments.to_string(),
        }),
        ToolKind::Custom => json!({
            "type": "custom_tool_call", "id": format!("ctc_{}", call.id), "status": "completed",
            "call_id": call.id, "name": call.name, "input": call.arguments.as_str().unwrap_or_default(),
        }),
        ToolKind::LocalShell => json!({
            "type": "local_shell_call", "id": format!("lsc_{}", call.id), "status": "completed",
            "call_id": call.id, "action": {"type": "exec", "command": call.arguments["command"]},
        }),
    }
}

fn event(data: Value) -> String {
    let name = data["type"].as_str().unwrap_or_default().to_string();
    sse(Some(&name), &data)
}

fn item_event(kind: &str, item: &Value) -> String {
    event(json!({"type": kind, "output_index": 0, "item": item}))
}

pub(super) fn frames(answer: &Answer, ctx: &Ctx) -> Frames {
    let created = event(json!({"type": "response.created", "response": response(ctx, "in_progress", vec![])}));
    let (head, pieces, item) = match answer {
        Answer::Text(text) => {
            let added = item_event("response.output_item.added", &message(ctx, "in_progress", None));
            let pieces = split(text, ctx.chunks).into_iter().map(|delta| {
                vec![event(json!({
                    "type": "response.output_text.delta", "item_id": format!("msg_{}", ctx.id),
                    "output_index": 0, "content_index": 0, "delta": delta,
                }))]
            });
            (
                vec![created, added],
                pieces.collect(),
                message(ctx, "completed", Some(text)),
            )
        }
        Answer::Tool(call) => {
            let item = call_item(call);
            let piece = vec![
                item_event("response.output_item.added", &item),
                item_event("response.output_item.done", &item),
            ];
            (vec![created], vec![piece], item)
        }
    };
    let mut tail = Vec::new();
    if let Answer::Text(_) = answer {
        tail.push(item_event("response.output_item.done", &item));
    }
    tail.push(event(
        json!({"type": "response.completed", "response": response(ctx, "completed", vec![item])}),
    ));
    Frames { head, pieces, tail }
}

pub(super) fn whole(answer: &Answer, ctx: &Ctx) -> Value {
    let item = match answer {
        Answer::Text(text) => message(ctx, "completed", Some(text)),
        Answer::Tool(call) => call_item(call),
    };
    response(ctx, "completed", vec![item])
}
