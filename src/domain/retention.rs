//! What the periodic sweep forgets: events past their retention (keeping what an enabled webhook
//! subscription that is not lagging has yet to deliver) and idempotency keys past their expiry.
use crate::domain::Ctx;
use crate::error::Result;
use crate::{events, store};

/// Retention by count and age, keeping every event after the lowest cursor of an enabled webhook
/// subscription that is not lagging (first marked, here, by how far behind each is): the events trimmed.
/// A subscription more than `BERTH_WEBHOOK_MAX_LAG_SECS` behind holds no one's retention.
pub async fn trim_events(ctx: &Ctx) -> Result<u64> {
    crate::domain::webhooks::lag::mark(ctx).await?;
    let undelivered = store::webhooks::lowest_holding_cursor(&ctx.db.conn).await?;
    Ok(events::trim(
        &ctx.db.conn,
        ctx.config.event_retention_count,
        ctx.config.event_retention_age,
        undelivered,
    )
    .await?)
}

/// Idempotency keys whose replay window has passed: the keys purged.
pub async fn purge_idempotency_keys(ctx: &Ctx) -> Result<u64> {
    store::idempotency::purge_expired(&ctx.db.conn, crate::clock::now()).await
}
