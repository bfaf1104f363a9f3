use crate::ids::{EnvironmentId, InboxItemId, ReviewId, SessionId, TaskId};
use sea_orm::entity::prelude::*;

/// A person's review of an environment's diff: a body, comments on lines, and the inbox message
/// that carried it to a session, when it was sent to one.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "reviews")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: ReviewId,
    pub task_id: TaskId,
    pub task_environment_id: EnvironmentId,
    pub body: String,
    /// `[{repository_id, path, line, side, body, quote}]`
    pub comments: Json,
    pub session_id: Option<SessionId>,
    pub message_id: Option<InboxItemId>,
    /// The actor that wrote it (its token's subject).
    pub created_by: Option<String>,
    pub created_at: DateTimeUtc,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
