//! How far behind a subscription may fall and still hold event retention. One whose oldest undelivered
//! event is older than `BERTH_WEBHOOK_MAX_LAG_SECS` is marked `lagging` (with a `webhook.lagging` event):
//! retention then ignores its cursor, so a receiver that fails or is slow, or a subscription disabled and
//! enabled again, keeps no one else's events past their retention. It goes on delivering; when retention
//! has taken events it had not delivered, the deliverer resumes from the oldest kept and says what it
//! skipped (`webhook.skipped`). It holds retention again once it is less than half that far behind.
use serde_json::json;

use super::Ctx;
use crate::error::Result;
use crate::events::{self, EventType, Filter, Subject};
use crate::store::webhooks as store;

/// Marks the enabled subscriptions too far behind lagging, and those caught up not lagging.
pub async fn mark(ctx: &Ctx) -> Result<()> {
    let conn = &ctx.db.conn;
    let max = chrono::Duration::from_std(ctx.config.webhook_max_lag).unwrap_or(chrono::Duration::MAX);
    let now = crate::clock::now();
    for w in store::enabled(conn).await? {
        let oldest = events::after(conn, w.cursor, 1, &Filter::default()).await?;
        let behind = oldest
            .first()
            .map(|e| now - e.created_at)
            .unwrap_or_else(chrono::Duration::zero);
        if !w.lagging && behind > max {
            let txn = ctx.db.begin_write().await?;
            if store::set_lagging(&txn, w.id, true).await? {
                let subject = Subject {
                    workspace_id: w.workspace_id,
                    ..Default::default()
                };
                let data = json!({
                    "webhook_id": w.id,
                    "url": super::shown_url(&w.url),
                    "cursor": w.cursor,
                    "behind_secs": behind.num_seconds(),
                });
                events::append(&txn, ctx.instance_id, EventType::WebhookLagging, subject, data).await?;
            }
            ctx.commit(txn).await?;
            tracing::warn!(webhook = %w.id, behind_secs = behind.num_seconds(), "webhook lagging: it holds no event retention");
        } else if w.lagging && behind <= max / 2 {
            store::set_lagging(conn, w.id, false).await?;
        }
    }
    Ok(())
}

/// After a skip: the subscription's position moved past what retention took, with the event saying so,
/// in one transaction (while `owner` delivers it); whether it did.
pub async fn record_skip(
    ctx: &Ctx,
    w: &crate::entity::webhook::Model,
    position: &store::Position,
    from_seq: i64,
) -> Result<bool> {
    let txn = ctx.db.begin_write().await?;
    if !store::set_position(&txn, w.id, ctx.instance_id, position).await? {
        txn.rollback().await?;
        return Ok(false);
    }
    let subject = Subject {
        workspace_id: w.workspace_id,
        ..Default::default()
    };
    let data = json!({
        "webhook_id": w.id,
        "url": super::shown_url(&w.url),
        "from_seq": from_seq,
        "to_seq": position.cursor,
    });
    events::append(&txn, ctx.instance_id, EventType::WebhookSkipped, subject, data).await?;
    ctx.commit(txn).await?;
    tracing::warn!(webhook = %w.id, from_seq, to_seq = position.cursor, "webhook skipped events retention took");
    Ok(true)
}
