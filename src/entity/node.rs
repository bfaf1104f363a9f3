use sea_orm::entity::prelude::*;

/// A node: the filesystem a set of berth processes reach (`BERTH_NODE_ID`), seen since its first
/// instance started. Up, down or given up is `domain::nodes`' to say.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "nodes")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: String,
    pub first_seen_at: DateTimeUtc,
    /// Set when an operator gave the node up (`POST /nodes/{id}/decommission`).
    pub decommissioned_at: Option<DateTimeUtc>,
    pub decommissioned_by: Option<String>,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
