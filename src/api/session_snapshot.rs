//! HTTP for a session's snapshot: everything a client loads before following the stream.
use crate::ids::{InstanceId, SessionId};
use actix_web::{get, web};
use chrono::{DateTime, Utc};
use serde::Serialize;
use utoipa::ToSchema;
use utoipa_actix_web::service_config::ServiceConfig;

use super::AppState;
use super::extract::{Authorized, SessionsRead};
use super::problem::Problem;
use super::sessions::Session;
use crate::domain::sessions;
use crate::entity::session_message::MessageRole;
use crate::entity::task_session::SessionState;
use crate::error::Error;

pub fn routes(cfg: &mut ServiceConfig) {
    cfg.service(session_snapshot);
}

#[derive(Debug, Serialize, ToSchema)]
pub struct TranscriptEntry {
    pub role: MessageRole,
    pub content: serde_json::Value,
    pub created_at: DateTime<Utc>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct SessionStatistics {
    pub turns: u64,
    pub messages: u64,
    /// Summed from the agent's usage reports (zero when it makes none); `cost` in US dollars (see
    /// `usage` for every currency).
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cost: f64,
}

/// A question an agent asked (Pi RPC `extension_ui_request`), answered with
/// `POST /sessions/{id}/attention/{request_id}`. Fields are as the agent sent them.
#[derive(Debug, Serialize, ToSchema)]
pub struct AttentionRequest {
    /// The request id to answer.
    id: serde_json::Value,
    /// `confirm`, `select`, `input`, ...
    method: serde_json::Value,
    title: serde_json::Value,
    message: serde_json::Value,
    options: serde_json::Value,
}

impl From<serde_json::Value> for AttentionRequest {
    fn from(r: serde_json::Value) -> Self {
        AttentionRequest {
            id: r["id"].clone(),
            method: r["method"].clone(),
            title: r["title"].clone(),
            message: r["message"].clone(),
            options: r["options"].clone(),
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct SessionSnapshot {
    pub session: Session,
    pub state: SessionState,
    /// The agent's name for its session, else the session's name, else its first prompt, else "New session".
    pub label: String,
    pub transcript: Vec<TranscriptEntry>,
    pub statistics: SessionStatistics,
    /// Every usage report of the session's agent summed: tokens by kind, cost per currency.
    pub usage: super::usage::Usage,
    /// The tool the agent is running right now, if any.
    pub active_tool: Option<String>,
    /// Messages waiting: queued in berth's inbox plus held in the agent's own queue (Pi's `queue_update`).
    pub queue_length: u64,
    /// What the agent last said about itself (Pi: `get_state`, `get_commands`, `get_available_models`,
    /// status lines, title, notifications; ACP: its introduction, modes, options, plan, commands, usage).
    pub agent: AgentInfo,
    pub last_activity_at: DateTime<Utc>,
    /// Pending requests: `{id, method, title, message, options}` as the agent sent them.
    pub attention_requests: Vec<AttentionRequest>,
    pub instance_id: InstanceId,
    /// Follow the event stream from here: nothing after it is missing from this snapshot's sources.
    pub latest_seq: i64,
}

/// What the agent last told berth about itself; each field is null (or empty) until it has.
#[derive(Debug, Serialize, ToSchema)]
pub struct AgentInfo {
    /// The current model, as the agent describes it (`{id, name, provider, ...}`).
    pub model: serde_json::Value,
    pub thinking_level: Option<String>,
    /// The agent's own name for its session.
    pub session_name: Option<String>,
    /// Commands the agent offers (invoked as `/name` in a message).
    pub commands: Vec<serde_json::Value>,
    /// Models the agent can switch to.
    pub models: Vec<serde_json::Value>,
    /// The latest status line per key (`setStatus`).
    pub status: serde_json::Map<String, serde_json::Value>,
    /// The latest title (`setTitle`).
    pub title: Option<String>,
    /// The latest notifications (`notify`), newest last: `{message, notify_type, at}`.
    pub notifications: Vec<serde_json::Value>,
    /// Who the agent said it is when its connection opened (ACP's `initialize`): `{name, title, version,
    /// protocol_version, capabilities, auth_methods}`; null for agents that do not say.
    pub identity: serde_json::Value,
    /// The agent's current mode, and the modes it offers (`{id, name, description}`).
    pub mode: Option<String>,
    pub modes: Vec<serde_json::Value>,
    /// The configuration options the agent offers (ACP `configOptions`: `{id, name, category, type,
    /// currentValue, options}`; a model selector is one).
    pub config_options: Vec<serde_json::Value>,
    /// The agent's plan for the turn, as it last sent it (`{content, priority, status}` entries).
    pub plan: Vec<serde_json::Value>,
    /// The context and cost the agent last reported (ACP `usage_update`: `{used, size, cost}`).
    pub usage: serde_json::Value,
    /// The tool calls of the agent's current or last turn (ACP), oldest first, at most 50: `{id, title,
    /// kind, status (pending, in_progress, completed, failed), paths}`.
    pub tool_calls: Vec<serde_json::Value>,
}

impl From<Option<serde_json::Value>> for AgentInfo {
    fn from(v: Option<serde_json::Value>) -> Self {
        let v = v.unwrap_or_default();
        let text = |k: &str| v[k].as_str().map(str::to_string);
        let list = |k: &str| v[k].as_array().cloned().unwrap_or_default();
        AgentInfo {
            model: v["model"].clone(),
            thinking_level: text("thinking_level"),
            session_name: text("session_name"),
            commands: list("commands"),
            models: list("models"),
            status: v["status"].as_object().cloned().unwrap_or_default(),
            title: text("title"),
            notifications: list("notifications"),
            identity: v["identity"].clone(),
            mode: text("mode"),
            modes: list("modes"),
            config_options: list("config_options"),
            plan: list("plan"),
            usage: v["usage"].clone(),
            tool_calls: list("tool_calls"),
        }
    }
}

/// Get a session snapshot to follow from
///
/// Everything a client loads before following the event stream: the session, its state and label, the
/// transcript, statistics, pending attention requests, the queue length, and `instance_id` with `latest_seq`.
/// Every event up to `latest_seq` is reflected, so reading the stream after `latest_seq` misses nothing
/// and repeats nothing. Scope `sessions:read`.
#[utoipa::path(
    operation_id = "getSessionSnapshot",
    tag = "sessions",
    security(("bearer" = ["sessions:read"])),
    params(("id" = Uuid, Path, description = "Session id")),
    responses(
        (status = 200, description = "Everything a client loads before following the stream from latest_seq", body = SessionSnapshot),
        (status = 404, description = "No such session (`not_found`)", body = Problem),
    )
)]
#[get("/sessions/{id}/snapshot")]
async fn session_snapshot(
    auth: Authorized<SessionsRead>,
    state: web::Data<AppState>,
    id: web::Path<SessionId>,
) -> Result<web::Json<SessionSnapshot>, Error> {
    let snap = sessions::snapshot(&state.ctx, &auth, *id).await?;
    let attention_requests = snap.attention_requests.into_iter().map(Into::into).collect();
    Ok(web::Json(SessionSnapshot {
        state: snap.view.session.state,
        session: snap.view.into(),
        label: snap.label,
        transcript: snap
            .transcript
            .into_iter()
            .map(|m| TranscriptEntry {
                role: m.role,
                content: m.content,
                created_at: m.created_at,
            })
            .collect(),
        usage: super::usage::Usage::from(&snap.usage),
        statistics: SessionStatistics {
            turns: snap.turns,
            messages: snap.messages,
            input_tokens: snap.input_tokens,
            output_tokens: snap.output_tokens,
            cost: snap.cost,
        },
        active_tool: snap.active_tool,
        queue_length: snap.queue_length,
        agent: AgentInfo::from(snap.agent_state),
        last_activity_at: snap.last_activity_at,
        attention_requests,
        instance_id: snap.instance_id,
        latest_seq: snap.latest_seq,
    }))
}
