//! Review comments that go back to the agent. A review answers an environment's diff: each comment names a
//! line the diff shows (`side: new` counts in the file as it is, `old` as it was; the lines of its hunks
//! at the default three lines of context), and is refused with the comment's field when the diff shows no
//! such line. It is stored with the text of each line it quotes; sent to a session, it goes through that
//! session's inbox as one message, in the same transaction as the review, so neither is ever there without
//! the other. `review.created` records it.
use crate::ids::{EnvironmentId, RepositoryId, ReviewId, SessionId};
use serde::{Deserialize, Serialize};
use serde_json::json;
use utoipa::ToSchema;

use super::Ctx;
use super::diff::{Query, SlotChanges};
use crate::auth::Principal;
use crate::entity::review;
use crate::error::{Error, Result};
use crate::events::{self, EventType, Subject};
use crate::git::diff::Scope;
use crate::git::patch::{self, Side};

/// The most comments in one review.
pub const MAX_COMMENTS: usize = 200;
/// The longest review body or comment.
pub const MAX_BODY: usize = 20_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum LineSide {
    /// The file as it is now (an added or an unchanged line).
    New,
    /// The file as it was (a removed or an unchanged line).
    Old,
}

/// A comment as the caller writes it.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewComment {
    pub repository_id: RepositoryId,
    /// The file's path in the diff (its new path, for a rename).
    pub path: String,
    /// The line's number on `side`, as the diff's hunks number it.
    #[schema(minimum = 1)]
    pub line: u32,
    pub side: LineSide,
    pub body: String,
}

/// A comment as stored: what was written, and the line it quotes.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Comment {
    pub repository_id: RepositoryId,
    pub path: String,
    pub line: u32,
    pub side: LineSide,
    pub body: String,
    /// The commented line's text as the diff showed it when the review was made.
    pub quote: String,
}

/// A review as the caller writes it.
pub struct NewReview {
    pub body: String,
    pub comments: Vec<NewComment>,
    pub session_id: Option<SessionId>,
}

/// Stores a review of the environment's diff and, when a session is named, sends it to that session's
/// agent as one message.
pub async fn create(
    ctx: &Ctx,
    p: &crate::auth::UnboundPrincipal,
    env_id: EnvironmentId,
    new: NewReview,
) -> Result<review::Model> {
    let view = super::environments::get(ctx, p, env_id).await?;
    let e = view.env;
    if new.body.len() > MAX_BODY {
        return Err(Error::invalid("body", "must be at most 20000 bytes"));
    }
    if new.body.trim().is_empty() && new.comments.is_empty() {
        return Err(Error::invalid("body", "a review needs a body or at least one comment"));
    }
    if new.comments.len() > MAX_COMMENTS {
        return Err(Error::invalid("comments", "at most 200 comments"));
    }
    for (i, c) in new.comments.iter().enumerate() {
        if c.body.trim().is_empty() || c.body.len() > MAX_BODY {
            return Err(Error::invalid(
                &format!("comments[{i}].body"),
                "must be 1 to 20000 bytes",
            ));
        }
    }
    // The session it goes to: seen by the caller, working in this environment, taking messages.
    let target = match new.session_id {
        Some(id) => {
            let (s, task) = super::sessions::taking_messages(ctx, p, id).await?;
            if s.task_environment_id != Some(e.id) {
                return Err(Error::invalid("session_id", "is not a session of this environment"));
            }
            Some((s, task))
        }
        None => None,
    };
    let comments = if new.comments.is_empty() {
        Vec::new()
    } else {
        let q = Query {
            scope: Scope::All,
            context: 3,
            paths: Vec::new(),
            repository_id: None,
            cursor: None,
        };
        // Whole patches: a comment may quote any line of its file.
        let slots = super::diff::slot_changes(ctx, &e, &q, super::diff::Keep::ALL).await?;
        quote(&slots, new.comments)?
    };
    let task = crate::store::tasks::find(&ctx.db.conn, e.task_id)
        .await?
        .ok_or(Error::NotFound("environment"))?;
    let id = ReviewId::now_v7();
    let txn = ctx.db.begin_write().await?;
    let message = match &target {
        Some((s, task)) => {
            let text = message_text(id, e.id, &new.body, &comments);
            Some(super::sessions::enqueue_message_in(&txn, ctx, task, s, &text).await?)
        }
        None => None,
    };
    let r = review::Model {
        id,
        task_id: e.task_id,
        task_environment_id: e.id,
        body: new.body,
        comments: serde_json::to_value(&comments).map_err(|err| Error::Internal(err.into()))?,
        session_id: new.session_id,
        message_id: message.as_ref().map(|m| m.id),
        created_by: Some(p.sub.clone()),
        created_at: crate::clock::now(),
    };
    crate::store::reviews::insert(&txn, r.clone()).await?;
    events::append(
        &txn,
        ctx.instance_id,
        EventType::ReviewCreated,
        Subject {
            task_environment_id: Some(e.id),
            session_id: new.session_id,
            ..Subject::task(task.workspace_id, task.id)
        },
        json!({ "review_id": r.id, "comments": comments.len(), "message_id": r.message_id }),
    )
    .await?;
    ctx.commit(txn).await?;
    if let Some((s, _)) = target {
        super::sessions::wake_inbox(ctx, s.id);
    }
    Ok(r)
}

/// An environment's reviews, oldest first.
pub async fn list(ctx: &Ctx, p: &Principal, env_id: EnvironmentId) -> Result<Vec<review::Model>> {
    super::environments::get(ctx, p, env_id).await?;
    crate::store::reviews::of_environment(&ctx.db.conn, env_id).await
}

/// One review of the environment.
pub async fn get(ctx: &Ctx, p: &Principal, env_id: EnvironmentId, review_id: ReviewId) -> Result<review::Model> {
    super::environments::get(ctx, p, env_id).await?;
    crate::store::reviews::find(&ctx.db.conn, review_id)
        .await?
        .filter(|r| r.task_environment_id == env_id)
        .ok_or(Error::NotFound("review"))
}

/// Each comment with the line it points at, or 422 naming the first comment whose line the diff does
/// not show.
fn quote(slots: &[SlotChanges], comments: Vec<NewComment>) -> Result<Vec<Comment>> {
    let mut out = Vec::with_capacity(comments.len());
    for (i, c) in comments.into_iter().enumerate() {
        let Some(slot) = slots.iter().find(|s| s.repository_id == c.repository_id) else {
            return Err(Error::invalid(
                &format!("comments[{i}].repository_id"),
                "is not a repository of this environment",
            ));
        };
        let Some(file) = slot.changes.files.iter().find(|f| f.path == c.path) else {
            return Err(Error::invalid(
                &format!("comments[{i}].path"),
                "is not a file of the environment's diff",
            ));
        };
        let lines = patch::lines(&file.patch);
        let side = match c.side {
            LineSide::New => Side::New,
            LineSide::Old => Side::Old,
        };
        let Some(line) = patch::find(&lines, side, c.line) else {
            return Err(Error::invalid(
                &format!("comments[{i}].line"),
                format!(
                    "the diff of {} shows no line {} on the {} side",
                    c.path,
                    c.line,
                    if side == Side::New { "new" } else { "old" }
                ),
            ));
        };
        out.push(Comment {
            repository_id: c.repository_id,
            path: c.path,
            line: c.line,
            side: c.side,
            body: c.body,
            quote: line.text.clone(),
        });
    }
    Ok(out)
}

/// The message the agent reads: the review's body, then each comment under the line it quotes, with
/// its file and line number, and where the review is.
fn message_text(review_id: ReviewId, env_id: EnvironmentId, body: &str, comments: &[Comment]) -> String {
    let mut text = String::from("A review of your changes");
    text.push_str(&format!(
        " (review {review_id}, /api/v1/environments/{env_id}/reviews/{review_id}):\n"
    ));
    if !body.trim().is_empty() {
        text.push('\n');
        text.push_str(body.trim_end());
        text.push('\n');
    }
    for c in comments {
        let side = match c.side {
            LineSide::New => "",
            LineSide::Old => " (before your change)",
        };
        text.push_str(&format!(
            "\n{} line {}{side}:\n> {}\n{}\n",
            c.path,
            c.line,
            c.quote,
            c.body.trim_end()
        ));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use uuid::Uuid;

    #[test]
    fn the_message_quotes_each_line_with_its_file_and_number() {
        let c = Comment {
            repository_id: RepositoryId::from(Uuid::nil()),
            path: "src/a.rs".into(),
            line: 7,
            side: LineSide::New,
            body: "use a constant".into(),
            quote: "let x = 42;".into(),
        };
        let t = message_text(
            ReviewId::from(Uuid::nil()),
            EnvironmentId::from(Uuid::nil()),
            "Nearly there.",
            &[c],
        );
        assert!(t.contains("Nearly there.\n"));
        assert!(t.contains("\nsrc/a.rs line 7:\n> let x = 42;\nuse a constant\n"), "{t}");
        assert!(t.contains("/reviews/00000000-0000-0000-0000-000000000000"));
    }
}
