//! A request that touches a node's disk or agents is carried out by that node, whichever replica it reached.
//! Innermost middleware: it looks up where the request's work is (`placement`) and, when that is another node
//! that is up, sends the request to a live instance of it (its advertised URL, the caller's token and
//! preferences with it) and answers with what that node answered, status, headers and body, so the caller
//! sees the same answers and codes as if it had asked that node. The caller waits for it, bounded by
//! `BERTH_ROUTING_DEADLINE_MS`. A request is forwarded once at most (`X-Berth-Forwarded-By`). A delete or an
//! archive whose node is down is accepted here (its jobs wait for the node); any other request for a down
//! node answers `503 node_unavailable`.
//!
//! A session delete goes to the session's node (its conversation is on that disk); leftover disposals go
//! to the node whose disk holds the leftover.
//!
//! Agent commands (stop, abort, answers, messages, settings) are not forwarded: they reach the instance
//! that runs the agent through the database (`domain::sessions::routing`), a sibling instance of the
//! node included.
use actix_web::body::{BoxBody, MessageBody};
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::{Method, StatusCode, header};
use actix_web::middleware::Next;
use actix_web::{HttpResponse, ResponseError, web};
use uuid::Uuid;

use crate::ids::{EnvironmentId, LeftoverId, SessionId, TaskId};

use super::AppState;
use crate::domain::nodes::placement;
use crate::error::Error;

/// Names the node that forwarded a request; such a request is carried out where it arrives.
pub const FORWARDED_BY: &str = "x-berth-forwarded-by";

/// What a request's work belongs to.
enum Owner {
    Task(TaskId),
    Session(SessionId),
    Environment(EnvironmentId),
    /// A repository registration naming its node in the body (`node_id`).
    Registration,
    /// What berth kept on a node's disk.
    Leftover(LeftoverId),
}

/// Whether a request for a down node is carried out here anyway (its disk work waits as jobs).
#[derive(PartialEq)]
enum WhenDown {
    Refuse,
    HandleHere,
}

/// The id at position `i` of the path, typed as the route says it is.
fn id<T: From<Uuid>>(parts: &[&str], i: usize) -> Option<T> {
    parts.get(i).and_then(|p| p.parse::<Uuid>().ok()).map(T::from)
}

fn route(method: &Method, path: &str) -> Option<(Owner, WhenDown)> {
    let rest = path.strip_prefix("/api/v1/")?;
    let parts: Vec<&str> = rest.split('/').collect();
    let m = method.as_str();
    match (m, parts.as_slice()) {
        ("POST", ["tasks", _, "sessions"]) | ("POST", ["tasks", _, "environment", "reset"]) => {
            Some((Owner::Task(id(&parts, 1)?), WhenDown::Refuse))
        }
        ("DELETE", ["tasks", _]) | ("POST", ["tasks", _, "archive"]) => {
            Some((Owner::Task(id(&parts, 1)?), WhenDown::HandleHere))
        }
        ("DELETE", ["sessions", _]) => Some((Owner::Session(id(&parts, 1)?), WhenDown::HandleHere)),
        ("GET", ["sessions", _, "turns", _, "diff"]) => Some((Owner::Session(id(&parts, 1)?), WhenDown::Refuse)),
        ("POST", ["sessions", _, "launch" | "resume"]) | ("GET", ["sessions", _, "git-status" | "diff"]) => {
            Some((Owner::Session(id(&parts, 1)?), WhenDown::Refuse))
        }
        ("POST", ["environments", _, "git-status", "refresh"])
        | ("GET", ["environments", _, "git-status" | "diff"])
        | (
            "POST",
            [
                "environments",
                _,
                "restore" | "reviews" | "commits" | "merge" | "push" | "pull-requests",
            ],
        ) => Some((Owner::Environment(id(&parts, 1)?), WhenDown::Refuse)),
        ("POST", ["workspaces", _, "repositories"]) => Some((Owner::Registration, WhenDown::Refuse)),
        ("DELETE", ["workspaces", _, "leftovers", _]) => Some((Owner::Leftover(id(&parts, 3)?), WhenDown::Refuse)),
        _ => None,
    }
}

fn answer(req: ServiceRequest, err: &Error) -> ServiceResponse<BoxBody> {
    req.into_response(err.error_response())
}

pub async fn forward(
    mut req: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<BoxBody>, actix_web::Error> {
    let Some((owner, when_down)) = route(req.method(), req.path()) else {
        return Ok(next.call(req).await?.map_into_boxed_body());
    };
    // Carried out here: a request another node forwarded, and one without a token (refused here).
    if req.headers().contains_key(FORWARDED_BY) || !req.headers().contains_key(header::AUTHORIZATION) {
        return Ok(next.call(req).await?.map_into_boxed_body());
    }
    let Some(state) = req.app_data::<web::Data<AppState>>().cloned() else {
        return Ok(next.call(req).await?.map_into_boxed_body());
    };
    let ctx = &state.ctx;
    // The body is read once, and given back to the handler when the request stays here.
    let body = match req.extract::<web::Bytes>().await {
        Ok(b) => b,
        Err(_) => {
            let limit = ctx.config.max_body_bytes;
            return Ok(answer(req, &Error::PayloadTooLarge { limit }));
        }
    };
    let node = match owner {
        Owner::Task(id) => placement::of_task(ctx, id).await,
        Owner::Session(id) => placement::of_session(ctx, id).await,
        Owner::Environment(id) => placement::of_environment(ctx, id).await,
        Owner::Leftover(id) => crate::store::leftovers::find(&ctx.db.conn, id)
            .await
            .map(|l| l.and_then(|l| l.node_id)),
        Owner::Registration => Ok(serde_json::from_slice::<serde_json::Value>(&body)
            .ok()
            .and_then(|v| v.get("node_id").and_then(|n| n.as_str()).map(str::to_string))),
    };
    let node = match node {
        Ok(n) => n,
        Err(e) => return Ok(answer(req, &e)),
    };
    // A registration naming a node berth has never seen is the caller's mistake, not a node that is down.
    if let (Owner::Registration, Some(n)) = (&owner, node.as_deref())
        && n != ctx.config.node_id
    {
        match crate::store::nodes::find_node(&ctx.db.conn, n).await {
            Ok(Some(_)) => {}
            Ok(None) => return Ok(answer(req, &Error::invalid("node_id", "no such node"))),
            Err(e) => return Ok(answer(req, &e)),
        }
    }
    let url = match placement::elsewhere(ctx, node.as_deref()).await {
        Ok(url) => url,
        Err(Error::NodeUnavailable {
            decommissioned: false, ..
        }) if when_down == WhenDown::HandleHere => None,
        Err(e) => return Ok(answer(req, &e)),
    };
    let Some(url) = url else {
        req.set_payload(actix_web::dev::Payload::from(body));
        return Ok(next.call(req).await?.map_into_boxed_body());
    };
    let res = match send(ctx, &req, &url, body).await {
        Ok(res) => res,
        Err(e) => return Ok(answer(req, &e)),
    };
    Ok(req.into_response(res))
}

thread_local! {
    /// One client per HTTP worker thread: its connections belong to that thread's runtime.
    static CLIENT: reqwest::Client = reqwest::Client::builder()
        .connect_timeout(std::time::Duration::from_secs(5))
        .build()
        .unwrap_or_default();
}

/// The request, as the caller sent it (less its Idempotency-Key: this replica keeps that), to `base`.
async fn send(
    ctx: &crate::domain::Ctx,
    req: &ServiceRequest,
    base: &str,
    body: web::Bytes,
) -> Result<HttpResponse, Error> {
    let target = format!(
        "{base}{}",
        req.uri().path_and_query().map_or(req.path(), |p| p.as_str())
    );
    let method = reqwest::Method::from_bytes(req.method().as_str().as_bytes())
        .map_err(|e| Error::Internal(anyhow::anyhow!("{e}")))?;
    let mut out = CLIENT
        .with(|c| c.clone())
        .request(method, &target)
        .timeout(ctx.config.routing_deadline)
        .header(FORWARDED_BY, ctx.config.node_id.as_str());
    for name in [
        header::AUTHORIZATION,
        header::CONTENT_TYPE,
        header::ACCEPT,
        header::IF_MATCH,
        header::IF_NONE_MATCH,
        header::HeaderName::from_static("prefer"),
        header::HeaderName::from_static("x-request-id"),
    ] {
        for v in req.headers().get_all(&name) {
            out = out.header(name.as_str(), v.as_bytes());
        }
    }
    let reply = out
        .body(body.to_vec())
        .send()
        .await
        .map_err(|e| Error::Unavailable(format!("could not reach the node that holds this work at {base}: {e}")))?;
    let status = StatusCode::from_u16(reply.status().as_u16()).unwrap_or(StatusCode::BAD_GATEWAY);
    let mut res = HttpResponse::build(status);
    for (name, value) in reply.headers() {
        let skip = matches!(
            name.as_str(),
            "connection" | "transfer-encoding" | "content-length" | "date" | "server" | "keep-alive"
        );
        if !skip {
            res.append_header((name.as_str(), value.as_bytes()));
        }
    }
    let bytes = reply
        .bytes()
        .await
        .map_err(|e| Error::Unavailable(format!("the node at {base} did not finish its answer: {e}")))?;
    Ok(res.body(bytes))
}
