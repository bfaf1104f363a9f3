//! Current git status belongs to the environment (seed 004, I21-I25): one authority per (environment,
//! repository), the newest observation wins whatever its kind, a completion capture supersedes earlier
//! live and completion rows, and a live report keeps exactly one live row per pair.
use crate::ids::{EnvironmentId, ObservationId, RepositoryId, SessionId};
use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Instant;

use serde_json::json;

use super::Ctx;
use crate::auth::Principal;
use crate::entity::git_status_observation::{self as obs, ObservationKind, ReportedKind};
use crate::entity::task_environment::{self as env, EnvironmentStatus, ExecutorType};
use crate::entity::task_environment_repo::EnvironmentRepoStatus;
use crate::error::{Error, Result, ReuseCategory};
use crate::events::EventType;
use crate::events::{self, Subject};
use crate::git::status::{self, FileStatus, IndexStatus, WorktreeStatus};
use crate::store::{environments as env_store, observations as store, sessions as sessions_store};

pub const MAX_FILES: usize = 2_000;
/// How far in the future an `observed_at` may lie (clock skew between an agent's host and berth).
pub const MAX_SKEW_SECS: i64 = 300;

#[derive(Debug, Clone)]
pub struct Observation {
    pub repository_id: RepositoryId,
    pub session_id: Option<SessionId>,
    pub kind: ObservationKind,
    pub observed_at: chrono::DateTime<chrono::Utc>,
    pub branch: Option<String>,
    pub head_commit: Option<String>,
    pub upstream: Option<String>,
    pub ahead: i32,
    pub behind: i32,
    pub files: Vec<FileStatus>,
}

/// What a monitor reports, as it arrived: kind and file statuses are checked by `report`, after the
/// environment is found, as they always were.
#[derive(Debug, Clone)]
pub struct Report {
    pub repository_id: RepositoryId,
    pub session_id: Option<SessionId>,
    pub kind: String,
    pub observed_at: chrono::DateTime<chrono::Utc>,
    pub branch: Option<String>,
    pub head_commit: Option<String>,
    pub upstream: Option<String>,
    pub ahead: i32,
    pub behind: i32,
    pub files: Vec<ReportedFile>,
}

/// A file of a report: the wire shape of `FileStatus`, statuses not yet checked.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReportedFile {
    pub path: String,
    pub index_status: String,
    pub worktree_status: String,
}

impl ReportedFile {
    fn check(self) -> Result<FileStatus> {
        let index_status = IndexStatus::parse(&self.index_status)
            .ok_or_else(|| Error::invalid("files.index_status", "is not a known index status"))?;
        let worktree_status = WorktreeStatus::parse_reported(&self.worktree_status)
            .ok_or_else(|| Error::invalid("files.worktree_status", "is not a known worktree status"))?;
        Ok(FileStatus {
            path: self.path,
            index_status,
            worktree_status,
        })
    }
}

/// An environment's status as the API reports it.
pub struct Current {
    /// The newest observation per repository.
    pub items: Vec<obs::Model>,
    /// The observations no longer describe a workspace anyone works in (the environment is
    /// `broken`, superseded or failed): history, not the present.
    pub stale: bool,
}

fn is_stale(e: &env::Model) -> bool {
    !matches!(
        e.status,
        EnvironmentStatus::Ready | EnvironmentStatus::Stopped | EnvironmentStatus::Creating
    )
}

/// The environment's current status, one per repository that has an observation (I22).
pub async fn current(ctx: &Ctx, p: &Principal, env_id: EnvironmentId) -> Result<Current> {
    let view = super::environments::get(ctx, p, env_id).await?;
    let stale = is_stale(&view.env);
    if !stale && agent_live(ctx, env_id).await? {
        // I25: while an agent works here, a fresh inspection is authoritative (rate-limited).
        inspect_and_record(ctx, &view.env, ObservationKind::Live, None, true).await?;
    }
    let items = read_current(ctx, env_id, view.repos.iter().map(|r| r.repository_id).collect()).await?;
    Ok(Current { items, stale })
}

pub async fn of_session(ctx: &Ctx, p: &Principal, session_id: SessionId) -> Result<Current> {
    let s = super::sessions::visible(&ctx.db.conn, p, session_id).await?;
    // The task's current environment: every session of the task sees the same status, also one still
    // pointing at an environment an executor transition superseded.
    let t = crate::store::tasks::find(&ctx.db.conn, s.task_id)
        .await?
        .ok_or(Error::NotFound("session"))?;
    let owner = crate::store::tasks::owner_of(&ctx.db.conn, &t).await?;
    let env_id = super::environments::current(&ctx.db.conn, owner.id)
        .await?
        .map(|e| e.id)
        .ok_or(Error::NotFound("environment"))?;
    // The route is the session's; the identity is the environment's (seed 004).
    let unbound = Principal::clone(p).without_session();
    current(ctx, &unbound, env_id).await
}

/// The newest observation per repository: one index probe per repository, whatever the history (the
/// read the benchmark measures).
pub async fn read_current(ctx: &Ctx, env_id: EnvironmentId, repos: Vec<RepositoryId>) -> Result<Vec<obs::Model>> {
    read_current_on(&ctx.db.conn, env_id, repos).await
}

pub async fn read_current_on<C: sea_orm::ConnectionTrait>(
    conn: &C,
    env_id: EnvironmentId,
    mut repos: Vec<RepositoryId>,
) -> Result<Vec<obs::Model>> {
    repos.sort();
    repos.dedup();
    let mut out = Vec::with_capacity(repos.len());
    for repo in repos {
        if let Some(o) = store::newest(conn, env_id, repo).await? {
            out.push(o);
        }
    }
    Ok(out)
}

/// I25: whether an agent is live in the environment, whichever instance runs it: this process's
/// runtime, or a live execution recorded by another instance that still holds its lease.
async fn agent_live(ctx: &Ctx, env_id: EnvironmentId) -> Result<bool> {
    let ids = sessions_store::ids_in_environment(&ctx.db.conn, env_id).await?;
    if ids.iter().any(|id| ctx.runtime.is_live(*id)) {
        return Ok(true);
    }
    for e in crate::store::executions::live_in_environment(&ctx.db.conn, env_id, &ids).await? {
        if e.instance_id != ctx.instance_id && super::nodes::sibling_alive(ctx, e.instance_id, false).await? {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Refresh: berth inspects the environment's worktrees itself and records live observations.
pub async fn refresh(ctx: &Ctx, p: &Principal, env_id: EnvironmentId) -> Result<Current> {
    let view = super::environments::get(ctx, p, env_id).await?;
    if view.env.status == EnvironmentStatus::Broken {
        // What admission found stands until a reset.
        return Err(Error::WorkspaceReuseUnsafe(super::environments::broken_category(
            &view.env,
        )));
    }
    inspect_and_record(ctx, &view.env, ObservationKind::Live, None, false).await?;
    let items = read_current(ctx, env_id, view.repos.iter().map(|r| r.repository_id).collect()).await?;
    Ok(Current {
        items,
        stale: is_stale(&view.env),
    })
}

/// Inspects each active worktree of the selected, ready environment (I20) and records the result.
pub(crate) async fn inspect_and_record(
    ctx: &Ctx,
    e: &env::Model,
    kind: ObservationKind,
    session_id: Option<SessionId>,
    rate_limited: bool,
) -> Result<()> {
    if !matches!(e.status, EnvironmentStatus::Ready | EnvironmentStatus::Stopped) {
        return Err(Error::InvalidState(
            "only a ready environment's worktrees are inspected".into(),
        ));
    }
    // Only the node whose disk holds the worktrees reads them; elsewhere a live read serves what was
    // recorded, and an explicit refresh (forwarded to that node when it is up) is refused.
    if e.node_id != ctx.config.node_id {
        if rate_limited {
            return Ok(());
        }
        return super::nodes::here(ctx, &e.node_id).await;
    }
    let rows: Vec<_> = env_store::active_repos_with_repository(&ctx.db.conn, e.id)
        .await?
        .into_iter()
        .filter(|(row, _)| !rate_limited || due(ctx, e.id, row.repository_id))
        .collect();
    if rows.is_empty() {
        return Ok(());
    }
    prove(ctx, e).await?;
    for (row, repo) in rows {
        let path = match (e.executor_type, &row.worktree_path, repo) {
            (ExecutorType::Worktree, Some(p), _) => PathBuf::from(p),
            (ExecutorType::Local, _, Some(r)) => PathBuf::from(r.path),
            _ => continue,
        };
        // A worktree that is gone, or is no longer a git worktree, is the workspace's state, not berth's
        // failure: a typed 409 that says to reset the environment, never a 500.
        if !path.is_dir() {
            return Err(Error::WorkspaceReuseUnsafe(ReuseCategory::WorkspaceMissing));
        }
        if !path.join(".git").exists() {
            return Err(Error::WorkspaceReuseUnsafe(ReuseCategory::NotAGitWorktree));
        }
        let snap = tokio::task::spawn_blocking(move || status::inspect(&path))
            .await
            .map_err(|e| Error::Internal(e.into()))?
            .map_err(|m| Error::Internal(anyhow::anyhow!("git status: {m}")))?;
        let o = Observation {
            repository_id: row.repository_id,
            session_id,
            kind,
            observed_at: crate::clock::now(),
            branch: snap.branch,
            head_commit: snap.head_commit,
            upstream: snap.upstream,
            ahead: snap.ahead,
            behind: snap.behind,
            files: snap.files,
        };
        record_checked(ctx, e, o).await?;
    }
    Ok(())
}

/// Admission, as a launch would ask it, before a worktree is read: a workspace that is gone, replaced or
/// no longer the repository's becomes `broken` with its category and `environment.broken`, and its stored
/// git status reads stale, whoever found it (a refresh, a live read, a turn's completion). Never `ready`
/// over a worktree that is not there.
pub(crate) async fn prove(ctx: &Ctx, e: &env::Model) -> Result<()> {
    let Some(task) = crate::store::tasks::find(&ctx.db.conn, e.task_id).await? else {
        return Err(Error::NotFound("task"));
    };
    let owner = crate::store::tasks::owner_of(&ctx.db.conn, &task).await?;
    match super::environments::admit(ctx, &owner, e, e.executor_type, false).await? {
        Ok(_) => Ok(()),
        Err(refusal) => {
            let category = ReuseCategory::from(refusal);
            super::environments::mark_broken(ctx, task.id, &owner, e.id, category).await?;
            Err(Error::WorkspaceReuseUnsafe(category))
        }
    }
}

fn due(ctx: &Ctx, env_id: EnvironmentId, repo: RepositoryId) -> bool {
    let mut last = ctx.git_status_inspected.lock().unwrap();
    let now = Instant::now();
    match last.get(&(env_id, repo)) {
        Some(at) if now.duration_since(*at) < ctx.config.git_status_interval => false,
        _ => {
            last.insert((env_id, repo), now);
            true
        }
    }
}

/// An observation reported by an agent-side monitor.
pub async fn report(ctx: &Ctx, p: &Principal, env_id: EnvironmentId, r: Report) -> Result<obs::Model> {
    let view = super::environments::get(ctx, p, env_id).await?;
    let kind = ReportedKind::parse(&r.kind).ok_or_else(|| Error::invalid("kind", "must be live or completion"))?;
    let files = r
        .files
        .into_iter()
        .map(ReportedFile::check)
        .collect::<Result<Vec<_>>>()?;
    let o = Observation {
        repository_id: r.repository_id,
        session_id: r.session_id,
        kind: kind.into(),
        observed_at: r.observed_at,
        branch: r.branch,
        head_commit: r.head_commit,
        upstream: r.upstream,
        ahead: r.ahead,
        behind: r.behind,
        files,
    };
    if o.files.len() > MAX_FILES {
        return Err(Error::invalid(
            "files",
            format!("at most {MAX_FILES} files; summarize the rest"),
        ));
    }
    if o.observed_at > crate::clock::now() + chrono::Duration::seconds(MAX_SKEW_SECS) {
        return Err(Error::invalid("observed_at", "lies in the future"));
    }
    if !view
        .repos
        .iter()
        .any(|r| r.repository_id == o.repository_id && r.status == EnvironmentRepoStatus::Active)
    {
        return Err(Error::invalid("repository_id", "not a repository of this environment"));
    }
    if let Some(sid) = o.session_id {
        let ok = sessions_store::environment_of(&ctx.db.conn, sid).await? == Some(env_id);
        if !ok || p.session_id.is_some_and(|bound| bound != sid) {
            return Err(Error::invalid("session_id", "not a session of this environment"));
        }
    }
    if !matches!(view.env.status, EnvironmentStatus::Ready | EnvironmentStatus::Stopped) {
        return Err(Error::InvalidState(
            "only a ready environment takes observations".into(),
        ));
    }
    record_checked(ctx, &view.env, o).await
}

/// Writes an observation by the rules of I22/I23, retrying once if a concurrent live report won the race
/// for the single live row.
async fn record_checked(ctx: &Ctx, e: &env::Model, o: Observation) -> Result<obs::Model> {
    match record(ctx, e, &o).await {
        Err(Error::Internal(err))
            if err
                .downcast_ref::<sea_orm::DbErr>()
                .is_some_and(crate::error::is_unique_violation) =>
        {
            record(ctx, e, &o).await
        }
        other => other,
    }
}

async fn record(ctx: &Ctx, e: &env::Model, o: &Observation) -> Result<obs::Model> {
    let txn = ctx.db.begin_write().await?;
    // The environment's row serializes writers of its status (PostgreSQL), and a superseded environment
    // takes nothing: its status must never become current (I20).
    let locked = env_store::lock(&txn, e.id)
        .await?
        .ok_or(Error::NotFound("environment"))?;
    if !matches!(locked.status, EnvironmentStatus::Ready | EnvironmentStatus::Stopped) {
        return Err(Error::InvalidState(
            "only a ready environment takes observations".into(),
        ));
    }
    // A clock running ahead must not outrank every later observation.
    let mut o = o.clone();
    o.observed_at = o.observed_at.min(crate::clock::now());
    let current = store::newest_locked(&txn, e.id, o.repository_id).await?;
    let becomes_current = current.as_ref().is_none_or(|c| o.observed_at >= c.observed_at);
    let model = row(e, &o)?;
    if let Some(kept) = write(&txn, &model, becomes_current).await? {
        txn.rollback().await?;
        return Ok(kept);
    }
    if becomes_current && let Some(owner) = crate::store::tasks::find(&txn, e.task_id).await? {
        // I24: the identity is the environment's and the repository's.
        let subject = Subject {
            task_environment_id: Some(e.id),
            session_id: o.session_id,
            ..Subject::task(owner.workspace_id, owner.id)
        };
        events::append(
            &txn,
            ctx.instance_id,
            EventType::GitStatusUpdated,
            subject,
            json!({ "repository_id": o.repository_id, "kind": o.kind, "observed_at": o.observed_at }),
        )
        .await?;
    }
    ctx.commit(txn).await?;
    Ok(model)
}

fn row(e: &env::Model, o: &Observation) -> Result<obs::Model> {
    let files = serde_json::to_value(&o.files).map_err(|e| Error::Internal(e.into()))?;
    Ok(obs::Model {
        id: ObservationId::now_v7(),
        task_environment_id: e.id,
        repository_id: o.repository_id,
        session_id: o.session_id,
        kind: o.kind,
        observed_at: o.observed_at,
        branch: o.branch.clone(),
        head_commit: o.head_commit.clone(),
        upstream: o.upstream.clone(),
        ahead: o.ahead,
        behind: o.behind,
        files,
        created_at: crate::clock::now(),
        imported_from: None,
    })
}

/// Stores `model` by I23's rules. Returns the live row that stays instead when the report is older.
async fn write(
    txn: &sea_orm::DatabaseTransaction,
    model: &obs::Model,
    becomes_current: bool,
) -> Result<Option<obs::Model>> {
    let (env_id, repo) = (model.task_environment_id, model.repository_id);
    match model.kind {
        ObservationKind::Live => match store::live_row(txn, env_id, repo).await? {
            // I23: one live row per pair; an older live report changes nothing.
            Some(live) if live.observed_at > model.observed_at => return Ok(Some(live)),
            // One live row: the old one goes, the new one (a fresh, larger id) takes its place.
            Some(live) => store::delete(txn, live.id).await?,
            None => {}
        },
        ObservationKind::Completion if becomes_current => {
            // I23: a completion capture supersedes earlier live and completion observations.
            let kinds = [ObservationKind::Live, ObservationKind::Completion];
            store::delete_kinds_up_to(txn, env_id, repo, &kinds, model.observed_at).await?;
        }
        ObservationKind::Completion | ObservationKind::Archive => {}
    }
    store::insert(txn, model).await?;
    Ok(None)
}

/// After an agent finishes a turn: berth captures a completion observation itself (seed 004).
pub(crate) async fn capture_completion(ctx: &Ctx, session_id: SessionId) {
    let result: Result<()> = async {
        let Some(env_id) = sessions_store::environment_of(&ctx.db.conn, session_id).await? else {
            return Ok(());
        };
        let Some(e) = env_store::find(&ctx.db.conn, env_id).await? else {
            return Ok(());
        };
        if matches!(e.status, EnvironmentStatus::Ready | EnvironmentStatus::Stopped) {
            inspect_and_record(ctx, &e, ObservationKind::Completion, Some(session_id), false).await?;
        }
        Ok(())
    }
    .await;
    if let Err(e) = result {
        tracing::warn!(session = %session_id, error = %e, "could not capture a completion status");
    }
}

pub type InspectionClock = std::sync::Mutex<HashMap<(EnvironmentId, RepositoryId), Instant>>;
