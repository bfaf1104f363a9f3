use crate::ids::{InboxItemId, SessionId};
use sea_orm::entity::prelude::*;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// How a message reaches a working agent.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, EnumIter, DeriveActiveEnum, Serialize, Deserialize, ToSchema,
)]
#[sea_orm(rs_type = "String", db_type = "Text")]
#[serde(rename_all = "snake_case")]
pub enum Delivery {
    /// A prompt when the agent is idle; held by berth while it works and sent when the turn settles.
    #[default]
    #[sea_orm(string_value = "auto")]
    Auto,
    /// Forwarded at once while the agent works: it reads it before its next model call.
    #[sea_orm(string_value = "steer")]
    Steer,
    /// Held by berth until the agent settles, then sent as the next prompt.
    #[sea_orm(string_value = "follow_up")]
    FollowUp,
}

/// Where an inbox message is: stored (`queued`), accepted by the agent (`delivered`), refused by it
/// (`refused`, with its reason) or taken back before it was sent (`cancelled`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, EnumIter, DeriveActiveEnum, Serialize, Deserialize, ToSchema)]
#[sea_orm(rs_type = "String", db_type = "Text")]
#[serde(rename_all = "snake_case")]
pub enum InboxState {
    #[sea_orm(string_value = "queued")]
    Queued,
    #[sea_orm(string_value = "delivered")]
    Delivered,
    #[sea_orm(string_value = "refused")]
    Refused,
    #[sea_orm(string_value = "cancelled")]
    Cancelled,
}

/// A message for a session's agent, stored before anything is sent (removed with the session).
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "session_inbox")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: InboxItemId,
    pub session_id: SessionId,
    pub text: String,
    pub delivery: Delivery,
    pub state: InboxState,
    pub reason: Option<String>,
    pub created_at: DateTimeUtc,
    pub updated_at: DateTimeUtc,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
