//! Agent output lines: reading past an oversized one, what a parsed line may cost, and the copies of
//! the message that Pi repeats in every streamed delta, skipped while parsing.
use serde::de::{Deserialize, Deserializer, IgnoredAny, MapAccess, Visitor};
use serde_json::Value;
use tokio::io::AsyncBufReadExt;

/// The longest stdout line kept; longer lines are dropped (an agent must not grow berth's memory).
pub const MAX_LINE: usize = 8 * 1024 * 1024;
/// The bytes of agent output parsed or waiting to be recorded, all agents together. A reader takes a
/// line's share before parsing it (an upper bound of its parsed size, `parsed_bound`), keeps what the
/// line holds once stripped, and the domain gives it back when the line is recorded; past this, agents'
/// output waits in their pipes. A line whose parsed form could exceed the whole budget is dropped.
pub const REPORT_BYTES: usize = 64 * 1024 * 1024;

/// What one parsed JSON value may cost beyond its strings (the `Value`, its slot in a growing `Vec` or a
/// `BTreeMap` node, allocator overhead), for `parsed_bound` and `held_bytes`.
const VALUE_COST: usize = 160;

/// Reads up to and including the next newline (or the end), keeping nothing: an endless line costs no
/// memory.
pub async fn skip_line<R: tokio::io::AsyncBufRead + Unpin>(reader: &mut R) -> std::io::Result<()> {
    loop {
        let buf = reader.fill_buf().await?;
        if buf.is_empty() {
            return Ok(());
        }
        match buf.iter().position(|b| *b == b'\n') {
            Some(i) => {
                reader.consume(i + 1);
                return Ok(());
            }
            None => {
                let n = buf.len();
                reader.consume(n);
            }
        }
    }
}

/// An upper bound of the memory a JSON line takes once parsed: its bytes (strings and keys) plus
/// `VALUE_COST` for every value, and every value but the first follows a `[`, `,` or `:` outside a string.
pub fn parsed_bound(line: &[u8]) -> usize {
    let (mut values, mut in_string, mut escaped) = (1usize, false, false);
    for &b in line {
        if in_string {
            if escaped {
                escaped = false;
            } else if b == b'\\' {
                escaped = true;
            } else if b == b'"' {
                in_string = false;
            }
        } else {
            match b {
                b'"' => in_string = true,
                b'[' | b',' | b':' => values += 1,
                _ => {}
            }
        }
    }
    line.len() + values * VALUE_COST
}

/// The memory a parsed value holds, counted as `parsed_bound` counts it.
pub fn held_bytes(v: &Value) -> usize {
    VALUE_COST
        + match v {
            Value::String(s) => s.len(),
            Value::Array(a) => a.iter().map(held_bytes).sum(),
            Value::Object(o) => o.iter().map(|(k, v)| k.len() + held_bytes(v)).sum(),
            _ => 0,
        }
}

/// Pi repeats the whole message so far in every `message_update` (`message`, and `partial` in its
/// `assistantMessageEvent`): O(n^2) bytes for an n-token answer. Only the delta is kept; the complete
/// message comes once, at `message_end`.
pub fn strip_partial(event: &mut Value) {
    if event["type"] != "message_update" {
        return;
    }
    if let Some(o) = event.as_object_mut() {
        o.remove("message");
    }
    if let Some(o) = event["assistantMessageEvent"].as_object_mut() {
        o.remove("partial");
    }
}

/// Parses a line, skipping Pi's copies of the message in a `message_update` (`message`, and `partial`
/// in its `assistantMessageEvent`) without building them when `type` comes first, as Pi writes it;
/// `strip_partial` removes them otherwise. `None` for a line that is not JSON.
pub fn parse(line: &[u8]) -> Option<Value> {
    let mut event = match serde_json::from_slice::<Line>(line) {
        Ok(Line(v)) => v,
        Err(_) => serde_json::from_slice::<Value>(line).ok()?,
    };
    strip_partial(&mut event);
    Some(event)
}

/// A JSON object line, read as a `Value` without the parts `strip_partial` drops.
struct Line(Value);

impl<'de> Deserialize<'de> for Line {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_map(Skipping {
            keys: &["message"],
            nested: true,
        })
        .map(Line)
    }
}

/// Reads a map, skipping `keys` once `type` said `message_update`; with `nested`, the
/// `assistantMessageEvent` skips its `partial`.
struct Skipping {
    keys: &'static [&'static str],
    nested: bool,
}

impl<'de> serde::de::DeserializeSeed<'de> for Skipping {
    type Value = Value;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        // Not an object (an `assistantMessageEvent` that is a string, say): read it as it is.
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Skipping {
    type Value = Value;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = serde_json::Map::new();
        let mut update = !self.nested;
        while let Some(key) = map.next_key::<String>()? {
            if update && self.keys.contains(&key.as_str()) {
                map.next_value::<IgnoredAny>()?;
                continue;
            }
            let value = if update && self.nested && key == "assistantMessageEvent" {
                map.next_value_seed(Skipping {
                    keys: &["partial"],
                    nested: false,
                })?
            } else {
                map.next_value::<Value>()?
            };
            if self.nested && key == "type" && value == "message_update" {
                update = true;
            }
            out.insert(key, value);
        }
        Ok(Value::Object(out))
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(v.into())
    }
    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(v.into())
    }
    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(v.into())
    }
    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(v.into())
    }
    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(v.into())
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut out = Vec::new();
        while let Some(v) = seq.next_element::<Value>()? {
            out.push(v);
        }
        Ok(Value::Array(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use tokio::io::{AsyncBufReadExt, BufReader};

    #[test]
    fn the_parse_bound_covers_what_parsing_holds() {
        for line in [
            json!({"type": "message_update", "delta": "x".repeat(1000)}).to_string(),
            serde_json::Value::from(vec![0; 1000]).to_string(),
            json!({"a": [[], {}, "b\"[,:", null, true, 1.5], "c": {"d": {"e": "f"}}}).to_string(),
            "[]".to_string(),
            "\"[,:\\\\\"".to_string(),
        ] {
            let v: serde_json::Value = serde_json::from_str(&line).unwrap();
            assert!(held_bytes(&v) <= parsed_bound(line.as_bytes()), "{line}");
        }
        // A dense line counts each value: `[0,0,...]` of 8 MiB could not be parsed within the budget.
        assert!(parsed_bound(&[b"[0".as_slice(), &b",0".repeat(MAX_LINE / 2 - 2), b"]"].concat()) > REPORT_BYTES);
        assert!(parsed_bound(format!("\"{}\"", "x".repeat(MAX_LINE - 2)).as_bytes()) < REPORT_BYTES);
    }

    #[test]
    fn partial_copies_are_stripped_from_message_updates_only() {
        let mut update = json!({"type": "message_update", "message": {"content": "so far"},
            "assistantMessageEvent": {"type": "text_delta", "contentIndex": 0, "delta": "far", "partial": {"content": "so far"}}});
        strip_partial(&mut update);
        assert_eq!(
            update,
            json!({"type": "message_update", "assistantMessageEvent": {"type": "text_delta", "contentIndex": 0, "delta": "far"}})
        );
        let mut end = json!({"type": "message_end", "message": {"content": "so far"}});
        strip_partial(&mut end);
        assert_eq!(end["message"]["content"], "so far");
    }

    #[test]
    fn parsing_skips_what_stripping_drops_and_keeps_the_rest() {
        for line in [
            r#"{"type":"message_update","message":{"content":[1,2]},"assistantMessageEvent":{"type":"text_delta","contentIndex":0,"delta":"a","partial":{"x":[1]}}}"#,
            r#"{"message":{"content":"first"},"type":"message_update","assistantMessageEvent":{"partial":1,"type":"text_delta","delta":"b"}}"#,
            r#"{"type":"message_update","assistantMessageEvent":"odd","delta":"c"}"#,
            r#"{"type":"message_end","message":{"role":"assistant","content":[{"type":"text","text":"hi"}]},"n":-1.5,"ok":true,"none":null}"#,
            r#"[1,"two",{"three":3}]"#,
            r#""just a string""#,
        ] {
            let mut expected: Value = serde_json::from_str(line).unwrap();
            strip_partial(&mut expected);
            assert_eq!(parse(line.as_bytes()), Some(expected), "{line}");
        }
        assert_eq!(parse(b"{not json"), None);
    }

    #[tokio::test]
    async fn an_oversized_line_is_skipped_to_its_newline() {
        let input = [vec![b'x'; 300_000], b"\n{\"next\":1}\n".to_vec()].concat();
        let mut reader = BufReader::with_capacity(4096, input.as_slice());
        skip_line(&mut reader).await.unwrap();
        let mut rest = String::new();
        reader.read_line(&mut rest).await.unwrap();
        assert_eq!(rest, "{\"next\":1}\n");
        // An endless line ends with the output.
        let mut endless = BufReader::new(&[b'y'; 10_000][..]);
        skip_line(&mut endless).await.unwrap();
        assert!(endless.fill_buf().await.unwrap().is_empty());
    }
}
