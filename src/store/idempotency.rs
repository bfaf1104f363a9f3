//! Stored answers for `Idempotency-Key` (`idempotency_keys`): claimed by an INSERT whose primary key
//! (subject, key) decides between concurrent requests, on one replica or several.
use chrono::{DateTime, Utc};
use sea_orm::sea_query::{Expr, OnConflict};
use sea_orm::{ActiveValue::Set, ColumnTrait, ConnectionTrait, EntityTrait, QueryFilter};
use uuid::Uuid;

use crate::entity::idempotency_key::{self as key, KeyState};
use crate::error::Result;

/// The answer kept for replay.
#[derive(Debug, Clone)]
pub struct StoredResponse {
    pub status: u16,
    pub content_type: Option<String>,
    pub body: Vec<u8>,
    pub location: Option<String>,
    pub etag: Option<String>,
}

impl key::Model {
    pub fn response(&self) -> Option<StoredResponse> {
        (self.state == KeyState::Done).then(|| StoredResponse {
            status: self.response_status.unwrap_or(200) as u16,
            content_type: self.response_content_type.clone(),
            body: self.response_body.clone().unwrap_or_default(),
            location: self.response_location.clone(),
            etag: self.response_etag.clone(),
        })
    }
}

/// Takes the key for a new request; `false` when a row for (subject, key) exists already.
pub async fn claim<C: ConnectionTrait>(
    conn: &C,
    subject: &str,
    idempotency_key: &str,
    fingerprint: &str,
    claim_id: Uuid,
    now: DateTime<Utc>,
    ttl: chrono::Duration,
) -> Result<bool> {
    let inserted = key::Entity::insert(key::ActiveModel {
        subject: Set(subject.to_string()),
        key: Set(idempotency_key.to_string()),
        fingerprint: Set(fingerprint.to_string()),
        state: Set(KeyState::InProgress),
        response_status: Set(None),
        response_content_type: Set(None),
        response_body: Set(None),
        response_location: Set(None),
        response_etag: Set(None),
        claim_id: Set(claim_id),
        created_at: Set(now),
        expires_at: Set(now + ttl),
    })
    .on_conflict(
        OnConflict::columns([key::Column::Subject, key::Column::Key])
            .do_nothing()
            .to_owned(),
    )
    .exec_without_returning(conn)
    .await?;
    Ok(inserted == 1)
}

pub async fn find<C: ConnectionTrait>(conn: &C, subject: &str, idempotency_key: &str) -> Result<Option<key::Model>> {
    Ok(super::by_key(
        key::Entity::find_by_id((subject.to_string(), idempotency_key.to_string())),
        conn,
    )
    .await?)
}

/// Takes over a row that is expired, or a claim left in progress by a process that never finished it
/// (compare-and-set on the claim seen: of two requests taking over, one wins).
pub async fn take_over<C: ConnectionTrait>(
    conn: &C,
    seen: &key::Model,
    fingerprint: &str,
    claim_id: Uuid,
    now: DateTime<Utc>,
    ttl: chrono::Duration,
) -> Result<bool> {
    let res = key::Entity::update_many()
        .col_expr(key::Column::Fingerprint, Expr::value(fingerprint))
        .col_expr(key::Column::State, Expr::value(KeyState::InProgress))
        .col_expr(key::Column::ResponseStatus, Expr::value(Option::<i32>::None))
        .col_expr(key::Column::ResponseContentType, Expr::value(Option::<String>::None))
        .col_expr(key::Column::ResponseBody, Expr::value(Option::<Vec<u8>>::None))
        .col_expr(key::Column::ResponseLocation, Expr::value(Option::<String>::None))
        .col_expr(key::Column::ResponseEtag, Expr::value(Option::<String>::None))
        .col_expr(key::Column::ClaimId, Expr::value(claim_id))
        .col_expr(key::Column::CreatedAt, Expr::value(now))
        .col_expr(key::Column::ExpiresAt, Expr::value(now + ttl))
        .filter(key::Column::Subject.eq(seen.subject.as_str()))
        .filter(key::Column::Key.eq(seen.key.as_str()))
        .filter(key::Column::ClaimId.eq(seen.claim_id))
        .exec(conn)
        .await?;
    Ok(res.rows_affected == 1)
}

/// Stores the answer of the claim that holds the row.
pub async fn finish<C: ConnectionTrait>(
    conn: &C,
    subject: &str,
    idempotency_key: &str,
    claim_id: Uuid,
    response: &StoredResponse,
) -> Result<()> {
    key::Entity::update_many()
        .col_expr(key::Column::State, Expr::value(KeyState::Done))
        .col_expr(key::Column::ResponseStatus, Expr::value(response.status as i32))
        .col_expr(
            key::Column::ResponseContentType,
            Expr::value(response.content_type.clone()),
        )
        .col_expr(key::Column::ResponseBody, Expr::value(response.body.clone()))
        .col_expr(key::Column::ResponseLocation, Expr::value(response.location.clone()))
        .col_expr(key::Column::ResponseEtag, Expr::value(response.etag.clone()))
        .filter(key::Column::Subject.eq(subject))
        .filter(key::Column::Key.eq(idempotency_key))
        .filter(key::Column::ClaimId.eq(claim_id))
        .exec(conn)
        .await?;
    Ok(())
}

/// Gives the key back (the request changed nothing, so a retry runs it again).
pub async fn release<C: ConnectionTrait>(conn: &C, subject: &str, idempotency_key: &str, claim_id: Uuid) -> Result<()> {
    key::Entity::delete_many()
        .filter(key::Column::Subject.eq(subject))
        .filter(key::Column::Key.eq(idempotency_key))
        .filter(key::Column::ClaimId.eq(claim_id))
        .exec(conn)
        .await?;
    Ok(())
}

/// Deletes rows past their 24 hours.
pub async fn purge_expired<C: ConnectionTrait>(conn: &C, now: DateTime<Utc>) -> Result<u64> {
    Ok(key::Entity::delete_many()
        .filter(key::Column::ExpiresAt.lt(now))
        .exec(conn)
        .await?
        .rows_affected)
}
