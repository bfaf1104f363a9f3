//! The scopes a token may carry. A leaf: the error type names them.
use std::str::FromStr;

/// The scopes of `docs/api.md`. `admin` implies every other.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Scope {
    WorkspacesAdmin,
    TasksRead,
    TasksWrite,
    /// Landing: merge, push, pull requests (a change outside the task's own branch).
    TasksLand,
    TasksArchive,
    TasksDelete,
    SessionsRead,
    SessionsWrite,
    SessionsDelete,
    CleanupRead,
    CleanupAdmin,
    EventsRead,
    /// Webhook subscriptions.
    WebhooksWrite,
    Admin,
}

impl Scope {
    pub const ALL: [Scope; 14] = [
        Scope::WorkspacesAdmin,
        Scope::TasksRead,
        Scope::TasksWrite,
        Scope::TasksLand,
        Scope::TasksArchive,
        Scope::TasksDelete,
        Scope::SessionsRead,
        Scope::SessionsWrite,
        Scope::SessionsDelete,
        Scope::CleanupRead,
        Scope::CleanupAdmin,
        Scope::EventsRead,
        Scope::WebhooksWrite,
        Scope::Admin,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Scope::WorkspacesAdmin => "workspaces:admin",
            Scope::TasksRead => "tasks:read",
            Scope::TasksWrite => "tasks:write",
            Scope::TasksLand => "tasks:land",
            Scope::TasksArchive => "tasks:archive",
            Scope::TasksDelete => "tasks:delete",
            Scope::SessionsRead => "sessions:read",
            Scope::SessionsWrite => "sessions:write",
            Scope::SessionsDelete => "sessions:delete",
            Scope::CleanupRead => "cleanup:read",
            Scope::CleanupAdmin => "cleanup:admin",
            Scope::EventsRead => "events:read",
            Scope::WebhooksWrite => "webhooks:write",
            Scope::Admin => "admin",
        }
    }
}

impl std::fmt::Display for Scope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Scope {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        Scope::ALL
            .into_iter()
            .find(|scope| scope.as_str() == s)
            .ok_or_else(|| format!("unknown scope {s:?}"))
    }
}
