use crate::ids::{InstanceId, WebhookId, WorkspaceId};
use sea_orm::entity::prelude::*;

/// A webhook subscription: where berth posts the events it takes, signed with its secret, and its
/// durable place in the event log.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "webhooks")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: WebhookId,
    pub url: String,
    /// The type entries as given (exact types and `prefix.`); `None`: every type.
    pub types: Option<Json>,
    /// Only this workspace's events; `None`: every workspace's, and events about no workspace.
    pub workspace_id: Option<WorkspaceId>,
    pub description: String,
    pub enabled: bool,
    /// Why berth disabled it (its receiver failed past the retry horizon); `None` when a person did.
    pub disabled_reason: Option<String>,
    /// `whsec_<base64>`: shown once, when made or rotated.
    pub secret: String,
    /// The secret before the last rotation, still signing until `previous_secret_expires_at`.
    pub previous_secret: Option<String>,
    pub previous_secret_expires_at: Option<DateTimeUtc>,
    /// The last seq passed: delivered, or not one this subscription takes.
    pub cursor: i64,
    /// Failed attempts at the event after the cursor, since `failing_since`.
    pub attempts: i32,
    pub failing_since: Option<DateTimeUtc>,
    pub next_attempt_at: Option<DateTimeUtc>,
    /// Its oldest undelivered event is older than `BERTH_WEBHOOK_MAX_LAG_SECS`: retention no longer keeps
    /// events for it (it resumes from the oldest kept, saying what it skipped).
    pub lagging: bool,
    /// The process (its instance id) that delivers it until `lease_expires_at`.
    pub lease_owner: Option<InstanceId>,
    pub lease_expires_at: Option<DateTimeUtc>,
    pub created_by: Option<String>,
    pub created_at: DateTimeUtc,
    pub updated_at: DateTimeUtc,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
