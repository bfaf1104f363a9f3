//! From kandev's rows and the normalized ownership to berth's rows (`Plan`): tasks and their slots,
//! environments with their inventory, sessions bound to their environment, transcripts, and the current
//! git status per (environment, repository) re-keyed through the session's environment (seed 004).
use std::collections::{BTreeMap, HashMap, HashSet};

use serde_json::{Value, json};

use crate::entity::git_status_observation::ObservationKind;
use crate::entity::session_message::MessageRole;
use crate::entity::task::{TaskKind, WorkspaceMode};
use crate::entity::task_environment::{EnvironmentStatus, ExecutorType};
use crate::entity::task_environment_repo::EnvironmentRepoStatus;
use crate::entity::task_session::SessionState;

use super::model::*;
use super::normalize::{Ownership, TargetState, normalize};
use super::plan::*;
use super::report::Entry;

pub fn plan(src: &Source) -> Plan {
    let own = normalize(src);
    let mut plan = Plan {
        repositories: src.repositories.clone(),
        ..Default::default()
    };
    plan.environments = environments(src, &own);
    plan.tasks = tasks(src, &plan.environments);
    plan.sessions = sessions(src, &own, &plan.environments, &mut plan.history);
    let imported: HashSet<&str> = plan.sessions.iter().map(|s| s.id.as_str()).collect();
    plan.messages = messages(src, &imported);
    plan.observations = observations(src, &own, &plan.environments, &mut plan.history);
    let (jobs, mut history) = super::jobs::plan(src, &plan);
    plan.jobs = jobs;
    plan.history.append(&mut history);
    let mut history = own.history;
    history.append(&mut plan.history);
    plan.history = history;
    plan.refused = own.refused;
    plan
}

fn executor_of(kind: Option<&str>) -> ExecutorType {
    match kind {
        Some("worktree") => ExecutorType::Worktree,
        // berth has two executors: every other kandev type (containers, remote hosts) runs locally here.
        _ => ExecutorType::Local,
    }
}

fn environments(src: &Source, own: &Ownership) -> Vec<PlannedEnv> {
    let executors: HashMap<&str, &str> = src.executors.iter().map(|(i, t)| (i.as_str(), t.as_str())).collect();
    let mut out = Vec::new();
    for (key, task_id) in &own.env_task {
        let kenv = src.environments.iter().find(|e| &e.id == key);
        let mut targets: Vec<_> = own.targets.iter().filter(|t| &t.env_key == key).collect();
        targets.sort_by(|a, b| {
            (a.position, &a.repository_id, &a.branch_slug).cmp(&(b.position, &b.repository_id, &b.branch_slug))
        });
        let has_worktrees = targets.iter().any(|t| t.worktree_id.is_some());
        let executor = if has_worktrees {
            ExecutorType::Worktree
        } else if let Some(e) = kenv {
            executor_of(e.executor_type.as_deref())
        } else {
            let session_executor = src
                .sessions
                .iter()
                .filter(|s| own.session_env.get(&s.id) == Some(key))
                .find_map(|s| s.executor_id.as_deref().and_then(|x| executors.get(x).copied()));
            executor_of(session_executor)
        };
        let mut rows: Vec<PlannedRow> = targets
            .iter()
            .map(|t| PlannedRow {
                key: t
                    .worktree_id
                    .clone()
                    .unwrap_or_else(|| format!("env-repo:{}", t.source_id)),
                repository_id: t.repository_id.clone(),
                branch_slug: t.branch_slug.clone(),
                worktree_path: t.worktree_id.as_ref().and(t.path.clone()),
                worktree_branch: t.worktree_id.as_ref().and(t.branch.clone()),
                position: t.position as i32,
                status: match t.state {
                    TargetState::Active => EnvironmentRepoStatus::Active,
                    TargetState::Merged => EnvironmentRepoStatus::Merged,
                    TargetState::Failed => EnvironmentRepoStatus::Failed,
                },
                error_message: t.error_message.clone(),
                created_at: t.created_at,
                updated_at: t.updated_at,
            })
            .collect();
        if executor == ExecutorType::Local && rows.is_empty() {
            // The local executor works in the repository itself: one row per slot, no worktree.
            for (i, r) in task_repositories(src, task_id).into_iter().enumerate() {
                let at = kenv.map_or(chrono::DateTime::UNIX_EPOCH, |e| e.created_at);
                rows.push(PlannedRow {
                    key: format!("local:{key}:{}", r.repository_id),
                    repository_id: r.repository_id.clone(),
                    branch_slug: String::new(),
                    worktree_path: None,
                    worktree_branch: None,
                    position: i as i32,
                    status: EnvironmentRepoStatus::Active,
                    error_message: None,
                    created_at: at,
                    updated_at: at,
                });
            }
        }
        let active: Vec<&str> = rows
            .iter()
            .filter(|r| r.status == EnvironmentRepoStatus::Active)
            .filter_map(|r| r.worktree_path.as_deref())
            .collect();
        let workspace_path = match active.as_slice() {
            [one] => Some(one.to_string()),
            [] => kenv.and_then(|e| e.workspace_path.clone()),
            several => kenv
                .and_then(|e| e.workspace_path.clone())
                .or_else(|| common_parent(several)),
        };
        let status = match kenv.and_then(|e| e.status.as_deref()) {
            Some("failed") => EnvironmentStatus::Failed,
            Some("stopped") => EnvironmentStatus::Stopped,
            // `creating` is not carried over: nothing may take over a materialization kandev abandoned.
            Some("creating") => EnvironmentStatus::Stopped,
            _ => EnvironmentStatus::Ready,
        };
        let (created_at, updated_at) = match kenv {
            Some(e) => (e.created_at, e.updated_at),
            None => {
                let ts: Vec<Ts> = src
                    .sessions
                    .iter()
                    .filter(|s| own.session_env.get(&s.id) == Some(key))
                    .map(|s| s.started_at)
                    .collect();
                let first = ts.iter().min().copied().unwrap_or(chrono::DateTime::UNIX_EPOCH);
                (first, ts.iter().max().copied().unwrap_or(first))
            }
        };
        out.push(PlannedEnv {
            key: key.clone(),
            task_id: task_id.clone(),
            executor,
            status,
            workspace_path,
            created_at,
            updated_at,
            rows,
        });
    }
    out
}

fn common_parent(paths: &[&str]) -> Option<String> {
    let parents: HashSet<_> = paths
        .iter()
        .map(|p| {
            std::path::Path::new(p)
                .parent()
                .map(|d| d.to_string_lossy().into_owned())
        })
        .collect();
    match parents.into_iter().collect::<Vec<_>>().as_slice() {
        [Some(one)] => Some(one.clone()),
        _ => None,
    }
}

/// A task's kandev `task_repositories`, one per repository (berth's slot is repository and branch slug).
fn task_repositories<'a>(src: &'a Source, task_id: &str) -> Vec<&'a TaskRepository> {
    let mut seen = HashSet::new();
    src.task_repositories
        .iter()
        .filter(|r| r.task_id == task_id && seen.insert(r.repository_id.as_str()))
        .collect()
}

fn tasks(src: &Source, envs: &[PlannedEnv]) -> Vec<PlannedTask> {
    let ids: HashSet<&str> = src.tasks.iter().map(|t| t.id.as_str()).collect();
    let mut slots: HashMap<&str, Vec<PlannedSlot>> = HashMap::new();
    for t in &src.tasks {
        let kandev = task_repositories(src, &t.id);
        let base = |repo: &str| {
            kandev
                .iter()
                .find(|r| r.repository_id == repo)
                .and_then(|r| r.base_branch.clone())
        };
        // The slots are the task's own inventory when it has one (admission matches them row for row).
        let own: Vec<PlannedSlot> = envs
            .iter()
            .filter(|e| e.task_id == t.id)
            .flat_map(|e| e.rows.iter())
            .map(|r| (r.repository_id.clone(), r.branch_slug.clone()))
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .enumerate()
            .map(|(i, (repo, slug))| PlannedSlot {
                base_branch: base(&repo),
                branch: (!slug.is_empty()).then(|| slug.clone()),
                repository_id: repo,
                branch_slug: slug,
                position: i as i32,
            })
            .collect();
        let list = if own.is_empty() {
            kandev
                .iter()
                .enumerate()
                .map(|(i, r)| PlannedSlot {
                    repository_id: r.repository_id.clone(),
                    branch_slug: String::new(),
                    base_branch: r.base_branch.clone(),
                    branch: None,
                    position: i as i32,
                })
                .collect()
        } else {
            own
        };
        slots.insert(t.id.as_str(), list);
    }
    let mut out = Vec::new();
    for t in &src.tasks {
        let parent_id = t.parent_id.clone().filter(|p| ids.contains(p.as_str()));
        let inherit = t.workspace_mode.as_deref() == Some("inherit_parent") && parent_id.is_some();
        let own_env = envs.iter().any(|e| e.task_id == t.id);
        // An inherit_parent subtask uses its parent's slots and never has an environment of its own.
        let (mode, task_slots) = match (&parent_id, inherit && !own_env) {
            (Some(p), true) => (WorkspaceMode::InheritParent, slots[p.as_str()].clone()),
            _ => (WorkspaceMode::NewWorkspace, slots[t.id.as_str()].clone()),
        };
        out.push(PlannedTask {
            id: t.id.clone(),
            title: t.title.clone(),
            description: t.description.clone().unwrap_or_default(),
            parent_id,
            kind: if t.ephemeral {
                TaskKind::QuickChat
            } else {
                TaskKind::Standard
            },
            mode,
            archived_at: t.archived_at,
            created_at: t.created_at,
            updated_at: t.updated_at,
            slots: task_slots,
        });
    }
    out
}

/// kandev's session state in berth's vocabulary. Nothing runs after an import: a live session is
/// `stopped` (resumable), a terminal one keeps its outcome.
fn session_state(kandev: &str) -> SessionState {
    match kandev {
        "CREATED" => SessionState::Created,
        "FAILED" => SessionState::Failed,
        "CANCELLED" => SessionState::Cancelled,
        _ => SessionState::Stopped,
    }
}

fn sessions(src: &Source, own: &Ownership, envs: &[PlannedEnv], history: &mut Vec<Entry>) -> Vec<PlannedSession> {
    let executor: HashMap<&str, ExecutorType> = envs.iter().map(|e| (e.key.as_str(), e.executor)).collect();
    let mut out = Vec::new();
    let mut by_task: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for s in &src.sessions {
        let Some(env_key) = own.session_env.get(&s.id) else {
            history.push(Entry {
                task_id: Some(s.task_id.clone()),
                ..Entry::new(
                    "session_without_task",
                    "task_sessions",
                    &s.id,
                    "its task does not exist; a session cannot be imported without one",
                )
            });
            continue;
        };
        by_task.entry(s.task_id.as_str()).or_default().push(out.len());
        out.push(PlannedSession {
            id: s.id.clone(),
            task_id: s.task_id.clone(),
            env_key: env_key.clone(),
            executor: executor.get(env_key.as_str()).copied().unwrap_or(ExecutorType::Local),
            state: session_state(&s.state),
            name: s.name.clone().unwrap_or_default(),
            is_primary: false,
            created_at: s.started_at,
            updated_at: s.updated_at,
            ended_at: s.completed_at,
        });
    }
    // Exactly one primary per task: kandev's (the newest if it marked several), else the newest session.
    for idx in by_task.values() {
        let newest = |only_primary: bool| {
            idx.iter()
                .copied()
                .filter(|&i| !only_primary || src.sessions.iter().any(|s| s.id == out[i].id && s.is_primary))
                .max_by_key(|&i| (out[i].updated_at, out[i].id.clone()))
        };
        let pick = newest(true).or_else(|| newest(false));
        if let Some(i) = pick {
            out[i].is_primary = true;
        }
    }
    out
}

fn messages(src: &Source, imported: &HashSet<&str>) -> Vec<PlannedMessage> {
    // In order by the parsed `created_at`, then id: the three timestamp forms do not sort as text.
    let mut ordered: Vec<&Message> = src.messages.iter().collect();
    ordered.sort_by(|a, b| (a.created_at, &a.id).cmp(&(b.created_at, &b.id)));
    ordered
        .into_iter()
        .filter(|m| imported.contains(m.session_id.as_str()))
        .filter_map(|m| {
            let (role, content) = match (m.author_type.as_str(), m.kind.as_str()) {
                ("user", _) => (MessageRole::User, json!({ "text": m.content })),
                ("agent", "message" | "content") => (
                    MessageRole::Assistant,
                    json!({ "role": "assistant", "content": [{ "type": "text", "text": m.content }] }),
                ),
                // Tool calls, logs, progress and the like are the agent's working notes, not the conversation.
                _ => return None,
            };
            Some(PlannedMessage {
                id: m.id.clone(),
                session_id: m.session_id.clone(),
                role,
                content,
                created_at: m.created_at,
            })
        })
        .collect()
}

fn observations(
    src: &Source,
    own: &Ownership,
    envs: &[PlannedEnv],
    history: &mut Vec<Entry>,
) -> Vec<PlannedObservation> {
    let names: HashMap<&str, &str> = src
        .repositories
        .iter()
        .map(|r| (r.id.as_str(), r.name.as_str()))
        .collect();
    let mut newest: BTreeMap<(String, String), &GitSnapshot> = BTreeMap::new();
    for s in &src.snapshots {
        let env_key = s
            .env_id
            .as_ref()
            .and_then(|e| own.env_alias.get(e))
            .or_else(|| s.session_id.as_ref().and_then(|id| own.session_env.get(id)));
        let env = env_key.and_then(|k| envs.iter().find(|e| &e.key == k));
        let repos: Vec<&str> = env
            .map(|e| {
                let mut r: Vec<&str> = e.rows.iter().map(|r| r.repository_id.as_str()).collect();
                r.dedup();
                r
            })
            .unwrap_or_default();
        let repo = match &s.repository_name {
            Some(name) => repos
                .iter()
                .copied()
                .find(|r| names.get(r).copied() == Some(name.as_str())),
            None if repos.len() == 1 => Some(repos[0]),
            None => None,
        };
        let (Some(env), Some(repo)) = (env, repo) else {
            history.push(Entry {
                session_id: s.session_id.clone(),
                repository: s.repository_name.clone(),
                branch: s.branch.clone(),
                ..Entry::new(
                    "observation_unresolved",
                    "task_session_git_snapshots",
                    &s.id,
                    "no environment and repository of the import match this git status",
                )
            });
            continue;
        };
        let slot = newest.entry((env.key.clone(), repo.to_string())).or_insert(s);
        if (s.created_at, &s.id) > (slot.created_at, &slot.id) {
            *slot = s;
        }
    }
    // I22: the newest observation per (environment, repository) is the current one; older ones are not kept.
    newest
        .into_iter()
        .map(|((env_key, repository_id), s)| PlannedObservation {
            id: s.id.clone(),
            env_key,
            repository_id,
            session_id: s.session_id.clone(),
            kind: match (s.snapshot_type.as_deref(), s.triggered_by.as_deref()) {
                (Some("archive"), _) => ObservationKind::Archive,
                (_, Some("agent_completed")) => ObservationKind::Completion,
                _ => ObservationKind::Live,
            },
            observed_at: s.created_at,
            branch: s.branch.clone(),
            head_commit: s.head_commit.clone(),
            upstream: s.remote_branch.clone(),
            ahead: s.ahead as i32,
            behind: s.behind as i32,
            files: files(&s.files),
        })
        .collect()
}

/// kandev's `files` (an object keyed by path) as berth's `[{path, index_status, worktree_status}]`.
fn files(v: &Value) -> Value {
    let Some(map) = v.as_object() else { return json!([]) };
    let list: Vec<Value> = map
        .iter()
        .map(|(path, f)| {
            let status = f["status"].as_str().unwrap_or("modified");
            let staged = f["staged"].as_bool().unwrap_or(false);
            let (index, worktree) = match status {
                "untracked" => ("unmodified", "untracked"),
                "added" => ("added", "unmodified"),
                "renamed" => ("renamed", "unmodified"),
                "conflict" | "conflicted" => ("unmodified", "conflict"),
                "deleted" if staged => ("deleted", "unmodified"),
                "deleted" => ("unmodified", "deleted"),
                _ if staged => ("modified", "unmodified"),
                _ => ("unmodified", "modified"),
            };
            json!({ "path": path, "index_status": index, "worktree_status": worktree })
        })
        .collect();
    Value::Array(list)
}
