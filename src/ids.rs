//! Typed ids: one newtype over a UUID per kind of row, so that a task's id cannot be passed where a
//! session's is meant. `mark_broken(ctx, task.id, owner, current.id, …)` with two ids swapped is a compile
//! error, not a bug found in production.
//!
//! Each id is what the rest of the house already understands a UUID as:
//! - sea-orm: a column value (`DeriveValueType`), a primary key (`TryFromU64`, which a UUID key never
//!   takes), a filter argument (`Into<Value>`);
//! - serde: the bare UUID string (`transparent`), so the wire format is unchanged;
//! - utoipa: `build.rs` declares each name below an alias of `Uuid`, so a schema shows
//!   `type: string, format: uuid` exactly as before (the spec test proves the document is unchanged).
//!
//! Adding one: add its name to the list at the bottom; `build.rs` reads this file for the alias list.
use std::fmt;
use std::str::FromStr;

use sea_orm::DeriveValueType;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

macro_rules! typed_ids {
    ($($(#[$doc:meta])* $name:ident,)*) => {$(
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, DeriveValueType)]
        #[serde(transparent)]
        pub struct $name(pub Uuid);

        impl $name {
            /// A fresh id, time-ordered (UUID v7) like every id berth makes.
            pub fn now_v7() -> Self {
                Self(Uuid::now_v7())
            }

            /// The UUID underneath, for the few places that speak bare UUIDs (tokens, import mapping).
            pub fn uuid(self) -> Uuid {
                self.0
            }
        }

        impl From<Uuid> for $name {
            fn from(id: Uuid) -> Self {
                Self(id)
            }
        }

        impl From<$name> for Uuid {
            fn from(id: $name) -> Uuid {
                id.0
            }
        }

        impl PartialEq<Uuid> for $name {
            fn eq(&self, other: &Uuid) -> bool {
                self.0 == *other
            }
        }

        impl PartialEq<$name> for Uuid {
            fn eq(&self, other: &$name) -> bool {
                *self == other.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.0.fmt(f)
            }
        }

        impl FromStr for $name {
            type Err = uuid::Error;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                Uuid::from_str(s).map(Self)
            }
        }

        impl sea_orm::TryFromU64 for $name {
            fn try_from_u64(_: u64) -> Result<Self, sea_orm::DbErr> {
                Err(sea_orm::DbErr::ConvertFromU64(stringify!($name)))
            }
        }
    )*};
}

typed_ids! {
    /// A workspace (`workspaces.id`).
    WorkspaceId,
    /// A repository registered in a workspace (`repositories.id`).
    RepositoryId,
    /// A task (`tasks.id`): the owner of environments and worktrees.
    TaskId,
    /// A task's environment (`task_environments.id`).
    EnvironmentId,
    /// One repository's worktree inside an environment (`task_environment_repos.id`).
    EnvironmentRepoId,
    /// A task's link to a repository (`task_repositories.id`).
    TaskRepositoryId,
    /// A session (`task_sessions.id`).
    SessionId,
    /// One run of an agent process for a session (`agent_executions.id`).
    ExecutionId,
    /// A cleanup job (`cleanup_jobs.id`).
    CleanupJobId,
    /// The task lifecycle operation a cleanup job belongs to (`cleanup_jobs.operation_id`).
    OperationId,
    /// A running berth process (`instances.id`).
    InstanceId,
    /// A workspace's board column (`workspace_columns.id`).
    ColumnId,
    /// A git checkpoint of an environment (`checkpoints.id`).
    CheckpointId,
    /// One turn of a session's conversation (`session_turns.id`).
    TurnId,
    /// A command sent to a session's agent (`session_commands.id`).
    CommandId,
    /// A message waiting in a session's inbox (`session_inbox.id`).
    InboxItemId,
    /// A git status observation (`git_status_observations.id`).
    ObservationId,
    /// A leftover found on disk (`leftovers.id`).
    LeftoverId,
    /// A branch berth made for a task (`task_branches.id`).
    TaskBranchId,
    /// A pull request opened for a task (`pull_requests.id`).
    PullRequestId,
    /// A review of a task's changes (`reviews.id`).
    ReviewId,
    /// A usage record (`usage_records.id`).
    UsageRecordId,
    /// A webhook subscription (`webhooks.id`).
    WebhookId,
    /// One delivery attempt of a webhook (`webhook_deliveries.id`).
    DeliveryId,
}

#[cfg(test)]
mod tests {
    use sea_orm::sea_query::{ColumnType, ValueType};

    use super::*;

    #[test]
    fn an_id_is_the_bare_uuid_on_the_wire() {
        let id = TaskId::now_v7();
        let text = serde_json::to_string(&id).unwrap();
        assert_eq!(text, serde_json::to_string(&id.uuid()).unwrap());
        assert_eq!(serde_json::from_str::<TaskId>(&text).unwrap(), id);
        assert_eq!(id.to_string().parse::<TaskId>().unwrap(), id);
        assert!("not-a-uuid".parse::<SessionId>().is_err());
    }

    #[test]
    fn an_id_is_a_uuid_column_and_value() {
        assert_eq!(EnvironmentId::column_type(), ColumnType::Uuid);
        let id = EnvironmentId::now_v7();
        assert_eq!(sea_orm::Value::from(id), sea_orm::Value::from(id.uuid()));
    }

    #[test]
    fn a_uuid_key_is_never_made_from_a_number() {
        assert!(<CleanupJobId as sea_orm::TryFromU64>::try_from_u64(7).is_err());
    }
}
