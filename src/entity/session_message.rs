use crate::ids::SessionId;
use sea_orm::entity::prelude::*;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// Who said a transcript entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, EnumIter, DeriveActiveEnum, Serialize, Deserialize, ToSchema)]
#[sea_orm(rs_type = "String", db_type = "Text")]
#[serde(rename_all = "snake_case")]
pub enum MessageRole {
    /// A prompt delivered to the agent.
    #[sea_orm(string_value = "user")]
    User,
    /// A message the agent finished (`message_end`).
    #[sea_orm(string_value = "assistant")]
    Assistant,
}

/// The conversation history of a session (removed with it, I2).
#[derive(Clone, Debug, PartialEq, DeriveEntityModel)]
#[sea_orm(table_name = "session_messages")]
pub struct Model {
    #[sea_orm(primary_key)]
    pub id: i64,
    pub session_id: SessionId,
    pub role: MessageRole,
    pub content: Json,
    pub created_at: DateTimeUtc,
    /// The kandev id this row was imported from (`berth import kandev`); null for rows berth made.
    pub imported_from: Option<String>,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
