//! What an import did, would do, or refused: the report printed as text or as one JSON object.
use crate::ids::{CleanupJobId, WorkspaceId};
use serde::Serialize;

use crate::entity::cleanup_job::{CleanupJobState, CleanupTrigger};

/// One kandev row that is history (superseded, deleted, orphaned: not imported as an owner) or that
/// refuses the import, with the ids and metadata a person needs to find it, and the rule that applied.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct Entry {
    pub rule: &'static str,
    /// The kandev table the row comes from.
    pub table: &'static str,
    /// The row's kandev id.
    pub id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub task_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub environment_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub worktree_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub repository_id: Option<String>,
    /// The repository's name, when known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub repository: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub branch: Option<String>,
    pub message: String,
}

impl Entry {
    pub fn new(rule: &'static str, table: &'static str, id: &str, message: impl Into<String>) -> Entry {
        Entry {
            rule,
            table,
            id: id.to_string(),
            message: message.into(),
            ..Default::default()
        }
    }
}

#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq, Eq)]
pub struct Counts {
    pub tasks: u64,
    pub environments: u64,
    pub worktrees: u64,
    pub sessions: u64,
    pub observations: u64,
}

impl Counts {
    pub fn is_zero(&self) -> bool {
        *self == Counts::default()
    }
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct Report {
    pub imported: Counts,
    pub history: Vec<Entry>,
    pub refused: Vec<Entry>,
    pub already_imported: bool,
    /// Extra fields: what the command saw and did.
    pub dry_run: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub generation: Option<super::model::Generation>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kandev_version: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub workspace_id: Option<WorkspaceId>,
    /// Transcript entries imported (not part of `imported`'s fixed shape).
    pub messages: u64,
    pub repositories: u64,
    /// kandev's cleanup work still owed, now berth cleanup jobs the worker runs.
    pub cleanup_jobs: Vec<CarriedJob>,
}

impl Report {
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a report serializes")
    }

    /// The human-readable form.
    pub fn to_text(&self) -> String {
        let mut out = String::new();
        let verb = if self.dry_run { "would import" } else { "imported" };
        let (rows, command): (Vec<&Entry>, Vec<&Entry>) = self.refused.iter().partition(|e| !e.id.is_empty());
        for e in command {
            out.push_str(&format!("refused [{}]: {}\n", e.rule, e.message));
        }
        if !rows.is_empty() {
            out.push_str(&format!(
                "refused: {} row(s) cannot be reconciled; nothing was {}\n",
                rows.len(),
                if self.dry_run { "changed (dry run)" } else { "imported" }
            ));
            for e in rows {
                out.push_str(&format!("  - {}\n", line(e)));
            }
        } else if self.refused.is_empty() && self.already_imported {
            out.push_str("already imported: this kandev database's rows are all in berth; nothing changed\n");
        } else if self.refused.is_empty() {
            let c = &self.imported;
            out.push_str(&format!(
                "{verb}: {} task(s), {} environment(s), {} worktree(s), {} session(s), {} git status observation(s), {} message(s), {} repository(ies)\n",
                c.tasks, c.environments, c.worktrees, c.sessions, c.observations, self.messages, self.repositories
            ));
        }
        if !self.cleanup_jobs.is_empty() {
            out.push_str(&format!(
                "cleanup kandev still owed, {} as berth cleanup job(s):\n",
                if self.dry_run {
                    "would be carried over"
                } else {
                    "carried over"
                }
            ));
            for j in &self.cleanup_jobs {
                let job = j.job_id.map(|id| format!(" as job {id}")).unwrap_or_default();
                out.push_str(&format!(
                    "  - kandev job(s) {} of task {}: {:?} {:?}{job}, removing {}{}\n",
                    j.kandev_ids.join(", "),
                    j.task_id,
                    j.trigger,
                    j.state,
                    if j.paths.is_empty() {
                        "no worktree".to_string()
                    } else {
                        j.paths.join(", ")
                    },
                    if j.discard_worktree_changes {
                        " (with kandev's consent to discard changes)"
                    } else {
                        ""
                    }
                ));
            }
        }
        if !self.history.is_empty() {
            out.push_str(&format!(
                "history ({} row(s) kept as evidence, not imported as owners; nothing on disk was touched):\n",
                self.history.len()
            ));
            for e in &self.history {
                out.push_str(&format!("  - {}\n", line(e)));
            }
        }
        out
    }
}

fn line(e: &Entry) -> String {
    let mut parts = vec![format!("[{}] {} {}", e.rule, e.table, e.id)];
    for (k, v) in [
        ("task", &e.task_id),
        ("session", &e.session_id),
        ("environment", &e.environment_id),
        ("worktree", &e.worktree_id),
        ("repository", &e.repository),
        ("path", &e.path),
        ("branch", &e.branch),
    ] {
        if let Some(v) = v {
            parts.push(format!("{k}={v}"));
        }
    }
    format!("{}: {}", parts.join(" "), e.message)
}

/// A kandev job berth took over, as the report shows it.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct CarriedJob {
    /// kandev's job ids (several of one task become one berth job).
    pub kandev_ids: Vec<String>,
    /// kandev's task id.
    pub task_id: String,
    /// berth's job (absent in a dry run, which writes none).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub job_id: Option<CleanupJobId>,
    pub trigger: CleanupTrigger,
    pub state: CleanupJobState,
    /// The worktrees the job removes.
    pub paths: Vec<String>,
    pub discard_worktree_changes: bool,
}
