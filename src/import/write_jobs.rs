//! Writes the cleanup jobs kandev still owed (`jobs::plan`) in the import's transaction, after the rows
//! they refer to. A job of an imported (archived) task snapshots its environment as an archive in berth
//! would (`cleanup::barrier`: the active inventory, the task root, the sessions) plus any other worktree
//! kandev's job named; a job of a task kandev deleted names kandev's worktrees alone. The job is written
//! `pending` (its archive or delete committed in kandev already, and the archived task in this very
//! transaction) or `failed` (kandev gave up; an operator may retry it). Its operation id derives from
//! kandev's job ids, so a second import finds it and writes nothing.
use crate::ids::{CleanupJobId, EnvironmentId, InstanceId, OperationId, RepositoryId, TaskId, WorkspaceId};
use std::collections::{HashMap, HashSet};
use std::path::Path;

use anyhow::Context;
use sea_orm::DatabaseTransaction;
use serde_json::json;
use sha2::{Digest, Sha256};

use crate::config::Config;
use crate::domain::cleanup::{EnvironmentSnapshot, Snapshot, WorktreeSnapshot};
use crate::domain::environments;
use crate::entity::cleanup_job::{self as job, CleanupJobState};
use crate::entity::task::WorkspaceMode;
use crate::entity::task_environment::ExecutorType;
use crate::events::{self, EventType, Subject};
use crate::managed_path::Consent;
use crate::store::{environments as env_store, sessions as sessions_store, tasks as task_store};

use super::plan::{PlannedJob, RepoProbe};
use super::report::{CarriedJob, Entry};

/// What the jobs refer to, as the writer resolved it.
pub struct Refs<'a> {
    pub workspace_id: WorkspaceId,
    pub instance: InstanceId,
    pub config: &'a Config,
    /// kandev id → berth id, of every task and repository the import knows (written now or before).
    pub task_ids: &'a HashMap<String, TaskId>,
    pub new_tasks: &'a HashSet<String>,
    pub repo_ids: &'a HashMap<String, RepositoryId>,
    pub probes: &'a HashMap<String, RepoProbe>,
}

/// The operation id of the berth job that carries these kandev jobs: the same on every import.
fn operation_id(kandev_ids: &[String]) -> OperationId {
    let digest = Sha256::digest(format!("berth import kandev: cleanup job {}", kandev_ids.join(",")));
    let mut bytes = [0u8; 16];
    bytes.copy_from_slice(&digest[..16]);
    OperationId::from(uuid::Builder::from_custom_bytes(bytes).into_uuid())
}

pub async fn write_jobs(
    txn: &DatabaseTransaction,
    refs: &Refs<'_>,
    planned: &[PlannedJob],
    history: &mut Vec<Entry>,
) -> anyhow::Result<Vec<CarriedJob>> {
    let mut carried = Vec::new();
    for p in planned {
        let operation_id = operation_id(&p.ids);
        if crate::store::import::job_of_operation(txn, operation_id).await? {
            continue;
        }
        let entry = |rule: &'static str, message: &str| Entry {
            task_id: Some(p.task_id.clone()),
            ..Entry::new(rule, "task_resource_cleanup_jobs", &p.ids.join(","), message)
        };
        let existing = refs.task_ids.get(&p.task_id).copied();
        if existing.is_some() && !refs.new_tasks.contains(&p.task_id) {
            history.push(entry(
                "cleanup_job_task_in_berth",
                "the task was imported before: berth's own archive and delete govern its worktrees now",
            ));
            continue;
        }
        let (task_id, env) = match existing {
            Some(id) => (id, current_environment(txn, refs, id).await?),
            None => (TaskId::now_v7(), None),
        };
        let mut env_snap = env.as_ref().map(|(_, s)| s.clone());
        let mut extra = Vec::new();
        for w in &p.worktrees {
            let named = env_snap
                .iter()
                .flat_map(|e| e.worktrees.iter())
                .chain(extra.iter())
                .any(|x: &WorktreeSnapshot| x.worktree_path == w.path);
            if named {
                continue;
            }
            let (Some(repository_id), Some(probe)) =
                (refs.repo_ids.get(&w.repository_id), refs.probes.get(&w.repository_id))
            else {
                history.push(Entry {
                    path: Some(w.path.clone()),
                    branch: w.branch.clone(),
                    repository_id: Some(w.repository_id.clone()),
                    ..entry(
                        "cleanup_worktree_unresolved",
                        "kandev's job names this worktree of a repository kandev does not list: berth cannot remove it and leaves it on disk",
                    )
                });
                continue;
            };
            extra.push(WorktreeSnapshot {
                repository_id: *repository_id,
                repository_path: probe.path.clone(),
                common_git_dir: probe.common_git_dir.clone().unwrap_or_default(),
                adopted_root: WorktreeSnapshot::adopted_root_of(refs.config, &w.path),
                worktree_path: w.path.clone(),
                // kandev's worktree id is not git's, and kandev's branches are not berth's: never deleted.
                worktree_id: None,
                branch: w.branch.clone(),
                branch_origin: None,
                base_branch: w.base_branch.clone(),
            });
        }
        if !extra.is_empty() {
            let snap = env_snap.get_or_insert_with(|| EnvironmentSnapshot {
                // No berth environment: the job's own, which no row has (its task is gone in kandev).
                id: EnvironmentId::now_v7(),
                task_root: common_parent(&extra),
                worktrees: Vec::new(),
                in_flight: None,
            });
            snap.worktrees.append(&mut extra);
        }
        let Some(env_snap) = env_snap else {
            history.push(entry(
                "cleanup_job_nothing_left",
                "kandev's job names no worktree berth knows of, and the task has no environment: nothing is owed",
            ));
            continue;
        };
        let sessions = match existing {
            Some(id) => sessions_store::ids_of_task(txn, id).await?,
            None => Vec::new(),
        };
        let paths = env_snap.worktrees.iter().map(|w| w.worktree_path.clone()).collect();
        let snapshot = Snapshot {
            task_id,
            workspace_id: refs.workspace_id,
            environment: Some(env_snap),
            superseded: Vec::new(),
            sessions,
            agents: Vec::new(),
            conversations: Vec::new(),
            // The user consented in kandev; the job carries it as berth's own jobs carry a request's.
            discard_worktree_changes: Consent::from_discard_flag(Some(p.discard_worktree_changes)),
            delete_branches: None,
            branches: Vec::new(),
        };
        let model = job_row(refs, p, operation_id, snapshot, env.map(|(e, _)| e))?;
        crate::store::cleanup_jobs::insert(txn, &model).await?;
        events::append(
            txn,
            refs.instance,
            EventType::CleanupJobUpdated,
            Subject {
                task_environment_id: model.task_environment_id,
                ..Subject::task(model.workspace_id, model.task_id)
            },
            json!({ "cleanup_job_id": model.id, "state": model.state, "trigger": model.trigger }),
        )
        .await?;
        carried.push(CarriedJob {
            kandev_ids: p.ids.clone(),
            task_id: p.task_id.clone(),
            job_id: Some(model.id),
            trigger: p.trigger,
            state: p.state,
            paths,
            discard_worktree_changes: p.discard_worktree_changes,
        });
    }
    Ok(carried)
}

fn job_row(
    refs: &Refs<'_>,
    p: &PlannedJob,
    operation_id: OperationId,
    snapshot: Snapshot,
    env: Option<crate::entity::task_environment::Model>,
) -> anyhow::Result<job::Model> {
    let now = crate::clock::now();
    let failed = p.state == CleanupJobState::Failed;
    Ok(job::Model {
        id: CleanupJobId::now_v7(),
        operation_id,
        task_id: snapshot.task_id,
        workspace_id: refs.workspace_id,
        task_environment_id: env.as_ref().map(|e| e.id),
        trigger: p.trigger,
        state: p.state,
        attempts: 0,
        max_attempts: refs.config.cleanup_max_attempts as i32,
        next_attempt_at: (!failed).then_some(now),
        last_error: failed.then(|| {
            format!(
                "kandev gave up on this cleanup: {}",
                p.last_error.as_deref().unwrap_or("no reason recorded")
            )
        }),
        resource_snapshot: serde_json::to_value(&snapshot)?,
        node_id: env.map_or_else(|| refs.config.node_id.clone(), |e| e.node_id),
        lease_owner: None,
        lease_expires_at: None,
        created_at: now,
        updated_at: now,
        completed_at: failed.then_some(now),
        actor_sub: None,
        actor_session_id: None,
    })
}

/// The environment an imported task owns, snapshotted as `cleanup::barrier` snapshots one before an
/// archive: its active worktrees with their repositories and slot bases, and its task root.
async fn current_environment(
    txn: &DatabaseTransaction,
    refs: &Refs<'_>,
    task_id: TaskId,
) -> anyhow::Result<Option<(crate::entity::task_environment::Model, EnvironmentSnapshot)>> {
    let t = task_store::find(txn, task_id)
        .await?
        .context("an imported task is in the import's transaction")?;
    if t.workspace_mode == WorkspaceMode::InheritParent {
        return Ok(None);
    }
    let Some(e) = environments::current(txn, t.id).await? else {
        return Ok(None);
    };
    if e.executor_type == ExecutorType::Local {
        let snap = EnvironmentSnapshot {
            id: e.id,
            task_root: String::new(),
            worktrees: Vec::new(),
            in_flight: None,
        };
        return Ok(Some((e, snap)));
    }
    let slots = task_store::slots_with_repositories(txn, t.id).await?;
    let base_of = |repository_id: RepositoryId, slug: &str| {
        slots
            .iter()
            .find(|(s, _)| s.repository_id == repository_id && s.branch_slug == slug)
            .and_then(|(s, r)| {
                s.base_branch
                    .clone()
                    .or_else(|| r.as_ref().map(|r| r.default_branch.clone()))
            })
    };
    let worktrees = env_store::active_repos_with_repository(txn, e.id)
        .await?
        .into_iter()
        .filter_map(|(r, repo)| {
            let repo = repo?;
            Some(WorktreeSnapshot {
                repository_id: r.repository_id,
                repository_path: repo.path,
                common_git_dir: repo.common_git_dir,
                adopted_root: WorktreeSnapshot::adopted_root_of(refs.config, r.worktree_path.as_deref()?),
                worktree_path: r.worktree_path?,
                worktree_id: r.worktree_id,
                branch: r.worktree_branch,
                branch_origin: r.branch_origin,
                base_branch: base_of(r.repository_id, &r.branch_slug),
            })
        })
        .collect();
    let task_root = refs.config.worktree_root.join(environments::dir_of(&t, &e));
    let snap = EnvironmentSnapshot {
        id: e.id,
        task_root: task_root.to_string_lossy().into_owned(),
        worktrees,
        in_flight: None,
    };
    Ok(Some((e, snap)))
}

/// kandev's task directory (`<home>/tasks/<dir>`), when every worktree is in the same one: removed by the
/// job only if it is empty and inside the managed root, as a berth task root is.
fn common_parent(worktrees: &[WorktreeSnapshot]) -> String {
    let parents: HashSet<_> = worktrees
        .iter()
        .map(|w| Path::new(&w.worktree_path).parent().map(Path::to_path_buf))
        .collect();
    match parents.into_iter().collect::<Vec<_>>().as_slice() {
        [Some(one)] => one.to_string_lossy().into_owned(),
        _ => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_carried_jobs_operation_id_is_the_same_on_every_import() {
        let a = operation_id(&["j1".into()]);
        assert_eq!(a, operation_id(&["j1".into()]));
        assert_ne!(a, operation_id(&["j2".into()]));
        assert_ne!(a, operation_id(&["j1".into(), "j2".into()]));
        assert_eq!(a.uuid().get_version_num(), 8);
    }
}
