use sea_orm::entity::prelude::*;

/// A session references the task's environment and owns nothing physical (I1).
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "task_sessions")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: Uuid,
    pub task_id: Uuid,
    pub task_environment_id: Option<Uuid>,
    pub name: String,
    pub executor_type: String,
    pub agent_profile: Option<String>,
    pub state: String,
    pub is_primary: bool,
    pub desired_open: bool,
    pub execution_id: Option<Uuid>,
    pub agent_session_ref: Option<String>,
    pub last_error_code: Option<String>,
    pub last_error_message: Option<String>,
    pub last_activity_at: DateTimeUtc,
    pub created_at: DateTimeUtc,
    pub updated_at: DateTimeUtc,
    pub started_at: Option<DateTimeUtc>,
    pub ended_at: Option<DateTimeUtc>,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
