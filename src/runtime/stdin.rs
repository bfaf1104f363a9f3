//! What berth holds for an agent's stdin, bounded: the lines queued towards it are counted in bytes
//! until the pipe took them, and an agent that stops reading so that its queue would pass
//! `BERTH_AGENT_STDIN_QUEUE_MAX_BYTES` is ended (its session fails with `agent_not_reading`) instead of
//! berth growing. The requests an agent makes of berth (ACP's `fs/*`) are bounded too: at most
//! `BERTH_AGENT_MAX_REQUESTS_IN_FLIGHT` answered at once, one file read at a time, each answer waiting
//! (a bounded time) for room in the queue before it is queued.
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::sync::{Notify, mpsc};

/// How long an answer waits for room in the agent's stdin queue before the agent counts as not reading.
pub const ROOM_WAIT: Duration = Duration::from_secs(10);

/// The per-agent bounds (from the configuration).
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Requests of the agent to berth answered at once.
    pub requests_in_flight: usize,
    /// Bytes queued towards the agent's stdin.
    pub queue_bytes: usize,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            requests_in_flight: 8,
            queue_bytes: 32 * 1024 * 1024,
        }
    }
}

/// The bytes queued towards one agent's stdin, the agent's requests in flight (received, their answers
/// not yet taken by the pipe), and whether it was found not reading.
#[derive(Debug)]
pub struct Queue {
    queued: AtomicUsize,
    limit: usize,
    /// Signalled whenever the pipe took a line.
    drained: Notify,
    /// The queue would have passed its limit: the agent is being ended for it.
    not_reading: AtomicBool,
    /// The agent's requests being answered now.
    requests: AtomicUsize,
    max_requests: usize,
    /// One file read at a time per agent: what waits holds only its request.
    pub serving: tokio::sync::Mutex<()>,
}

impl Queue {
    pub fn new(limits: Limits) -> Queue {
        Queue {
            queued: AtomicUsize::new(0),
            limit: limits.queue_bytes,
            drained: Notify::new(),
            not_reading: AtomicBool::new(false),
            requests: AtomicUsize::new(0),
            max_requests: limits.requests_in_flight,
            serving: tokio::sync::Mutex::new(()),
        }
    }

    pub fn limit(&self) -> usize {
        self.limit
    }

    pub fn queued(&self) -> usize {
        self.queued.load(Ordering::Acquire)
    }

    /// Whether the agent was ended for not reading its stdin.
    pub fn not_reading(&self) -> bool {
        self.not_reading.load(Ordering::Acquire)
    }

    /// Takes `n` bytes of the queue: false (nothing taken) when that would pass the limit while
    /// something is still queued. A line alone larger than the limit goes when the queue is empty.
    pub fn take(&self, n: usize) -> bool {
        let prev = self.queued.fetch_add(n, Ordering::AcqRel);
        if prev > 0 && prev + n > self.limit {
            self.queued.fetch_sub(n, Ordering::AcqRel);
            return false;
        }
        true
    }

    /// Gives back bytes taken for a line that was never queued.
    pub fn give_back(&self, n: usize) {
        self.queued.fetch_sub(n, Ordering::AcqRel);
        self.drained.notify_waiters();
    }

    /// Marks the agent not reading; true the first time.
    pub fn mark_not_reading(&self) -> bool {
        !self.not_reading.swap(true, Ordering::AcqRel)
    }

    /// Waits up to `within` until `n` more bytes fit (or the queue is empty); false when they never did.
    pub async fn room_for(&self, n: usize, within: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let drained = self.drained.notified();
            tokio::pin!(drained);
            drained.as_mut().enable();
            let queued = self.queued();
            if queued == 0 || queued + n <= self.limit {
                return true;
            }
            if self.not_reading() || tokio::time::timeout_at(deadline, drained).await.is_err() {
                return false;
            }
        }
    }

    /// Counts one more request of the agent's; false (not counted) past the limit.
    pub fn begin_request(&self) -> bool {
        let prev = self.requests.fetch_add(1, Ordering::AcqRel);
        if prev >= self.max_requests {
            self.requests.fetch_sub(1, Ordering::AcqRel);
            return false;
        }
        true
    }

    pub fn end_request(&self) {
        self.requests.fetch_sub(1, Ordering::AcqRel);
    }

    pub fn max_requests(&self) -> usize {
        self.max_requests
    }
}

/// One line for the agent's stdin; `answer` when it answers one of the agent's requests, which stays in
/// flight until the pipe took its answer.
#[derive(Debug)]
pub struct Line {
    pub text: String,
    pub answer: bool,
}

/// Writes the queued lines to the agent's stdin in order, giving their bytes (and the requests they
/// answer) back as the pipe takes them.
pub async fn write_lines(
    mut stdin: tokio::process::ChildStdin,
    mut lines: mpsc::UnboundedReceiver<Line>,
    queue: std::sync::Arc<Queue>,
) {
    let done = |line: Line| {
        queue.queued.fetch_sub(line.text.len() + 1, Ordering::AcqRel);
        if line.answer {
            queue.end_request();
        }
        queue.drained.notify_waiters();
    };
    while let Some(line) = lines.recv().await {
        let ok = stdin.write_all(line.text.as_bytes()).await.is_ok()
            && stdin.write_all(b"\n").await.is_ok()
            && stdin.flush().await.is_ok();
        done(line);
        if !ok {
            break;
        }
    }
    // What is still queued goes with the channel; nothing counts any more.
    lines.close();
    while let Some(line) = lines.recv().await {
        done(line);
    }
}

/// The length of `v` serialized, without building it.
pub fn serialized_len(v: &serde_json::Value) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut c = Count(0);
    let _ = serde_json::to_writer(&mut c, v);
    c.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_queue_refuses_past_its_limit_unless_empty() {
        let q = Queue::new(Limits {
            requests_in_flight: 2,
            queue_bytes: 100,
        });
        assert!(q.take(150), "a line alone goes when nothing waits");
        assert!(!q.take(1), "nothing more past the limit");
        assert_eq!(q.queued(), 150);
        assert!(q.begin_request() && q.begin_request() && !q.begin_request());
        q.end_request();
        assert!(q.begin_request());
        assert_eq!(serialized_len(&serde_json::json!({"a": "b\n"})), r#"{"a":"b\n"}"#.len());
    }
}
