//! `Idempotency-Key` on every POST and DELETE under /api/v1: the first answer is kept per (token
//! subject, key) for 24 hours and replayed with `Idempotent-Replayed: true`.
//!
//! The key is claimed by an INSERT before the handler runs, so the database's primary key decides between
//! two requests, on one replica or two. A repeat finds the row: done, it replays the stored answer; in
//! progress, it waits a few seconds for it and then replays, else answers `409 conflict` (retryable). The
//! same key with another method, path, query or body is `422 idempotency_key_reused`. Only answers that
//! are final are kept (2xx and non-retryable 4xx other than 401/403); a retryable problem or a 5xx
//! changed nothing, so the key is released and a retry runs again. The handler runs in its own task: a client that hangs up (a
//! proxy timeout) does not cancel it, and its retry gets the answer the first request produced.
//!
//! Known limit: a claim left in progress by a process that died is taken over after [`STALE_CLAIM`]; if
//! that process had committed its change, the request runs a second time.
use std::time::Duration;

use actix_web::body::{BoxBody, MessageBody};
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::header::{self, HeaderName, HeaderValue};
use actix_web::http::{Method, StatusCode};
use actix_web::middleware::Next;
use actix_web::{HttpResponse, web};
use sha2::{Digest, Sha256};
use tracing::Instrument;

use super::AppState;
use crate::error::Error;
use crate::store::idempotency::{self as store, StoredResponse};

pub const IDEMPOTENCY_KEY: &str = "idempotency-key";
pub const IDEMPOTENT_REPLAYED: &str = "idempotent-replayed";

/// How long an answer is kept.
const TTL: chrono::Duration = chrono::Duration::hours(24);
/// A claim in progress for longer is taken to be a crashed process's, and may run again.
const STALE_CLAIM: chrono::Duration = chrono::Duration::seconds(60);
/// How long a repeat waits for the first request to finish before answering 409.
const WAIT: Duration = Duration::from_secs(5);
const POLL: Duration = Duration::from_millis(50);

/// 1 to 255 visible ASCII characters.
fn valid_key(key: &str) -> bool {
    (1..=255).contains(&key.len()) && key.bytes().all(|b| b.is_ascii_graphic())
}

/// SHA-256 (hex) of what makes two requests the same one: method, path, query and body.
pub fn fingerprint(method: &str, path: &str, query: &str, body: &[u8]) -> String {
    let mut h = Sha256::new();
    for part in [method, path, query] {
        h.update(part.as_bytes());
        h.update([0u8]);
    }
    h.update(body);
    hex::encode(h.finalize())
}

/// Every POST and DELETE under /api/v1, but minting a stream ticket: it changes nothing a retry could
/// repeat, and a kept answer would hold a live credential in the database for its lifetime.
pub fn covers(path: &str) -> bool {
    path.starts_with("/api/v1/") && path != "/api/v1/events/tickets"
}

pub async fn idempotency(
    mut req: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<BoxBody>, actix_web::Error> {
    let applies = matches!(*req.method(), Method::POST | Method::DELETE) && covers(req.path());
    let Some(raw) = req.headers().get(IDEMPOTENCY_KEY).filter(|_| applies).cloned() else {
        return Ok(next.call(req).await?.map_into_boxed_body());
    };
    let key = match raw.to_str() {
        Ok(k) if valid_key(k) => k.to_string(),
        _ => {
            let refused = Error::BadRequest("Idempotency-Key must be 1 to 255 visible ASCII characters".into());
            return Ok(answer(req, &refused));
        }
    };
    // The token only names the caller here; a bad one is the handler's to refuse, and nothing is kept.
    let Ok(principal) = super::extract::authenticate(req.request()).await else {
        return Ok(next.call(req).await?.map_into_boxed_body());
    };
    let Some(state) = req.app_data::<web::Data<AppState>>().cloned() else {
        return Ok(answer(req, &Error::Internal(anyhow::anyhow!("no app state"))));
    };
    let body = match req.extract::<web::Bytes>().await {
        Ok(body) => body,
        Err(_) => {
            let limit = state.ctx.config.max_body_bytes;
            return Ok(answer(req, &Error::PayloadTooLarge { limit }));
        }
    };
    let print = fingerprint(req.method().as_str(), req.path(), req.query_string(), &body);
    req.set_payload(actix_web::dev::Payload::from(body));
    let subject = principal.sub.clone();
    let conn = &state.ctx.db.conn;

    let claim_id = uuid::Uuid::now_v7();
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let now = crate::clock::now();
        let claimed = match store::claim(conn, &subject, &key, &print, claim_id, now, TTL).await {
            Ok(claimed) => claimed,
            Err(e) => return Ok(answer(req, &e)),
        };
        if claimed {
            break;
        }
        let row = match store::find(conn, &subject, &key).await {
            Ok(row) => row,
            Err(e) => return Ok(answer(req, &e)),
        };
        let Some(row) = row else {
            // Released (or purged) meanwhile: claim again.
            continue;
        };
        let stale =
            row.state == crate::entity::idempotency_key::KeyState::InProgress && row.created_at + STALE_CLAIM < now;
        if row.expires_at < now || stale {
            match store::take_over(conn, &row, &print, claim_id, now, TTL).await {
                Ok(true) => break,
                Ok(false) => continue,
                Err(e) => return Ok(answer(req, &e)),
            }
        }
        if row.fingerprint != print {
            return Ok(answer(req, &Error::IdempotencyKeyReused));
        }
        if let Some(stored) = row.response() {
            return Ok(req.into_response(replay(&stored)));
        }
        if tokio::time::Instant::now() >= deadline {
            return Ok(answer(req, &Error::IdempotencyInProgress));
        }
        tokio::time::sleep(POLL).await;
    }

    // Ours: run the request to its end even if the client goes away.
    let ctx = state.ctx.clone();
    let request_id = super::middleware::current_request_id();
    let span = tracing::Span::current();
    let run = actix_web::rt::spawn(crate::actor::carry(super::middleware::with_request_id(
        request_id,
        async move {
            let outcome = next.call(req).await;
            let res = match outcome {
                Ok(res) => res,
                Err(e) => {
                    let _ = store::release(&ctx.db.conn, &subject, &key, claim_id).await;
                    return Err(e);
                }
            };
            let (http_req, res) = res.into_parts();
            let (res, body) = res.into_parts();
            let bytes = match actix_web::body::to_bytes(body).await {
                Ok(b) => b,
                Err(_) => {
                    let _ = store::release(&ctx.db.conn, &subject, &key, claim_id).await;
                    return Err(Error::Internal(anyhow::anyhow!("reading the response body failed")).into());
                }
            };
            let stored = StoredResponse {
                status: res.status().as_u16(),
                content_type: header_text(&res, header::CONTENT_TYPE),
                body: bytes.to_vec(),
                location: header_text(&res, header::LOCATION),
                etag: header_text(&res, header::ETAG),
            };
            let kept = if is_final(&stored) {
                store::finish(&ctx.db.conn, &subject, &key, claim_id, &stored).await
            } else {
                store::release(&ctx.db.conn, &subject, &key, claim_id).await
            };
            if let Err(e) = kept {
                // The change (if any) is committed; the answer still goes out, only a retry cannot replay it.
                tracing::warn!(error = %e, "storing the idempotent answer failed");
                let _ = store::release(&ctx.db.conn, &subject, &key, claim_id).await;
            }
            Ok(ServiceResponse::new(
                http_req,
                res.set_body(bytes).map_into_boxed_body(),
            ))
        }
        .instrument(span),
    )));
    run.await
        .map_err(|e| actix_web::Error::from(Error::Internal(anyhow::anyhow!("the request task failed: {e}"))))?
}

fn answer(req: ServiceRequest, err: &Error) -> ServiceResponse<BoxBody> {
    use actix_web::ResponseError;
    req.into_response(err.error_response())
}

fn header_text(res: &HttpResponse<()>, name: HeaderName) -> Option<String> {
    res.headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
}

/// 2xx and non-retryable 4xx answers are final; a retryable problem or a 5xx changed nothing. A 401 or
/// 403 is about the token, not the request: a retry with a better token runs.
fn is_final(res: &StoredResponse) -> bool {
    match res.status {
        200..=299 => true,
        401 | 403 => false,
        400..=499 => {
            let retryable = serde_json::from_slice::<serde_json::Value>(&res.body)
                .ok()
                .and_then(|v| v.get("retryable").and_then(|r| r.as_bool()))
                .unwrap_or(false);
            !retryable
        }
        _ => false,
    }
}

fn replay(stored: &StoredResponse) -> HttpResponse {
    let mut res = HttpResponse::build(StatusCode::from_u16(stored.status).unwrap_or(StatusCode::OK));
    for (name, value) in [
        (header::CONTENT_TYPE, &stored.content_type),
        (header::LOCATION, &stored.location),
        (header::ETAG, &stored.etag),
    ] {
        if let Some(v) = value.as_deref().and_then(|v| HeaderValue::from_str(v).ok()) {
            res.insert_header((name, v));
        }
    }
    res.insert_header((
        HeaderName::from_static(IDEMPOTENT_REPLAYED),
        HeaderValue::from_static("true"),
    ));
    res.body(stored.body.clone())
}
