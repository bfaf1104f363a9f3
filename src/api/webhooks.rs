//! HTTP for webhook subscriptions. The rules and the delivery are `domain::webhooks`.
use crate::ids::{DeliveryId, WebhookId, WorkspaceId};
use actix_web::{HttpResponse, delete, get, patch, post, web};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa_actix_web::service_config::ServiceConfig;

use super::AppState;
use super::extract::{Unbound, WebhooksWrite};
use super::problem::Problem;
use crate::domain::webhooks::{self, Made, NewWebhook, WebhookPatch};
use crate::entity::{webhook, webhook_delivery};
use crate::error::Error;

pub fn routes(cfg: &mut ServiceConfig) {
    cfg.service(create_webhook)
        .service(list_webhooks)
        .service(get_webhook)
        .service(update_webhook)
        .service(delete_webhook)
        .service(rotate_webhook_secret)
        .service(list_webhook_deliveries)
        .service(test_webhook);
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateWebhook {
    /// `https://...`; plain `http://` only to a loopback host unless `BERTH_WEBHOOK_ALLOW_HTTP` is set.
    pub url: String,
    /// Event types it takes, each exact (`session.state_changed`) or a prefix ending in `.` (`session.`);
    /// absent: every type.
    pub types: Option<Vec<String>>,
    /// Only this workspace's events (required for a token limited to workspaces); absent: every event.
    pub workspace_id: Option<WorkspaceId>,
    #[serde(default)]
    pub description: String,
    /// Default `true`.
    pub enabled: Option<bool>,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UpdateWebhook {
    pub url: Option<String>,
    /// `null`: every type.
    #[serde(default, deserialize_with = "super::extract::present")]
    #[schema(value_type = Option<Vec<String>>, nullable)]
    pub types: Option<Option<Vec<String>>>,
    pub description: Option<String>,
    /// `true` on a disabled subscription enables it again: it resumes at the event it stopped at (or
    /// at the oldest one retention kept), with fresh retries.
    pub enabled: Option<bool>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Webhook {
    pub id: WebhookId,
    pub url: String,
    /// As given; `null`: every type.
    pub types: Option<Vec<String>>,
    pub workspace_id: Option<WorkspaceId>,
    pub description: String,
    pub enabled: bool,
    /// Why berth disabled it (its receiver failed past the retry horizon); `null` otherwise.
    pub disabled_reason: Option<String>,
    /// The last event seq it has passed (delivered, or not one it takes).
    pub cursor: i64,
    /// Failed attempts at the next event, and when the next one is due.
    pub failed_attempts: i32,
    pub failing_since: Option<DateTime<Utc>>,
    pub next_attempt_at: Option<DateTime<Utc>>,
    /// Its oldest undelivered event is older than `BERTH_WEBHOOK_MAX_LAG_SECS`: retention no longer keeps
    /// events for it; what retention takes before it is delivered is skipped (a `webhook.skipped` event
    /// says which). Cleared once it has caught up.
    pub lagging: bool,
    /// Until when the rotated-out secret still signs beside the current one.
    pub previous_secret_expires_at: Option<DateTime<Utc>>,
    pub created_by: Option<String>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

impl From<&webhook::Model> for Webhook {
    fn from(w: &webhook::Model) -> Self {
        Webhook {
            id: w.id,
            url: w.url.clone(),
            types: w.types.as_ref().and_then(|t| serde_json::from_value(t.clone()).ok()),
            workspace_id: w.workspace_id,
            description: w.description.clone(),
            enabled: w.enabled,
            disabled_reason: w.disabled_reason.clone(),
            cursor: w.cursor,
            failed_attempts: w.attempts,
            failing_since: w.failing_since,
            next_attempt_at: w.next_attempt_at,
            lagging: w.lagging,
            previous_secret_expires_at: w.previous_secret_expires_at.filter(|t| *t > crate::clock::now()),
            created_by: w.created_by.clone(),
            created_at: w.created_at,
            updated_at: w.updated_at,
        }
    }
}

/// A subscription with its signing secret: shown here only, when made or rotated.
#[derive(Debug, Serialize, ToSchema)]
pub struct WebhookWithSecret {
    #[serde(flatten)]
    pub webhook: Webhook,
    /// `whsec_<base64>`, the Standard Webhooks secret that verifies `webhook-signature`. Keep it: it is
    /// never shown again.
    pub secret: String,
}

impl From<Made> for WebhookWithSecret {
    fn from(m: Made) -> Self {
        WebhookWithSecret {
            webhook: Webhook::from(&m.webhook),
            secret: m.secret,
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct WebhookList {
    /// Oldest first.
    pub items: Vec<Webhook>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct WebhookDelivery {
    pub id: DeliveryId,
    pub webhook_id: WebhookId,
    /// The `webhook-id` header: the same for every attempt of one event.
    pub message_id: String,
    /// `null` for a ping.
    pub event_seq: Option<i64>,
    pub event_type: String,
    /// 1 for a message's first attempt.
    pub attempt: i32,
    /// The receiver's status; `null` when it did not answer.
    pub status_code: Option<i32>,
    pub succeeded: bool,
    pub latency_ms: i64,
    /// Why it failed; a receiver's answer shows as its status and at most 100 bytes of its body, with
    /// anything that looks like a credential replaced by `[redacted]`.
    pub error: Option<String>,
    pub created_at: DateTime<Utc>,
}

impl From<webhook_delivery::Model> for WebhookDelivery {
    fn from(d: webhook_delivery::Model) -> Self {
        WebhookDelivery {
            id: d.id,
            webhook_id: d.webhook_id,
            message_id: d.message_id,
            event_seq: d.event_seq,
            event_type: d.event_type,
            attempt: d.attempt,
            status_code: d.status_code,
            succeeded: d.succeeded,
            latency_ms: d.latency_ms,
            error: d.error,
            created_at: d.created_at,
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct WebhookDeliveryList {
    /// The newest 100 attempts, newest first.
    pub items: Vec<WebhookDelivery>,
}

/// Subscribe a URL to events
///
/// berth posts each event the subscription takes (body: the event as the stream sends it) to `url`,
/// signed per Standard Webhooks (`webhook-id`, `webhook-timestamp`, `webhook-signature: v1,<base64
/// HMAC-SHA256>`), in `seq` order, at least once: starting after the newest event now, surviving
/// restarts and replicas (one replica delivers a subscription at a time). `webhook-id` stays the same
/// across retries. A receiver that fails is retried with backoff and jitter for
/// `BERTH_WEBHOOK_RETRY_HORIZON_SECS`; then the subscription is disabled with its reason and a
/// `webhook.disabled` event. The answer carries the signing secret, shown this once. The URL must reach
/// a public address (checked now and at every connection; `BERTH_WEBHOOK_ALLOWED_NETWORKS` lists other
/// networks allowed). Scopes `webhooks:write` and `events:read` (a subscription takes events), or
/// `admin`.
#[utoipa::path(
    operation_id = "createWebhook",
    tag = "webhooks",
    security(("bearer" = ["webhooks:write"])),
    request_body = CreateWebhook,
    responses(
        (status = 201, description = "Subscribed; the secret is shown only here", body = WebhookWithSecret),
        (status = 403, description = "No `events:read` (`insufficient_scope`), or a token limited to workspaces without one of them", body = Problem),
        (status = 404, description = "No such workspace (`not_found`)", body = Problem),
        (status = 422, description = "A URL that is not https (or loopback http), or whose host is or resolves to an address not public and not allowed, or an unknown type (`validation_failed`, with the field)", body = Problem),
    )
)]
#[post("/webhooks")]
async fn create_webhook(
    auth: Unbound<WebhooksWrite>,
    state: web::Data<AppState>,
    body: web::Json<CreateWebhook>,
) -> Result<HttpResponse, Error> {
    let b = body.into_inner();
    let new = NewWebhook {
        url: b.url,
        types: b.types,
        workspace_id: b.workspace_id,
        description: b.description,
        enabled: b.enabled.unwrap_or(true),
    };
    let made = webhooks::create(&state.ctx, &auth, new).await?;
    Ok(super::created(
        format!("/api/v1/webhooks/{}", made.webhook.id),
        &WebhookWithSecret::from(made),
    ))
}

/// List webhook subscriptions
///
/// The subscriptions this token manages (a token limited to workspaces: theirs), oldest first, without
/// their secrets. Scope `webhooks:write`.
#[utoipa::path(
    operation_id = "listWebhooks",
    tag = "webhooks",
    security(("bearer" = ["webhooks:write"])),
    responses((status = 200, description = "The subscriptions", body = WebhookList))
)]
#[get("/webhooks")]
async fn list_webhooks(
    auth: Unbound<WebhooksWrite>,
    state: web::Data<AppState>,
) -> Result<web::Json<WebhookList>, Error> {
    let all = webhooks::list(&state.ctx, &auth).await?;
    Ok(web::Json(WebhookList {
        items: all.iter().map(Webhook::from).collect(),
    }))
}

/// Get a webhook subscription
///
/// Its settings and where its delivery stands (cursor, failed attempts, next attempt), without the
/// secret. Scope `webhooks:write`.
#[utoipa::path(
    operation_id = "getWebhook",
    tag = "webhooks",
    security(("bearer" = ["webhooks:write"])),
    params(("id" = Uuid, Path, description = "Webhook id")),
    responses(
        (status = 200, description = "The subscription", body = Webhook),
        (status = 404, description = "No such subscription (`not_found`)", body = Problem),
    )
)]
#[get("/webhooks/{id}")]
async fn get_webhook(
    auth: Unbound<WebhooksWrite>,
    state: web::Data<AppState>,
    id: web::Path<WebhookId>,
) -> Result<web::Json<Webhook>, Error> {
    Ok(web::Json(Webhook::from(&webhooks::get(&state.ctx, &auth, *id).await?)))
}

/// Change a webhook subscription
///
/// Changes only the fields given. `enabled: false` stops delivery (the cursor stays); `enabled: true`
/// on a disabled one resumes at the event it stopped at, with fresh retries. Scope `webhooks:write`;
/// changing `types` needs `events:read` too.
#[utoipa::path(
    operation_id = "updateWebhook",
    tag = "webhooks",
    security(("bearer" = ["webhooks:write"])),
    params(("id" = Uuid, Path, description = "Webhook id")),
    request_body = UpdateWebhook,
    responses(
        (status = 200, description = "The subscription as it is now", body = Webhook),
        (status = 403, description = "`types` without `events:read` (`insufficient_scope`)", body = Problem),
        (status = 404, description = "No such subscription (`not_found`)", body = Problem),
        (status = 422, description = "A URL or type refused (`validation_failed`, with the field)", body = Problem),
    )
)]
#[patch("/webhooks/{id}")]
async fn update_webhook(
    auth: Unbound<WebhooksWrite>,
    state: web::Data<AppState>,
    id: web::Path<WebhookId>,
    body: web::Json<UpdateWebhook>,
) -> Result<web::Json<Webhook>, Error> {
    let b = body.into_inner();
    let patch = WebhookPatch {
        url: b.url,
        types: b.types,
        description: b.description,
        enabled: b.enabled,
    };
    Ok(web::Json(Webhook::from(
        &webhooks::update(&state.ctx, &auth, *id, patch).await?,
    )))
}

/// Delete a webhook subscription
///
/// Once it answers, nothing more is sent: an attempt in flight is finished or abandoned first. Its
/// attempts go with it. Scope `webhooks:write`.
#[utoipa::path(
    operation_id = "deleteWebhook",
    tag = "webhooks",
    security(("bearer" = ["webhooks:write"])),
    params(("id" = Uuid, Path, description = "Webhook id")),
    responses(
        (status = 204, description = "Deleted"),
        (status = 404, description = "No such subscription (`not_found`)", body = Problem),
    )
)]
#[delete("/webhooks/{id}")]
async fn delete_webhook(
    auth: Unbound<WebhooksWrite>,
    state: web::Data<AppState>,
    id: web::Path<WebhookId>,
) -> Result<HttpResponse, Error> {
    webhooks::delete(&state.ctx, &auth, *id).await?;
    Ok(HttpResponse::NoContent().finish())
}

/// Rotate a webhook's signing secret
///
/// A new secret, shown this once. The old one keeps signing beside it (two `v1,` signatures in
/// `webhook-signature`) for `BERTH_WEBHOOK_SECRET_OVERLAP_SECS` (a day by default), so a receiver can
/// switch without losing a delivery. Scope `webhooks:write`.
#[utoipa::path(
    operation_id = "rotateWebhookSecret",
    tag = "webhooks",
    security(("bearer" = ["webhooks:write"])),
    params(("id" = Uuid, Path, description = "Webhook id")),
    responses(
        (status = 200, description = "The new secret, shown only here", body = WebhookWithSecret),
        (status = 404, description = "No such subscription (`not_found`)", body = Problem),
    )
)]
#[post("/webhooks/{id}/secret")]
async fn rotate_webhook_secret(
    auth: Unbound<WebhooksWrite>,
    state: web::Data<AppState>,
    id: web::Path<WebhookId>,
) -> Result<web::Json<WebhookWithSecret>, Error> {
    Ok(web::Json(webhooks::rotate_secret(&state.ctx, &auth, *id).await?.into()))
}

/// List a webhook's recent delivery attempts
///
/// The newest 100 attempts (events and pings), newest first: status, latency and error. Scope
/// `webhooks:write`.
#[utoipa::path(
    operation_id = "listWebhookDeliveries",
    tag = "webhooks",
    security(("bearer" = ["webhooks:write"])),
    params(("id" = Uuid, Path, description = "Webhook id")),
    responses(
        (status = 200, description = "The attempts", body = WebhookDeliveryList),
        (status = 404, description = "No such subscription (`not_found`)", body = Problem),
    )
)]
#[get("/webhooks/{id}/deliveries")]
async fn list_webhook_deliveries(
    auth: Unbound<WebhooksWrite>,
    state: web::Data<AppState>,
    id: web::Path<WebhookId>,
) -> Result<web::Json<WebhookDeliveryList>, Error> {
    let items = webhooks::deliveries(&state.ctx, &auth, *id).await?;
    Ok(web::Json(WebhookDeliveryList {
        items: items.into_iter().map(Into::into).collect(),
    }))
}

/// Send a webhook a ping
///
/// Posts `{"version": "v1", "type": "webhook.ping", "webhook_id", "created_at", "data": {}}`, signed as
/// every delivery, once, now, and answers the attempt (a ping is not an event of the log and is not
/// retried). Works on a disabled subscription too. Scope `webhooks:write`.
#[utoipa::path(
    operation_id = "testWebhook",
    tag = "webhooks",
    security(("bearer" = ["webhooks:write"])),
    params(("id" = Uuid, Path, description = "Webhook id")),
    responses(
        (status = 200, description = "The attempt (see `succeeded`)", body = WebhookDelivery),
        (status = 404, description = "No such subscription (`not_found`)", body = Problem),
    )
)]
#[post("/webhooks/{id}/test")]
async fn test_webhook(
    auth: Unbound<WebhooksWrite>,
    state: web::Data<AppState>,
    id: web::Path<WebhookId>,
) -> Result<web::Json<WebhookDelivery>, Error> {
    Ok(web::Json(webhooks::ping(&state.ctx, &auth, *id).await?.into()))
}
