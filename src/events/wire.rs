//! An event as readers receive it: the stream's `data`, a replay page's item and a webhook's body
//! are this one shape.
use crate::ids::{EnvironmentId, ExecutionId, InstanceId, SessionId, TaskId, WorkspaceId};
use chrono::{DateTime, Utc};
use serde::Serialize;
use utoipa::ToSchema;

use super::EventType;
use crate::entity::event as event_row;

/// The spec's schema is a union by `type`, hand-written in `event_schema.rs`.
#[derive(Debug, Serialize)]
pub struct Event {
    /// Always `v1`.
    pub version: String,
    /// The server generation that wrote the event.
    pub instance_id: InstanceId,
    /// Strictly increasing across all events; the SSE `id`.
    pub seq: i64,
    #[serde(rename = "type")]
    pub event_type: EventType,
    pub workspace_id: Option<WorkspaceId>,
    pub task_id: Option<TaskId>,
    pub session_id: Option<SessionId>,
    pub task_environment_id: Option<EnvironmentId>,
    pub execution_id: Option<ExecutionId>,
    pub data: serde_json::Value,
    pub created_at: DateTime<Utc>,
    /// Who did it; `null` when berth did it on its own (a worker, a reconcile pass, recovery).
    pub actor: Option<Actor>,
}

/// Who caused an event or asked for a cleanup job (issue 17): the token's `sub`, and for an agent's
/// session-bound token its session.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Actor {
    pub sub: String,
    pub session_id: Option<SessionId>,
}

impl Actor {
    pub fn of(sub: &Option<String>, session_id: Option<SessionId>) -> Option<Actor> {
        sub.as_ref().map(|sub| Actor {
            sub: sub.clone(),
            session_id,
        })
    }
}

impl From<&event_row::Model> for Event {
    fn from(e: &event_row::Model) -> Self {
        Event {
            version: "v1".into(),
            instance_id: e.instance_id,
            seq: e.seq,
            event_type: e.event_type,
            workspace_id: e.workspace_id,
            task_id: e.task_id,
            session_id: e.session_id,
            task_environment_id: e.task_environment_id,
            execution_id: e.execution_id,
            data: e.data.clone(),
            created_at: e.created_at,
            actor: Actor::of(&e.actor_sub, e.actor_session_id),
        }
    }
}
