use sea_orm::entity::prelude::*;

/// The durable handle of one agent process: written before the process is reported running.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "agent_executions")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: Uuid,
    pub session_id: Uuid,
    pub task_environment_id: Option<Uuid>,
    pub instance_id: Uuid,
    pub node_id: String,
    pub pid: Option<i32>,
    /// `starting`, `running`, `exited` or `failed`.
    pub state: String,
    pub workspace_path: String,
    pub exit_code: Option<i32>,
    pub started_at: DateTimeUtc,
    pub ended_at: Option<DateTimeUtc>,
    pub updated_at: DateTimeUtc,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
