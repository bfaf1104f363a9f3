//! Streamed deltas, coalesced: an agent streams one delta per token, and each would be a write
//! transaction and an event. Deltas are held per session and written as one `runtime.output` event per
//! session per `BERTH_STREAM_INTERVAL_MS`, in order, so an SSE subscriber still sees the text grow about
//! ten times a second and rebuilds it exactly.
//!
//! What a delta is, and the one line that stands for a run of them, is the agent protocol's
//! (`crate::agent`: `Delta`, `Run::render`); consecutive deltas of one run merge, the line keeping the
//! agent's own shape with `coalesced` counting the deltas it holds.
//!
//! A delta of another run, any other line of the session and its exit write what is held first (order
//! is kept: an event never holds two runs, so every event keeps the agent's own shape); so does a
//! buffer past `STREAM_CAP` bytes, and the interval: a buffer is due one interval after its first delta,
//! or one interval after the session's previous due time while the agent keeps streaming, so a steady
//! stream is written on a fixed cadence (ten times a second by default) and never more often.
use crate::ids::{ExecutionId, SessionId};
use std::collections::HashMap;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::agent::{Delta, Run, Signal};

/// The most delta text held for one session before it is written early.
pub const STREAM_CAP: usize = 256 * 1024;

/// One agent report to apply: the `runtime.output` event to write (if any) and the signals it carries.
#[derive(Debug, Clone, PartialEq)]
pub struct Write {
    pub session_id: SessionId,
    pub execution_id: ExecutionId,
    pub event: Option<Value>,
    pub signals: Vec<Signal>,
}

/// One decoded agent line: a streamed piece, or anything else.
#[derive(Debug, Clone, PartialEq)]
pub enum Offer {
    Delta(Delta),
    Line {
        record: Option<Value>,
        signals: Vec<Signal>,
    },
}

struct Held {
    execution_id: ExecutionId,
    due: Instant,
    run: Run,
    text: String,
    count: usize,
}

impl Held {
    fn into_write(self, session_id: SessionId) -> Write {
        Write {
            session_id,
            execution_id: self.execution_id,
            event: Some(self.run.render(&self.text, self.count)),
            signals: Vec::new(),
        }
    }
}

/// The deltas held, per session.
pub struct Coalescer {
    interval: Duration,
    cap: usize,
    held: HashMap<SessionId, Held>,
    /// When each streaming session's last buffer was due, for the cadence (dropped an interval later).
    last_due: HashMap<SessionId, Instant>,
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
    pub fn offer(
        &mut self,
        session_id: SessionId,
        execution_id: ExecutionId,
        offer: Offer,
        now: Instant,
    ) -> Vec<Write> {
        let mut out = Vec::new();
        let Delta { run, text } = match offer {
            Offer::Delta(d) => d,
            Offer::Line { record, signals } => {
                out.extend(self.flush(session_id));
                out.push(Write {
                    session_id,
                    execution_id,
                    event: record,
                    signals,
                });
                return out;
            }
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
        held.text.push_str(&text);
        held.count += 1;
        if held.text.len() >= self.cap {
            out.extend(self.flush(session_id));
        }
        out
    }

    /// What the session holds, as one event (before its exit is recorded).
    pub fn flush(&mut self, session_id: SessionId) -> Option<Write> {
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
        let due: Vec<(SessionId, Instant)> = self
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
        let ids: Vec<SessionId> = self.held.keys().copied().collect();
        ids.into_iter().filter_map(|id| self.flush(id)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A Pi line, decoded as the runtime decodes it.
    fn line(v: Value) -> Offer {
        let d = crate::agent::Wire::new(crate::agent::Protocol::Pi).decode(v);
        match d.delta {
            Some(delta) => Offer::Delta(delta),
            None => Offer::Line {
                record: d.record,
                signals: d.signals,
            },
        }
    }

    fn pi(kind: &str, index: u64, text: &str) -> Offer {
        line(
            json!({"type": "message_update", "assistantMessageEvent": {"type": kind, "contentIndex": index, "delta": text}}),
        )
    }

    fn plain(text: &str) -> Offer {
        line(json!({"type": "message_update", "delta": text}))
    }

    /// What a subscriber rebuilds from the written events: the text of each (kind, block), in order.
    fn rebuild(writes: &[Write]) -> Vec<(String, String)> {
        let mut out: Vec<(String, String)> = Vec::new();
        for w in writes {
            let e = w.event.as_ref().unwrap();
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
        let (s, x) = (SessionId::now_v7(), ExecutionId::now_v7());
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
            Some(
                json!({"type": "message_update", "assistantMessageEvent": {"type": "text_delta", "contentIndex": 0, "delta": expected}, "coalesced": 50})
            )
        );
        assert_eq!((due[0].session_id, due[0].execution_id), (s, x));
        assert_eq!(c.next_due(), None);
    }

    #[test]
    fn another_line_or_run_writes_what_is_held_first() {
        let (s, x) = (SessionId::now_v7(), ExecutionId::now_v7());
        let t = Instant::now();
        let mut c = Coalescer::new(Duration::from_millis(100), STREAM_CAP);
        let mut writes = Vec::new();
        writes.extend(c.offer(s, x, pi("thinking_delta", 0, "hm"), t));
        writes.extend(c.offer(s, x, pi("thinking_delta", 0, "m"), t));
        writes.extend(c.offer(s, x, pi("text_delta", 1, "Hel"), t));
        writes.extend(c.offer(s, x, pi("text_delta", 1, "lo"), t));
        writes.extend(c.offer(s, x, pi("text_delta", 2, "!"), t));
        writes.extend(c.offer(s, x, pi("toolcall_delta", 3, "{\"a\""), t));
        writes.extend(c.offer(
            s,
            x,
            line(json!({"type": "tool_execution_start", "toolName": "bash"})),
            t,
        ));
        writes.extend(c.offer(s, x, plain("x"), t));
        writes.extend(c.offer(s, x, plain("y"), t));
        writes.extend(c.offer(s, x, line(json!({"type": "message_end"})), t));
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
        let counts: Vec<&Value> = writes.iter().map(|w| &w.event.as_ref().unwrap()["coalesced"]).collect();
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
        let (a, b, x, y) = (
            SessionId::now_v7(),
            SessionId::now_v7(),
            ExecutionId::now_v7(),
            ExecutionId::now_v7(),
        );
        let t = Instant::now();
        let mut c = Coalescer::new(Duration::from_millis(100), STREAM_CAP);
        assert!(c.offer(a, x, plain("a1"), t).is_empty());
        assert!(c.offer(b, y, plain("b1"), t + Duration::from_millis(50)).is_empty());
        let due = c.due(t + Duration::from_millis(120));
        assert_eq!(due.len(), 1, "only the older buffer is due");
        assert_eq!(due[0].event.as_ref().unwrap()["delta"], "a1");
        // A relaunch of session b (a new execution) never merges with the old one's deltas.
        let z = ExecutionId::now_v7();
        let w = c.offer(b, z, plain("b2"), t + Duration::from_millis(130));
        assert_eq!(w.len(), 1);
        assert_eq!(
            (w[0].execution_id, w[0].event.as_ref().unwrap()["delta"].as_str()),
            (y, Some("b1"))
        );
        let rest = c.drain();
        assert_eq!(
            (rest[0].execution_id, rest[0].event.as_ref().unwrap()["delta"].as_str()),
            (z, Some("b2"))
        );
    }

    #[test]
    fn a_steady_stream_is_written_on_a_fixed_cadence() {
        let (s, x) = (SessionId::now_v7(), ExecutionId::now_v7());
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
        let (s, x) = (SessionId::now_v7(), ExecutionId::now_v7());
        let t = Instant::now();
        let mut c = Coalescer::new(Duration::from_secs(3600), 10);
        assert!(c.offer(s, x, plain("12345"), t).is_empty());
        let w = c.offer(s, x, plain("67890"), t);
        assert_eq!(w.len(), 1);
        assert_eq!(w[0].event.as_ref().unwrap()["delta"], "1234567890");
        assert_eq!(c.next_due(), None);
    }
}
