use sea_orm::entity::prelude::*;

/// `in_progress` while the first request runs; `done` once its answer is stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, EnumIter, DeriveActiveEnum)]
#[sea_orm(rs_type = "String", db_type = "Text")]
pub enum KeyState {
    #[sea_orm(string_value = "in_progress")]
    InProgress,
    #[sea_orm(string_value = "done")]
    Done,
}

/// The first answer to a request sent with an `Idempotency-Key`, per token subject and key.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "idempotency_keys")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub subject: String,
    #[sea_orm(primary_key, auto_increment = false)]
    pub key: String,
    /// SHA-256 (hex) of method, path, query and body.
    pub fingerprint: String,
    pub state: KeyState,
    pub response_status: Option<i32>,
    pub response_content_type: Option<String>,
    pub response_body: Option<Vec<u8>>,
    pub response_location: Option<String>,
    pub response_etag: Option<String>,
    pub claim_id: Uuid,
    pub created_at: DateTimeUtc,
    pub expires_at: DateTimeUtc,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
