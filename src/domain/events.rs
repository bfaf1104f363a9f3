//! Who may read which events, and what a cursor means.
use uuid::Uuid;

use super::Ctx;
use crate::auth::Principal;
use crate::entity::event;
use crate::error::{Error, Result};
use crate::events::{self, Filter};

pub const DEFAULT_LIMIT: u64 = 100;
pub const MAX_LIMIT: u64 = 1000;

pub struct ReplayPage {
    pub instance_id: Uuid,
    pub first_available_seq: i64,
    pub latest_seq: i64,
    pub truncated: bool,
    pub events: Vec<event::Model>,
}

/// The token's view of the event log: its workspaces, and for an agent's token its session and its
/// session's environment.
pub async fn filter_for(ctx: &Ctx, p: &Principal) -> Result<Filter> {
    let environment_id = match p.session_id {
        Some(sid) => crate::store::sessions::environment_of(&ctx.db.conn, sid).await?,
        None => None,
    };
    Ok(Filter {
        workspaces: p.workspace_filter().map(<[Uuid]>::to_vec),
        session_id: p.session_id,
        environment_id,
    })
}

/// A cursor is a non-negative integer (the last seq a client saw).
pub fn parse_cursor(raw: Option<&str>) -> Result<i64> {
    match raw.map(str::trim) {
        None | Some("") => Ok(0),
        Some(s) => s.parse::<i64>().ok().filter(|n| *n >= 0).ok_or(Error::InvalidCursor),
    }
}

/// True when the client must reload snapshots: its instance is not this one, or events after its
/// cursor were already trimmed.
pub fn is_truncated(ctx: &Ctx, after: i64, instance_id: Option<Uuid>, first_available: i64) -> bool {
    instance_id.is_some_and(|i| i != ctx.instance_id) || after + 1 < first_available
}

pub async fn replay(
    ctx: &Ctx,
    p: &Principal,
    after: i64,
    instance_id: Option<Uuid>,
    limit: Option<u64>,
) -> Result<ReplayPage> {
    let limit = limit.unwrap_or(DEFAULT_LIMIT);
    if !(1..=MAX_LIMIT).contains(&limit) {
        return Err(Error::BadRequest(format!("limit must be between 1 and {MAX_LIMIT}")));
    }
    let events = events::after(&ctx.db.conn, after, limit, &filter_for(ctx, p).await?).await?;
    // Bounds after the read: retention trims a prefix, so a page read before a concurrent trim reached
    // `after` is whole, and one it raced is reported truncated (never a silent gap).
    let (first_available_seq, latest_seq) = events::bounds(&ctx.db.conn).await?;
    let truncated = is_truncated(ctx, after, instance_id, first_available_seq);
    Ok(ReplayPage {
        instance_id: ctx.instance_id,
        first_available_seq,
        latest_seq,
        truncated,
        events,
    })
}
