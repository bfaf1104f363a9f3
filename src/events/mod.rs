//! Events (decision 6, I32): appended in the same transaction as the change they report, so an event
//! exists if and only if its change committed. `seq` comes from the one-row `event_sequence` counter,
//! whose row lock (PostgreSQL) or the writer lock (SQLite) makes seq order equal commit order.
use sea_orm::{
    ActiveValue::Set, ConnectionTrait, DatabaseTransaction, DbErr, EntityTrait, Statement,
};
use uuid::Uuid;

use crate::entity::event;

/// What an event is about; the ids let streams filter by workspace and session.
#[derive(Debug, Default, Clone)]
pub struct Subject {
    pub workspace_id: Option<Uuid>,
    pub task_id: Option<Uuid>,
    pub session_id: Option<Uuid>,
    pub task_environment_id: Option<Uuid>,
    pub execution_id: Option<Uuid>,
}

impl Subject {
    pub fn workspace(id: Uuid) -> Self {
        Subject {
            workspace_id: Some(id),
            ..Default::default()
        }
    }
    pub fn task(workspace_id: Uuid, task_id: Uuid) -> Self {
        Subject {
            workspace_id: Some(workspace_id),
            task_id: Some(task_id),
            ..Default::default()
        }
    }
}

/// Appends one event inside `txn` and returns its seq.
pub async fn append(
    txn: &DatabaseTransaction,
    instance_id: Uuid,
    event_type: &str,
    subject: Subject,
    data: serde_json::Value,
) -> Result<i64, DbErr> {
    let backend = txn.get_database_backend();
    let row = txn
        .query_one_raw(Statement::from_string(
            backend,
            "UPDATE event_sequence SET last_seq = last_seq + 1 WHERE id = 1 RETURNING last_seq",
        ))
        .await?
        .ok_or_else(|| DbErr::Custom("event_sequence has no row".into()))?;
    let seq: i64 = row.try_get("", "last_seq")?;
    event::Entity::insert(event::ActiveModel {
        seq: Set(seq),
        instance_id: Set(instance_id),
        event_type: Set(event_type.to_string()),
        workspace_id: Set(subject.workspace_id),
        task_id: Set(subject.task_id),
        session_id: Set(subject.session_id),
        task_environment_id: Set(subject.task_environment_id),
        execution_id: Set(subject.execution_id),
        data: Set(data),
        created_at: Set(crate::domain::now()),
    })
    .exec_without_returning(txn)
    .await?;
    Ok(seq)
}
