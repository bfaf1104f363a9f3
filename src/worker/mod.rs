//! Background work beside the API: cleanup-job workers (`cleanup`) and periodic sweeps (event retention,
//! quick-chat expiry).
pub mod cleanup;
use std::time::Duration;

use crate::domain::Ctx;
use cleanup::chain;

/// Trims events by count and age, expires idle quick chats, purges expired idempotency keys and takes
/// over abandoned materializations,
/// every `interval`, forever.
pub async fn sweep(ctx: Ctx, interval: Duration) {
    let mut ticker = tokio::time::interval(interval);
    loop {
        ticker.tick().await;
        match crate::domain::retention::trim_events(&ctx).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(trimmed = n, "event retention"),
            Err(e) => tracing::warn!(error = %chain(e), "event retention failed"),
        }
        if let Err(e) = crate::domain::task_lifecycle::expire_quick_chats(&ctx).await {
            tracing::warn!(error = %chain(e), "quick-chat expiry failed");
        }
        match crate::domain::retention::purge_idempotency_keys(&ctx).await {
            Ok(0) => {}
            Ok(n) => tracing::debug!(purged = n, "expired idempotency keys"),
            Err(e) => tracing::warn!(error = %chain(e), "purging idempotency keys failed"),
        }
        match crate::domain::environments::recover_abandoned(&ctx).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(recovered = n, "took over abandoned materializations"),
            Err(e) => tracing::warn!(error = %chain(e), "recovering abandoned materializations failed"),
        }
    }
}
