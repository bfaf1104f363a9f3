//! Usage records: queries only. Sums are cast to BIGINT so that both databases answer an integer
//! (PostgreSQL's SUM of a BIGINT is a NUMERIC).
use crate::ids::{SessionId, TaskId, WorkspaceId};
use chrono::{DateTime, Utc};
use sea_orm::sea_query::Expr;
use sea_orm::{
    ColumnTrait, ConnectionTrait, EntityTrait, FromQueryResult, IdenStatic, QueryFilter, QueryOrder, QuerySelect,
    Select,
};

use crate::entity::usage_record as usage;
use crate::error::Result;

pub async fn insert<C: ConnectionTrait>(conn: &C, r: usage::Model) -> Result<()> {
    let am: usage::ActiveModel = r.into();
    usage::Entity::insert(am).exec_without_returning(conn).await?;
    Ok(())
}

/// The running total this session's agent reported last in `currency`, if it reports one.
pub async fn last_cumulative<C: ConnectionTrait>(
    conn: &C,
    session_id: SessionId,
    currency: &str,
) -> Result<Option<i64>> {
    Ok(usage::Entity::find()
        .filter(usage::Column::SessionId.eq(session_id))
        .filter(usage::Column::Currency.eq(currency))
        .filter(usage::Column::CumulativeCostNanos.is_not_null())
        .order_by_desc(usage::Column::Id)
        .one(conn)
        .await?
        .and_then(|r| r.cumulative_cost_nanos))
}

/// One group's sums in one currency (`None`: records without a cost).
#[derive(Debug, Clone, FromQueryResult)]
pub struct Sums {
    pub currency: Option<String>,
    pub records: i64,
    pub input_tokens: i64,
    pub output_tokens: i64,
    pub cache_read_tokens: i64,
    pub cache_write_tokens: i64,
    pub cost_nanos: Option<i64>,
}

#[derive(Debug, Clone, FromQueryResult)]
struct KeyedText {
    key: String,
    #[sea_orm(nested)]
    sums: Sums,
}

#[derive(Debug, Clone, FromQueryResult)]
struct KeyedTask {
    key: TaskId,
    #[sea_orm(nested)]
    sums: Sums,
}

/// What the rollups group by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupBy {
    Day,
    Task,
    Model,
    AgentProfile,
}

/// A group's key: a task's id, or a day, model or profile name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Key {
    Task(TaskId),
    Text(String),
}

fn summed(select: Select<usage::Entity>) -> Select<usage::Entity> {
    let sum = |c: usage::Column| Expr::cust(format!("CAST(SUM(\"{}\") AS BIGINT)", c.as_str()));
    select
        .column(usage::Column::Currency)
        .column_as(usage::Column::Id.count(), "records")
        .column_as(sum(usage::Column::InputTokens), "input_tokens")
        .column_as(sum(usage::Column::OutputTokens), "output_tokens")
        .column_as(sum(usage::Column::CacheReadTokens), "cache_read_tokens")
        .column_as(sum(usage::Column::CacheWriteTokens), "cache_write_tokens")
        .column_as(sum(usage::Column::CostNanos), "cost_nanos")
        .group_by(usage::Column::Currency)
}

/// The sums of a session's records, per currency.
pub async fn of_session<C: ConnectionTrait>(conn: &C, session_id: SessionId) -> Result<Vec<Sums>> {
    Ok(summed(usage::Entity::find().select_only())
        .filter(usage::Column::SessionId.eq(session_id))
        .into_model::<Sums>()
        .all(conn)
        .await?)
}

/// The sums of each of these tasks' records, per currency.
pub async fn of_tasks<C: ConnectionTrait>(conn: &C, task_ids: &[TaskId]) -> Result<Vec<(TaskId, Sums)>> {
    if task_ids.is_empty() {
        return Ok(Vec::new());
    }
    let rows = summed(
        usage::Entity::find()
            .select_only()
            .column_as(usage::Column::TaskId, "key"),
    )
    .filter(usage::Column::TaskId.is_in(task_ids.to_vec()))
    .group_by(usage::Column::TaskId)
    .into_model::<KeyedTask>()
    .all(conn)
    .await?;
    Ok(rows.into_iter().map(|r| (r.key, r.sums)).collect())
}

/// A workspace's records created in `[from, to)`, summed per group and currency.
pub async fn rollup<C: ConnectionTrait>(
    conn: &C,
    workspace_id: WorkspaceId,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
    group_by: GroupBy,
) -> Result<Vec<(Key, Sums)>> {
    let base = usage::Entity::find()
        .select_only()
        .filter(usage::Column::WorkspaceId.eq(workspace_id))
        .filter(usage::Column::CreatedAt.gte(from))
        .filter(usage::Column::CreatedAt.lt(to));
    if group_by == GroupBy::Task {
        let rows = summed(base.column_as(usage::Column::TaskId, "key"))
            .group_by(usage::Column::TaskId)
            .into_model::<KeyedTask>()
            .all(conn)
            .await?;
        return Ok(rows.into_iter().map(|r| (Key::Task(r.key), r.sums)).collect());
    }
    let column = match group_by {
        GroupBy::Day => usage::Column::Day,
        GroupBy::Model => usage::Column::Model,
        _ => usage::Column::AgentProfile,
    };
    let rows = summed(base.column_as(column, "key"))
        .group_by(column)
        .into_model::<KeyedText>()
        .all(conn)
        .await?;
    Ok(rows.into_iter().map(|r| (Key::Text(r.key), r.sums)).collect())
}
