//! Gemini, `POST /v1beta/models/<model>:streamGenerateContent?alt=sse`, `:generateContent` and `:countTokens`
//! (Gemini CLI, `GOOGLE_GEMINI_BASE_URL`). Request: `systemInstruction` (apart), `contents: [{role: user |
//! model, parts: [{text} | {functionCall} | {functionResponse: {name, id?, response}}]}]`, `tools:
//! [{functionDeclarations: [{name, parametersJsonSchema | parameters}]}]`, `generationConfig` (a
//! `responseMimeType` of JSON with a schema for the CLI's side calls). Streamed reply: `data:` chunks
//! `{candidates: [{content: {role: model, parts}, finishReason?}], usageMetadata}`; not streamed, one of them.
use serde_json::{Value, json};

use super::{Answer, Ctx, Dialect, Entry, Frames, ModelRequest, Tool, ToolKind, split, sse};

/// `(model, action)` of a Gemini path (`/v1beta/models/<model>:<action>`).
pub(super) fn action(path: &str) -> Option<(&str, &str)> {
    let rest = ["/v1beta/models/", "/v1/models/", "/v1alpha/models/"]
        .iter()
        .find_map(|prefix| path.strip_prefix(prefix))?;
    rest.rsplit_once(':')
}

pub(super) fn entries(body: &Value) -> Vec<Entry> {
    let mut out = Vec::new();
    for content in body["contents"].as_array().into_iter().flatten() {
        let role = match content["role"].as_str() {
            Some("model") => "assistant",
            _ => "user",
        };
        let mut parts = Vec::new();
        let mut calls = false;
        for part in content["parts"].as_array().into_iter().flatten() {
            if let Some(text) = part["text"].as_str()
                && part["thought"] != true
            {
                parts.push(text.to_string());
            } else if let Some(result) = part.get("functionResponse") {
                calls = true;
                let response = &result["response"];
                let text = match response["output"].as_str() {
                    Some(output) => output.to_string(),
                    None => response.to_string(),
                };
                out.push(Entry::new("tool", vec![text]));
            } else if part.get("functionCall").is_some() {
                calls = true;
            }
        }
        if !parts.is_empty() || !calls {
            out.push(Entry::new(role, parts));
        }
    }
    out
}

pub(super) fn tools(body: &Value) -> Vec<Tool> {
    let declarations = body["tools"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|t| t["functionDeclarations"].as_array().into_iter().flatten());
    declarations
        .filter_map(|d| {
            let schema = match &d["parametersJsonSchema"] {
                Value::Null => d["parameters"].clone(),
                schema => schema.clone(),
            };
            Some(Tool {
                name: d["name"].as_str()?.to_string(),
                schema,
                kind: ToolKind::Function,
            })
        })
        .collect()
}

pub(super) fn tool_result(body: &Value) -> Option<String> {
    let last = body["contents"].as_array()?.last()?;
    let parts = last["parts"].as_array()?;
    let result = parts.iter().rev().find_map(|p| p.get("functionResponse"))?;
    Some(result["id"].as_str().unwrap_or_default().to_string())
}

/// The schema of the JSON a Gemini request wants as its answer (`responseMimeType: application/json`).
pub(super) fn json_schema(request: &ModelRequest) -> Option<Value> {
    if request.dialect != Dialect::Gemini {
        return None;
    }
    let config = match &request.body["generationConfig"] {
        Value::Null => &request.body["config"],
        config => config,
    };
    let schema = [&config["responseJsonSchema"], &config["responseSchema"]]
        .into_iter()
        .find(|s| !s.is_null());
    match schema {
        Some(schema) => Some(schema.clone()),
        None => (config["responseMimeType"] == "application/json").then(|| json!({})),
    }
}

/// A value of `schema`. Enums prefer "user" (the CLI's next-speaker check: the model is done) and "flash"
/// (its model router).
pub(super) fn example(schema: &Value) -> Value {
    if let Some(values) = schema["enum"].as_array()
        && let Some(first) = values.first()
    {
        let preferred = ["user", "flash"].iter().find_map(|p| values.iter().find(|v| *v == p));
        return preferred.unwrap_or(first).clone();
    }
    let kind = match &schema["type"] {
        Value::Array(kinds) => kinds.first().and_then(Value::as_str).unwrap_or_default(),
        kind => kind.as_str().unwrap_or_default(),
    }
    .to_lowercase();
    if kind == "object" || schema.get("properties").is_some() {
        let properties = schema["properties"].as_object().into_iter().flatten();
        return Value::Object(properties.map(|(k, v)| (k.clone(), example(v))).collect());
    }
    match kind.as_str() {
        "array" => json!([]),
        "integer" | "number" => json!(0),
        "boolean" => json!(false),
        _ => json!("scripted"),
    }
}

fn chunk(ctx: &Ctx, parts: Value, last: bool) -> Value {
    let mut candidate = json!({"content": {"role": "model", "parts": parts}, "index": 0});
    if last {
        candidate["finishReason"] = json!("STOP");
    }
    let u = ctx.usage;
    json!({
        "candidates": [candidate],
        "usageMetadata": {"promptTokenCount": u.input, "candidatesTokenCount": u.output,
                          "totalTokenCount": u.input + u.output},
        "modelVersion": ctx.model,
    })
}

/// The streamed chunks: a text's pieces (the last one finishing), or the one function call.
pub(super) fn chunks(answer: &Answer, ctx: &Ctx) -> Vec<Value> {
    match answer {
        Answer::Text(text) => {
            let pieces = split(text, ctx.chunks);
            let n = pieces.len();
            let chunks = pieces.into_iter().enumerate();
            chunks
                .map(|(i, piece)| chunk(ctx, json!([{ "text": piece }]), i + 1 == n))
                .collect()
        }
        Answer::Tool(call) => {
            let parts = json!([{"functionCall": {"name": call.name, "args": call.arguments}}]);
            vec![chunk(ctx, parts, true)]
        }
    }
}

pub(super) fn frames(answer: &Answer, ctx: &Ctx) -> Frames {
    Frames {
        pieces: chunks(answer, ctx).iter().map(|c| vec![sse(None, c)]).collect(),
        ..Frames::default()
    }
}

pub(super) fn whole(answer: &Answer, ctx: &Ctx) -> Value {
    match answer {
        Answer::Text(text) => chunk(ctx, json!([{ "text": text }]), true),
        Answer::Tool(_) => chunks(answer, ctx).swap_remove(0),
    }
}
