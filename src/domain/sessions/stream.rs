//! Streamed deltas, coalesced (issue 15, item 7): an agent streams one `message_update` per token, and
//! each would be a write transaction and an event. Deltas are held per session and written as one
//! `runtime.output` event per session per `BERTH_STREAM_INTERVAL_MS`, in order, so an SSE subscriber
//! still sees the text grow about ten times a second and rebuilds it exactly.
//!
//! A delta is a `message_update` whose `assistantMessageEvent` is a `text_delta`, `thinking_delta` or
//! `toolcall_delta` (Pi), or the plain `{"type":"message_update","delta":".."}`. Consecutive deltas of one
//! run (same kind and `contentIndex`) merge into one event of the same shape, with `coalesced` counting
//! the lines it holds:
//!
//! `{"type":"message_update","assistantMessageEvent":{"type":"text_delta","contentIndex":0,"delta":"<joined>"},"coalesced":N}`
//! `{"type":"message_update","delta":"<joined>","coalesced":N}`
//!
//! A delta of another run, any other line of the session and its exit write what is held first (order
//! is kept: an event never holds two runs, so every event keeps the agent's own shape); so does a
//! buffer past `STREAM_CAP` bytes, and the interval: a buffer is due one interval after its first delta,
//! or one interval after the session's previous due time while the agent keeps streaming, so a steady
//! stream is written on a fixed cadence (ten times a second by default) and never more often.
use std::collections::HashMap;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use uuid::Uuid;

/// The most delta text held for one session before it is written early.
pub const STREAM_CAP: usize = 256 * 1024;

/// The kinds of Pi's `assistantMessageEvent` that carry a piece of a content block.
const DELTA_KINDS: [&str; 3] = ["text_delta", "thinking_delta", "toolcall_delta"];

/// One `runtime.output` event to write.
#[derive(Debug, Clone, PartialEq)]
pub struct Write {
    pub session_id: Uuid,
    pub execution_id: Uuid,
    pub event: Value,
}

/// What consecutive deltas add to.
#[derive(Debug, Clone, PartialEq)]
enum Run {
    /// Pi: the kind (`text_delta`, ...) and the content block (`contentIndex`, null when absent).
    Block { kind: String, content_index: Value },
    /// `{"type":"message_update","delta":..}`.
    Plain,
}

struct Held {
    execution_id: Uuid,
    due: Instant,
    run: Run,
    text: String,
    count: usize,
}

impl Held {
    fn into_write(self, session_id: Uuid) -> Write {
        let event = match self.run {
            Run::Block { kind, content_index } => {
                let mut piece = json!({"type": kind, "delta": self.text});
                if !content_index.is_null() {
                    piece["contentIndex"] = content_index;
                }
                json!({"type": "message_update", "assistantMessageEvent": piece, "coalesced": self.count})
            }
            Run::Plain => json!({"type": "message_update", "delta": self.text, "coalesced": self.count}),
        };
        Write {
            session_id,
            execution_id: self.execution_id,
            event,
        }
    }
}

/// The deltas held, per session.
pub struct Coalescer {
    interval: Duration,
    cap: usize,
    held: HashMap<Uuid, Held>,
    /// When each streaming session's last buffer was due, for the cadence (dropped an interval later).
    last_due: HashMap<Uuid, Instant>,
}

impl Coalescer {
    pub fn new(interval: Duration, cap: usize) -> Coalescer {
        Coalescer {
            interval,
            cap,
            held: HashMap::new(),
            last_due: HashMap::new(),
        }
    }

    /// Takes one output line of a session; returns what to write now, in order.
    pub fn offer(&mut self, session_id: Uuid, execution_id: Uuid, event: Value, now: Instant) -> Vec<Write> {
        let mut out = Vec::new();
        let Some((run, text)) = delta(&event) else {
            out.extend(self.flush(session_id));
            out.push(Write {
                session_id,
                execution_id,
                event,
            });
            return out;
        };
        if self
            .held
            .get(&session_id)
            .is_some_and(|h| h.execution_id != execution_id || h.run != run)
        {
            out.extend(self.flush(session_id));
        }
        let due = match self.last_due.get(&session_id) {
            Some(last) if now < *last + self.interval => *last + self.interval,
            _ => now + self.interval,
        };
        let held = self.held.entry(session_id).or_insert_with(|| Held {
            execution_id,
            due,
            run,
            text: String::new(),
            count: 0,
        });
        held.text.push_str(text);
        held.count += 1;
        if held.text.len() >= self.cap {
            out.extend(self.flush(session_id));
        }
        out
    }

    /// What the session holds, as one event (before its exit is recorded).
    pub fn flush(&mut self, session_id: Uuid) -> Option<Write> {
        self.held.remove(&session_id).map(|h| h.into_write(session_id))
    }

    /// When the oldest buffer is due.
    pub fn next_due(&self) -> Option<Instant> {
        self.held.values().map(|h| h.due).min()
    }

    /// The buffers held for an interval or longer, as events.
    pub fn due(&mut self, now: Instant) -> Vec<Write> {
        let interval = self.interval;
        let held = &self.held;
        self.last_due
            .retain(|id, last| held.contains_key(id) || now < *last + interval);
        let due: Vec<(Uuid, Instant)> = self
            .held
            .iter()
            .filter(|(_, h)| h.due <= now)
            .map(|(id, h)| (*id, h.due))
            .collect();
        due.into_iter()
            .filter_map(|(id, at)| {
                self.last_due.insert(id, at);
                self.flush(id)
            })
            .collect()
    }

    /// Everything held (the reports ended).
    pub fn drain(&mut self) -> Vec<Write> {
        let ids: Vec<Uuid> = self.held.keys().copied().collect();
        ids.into_iter().filter_map(|id| self.flush(id)).collect()
    }
}

/// The run and text of a streamed delta; `None` for any other line, and for a delta that carries more
/// than its kind, block and text (merging would lose the rest; it is written as it came).
fn delta(event: &Value) -> Option<(Run, &str)> {
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
        let run = Run::Block {
            kind: kind.to_string(),
            content_index: piece.get("contentIndex").cloned().unwrap_or(Value::Null),
        };
        return Some((run, piece.get("delta")?.as_str()?));
    }
    if !line.keys().all(|k| matches!(k.as_str(), "type" | "delta")) {
        return None;
    }
    Some((Run::Plain, line.get("delta")?.as_str()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pi(kind: &str, index: u64, text: &str) -> Value {
        json!({"type": "message_update", "assistantMessageEvent": {"type": kind, "contentIndex": index, "delta": text}})
    }

    fn plain(text: &str) -> Value {
        json!({"type": "message_update", "delta": text})
    }

    /// What a subscriber rebuilds from the written events: the text of each (kind, block), in order.
    fn rebuild(writes: &[Write]) -> Vec<(String, String)> {
        let mut out: Vec<(String, String)> = Vec::new();
        for w in writes {
            let e = &w.event;
            let (key, text) = if e["assistantMessageEvent"].is_object() {
                let p = &e["assistantMessageEvent"];
                (
                    format!("{}#{}", p["type"].as_str().unwrap(), p["contentIndex"]),
                    p["delta"].as_str().unwrap_or_default(),
                )
            } else if e["type"] == "message_update" {
                ("plain".to_string(), e["delta"].as_str().unwrap())
            } else {
                (e["type"].as_str().unwrap().to_string(), "")
            };
            match out.last_mut() {
                Some((k, t)) if *k == key => t.push_str(text),
                _ => out.push((key, text.to_string())),
            }
        }
        out
    }

    #[test]
    fn deltas_of_one_run_become_one_event_in_order() {
        let (s, x) = (Uuid::now_v7(), Uuid::now_v7());
        let t = Instant::now();
        let mut c = Coalescer::new(Duration::from_millis(100), STREAM_CAP);
        let mut writes = Vec::new();
        for i in 0..50 {
            writes.extend(c.offer(s, x, pi("text_delta", 0, &format!("{i} ")), t));
        }
        assert!(writes.is_empty(), "held until the interval");
        assert_eq!(c.next_due(), Some(t + Duration::from_millis(100)));
        assert!(c.due(t + Duration::from_millis(99)).is_empty());
        let due = c.due(t + Duration::from_millis(100));
        assert_eq!(due.len(), 1);
        let expected: String = (0..50).map(|i| format!("{i} ")).collect();
        assert_eq!(
            due[0].event,
            json!({"type": "message_update", "assistantMessageEvent": {"type": "text_delta", "contentIndex": 0, "delta": expected}, "coalesced": 50})
        );
        assert_eq!((due[0].session_id, due[0].execution_id), (s, x));
        assert_eq!(c.next_due(), None);
    }

    #[test]
    fn another_line_or_run_writes_what_is_held_first() {
        let (s, x) = (Uuid::now_v7(), Uuid::now_v7());
        let t = Instant::now();
        let mut c = Coalescer::new(Duration::from_millis(100), STREAM_CAP);
        let mut writes = Vec::new();
        writes.extend(c.offer(s, x, pi("thinking_delta", 0, "hm"), t));
        writes.extend(c.offer(s, x, pi("thinking_delta", 0, "m"), t));
        writes.extend(c.offer(s, x, pi("text_delta", 1, "Hel"), t));
        writes.extend(c.offer(s, x, pi("text_delta", 1, "lo"), t));
        writes.extend(c.offer(s, x, pi("text_delta", 2, "!"), t));
        writes.extend(c.offer(s, x, pi("toolcall_delta", 3, "{\"a\""), t));
        writes.extend(c.offer(s, x, json!({"type": "tool_execution_start", "toolName": "bash"}), t));
        writes.extend(c.offer(s, x, plain("x"), t));
        writes.extend(c.offer(s, x, plain("y"), t));
        writes.extend(c.offer(s, x, json!({"type": "message_end"}), t));
        assert_eq!(
            rebuild(&writes),
            [
                ("thinking_delta#0", "hmm"),
                ("text_delta#1", "Hello"),
                ("text_delta#2", "!"),
                ("toolcall_delta#3", "{\"a\""),
                ("tool_execution_start", ""),
                ("plain", "xy"),
                ("message_end", ""),
            ]
            .map(|(k, t)| (k.to_string(), t.to_string()))
        );
        let counts: Vec<&Value> = writes.iter().map(|w| &w.event["coalesced"]).collect();
        assert_eq!(
            counts,
            [
                &json!(2),
                &json!(2),
                &json!(1),
                &json!(1),
                &Value::Null,
                &json!(2),
                &Value::Null
            ]
        );
        assert!(c.drain().is_empty());
    }

    #[test]
    fn sessions_are_held_apart_and_a_new_execution_starts_afresh() {
        let (a, b, x, y) = (Uuid::now_v7(), Uuid::now_v7(), Uuid::now_v7(), Uuid::now_v7());
        let t = Instant::now();
        let mut c = Coalescer::new(Duration::from_millis(100), STREAM_CAP);
        assert!(c.offer(a, x, plain("a1"), t).is_empty());
        assert!(c.offer(b, y, plain("b1"), t + Duration::from_millis(50)).is_empty());
        let due = c.due(t + Duration::from_millis(120));
        assert_eq!(due.len(), 1, "only the older buffer is due");
        assert_eq!(due[0].event["delta"], "a1");
        // A relaunch of session b (a new execution) never merges with the old one's deltas.
        let z = Uuid::now_v7();
        let w = c.offer(b, z, plain("b2"), t + Duration::from_millis(130));
        assert_eq!(w.len(), 1);
        assert_eq!((w[0].execution_id, w[0].event["delta"].as_str()), (y, Some("b1")));
        let rest = c.drain();
        assert_eq!((rest[0].execution_id, rest[0].event["delta"].as_str()), (z, Some("b2")));
    }

    #[test]
    fn a_steady_stream_is_written_on_a_fixed_cadence() {
        let (s, x) = (Uuid::now_v7(), Uuid::now_v7());
        let t = Instant::now();
        let ms = Duration::from_millis;
        let mut c = Coalescer::new(ms(100), STREAM_CAP);
        let mut at = Vec::new();
        // A delta every 5 ms for a second, the timer checked 3 ms late each time.
        for i in 0..200u64 {
            let now = t + ms(5 * i);
            assert!(c.offer(s, x, plain("."), now).is_empty());
            if let Some(due) = c.next_due()
                && due + ms(3) <= now
            {
                let w = c.due(now);
                assert_eq!(w.len(), 1);
                at.push(due - t);
            }
        }
        assert_eq!(
            at,
            (1..=9).map(|k| ms(100 * k)).collect::<Vec<_>>(),
            "due every 100 ms, not 103"
        );
        // Once the agent is quiet for an interval, the next buffer is due an interval after its delta.
        let later = t + ms(5000);
        assert_eq!(c.due(later).len(), 1);
        assert!(c.due(later).is_empty());
        assert!(c.last_due.is_empty(), "the cadence is forgotten");
        assert!(c.offer(s, x, plain("."), later).is_empty());
        assert_eq!(c.next_due(), Some(later + ms(100)));
    }

    #[test]
    fn a_full_buffer_is_written_early() {
        let (s, x) = (Uuid::now_v7(), Uuid::now_v7());
        let t = Instant::now();
        let mut c = Coalescer::new(Duration::from_secs(3600), 10);
        assert!(c.offer(s, x, plain("12345"), t).is_empty());
        let w = c.offer(s, x, plain("67890"), t);
        assert_eq!(w.len(), 1);
        assert_eq!(w[0].event["delta"], "1234567890");
        assert_eq!(c.next_due(), None);
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
        assert!(delta(&pi("toolcall_delta", 2, "{")).is_some());
        assert!(
            delta(&json!({"type": "message_update", "assistantMessageEvent": {"type": "text_delta", "delta": "x"}}))
                .is_some()
        );
    }
}
