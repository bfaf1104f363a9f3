use crate::ids::{CommandId, ExecutionId, SessionId};
use sea_orm::entity::prelude::*;
use serde::{Deserialize, Serialize};

/// What a replica that does not run a session's agent asks of the node that does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, EnumIter, DeriveActiveEnum, Serialize, Deserialize)]
#[sea_orm(rs_type = "String", db_type = "Text")]
#[serde(rename_all = "snake_case")]
pub enum CommandKind {
    #[sea_orm(string_value = "abort")]
    Abort,
    #[sea_orm(string_value = "stop")]
    Stop,
    /// An answer to one of the agent's questions (`payload`: `request_id` and `response`).
    #[sea_orm(string_value = "answer")]
    Answer,
    /// A mode or configuration option for the agent (`payload`: a `Setting`).
    #[sea_orm(string_value = "configure")]
    Configure,
}

/// `pending` until the owning node carried it out (`done`) or could not (`failed`, with the error in
/// `result`); a caller that gave up waiting marks it `failed` so it never runs late.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, EnumIter, DeriveActiveEnum, Serialize, Deserialize)]
#[sea_orm(rs_type = "String", db_type = "Text")]
#[serde(rename_all = "snake_case")]
pub enum CommandState {
    #[sea_orm(string_value = "pending")]
    Pending,
    #[sea_orm(string_value = "done")]
    Done,
    #[sea_orm(string_value = "failed")]
    Failed,
}

/// A command routed to the node that runs a session's agent (removed with the session).
#[derive(Clone, Debug, PartialEq, DeriveEntityModel)]
#[sea_orm(table_name = "session_commands")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: CommandId,
    pub session_id: SessionId,
    /// The execution the command is for: another execution (a relaunch) does not carry it out.
    pub execution_id: ExecutionId,
    pub kind: CommandKind,
    pub payload: Json,
    pub state: CommandState,
    pub result: Option<Json>,
    pub created_at: DateTimeUtc,
    pub updated_at: DateTimeUtc,
    /// Who asked (the caller's token `sub`, and its session for an agent's token): the events the command
    /// causes on the owning node name them.
    pub actor_sub: Option<String>,
    pub actor_session_id: Option<SessionId>,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
