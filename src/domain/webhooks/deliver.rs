//! Delivery: each enabled subscription is a durable cursor over the event log, delivered
//! by exactly one process at a time (a lease on its row, renewed every third of it), in `seq` order, at
//! least once. The cursor moves only past an event its receiver took (a 2xx) or one the subscription does
//! not take, recorded with the attempts in batches, so a process killed mid-batch is followed by one that
//! sends those events again, with the same `webhook-id`. A failing receiver holds its own subscription back (with backoff and jitter) and
//! nothing else: every subscription has its own task, and no request waits for a receiver. One event
//! failing for longer than the retry horizon disables the subscription with its reason and a
//! `webhook.disabled` event.
use crate::ids::{DeliveryId, InstanceId, WebhookId};
use std::collections::{HashMap, VecDeque};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use serde_json::json;

use super::{Ctx, address};
use crate::entity::{event, webhook, webhook_delivery};
use crate::error::Result;
use crate::events::{self, EventType, Filter, Narrowing, Subject};
use crate::store::webhooks::{self as store, Position};

/// Events read at once past a subscription's cursor.
const PAGE: u64 = 200;
/// What of a receiver's answer is read (its start is the attempt's excerpt); the rest is never read.
const ANSWER_READ: usize = 4 * 1024;
/// The longest wait between two attempts at one event.
const MAX_BACKOFF: Duration = Duration::from_secs(3600);
/// Old attempts are trimmed after this many new ones.
const TRIM_EVERY: usize = 50;
/// Successful attempts and the cursor they moved are recorded together, at most this many at once or
/// this long after the first: one write for many deliveries. A process killed in between sends those
/// events again, with the same `webhook-id` (at least once).
const RECORD_EVERY: usize = 32;
const RECORD_AFTER: Duration = Duration::from_millis(250);
/// A caught-up deliverer woken by a new event waits this long before reading: under load, every
/// subscription reads the log tens of times a second instead of once per event.
const COALESCE: Duration = Duration::from_millis(25);

/// What one attempt came to.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub status: Option<u16>,
    pub latency: Duration,
    /// Why it did not succeed; `None` when the receiver answered 2xx.
    pub error: Option<String>,
}

impl Outcome {
    pub fn succeeded(&self) -> bool {
        self.error.is_none()
    }
}

/// The client for the allowed networks of this process's settings (one per set of networks, so its
/// connections are pooled).
fn client(allowed: &[ipnet::IpNet]) -> reqwest::Client {
    static CLIENTS: OnceLock<Mutex<HashMap<Vec<ipnet::IpNet>, reqwest::Client>>> = OnceLock::new();
    let mut clients = CLIENTS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    clients
        .entry(allowed.to_vec())
        .or_insert_with(|| address::client(address::CheckedResolver::new(allowed.to_vec())))
        .clone()
}

/// A post refused before any byte was sent.
fn refused(why: String) -> Outcome {
    Outcome {
        status: None,
        latency: Duration::ZERO,
        error: Some(format!("not posted: {why}")),
    }
}

/// Posts `body` to the subscription, signed, once.
pub async fn post(ctx: &Ctx, w: &webhook::Model, message_id: &str, body: &serde_json::Value) -> Outcome {
    let bytes = serde_json::to_vec(body).unwrap_or_default();
    let now = crate::clock::now();
    let timestamp = now.timestamp();
    let signature = super::sign::header(&super::signing_secrets(w, now), message_id, timestamp, &bytes);
    // A literal address is checked here; a name by the client's resolver, at the connection itself.
    let allowed = &ctx.config.webhook_allowed_networks;
    let Ok(url) = reqwest::Url::parse(&w.url) else {
        return refused("not a URL".into());
    };
    if let Some(why) = address::literal(&url).and_then(|ip| address::refusal(ip, allowed)) {
        return refused(why);
    }
    let started = Instant::now();
    let sent = client(allowed)
        .post(url)
        .timeout(ctx.config.webhook_timeout)
        .header("content-type", "application/json")
        .header("webhook-id", message_id)
        .header("webhook-timestamp", timestamp.to_string())
        .header("webhook-signature", signature)
        .body(bytes)
        .send()
        .await;
    let mut res = match sent {
        Ok(r) => r,
        Err(e) => {
            return Outcome {
                status: None,
                latency: started.elapsed(),
                error: Some(failure(e)),
            };
        }
    };
    let status = res.status();
    // At most ANSWER_READ bytes of the answer, within the same timeout; the rest is dropped unread.
    let mut answer = Vec::new();
    while answer.len() < ANSWER_READ {
        match res.chunk().await {
            Ok(Some(chunk)) => answer.extend_from_slice(&chunk),
            _ => break,
        }
    }
    let latency = started.elapsed();
    let error = if status.is_success() {
        None
    } else if status.is_redirection() {
        let to = res
            .headers()
            .get("location")
            .map(|v| super::excerpt::excerpt(v.as_bytes()))
            .unwrap_or_default();
        Some(format!("answered {status} (redirects are not followed): {to}"))
    } else {
        Some(format!("answered {status}: {}", super::excerpt::excerpt(&answer)))
    };
    Outcome {
        status: Some(status.as_u16()),
        latency,
        error,
    }
}

/// Why a post failed, with its causes, without the URL (which may carry credentials).
fn failure(e: reqwest::Error) -> String {
    let what = if e.is_timeout() {
        "no answer within BERTH_WEBHOOK_TIMEOUT_SECS"
    } else {
        "could not post"
    };
    format!("{what}: {}", crate::error::with_causes(&e.without_url()))
}

pub fn attempt_row(
    w: &webhook::Model,
    message_id: &str,
    event_seq: Option<i64>,
    event_type: &str,
    attempt: i32,
    o: &Outcome,
) -> webhook_delivery::Model {
    webhook_delivery::Model {
        id: DeliveryId::now_v7(),
        webhook_id: w.id,
        message_id: message_id.to_string(),
        event_seq,
        event_type: event_type.to_string(),
        attempt,
        status_code: o.status.map(i32::from),
        succeeded: o.succeeded(),
        latency_ms: o.latency.as_millis() as i64,
        error: o.error.clone(),
        created_at: crate::clock::now(),
    }
}

/// The `webhook-id` of an event for a subscription: the same for every attempt.
fn message_id(w: &webhook::Model, seq: i64) -> String {
    format!("msg_{}_{seq}", w.id.uuid().simple())
}

/// The events a subscription takes.
fn filter_of(w: &webhook::Model) -> Filter {
    let types = w.types.as_ref().and_then(|t| t.as_array()).map(|entries| {
        let joined: Vec<&str> = entries.iter().filter_map(|e| e.as_str()).collect();
        // Checked when stored; a type renamed since then narrows to what is left.
        crate::domain::events::parse_types(Some(&joined.join(",")))
            .ok()
            .flatten()
            .unwrap_or_default()
    });
    Filter {
        narrow: Narrowing {
            workspace_id: w.workspace_id,
            types,
            ..Default::default()
        },
        ..Default::default()
    }
}

/// The wait before attempt `attempts + 1`: doubling from one second, at most an hour, each between half
/// and all of that (jitter, so receivers coming back are not hit by every sender at once).
fn backoff(attempts: i32) -> Duration {
    let full = Duration::from_secs(1u64 << (attempts.clamp(1, 13) - 1) as u32).min(MAX_BACKOFF);
    let mut r = [0u8; 2];
    let _ = getrandom::fill(&mut r);
    let fraction = 0.5 + 0.5 * (u16::from_le_bytes(r) as f64 / u16::MAX as f64);
    full.mul_f64(fraction)
}

/// The deliverers of this process, each with the switch that abandons what it does (a deleted
/// subscription's post in flight, its waits).
/// Keyed by the berth instance too: two instances in one process (the tests' replicas) are as apart as two
/// processes, and another's deliverer is reached through the database (the delete waits for its lease).
type Switches = HashMap<(InstanceId, WebhookId), tokio::sync::watch::Sender<bool>>;

fn deliverers() -> std::sync::MutexGuard<'static, Switches> {
    static DELIVERERS: OnceLock<Mutex<Switches>> = OnceLock::new();
    DELIVERERS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner())
}

/// Abandons what this instance's deliverer of `id` does now (its subscription is being deleted).
pub fn cancel(me: InstanceId, id: WebhookId) {
    if let Some(switch) = deliverers().get(&(me, id)) {
        let _ = switch.send(true);
    }
}

/// A deliverer's place in [`deliverers`], given up when it stops.
struct Registered {
    key: (InstanceId, WebhookId),
    cancelled: tokio::sync::watch::Receiver<bool>,
}

impl Registered {
    fn new(me: InstanceId, id: WebhookId) -> Registered {
        let (switch, cancelled) = tokio::sync::watch::channel(false);
        deliverers().insert((me, id), switch);
        Registered {
            key: (me, id),
            cancelled,
        }
    }

    /// Completes once the deliverer is cancelled.
    async fn cancelled(&self) {
        let mut rx = self.cancelled.clone();
        if rx.wait_for(|c| *c).await.is_err() {
            std::future::pending::<()>().await; // its switch is gone: never cancelled
        }
    }
}

impl Drop for Registered {
    fn drop(&mut self) {
        let mut all = deliverers();
        if all
            .get(&self.key)
            .is_some_and(|switch| switch.subscribe().same_channel(&self.cancelled))
        {
            all.remove(&self.key);
        }
    }
}

/// Finds subscriptions nobody delivers and delivers each this process leases, each in its own task,
/// forever.
pub async fn run(ctx: Ctx) {
    let tick = (ctx.config.webhook_lease / 4).clamp(Duration::from_millis(200), Duration::from_secs(1));
    let mut running: HashMap<WebhookId, tokio::task::JoinHandle<()>> = HashMap::new();
    loop {
        if ctx.shutdown.is_begun() {
            return; // `give_back` releases what this process held
        }
        running.retain(|_, task| !task.is_finished());
        let now = crate::clock::now();
        match store::unleased(&ctx.db.conn, now).await {
            Ok(ids) => {
                for id in ids {
                    if running.contains_key(&id) {
                        continue;
                    }
                    let until = now + chrono::Duration::from_std(ctx.config.webhook_lease).unwrap_or_default();
                    match store::lease(&ctx.db.conn, id, ctx.instance_id, now, until).await {
                        Ok(true) => {
                            let c = ctx.clone();
                            running.insert(id, tokio::spawn(async move { serve(c, id).await }));
                        }
                        Ok(false) => {}
                        Err(e) => tracing::warn!(webhook = %id, error = %e, "could not lease a webhook"),
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e, "could not read the webhook subscriptions"),
        }
        tokio::time::sleep(tick).await;
    }
}

/// A process shutting down gives its subscriptions back, so that another replica (or this node started
/// again) delivers them at once rather than after `BERTH_WEBHOOK_LEASE_SECS`. A delivery still in flight
/// may then be sent twice: its `webhook-id` lets the receiver see that.
pub async fn give_back(ctx: &Ctx) {
    match store::release_all(&ctx.db.conn, ctx.instance_id).await {
        Ok(0) => {}
        Ok(n) => tracing::info!(webhooks = n, "gave the webhook subscriptions back"),
        Err(e) => tracing::warn!(error = %e, "could not give the webhook subscriptions back; their leases run out"),
    }
}

/// Delivers one subscription while this process holds its lease.
async fn serve(ctx: Ctx, id: WebhookId) {
    match deliver(&ctx, id).await {
        Ok(()) => {}
        Err(e) => tracing::warn!(webhook = %id, error = %e, "webhook delivery stopped; it resumes from its cursor"),
    }
    let _ = store::release(&ctx.db.conn, id, ctx.instance_id).await;
}

/// What a deliverer sent since it last recorded: its attempts, and since when.
struct Unrecorded {
    attempts: Vec<webhook_delivery::Model>,
    since: Instant,
    /// The position last written: with no attempt since, an unchanged position is not written again.
    written: Option<Position>,
}

async fn deliver(ctx: &Ctx, id: WebhookId) -> Result<()> {
    let me = ctx.instance_id;
    let conn = &ctx.db.conn;
    let lease = chrono::Duration::from_std(ctx.config.webhook_lease).unwrap_or_default();
    let idle = ctx.config.webhook_lease / 3;
    let mut live = ctx.events.subscribe();
    let me_registered = Registered::new(me, id);
    let Some(mut w) = store::find(conn, id).await? else {
        return Ok(());
    };
    let mut renewed: Option<Instant> = None;
    let mut queue: VecDeque<event::Model> = VecDeque::new();
    let mut unrecorded = Unrecorded {
        attempts: Vec::new(),
        since: Instant::now(),
        written: None,
    };
    let mut since_trim = 0usize;
    loop {
        if ctx.shutdown.is_begun() {
            record(ctx, &mut w, &mut unrecorded).await?;
            return Ok(());
        }
        let now = crate::clock::now();
        if renewed.is_none_or(|at| at.elapsed() >= idle) {
            if !store::lease(conn, id, me, now, now + lease).await? {
                return Ok(()); // another process holds it, or it was disabled or deleted
            }
            renewed = Some(Instant::now());
        }
        if let Some(at) = w.next_attempt_at
            && at > now
        {
            let wait = (at - now).to_std().unwrap_or_default().min(idle);
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = me_registered.cancelled() => return Ok(()),
            }
            continue;
        }
        if queue.is_empty() {
            let page = events::after(conn, w.cursor, PAGE, &Filter::default()).await?;
            let filter = filter_of(&w);
            let Some(last) = page.last().map(|e| e.seq) else {
                // Caught up: record, then wait for the next event (or the lease's renewal).
                if !record(ctx, &mut w, &mut unrecorded).await? {
                    return Ok(());
                }
                let woken = tokio::select! {
                    woken = tokio::time::timeout(idle, live.recv()) => woken.is_ok(),
                    _ = me_registered.cancelled() => return Ok(()),
                };
                if woken {
                    // Let the burst the event belongs to arrive: one read for many events, not one each.
                    tokio::time::sleep(COALESCE).await;
                }
                continue;
            };
            // Retention took events after the cursor before they were delivered (the subscription was
            // lagging or disabled): resume from the oldest kept, and say what was skipped.
            if page[0].seq > w.cursor + 1 {
                let (kept, _) = events::bounds(conn).await?;
                if kept > w.cursor + 1 {
                    if !skip(ctx, &mut w, &mut unrecorded, kept - 1).await? {
                        return Ok(());
                    }
                    continue;
                }
            }
            queue = page.into_iter().filter(|e| filter.admits(e)).collect();
            if queue.is_empty() {
                // Nothing of this subscription's in the page: pass it.
                w.cursor = last;
                if !record(ctx, &mut w, &mut unrecorded).await? {
                    return Ok(());
                }
                continue;
            }
        }
        let next = queue.front().expect("a queued event");
        let message = message_id(&w, next.seq);
        // Still this process's to deliver (not deleted, disabled, or taken over) just before the post; a
        // delete after this check abandons the post (this process) or waits for it (another).
        if !store::still_delivers(conn, id, me).await? {
            return Ok(());
        }
        let sent = body(next);
        let outcome = tokio::select! {
            outcome = post(ctx, &w, &message, &sent) => outcome,
            _ = me_registered.cancelled() => return Ok(()),
        };
        let attempt = w.attempts + 1;
        let row = attempt_row(
            &w,
            &message,
            Some(next.seq),
            next.event_type.as_str(),
            attempt,
            &outcome,
        );
        unrecorded.attempts.push(row);
        ctx.metrics.webhook_attempt(outcome.succeeded());
        let now = crate::clock::now();
        if outcome.succeeded() {
            w.cursor = next.seq;
            w.attempts = 0;
            w.failing_since = None;
            w.next_attempt_at = None;
            queue.pop_front();
        } else {
            let failing_since = w.failing_since.unwrap_or(now);
            let failing_for = (now - failing_since).to_std().unwrap_or_default();
            if failing_for >= ctx.config.webhook_retry_horizon {
                let reason = format!(
                    "{} attempts at event {} failed over {} s; the last: {}",
                    attempt,
                    next.seq,
                    failing_for.as_secs(),
                    outcome.error.as_deref().unwrap_or("")
                );
                let seq = next.seq;
                record(ctx, &mut w, &mut unrecorded).await?;
                disable(ctx, &w, seq, &reason).await?;
                return Ok(());
            }
            // Past what it does not take, up to the event it failed; the retry reads the log again (retention
            // may take that event meanwhile, if the subscription lags).
            w.cursor = next.seq - 1;
            queue.clear();
            w.attempts = attempt;
            w.failing_since = Some(failing_since);
            w.next_attempt_at = Some(now + chrono::Duration::from_std(backoff(attempt)).unwrap_or_default());
        }
        // A failure is recorded at once (its backoff is the subscription's state); successes in batches.
        if !outcome.succeeded()
            || unrecorded.attempts.len() >= RECORD_EVERY
            || unrecorded.since.elapsed() >= RECORD_AFTER
        {
            let cursor = w.cursor;
            since_trim += unrecorded.attempts.len();
            if !record(ctx, &mut w, &mut unrecorded).await? {
                return Ok(());
            }
            if w.cursor != cursor {
                queue.clear(); // moved by someone else (enabled again): read from where it is now
            }
            if since_trim >= TRIM_EVERY {
                since_trim = 0;
                store::trim_deliveries(conn, id, super::DELIVERIES_KEPT).await?;
            }
        }
    }
}

/// Writes the unrecorded attempts and `w`'s position in one transaction, then reads the subscription
/// again (its secrets, URL and types as edited since). `false`: this process no longer delivers it
/// (the lease was lost, or it was disabled or deleted).
async fn record(ctx: &Ctx, w: &mut webhook::Model, unrecorded: &mut Unrecorded) -> Result<bool> {
    let position = Position {
        cursor: w.cursor,
        attempts: w.attempts,
        failing_since: w.failing_since,
        next_attempt_at: w.next_attempt_at,
    };
    if unrecorded.attempts.is_empty() && unrecorded.written.as_ref() == Some(&position) {
        return Ok(true); // nothing new; the lease's renewal notices a disable or a delete
    }
    let attempts = std::mem::take(&mut unrecorded.attempts);
    unrecorded.since = Instant::now();
    let txn = ctx.db.begin_write().await?;
    if !store::record(&txn, w.id, ctx.instance_id, attempts, &position).await? {
        txn.rollback().await?;
        return Ok(false);
    }
    ctx.commit(txn).await?;
    unrecorded.written = Some(position);
    match store::find(&ctx.db.conn, w.id).await? {
        Some(fresh) => {
            *w = fresh;
            Ok(true)
        }
        None => Ok(false),
    }
}

/// Moves past events retention took (up to `to`), recording what was sent before and the skip with its
/// event; `false`: this process no longer delivers it.
async fn skip(ctx: &Ctx, w: &mut webhook::Model, unrecorded: &mut Unrecorded, to: i64) -> Result<bool> {
    if !record(ctx, w, unrecorded).await? {
        return Ok(false);
    }
    let from = w.cursor + 1;
    if to < from {
        return Ok(true); // moved meanwhile
    }
    let position = Position {
        cursor: to,
        attempts: 0,
        failing_since: None,
        next_attempt_at: None,
    };
    if !super::lag::record_skip(ctx, w, &position, from).await? {
        return Ok(false);
    }
    unrecorded.written = Some(position.clone());
    w.cursor = to;
    w.attempts = 0;
    w.failing_since = None;
    w.next_attempt_at = None;
    Ok(true)
}

/// The body of an event's delivery: the event as the stream sends it.
fn body(e: &event::Model) -> serde_json::Value {
    serde_json::to_value(events::wire::Event::from(e)).unwrap_or_default()
}

/// Disables the subscription with its reason, and says so in the log (never silently).
async fn disable(ctx: &Ctx, w: &webhook::Model, seq: i64, reason: &str) -> Result<()> {
    let txn = ctx.db.begin_write().await?;
    if store::disable(&txn, w.id, ctx.instance_id, reason, crate::clock::now()).await? {
        let subject = Subject {
            workspace_id: w.workspace_id,
            ..Default::default()
        };
        let data = json!({"webhook_id": w.id, "url": super::shown_url(&w.url), "reason": reason, "event_seq": seq});
        events::append(&txn, ctx.instance_id, EventType::WebhookDisabled, subject, data).await?;
    }
    ctx.commit(txn).await?;
    tracing::warn!(webhook = %w.id, reason, "webhook disabled");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_with_jitter_and_stops_at_an_hour() {
        for (attempts, full) in [(1, 1), (2, 2), (3, 4), (10, 512), (13, 3600), (40, 3600)] {
            let d = backoff(attempts);
            let full = Duration::from_secs(full);
            assert!(d >= full / 2 && d <= full, "{attempts}: {d:?}");
        }
    }
}
