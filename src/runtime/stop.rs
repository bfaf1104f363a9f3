//! Stopping agents (I28): abort, close stdin, SIGTERM the process group, SIGKILL, each step after a
//! bounded wait; at server shutdown the waits are cut to fit the budget.
use crate::ids::{ExecutionId, SessionId};
use std::time::Duration;

use super::orphans::signal_group;
use super::{Agent, Runtime};

impl Runtime {
    /// I28: abort a working agent, wait; close stdin, wait; SIGTERM the process group, wait; SIGKILL.
    /// Returns once the process has exited (and is forgotten): which execution it was, and its status.
    pub async fn stop(&self, session_id: SessionId) -> Option<(ExecutionId, Option<i32>)> {
        let graces = Graces {
            stop: self.grace,
            term: self.term_grace,
            kill: None,
        };
        self.stop_with(session_id, graces).await
    }

    async fn stop_with(&self, session_id: SessionId, graces: Graces) -> Option<(ExecutionId, Option<i32>)> {
        let agent = self.agents.lock().unwrap().get(&session_id).cloned()?;
        self.escalate(session_id, &agent, graces).await;
        self.forget(session_id, agent.execution_id);
        let code = *agent.exit_code.lock().unwrap();
        Some((agent.execution_id, code))
    }

    async fn escalate(&self, session_id: SessionId, agent: &Agent, graces: Graces) {
        agent.stopping.store(true, std::sync::atomic::Ordering::Release);
        let mut exited = agent.exited.clone();
        if *agent.working.borrow() {
            // Not waited for: the turn's end is.
            let _ = self
                .call(session_id, crate::agent::Command::Abort, Duration::ZERO)
                .await;
            let mut working = agent.working.subscribe();
            let _ = tokio::time::timeout(graces.stop, working.wait_for(|w| !*w)).await;
        }
        agent.stdin.lock().unwrap().take();
        if tokio::time::timeout(graces.stop, exited.wait_for(|e| *e)).await.is_ok() {
            return;
        }
        signal_group(agent.pid, libc::SIGTERM);
        if tokio::time::timeout(graces.term, exited.wait_for(|e| *e)).await.is_ok() {
            return;
        }
        tracing::warn!(%session_id, "agent ignored SIGTERM; sending SIGKILL");
        signal_group(agent.pid, libc::SIGKILL);
        match graces.kill {
            None => {
                let _ = exited.wait_for(|e| *e).await;
            }
            Some(within) => {
                if tokio::time::timeout(within, exited.wait_for(|e| *e)).await.is_err() {
                    tracing::warn!(%session_id, pid = agent.pid, "agent still not reaped after SIGKILL");
                }
            }
        }
    }

    /// Stops every live agent (tests; server shutdown uses `stop_all_by`).
    pub async fn stop_all(&self) {
        let ids: Vec<SessionId> = self.agents.lock().unwrap().keys().copied().collect();
        futures_util::future::join_all(ids.into_iter().map(|id| self.stop(id))).await;
        // (The exits are recorded by their reports.)
    }

    /// Server shutdown: every live agent through the I28 escalation, its waits cut to a quarter each of
    /// the time left, so that the last SIGKILL and its exit fall before `deadline`. Agents that appear
    /// meanwhile (a crash restarted) are stopped with what is left. Sessions keep `desired_open`: the next
    /// start restores them (I29).
    pub async fn stop_all_by(&self, deadline: tokio::time::Instant) {
        loop {
            let ids = self.live_sessions();
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if ids.is_empty() {
                return;
            }
            if left.is_zero() {
                tracing::warn!(agents = ids.len(), "shutdown budget spent with agents still live");
                return;
            }
            let quarter = left / 4;
            let graces = Graces {
                stop: self.grace.min(quarter),
                term: self.term_grace.min(quarter),
                kill: Some(quarter),
            };
            tracing::info!(agents = ids.len(), ?graces, "stopping agents");
            let stops = futures_util::future::join_all(ids.into_iter().map(|id| self.stop_with(id, graces)));
            let _ = tokio::time::timeout_at(deadline, stops).await;
        }
    }
}

/// How long each wait of the I28 escalation lasts.
#[derive(Debug, Clone, Copy)]
struct Graces {
    /// After `abort` (a working agent only), and again after closing stdin.
    stop: Duration,
    /// After SIGTERM, before SIGKILL.
    term: Duration,
    /// After SIGKILL, for the exit; `None`: until it comes.
    kill: Option<Duration>,
}
