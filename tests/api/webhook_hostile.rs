//! Webhooks as a hostile caller would use them: they reach the outside only (an address of this host or
//! its networks is refused when a subscription is made or changed, and again at every post), show a
//! receiver's answer to the subscription's owner only and shortly, need `events:read` to take events, hold
//! no one's retention when they lag, send nothing once deleted, and never show a URL's credentials in an
//! event.
use std::sync::{Arc, Mutex};
use std::time::Duration;

use reqwest::Method;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::both_backends;
use crate::helpers::{TestApp, id_of};
use crate::webhooks::respawn;

both_backends!(
    inside_addresses_are_refused_when_made_changed_and_posted,
    loopback_is_reached_only_when_listed,
    a_receivers_answer_is_kept_short_redacted_and_for_its_owner_only,
    taking_events_needs_events_read,
    a_disabled_event_shows_the_url_without_its_credentials,
    nothing_is_delivered_once_a_delete_answered,
    nothing_is_delivered_once_another_replica_answered_a_delete,
    a_lagging_subscription_holds_no_retention_and_says_what_it_skipped,
);

/// A receiver of this test's own: answers every request with one status and body, and counts the
/// connections and the deliveries it got (`webhook-id` and the body's `seq`).
struct Sink {
    port: u16,
    state: Arc<Mutex<SinkState>>,
}

struct SinkState {
    connections: usize,
    /// (`webhook-id`, the event's `seq`) of each request.
    got: Vec<(String, Option<i64>)>,
    /// Requests answered (or whose connection berth dropped while it waited).
    finished: usize,
    status: u16,
    body: String,
    delay: Duration,
}

impl Sink {
    async fn start(status: u16, body: &str) -> Sink {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let state = Arc::new(Mutex::new(SinkState {
            connections: 0,
            got: Vec::new(),
            finished: 0,
            status,
            body: body.to_string(),
            delay: Duration::ZERO,
        }));
        let shared = state.clone();
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                shared.lock().unwrap().connections += 1;
                tokio::spawn(serve(stream, shared.clone()));
            }
        });
        Sink { port, state }
    }

    fn url(&self, host: &str) -> String {
        format!("http://{host}:{}/hook", self.port)
    }

    fn connections(&self) -> usize {
        self.state.lock().unwrap().connections
    }

    fn got(&self) -> Vec<(String, Option<i64>)> {
        self.state.lock().unwrap().got.clone()
    }

    fn finished(&self) -> usize {
        self.state.lock().unwrap().finished
    }

    fn answer(&self, status: u16) {
        self.state.lock().unwrap().status = status;
    }

    fn slow(&self, delay: Duration) {
        self.state.lock().unwrap().delay = delay;
    }

    /// The `seq`s it got.
    fn seqs(&self) -> Vec<i64> {
        self.got().into_iter().filter_map(|(_, seq)| seq).collect()
    }
}

/// One request per connection: its head and body read, recorded, answered after the delay.
async fn serve(mut stream: tokio::net::TcpStream, state: Arc<Mutex<SinkState>>) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    let (head, mut body) = loop {
        let Ok(n) = stream.read(&mut chunk).await else { return };
        if n == 0 {
            return;
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break (
                String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase(),
                buf[end + 4..].to_vec(),
            );
        }
    };
    let header = |name: &str| {
        head.lines()
            .find_map(|l| l.strip_prefix(&format!("{name}:")).map(|v| v.trim().to_string()))
    };
    let length: usize = header("content-length").and_then(|v| v.parse().ok()).unwrap_or(0);
    while body.len() < length {
        let Ok(n) = stream.read(&mut chunk).await else { return };
        if n == 0 {
            break;
        }
        body.extend_from_slice(&chunk[..n]);
    }
    let seq = serde_json::from_slice::<Value>(&body)
        .ok()
        .and_then(|b| b["seq"].as_i64());
    let (status, answer, delay) = {
        let mut s = state.lock().unwrap();
        s.got.push((header("webhook-id").unwrap_or_default(), seq));
        (s.status, s.body.clone(), s.delay)
    };
    tokio::time::sleep(delay).await;
    let reply = format!(
        "HTTP/1.1 {status} X\r\ncontent-type: text/plain\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{answer}",
        answer.len()
    );
    let _ = stream.write_all(reply.as_bytes()).await;
    state.lock().unwrap().finished += 1;
}

/// Writes a subscription's URL as stored, past the API's checks (as if made while an operator allowed it).
async fn set_url(app: &TestApp, id: uuid::Uuid, url: &str) {
    use berth::entity::webhook::{Column, Entity};
    use sea_orm::sea_query::Expr;
    use sea_orm::{ColumnTrait, EntityTrait, QueryFilter};
    let done = Entity::update_many()
        .col_expr(Column::Url, Expr::value(url))
        .filter(Column::Id.eq(berth::ids::WebhookId::from(id)))
        .exec(app.db())
        .await
        .unwrap();
    assert_eq!(done.rows_affected, 1);
}

/// The instance that holds a subscription's lease.
async fn lease_owner(app: &TestApp, id: uuid::Uuid) -> Option<uuid::Uuid> {
    use berth::entity::webhook::Entity;
    use sea_orm::EntityTrait;
    let w = Entity::find_by_id(berth::ids::WebhookId::from(id))
        .one(app.db())
        .await
        .unwrap()
        .unwrap();
    w.lease_owner.map(|o| o.uuid())
}

/// Settings with no network allowed besides public addresses.
const NOTHING_INSIDE: [(&str, &str); 1] = [("BERTH_WEBHOOK_ALLOWED_NETWORKS", "")];

/// Addresses of this host and of the networks it sits in, each as a URL berth must refuse.
const INSIDE: [&str; 25] = [
    "https://127.0.0.1/hook",
    "https://2130706433/hook",
    "https://0x7f.0.0.1/hook",
    "https://017700000001/hook",
    "http://127.0.0.1:9/hook",
    "https://127.1.2.3/hook",
    "https://[::1]/hook",
    "https://localhost/hook",
    "http://localhost:9/hook",
    "https://10.0.0.1/hook",
    "https://172.16.5.4/hook",
    "https://192.168.1.1/hook",
    "https://100.64.0.1/hook",
    "https://169.254.169.254/latest/meta-data",
    "https://[fc00::1]/hook",
    "https://[fd00:ec2::254]/hook",
    "https://[fe80::1]/hook",
    "https://224.0.0.1/hook",
    "https://[ff02::1]/hook",
    "https://0.0.0.0/hook",
    "https://0.1.2.3/hook",
    "https://[::]/hook",
    "https://255.255.255.255/hook",
    "https://[::ffff:127.0.0.1]/hook",
    "https://[::ffff:a9fe:a9fe]/hook",
];

/// A public address (TEST-NET-3) nothing answers on: accepted, never reached in these tests.
const PUBLIC: &str = "https://203.0.113.7/hook";

async fn inside_addresses_are_refused_when_made_changed_and_posted(app: TestApp) {
    let app = respawn(app, &NOTHING_INSIDE).await;
    let ws = app.workspace("hostile").await;
    for url in INSIDE {
        let p = app
            .post("/api/v1/webhooks", json!({"url": url, "workspace_id": ws}))
            .await
            .problem(422, "validation_failed");
        assert_eq!(p["errors"][0]["field"], "url", "{url}: {p}");
    }
    assert_eq!(app.count("webhooks").await, 0, "nothing refused was kept");
    // Changed to an inside address: refused, and the subscription is as it was.
    let w = app
        .post(
            "/api/v1/webhooks",
            json!({"url": PUBLIC, "workspace_id": ws, "enabled": false}),
        )
        .await
        .ok(201);
    let id = id_of(&w);
    for url in [
        "https://10.1.2.3/x",
        "https://localhost:8443/x",
        "https://[::ffff:10.0.0.1]/",
    ] {
        let p = app
            .patch(&format!("/api/v1/webhooks/{id}"), json!({"url": url}))
            .await
            .problem(422, "validation_failed");
        assert_eq!(p["errors"][0]["field"], "url", "{url}: {p}");
    }
    let got = app.get(&format!("/api/v1/webhooks/{id}")).await.ok(200);
    assert_eq!(got["url"], PUBLIC);

    // A subscription stored with an inside address (made while an operator allowed it) is refused at
    // the post itself, by literal address and by name, and nothing connects.
    let sink = Sink::start(204, "").await;
    for host in ["127.0.0.1", "localhost"] {
        let url = sink.url(host);
        set_url(&app, id, &url).await;
        let ping = app
            .post(&format!("/api/v1/webhooks/{id}/test"), json!({}))
            .await
            .ok(200);
        assert_eq!(ping["succeeded"], false, "{ping}");
        assert_eq!(ping["status_code"], Value::Null, "{ping}");
        let error = ping["error"].as_str().unwrap();
        assert!(error.contains("loopback"), "{host}: {error}");
        assert!(error.contains("BERTH_WEBHOOK_ALLOWED_NETWORKS"), "{host}: {error}");
    }
    assert_eq!(sink.connections(), 0, "berth connected to no inside address");
}

async fn loopback_is_reached_only_when_listed(app: TestApp) {
    // The webhook tests' settings list loopback (and only loopback).
    let app = respawn(app, &[]).await;
    let ws = app.workspace("listed").await;
    let sink = Sink::start(204, "").await;
    for host in ["127.0.0.1", "localhost"] {
        let w = app
            .post(
                "/api/v1/webhooks",
                json!({"url": sink.url(host), "workspace_id": ws, "enabled": false}),
            )
            .await
            .ok(201);
        let ping = app
            .post(&format!("/api/v1/webhooks/{}/test", id_of(&w)), json!({}))
            .await
            .ok(200);
        assert_eq!(ping["succeeded"], true, "{host}: {ping}");
    }
    assert_eq!(sink.got().len(), 2);
    // Listing loopback lets nothing else inside through.
    for url in [
        "https://10.0.0.1/hook",
        "https://169.254.169.254/",
        "https://[fc00::1]/",
    ] {
        app.post("/api/v1/webhooks", json!({"url": url, "workspace_id": ws}))
            .await
            .problem(422, "validation_failed");
    }
    // Plain http still goes to loopback only.
    app.post(
        "/api/v1/webhooks",
        json!({"url": "http://203.0.113.7/hook", "workspace_id": ws}),
    )
    .await
    .problem(422, "validation_failed");
}

/// What an internal service might answer: credentials, then far more than an excerpt.
const LEAKY: &str = "internal admin console\n\ttoken=sk_live_0123456789abcdefABCDEF password: hunter2hunter2 \
     api_key abcdEFGH12345678ijkl ";

async fn a_receivers_answer_is_kept_short_redacted_and_for_its_owner_only(app: TestApp) {
    let app = respawn(app, &[]).await;
    let (ws, other) = (app.workspace("mine").await, app.workspace("theirs").await);
    let sink = Sink::start(500, &format!("{LEAKY}{}", "x".repeat(400))).await;
    let w = app
        .post(
            "/api/v1/webhooks",
            json!({"url": sink.url("127.0.0.1"), "workspace_id": ws, "enabled": false}),
        )
        .await
        .ok(201);
    let id = id_of(&w);
    let ping = app
        .post(&format!("/api/v1/webhooks/{id}/test"), json!({}))
        .await
        .ok(200);
    assert_eq!(ping["succeeded"], false, "{ping}");
    assert_eq!(ping["status_code"], 500, "{ping}");
    let error = ping["error"].as_str().unwrap();
    let answer = error.split_once(": ").map(|(_, a)| a).unwrap_or_default();
    assert!(answer.starts_with("internal admin console"), "{error}");
    assert!(
        answer.len() <= 100 + '…'.len_utf8(),
        "at most 100 bytes of the answer: {error}"
    );
    for secret in [
        "sk_live_0123456789abcdefABCDEF",
        "hunter2hunter2",
        "abcdEFGH12345678ijkl",
    ] {
        assert!(!error.contains(secret), "{secret} shown: {error}");
    }
    let kept = app.get(&format!("/api/v1/webhooks/{id}/deliveries")).await;
    assert!(!kept.text.contains("hunter2") && !kept.text.contains("xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"), "{}", kept.text);
    // Another workspace's token, even with every webhook and event scope, sees no such subscription.
    let theirs = app.token_for("webhooks:write events:read", Some(vec![other]), None);
    for (method, path) in [
        (Method::POST, format!("/api/v1/webhooks/{id}/test")),
        (Method::GET, format!("/api/v1/webhooks/{id}/deliveries")),
        (Method::GET, format!("/api/v1/webhooks/{id}")),
    ] {
        let body = (method == Method::POST).then(|| json!({}));
        app.call(method, &path, Some(&theirs), body)
            .await
            .problem(404, "not_found");
    }
    assert_eq!(sink.got().len(), 1, "the other token's test sent nothing");
    // A subscription about every workspace belongs to tokens limited to no workspace.
    let global = app
        .post(
            "/api/v1/webhooks",
            json!({"url": sink.url("127.0.0.1"), "enabled": false}),
        )
        .await
        .ok(201);
    let mine = app.token_for("webhooks:write events:read", Some(vec![ws]), None);
    app.call(
        Method::POST,
        &format!("/api/v1/webhooks/{}/test", id_of(&global)),
        Some(&mine),
        Some(json!({})),
    )
    .await
    .problem(404, "not_found");
}

async fn taking_events_needs_events_read(app: TestApp) {
    let app = respawn(app, &[]).await;
    let ws = app.workspace("scopes").await;
    let sink = Sink::start(204, "").await;
    let body = json!({"url": sink.url("127.0.0.1"), "workspace_id": ws, "enabled": false});
    let writer = app.token("webhooks:write");
    let p = app
        .call(Method::POST, "/api/v1/webhooks", Some(&writer), Some(body.clone()))
        .await
        .problem(403, "insufficient_scope");
    assert_eq!(p["required_scope"], "events:read", "{p}");
    assert_eq!(app.count("webhooks").await, 0);
    let reader = app.token("webhooks:write events:read");
    let w = app
        .call(Method::POST, "/api/v1/webhooks", Some(&reader), Some(body))
        .await
        .ok(201);
    let path = format!("/api/v1/webhooks/{}", id_of(&w));
    app.call(
        Method::PATCH,
        &path,
        Some(&writer),
        Some(json!({"types": ["session."]})),
    )
    .await
    .problem(403, "insufficient_scope");
    app.call(Method::PATCH, &path, Some(&writer), Some(json!({"types": null})))
        .await
        .problem(403, "insufficient_scope");
    let got = app.call(Method::GET, &path, Some(&writer), None).await.ok(200);
    assert_eq!(got["types"], Value::Null, "unchanged: {got}");
    // What does not widen what it takes needs no more than webhooks:write.
    app.call(
        Method::PATCH,
        &path,
        Some(&writer),
        Some(json!({"description": "renamed"})),
    )
    .await
    .ok(200);
    app.call(Method::PATCH, &path, Some(&reader), Some(json!({"types": ["task."]})))
        .await
        .ok(200);
}

async fn a_disabled_event_shows_the_url_without_its_credentials(app: TestApp) {
    let app = respawn(app, &[("BERTH_WEBHOOK_RETRY_HORIZON_SECS", "1")]).await;
    let ws = app.workspace("credentials").await;
    let sink = Sink::start(500, "no").await;
    let url = format!(
        "http://robot:pa55w0rd@127.0.0.1:{}/hook/path?key=s3cr3tvalue",
        sink.port
    );
    let w = app
        .post(
            "/api/v1/webhooks",
            json!({"url": url, "types": ["task."], "workspace_id": ws}),
        )
        .await
        .ok(201);
    let id = id_of(&w);
    app.task(ws, "trigger", &[]).await;
    let disabled = crate::helpers::wait_until_every(
        "the webhook to be disabled",
        Duration::from_secs(60),
        Duration::from_millis(100),
        || async {
            let e = app.get("/api/v1/events?types=webhook.disabled").await.ok(200);
            let found = e["events"]
                .as_array()
                .unwrap()
                .iter()
                .find(|e| e["data"]["webhook_id"] == id.to_string())
                .cloned();
            found.ok_or_else(|| e.to_string())
        },
    )
    .await;
    assert_eq!(
        disabled["data"]["url"],
        format!("http://127.0.0.1:{}/hook/path", sink.port),
        "{disabled}"
    );
    let text = disabled.to_string();
    assert!(
        !text.contains("pa55w0rd") && !text.contains("s3cr3tvalue") && !text.contains("robot"),
        "{text}"
    );
}

async fn nothing_is_delivered_once_a_delete_answered(app: TestApp) {
    let app = respawn(app, &[]).await;
    delete_mid_backlog(&app, None).await;
}

/// Two replicas: the one that does not deliver the subscription answers the delete, which waits for the
/// other's post in flight (through the database: the lease).
async fn nothing_is_delivered_once_another_replica_answered_a_delete(app: TestApp) {
    let app = respawn(app, &[]).await;
    let b = crate::replicas::Replica::start(&app).await;
    delete_mid_backlog(&app, Some(&b)).await;
    b.stop().await;
}

/// A backlog of ten events posted to a slow receiver, the subscription deleted while the second is in
/// flight (through the replica that does not deliver it, when there is one): nothing more arrives.
async fn delete_mid_backlog(app: &TestApp, replica: Option<&crate::replicas::Replica>) {
    let ws = app.workspace("deleted").await;
    let (slow, witness) = (Sink::start(204, "").await, Sink::start(204, "").await);
    // Each answer takes a while (well within the 1 s timeout), so a backlog is being posted, one after
    // another, when the delete comes.
    slow.slow(Duration::from_millis(40));
    let subscribe = |url: String, enabled: bool| async move {
        app.post(
            "/api/v1/webhooks",
            json!({"url": url, "types": ["task."], "workspace_id": ws, "enabled": enabled}),
        )
        .await
        .ok(201)
    };
    let doomed = subscribe(slow.url("127.0.0.1"), false).await;
    subscribe(witness.url("127.0.0.1"), true).await;
    for i in 0..10 {
        app.task(ws, &format!("t{i}"), &[]).await;
    }
    let path = format!("/api/v1/webhooks/{}", id_of(&doomed));
    app.patch(&path, json!({"enabled": true})).await.ok(200);
    // Deleted while the second of ten events is in flight.
    crate::helpers::wait_until_every(
        "the backlog's delivery to be under way",
        Duration::from_secs(60),
        Duration::from_millis(2),
        || async {
            let got = slow.got().len();
            crate::helpers::seen(got >= 2, got)
        },
    )
    .await;
    match replica {
        None => {
            app.delete(&path).await.ok(204);
        }
        Some(b) => {
            let owner = lease_owner(app, id_of(&doomed)).await;
            if owner == Some(app.app_state.ctx.instance_id.uuid()) {
                b.call(Method::DELETE, &path, None).await.ok(204);
            } else {
                assert!(owner.is_some(), "a replica delivers it");
                app.delete(&path).await.ok(204);
            }
        }
    }
    let before = slow.got();
    assert!(
        before.len() < 10,
        "the delete came while the backlog was delivered: {before:?}"
    );
    // Until the post in flight is over (answered, or dropped by berth), and then until the other
    // subscription has taken two events made after the delete, the deleted one gets nothing more.
    crate::helpers::wait_until_every(
        "the post in flight to end",
        Duration::from_secs(60),
        Duration::from_millis(10),
        || async {
            let (finished, got) = (slow.finished(), slow.got().len());
            crate::helpers::seen(finished >= got, (finished, got))
        },
    )
    .await;
    for i in 0..2 {
        let t = app.task(ws, &format!("after{i}"), &[]).await;
        let seq = app
            .get(&format!("/api/v1/events?types=task.created&task_id={t}"))
            .await
            .ok(200)["events"][0]["seq"]
            .as_i64()
            .unwrap();
        crate::helpers::wait_until_every(
            "the other subscription to take it",
            Duration::from_secs(60),
            Duration::from_millis(10),
            || async {
                let seqs = witness.seqs();
                crate::helpers::seen(seqs.contains(&seq), seqs)
            },
        )
        .await;
    }
    assert_eq!(
        slow.got(),
        before,
        "nothing reached the deleted subscription's receiver after the 204"
    );
    assert_eq!(app.count("webhooks").await, 1);
}

async fn a_lagging_subscription_holds_no_retention_and_says_what_it_skipped(app: TestApp) {
    let app = respawn(
        app,
        &[
            ("BERTH_WEBHOOK_MAX_LAG_SECS", "2"),
            ("BERTH_EVENT_RETENTION_COUNT", "5"),
        ],
    )
    .await;
    let ws = app.workspace("lagging").await;
    let sink = Sink::start(500, "down").await;
    let w = app
        .post(
            "/api/v1/webhooks",
            json!({"url": sink.url("127.0.0.1"), "types": ["task."], "workspace_id": ws}),
        )
        .await
        .ok(201);
    let id = id_of(&w);
    assert_eq!(w["lagging"], false, "{w}");
    app.task(ws, "first", &[]).await;
    let within = Duration::from_secs(60);
    let every = Duration::from_millis(50);
    // Failing for more than the lag allowed: marked, with an event.
    let lagging = crate::helpers::wait_until_every("the subscription to lag", within, every, || async {
        let w = app.get(&format!("/api/v1/webhooks/{id}")).await.ok(200);
        crate::helpers::seen_json(w["lagging"] == true, w)
    })
    .await;
    let cursor = lagging["cursor"].as_i64().unwrap();
    let events = app.get("/api/v1/events?types=webhook.lagging").await.ok(200);
    let marked = &events["events"][0];
    assert_eq!(marked["data"]["webhook_id"], id.to_string(), "{events}");
    assert_eq!(marked["data"]["cursor"], cursor, "{events}");
    assert!(marked["data"]["behind_secs"].as_i64().unwrap() >= 2, "{events}");
    assert_eq!(marked["workspace_id"], ws.to_string());
    // Retention no longer keeps what it has yet to deliver.
    for i in 0..6 {
        app.task(ws, &format!("more{i}"), &[]).await;
    }
    let first_kept =
        crate::helpers::wait_until_every("retention to take undelivered events", within, every, || async {
            let page = app.get("/api/v1/events?limit=1").await.ok(200);
            let first = page["first_available_seq"].as_i64().unwrap();
            crate::helpers::seen(first > cursor + 1, first)
        })
        .await;
    // Back up: it resumes from the oldest event kept and says what it skipped.
    let seen_before = sink.seqs().len();
    sink.answer(204);
    let skipped = crate::helpers::wait_until_every("the skip to be reported", within, every, || async {
        let e = app.get("/api/v1/events?types=webhook.skipped").await.ok(200);
        let found = e["events"].as_array().unwrap().first().cloned();
        found.ok_or_else(|| e.to_string())
    })
    .await;
    assert_eq!(skipped["data"]["webhook_id"], id.to_string(), "{skipped}");
    assert_eq!(skipped["data"]["from_seq"], cursor + 1, "{skipped}");
    let to = skipped["data"]["to_seq"].as_i64().unwrap();
    assert!(to >= first_kept - 1, "{skipped} (first kept {first_kept})");
    let latest_task = app
        .get(&format!("/api/v1/events?types=task.&workspace_id={ws}&limit=1000"))
        .await
        .ok(200)["events"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()["seq"]
        .as_i64()
        .unwrap();
    crate::helpers::wait_until_every("the newest task event to be delivered", within, every, || async {
        let seqs = sink.seqs();
        crate::helpers::seen(seqs.contains(&latest_task), seqs)
    })
    .await;
    let after: Vec<i64> = sink.seqs().split_off(seen_before);
    assert!(
        after.iter().all(|s| *s > to),
        "nothing skipped was sent: {after:?} (skipped to {to})"
    );
    // Caught up, it holds retention again.
    crate::helpers::wait_until_every("the subscription to catch up", within, every, || async {
        let w = app.get(&format!("/api/v1/webhooks/{id}")).await.ok(200);
        crate::helpers::seen_json(w["lagging"] == false, w)
    })
    .await;
}
