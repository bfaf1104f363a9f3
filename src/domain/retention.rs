//! What the periodic sweep forgets: events past their retention (keeping what an enabled webhook
//! subscription has yet to deliver) and idempotency keys past their expiry.
use crate::domain::Ctx;
use crate::error::Result;
use crate::{events, store};

/// Retention by count and age, keeping every event after the lowest enabled webhook cursor: the events
/// trimmed.
pub async fn trim_events(ctx: &Ctx) -> Result<u64> {
    let undelivered = store::webhooks::lowest_enabled_cursor(&ctx.db.conn).await?;
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
