//! `Idempotency-Key` makes a retry safe. The first answer is kept per (token subject, key) and replayed
//! with `Idempotent-Replayed: true`; a replay creates nothing (no row, no worktree) and a retried message
//! reaches the agent once; the same key with another body is 422; a retryable failure gives the key back;
//! two replicas sent the same key at once make one resource.
use reqwest::Method;
use serde_json::{Value, json};

use crate::both_backends;
use crate::helpers::{Reply, TestApp, id_of, mint, worktrees_of};
use crate::inbox::{wait_message, wait_replies};
use crate::replicas::Replica;

both_backends!(
    a_retried_task_create_returns_the_same_task,
    a_retried_session_create_makes_one_session_and_one_worktree,
    a_retried_message_reaches_the_agent_once,
    the_same_key_with_another_body_is_refused,
    subjects_use_keys_independently,
    malformed_keys_are_refused,
    a_retryable_failure_gives_the_key_back,
    two_replicas_sent_one_key_at_once_make_one_resource,
    deletes_and_actions_replay,
    a_repeat_waits_for_the_first_then_gives_up_and_a_stale_claim_is_taken_over,
);

async fn post_key(app: &TestApp, path: &str, body: Value, key: &str) -> Reply {
    app.call_with(
        Method::POST,
        path,
        Some(&app.admin),
        Some(body),
        &[("Idempotency-Key", key)],
    )
    .await
}

fn replayed(r: &Reply) -> bool {
    r.header("idempotent-replayed").as_deref() == Some("true")
}

async fn a_retried_task_create_returns_the_same_task(app: TestApp) {
    let ws = app.workspace("ws").await;
    let (repo, _) = app.repository(ws, "svc").await;
    let path = format!("/api/v1/workspaces/{ws}/tasks");
    let body = json!({"title": "Once", "repositories": [{"repository_id": repo}]});
    let first = post_key(&app, &path, body.clone(), "task-1").await;
    let created = first.ok(201);
    assert!(!replayed(&first));
    let tasks = app.count("tasks").await;
    let events = app.count("events").await;
    let again = post_key(&app, &path, body, "task-1").await;
    assert_eq!(again.ok(201), created, "the same task, as first answered");
    assert!(replayed(&again));
    assert_eq!(again.header("location"), first.header("location"));
    assert_eq!(again.header("content-type"), first.header("content-type"));
    assert_eq!(app.count("tasks").await, tasks, "a replay creates nothing");
    assert_eq!(app.count("events").await, events, "a replay emits nothing");
    // Without a key, a repeat is a new request.
    app.post(
        &path,
        json!({"title": "Once", "repositories": [{"repository_id": repo}]}),
    )
    .await
    .ok(201);
    assert_eq!(app.count("tasks").await, tasks + 1);
}

async fn a_retried_session_create_makes_one_session_and_one_worktree(app: TestApp) {
    let f = app.task_with_repo("Sessions").await;
    let (repo_path, task) = (f.repo_dir.clone(), f.task);
    let path = format!("/api/v1/tasks/{task}/sessions");
    let body = json!({"executor_type": "worktree", "start": false});
    let first = post_key(&app, &path, body.clone(), "session-1").await;
    let created = first.ok(201);
    let worktrees = worktrees_of(&repo_path);
    assert_eq!(
        worktrees.len(),
        2,
        "the main checkout and the task's worktree: {worktrees:?}"
    );
    for _ in 0..2 {
        let again = post_key(&app, &path, body.clone(), "session-1").await;
        assert!(replayed(&again));
        assert_eq!(id_of(&again.ok(201)), id_of(&created));
        assert_eq!(again.text, first.text, "the stored body, byte for byte");
    }
    assert_eq!(app.count("task_sessions").await, 1);
    assert_eq!(app.count("task_environments").await, 1);
    assert_eq!(worktrees_of(&repo_path), worktrees, "no second worktree");
}

async fn a_retried_message_reaches_the_agent_once(app: TestApp) {
    let f = app.task_with_repo("Inbox").await;
    let id = f.started_session("test").await.id;
    let path = format!("/api/v1/sessions/{id}/messages");
    let first = post_key(&app, &path, json!({"text": "hello"}), "msg-1").await;
    let m = first.ok(202);
    let again = post_key(&app, &path, json!({"text": "hello"}), "msg-1").await;
    assert!(replayed(&again));
    assert_eq!(again.ok(202)["id"], m["id"]);
    wait_message(&app, id, &m, "delivered").await;
    assert_eq!(wait_replies(&app, id, 1).await, ["hello"]);
    // A later message is answered after the first: had the retry been sent, its reply would come first.
    app.post(&path, json!({"text": "done"})).await.ok(202);
    assert_eq!(wait_replies(&app, id, 2).await, ["hello", "done"], "delivered once");
    assert_eq!(app.count("session_inbox").await, 2);
}

async fn the_same_key_with_another_body_is_refused(app: TestApp) {
    let ws = app.workspace("ws").await;
    let path = format!("/api/v1/workspaces/{ws}/tasks");
    let first = post_key(&app, &path, json!({"title": "One"}), "k").await.ok(201);
    let tasks = app.count("tasks").await;
    let other = post_key(&app, &path, json!({"title": "Two"}), "k").await;
    let p = other.problem(422, "idempotency_key_reused");
    assert_eq!(p["retryable"], false);
    // Another path (or method) with the same key is another request too.
    let elsewhere = app
        .call_with(
            Method::POST,
            "/api/v1/workspaces",
            Some(&app.admin),
            Some(json!({"title": "One"})),
            &[("Idempotency-Key", "k")],
        )
        .await;
    elsewhere.problem(422, "idempotency_key_reused");
    assert_eq!(app.count("tasks").await, tasks, "nothing changed");
    let task = app.get(&format!("/api/v1/tasks/{}", id_of(&first))).await.ok(200);
    assert_eq!(task["title"], "One");
    // The original still replays.
    assert!(replayed(&post_key(&app, &path, json!({"title": "One"}), "k").await));
}

async fn subjects_use_keys_independently(app: TestApp) {
    let ws = app.workspace("ws").await;
    let path = format!("/api/v1/workspaces/{ws}/tasks");
    let alice = mint(&app.config, "alice", "tasks:write tasks:read", None, None);
    let bob = mint(&app.config, "bob", "tasks:write tasks:read", None, None);
    let send = |token: String, title: &'static str| {
        let path = path.clone();
        let app = &app;
        async move {
            app.call_with(
                Method::POST,
                &path,
                Some(&token),
                Some(json!({"title": title})),
                &[("Idempotency-Key", "shared")],
            )
            .await
        }
    };
    let a = send(alice.clone(), "Alice's").await;
    let b = send(bob.clone(), "Bob's").await;
    assert!(!replayed(&a) && !replayed(&b));
    assert_ne!(id_of(&a.ok(201)), id_of(&b.ok(201)), "two subjects, two tasks");
    let a2 = send(alice, "Alice's").await;
    assert!(replayed(&a2));
    assert_eq!(id_of(&a2.ok(201)), id_of(&a.json()));
    // A token that fails verification stores nothing: the handler answers 401.
    let bad = app
        .call_with(
            Method::POST,
            &path,
            Some("not-a-token"),
            Some(json!({"title": "x"})),
            &[("Idempotency-Key", "bad")],
        )
        .await;
    bad.problem(401, "unauthenticated");
    // A refusal about the token is not kept either: the same key with a token that may write runs.
    let reader = mint(&app.config, "carol", "tasks:read", None, None);
    send(reader, "Carol's").await.problem(403, "insufficient_scope");
    assert_eq!(app.count("idempotency_keys").await, 2);
    let carol = mint(&app.config, "carol", "tasks:write tasks:read", None, None);
    let c = send(carol, "Carol's").await;
    assert!(!replayed(&c));
    c.ok(201);
}

async fn malformed_keys_are_refused(app: TestApp) {
    let ws = app.workspace("ws").await;
    let path = format!("/api/v1/workspaces/{ws}/tasks");
    let long = "k".repeat(256);
    for key in ["", "has space", long.as_str(), "tab\tkey"] {
        let r = post_key(&app, &path, json!({"title": "x"}), key).await;
        r.problem(400, "validation_failed");
    }
    let longest = "k".repeat(255);
    post_key(&app, &path, json!({"title": "x"}), &longest).await.ok(201);
    assert_eq!(app.count("tasks").await, 1);
}

/// A retryable answer changed nothing: the key is released, and a retry with it runs again.
async fn a_retryable_failure_gives_the_key_back(app: TestApp) {
    let f = app.task_with_repo("Retry").await;
    let (repo_path, task) = (f.repo_dir.clone(), f.task);
    // The source repository is away: preparing the workspace fails, retryably.
    let away = repo_path.with_file_name("svc-away");
    std::fs::rename(&repo_path, &away).unwrap();
    let path = format!("/api/v1/tasks/{task}/sessions");
    let body = json!({"executor_type": "worktree", "start": false});
    let failed = post_key(&app, &path, body.clone(), "retry-me").await;
    assert!(
        failed.status.as_u16() == 503 || failed.status.as_u16() == 409,
        "{} {}",
        failed.status,
        failed.text
    );
    assert_eq!(failed.json()["retryable"], true, "{}", failed.text);
    assert_eq!(app.count("idempotency_keys").await, 0, "the key was released");
    std::fs::rename(&away, &repo_path).unwrap();
    let retried = post_key(&app, &path, body.clone(), "retry-me").await;
    assert!(!replayed(&retried), "the retry ran again");
    let s = retried.ok(201);
    let again = post_key(&app, &path, body, "retry-me").await;
    assert!(replayed(&again));
    assert_eq!(id_of(&again.ok(201)), id_of(&s));
    assert_eq!(app.count("task_sessions").await, 1);
}

async fn two_replicas_sent_one_key_at_once_make_one_resource(app: TestApp) {
    let f = app.task_with_repo("Replicas").await;
    let (repo_path, task) = (f.repo_dir.clone(), f.task);
    let b = Replica::start(&app).await;
    let path = format!("/api/v1/tasks/{task}/sessions");
    let body = json!({"executor_type": "worktree", "start": false});
    let token = b.token.clone();
    let send = |base: String| {
        let (client, path, body, token) = (b.client.clone(), path.clone(), body.clone(), token.clone());
        async move {
            let res = client
                .post(format!("{base}{path}"))
                .bearer_auth(token)
                .header("Idempotency-Key", "both")
                .json(&body)
                .send()
                .await
                .unwrap();
            let status = res.status();
            let headers = res.headers().clone();
            let text = res.text().await.unwrap();
            Reply { status, headers, text }
        }
    };
    let (one, two) = tokio::join!(send(app.base.clone()), send(b.base.clone()));
    assert_eq!(
        (one.status.as_u16(), two.status.as_u16()),
        (201, 201),
        "{} / {}",
        one.text,
        two.text
    );
    assert_eq!(one.text, two.text, "both answers identical");
    assert_eq!(one.header("location"), two.header("location"));
    assert_eq!(replayed(&one) as u8 + replayed(&two) as u8, 1, "one ran, one replayed");
    assert_eq!(app.count("task_sessions").await, 1);
    assert_eq!(worktrees_of(&repo_path).len(), 2);
    b.stop().await;
}

/// DELETEs and actions are covered too: a retried delete answers what the first did, not 404.
async fn deletes_and_actions_replay(app: TestApp) {
    let f = app.task_with_repo("Actions").await;
    let task = f.task;
    let s = f.session("worktree").await;
    let id = id_of(&s);
    let del = |key: &'static str| {
        let app = &app;
        async move {
            app.call_with(
                Method::DELETE,
                &format!("/api/v1/sessions/{id}"),
                Some(&app.admin),
                None,
                &[("Idempotency-Key", key)],
            )
            .await
        }
    };
    let first = del("del").await;
    assert_eq!(first.status.as_u16(), 204, "{}", first.text);
    let again = del("del").await;
    assert_eq!(again.status.as_u16(), 204, "replayed, not 404: {}", again.text);
    assert!(replayed(&again));
    // A 404 is final too: kept and replayed.
    let missing = del("missing").await;
    missing.problem(404, "not_found");
    assert!(replayed(&del("missing").await));
    // An action: archive, twice with one key, is one archive (one cleanup job).
    let archive = format!("/api/v1/tasks/{task}/archive");
    let a1 = post_key(&app, &archive, json!({}), "arch").await;
    assert!(a1.status.is_success(), "{}", a1.text);
    let a2 = post_key(&app, &archive, json!({}), "arch").await;
    assert!(replayed(&a2));
    assert_eq!(a2.text, a1.text);
}

/// A repeat while the first request is still running waits a few seconds, then answers a retryable 409;
/// a claim left in progress past its bound (a crashed process's) is taken over and the request runs.
async fn a_repeat_waits_for_the_first_then_gives_up_and_a_stale_claim_is_taken_over(app: TestApp) {
    use berth::entity::idempotency_key as k;
    use sea_orm::{ActiveValue::Set, EntityTrait};
    let ws = app.workspace("ws").await;
    let path = format!("/api/v1/workspaces/{ws}/tasks");
    let body = json!({"title": "Held"});
    let bytes = serde_json::to_vec(&body).unwrap();
    let now = chrono::Utc::now();
    // As a first request that is still running (on this replica or another) holds it.
    k::Entity::insert(k::ActiveModel {
        subject: Set("admin".into()),
        key: Set("held".into()),
        fingerprint: Set(berth::api::idempotency::fingerprint("POST", &path, "", &bytes)),
        state: Set(k::KeyState::InProgress),
        response_status: Set(None),
        response_content_type: Set(None),
        response_body: Set(None),
        response_location: Set(None),
        response_etag: Set(None),
        claim_id: Set(uuid::Uuid::now_v7()),
        created_at: Set(now),
        expires_at: Set(now + chrono::Duration::hours(24)),
    })
    .exec(app.db())
    .await
    .unwrap();
    let started = std::time::Instant::now();
    let busy = post_key(&app, &path, body.clone(), "held").await;
    let p = busy.problem(409, "conflict");
    assert_eq!(p["retryable"], true);
    assert!(p["retry_after_ms"].as_u64().is_some(), "{p}");
    assert!(
        started.elapsed() >= std::time::Duration::from_secs(4),
        "it waited first"
    );
    assert_eq!(app.count("tasks").await, 0, "nothing ran");
    // The holder crashed: past the bound, the claim is taken over and the request runs once.
    k::Entity::update(k::ActiveModel {
        subject: Set("admin".into()),
        key: Set("held".into()),
        created_at: Set(now - chrono::Duration::seconds(61)),
        ..Default::default()
    })
    .exec(app.db())
    .await
    .unwrap();
    let ran = post_key(&app, &path, body.clone(), "held").await;
    assert!(!replayed(&ran));
    let task = ran.ok(201);
    let again = post_key(&app, &path, body, "held").await;
    assert!(replayed(&again));
    assert_eq!(id_of(&again.ok(201)), id_of(&task));
    assert_eq!(app.count("tasks").await, 1);
}
