use crate::ids::SessionId;
use sea_orm::entity::prelude::*;

/// A stream ticket: the principal a `GET /events/stream?ticket=` stands for. Only the ticket's SHA-256
/// is kept; `used_at` is set when a stream redeems it, which it can do once.
#[derive(Clone, Debug, PartialEq, DeriveEntityModel)]
#[sea_orm(table_name = "event_tickets")]
pub struct Model {
    /// Hex SHA-256 of the ticket.
    #[sea_orm(primary_key, auto_increment = false)]
    pub ticket_hash: String,
    pub sub: String,
    /// Space-separated scope names of the minting token.
    pub scopes: String,
    /// The minting token's workspaces (a JSON list of ids), or none for every workspace.
    pub workspaces: Option<Json>,
    pub session_id: Option<SessionId>,
    pub created_at: DateTimeUtc,
    pub expires_at: DateTimeUtc,
    pub used_at: Option<DateTimeUtc>,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
