//! HTTP for a session's inbox: messages are stored first, then delivered by the node running the agent.
use crate::ids::{InboxItemId, SessionId};
use actix_web::{HttpResponse, delete, get, post, web};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa_actix_web::service_config::ServiceConfig;

use super::AppState;
use super::extract::{Authorized, FollowPoint, SessionsRead, SessionsWrite};
use super::problem::Problem;
use crate::domain::sessions;
use crate::entity::session_inbox::{self as inbox, Delivery, InboxState};
use crate::error::Error;

pub fn routes(cfg: &mut ServiceConfig) {
    cfg.service(send_message).service(list_messages).service(cancel_message);
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SendMessage {
    pub text: String,
    /// `auto` (default): a prompt when the agent is idle, the next prompt after the turn while it works;
    /// `steer`: read by the working agent before its next model call; `follow_up`: after the turn.
    #[serde(default)]
    pub delivery: Delivery,
}

/// A message for the session's agent and where it is.
#[derive(Debug, Serialize, ToSchema)]
pub struct Message {
    pub id: InboxItemId,
    pub session_id: SessionId,
    pub text: String,
    pub delivery: Delivery,
    pub state: InboxState,
    /// Why it was refused (the agent's words) or cancelled.
    pub reason: Option<String>,
    pub created_at: DateTime<Utc>,
}

impl From<inbox::Model> for Message {
    fn from(m: inbox::Model) -> Self {
        Message {
            id: m.id,
            session_id: m.session_id,
            text: m.text,
            delivery: m.delivery,
            state: m.state,
            reason: m.reason,
            created_at: m.created_at,
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct MessageList {
    /// Oldest first.
    pub items: Vec<Message>,
    /// Every event with `seq <= latest_seq` is reflected in this list: follow with
    /// `GET /events/stream?after=<latest_seq>` to miss nothing.
    pub latest_seq: i64,
}

/// Send a message to a session's agent
///
/// Stores the message at once (`202`) and delivers it as soon as the agent can take it, in order; each
/// change of its state (queued, delivered, refused, cancelled) is a `session.message_updated` event.
/// Refused with `409 conflict` when no agent runs. Scope `sessions:write`.
#[utoipa::path(
    operation_id = "sendSessionMessage",
    tag = "sessions",
    security(("bearer" = ["sessions:write"])),
    params(("id" = Uuid, Path, description = "Session id")),
    request_body = SendMessage,
    responses(
        (status = 202, description = "Stored, then delivered as soon as the agent can take it; each change of its state is a `session.message_updated` event", body = Message),
        (status = 404, description = "No such session (`not_found`)", body = Problem),
        (status = 409, description = "The session has no running agent (`conflict`)", body = Problem),
        (status = 422, description = "Empty or too long (`validation_failed`)", body = Problem),
    )
)]
#[post("/sessions/{id}/messages")]
async fn send_message(
    auth: Authorized<SessionsWrite>,
    state: web::Data<AppState>,
    id: web::Path<SessionId>,
    body: web::Json<SendMessage>,
) -> Result<HttpResponse, Error> {
    let body = body.into_inner();
    let message = sessions::post_message(&state.ctx, &auth, *id, &body.text, body.delivery).await?;
    Ok(HttpResponse::Accepted().json(Message::from(message)))
}

/// List a session's messages
///
/// The messages sent to the session and their delivery state, oldest first. Scope `sessions:read`.
#[utoipa::path(
    operation_id = "listSessionMessages",
    tag = "sessions",
    security(("bearer" = ["sessions:read"])),
    params(("id" = Uuid, Path, description = "Session id")),
    responses(
        (status = 200, description = "The session's messages, oldest first", body = MessageList),
        (status = 404, description = "No such session (`not_found`)", body = Problem),
    )
)]
#[get("/sessions/{id}/messages")]
async fn list_messages(
    auth: Authorized<SessionsRead>,
    state: web::Data<AppState>,
    seq: FollowPoint,
    id: web::Path<SessionId>,
) -> Result<web::Json<MessageList>, Error> {
    let items = sessions::list_messages(&state.ctx, &auth, *id).await?;
    Ok(web::Json(MessageList {
        items: items.into_iter().map(Into::into).collect(),
        latest_seq: seq.0,
    }))
}

/// Cancel a queued message
///
/// Cancels a message that has not reached the agent yet. Refused with `409 conflict` once it was
/// delivered, refused or cancelled. Scope `sessions:write`.
#[utoipa::path(
    operation_id = "cancelSessionMessage",
    tag = "sessions",
    security(("bearer" = ["sessions:write"])),
    params(
        ("id" = Uuid, Path, description = "Session id"),
        ("message_id" = Uuid, Path, description = "Message id"),
    ),
    responses(
        (status = 200, description = "Cancelled before it reached the agent", body = Message),
        (status = 404, description = "No such session or message (`not_found`)", body = Problem),
        (status = 409, description = "Already delivered, refused or cancelled (`conflict`)", body = Problem),
    )
)]
#[delete("/sessions/{id}/messages/{message_id}")]
async fn cancel_message(
    auth: Authorized<SessionsWrite>,
    state: web::Data<AppState>,
    path: web::Path<(SessionId, InboxItemId)>,
) -> Result<web::Json<Message>, Error> {
    let (id, message_id) = path.into_inner();
    Ok(web::Json(
        sessions::cancel_message(&state.ctx, &auth, id, message_id)
            .await?
            .into(),
    ))
}
