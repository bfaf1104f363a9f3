//! The `creating` lease (I14): a materializer keeps its row fresh while it works; a row whose lease
//! expired is stale (`recovery` takes such rows over).
use crate::domain::Ctx;
use crate::entity::task_environment::{self as env, EnvironmentStatus};
use crate::ids::InstanceId;
use crate::store::environments as store;

pub(crate) use crate::domain::cleanup::InFlight;

pub(super) fn lease(ctx: &Ctx) -> chrono::Duration {
    chrono::Duration::from_std(ctx.config.materialize_lease).unwrap_or(chrono::Duration::minutes(5))
}

pub(crate) fn is_fresh_creating(ctx: &Ctx, e: &env::Model) -> bool {
    e.status == EnvironmentStatus::Creating && e.updated_at > crate::clock::now() - lease(ctx)
}

/// The materializations this process is running, by materializer id: a cleanup job here can tell that
/// one it waits for has finished (removing what it made, its git calls returned) without waiting out
/// its lease.
#[derive(Default)]
pub struct Materializing {
    running: std::sync::Mutex<std::collections::HashSet<InstanceId>>,
    /// Told whenever one is forgotten.
    finished: tokio::sync::Notify,
}

/// Held while a materialization runs; dropping it (on every way out) forgets the materialization.
pub(crate) struct Running(std::sync::Arc<Materializing>, Option<InstanceId>);

impl Materializing {
    /// Marks a materialization as running here from its election on (before the election commits, so
    /// that no mutation can see its `creating` row without seeing it here); `hold` takes it over.
    pub(super) fn register(&self, materializer_id: Option<InstanceId>) {
        if let Some(id) = materializer_id {
            self.running.lock().unwrap_or_else(|p| p.into_inner()).insert(id);
        }
    }

    pub(super) fn forget(&self, materializer_id: Option<InstanceId>) {
        if let Some(id) = materializer_id {
            self.running.lock().unwrap_or_else(|p| p.into_inner()).remove(&id);
            self.finished.notify_waiters();
        }
    }

    pub(super) fn hold(self: &std::sync::Arc<Self>, materializer_id: Option<InstanceId>) -> Running {
        self.register(materializer_id);
        Running(self.clone(), materializer_id)
    }

    pub(crate) fn is_running(&self, materializer_id: Option<InstanceId>) -> bool {
        materializer_id.is_some_and(|id| self.running.lock().unwrap_or_else(|p| p.into_inner()).contains(&id))
    }

    /// Waits until the materialization is no longer running here, or `deadline`: whether it finished.
    pub(crate) async fn finished(&self, materializer_id: Option<InstanceId>, deadline: tokio::time::Instant) -> bool {
        loop {
            let told = self.finished.notified();
            tokio::pin!(told);
            // Registered before the look, so a `forget` right after it is not missed.
            told.as_mut().enable();
            if !self.is_running(materializer_id) {
                return true;
            }
            if tokio::time::timeout_at(deadline, told).await.is_err() {
                return !self.is_running(materializer_id);
            }
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.0.forget(self.1);
    }
}

/// A fresh `creating` environment, as a job that removes its row sees it: until when its materializer
/// may still be making worktrees no row records (counted from now: the mutation that removes the row
/// in the transaction this is called from ends its heartbeats), and whether it runs in this process.
pub(crate) fn in_flight(ctx: &Ctx, e: &env::Model) -> Option<InFlight> {
    is_fresh_creating(ctx, e).then(|| InFlight {
        until: crate::clock::now() + lease(ctx),
        materializer_id: e.materializer_id,
        here: ctx
            .materializing
            .is_running(e.materializer_id)
            .then_some(ctx.instance_id),
    })
}

/// Whether a job must still wait for the materializer `in_flight` saw, and until when.
pub(crate) fn still_in_flight(ctx: &Ctx, f: &InFlight) -> Option<chrono::DateTime<chrono::Utc>> {
    let now = crate::clock::now();
    if f.here == Some(ctx.instance_id) {
        // Ours, so known exactly, lease or not: done when it is no longer running (its git calls returned,
        // what it made removed); look again shortly while it is.
        return ctx
            .materializing
            .is_running(f.materializer_id)
            .then_some(now + chrono::Duration::seconds(1));
    }
    if f.until <= now {
        // Its lease is out: whatever it still does, its planned paths are this job's.
        return None;
    }
    // Another process's (or one a restart left behind, its git calls perhaps still running): its lease.
    Some(f.until)
}

/// Keeps a `creating` environment's lease fresh until dropped (on every way out of its materializer):
/// a first materialization while it runs, a transition's candidate from its election until the launch
/// promotes or abandons it.
pub(crate) struct Lease(tokio::task::AbortHandle);

impl Lease {
    pub(super) fn keep(ctx: &Ctx, e: &env::Model) -> Self {
        Lease(tokio::spawn(heartbeat(ctx.clone(), e.clone())).abort_handle())
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Touches the row every quarter lease while it is still `creating` and held by this materializer.
async fn heartbeat(ctx: Ctx, e: env::Model) {
    let every = (ctx.config.materialize_lease / 4).max(std::time::Duration::from_millis(200));
    loop {
        tokio::time::sleep(every).await;
        if !matches!(store::touch_held(&ctx.db.conn, e.id, e.materializer_id).await, Ok(true)) {
            return;
        }
    }
}
