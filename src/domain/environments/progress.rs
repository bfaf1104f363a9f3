//! A materialization's progress (`environment.progress`): one event per repository and stage,
//! recorded behind the work by one writer, and the stages still queued when the work ends handed to
//! the transaction that follows.
use crate::ids::{EnvironmentId, RepositoryId};
use sea_orm::DatabaseTransaction;
use serde_json::json;

use super::state::env_subject;
use crate::domain::Ctx;
use crate::entity::task;
use crate::error::Result;
use crate::events::{self, EventType};
use crate::executor::worktree;

/// A repository's stage, waiting to be recorded.
pub(super) type Stage = (RepositoryId, worktree::Stage);

/// Records each repository's progress as an `environment.progress` event, behind the work: a stage is
/// queued and the materialization goes on at once; one writer appends the queued stages in order, all
/// that are waiting in one small transaction (progress is shown while the materialization goes on, and
/// need not hold it up). A failure of the writer to record progress only goes to the log; what it
/// hands back is recorded by its caller's transaction.
pub(super) fn reporter(
    ctx: &Ctx,
    owner: &task::Model,
    env_id: EnvironmentId,
) -> (
    impl Fn(RepositoryId, worktree::Stage) -> futures_util::future::BoxFuture<'static, ()> + Send + Sync + use<>,
    ProgressWriter,
) {
    // `None` asks the writer to hand back what is queued before it, unwritten.
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Option<Stage>>();
    let (ctx, subject) = (ctx.clone(), env_subject(owner, env_id));
    let handle = crate::actor::spawn(async move {
        let mut batch = Vec::new();
        while rx.recv_many(&mut batch, 64).await > 0 {
            if let Some(at) = batch.iter().position(Option::is_none) {
                return batch.drain(..at).flatten().collect();
            }
            let recorded = async {
                let txn = ctx.db.begin_write().await?;
                // Events only, unread until stamped: the stamp's flush makes them durable first.
                crate::store::Db::unflushed(&txn).await?;
                append_progress(&txn, &ctx, &subject, batch.drain(..).flatten()).await?;
                ctx.commit(txn).await
            };
            if let Err(e) = recorded.await {
                tracing::warn!(error = %e, environment = %env_id, "could not record environment progress");
            }
            batch.clear();
        }
        Vec::new()
    });
    let writer = ProgressWriter { tx: tx.clone(), handle };
    let report = move |repository_id, stage| {
        let _ = tx.send(Some((repository_id, stage)));
        Box::pin(std::future::ready(())) as futures_util::future::BoxFuture<'static, ()>
    };
    (report, writer)
}

/// The writer of a [`reporter`]; its methods are called once the reporter is dropped.
pub(super) struct ProgressWriter {
    tx: tokio::sync::mpsc::UnboundedSender<Option<Stage>>,
    handle: tokio::task::JoinHandle<Vec<Stage>>,
}

impl ProgressWriter {
    /// Waits for the stages being written, and returns those still queued, for the caller to append in
    /// the transaction that follows (the publish: one commit fewer on the way to the answer).
    pub(super) async fn hand_over(self, env_id: EnvironmentId) -> Vec<Stage> {
        let _ = self.tx.send(None);
        self.joined(env_id).await
    }

    /// Waits until every queued stage is written.
    pub(super) async fn finish(self, env_id: EnvironmentId) {
        self.joined(env_id).await;
    }

    async fn joined(self, env_id: EnvironmentId) -> Vec<Stage> {
        // The channel closes with this sender (the reporter's is gone): the writer ends once it is empty.
        drop(self.tx);
        self.handle.await.unwrap_or_else(|_| {
            tracing::warn!(environment = %env_id, "the progress writer of a materialization panicked");
            Vec::new()
        })
    }
}

/// Appends `stages` as `environment.progress` events of `subject`, in order.
pub(super) async fn append_progress(
    txn: &DatabaseTransaction,
    ctx: &Ctx,
    subject: &events::Subject,
    stages: impl Iterator<Item = Stage>,
) -> Result<()> {
    for (repository_id, stage) in stages {
        let data = json!({ "repository_id": repository_id, "stage": stage });
        events::append(
            txn,
            ctx.instance_id,
            EventType::EnvironmentProgress,
            subject.clone(),
            data,
        )
        .await?;
    }
    Ok(())
}
