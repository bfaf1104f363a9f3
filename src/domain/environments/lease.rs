//! The `creating` lease (I14): a materializer keeps its row fresh while it works; a row whose lease
//! expired is stale (`recovery` takes such rows over).
use crate::domain::Ctx;
use crate::entity::task_environment::{self as env, EnvironmentStatus};
use crate::store::environments as store;

pub(super) fn lease(ctx: &Ctx) -> chrono::Duration {
    chrono::Duration::from_std(ctx.config.materialize_lease).unwrap_or(chrono::Duration::minutes(5))
}

pub(crate) fn is_fresh_creating(ctx: &Ctx, e: &env::Model) -> bool {
    e.status == EnvironmentStatus::Creating && e.updated_at > crate::clock::now() - lease(ctx)
}

/// Keeps a `creating` environment's lease fresh while its materializer works.
pub(super) async fn heartbeat(ctx: Ctx, e: env::Model) {
    let every = (ctx.config.materialize_lease / 4).max(std::time::Duration::from_millis(200));
    loop {
        tokio::time::sleep(every).await;
        if !matches!(store::touch_held(&ctx.db.conn, e.id, e.materializer_id).await, Ok(true)) {
            return;
        }
    }
}
