//! HTTP for the event log: replay, and the server-sent event stream.
use crate::ids::{InstanceId, SessionId, TaskId, WorkspaceId};
use actix_web::http::header;
use actix_web::web::Bytes;
use actix_web::{FromRequest, HttpRequest, HttpResponse, get, post, web};
use chrono::{DateTime, Utc};
use futures_util::StreamExt;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use utoipa_actix_web::service_config::ServiceConfig;

use super::AppState;
use super::extract::{Authorized, EventsRead};
use crate::domain::events::{self as domain_events, ReplayPage};
use crate::error::Error;
use crate::events::Narrowing;
use crate::events::stream::{self, Frame, StreamRequest};

pub fn routes(cfg: &mut ServiceConfig) {
    cfg.service(replay_events)
        .service(stream_events)
        .service(create_stream_ticket);
}

pub use crate::events::wire::{Actor, Event};

#[derive(Debug, Serialize, ToSchema)]
pub struct EventPage {
    /// This server generation; a client holding another must reload snapshots.
    pub instance_id: InstanceId,
    /// The oldest retained seq.
    pub first_available_seq: i64,
    pub latest_seq: i64,
    /// True when `instance_id` was given and is not this one, or when events after `after` were trimmed:
    /// reload snapshots.
    pub truncated: bool,
    pub events: Vec<Event>,
}

impl From<ReplayPage> for EventPage {
    fn from(p: ReplayPage) -> Self {
        EventPage {
            instance_id: p.instance_id,
            first_available_seq: p.first_available_seq,
            latest_seq: p.latest_seq,
            truncated: p.truncated,
            events: p.events.iter().map(Event::from).collect(),
        }
    }
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ReplayQuery {
    /// The last seq the client saw (default 0).
    #[param(value_type = Option<i64>, minimum = 0)]
    pub after: Option<String>,
    /// The instance the client's state came from.
    pub instance_id: Option<InstanceId>,
    /// 1 to 1000 (default 100).
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<u64>,
    /// Only events about this workspace (narrows what the token sees; never widens it).
    pub workspace_id: Option<WorkspaceId>,
    /// Only events about this task.
    pub task_id: Option<TaskId>,
    /// Only events about this session.
    pub session_id: Option<SessionId>,
    /// Comma-separated event types, each exact (`session.state_changed`) or a prefix ending in `.`
    /// (`session.`). An entry that matches no type is `400 validation_failed`.
    pub types: Option<String>,
    /// Only events caused by this token `sub` (`actor.sub`).
    pub actor: Option<String>,
}

/// One server-sent event frame, as SSE parsers present it (`data` of a `message` is one `Event` as JSON).
// Only described to OpenAPI: the stream writes frames as text (`events::stream`).
#[derive(ToSchema)]
pub struct SseFrame {
    /// `message` (an event), `ready` (replay done, live events follow), `reset` (reload snapshots) or
    /// `shutdown` (the server is stopping: reconnect with the last seq seen after `retry` ms).
    #[schema(pattern = "^(message|ready|reset|shutdown)$")]
    pub event: Option<String>,
    /// The event's seq (`message` frames only: no other frame moves `Last-Event-ID`).
    pub id: Option<String>,
    pub retry: Option<i64>,
    /// An `Event` as JSON for `message` frames.
    #[schema(content_media_type = "application/json")]
    pub data: Option<String>,
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct StreamQuery {
    /// The last seq the client saw (default 0); the `Last-Event-ID` header overrides it.
    #[param(value_type = Option<i64>, minimum = 0)]
    pub after: Option<String>,
    /// The instance the client's state came from.
    pub instance_id: Option<InstanceId>,
    /// A stream ticket (`POST /events/tickets`) instead of the `Authorization` header, for clients that
    /// cannot send headers (a browser's `EventSource`). Single use.
    pub ticket: Option<String>,
    /// Only events about this workspace (narrows what the token sees; never widens it).
    pub workspace_id: Option<WorkspaceId>,
    /// Only events about this task.
    pub task_id: Option<TaskId>,
    /// Only events about this session.
    pub session_id: Option<SessionId>,
    /// Comma-separated event types, each exact (`session.state_changed`) or a prefix ending in `.`
    /// (`session.`). An entry that matches no type is `400 validation_failed`.
    pub types: Option<String>,
    /// Only events caused by this token `sub` (`actor.sub`).
    pub actor: Option<String>,
}

/// A single-use credential for opening one event stream.
#[derive(Debug, Serialize, ToSchema)]
pub struct StreamTicket {
    /// Opaque; pass it as `GET /events/stream?ticket=`. Valid once, until `expires_at`.
    pub ticket: String,
    pub expires_at: DateTime<Utc>,
}

/// Mint a stream ticket.
///
/// A browser's `EventSource` cannot send an `Authorization` header: it opens
/// `GET /events/stream?ticket=<ticket>` instead. The ticket is single use and valid for 60 s, and it
/// carries this token's subject, scopes, workspaces and session binding (a session-bound token's ticket
/// sees only its session). `EventSource` reconnects with the same URL, which then fails: close it on
/// `error`, mint a new ticket and reopen with `after=<last seq seen>`.
#[utoipa::path(
    tag = "events",
    operation_id = "createStreamTicket",
    security(("bearer" = ["events:read"])),
    responses((status = 201, description = "The ticket (not a resource: no `Location`)", body = StreamTicket))
)]
#[post("/events/tickets")]
async fn create_stream_ticket(auth: Authorized<EventsRead>, state: web::Data<AppState>) -> Result<HttpResponse, Error> {
    let minted = domain_events::mint_ticket(&state.ctx, &auth).await?;
    Ok(HttpResponse::Created().json(StreamTicket {
        ticket: minted.ticket,
        expires_at: minted.expires_at,
    }))
}

/// List events after a sequence number
///
/// Events with `seq` after `after`, oldest first, limited to what the token may see (its workspaces, and
/// its session when bound to one). `seq` is strictly increasing across all events. `truncated` is true when
/// the events after `after` are no longer all available or `instance_id` names another instance: reload
/// snapshots, then continue from `latest_seq`. Scope `events:read`.
#[utoipa::path(
    operation_id = "listEvents",
    tag = "events",
    security(("bearer" = ["events:read"])),
    params(ReplayQuery),
    responses((status = 200, description = "Events after the cursor, oldest first, filtered by the token's workspaces and session", body = EventPage))
)]
#[get("/events")]
async fn replay_events(
    auth: Authorized<EventsRead>,
    state: web::Data<AppState>,
    query: web::Query<ReplayQuery>,
) -> Result<web::Json<EventPage>, Error> {
    let after = domain_events::parse_cursor(query.after.as_deref())?;
    let narrow = narrowing(
        query.workspace_id,
        query.task_id,
        query.session_id,
        query.types.as_deref(),
        query.actor.clone(),
    )?;
    let page = domain_events::replay(&state.ctx, &auth, narrow, after, query.instance_id, query.limit).await?;
    Ok(web::Json(page.into()))
}

/// Follow events as server-sent events
///
/// A `text/event-stream`: the events after `after` (or `Last-Event-ID`), then `event: ready`, then live
/// events, with no gap and no duplicate; each SSE `id` is the event's `seq`. A subscriber that falls behind
/// gets `event: reset` and the stream ends: reload snapshots and reconnect. When the server shuts down, the
/// stream ends with `event: shutdown` (`{"reason": "shutdown", "reconnect": true, "instance_id"}`, a
/// `retry:` line and no `id`): reconnect with `Last-Event-ID` as usual. A `: keep-alive` comment every
/// 15 s. Limited to what the token may see. Scope `events:read`.
#[utoipa::path(
    operation_id = "streamEvents",
    tag = "events",
    security(("bearer" = ["events:read"]), ("ticket" = [])),
    params(StreamQuery, ("Last-Event-ID" = Option<String>, Header, description = "Overrides `after`")),
    responses((
        status = 200,
        description = "`text/event-stream`: the events after the cursor (SSE `id` is the seq), then `event: ready`, then live events. `event: reset` means reload snapshots; the stream ends after it. `event: shutdown` (no `id`, a `retry:` line) means the server is stopping: the stream ends after it; reconnect with `Last-Event-ID`. A `: keep-alive` comment every 15 s.",
        body = SseFrame,
        content_type = "text/event-stream"
    ))
)]
#[get("/events/stream")]
async fn stream_events(
    state: web::Data<AppState>,
    query: web::Query<StreamQuery>,
    req: HttpRequest,
) -> Result<HttpResponse, Error> {
    // A ticket, when given, is the credential instead of `Authorization`; redeeming it spends it.
    let auth = match query.ticket.as_deref() {
        Some(ticket) => domain_events::redeem_ticket(&state.ctx, ticket).await?,
        None => Authorized::<EventsRead>::extract(&req).await?.0,
    };
    auth.require(crate::auth::Scope::EventsRead)?;
    let last_event_id = req
        .headers()
        .get("last-event-id")
        .map(|v| v.to_str().map_err(|_| Error::InvalidCursor))
        .transpose()?;
    let after = domain_events::parse_cursor(last_event_id.or(query.after.as_deref()))?;
    let narrow = narrowing(
        query.workspace_id,
        query.task_id,
        query.session_id,
        query.types.as_deref(),
        query.actor.clone(),
    )?;
    let ctx = &state.ctx;
    let (first_available, _) = crate::events::bounds(&ctx.db.conn).await?;
    let request = StreamRequest {
        after,
        filter: domain_events::filter_for(ctx, &auth, narrow).await?,
        truncated: domain_events::is_truncated(ctx, after, query.instance_id, first_available),
        keep_alive: ctx.config.sse_keep_alive,
        buffer: ctx.config.event_buffer,
    };
    let instance_id = ctx.instance_id;
    let frames = stream::open(ctx.events.clone(), ctx.db.conn.clone(), request);
    // Counted open while the body lives (the guard goes with it), and every reset by its reason.
    let metrics = (ctx.metrics.clone(), ctx.metrics.stream_opened());
    // At shutdown the stream's last frame tells the client to reconnect (`None` after it).
    let shutdown = Some(ctx.shutdown.clone());
    let body = futures_util::stream::once(async { Ok::<_, actix_web::Error>(Bytes::from_static(b"retry: 3000\n\n")) })
        .chain(futures_util::stream::unfold(
            (frames, metrics, shutdown),
            move |(mut frames, metrics, shutdown)| async move {
                let stopping = shutdown?;
                let frame = tokio::select! {
                    biased;
                    _ = stopping.begun() => None,
                    frame = frames.recv() => Some(frame?),
                };
                let Some(frame) = frame else {
                    let last = shutdown_frame(instance_id);
                    return Some((Ok(Bytes::from(last)), (frames, metrics, None)));
                };
                if let Frame::Reset(reason) = frame {
                    metrics.0.stream_reset(reason);
                }
                Some((
                    Ok::<_, actix_web::Error>(Bytes::from(encode(&frame, instance_id))),
                    (frames, metrics, Some(stopping)),
                ))
            },
        ));
    Ok(HttpResponse::Ok()
        .insert_header((header::CONTENT_TYPE, "text/event-stream"))
        .insert_header((header::CACHE_CONTROL, "no-cache"))
        .insert_header(("X-Accel-Buffering", "no"))
        .streaming(body))
}

fn narrowing(
    workspace_id: Option<WorkspaceId>,
    task_id: Option<TaskId>,
    session_id: Option<SessionId>,
    types: Option<&str>,
    actor: Option<String>,
) -> Result<Narrowing, Error> {
    Ok(Narrowing {
        workspace_id,
        task_id,
        session_id,
        types: domain_events::parse_types(types)?,
        actor,
    })
}

/// The last frame of every stream at shutdown: no `id` (the client's `Last-Event-ID` stays its last
/// event's), and a `retry` for its reconnection.
fn shutdown_frame(instance_id: InstanceId) -> String {
    format!(
        "event: shutdown\nretry: {SHUTDOWN_RETRY_MS}\ndata: {}\n\n",
        serde_json::json!({ "reason": "shutdown", "reconnect": true, "instance_id": instance_id })
    )
}

/// How long a client waits before reconnecting after `event: shutdown` (a restart takes seconds).
const SHUTDOWN_RETRY_MS: u64 = 2000;

fn encode(frame: &Frame, instance_id: InstanceId) -> String {
    match frame {
        Frame::Event(e) => {
            let json = serde_json::to_string(&Event::from(e.as_ref())).unwrap_or_default();
            format!("id: {}\ndata: {json}\n\n", e.seq)
        }
        Frame::Ready => format!(
            "event: ready\ndata: {}\n\n",
            serde_json::json!({ "instance_id": instance_id })
        ),
        Frame::Reset(reason) => format!(
            "event: reset\ndata: {}\n\n",
            serde_json::json!({ "reason": reason, "instance_id": instance_id })
        ),
        Frame::KeepAlive => ": keep-alive\n\n".to_string(),
    }
}
