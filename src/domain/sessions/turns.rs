//! A session's turns: each prompt delivered to the agent starts one, its settling ends it, and a
//! checkpoint of the environment is taken at both ends (the start one before the agent has the prompt,
//! so it holds the worktree as the agent found it; the end one after the turn's answer, never holding it
//! up). A turn's diff is what changed between its two checkpoints.
use crate::ids::{CheckpointId, SessionId, TurnId};

use super::Ctx;
use crate::auth::Principal;
use crate::domain::checkpoints;
use crate::domain::diff::{Diff, RepositoryDiff};
use crate::domain::writer::{self, WriterLease};
use crate::entity::session_turn as turn;
use crate::entity::task_session as session;
use crate::error::{Error, Result};
use crate::store::turns as store;

/// The checkpoint a prompt's turn starts from; `None` when none could be taken (said in the log: a turn
/// is never refused for it).
async fn checkpoint_now(ctx: &Ctx, s: &session::Model, lease: Option<&WriterLease>) -> Option<CheckpointId> {
    let lease = lease?;
    let e = crate::store::environments::find(&ctx.db.conn, lease.environment_id())
        .await
        .ok()??;
    match checkpoints::take(ctx, &e, Some(s.id), lease).await {
        Ok(c) => c.map(|c| c.id),
        Err(err) => {
            tracing::warn!(session = %s.id, error = %err, "no checkpoint at the start of the turn");
            None
        }
    }
}

/// A prompt is about to go to the agent: its turn, with the checkpoint it starts from. Recorded before
/// the agent has the prompt, so that its settling always finds it.
pub(super) async fn start(ctx: &Ctx, s: &session::Model, prompt: &str, lease: Option<&WriterLease>) -> Result<TurnId> {
    let start = checkpoint_now(ctx, s, lease).await;
    let t = turn::Model {
        id: TurnId::now_v7(),
        session_id: s.id,
        task_environment_id: s.task_environment_id,
        number: 0,
        prompt: prompt.to_string(),
        started_at: crate::clock::now(),
        settled_at: None,
        start_checkpoint_id: start,
        end_checkpoint_id: None,
        files_changed: None,
    };
    Ok(store::insert_turn(&ctx.db.conn, t).await?.id)
}

/// The agent did not take the prompt: no turn.
pub(super) async fn take_back(ctx: &Ctx, turn_id: TurnId) -> Result<()> {
    store::delete_turn(&ctx.db.conn, turn_id).await
}

/// The session's open turn settled: its end checkpoint, and how many files it changed.
/// The writer lease the turn held is given back after its end checkpoint, whatever became of it.
pub(crate) async fn settled(ctx: &Ctx, session_id: SessionId) {
    let lease = match writer::resume_turn(ctx, session_id).await {
        Ok(lease) => lease,
        Err(err) => {
            tracing::warn!(session = %session_id, error = %err, "could not read the turn's writer lease");
            None
        }
    };
    if let Err(err) = settle(ctx, session_id, lease.as_ref()).await {
        tracing::warn!(session = %session_id, error = ?err, "could not record the end of the turn");
    }
    if let Some(lease) = lease {
        writer::release(ctx, lease).await;
    }
}

/// Without the lease (the session stopped meanwhile, a cleanup took over) the turn settles without an
/// end checkpoint: nothing is written after another writer began.
async fn settle(ctx: &Ctx, session_id: SessionId, lease: Option<&WriterLease>) -> Result<()> {
    let conn = &ctx.db.conn;
    let Some(t) = store::open_turn(conn, session_id).await? else {
        return Ok(());
    };
    let env = match (t.task_environment_id, lease) {
        (Some(id), Some(lease)) if lease.environment_id() == id => {
            crate::store::environments::find(conn, id).await?.map(|e| (e, lease))
        }
        _ => None,
    };
    let (mut end, mut changed) = (None, None);
    if let Some((e, lease)) = &env
        && let Some(c) = checkpoints::take(ctx, e, Some(session_id), lease).await?
    {
        if let Some(start) = match t.start_checkpoint_id {
            Some(id) => store::checkpoint(conn, id).await?,
            None => None,
        } {
            // Counted, never a patch built: an agent's big files cost berth nothing here.
            changed = Some(checkpoints::files_changed(ctx, e, &start, &c).await? as i32);
        }
        end = Some(c.id);
    }
    store::settle_turn(conn, t.id, crate::clock::now(), end, changed).await
}

pub async fn list(ctx: &Ctx, p: &Principal, session_id: SessionId) -> Result<Vec<turn::Model>> {
    let s = super::visible(&ctx.db.conn, p, session_id).await?;
    store::turns_of(&ctx.db.conn, s.id).await
}

/// What turn `number` changed, in the diff shape, and its ETag.
pub async fn diff(
    ctx: &Ctx,
    p: &Principal,
    session_id: SessionId,
    number: i32,
    context: u32,
) -> Result<(Diff, String)> {
    let s = super::visible(&ctx.db.conn, p, session_id).await?;
    let conn = &ctx.db.conn;
    let t = store::turn(conn, s.id, number).await?.ok_or(Error::NotFound("turn"))?;
    let (Some(from), Some(to)) = (t.start_checkpoint_id, t.end_checkpoint_id) else {
        return Err(Error::InvalidState(
            "the turn has no checkpoint at both ends (it has not settled, or none could be taken)".into(),
        ));
    };
    let env_id = t.task_environment_id.ok_or(Error::NotFound("environment"))?;
    let e = crate::store::environments::find(conn, env_id)
        .await?
        .ok_or(Error::NotFound("environment"))?;
    crate::domain::nodes::here(ctx, &e.node_id).await?;
    let (from, to) = (
        store::checkpoint(conn, from)
            .await?
            .ok_or(Error::NotFound("checkpoint"))?,
        store::checkpoint(conn, to)
            .await?
            .ok_or(Error::NotFound("checkpoint"))?,
    );
    let slots = crate::store::tasks::slots_of(conn, e.task_id).await?;
    let mut total = 0u64;
    let mut repositories = Vec::new();
    for (repository_id, position, base, head, files) in
        checkpoints::changes_between(ctx, &e, &from, &to, context, &[], crate::domain::diff::keep(ctx)).await?
    {
        total += files.len() as u64;
        repositories.push(RepositoryDiff {
            repository_id,
            base_branch: slots
                .iter()
                .find(|s| s.position == position)
                .and_then(|s| s.base_branch.clone())
                .unwrap_or_default(),
            base: Some(base),
            head: Some(head),
            files: files
                .into_iter()
                .map(|f| crate::domain::diff::file(f, ctx.config.diff_max_file_bytes))
                .collect(),
        });
    }
    let answer = Diff {
        task_environment_id: e.id,
        scope: "turn".into(),
        repositories,
        total_files: total,
        next_cursor: None,
    };
    crate::domain::diff::tagged(answer, 't')
}
