//! Commands to an agent and what its signals leave in the runtime: a command goes through the agent's
//! protocol (`crate::agent::Wire`), and its answer, where the protocol gives one, comes back to the caller;
//! the signals keep whether the agent works, its pending questions, its tool and its queue; the files
//! an ACP agent asks for are served inside the admitted workspace only.
use crate::ids::{ExecutionId, SessionId};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use uuid::Uuid;

use super::{Agent, InFlight, Runtime, RuntimeEvent};
use crate::agent::{self, Answered, Command, Delivery, Reply, Signal};

impl Runtime {
    /// Sends a command and, where the protocol answers it, waits up to `within` for the answer. What the
    /// command means at once (an ACP prompt starts a turn) is reported like the agent's own lines.
    pub async fn call(&self, session_id: SessionId, command: Command, within: Duration) -> Delivery {
        let Some(agent) = self.agents.lock().unwrap().get(&session_id).cloned() else {
            return Delivery::Gone;
        };
        let id = format!("{}{}", agent::pi::REQUEST_PREFIX, Uuid::now_v7());
        let (tx, rx) = oneshot::channel();
        let out = {
            let mut wire = agent.wire.lock().unwrap();
            match wire.encode(&command, id) {
                Ok(out) => out,
                Err(u) => return Delivery::Unsupported(u),
            }
        };
        if let Some(id) = &out.awaits {
            agent.waiting.lock().unwrap().insert(id.clone(), tx);
        }
        if let Some(working) = out.working {
            agent.working.send_replace(working);
        }
        let mut written = true;
        for line in out.lines {
            written &= agent.write(line);
        }
        if !out.signals.is_empty() {
            agent.apply(&self.events, session_id, agent.execution_id, &out.signals);
            let _ = self
                .events
                .send(RuntimeEvent::Output {
                    session_id,
                    execution_id: agent.execution_id,
                    record: None,
                    delta: None,
                    signals: out.signals,
                    held: InFlight::none(),
                })
                .await;
        }
        let Some(id) = out.awaits else {
            return if written {
                Delivery::Accepted(serde_json::Value::Null)
            } else {
                Delivery::Gone
            };
        };
        if !written {
            agent.waiting.lock().unwrap().remove(&id);
            return Delivery::Gone;
        }
        let answer = tokio::time::timeout(within, rx).await.ok().and_then(Result::ok);
        agent.waiting.lock().unwrap().remove(&id);
        match answer {
            Some(Reply::Ok(v)) => Delivery::Accepted(v),
            Some(Reply::Refused { reason, code }) => {
                if out.working == Some(true) {
                    agent.working.send_replace(false);
                }
                Delivery::Refused { reason, code }
            }
            Some(Reply::Busy) => Delivery::Busy,
            None if self.is_live(session_id) => Delivery::NoAnswer,
            None => Delivery::Gone,
        }
    }

    /// What the agent said when its connection opened (ACP's `initialize`).
    pub fn introduction(&self, session_id: SessionId) -> Option<agent::Introduction> {
        let agent = self.agents.lock().unwrap().get(&session_id).cloned()?;
        agent.wire.lock().unwrap().introduction().cloned()
    }

    /// Answers a pending request of this session (I31): `NotPending` when it is not pending here, `Unfit`
    /// (with the field and why) when the answer does not fit the question, which then stays pending.
    pub fn answer(&self, session_id: SessionId, request_id: &str, answer: &agent::Answer) -> Answered {
        let agent = self.agents.lock().unwrap().get(&session_id).cloned();
        let Some(agent) = agent else {
            return Answered::NotPending;
        };
        {
            let mut pending = agent.pending.lock().unwrap();
            let Some(i) = pending.iter().position(|r| r["id"] == request_id) else {
                return Answered::NotPending;
            };
            if let Err((field, why)) = agent.wire.lock().unwrap().fits(&pending[i], answer) {
                return Answered::Unfit(field, why);
            }
            pending.remove(i);
        }
        let command = Command::Answer {
            request_id: request_id.to_string(),
            answer: answer.clone(),
        };
        let out = agent.wire.lock().unwrap().encode(&command, String::new());
        match out {
            Ok(out) if out.lines.iter().all(|l| agent.write(l.clone())) => Answered::Sent,
            _ => Answered::NotPending,
        }
    }
}

impl Agent {
    /// Queues a line for the agent's stdin. False when its stdin is closed, or when the line would take
    /// its queue past the limit: then the agent is not reading and is ended for it.
    pub(super) fn write(&self, line: serde_json::Value) -> bool {
        self.queue_line(line, false)
    }

    /// `write`, for the answer to one of the agent's requests (in flight until the pipe took it; given
    /// back here when it is not queued).
    fn queue_line(&self, line: serde_json::Value, answer: bool) -> bool {
        let queued = self.try_queue(line, answer);
        if !queued && answer {
            self.queue.end_request();
        }
        queued
    }

    fn try_queue(&self, line: serde_json::Value, answer: bool) -> bool {
        // Serialized once into a buffer of its exact size (no doubling copies of a big answer).
        let mut text = Vec::with_capacity(super::stdin::serialized_len(&line));
        let _ = serde_json::to_writer(&mut text, &line);
        drop(line);
        let text = String::from_utf8(text).unwrap_or_default();
        let n = text.len() + 1;
        let stdin = self.stdin.lock().unwrap();
        let Some(tx) = stdin.as_ref() else {
            return false;
        };
        if !self.queue.take(n) {
            drop(stdin);
            self.not_reading();
            return false;
        }
        if tx.send(super::stdin::Line { text, answer }).is_err() {
            // The writer is gone: nothing will give these bytes back.
            self.queue.give_back(n);
            return false;
        }
        true
    }

    /// The agent stopped reading its stdin with its queue full: ended at once (SIGKILL to its group), its
    /// exit reported as `not_reading`; what was queued for it goes with its pipe.
    pub(super) fn not_reading(&self) {
        if self.queue.mark_not_reading() {
            tracing::warn!(
                pid = self.pid,
                queued = self.queue.queued(),
                limit = self.queue.limit(),
                "an agent stopped reading its stdin with its queue full: ending it"
            );
            self.stdin.lock().unwrap().take();
            super::orphans::signal_group(self.pid, libc::SIGKILL);
        }
    }

    /// What the runtime itself keeps of the signals: whether the agent works, its pending questions, its
    /// tool, its queue.
    pub(super) fn apply(
        self: &Arc<Agent>,
        events: &mpsc::Sender<RuntimeEvent>,
        session_id: SessionId,
        execution_id: ExecutionId,
        signals: &[Signal],
    ) {
        apply(self, events, session_id, execution_id, signals);
    }

    /// Serves a file the agent asked for, inside the admitted workspace only, off the async threads.
    pub(super) fn serve(self: &Arc<Agent>, request: agent::fs::Request) {
        serve_file(self, request);
    }
}

fn apply(
    agent: &Arc<Agent>,
    events: &mpsc::Sender<RuntimeEvent>,
    session_id: SessionId,
    execution_id: ExecutionId,
    signals: &[Signal],
) {
    use std::sync::atomic::Ordering;
    for signal in signals {
        match signal {
            Signal::TurnStarted => {
                agent.working.send_replace(true);
            }
            Signal::TurnSettled { .. } => {
                agent.working.send_replace(false);
            }
            Signal::Question { request, timeout_ms } => {
                agent.pending.lock().unwrap().push(request.clone());
                if let Some(ms) = timeout_ms {
                    expire_after(agent, events, session_id, execution_id, request, *ms);
                }
            }
            Signal::QuestionsCleared => agent.pending.lock().unwrap().clear(),
            Signal::ToolStarted(name) => *agent.tool.lock().unwrap() = Some(name.clone()),
            Signal::ToolEnded => {
                agent.tool.lock().unwrap().take();
            }
            Signal::Queue(n) => agent.agent_queue.store(*n, Ordering::Release),
            Signal::QuestionExpired { .. } | Signal::Assistant(_) | Signal::Usage(_) | Signal::Notice(_) => {}
        }
    }
}

/// Serves a file request: at most `BERTH_AGENT_MAX_REQUESTS_IN_FLIGHT` of one agent at once (each one
/// past it is answered with an error at once), one file at a time, its answer queued only once the
/// agent's stdin queue has room for it (waiting `stdin::ROOM_WAIT` at most, else the agent is not
/// reading and is ended).
fn serve_file(agent: &Arc<Agent>, request: agent::fs::Request) {
    if !agent.queue.begin_request() {
        let busy = agent::fs::Failure {
            code: agent::fs::FAILED,
            message: format!(
                "berth is already answering {} requests of this agent; ask again once one is answered",
                agent.queue.max_requests()
            ),
        };
        let line = agent.wire.lock().unwrap().served(request.id, Err(busy));
        agent.write(line);
        return;
    }
    let agent = agent.clone();
    tokio::spawn(async move {
        let one = agent.queue.serving.lock().await;
        if agent.queue.not_reading() {
            // Ended for not reading: nothing more is read for it.
            agent.queue.end_request();
            return;
        }
        // A file is read only once its answer has room in the queue (its size, a lower bound of the
        // answer): an agent not reading makes berth wait, not hold another copy.
        let (root, op) = (agent.root.clone(), request.op.clone());
        let size = tokio::task::spawn_blocking(move || agent::fs::read_size(&root, &op))
            .await
            .ok()
            .flatten();
        if let Some(size) = size
            && !agent.queue.room_for(size as usize, super::stdin::ROOM_WAIT).await
        {
            agent.queue.end_request();
            agent.not_reading();
            return;
        }
        let root = agent.root.clone();
        let op = request.op.clone();
        let result = tokio::task::spawn_blocking(move || agent::fs::serve(&root, &op))
            .await
            .unwrap_or_else(|e| {
                Err(agent::fs::Failure {
                    code: agent::fs::FAILED,
                    message: e.to_string(),
                })
            });
        if let Err(f) = &result {
            // Which file and how much, never what an agent wanted written.
            tracing::info!(
                op = request.op.name(),
                path = request.op.path(),
                bytes = request.op.size(),
                reason = %f.message,
                "refused an agent's file request"
            );
        }
        let line = agent.wire.lock().unwrap().served(request.id, result);
        let n = super::stdin::serialized_len(&line) + 1;
        if agent.queue.room_for(n, super::stdin::ROOM_WAIT).await {
            agent.queue_line(line, true);
        } else {
            drop(line);
            agent.queue.end_request();
            agent.not_reading();
        }
        drop(one);
    });
}

/// A question with its own `timeout` is resolved by the agent when it passes (Pi answers it with a
/// default): berth then forgets the question and reports it expired, so the session does not wait for an
/// answer nobody can give any more.
fn expire_after(
    agent: &Arc<Agent>,
    events: &mpsc::Sender<RuntimeEvent>,
    session_id: SessionId,
    execution_id: ExecutionId,
    request: &serde_json::Value,
    ms: u64,
) {
    let (agent, events, id) = (Arc::downgrade(agent), events.clone(), request["id"].clone());
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(ms)).await;
        let Some(agent) = agent.upgrade() else { return };
        let expired = {
            let mut pending = agent.pending.lock().unwrap();
            let before = pending.len();
            pending.retain(|r| r["id"] != id);
            pending.len() < before
        };
        if expired {
            let _ = events
                .send(RuntimeEvent::Output {
                    session_id,
                    execution_id,
                    record: Some(agent::pi::expired(&id)),
                    delta: None,
                    signals: vec![Signal::QuestionExpired { id }],
                    held: InFlight::none(),
                })
                .await;
        }
    });
}
