use crate::ids::{DeliveryId, WebhookId};
use sea_orm::entity::prelude::*;

/// One attempt to deliver an event (or a ping) to a webhook; the recent ones are kept.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "webhook_deliveries")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: DeliveryId,
    pub webhook_id: WebhookId,
    /// The `webhook-id` header, the same for every attempt of one event.
    pub message_id: String,
    /// `None` for a ping.
    pub event_seq: Option<i64>,
    pub event_type: String,
    /// 1 for the first attempt of this message.
    pub attempt: i32,
    pub status_code: Option<i32>,
    pub succeeded: bool,
    pub latency_ms: i64,
    pub error: Option<String>,
    pub created_at: DateTimeUtc,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
