use sea_orm::entity::prelude::*;

/// A durable cleanup job. No foreign key to its task: it outlives it (I9).
#[derive(Clone, Debug, PartialEq, DeriveEntityModel)]
#[sea_orm(table_name = "task_resource_cleanup_jobs")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: Uuid,
    pub operation_id: Uuid,
    pub task_id: Uuid,
    pub workspace_id: Uuid,
    pub task_environment_id: Option<Uuid>,
    pub trigger: String,
    pub state: String,
    pub attempts: i32,
    pub max_attempts: i32,
    pub next_attempt_at: Option<DateTimeUtc>,
    pub last_error: Option<String>,
    pub resource_snapshot: Json,
    pub node_id: String,
    pub lease_owner: Option<String>,
    pub lease_expires_at: Option<DateTimeUtc>,
    pub created_at: DateTimeUtc,
    pub updated_at: DateTimeUtc,
    pub completed_at: Option<DateTimeUtc>,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}

/// The states that hold the barrier (I7): sessions, environments and inventory rows cannot be created.
pub const ACTIVE_STATES: [&str; 4] = ["prepared", "pending", "running", "retry_wait"];
