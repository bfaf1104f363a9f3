use sea_orm::entity::prelude::*;

/// I21: keyed by environment and repository; the session is nullable provenance.
#[derive(Clone, Debug, PartialEq, DeriveEntityModel)]
#[sea_orm(table_name = "git_status_observations")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: Uuid,
    pub task_environment_id: Uuid,
    pub repository_id: Uuid,
    pub session_id: Option<Uuid>,
    /// `live`, `completion` or `archive`.
    pub kind: String,
    pub observed_at: DateTimeUtc,
    pub branch: Option<String>,
    pub head_commit: Option<String>,
    pub upstream: Option<String>,
    pub ahead: i32,
    pub behind: i32,
    pub files: Json,
    pub created_at: DateTimeUtc,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
