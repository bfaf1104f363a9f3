//! Writes a plan into berth's database in ONE transaction (`BEGIN IMMEDIATE` on SQLite). A kandev row
//! whose id is already some row's `imported_from` is not written again, so a second import changes
//! nothing. Any error, an injected one included, drops the transaction: berth's database is unchanged.
use crate::ids::{
    EnvironmentId, EnvironmentRepoId, InstanceId, ObservationId, RepositoryId, SessionId, TaskId, TaskRepositoryId,
    WorkspaceId,
};
use std::collections::{HashMap, HashSet};

use sea_orm::ActiveValue::{NotSet, Set};
use serde_json::json;

use crate::entity::repository::RepositoryStatus;
use crate::entity::workspace::WorkspaceStatus;
use crate::entity::{
    git_status_observation as obs, repository, session_message, task, task_environment as env,
    task_environment_repo as env_repo, task_repository, task_session as session, workspace,
};
use crate::events::{self, EventType, Subject};
use crate::store::Db;
use crate::store::import as store;

use super::plan::{Plan, RepoProbe};
use super::report::{CarriedJob, Counts, Entry};
use super::write_jobs::{Refs, write_jobs};

pub struct Written {
    pub workspace_id: WorkspaceId,
    pub counts: Counts,
    pub messages: u64,
    pub repositories: u64,
    /// Some kandev row was already in berth.
    pub seen_before: bool,
    /// kandev's cleanup jobs written as berth's.
    pub cleanup_jobs: Vec<CarriedJob>,
    /// kandev rows the writer found to be history (a job of a task berth already had, ...).
    pub history: Vec<Entry>,
}

/// A test-only failure after a step (`BERTH_IMPORT_FAIL_AT=after_read|after_<table>|before_commit`);
/// compiled only into debug builds, never reachable in a release binary.
fn failpoint(step: &str) -> anyhow::Result<()> {
    #[cfg(debug_assertions)]
    if std::env::var("BERTH_IMPORT_FAIL_AT").as_deref() == Ok(step) {
        anyhow::bail!("injected failure at {step} (BERTH_IMPORT_FAIL_AT)");
    }
    let _ = step;
    Ok(())
}

fn repo_name(raw: &str) -> String {
    let name: String = raw
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '-'
            }
        })
        .take(90)
        .collect();
    let name = name.trim_start_matches('.').to_string();
    if name.is_empty() { "repository".into() } else { name }
}

pub async fn write(
    db: &Db,
    workspace_name: &str,
    config: &crate::config::Config,
    plan: &Plan,
    probes: &HashMap<String, RepoProbe>,
    commit: bool,
) -> anyhow::Result<Written> {
    let txn = db.begin_write().await?;
    let instance = InstanceId::now_v7();
    let now = crate::clock::now();
    failpoint("after_read")?;
    let mut counts = Counts::default();
    let mut seen_before = false;
    let mut created_workspace = false;

    let ws = match store::workspace_named(&txn, workspace_name).await? {
        Some(ws) if ws.status != WorkspaceStatus::Active => {
            anyhow::bail!("workspace {workspace_name:?} is being deleted; nothing was imported")
        }
        Some(ws) => ws,
        None => {
            let ws = workspace::Model {
                id: WorkspaceId::now_v7(),
                name: workspace_name.to_string(),
                status: WorkspaceStatus::Active,
                created_at: now,
                updated_at: now,
            };
            crate::store::workspaces::insert(&txn, &ws).await?;
            crate::store::columns::insert_defaults(&txn, ws.id, now).await?;
            created_workspace = true;
            ws
        }
    };
    failpoint("after_workspaces")?;
    let first_column = crate::store::columns::of_workspace(&txn, ws.id)
        .await?
        .first()
        .map(|c| c.id);

    // Repositories: by their local path (one berth repository per path), else kandev's id.
    let mut repo_ids = store::imported::<repository::Entity, RepositoryId>(
        &txn,
        repository::Column::ImportedFrom,
        repository::Column::Id,
    )
    .await?;
    seen_before |= plan.repositories.iter().any(|r| repo_ids.contains_key(&r.id));
    let live = store::live_repositories(&txn, ws.id).await?;
    let mut by_path: HashMap<String, RepositoryId> = live.iter().map(|r| (r.path.clone(), r.id)).collect();
    let mut names: HashSet<String> = live.iter().map(|r| r.name.clone()).collect();
    let mut new_repos = Vec::new();
    for r in &plan.repositories {
        if repo_ids.contains_key(&r.id) {
            continue;
        }
        let probe = &probes[&r.id];
        if r.deleted_at.is_none()
            && let Some(id) = by_path.get(&probe.path)
        {
            repo_ids.insert(r.id.clone(), *id);
            continue;
        }
        let base = repo_name(&r.name);
        let mut name = base.clone();
        let mut n = 2;
        while r.deleted_at.is_none() && !names.insert(name.clone()) {
            name = format!("{base}-{n}");
            n += 1;
        }
        let id = RepositoryId::now_v7();
        repo_ids.insert(r.id.clone(), id);
        if r.deleted_at.is_none() {
            by_path.insert(probe.path.clone(), id);
        }
        new_repos.push(repository::ActiveModel {
            id: Set(id),
            workspace_id: Set(ws.id),
            name: Set(name),
            path: Set(probe.path.clone()),
            common_git_dir: Set(probe.common_git_dir.clone().unwrap_or_default()),
            default_branch: Set(r
                .default_branch
                .clone()
                .or(probe.head_branch.clone())
                .unwrap_or_else(|| "main".into())),
            created_at: Set(r.created_at),
            updated_at: Set(r.updated_at),
            deleted_at: Set(r.deleted_at),
            imported_from: Set(Some(r.id.clone())),
            // On the disk of the node that imports it.
            node_id: Set(Some(config.node_id.clone())),
            status: Set(if probe.common_git_dir.is_some() {
                RepositoryStatus::Available
            } else {
                RepositoryStatus::Missing
            }),
        });
    }
    let repositories = new_repos.len() as u64;
    for r in &new_repos {
        let (id, name) = (r.id.clone().unwrap(), r.name.clone().unwrap());
        events::append(
            &txn,
            instance,
            EventType::RepositoryCreated,
            Subject::workspace(ws.id),
            json!({ "repository_id": id, "name": name }),
        )
        .await?;
    }
    store::insert_chunked(&txn, new_repos).await?;
    failpoint("after_repositories")?;

    // Tasks, parents first (the parent link is a foreign key).
    let mut task_ids =
        store::imported::<task::Entity, TaskId>(&txn, task::Column::ImportedFrom, task::Column::Id).await?;
    seen_before |= plan.tasks.iter().any(|t| task_ids.contains_key(&t.id));
    let mut new_tasks: HashSet<String> = HashSet::new();
    let mut pending: Vec<&super::plan::PlannedTask> =
        plan.tasks.iter().filter(|t| !task_ids.contains_key(&t.id)).collect();
    while !pending.is_empty() {
        let ready: Vec<usize> = (0..pending.len())
            .filter(|&i| {
                pending[i]
                    .parent_id
                    .as_ref()
                    .is_none_or(|p| task_ids.contains_key(p) || !pending.iter().any(|o| &o.id == p))
            })
            .collect();
        // A parent cycle (no such task in kandev) is broken where it starts.
        let ready = if ready.is_empty() { vec![0] } else { ready };
        let mut batch = Vec::new();
        let mut slots = Vec::new();
        for &i in ready.iter().rev() {
            let t = pending.remove(i);
            let id = TaskId::now_v7();
            let parent = t.parent_id.as_ref().and_then(|p| task_ids.get(p)).copied();
            task_ids.insert(t.id.clone(), id);
            new_tasks.insert(t.id.clone());
            batch.push(task::ActiveModel {
                id: Set(id),
                workspace_id: Set(ws.id),
                parent_task_id: Set(parent),
                title: Set(t.title.clone()),
                slug: Set(crate::executor::task_dir_name(&t.title, id)),
                description: Set(t.description.clone()),
                kind: Set(t.kind),
                workspace_mode: Set(if parent.is_some() {
                    t.mode
                } else {
                    task::WorkspaceMode::NewWorkspace
                }),
                archived_at: Set(t.archived_at),
                last_activity_at: Set(t.updated_at),
                created_at: Set(t.created_at),
                updated_at: Set(t.updated_at),
                row_version: Set(1),
                imported_from: Set(Some(t.id.clone())),
                // Imported tasks start in the workspace's first column.
                column_id: Set(first_column),
            });
            for s in &t.slots {
                let Some(repository_id) = repo_ids.get(&s.repository_id) else {
                    continue;
                };
                slots.push(task_repository::ActiveModel {
                    id: Set(TaskRepositoryId::now_v7()),
                    task_id: Set(id),
                    repository_id: Set(*repository_id),
                    branch_slug: Set(s.branch_slug.clone()),
                    base_branch: Set(s.base_branch.clone()),
                    branch: Set(s.branch.clone()),
                    position: Set(s.position),
                    created_at: Set(t.created_at),
                });
            }
            events::append(
                &txn,
                instance,
                EventType::TaskCreated,
                Subject::task(ws.id, id),
                json!({ "title": t.title, "kind": t.kind, "parent_task_id": parent }),
            )
            .await?;
        }
        counts.tasks += batch.len() as u64;
        store::insert_chunked(&txn, batch).await?;
        store::insert_chunked(&txn, slots).await?;
    }
    failpoint("after_tasks")?;

    // Environments and their inventory, only with a new environment (an existing one keeps its rows).
    let mut env_ids =
        store::imported::<env::Entity, EnvironmentId>(&txn, env::Column::ImportedFrom, env::Column::Id).await?;
    seen_before |= plan.environments.iter().any(|e| env_ids.contains_key(&e.key));
    let known_rows = store::imported::<env_repo::Entity, EnvironmentRepoId>(
        &txn,
        env_repo::Column::ImportedFrom,
        env_repo::Column::Id,
    )
    .await?;
    let mut new_envs: HashSet<String> = HashSet::new();
    let (mut envs, mut rows) = (Vec::new(), Vec::new());
    let fresh: Vec<_> = plan
        .environments
        .iter()
        .filter(|e| !env_ids.contains_key(&e.key))
        .collect();
    for e in fresh {
        let id = EnvironmentId::now_v7();
        env_ids.insert(e.key.clone(), id);
        new_envs.insert(e.key.clone());
        envs.push(env::ActiveModel {
            id: Set(id),
            task_id: Set(task_ids[&e.task_id]),
            executor_type: Set(e.executor),
            status: Set(e.status),
            workspace_path: Set(e.workspace_path.clone()),
            node_id: Set(config.node_id.clone()),
            ownership_generation: Set(1),
            materializer_id: Set(None),
            error_message: Set(None),
            created_at: Set(e.created_at),
            updated_at: Set(e.updated_at),
            superseded_at: Set(None),
            row_version: Set(1),
            broken_category: Set(None),
            imported_from: Set(Some(e.key.clone())),
        });
        for r in e.rows.iter().filter(|r| !known_rows.contains_key(&r.key)) {
            let Some(repository_id) = repo_ids.get(&r.repository_id) else {
                continue;
            };
            if r.is_worktree() {
                counts.worktrees += 1;
            }
            rows.push(env_repo::ActiveModel {
                id: Set(EnvironmentRepoId::now_v7()),
                task_environment_id: Set(id),
                repository_id: Set(*repository_id),
                branch_slug: Set(r.branch_slug.clone()),
                // kandev's worktree id is not git's: admission proves the adopted directory instead.
                worktree_id: Set(None),
                worktree_path: Set(r.worktree_path.clone()),
                worktree_branch: Set(r.worktree_branch.clone()),
                base_commit: Set(None),
                position: Set(r.position),
                status: Set(r.status),
                error_message: Set(r.error_message.clone()),
                created_at: Set(r.created_at),
                updated_at: Set(r.updated_at),
                merged_at: Set(None),
                deleted_at: Set(None),
                row_version: Set(1),
                // Not berth's branch: an unknown origin is never deleted.
                branch_origin: Set(None),
                imported_from: Set(Some(r.key.clone())),
            });
        }
    }
    counts.environments = envs.len() as u64;
    store::insert_chunked(&txn, envs).await?;
    failpoint("after_environments")?;
    store::insert_chunked(&txn, rows).await?;
    failpoint("after_environment_repos")?;

    let mut session_ids =
        store::imported::<session::Entity, SessionId>(&txn, session::Column::ImportedFrom, session::Column::Id).await?;
    seen_before |= plan.sessions.iter().any(|s| session_ids.contains_key(&s.id));
    let mut sessions = Vec::new();
    let fresh: Vec<_> = plan
        .sessions
        .iter()
        .filter(|s| !session_ids.contains_key(&s.id))
        .collect();
    for s in fresh {
        let id = SessionId::now_v7();
        session_ids.insert(s.id.clone(), id);
        sessions.push(session::ActiveModel {
            id: Set(id),
            task_id: Set(task_ids[&s.task_id]),
            task_environment_id: Set(env_ids.get(&s.env_key).copied()),
            name: Set(s.name.clone()),
            executor_type: Set(s.executor),
            agent_profile: Set(None),
            state: Set(s.state),
            // A task that was in berth before keeps its primary.
            is_primary: Set(s.is_primary && new_tasks.contains(&s.task_id)),
            desired_open: Set(false),
            execution_id: Set(None),
            agent_session_ref: Set(None),
            agent_state: Set(None),
            last_error_code: Set(None),
            last_error_message: Set(None),
            last_activity_at: Set(s.updated_at),
            created_at: Set(s.created_at),
            updated_at: Set(s.updated_at),
            started_at: Set(Some(s.created_at)),
            ended_at: Set(s.ended_at),
            row_version: Set(1),
            imported_from: Set(Some(s.id.clone())),
        });
    }
    counts.sessions = sessions.len() as u64;
    store::insert_chunked(&txn, sessions).await?;
    failpoint("after_sessions")?;

    let known = store::imported::<session_message::Entity, SessionId>(
        &txn,
        session_message::Column::ImportedFrom,
        session_message::Column::SessionId,
    )
    .await?;
    seen_before |= plan.messages.iter().any(|m| known.contains_key(&m.id));
    let messages: Vec<session_message::ActiveModel> = plan
        .messages
        .iter()
        .filter(|m| !known.contains_key(&m.id))
        .filter_map(|m| {
            Some(session_message::ActiveModel {
                id: NotSet,
                session_id: Set(*session_ids.get(&m.session_id)?),
                role: Set(m.role),
                content: Set(m.content.clone()),
                created_at: Set(m.created_at),
                imported_from: Set(Some(m.id.clone())),
            })
        })
        .collect();
    let message_count = messages.len() as u64;
    store::insert_chunked(&txn, messages).await?;
    failpoint("after_messages")?;

    // Current git status, only for environments this import creates (an existing one has its own).
    let known = store::imported::<obs::Entity, ObservationId>(&txn, obs::Column::ImportedFrom, obs::Column::Id).await?;
    seen_before |= plan.observations.iter().any(|o| known.contains_key(&o.id));
    let observations: Vec<obs::ActiveModel> = plan
        .observations
        .iter()
        .filter(|o| !known.contains_key(&o.id) && new_envs.contains(&o.env_key))
        .filter_map(|o| {
            Some(obs::ActiveModel {
                id: Set(ObservationId::now_v7()),
                task_environment_id: Set(env_ids[&o.env_key]),
                repository_id: Set(*repo_ids.get(&o.repository_id)?),
                session_id: Set(o.session_id.as_ref().and_then(|s| session_ids.get(s)).copied()),
                kind: Set(o.kind),
                observed_at: Set(o.observed_at),
                branch: Set(o.branch.clone()),
                head_commit: Set(o.head_commit.clone()),
                upstream: Set(o.upstream.clone()),
                ahead: Set(o.ahead),
                behind: Set(o.behind),
                files: Set(o.files.clone()),
                created_at: Set(o.observed_at),
                imported_from: Set(Some(o.id.clone())),
            })
        })
        .collect();
    counts.observations = observations.len() as u64;
    store::insert_chunked(&txn, observations).await?;
    failpoint("after_observations")?;

    // What kandev still owed, once the rows its jobs name are written.
    let refs = Refs {
        workspace_id: ws.id,
        instance,
        config,
        task_ids: &task_ids,
        new_tasks: &new_tasks,
        repo_ids: &repo_ids,
        probes,
    };
    let mut history = Vec::new();
    let cleanup_jobs = write_jobs(&txn, &refs, &plan.jobs, &mut history).await?;
    failpoint("after_cleanup_jobs")?;

    let nothing = counts.is_zero() && message_count == 0 && repositories == 0 && cleanup_jobs.is_empty();
    if created_workspace && !nothing {
        events::append(
            &txn,
            instance,
            EventType::WorkspaceCreated,
            Subject::workspace(ws.id),
            json!({ "name": ws.name }),
        )
        .await?;
    }
    failpoint("before_commit")?;
    // Nothing new: the transaction (and a workspace it would have created) is dropped, changing nothing.
    if commit && !nothing {
        txn.commit().await?;
    }
    Ok(Written {
        workspace_id: ws.id,
        counts,
        messages: message_count,
        repositories,
        seen_before,
        cleanup_jobs,
        history,
    })
}
