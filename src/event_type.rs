//! The vocabulary of the event log (`docs/api.md` "Events"): what `events::append` takes and what the
//! spec's `Event.type` lists. Stored as today's strings (no data migration).
use sea_orm::entity::prelude::*;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, EnumIter, DeriveActiveEnum, Serialize, Deserialize, ToSchema)]
#[sea_orm(rs_type = "String", db_type = "Text")]
pub enum EventType {
    #[sea_orm(string_value = "workspace.created")]
    #[serde(rename = "workspace.created")]
    WorkspaceCreated,
    #[sea_orm(string_value = "workspace.deleted")]
    #[serde(rename = "workspace.deleted")]
    WorkspaceDeleted,
    #[sea_orm(string_value = "workspace.columns_changed")]
    #[serde(rename = "workspace.columns_changed")]
    WorkspaceColumnsChanged,
    #[sea_orm(string_value = "repository.created")]
    #[serde(rename = "repository.created")]
    RepositoryCreated,
    #[sea_orm(string_value = "repository.deleted")]
    #[serde(rename = "repository.deleted")]
    RepositoryDeleted,
    #[sea_orm(string_value = "task.created")]
    #[serde(rename = "task.created")]
    TaskCreated,
    #[sea_orm(string_value = "task.updated")]
    #[serde(rename = "task.updated")]
    TaskUpdated,
    #[sea_orm(string_value = "task.archived")]
    #[serde(rename = "task.archived")]
    TaskArchived,
    #[sea_orm(string_value = "task.unarchived")]
    #[serde(rename = "task.unarchived")]
    TaskUnarchived,
    #[sea_orm(string_value = "task.deleted")]
    #[serde(rename = "task.deleted")]
    TaskDeleted,
    #[sea_orm(string_value = "environment.created")]
    #[serde(rename = "environment.created")]
    EnvironmentCreated,
    #[sea_orm(string_value = "environment.ready")]
    #[serde(rename = "environment.ready")]
    EnvironmentReady,
    #[sea_orm(string_value = "environment.failed")]
    #[serde(rename = "environment.failed")]
    EnvironmentFailed,
    /// One repository's step while an environment is materialized (`data`: `repository_id`, `stage`).
    #[sea_orm(string_value = "environment.progress")]
    #[serde(rename = "environment.progress")]
    EnvironmentProgress,
    #[sea_orm(string_value = "environment.superseded")]
    #[serde(rename = "environment.superseded")]
    EnvironmentSuperseded,
    #[sea_orm(string_value = "environment.reset")]
    #[serde(rename = "environment.reset")]
    EnvironmentReset,
    /// Admission found the environment's workspace unsafe (issue 17 item 6).
    #[sea_orm(string_value = "environment.broken")]
    #[serde(rename = "environment.broken")]
    EnvironmentBroken,
    /// Its node was decommissioned (issue 39 item 3).
    #[sea_orm(string_value = "environment.lost")]
    #[serde(rename = "environment.lost")]
    EnvironmentLost,
    #[sea_orm(string_value = "environment.restored")]
    #[serde(rename = "environment.restored")]
    EnvironmentRestored,
    /// A review of an environment's diff (issue 40 item 3).
    #[sea_orm(string_value = "review.created")]
    #[serde(rename = "review.created")]
    ReviewCreated,
    /// Issue 41: work landed.
    #[sea_orm(string_value = "environment.committed")]
    #[serde(rename = "environment.committed")]
    EnvironmentCommitted,
    #[sea_orm(string_value = "environment.merged")]
    #[serde(rename = "environment.merged")]
    EnvironmentMerged,
    #[sea_orm(string_value = "environment.pushed")]
    #[serde(rename = "environment.pushed")]
    EnvironmentPushed,
    #[sea_orm(string_value = "pull_request.updated")]
    #[serde(rename = "pull_request.updated")]
    PullRequestUpdated,
    #[sea_orm(string_value = "session.created")]
    #[serde(rename = "session.created")]
    SessionCreated,
    #[sea_orm(string_value = "session.state_changed")]
    #[serde(rename = "session.state_changed")]
    SessionStateChanged,
    #[sea_orm(string_value = "session.deleted")]
    #[serde(rename = "session.deleted")]
    SessionDeleted,
    #[sea_orm(string_value = "session.primary_changed")]
    #[serde(rename = "session.primary_changed")]
    SessionPrimaryChanged,
    #[sea_orm(string_value = "session.message_updated")]
    #[serde(rename = "session.message_updated")]
    SessionMessageUpdated,
    #[sea_orm(string_value = "session.egress_refused")]
    #[serde(rename = "session.egress_refused")]
    SessionEgressRefused,
    #[sea_orm(string_value = "runtime.output")]
    #[serde(rename = "runtime.output")]
    RuntimeOutput,
    #[sea_orm(string_value = "git_status.updated")]
    #[serde(rename = "git_status.updated")]
    GitStatusUpdated,
    #[sea_orm(string_value = "cleanup_job.updated")]
    #[serde(rename = "cleanup_job.updated")]
    CleanupJobUpdated,
    #[sea_orm(string_value = "webhook.disabled")]
    #[serde(rename = "webhook.disabled")]
    WebhookDisabled,
    /// A subscription fell too far behind: retention no longer keeps events for it.
    #[sea_orm(string_value = "webhook.lagging")]
    #[serde(rename = "webhook.lagging")]
    WebhookLagging,
    /// A subscription resumed past events retention took before it delivered them.
    #[sea_orm(string_value = "webhook.skipped")]
    #[serde(rename = "webhook.skipped")]
    WebhookSkipped,
}

impl EventType {
    /// The stored and serialized name, e.g. `session.state_changed`.
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::WorkspaceCreated => "workspace.created",
            EventType::WorkspaceDeleted => "workspace.deleted",
            EventType::WorkspaceColumnsChanged => "workspace.columns_changed",
            EventType::RepositoryCreated => "repository.created",
            EventType::RepositoryDeleted => "repository.deleted",
            EventType::TaskCreated => "task.created",
            EventType::TaskUpdated => "task.updated",
            EventType::TaskArchived => "task.archived",
            EventType::TaskUnarchived => "task.unarchived",
            EventType::TaskDeleted => "task.deleted",
            EventType::EnvironmentCreated => "environment.created",
            EventType::EnvironmentReady => "environment.ready",
            EventType::EnvironmentFailed => "environment.failed",
            EventType::EnvironmentProgress => "environment.progress",
            EventType::EnvironmentSuperseded => "environment.superseded",
            EventType::EnvironmentReset => "environment.reset",
            EventType::EnvironmentBroken => "environment.broken",
            EventType::EnvironmentLost => "environment.lost",
            EventType::EnvironmentRestored => "environment.restored",
            EventType::ReviewCreated => "review.created",
            EventType::EnvironmentCommitted => "environment.committed",
            EventType::EnvironmentMerged => "environment.merged",
            EventType::EnvironmentPushed => "environment.pushed",
            EventType::PullRequestUpdated => "pull_request.updated",
            EventType::SessionCreated => "session.created",
            EventType::SessionStateChanged => "session.state_changed",
            EventType::SessionDeleted => "session.deleted",
            EventType::SessionPrimaryChanged => "session.primary_changed",
            EventType::SessionMessageUpdated => "session.message_updated",
            EventType::SessionEgressRefused => "session.egress_refused",
            EventType::RuntimeOutput => "runtime.output",
            EventType::GitStatusUpdated => "git_status.updated",
            EventType::CleanupJobUpdated => "cleanup_job.updated",
            EventType::WebhookDisabled => "webhook.disabled",
            EventType::WebhookLagging => "webhook.lagging",
            EventType::WebhookSkipped => "webhook.skipped",
        }
    }
}

impl std::fmt::Display for EventType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sea_orm::Iterable;

    #[test]
    fn stored_serialized_and_displayed_names_agree() {
        for t in EventType::iter() {
            assert_eq!(t.to_value(), t.as_str());
            assert_eq!(serde_json::to_value(t).unwrap(), t.as_str());
            assert_eq!(EventType::try_from_value(&t.as_str().to_string()).unwrap(), t);
        }
    }
}
