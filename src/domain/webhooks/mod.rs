//! Webhook subscriptions: who may make and see them, what a valid one is, and
//! the secret that signs its deliveries. Delivery itself is `deliver`; the signature `sign`.
pub mod address;
pub mod deliver;
pub mod excerpt;
pub mod lag;
pub mod sign;

use crate::ids::{WebhookId, WorkspaceId};
use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::Ctx;
use crate::auth::Principal;
use crate::entity::{webhook, webhook_delivery};
use crate::error::{Error, Result};
use crate::scope::Scope;
use crate::store::webhooks as store;

/// The newest attempts `deliveries` lists and keeps.
pub const DELIVERIES_KEPT: u64 = 100;

pub struct NewWebhook {
    pub url: String,
    pub types: Option<Vec<String>>,
    pub workspace_id: Option<WorkspaceId>,
    pub description: String,
    pub enabled: bool,
}

/// A person's change; `None` leaves a field as it is (`types: Some(None)` takes every type).
#[derive(Default)]
pub struct WebhookPatch {
    pub url: Option<String>,
    pub types: Option<Option<Vec<String>>>,
    pub description: Option<String>,
    pub enabled: Option<bool>,
}

/// A subscription and, when it was just made or its secret rotated, the secret (shown that once).
pub struct Made {
    pub webhook: webhook::Model,
    pub secret: String,
}

/// `https://`, or `http://` to a loopback host (any host with `BERTH_WEBHOOK_ALLOW_HTTP`); and a host
/// that is, or resolves to, only addresses berth may post to (`address`).
async fn checked_url(ctx: &Ctx, raw: &str) -> Result<String> {
    let raw = raw.trim();
    if raw.len() > 2000 {
        return Err(Error::invalid("url", "at most 2000 characters"));
    }
    let url = reqwest::Url::parse(raw).map_err(|e| Error::invalid("url", format!("not a URL: {e}")))?;
    let loopback = super::names_loopback(&url).ok_or_else(|| Error::invalid("url", "names no host"))?;
    match url.scheme() {
        "https" => {}
        "http" if loopback || ctx.config.webhook_allow_http => {}
        "http" => {
            return Err(Error::invalid(
                "url",
                "plain http only to a loopback host (set BERTH_WEBHOOK_ALLOW_HTTP=true to allow others); use https",
            ));
        }
        other => return Err(Error::invalid("url", format!("{other}: not http or https"))),
    }
    if url.fragment().is_some() {
        return Err(Error::invalid("url", "must not carry a fragment"));
    }
    address::check_url(&url, &ctx.config.webhook_allowed_networks)
        .await
        .map_err(|why| Error::invalid("url", why))?;
    Ok(url.to_string())
}

/// A URL as events and logs show it: without its userinfo, query and fragment (any of which may carry a
/// credential).
pub fn shown_url(raw: &str) -> String {
    match reqwest::Url::parse(raw) {
        Ok(mut url) => {
            let _ = url.set_username("");
            let _ = url.set_password(None);
            url.set_query(None);
            url.set_fragment(None);
            url.to_string()
        }
        Err(_) => "<not a URL>".into(),
    }
}

/// Each entry an event type or a prefix of some ending in `.` (as the event filters take them).
fn checked_types(types: Option<Vec<String>>) -> Result<Option<serde_json::Value>> {
    let Some(types) = types else { return Ok(None) };
    if types.is_empty() {
        return Err(Error::invalid(
            "types",
            "give at least one entry, or leave it out for every type",
        ));
    }
    super::events::parse_types(Some(&types.join(","))).map_err(|e| match e {
        Error::BadRequest(m) => Error::invalid("types", m),
        other => other,
    })?;
    Ok(Some(serde_json::json!(types)))
}

fn checked_description(d: &str) -> Result<String> {
    if d.chars().count() > 500 {
        return Err(Error::invalid("description", "at most 500 characters"));
    }
    Ok(d.to_string())
}

/// A subscription's owner: a token that sees its workspace, or, for one about every workspace, a token
/// limited to no workspace (which sees every event anyway). Only an owner sees, changes, tests or deletes
/// it, and reads its attempts (the receiver's status and a short, redacted excerpt of its answer); to
/// anyone else it does not exist (`404`).
fn may_manage(p: &Principal, workspace_id: Option<WorkspaceId>) -> bool {
    match workspace_id {
        Some(ws) => p.sees_workspace(ws),
        None => p.workspace_filter().is_none(),
    }
}

/// A subscription delivers events: taking them needs the scope that reads them.
fn may_take_events(p: &Principal) -> Result<()> {
    p.require(Scope::EventsRead)
}

pub async fn create(ctx: &Ctx, p: &Principal, new: NewWebhook) -> Result<Made> {
    may_take_events(p)?;
    let url = checked_url(ctx, &new.url).await?;
    let types = checked_types(new.types)?;
    let description = checked_description(&new.description)?;
    if !may_manage(p, new.workspace_id) {
        return Err(Error::Forbidden(
            "a token limited to workspaces makes subscriptions of one of them only (give workspace_id)",
        ));
    }
    if let Some(ws) = new.workspace_id {
        crate::store::workspaces::find(&ctx.db.conn, ws)
            .await?
            .ok_or(Error::NotFound("workspace"))?;
    }
    let now = crate::clock::now();
    // Delivery starts after the newest event: a new subscription is told what happens from now on.
    let (_, latest) = crate::events::bounds(&ctx.db.conn).await?;
    let secret = sign::new_secret();
    let w = webhook::Model {
        id: WebhookId::now_v7(),
        url,
        types,
        workspace_id: new.workspace_id,
        description,
        enabled: new.enabled,
        disabled_reason: None,
        secret: secret.clone(),
        previous_secret: None,
        previous_secret_expires_at: None,
        cursor: latest,
        attempts: 0,
        failing_since: None,
        next_attempt_at: None,
        lagging: false,
        lease_owner: None,
        lease_expires_at: None,
        created_by: Some(p.sub.clone()),
        created_at: now,
        updated_at: now,
    };
    store::insert(&ctx.db.conn, w.clone()).await?;
    Ok(Made { webhook: w, secret })
}

/// The subscriptions this token manages.
pub async fn list(ctx: &Ctx, p: &Principal) -> Result<Vec<webhook::Model>> {
    let all = store::list(&ctx.db.conn, p.workspace_filter()).await?;
    Ok(all.into_iter().filter(|w| may_manage(p, w.workspace_id)).collect())
}

/// One subscription this token manages (else `404`, as if it did not exist).
pub async fn get(ctx: &Ctx, p: &Principal, id: WebhookId) -> Result<webhook::Model> {
    store::find(&ctx.db.conn, id)
        .await?
        .filter(|w| may_manage(p, w.workspace_id))
        .ok_or(Error::NotFound("webhook"))
}

pub async fn update(ctx: &Ctx, p: &Principal, id: WebhookId, patch: WebhookPatch) -> Result<webhook::Model> {
    let mut w = get(ctx, p, id).await?;
    if patch.types.is_some() {
        may_take_events(p)?;
    }
    if let Some(url) = patch.url {
        w.url = checked_url(ctx, &url).await?;
    }
    if let Some(types) = patch.types {
        w.types = checked_types(types)?;
    }
    if let Some(d) = patch.description {
        w.description = checked_description(&d)?;
    }
    if let Some(enabled) = patch.enabled {
        if enabled && !w.enabled {
            // Enabled again: the retries start afresh at the event it stopped at, or at the oldest one
            // still retained when retention took events while it was off (the deliverer says what it
            // skipped). Its lag is not reset: one still far behind holds no retention.
            w.disabled_reason = None;
            w.attempts = 0;
            w.failing_since = None;
            w.next_attempt_at = None;
        }
        w.enabled = enabled;
    }
    w.updated_at = crate::clock::now();
    store::save(&ctx.db.conn, w.clone()).await?;
    Ok(w)
}

/// Deletes a subscription so that nothing reaches its receiver after the answer: it is stopped first
/// (every deliverer checks that before each post), a post of this process in flight is abandoned, and a
/// post of another replica is waited for (it holds the lease until it is done, and a post takes at most
/// `BERTH_WEBHOOK_TIMEOUT_SECS`); then the row goes.
pub async fn delete(ctx: &Ctx, p: &Principal, id: WebhookId) -> Result<()> {
    get(ctx, p, id).await?;
    let conn = &ctx.db.conn;
    store::stop(conn, id).await?;
    deliver::cancel(ctx.instance_id, id);
    let deadline = std::time::Instant::now() + ctx.config.webhook_timeout + std::time::Duration::from_secs(1);
    while std::time::Instant::now() < deadline && !store::lease_free(conn, id, crate::clock::now()).await? {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    store::delete(conn, id).await?;
    Ok(())
}

/// A new secret; the old one keeps signing beside it for `BERTH_WEBHOOK_SECRET_OVERLAP_SECS`.
pub async fn rotate_secret(ctx: &Ctx, p: &Principal, id: WebhookId) -> Result<Made> {
    let mut w = get(ctx, p, id).await?;
    let now = crate::clock::now();
    let secret = sign::new_secret();
    let overlap = chrono::Duration::from_std(ctx.config.webhook_secret_overlap).unwrap_or_default();
    w.previous_secret = Some(std::mem::replace(&mut w.secret, secret.clone()));
    w.previous_secret_expires_at = Some(now + overlap);
    w.updated_at = now;
    store::save(&ctx.db.conn, w.clone()).await?;
    Ok(Made { webhook: w, secret })
}

/// The secrets that sign a delivery now: the current one, and the previous one within its overlap.
pub fn signing_secrets(w: &webhook::Model, now: DateTime<Utc>) -> Vec<&str> {
    let mut all = vec![w.secret.as_str()];
    if let (Some(old), Some(until)) = (&w.previous_secret, w.previous_secret_expires_at)
        && now < until
    {
        all.push(old);
    }
    all
}

/// The newest attempts, newest first.
pub async fn deliveries(ctx: &Ctx, p: &Principal, id: WebhookId) -> Result<Vec<webhook_delivery::Model>> {
    get(ctx, p, id).await?;
    store::deliveries(&ctx.db.conn, id, DELIVERIES_KEPT).await
}

/// Sends a ping now (not an event of the log; its cursor does not move) and answers the attempt.
pub async fn ping(ctx: &Ctx, p: &Principal, id: WebhookId) -> Result<webhook_delivery::Model> {
    let w = get(ctx, p, id).await?;
    let now = crate::clock::now();
    let body = serde_json::json!({
        "version": "v1",
        "type": "webhook.ping",
        "webhook_id": w.id,
        "created_at": now,
        "data": {},
    });
    let message_id = format!("ping_{}", Uuid::now_v7().simple());
    let outcome = deliver::post(ctx, &w, &message_id, &body).await;
    let d = deliver::attempt_row(&w, &message_id, None, "webhook.ping", 1, &outcome);
    store::insert_delivery(&ctx.db.conn, d.clone()).await?;
    Ok(d)
}
