use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "repositories")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: Uuid,
    pub workspace_id: Uuid,
    pub name: String,
    pub path: String,
    pub common_git_dir: String,
    pub default_branch: String,
    pub created_at: DateTimeUtc,
    pub updated_at: DateTimeUtc,
    /// Soft delete: archived tasks keep referring to a deregistered repository.
    pub deleted_at: Option<DateTimeUtc>,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {
    #[sea_orm(has_many = "super::task_repository::Entity")]
    Slots,
}

impl Related<super::task_repository::Entity> for Entity {
    fn to() -> RelationDef {
        Relation::Slots.def()
    }
}

impl ActiveModelBehavior for ActiveModel {}
