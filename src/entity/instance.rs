use crate::ids::InstanceId;
use sea_orm::entity::prelude::*;

/// One berth process of a node, holding a lease it renews while it runs.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "instances")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: InstanceId,
    pub node_id: String,
    pub pid: i32,
    pub host: String,
    /// Where the other instances reach it.
    pub url: String,
    pub version: String,
    pub db_max_connections: i32,
    pub started_at: DateTimeUtc,
    pub renewed_at: DateTimeUtc,
    pub lease_until: DateTimeUtc,
    /// A clean shutdown gave the lease back.
    pub ended_at: Option<DateTimeUtc>,
}

impl Model {
    /// Whether it holds its lease at `now`.
    pub fn holds_lease(&self, now: DateTimeUtc) -> bool {
        self.ended_at.is_none() && self.lease_until > now
    }
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
