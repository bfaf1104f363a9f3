//! Signed webhooks that never lose an event. Every delivery is checked by a
//! receiver that verifies it with the Standard Webhooks library from PyPI (tests/webhooks/receiver.py,
//! installed by .ci/webhooks), not with berth's own code. What must hold: every delivery verifies, also
//! across a secret's rotation; a receiver that fails for a while gets every event, once after
//! deduplication by `webhook-id`, in `seq` order, while another subscription is not held up; one that
//! fails past the horizon is disabled with its reason and an event, and resumes where it stopped when
//! enabled again; two replicas deliver each event once; a berth SIGKILLed mid-delivery is followed by one
//! that resumes without a gap.
use std::collections::{BTreeMap, HashSet};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use reqwest::Method;
use serde_json::{Value, json};
use uuid::Uuid;

use crate::both_backends;
use crate::helpers::{TestApp, id_of, seen, seen_json, wait_until, wait_until_every};

both_backends!(
    deliveries_are_signed_ordered_and_survive_a_rotation,
    a_failing_receiver_gets_every_event_once_in_order_and_holds_no_one_else_up,
    a_receiver_failing_past_the_horizon_is_disabled_with_an_event,
    two_replicas_deliver_each_event_once,
    a_berth_killed_mid_delivery_is_followed_without_a_gap,
    a_berth_stopped_gracefully_gives_its_subscriptions_back_at_once,
    bad_subscriptions_are_refused_and_secrets_never_shown_again,
);

const WAIT: Duration = Duration::from_secs(90);

/// Quick leases and timeouts; retries for an hour unless a test says otherwise; the receiver is on
/// loopback, which webhooks may reach only when it is listed.
pub(crate) const SETTINGS: [(&str, &str); 4] = [
    ("BERTH_WEBHOOK_ALLOWED_NETWORKS", "127.0.0.0/8,::1/128"),
    ("BERTH_WEBHOOK_LEASE_SECS", "2"),
    ("BERTH_WEBHOOK_TIMEOUT_SECS", "1"),
    ("BERTH_SWEEP_INTERVAL_MS", "300"),
];

/// The receiver: a Python process verifying with `standardwebhooks`, logging every request.
pub(crate) struct Receiver {
    child: Child,
    pub(crate) url: String,
    port: u16,
    secrets: PathBuf,
    _dir: tempfile::TempDir,
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Receiver {
    /// `None` (with a notice) when .ci/webhooks has not run, outside CI; with `CI` set that fails.
    pub(crate) fn start() -> Option<Receiver> {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/webhooks");
        let python = root.join(".venv/bin/python");
        if !python.exists() {
            let why = "standardwebhooks is not installed in tests/webhooks/.venv (run .ci/webhooks)";
            assert!(
                std::env::var_os("CI").is_none_or(|v| v.is_empty()),
                "CI is set but {why}"
            );
            use std::io::Write as _;
            let _ = writeln!(std::io::stderr(), "\nnote: the webhook tests did not run: {why}\n");
            return None;
        }
        let dir = tempfile::TempDir::new().unwrap();
        let secrets = dir.path().join("secrets");
        std::fs::write(&secrets, "").unwrap();
        let mut child = Command::new(python)
            .arg(root.join("receiver.py"))
            .arg("--secret-file")
            .arg(&secrets)
            .arg("--log")
            .arg(dir.path().join("log.jsonl"))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("the receiver starts");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let port: u16 = line.trim().parse().expect("the receiver prints its port");
        Some(Receiver {
            child,
            url: format!("http://127.0.0.1:{port}/hook"),
            port,
            secrets,
            _dir: dir,
        })
    }

    /// The secrets it verifies with (one per line).
    pub(crate) fn trust(&self, secrets: &[&str]) {
        std::fs::write(&self.secrets, secrets.join("\n")).unwrap();
    }

    pub(crate) async fn mode(&self, mode: &str, seconds: f64) {
        crate::helpers::client()
            .post(format!("http://127.0.0.1:{}/control/mode", self.port))
            .json(&json!({"mode": mode, "seconds": seconds}))
            .send()
            .await
            .unwrap()
            .error_for_status()
            .unwrap();
    }

    pub(crate) async fn log(&self) -> Vec<Value> {
        let r = crate::helpers::client()
            .get(format!("http://127.0.0.1:{}/control/log", self.port))
            .send()
            .await
            .unwrap();
        r.json::<Vec<Value>>().await.unwrap()
    }

    /// Deliveries it took (answered 2xx), first of each `webhook-id` only, in arrival order.
    pub(crate) async fn taken(&self) -> Vec<Value> {
        let mut seen = HashSet::new();
        self.log()
            .await
            .into_iter()
            .filter(|d| d["status"].as_u64().is_some_and(|s| (200..300).contains(&s)))
            .filter(|d| seen.insert(d["webhook_id"].as_str().unwrap_or_default().to_string()))
            .collect()
    }

    /// Waits until it took `n` events (after deduplication).
    pub(crate) async fn wait_taken(&self, n: usize) -> Vec<Value> {
        wait_until(&format!("the receiver to take {n} events"), WAIT, || async {
            let taken = self.taken().await;
            if taken.len() >= n {
                return Ok(taken);
            }
            Err(format!("took {}: {:#?}", taken.len(), self.log().await))
        })
        .await
    }

    /// Waits until its log holds `n` requests (probing every `every`).
    pub(crate) async fn wait_logged(&self, n: usize, what: &str, every: Duration) {
        wait_until_every(what, WAIT, every, || async {
            let logged = self.log().await.len();
            seen(logged >= n, logged)
        })
        .await;
    }
}

/// Every request verified with the receiver's library; nothing it refused.
fn all_verified(log: &[Value]) {
    for d in log {
        assert_eq!(d["verified"], true, "a delivery did not verify: {d}");
    }
}

/// The events a subscription to `task.` events of `ws` must deliver after `after`, as the replay has them.
async fn expected(app: &TestApp, ws: Uuid, after: i64) -> Vec<Value> {
    app.get(&format!(
        "/api/v1/events?after={after}&types=task.&workspace_id={ws}&limit=1000"
    ))
    .await
    .ok(200)["events"]
        .as_array()
        .unwrap()
        .clone()
}

/// The bodies the receiver took are exactly these events, in this order.
fn assert_exactly(taken: &[Value], events: &[Value]) {
    let got: Vec<i64> = taken.iter().map(|d| d["body"]["seq"].as_i64().unwrap()).collect();
    let want: Vec<i64> = events.iter().map(|e| e["seq"].as_i64().unwrap()).collect();
    assert_eq!(got, want, "every event once, in seq order");
    for (d, e) in taken.iter().zip(events) {
        assert_eq!(&d["body"], e, "the body is the event as the stream sends it");
    }
}

async fn subscribe(app: &TestApp, url: &str, ws: Uuid) -> Value {
    app.post(
        "/api/v1/webhooks",
        json!({"url": url, "types": ["task."], "workspace_id": ws, "description": "test"}),
    )
    .await
    .ok(201)
}

/// `n` task events in `ws` (each task created and renamed: two events).
async fn task_events(app: &TestApp, ws: Uuid, n: usize) {
    for i in 0..n / 2 {
        let t = app.task(ws, &format!("t{i}"), &[]).await;
        app.patch(&format!("/api/v1/tasks/{t}"), json!({"title": format!("t{i} renamed")}))
            .await
            .ok(200);
    }
}

async fn latest_seq(app: &TestApp) -> i64 {
    app.get("/api/v1/events?limit=1").await.ok(200)["latest_seq"]
        .as_i64()
        .unwrap()
}

async fn deliveries_are_signed_ordered_and_survive_a_rotation(app: TestApp) {
    let Some(rx) = Receiver::start() else { return };
    let app = respawn(app, &[]).await;
    let ws = app.workspace("hooks").await;
    let from = latest_seq(&app).await;
    let w = subscribe(&app, &rx.url, ws).await;
    let old = w["secret"].as_str().unwrap().to_string();
    assert!(old.starts_with("whsec_"), "{w}");
    rx.trust(&[&old]);
    task_events(&app, ws, 6).await;
    let taken = rx.wait_taken(6).await;
    assert_exactly(&taken, &expected(&app, ws, from).await);
    let first_id = taken[0]["webhook_id"].as_str().unwrap();
    assert!(first_id.starts_with("msg_"), "{first_id}");

    // Rotation: during the overlap a receiver holding either secret verifies.
    let id = id_of(&w);
    let rotated = app
        .post(&format!("/api/v1/webhooks/{id}/secret"), json!({}))
        .await
        .ok(200);
    let new = rotated["secret"].as_str().unwrap().to_string();
    assert_ne!(new, old);
    assert!(rotated["previous_secret_expires_at"].is_string(), "{rotated}");
    task_events(&app, ws, 2).await;
    rx.wait_taken(8).await;
    rx.trust(&[&new]);
    task_events(&app, ws, 2).await;
    let taken = rx.wait_taken(10).await;
    all_verified(&rx.log().await);
    assert_exactly(&taken, &expected(&app, ws, from).await);
    let signature = rx.log().await.last().unwrap()["signature"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(
        signature.split(' ').count(),
        2,
        "both secrets sign during the overlap: {signature}"
    );

    // What berth shows of it: the attempts, never the secret again.
    let got = app.get(&format!("/api/v1/webhooks/{id}")).await;
    assert!(!got.text.contains(&new) && !got.text.contains(&old), "{}", got.text);
    let listed = app.get(&format!("/api/v1/webhooks/{id}/deliveries")).await.ok(200);
    let items = listed["items"].as_array().unwrap();
    assert_eq!(items.len(), 10, "{listed}");
    assert!(
        items.iter().all(|d| d["succeeded"] == true && d["status_code"] == 204),
        "{listed}"
    );
    assert!(
        items[0]["event_seq"].as_i64() > items[9]["event_seq"].as_i64(),
        "newest first"
    );
}

/// The app `both_backends!` made, on the same backend, with the webhook settings and `extra`.
pub(crate) async fn respawn(app: TestApp, extra: &[(&str, &str)]) -> TestApp {
    let backend = app.backend;
    drop(app);
    let mut settings: BTreeMap<&str, &str> = SETTINGS.into_iter().collect();
    settings.extend(extra.iter().copied());
    let settings: Vec<(&str, &str)> = settings.into_iter().collect();
    TestApp::spawn_with(backend, &settings)
        .await
        .expect("the backend was available")
}

async fn a_failing_receiver_gets_every_event_once_in_order_and_holds_no_one_else_up(app: TestApp) {
    let (Some(down), Some(up)) = (Receiver::start(), Receiver::start()) else {
        return;
    };
    let app = respawn(app, &[]).await;
    let ws = app.workspace("hooks").await;
    let from = latest_seq(&app).await;
    let a = subscribe(&app, &down.url, ws).await;
    let b = subscribe(&app, &up.url, ws).await;
    down.trust(&[a["secret"].as_str().unwrap()]);
    up.trust(&[b["secret"].as_str().unwrap()]);
    down.mode("fail", 0.0).await;
    task_events(&app, ws, 6).await;
    // The healthy receiver gets everything while the other fails.
    let events = expected(&app, ws, from).await;
    assert_exactly(&up.wait_taken(6).await, &events);
    down.wait_logged(2, "a retry to reach the failing receiver", Duration::from_millis(50))
        .await;
    let w = app.get(&format!("/api/v1/webhooks/{}", id_of(&a))).await.ok(200);
    assert!(w["failed_attempts"].as_i64().unwrap() >= 1, "{w}");
    assert_eq!(w["enabled"], true);
    // Back up (and then failing by redirects for a while: a redirect is not followed, not success).
    down.mode("redirect", 0.0).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    down.mode("ok", 0.0).await;
    let taken = down.wait_taken(6).await;
    assert_exactly(&taken, &events);
    all_verified(&down.log().await);
    let attempts = app
        .get(&format!("/api/v1/webhooks/{}/deliveries", id_of(&a)))
        .await
        .ok(200);
    let items = attempts["items"].as_array().unwrap();
    assert!(
        items.iter().any(|d| d["status_code"] == 500 && d["succeeded"] == false),
        "{attempts}"
    );
    // Every attempt at one event carried one webhook-id.
    let first = &events[0]["seq"];
    let ids: HashSet<&str> = items
        .iter()
        .filter(|d| &d["event_seq"] == first)
        .map(|d| d["message_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids.len(), 1, "{attempts}");
}

async fn a_receiver_failing_past_the_horizon_is_disabled_with_an_event(app: TestApp) {
    let Some(rx) = Receiver::start() else { return };
    let app = respawn(app, &[("BERTH_WEBHOOK_RETRY_HORIZON_SECS", "2")]).await;
    let ws = app.workspace("hooks").await;
    let from = latest_seq(&app).await;
    let w = subscribe(&app, &rx.url, ws).await;
    let id = id_of(&w);
    rx.trust(&[w["secret"].as_str().unwrap()]);
    rx.mode("fail", 0.0).await;
    task_events(&app, ws, 2).await;
    let disabled = wait_until_every(
        "the webhook to be disabled",
        WAIT,
        Duration::from_millis(100),
        || async {
            let w = app.get(&format!("/api/v1/webhooks/{id}")).await.ok(200);
            seen_json(w["enabled"] == false, w)
        },
    )
    .await;
    let reason = disabled["disabled_reason"].as_str().unwrap();
    assert!(reason.contains("500"), "{reason}");
    let events = app
        .get(&format!("/api/v1/events?after={from}&types=webhook.disabled"))
        .await
        .ok(200);
    let e = &events["events"][0];
    assert_eq!(e["data"]["webhook_id"], id.to_string(), "{events}");
    assert_eq!(e["workspace_id"], ws.to_string());
    // Enabled again, it resumes at the event it failed.
    rx.mode("ok", 0.0).await;
    let seen = rx.log().await.len();
    app.patch(&format!("/api/v1/webhooks/{id}"), json!({"enabled": true}))
        .await
        .ok(200);
    let taken = rx.wait_taken(2).await;
    assert_exactly(&taken, &expected(&app, ws, from).await);
    assert!(rx.log().await.len() > seen);
}

async fn two_replicas_deliver_each_event_once(app: TestApp) {
    let Some(rx) = Receiver::start() else { return };
    let app = respawn(app, &[]).await;
    let b = crate::replicas::Replica::start(&app).await;
    let ws = app.workspace("hooks").await;
    let from = latest_seq(&app).await;
    let w = subscribe(&app, &rx.url, ws).await;
    rx.trust(&[w["secret"].as_str().unwrap()]);
    task_events(&app, ws, 10).await;
    let taken = rx.wait_taken(10).await;
    assert_exactly(&taken, &expected(&app, ws, from).await);
    // Nothing arrives twice: one replica delivers the subscription.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(rx.log().await.len(), 10, "{:#?}", rx.log().await);
    b.stop().await;
}

/// The environment of a berth process of this test's (`faults::process_env`), with this file's settings.
fn process_env(app: &TestApp, data: &Path) -> BTreeMap<String, String> {
    let mut env = crate::faults::process_env(app, data);
    for (k, v) in SETTINGS {
        env.insert(k.into(), v.into());
    }
    env
}

async fn a_berth_killed_mid_delivery_is_followed_without_a_gap(app: TestApp) {
    let Some(rx) = Receiver::start() else { return };
    let dir = tempfile::TempDir::new().unwrap();
    let data = dir.path().join("data");
    let log = dir.path().join("berth.log");
    let env = process_env(&app, &data);
    // The in-process server shares a PostgreSQL database: it must not deliver.
    app.stop_background();
    let client = crate::helpers::client();
    let token = app.admin.clone();
    let mut first = crate::faults::start(&env, None, &log);
    crate::faults::wait_ready(&client, &mut first).await;
    let call = |base: String, method: Method, path: &str, body: Value| {
        let path = path.to_string();
        let req = client
            .request(method, format!("{base}{path}"))
            .bearer_auth(&token)
            .json(&body);
        async move {
            let r = req.send().await.unwrap();
            assert!(r.status().is_success(), "{path}: {}", r.status());
            r.json::<Value>().await.unwrap_or(Value::Null)
        }
    };
    let ws = call(
        first.base.clone(),
        Method::POST,
        "/api/v1/workspaces",
        json!({"name": "killed"}),
    )
    .await;
    let ws = id_of(&ws);
    let w = call(
        first.base.clone(),
        Method::POST,
        "/api/v1/webhooks",
        json!({"url": rx.url, "types": ["task."], "workspace_id": ws}),
    )
    .await;
    rx.trust(&[w["secret"].as_str().unwrap()]);
    // Each delivery takes most of the timeout: a kill lands in the middle of one.
    rx.mode("slow", 0.6).await;
    for i in 0..8 {
        call(
            first.base.clone(),
            Method::POST,
            &format!("/api/v1/workspaces/{ws}/tasks"),
            json!({"title": format!("t{i}"), "repositories": []}),
        )
        .await;
    }
    rx.wait_logged(2, "a delivery", Duration::from_millis(20)).await;
    unsafe {
        libc::kill(first.child.id() as i32, libc::SIGKILL);
    }
    let _ = first.child.wait();
    let mut second = crate::faults::start(&env, None, &log);
    crate::faults::wait_ready(&client, &mut second).await;
    let taken = rx.wait_taken(8).await;
    all_verified(&rx.log().await);
    let events = call(
        second.base.clone(),
        Method::GET,
        &format!("/api/v1/events?types=task.&workspace_id={ws}&limit=1000"),
        Value::Null,
    )
    .await;
    let events: Vec<Value> = events["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["seq"].as_i64() > Some(w["cursor"].as_i64().unwrap()))
        .cloned()
        .collect();
    assert_eq!(events.len(), 8);
    assert_exactly(&taken, &events);
}

/// A berth stopped with SIGTERM gives up the leases of the subscriptions it delivered: the next process
/// delivers at once, though the leases are set to outlast the test (without the give-back, the second
/// process would wait ten minutes and the test fail at its deadline).
async fn a_berth_stopped_gracefully_gives_its_subscriptions_back_at_once(app: TestApp) {
    let Some(rx) = Receiver::start() else { return };
    let dir = tempfile::TempDir::new().unwrap();
    let data = dir.path().join("data");
    let log = dir.path().join("berth.log");
    let mut env = process_env(&app, &data);
    env.insert("BERTH_WEBHOOK_LEASE_SECS".into(), "600".into());
    app.stop_background();
    let client = crate::helpers::client();
    let token = app.admin.clone();
    let call = |base: String, path: &str, body: Value| {
        let req = client.post(format!("{base}{path}")).bearer_auth(&token).json(&body);
        let path = path.to_string();
        async move {
            let r = req.send().await.unwrap();
            assert!(r.status().is_success(), "{path}: {}", r.status());
            r.json::<Value>().await.unwrap()
        }
    };
    let mut first = crate::faults::start(&env, None, &log);
    crate::faults::wait_ready(&client, &mut first).await;
    let ws = id_of(&call(first.base.clone(), "/api/v1/workspaces", json!({"name": "stopped"})).await);
    let w = call(
        first.base.clone(),
        "/api/v1/webhooks",
        json!({"url": rx.url, "types": ["task."], "workspace_id": ws}),
    )
    .await;
    rx.trust(&[w["secret"].as_str().unwrap()]);
    let tasks = format!("/api/v1/workspaces/{ws}/tasks");
    call(
        first.base.clone(),
        &tasks,
        json!({"title": "before", "repositories": []}),
    )
    .await;
    rx.wait_taken(1).await;
    unsafe {
        libc::kill(first.child.id() as i32, libc::SIGTERM);
    }
    assert!(first.child.wait().unwrap().success(), "berth stopped cleanly");
    let mut second = crate::faults::start(&env, None, &log);
    crate::faults::wait_ready(&client, &mut second).await;
    call(
        second.base.clone(),
        &tasks,
        json!({"title": "after", "repositories": []}),
    )
    .await;
    let taken = rx.wait_taken(2).await;
    all_verified(&rx.log().await);
    assert_eq!(taken.len(), 2, "{taken:?}");
}

async fn bad_subscriptions_are_refused_and_secrets_never_shown_again(app: TestApp) {
    let Some(rx) = Receiver::start() else { return };
    let app = respawn(app, &[]).await;
    let ws = app.workspace("hooks").await;
    for (body, field) in [
        (json!({"url": "http://example.com/hook"}), "url"),
        (json!({"url": "ftp://127.0.0.1/hook"}), "url"),
        (json!({"url": "not a url"}), "url"),
        (json!({"url": rx.url, "types": ["no.such_type"]}), "types"),
        (json!({"url": rx.url, "types": []}), "types"),
    ] {
        let p = app
            .post("/api/v1/webhooks", body.clone())
            .await
            .problem(422, "validation_failed");
        assert_eq!(p["errors"][0]["field"], field, "{body}: {p}");
    }
    app.post(
        "/api/v1/webhooks",
        json!({"url": rx.url, "workspace_id": Uuid::now_v7()}),
    )
    .await
    .problem(404, "not_found");
    // Scopes: webhooks:write and events:read (or admin); a token limited to workspaces manages theirs only.
    let reader = app.token("tasks:read events:read");
    app.call(
        Method::POST,
        "/api/v1/webhooks",
        Some(&reader),
        Some(json!({"url": rx.url})),
    )
    .await
    .problem(403, "insufficient_scope");
    let limited = app.token_for("webhooks:write events:read", Some(vec![ws]), None);
    app.call(
        Method::POST,
        "/api/v1/webhooks",
        Some(&limited),
        Some(json!({"url": rx.url})),
    )
    .await
    .problem(403, "insufficient_scope");
    let mine = app
        .call(
            Method::POST,
            "/api/v1/webhooks",
            Some(&limited),
            Some(json!({"url": rx.url, "workspace_id": ws})),
        )
        .await
        .ok(201);
    let global = app
        .post("/api/v1/webhooks", json!({"url": rx.url, "enabled": false}))
        .await
        .ok(201);
    let listed = app
        .call(Method::GET, "/api/v1/webhooks", Some(&limited), None)
        .await
        .ok(200);
    assert_eq!(listed["items"].as_array().unwrap().len(), 1, "{listed}");
    app.call(
        Method::GET,
        &format!("/api/v1/webhooks/{}", id_of(&global)),
        Some(&limited),
        None,
    )
    .await
    .problem(404, "not_found");
    let all = app.get("/api/v1/webhooks").await;
    assert!(!all.text.contains("whsec_"), "{}", all.text);
    // A ping, signed like every delivery, recorded as an attempt.
    rx.trust(&[mine["secret"].as_str().unwrap()]);
    let ping = app
        .post(&format!("/api/v1/webhooks/{}/test", id_of(&mine)), json!({}))
        .await
        .ok(200);
    assert_eq!(ping["succeeded"], true, "{ping}");
    assert_eq!(ping["event_type"], "webhook.ping");
    let log = rx.log().await;
    all_verified(&log);
    assert_eq!(log.last().unwrap()["body"]["type"], "webhook.ping");
    // An answer that is too large, or too slow, is a failed attempt, not a hang.
    rx.mode("slow", 3.0).await;
    let slow = app
        .post(&format!("/api/v1/webhooks/{}/test", id_of(&mine)), json!({}))
        .await
        .ok(200);
    assert_eq!(slow["succeeded"], false, "{slow}");
    assert!(
        slow["error"].as_str().unwrap().contains("BERTH_WEBHOOK_TIMEOUT_SECS"),
        "{slow}"
    );
    rx.mode("huge", 0.0).await;
    let huge = app
        .post(&format!("/api/v1/webhooks/{}/test", id_of(&mine)), json!({}))
        .await
        .ok(200);
    assert_eq!(huge["succeeded"], true, "a 2xx with a large body is taken: {huge}");
    // Deleted: gone, with its attempts.
    app.delete(&format!("/api/v1/webhooks/{}", id_of(&mine))).await.ok(204);
    app.get(&format!("/api/v1/webhooks/{}/deliveries", id_of(&mine)))
        .await
        .problem(404, "not_found");
}
