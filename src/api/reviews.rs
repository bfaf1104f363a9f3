//! HTTP for reviews of an environment's diff, sent back to a session's agent.
use crate::ids::{EnvironmentId, InboxItemId, ReviewId, SessionId, TaskId};
use actix_web::{HttpResponse, get, post, web};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa_actix_web::service_config::ServiceConfig;

use super::AppState;
use super::extract::{Authorized, TasksRead, TasksWrite, Unbound};
use super::problem::Problem;
use crate::domain::reviews::{self, Comment, NewComment, NewReview};
use crate::entity::review;
use crate::error::Error;

pub fn routes(cfg: &mut ServiceConfig) {
    cfg.service(create_review).service(list_reviews).service(get_review);
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateReview {
    /// What the reviewer says about the change as a whole (may be empty when there are comments).
    #[serde(default)]
    pub body: String,
    /// Comments on lines the environment's diff shows (at most 200).
    #[serde(default)]
    pub comments: Vec<NewComment>,
    /// A session of this environment to send the review to, as one message in its inbox.
    pub session_id: Option<SessionId>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Review {
    pub id: ReviewId,
    pub task_id: TaskId,
    pub task_environment_id: EnvironmentId,
    pub body: String,
    /// Each with the text of the line it quotes.
    pub comments: Vec<Comment>,
    /// The session it was sent to.
    pub session_id: Option<SessionId>,
    /// The inbox message that carries it (`GET /sessions/{session_id}/messages`).
    pub message_id: Option<InboxItemId>,
    /// The token subject that wrote it.
    pub created_by: Option<String>,
    pub created_at: DateTime<Utc>,
}

impl From<review::Model> for Review {
    fn from(r: review::Model) -> Self {
        Review {
            id: r.id,
            task_id: r.task_id,
            task_environment_id: r.task_environment_id,
            body: r.body,
            comments: serde_json::from_value(r.comments).unwrap_or_default(),
            session_id: r.session_id,
            message_id: r.message_id,
            created_by: r.created_by,
            created_at: r.created_at,
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ReviewList {
    /// Oldest first.
    pub items: Vec<Review>,
}

/// Review an environment's changes
///
/// Stores a review of the environment's diff: a body and comments on lines. Each comment names a line the
/// diff shows (`scope=all`, three lines of context): `side: new` counts lines in the file as it is, `old`
/// as it was; a line the diff does not show is refused with the comment's field (`comments[i].line`).
/// With `session_id` (a session of this environment that takes messages), the review goes to that
/// session's agent as one inbox message quoting each commented line with its file and line number, in the
/// same transaction as the review. Event `review.created`. Scope `tasks:write`.
#[utoipa::path(
    operation_id = "createReview",
    tag = "diffs",
    security(("bearer" = ["tasks:write"])),
    params(("id" = Uuid, Path, description = "Environment id")),
    request_body = CreateReview,
    responses(
        (status = 201, description = "Stored (and queued for the session's agent when one was named)", body = Review),
        (status = 404, description = "No such environment or session (`not_found`)", body = Problem),
        (status = 409, description = "The session has no running agent, or the environment is not ready (`conflict`), or a worktree is gone (`workspace_reuse_unsafe`)", body = Problem),
        (status = 422, description = "An empty review, a comment on a line, file or repository the diff does not show, a session of another environment (`validation_failed`, with the field)", body = Problem),
        (status = 503, description = "The environment's node is down (`node_unavailable`, retryable)", body = Problem),
    )
)]
#[post("/environments/{id}/reviews")]
async fn create_review(
    auth: Unbound<TasksWrite>,
    state: web::Data<AppState>,
    id: web::Path<EnvironmentId>,
    body: web::Json<CreateReview>,
) -> Result<HttpResponse, Error> {
    let b = body.into_inner();
    let new = NewReview {
        body: b.body,
        comments: b.comments,
        session_id: b.session_id,
    };
    let r = reviews::create(&state.ctx, &auth, *id, new).await?;
    Ok(super::created(
        format!("/api/v1/environments/{}/reviews/{}", r.task_environment_id, r.id),
        &Review::from(r),
    ))
}

/// List an environment's reviews
///
/// Oldest first, each with its comments and the lines they quote. Scope `tasks:read`.
#[utoipa::path(
    operation_id = "listReviews",
    tag = "diffs",
    security(("bearer" = ["tasks:read"])),
    params(("id" = Uuid, Path, description = "Environment id")),
    responses(
        (status = 200, description = "The reviews, oldest first", body = ReviewList),
        (status = 404, description = "No such environment (`not_found`)", body = Problem),
    )
)]
#[get("/environments/{id}/reviews")]
async fn list_reviews(
    auth: Authorized<TasksRead>,
    state: web::Data<AppState>,
    id: web::Path<EnvironmentId>,
) -> Result<web::Json<ReviewList>, Error> {
    let items = reviews::list(&state.ctx, &auth, *id).await?;
    Ok(web::Json(ReviewList {
        items: items.into_iter().map(Into::into).collect(),
    }))
}

/// Get a review
///
/// One review of the environment (the message a review sends to an agent names this path). Scope
/// `tasks:read`.
#[utoipa::path(
    operation_id = "getReview",
    tag = "diffs",
    security(("bearer" = ["tasks:read"])),
    params(
        ("id" = Uuid, Path, description = "Environment id"),
        ("review_id" = Uuid, Path, description = "Review id"),
    ),
    responses(
        (status = 200, description = "The review", body = Review),
        (status = 404, description = "No such environment or review (`not_found`)", body = Problem),
    )
)]
#[get("/environments/{id}/reviews/{review_id}")]
async fn get_review(
    auth: Authorized<TasksRead>,
    state: web::Data<AppState>,
    path: web::Path<(EnvironmentId, ReviewId)>,
) -> Result<web::Json<Review>, Error> {
    let (id, review_id) = path.into_inner();
    Ok(web::Json(reviews::get(&state.ctx, &auth, id, review_id).await?.into()))
}
