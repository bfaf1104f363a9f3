//! What a client loads before following the stream (seed 002 "Snapshot").
use crate::ids::{InstanceId, SessionId};

use super::Ctx;
use super::access::{SessionView, project, visible};
use crate::auth::Principal;
use crate::entity::session_message::{self as message, MessageRole};
use crate::error::Result;
use crate::events;

/// What a client loads before following the stream from `latest_seq`.
pub struct SessionSnapshot {
    pub view: SessionView,
    pub label: String,
    pub transcript: Vec<message::Model>,
    pub turns: u64,
    pub messages: u64,
    /// Summed from the agent's usage reports, when it makes them; `cost` is in US dollars.
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cost: f64,
    pub usage: crate::domain::usage::Totals,
    pub active_tool: Option<String>,
    pub last_activity_at: chrono::DateTime<chrono::Utc>,
    pub attention_requests: Vec<serde_json::Value>,
    /// Queued in berth's inbox plus held in the agent's own queue.
    pub queue_length: u64,
    pub agent_state: Option<serde_json::Value>,
    pub instance_id: InstanceId,
    pub latest_seq: i64,
}

pub async fn snapshot(ctx: &Ctx, p: &Principal, session_id: SessionId) -> Result<SessionSnapshot> {
    // The seq first: everything read after it is at least as new, so following from it loses nothing.
    let (_, latest_seq) = events::bounds(&ctx.db.conn).await?;
    let s = visible(&ctx.db.conn, p, session_id).await?;
    let transcript = crate::store::messages::transcript(&ctx.db.conn, s.id).await?;
    let first_prompt = transcript
        .iter()
        .find(|m| m.role == MessageRole::User)
        .and_then(|m| m.content["text"].as_str().map(str::to_string));
    let agent_name = s
        .agent_state
        .as_ref()
        .and_then(|a| a["session_name"].as_str())
        .filter(|n| !n.trim().is_empty())
        .map(str::to_string);
    let label = if let Some(name) = agent_name {
        name
    } else if !s.name.is_empty() {
        s.name.clone()
    } else {
        first_prompt
            .map(|t| t.chars().take(80).collect())
            .unwrap_or_else(|| "New session".into())
    };
    let turns = transcript.iter().filter(|m| m.role == MessageRole::Assistant).count() as u64;
    // The recorded reports, not the transcript (ACP's usage is not in its messages).
    let usage = crate::domain::usage::of_session(ctx, s.id).await?;
    let (input_tokens, output_tokens) = (usage.input_tokens, usage.output_tokens);
    let cost = usage.cost_nanos.get("USD").copied().unwrap_or(0) as f64 / 1e9;
    let active_tool = ctx.runtime.active_tool(s.id);
    let last_activity_at = s.last_activity_at;
    let messages = transcript.len() as u64;
    // The agent's node holds its questions; any other replica shows what that node last recorded.
    let attention_requests = if ctx.runtime.is_live(s.id) {
        ctx.runtime.attention(s.id)
    } else {
        s.agent_state
            .as_ref()
            .and_then(|a| a["attention"].as_array().cloned())
            .filter(|_| s.state == crate::entity::task_session::SessionState::Attention)
            .unwrap_or_default()
    };
    let queue_length =
        crate::store::inbox::count_queued(&ctx.db.conn, s.id).await? + ctx.runtime.agent_queue(s.id) as u64;
    let agent_state = s.agent_state.clone();
    let view = project(ctx, s).await?;
    Ok(SessionSnapshot {
        view,
        label,
        transcript,
        turns,
        messages,
        input_tokens,
        output_tokens,
        cost,
        usage,
        active_tool,
        last_activity_at,
        attention_requests,
        queue_length,
        agent_state,
        instance_id: ctx.instance_id,
        latest_seq,
    })
}
