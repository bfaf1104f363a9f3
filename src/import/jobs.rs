//! kandev's pending cleanup work (`task_resource_cleanup_jobs`, docs/kandev-schema.md §4) becomes berth's:
//! what kandev still owed (a job not finished, whose archive or delete did happen) is planned as one berth
//! cleanup job per task, naming the worktrees kandev's snapshot named; the worker then does the work.
//! Everything else is history with its reason. Pure: kandev's rows in, plan and report entries out.
use std::collections::HashSet;

use serde_json::Value;

use crate::entity::cleanup_job::{CleanupJobState, CleanupTrigger};
use crate::entity::task_environment_repo::EnvironmentRepoStatus;

use super::model::{CleanupJob, Source, Task};
use super::plan::{JobWorktree, Plan, PlannedJob};
use super::report::Entry;

const TABLE: &str = "task_resource_cleanup_jobs";

/// Which of kandev's jobs berth takes over, and what is history and why. `plan` must already hold the
/// tasks and environments (an archived task's worktrees no job names are reported too).
pub fn plan(src: &Source, plan: &Plan) -> (Vec<PlannedJob>, Vec<Entry>) {
    let mut history = Vec::new();
    let mut owed: Vec<PlannedJob> = Vec::new();
    let mut ordered: Vec<&CleanupJob> = src.cleanup_jobs.iter().collect();
    ordered.sort_by(|a, b| (a.created_at, &a.id).cmp(&(b.created_at, &b.id)));
    for j in ordered {
        match decide(src, j) {
            Ok(job) => merge(&mut owed, job),
            Err(entry) => history.push(*entry),
        }
    }
    history.extend(archived_without_job(plan, &owed));
    (owed, history)
}

/// What one kandev job becomes: a berth job, or a history entry saying why not.
fn decide(src: &Source, j: &CleanupJob) -> Result<PlannedJob, Box<Entry>> {
    let entry = |rule: &'static str, message: String| {
        Box::new(Entry {
            task_id: j.task_id.clone(),
            ..Entry::new(rule, TABLE, &j.id, message)
        })
    };
    if j.trigger == "session_delete" {
        return Err(entry(
            "session_delete_job_dropped",
            "a session delete never cleans anything up (seed 001)".into(),
        ));
    }
    let state = j.state.as_deref().unwrap_or("pending");
    let berth_state = match state {
        "succeeded" | "cancelled" => {
            return Err(entry(
                "cleanup_job_finished",
                format!("kandev's job is {state}: nothing is owed"),
            ));
        }
        "pending" | "running" | "retry_wait" | "prepared" => CleanupJobState::Pending,
        "failed" => CleanupJobState::Failed,
        other => return Err(entry("cleanup_job_not_carried", format!("unknown state {other:?}"))),
    };
    let Some(task_id) = j.task_id.clone() else {
        return Err(entry("cleanup_job_not_carried", "it names no task".into()));
    };
    let task: Option<&Task> = src.tasks.iter().find(|t| t.id == task_id);
    let not_committed = |what: &str| {
        if state == "prepared" {
            entry(
                "cleanup_job_not_committed",
                format!("kandev's {what} did not commit (the job was only prepared); kandev cancels such a job"),
            )
        } else {
            entry(
                "cleanup_job_reason_gone",
                format!("the task is not {what}d in kandev; its worktrees stay the task's"),
            )
        }
    };
    let trigger = match (j.trigger.as_str(), task) {
        ("archive", _) => CleanupTrigger::Archive,
        ("cascade_archive", _) => CleanupTrigger::CascadeArchive,
        ("reconcile", Some(_)) => CleanupTrigger::Archive,
        ("reconcile", None) | ("delete", None) => CleanupTrigger::Delete,
        ("cascade_delete", None) => CleanupTrigger::CascadeDelete,
        ("workspace_delete", None) => CleanupTrigger::WorkspaceDelete,
        ("quick_chat_expire", None) => CleanupTrigger::QuickChatExpire,
        ("delete" | "cascade_delete" | "workspace_delete" | "quick_chat_expire", Some(_)) => {
            return Err(not_committed("delete"));
        }
        (other, _) => return Err(entry("cleanup_job_not_carried", format!("unknown trigger {other:?}"))),
    };
    // An archive job of a live task: the task was unarchived, or the archive never committed.
    if trigger.is_archive() && task.is_some_and(|t| t.archived_at.is_none()) {
        return Err(not_committed("archive"));
    }
    Ok(PlannedJob {
        ids: vec![j.id.clone()],
        task_id,
        trigger,
        state: berth_state,
        last_error: j.last_error.clone(),
        worktrees: worktrees_of(&j.snapshot),
        discard_worktree_changes: j.snapshot["discard_worktree_changes"].as_bool() == Some(true),
    })
}

/// One active job per task: a later owed job of the same task joins the earlier one (its worktrees, a
/// delete's trigger over an archive's; consent only if every one of them gave it).
fn merge(owed: &mut Vec<PlannedJob>, job: PlannedJob) {
    let into = owed
        .iter_mut()
        .find(|o| o.state == CleanupJobState::Pending && job.state == o.state && o.task_id == job.task_id);
    let Some(o) = into else {
        owed.push(job);
        return;
    };
    o.ids.extend(job.ids);
    if o.trigger.is_archive() || !job.trigger.is_archive() {
        o.trigger = job.trigger;
    }
    o.discard_worktree_changes &= job.discard_worktree_changes;
    for w in job.worktrees {
        if !o.worktrees.iter().any(|x| x.path == w.path) {
            o.worktrees.push(w);
        }
    }
}

/// The worktrees a kandev job snapshot names (`worktrees[]`, and an older snapshot's flat
/// `task_environment.worktree_path`), without those it records as already deleted.
fn worktrees_of(snapshot: &Value) -> Vec<JobWorktree> {
    let s = |v: &Value, k: &str| v[k].as_str().filter(|x| !x.is_empty()).map(str::to_string);
    let mut out: Vec<JobWorktree> = Vec::new();
    let listed = snapshot["worktrees"].as_array().cloned().unwrap_or_default();
    let env = &snapshot["task_environment"];
    let flat = (!env.is_null()).then(|| {
        serde_json::json!({
            "repository_id": env["repository_id"], "path": env["worktree_path"], "branch": env["worktree_branch"],
        })
    });
    for w in listed.iter().chain(flat.iter()) {
        let deleted = w["status"].as_str() == Some("deleted") || !w["deleted_at"].is_null();
        let Some(path) = s(w, "path") else { continue };
        if deleted || out.iter().any(|o| o.path == path) {
            continue;
        }
        out.push(JobWorktree {
            repository_id: s(w, "repository_id").unwrap_or_default(),
            path,
            branch: s(w, "branch"),
            base_branch: s(w, "base_branch"),
        });
    }
    out
}

/// An archived task's worktrees that kandev kept (no job owed their removal): berth keeps them too, and
/// says so, so nothing on disk goes unmentioned.
fn archived_without_job(plan: &Plan, owed: &[PlannedJob]) -> Vec<Entry> {
    let covered: HashSet<&str> = owed.iter().map(|j| j.task_id.as_str()).collect();
    let mut out = Vec::new();
    for t in plan.tasks.iter().filter(|t| t.archived_at.is_some()) {
        if covered.contains(t.id.as_str()) {
            continue;
        }
        for e in plan.environments.iter().filter(|e| e.task_id == t.id) {
            for r in e
                .rows
                .iter()
                .filter(|r| r.is_worktree() && r.status == EnvironmentRepoStatus::Active)
            {
                out.push(Entry {
                    task_id: Some(t.id.clone()),
                    environment_id: Some(e.key.clone()),
                    worktree_id: Some(r.key.clone()),
                    repository_id: Some(r.repository_id.clone()),
                    path: r.worktree_path.clone(),
                    branch: r.worktree_branch.clone(),
                    ..Entry::new(
                        "archived_task_worktree_kept",
                        "task_environment_repos",
                        &r.key,
                        "kandev archived the task and owed no cleanup of this worktree: it stays on disk as the \
                         archived task's (a task delete removes it)",
                    )
                });
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use chrono::{TimeZone, Utc};
    use serde_json::json;

    use super::*;
    use crate::import::model::Ts;

    fn at(day: u32) -> Ts {
        Utc.with_ymd_and_hms(2026, 8, day, 10, 0, 0).unwrap()
    }

    fn task(id: &str, archived: bool) -> Task {
        Task {
            id: id.into(),
            title: id.into(),
            description: None,
            parent_id: None,
            ephemeral: false,
            archived_at: archived.then(|| at(3)),
            workspace_mode: None,
            created_at: at(1),
            updated_at: at(2),
        }
    }

    fn job(id: &str, task: &str, trigger: &str, state: &str, snapshot: Value, day: u32) -> CleanupJob {
        CleanupJob {
            id: id.into(),
            task_id: Some(task.into()),
            trigger: trigger.into(),
            state: Some(state.into()),
            snapshot,
            last_error: (state == "failed").then(|| "worktree is busy".into()),
            created_at: at(day),
        }
    }

    fn wt(path: &str) -> Value {
        json!({"id": format!("wt{path}"), "repository_id": "r1", "path": path, "branch": "feature/x",
               "base_branch": "main", "status": "active"})
    }

    #[test]
    fn what_kandev_still_owed_is_carried_and_the_rest_is_history_with_its_reason() {
        let src = Source {
            tasks: vec![task("archived", true), task("live", false)],
            cleanup_jobs: vec![
                job(
                    "a1",
                    "archived",
                    "archive",
                    "pending",
                    json!({"worktrees": [wt("/k/a")]}),
                    4,
                ),
                job(
                    "d1",
                    "gone",
                    "delete",
                    "retry_wait",
                    json!({"worktrees": [wt("/k/d"), {"path": "/k/old", "status": "deleted"}],
                           "discard_worktree_changes": true}),
                    4,
                ),
                job(
                    "f1",
                    "gone-too",
                    "cascade_delete",
                    "failed",
                    json!({"worktrees": [wt("/k/f")]}),
                    4,
                ),
                job("ok", "archived", "archive", "succeeded", json!({}), 2),
                job("p1", "live", "delete", "prepared", json!({}), 4),
                job("un", "live", "archive", "pending", json!({}), 4),
                job("sd", "live", "session_delete", "pending", json!({}), 4),
                job(
                    "rc",
                    "gone",
                    "reconcile",
                    "pending",
                    json!({"worktrees": [wt("/k/r")]}),
                    5,
                ),
            ],
            ..Default::default()
        };
        let (jobs, history) = plan(&src, &Plan::default());
        let rules: Vec<(&str, &str)> = history.iter().map(|e| (e.rule, e.id.as_str())).collect();
        assert_eq!(
            rules,
            vec![
                ("cleanup_job_finished", "ok"),
                ("cleanup_job_not_committed", "p1"),
                ("session_delete_job_dropped", "sd"),
                ("cleanup_job_reason_gone", "un"),
            ]
        );
        let summary: Vec<_> = jobs
            .iter()
            .map(|j| {
                (
                    j.ids.clone(),
                    j.trigger,
                    j.state,
                    j.worktrees.len(),
                    j.discard_worktree_changes,
                )
            })
            .collect();
        assert_eq!(
            summary,
            vec![
                (
                    vec!["a1".to_string()],
                    CleanupTrigger::Archive,
                    CleanupJobState::Pending,
                    1,
                    false
                ),
                // A later reconcile of the same deleted task joins its delete: one active job per task.
                (
                    vec!["d1".to_string(), "rc".to_string()],
                    CleanupTrigger::Delete,
                    CleanupJobState::Pending,
                    2,
                    false
                ),
                (
                    vec!["f1".to_string()],
                    CleanupTrigger::CascadeDelete,
                    CleanupJobState::Failed,
                    1,
                    false
                ),
            ]
        );
        assert_eq!(
            jobs[1].worktrees[0].path, "/k/d",
            "a deleted worktree is not named again"
        );
        assert_eq!(jobs[2].last_error.as_deref(), Some("worktree is busy"));
    }

    #[test]
    fn an_older_snapshot_names_its_worktree_in_the_flat_environment_fields() {
        let snapshot = json!({"task_environment": {"repository_id": "r1", "worktree_path": "/k/flat",
                              "worktree_branch": "feature/f"}});
        assert_eq!(
            worktrees_of(&snapshot),
            vec![JobWorktree {
                repository_id: "r1".into(),
                path: "/k/flat".into(),
                branch: Some("feature/f".into()),
                base_branch: None,
            }]
        );
    }
}
