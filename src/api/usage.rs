//! HTTP for what agents spent: the totals sessions and tasks carry, and a workspace's rollups.
use crate::ids::WorkspaceId;
use actix_web::{get, web};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use utoipa_actix_web::service_config::ServiceConfig;

use super::AppState;
use super::extract::{TasksRead, Unbound};
use super::problem::Problem;
use crate::domain::usage::{self, Totals};
use crate::error::Error;
use crate::store::usage::{GroupBy, Key};

pub fn routes(cfg: &mut ServiceConfig) {
    cfg.service(get_workspace_usage);
}

/// What agents reported their model calls used and cost.
#[derive(Debug, Serialize, ToSchema)]
pub struct Usage {
    /// Usage reports counted (Pi: one per assistant message; ACP: one per turn and one per step of
    /// the cost the agent reports).
    pub reports: u64,
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cache_read_tokens: u64,
    pub cache_write_tokens: u64,
    /// The cost per currency the agents named (Pi prices in `USD`); empty when none reported a cost.
    pub cost: Vec<Cost>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Cost {
    /// The code the agent gave (`USD`).
    pub currency: String,
    /// In the currency's unit, exact to a billionth.
    pub amount: f64,
}

impl From<&Totals> for Usage {
    fn from(t: &Totals) -> Self {
        Usage {
            reports: t.reports,
            input_tokens: t.input_tokens,
            output_tokens: t.output_tokens,
            cache_read_tokens: t.cache_read_tokens,
            cache_write_tokens: t.cache_write_tokens,
            cost: t
                .cost_nanos
                .iter()
                .map(|(currency, nanos)| Cost {
                    currency: currency.clone(),
                    amount: *nanos as f64 / 1e9,
                })
                .collect(),
        }
    }
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct UsageQuery {
    /// The start (RFC 3339, inclusive); default: 30 days before `to`.
    pub from: Option<DateTime<Utc>>,
    /// The end (RFC 3339, exclusive); default: now. At most 366 days after `from`.
    pub to: Option<DateTime<Utc>>,
    /// `day` (UTC, oldest first; the default), `task`, `model` or `agent_profile` (largest cost first).
    pub group_by: Option<UsageGroupBy>,
}

#[derive(Debug, Clone, Copy, Deserialize, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum UsageGroupBy {
    Day,
    Task,
    Model,
    AgentProfile,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct UsageGroup {
    /// The day (`YYYY-MM-DD`), the task's id, the model or the agent profile.
    pub key: String,
    pub usage: Usage,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct WorkspaceUsage {
    pub workspace_id: WorkspaceId,
    pub from: DateTime<Utc>,
    pub to: DateTime<Utc>,
    pub group_by: UsageGroupBy,
    /// Everything in the span, deleted sessions and tasks included.
    pub total: Usage,
    /// Only groups with reports.
    pub groups: Vec<UsageGroup>,
}

/// What a workspace's agents spent
///
/// Sums of every usage report the workspace's agents made in `[from, to)`, grouped by UTC day, task,
/// model or agent profile. Reports outlive their sessions and tasks: deleting a session deletes its
/// conversation, not the money it spent. Scope `tasks:read`.
#[utoipa::path(
    operation_id = "getWorkspaceUsage",
    tag = "workspaces",
    security(("bearer" = ["tasks:read"])),
    params(("id" = Uuid, Path, description = "Workspace id"), UsageQuery),
    responses(
        (status = 200, description = "The rollup", body = WorkspaceUsage),
        (status = 400, description = "A malformed time or an unknown `group_by` (`bad_request`)", body = Problem),
        (status = 404, description = "No such workspace (`not_found`)", body = Problem),
        (status = 422, description = "`from` not before `to`, or a span over 366 days (`validation_failed`)", body = Problem),
    )
)]
#[get("/workspaces/{id}/usage")]
async fn get_workspace_usage(
    auth: Unbound<TasksRead>,
    state: web::Data<AppState>,
    id: web::Path<WorkspaceId>,
    query: web::Query<UsageQuery>,
) -> Result<web::Json<WorkspaceUsage>, Error> {
    crate::domain::workspaces::get(&state.ctx, &auth, *id).await?;
    let q = query.into_inner();
    let group_by = q.group_by.unwrap_or(UsageGroupBy::Day);
    let by = match group_by {
        UsageGroupBy::Day => GroupBy::Day,
        UsageGroupBy::Task => GroupBy::Task,
        UsageGroupBy::Model => GroupBy::Model,
        UsageGroupBy::AgentProfile => GroupBy::AgentProfile,
    };
    let r = usage::rollup(&state.ctx, *id, q.from, q.to, by).await?;
    Ok(web::Json(WorkspaceUsage {
        workspace_id: *id,
        from: r.from,
        to: r.to,
        group_by,
        total: Usage::from(&r.total),
        groups: r
            .groups
            .iter()
            .map(|(key, t)| UsageGroup {
                key: match key {
                    Key::Task(id) => id.to_string(),
                    Key::Text(s) => s.clone(),
                },
                usage: Usage::from(t),
            })
            .collect(),
    }))
}
