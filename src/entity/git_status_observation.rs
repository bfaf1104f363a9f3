use crate::ids::{EnvironmentId, ObservationId, RepositoryId, SessionId};
use sea_orm::entity::prelude::*;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// Where an observation came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, EnumIter, DeriveActiveEnum, Serialize, Deserialize, ToSchema)]
#[sea_orm(rs_type = "String", db_type = "Text")]
#[serde(rename_all = "snake_case")]
pub enum ObservationKind {
    #[sea_orm(string_value = "live")]
    Live,
    #[sea_orm(string_value = "completion")]
    Completion,
    #[sea_orm(string_value = "archive")]
    Archive,
}

/// The kinds a monitor may report.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ReportedKind {
    Live,
    Completion,
}

impl ReportedKind {
    /// The wire value, checked where today's rules check it (after the environment is found).
    pub fn parse(raw: &str) -> Option<ReportedKind> {
        match raw {
            "live" => Some(ReportedKind::Live),
            "completion" => Some(ReportedKind::Completion),
            _ => None,
        }
    }
}

impl From<ReportedKind> for ObservationKind {
    fn from(k: ReportedKind) -> Self {
        match k {
            ReportedKind::Live => ObservationKind::Live,
            ReportedKind::Completion => ObservationKind::Completion,
        }
    }
}

/// I21: keyed by environment and repository; the session is nullable provenance.
#[derive(Clone, Debug, PartialEq, DeriveEntityModel)]
#[sea_orm(table_name = "git_status_observations")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: ObservationId,
    pub task_environment_id: EnvironmentId,
    pub repository_id: RepositoryId,
    pub session_id: Option<SessionId>,
    pub kind: ObservationKind,
    pub observed_at: DateTimeUtc,
    pub branch: Option<String>,
    pub head_commit: Option<String>,
    pub upstream: Option<String>,
    pub ahead: i32,
    pub behind: i32,
    /// `Vec<crate::git::status::FileStatus>` as JSON.
    pub files: Json,
    pub created_at: DateTimeUtc,
    /// The kandev id this row was imported from (`berth import kandev`); null for rows berth made.
    pub imported_from: Option<String>,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_monitor_reports_live_or_completion_only() {
        assert_eq!(
            ReportedKind::parse("live").map(ObservationKind::from),
            Some(ObservationKind::Live)
        );
        assert_eq!(
            ReportedKind::parse("completion").map(ObservationKind::from),
            Some(ObservationKind::Completion)
        );
        assert_eq!(ReportedKind::parse("archive"), None);
        assert_eq!(ReportedKind::parse("Live"), None);
    }
}
