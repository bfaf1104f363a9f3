//! Who may read which events, and what a cursor means.
use crate::ids::{InstanceId, WorkspaceId};

use super::Ctx;
use crate::auth::Principal;
use crate::entity::event;
use crate::error::{Error, Result};
use crate::events::{self, EventType, Filter, Narrowing};

pub const DEFAULT_LIMIT: u64 = 100;
pub const MAX_LIMIT: u64 = 1000;

pub struct ReplayPage {
    pub instance_id: InstanceId,
    pub first_available_seq: i64,
    pub latest_seq: i64,
    pub truncated: bool,
    pub events: Vec<event::Model>,
}

/// The token's view of the event log, narrowed by what the reader asked for.
pub async fn filter_for(ctx: &Ctx, p: &Principal, narrow: Narrowing) -> Result<Filter> {
    Ok(Filter {
        narrow,
        ..view_of(ctx, p).await?
    })
}

/// The token's view of the event log: its workspaces, and for an agent's token its session and its
/// session's environment.
async fn view_of(ctx: &Ctx, p: &Principal) -> Result<Filter> {
    let environment_id = match p.session_id {
        Some(sid) => crate::store::sessions::environment_of(&ctx.db.conn, sid).await?,
        None => None,
    };
    Ok(Filter {
        workspaces: p.workspace_filter().map(<[WorkspaceId]>::to_vec),
        session_id: p.session_id,
        environment_id,
        narrow: Narrowing::default(),
    })
}

/// Parses `types`: comma-separated entries, each an exact event type (`session.state_changed`) or a
/// prefix ending in `.` (`session.`). An entry that matches no type is refused, so a typo never reads
/// as "no events".
pub fn parse_types(raw: Option<&str>) -> Result<Option<Vec<EventType>>> {
    use sea_orm::Iterable;
    let Some(raw) = raw else { return Ok(None) };
    let mut types = Vec::new();
    for entry in raw.split(',').map(str::trim) {
        let matching: Vec<EventType> = EventType::iter()
            .filter(|t| {
                if entry.ends_with('.') {
                    t.as_str().starts_with(entry)
                } else {
                    t.as_str() == entry
                }
            })
            .collect();
        if matching.is_empty() {
            return Err(Error::BadRequest(format!(
                "types: {entry:?} is neither an event type nor a prefix of one ending in \".\""
            )));
        }
        for t in matching {
            if !types.contains(&t) {
                types.push(t);
            }
        }
    }
    Ok(Some(types))
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
pub fn is_truncated(ctx: &Ctx, after: i64, instance_id: Option<InstanceId>, first_available: i64) -> bool {
    instance_id.is_some_and(|i| i != ctx.instance_id) || after + 1 < first_available
}

pub async fn replay(
    ctx: &Ctx,
    p: &Principal,
    narrow: Narrowing,
    after: i64,
    instance_id: Option<InstanceId>,
    limit: Option<u64>,
) -> Result<ReplayPage> {
    let limit = limit.unwrap_or(DEFAULT_LIMIT);
    if !(1..=MAX_LIMIT).contains(&limit) {
        return Err(Error::BadRequest(format!("limit must be between 1 and {MAX_LIMIT}")));
    }
    let filter = filter_for(ctx, p, narrow).await?;
    if !ctx.db.is_sqlite() {
        // Whatever committed before this read is in it (stamping follows the commit).
        events::sequencer::settle(&ctx.events, &ctx.db.conn).await?;
    }
    let events = events::after(&ctx.db.conn, after, limit, &filter).await?;
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

/// How long a stream ticket may wait to be redeemed.
pub const TICKET_TTL: chrono::Duration = chrono::Duration::seconds(60);

/// A freshly minted stream ticket: the only time its value exists outside the caller.
pub struct MintedTicket {
    pub ticket: String,
    pub expires_at: chrono::DateTime<chrono::Utc>,
}

fn ticket_hash(ticket: &str) -> String {
    use sha2::{Digest, Sha256};
    Sha256::digest(ticket.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Mints a single-use stream ticket for `p`: 32 random bytes (URL-safe base64), stored only as its
/// SHA-256 with `p`'s sub, scopes, workspaces and session binding. Tickets that expired are deleted
/// on the way.
pub async fn mint_ticket(ctx: &Ctx, p: &Principal) -> Result<MintedTicket> {
    use base64::Engine;
    let mut raw = [0u8; 32];
    getrandom::fill(&mut raw).map_err(|e| Error::Internal(anyhow::anyhow!("no random source: {e}")))?;
    let ticket = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(raw);
    let now = crate::clock::now();
    let expires_at = now + TICKET_TTL;
    crate::store::event_tickets::delete_expired(&ctx.db.conn, now).await?;
    crate::store::event_tickets::insert(
        &ctx.db.conn,
        crate::entity::event_ticket::Model {
            ticket_hash: ticket_hash(&ticket),
            sub: p.sub.clone(),
            scopes: p.scopes().iter().map(|s| s.as_str()).collect::<Vec<_>>().join(" "),
            workspaces: p.workspace_filter().map(|ids| serde_json::json!(ids)),
            session_id: p.session_id,
            created_at: now,
            expires_at,
            used_at: None,
        },
    )
    .await?;
    Ok(MintedTicket { ticket, expires_at })
}

/// Redeems a stream ticket (once, on any replica) and returns the principal it carries. Unknown, used
/// and expired tickets are the same opaque 401.
pub async fn redeem_ticket(ctx: &Ctx, ticket: &str) -> Result<Principal> {
    const REFUSED: Error = Error::Unauthenticated("invalid, used or expired ticket");
    let row = crate::store::event_tickets::redeem(&ctx.db.conn, &ticket_hash(ticket), crate::clock::now())
        .await?
        .ok_or(REFUSED)?;
    let workspaces = match row.workspaces {
        None => None,
        Some(v) => Some(serde_json::from_value::<Vec<WorkspaceId>>(v).map_err(|_| REFUSED)?),
    };
    let scopes = row.scopes.split_whitespace().filter_map(|s| s.parse().ok()).collect();
    Ok(Principal::new(row.sub, scopes, workspaces, row.session_id))
}
