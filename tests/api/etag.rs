//! Optimistic concurrency: tasks, sessions and environments carry an `ETag` (their row version);
//! `PATCH /tasks/{id}` with a stale `If-Match` is `412 precondition_failed` and changes nothing.
use reqwest::Method;
use serde_json::json;
use uuid::Uuid;

use crate::both_backends;
use crate::helpers::{TestApp, id_of, seen, wait_until};

both_backends!(
    a_stale_if_match_is_412_and_changes_nothing,
    of_two_writers_that_read_one_version_one_wins,
    etags_follow_changes_and_only_changes,
    if_match_is_parsed_strictly,
);

async fn task_with_repo(app: &TestApp) -> Uuid {
    app.task_with_repo_in("ws", "api", "first").await.task
}

async fn patch_if(app: &TestApp, task: Uuid, if_match: &str, title: &str) -> crate::helpers::Reply {
    app.call_with(
        Method::PATCH,
        &format!("/api/v1/tasks/{task}"),
        Some(&app.admin),
        Some(json!({ "title": title })),
        &[("If-Match", if_match)],
    )
    .await
}

async fn a_stale_if_match_is_412_and_changes_nothing(app: TestApp) {
    let task = task_with_repo(&app).await;
    let read = app.get(&format!("/api/v1/tasks/{task}")).await;
    read.ok(200);
    let v1 = read.header("etag").expect("GET /tasks/{id} carries an ETag");

    // Tab A writes with the version it read: accepted, and the answer carries the new version.
    let a = patch_if(&app, task, &v1, "from tab A").await;
    assert_eq!(a.ok(200)["title"], "from tab A");
    let v2 = a.header("etag").expect("PATCH answers with the new ETag");
    assert_ne!(v1, v2);
    assert_eq!(
        app.get(&format!("/api/v1/tasks/{task}"))
            .await
            .header("etag")
            .as_deref(),
        Some(v2.as_str())
    );

    // Tab B still holds v1: refused, and nothing changes (no write, no event).
    let events_before = app.events().await.len();
    let b = patch_if(&app, task, &v1, "from tab B").await;
    let problem = b.problem(412, "precondition_failed");
    assert_eq!(problem["retryable"], false);
    let now = app.get(&format!("/api/v1/tasks/{task}")).await;
    assert_eq!(now.json()["title"], "from tab A");
    assert_eq!(now.header("etag").as_deref(), Some(v2.as_str()));
    assert_eq!(
        app.events().await.len(),
        events_before,
        "a refused PATCH writes no event"
    );

    // `*` and a list holding the current version pass; no header is an unconditional write.
    patch_if(&app, task, &format!("\"0\", {v2}"), "listed").await.ok(200);
    patch_if(&app, task, "*", "any").await.ok(200);
    app.patch(&format!("/api/v1/tasks/{task}"), json!({"title": "unconditional"}))
        .await
        .ok(200);
}

async fn of_two_writers_that_read_one_version_one_wins(app: TestApp) {
    let task = task_with_repo(&app).await;
    let v1 = app.get(&format!("/api/v1/tasks/{task}")).await.header("etag").unwrap();
    let writers: Vec<_> = (0..4)
        .map(|i| patch_if(&app, task, &v1, Box::leak(format!("writer {i}").into_boxed_str())))
        .collect();
    let replies = futures_util::future::join_all(writers).await;
    let won: Vec<_> = replies.iter().filter(|r| r.status.as_u16() == 200).collect();
    let refused = replies.iter().filter(|r| r.status.as_u16() == 412).count();
    assert_eq!(
        won.len(),
        1,
        "exactly one writer of one version wins: {:?}",
        replies.iter().map(|r| r.status).collect::<Vec<_>>()
    );
    assert_eq!(refused, 3);
    let title = app.get(&format!("/api/v1/tasks/{task}")).await.json()["title"].clone();
    assert_eq!(title, won[0].json()["title"], "the winner's write is the one kept");
}

async fn etags_follow_changes_and_only_changes(app: TestApp) {
    let task = task_with_repo(&app).await;
    let etag_of = |path: String| {
        let app = &app;
        async move {
            let r = app.get(&path).await;
            r.ok(200);
            r.header("etag").unwrap_or_else(|| panic!("{path} carries no ETag"))
        }
    };
    let task_v1 = etag_of(format!("/api/v1/tasks/{task}")).await;
    assert_eq!(
        task_v1,
        etag_of(format!("/api/v1/tasks/{task}")).await,
        "a read is not a change"
    );

    // A session on the task: activity, not a change of the task's own fields, so a tab editing the
    // title keeps a valid If-Match while agents come and go.
    let created = app
        .call(
            Method::POST,
            &format!("/api/v1/tasks/{task}/sessions"),
            Some(&app.admin),
            Some(json!({"executor_type": "worktree", "start": false})),
        )
        .await;
    let session = created.ok(201);
    let sid = id_of(&session);
    let created_tag = created.header("etag").expect("session create carries an ETag");
    assert_eq!(etag_of(format!("/api/v1/tasks/{task}")).await, task_v1);

    let s1 = etag_of(format!("/api/v1/sessions/{sid}")).await;
    assert_eq!(s1, created_tag);
    let env_path = format!("/api/v1/tasks/{task}/environment");
    let e1 = etag_of(env_path.clone()).await;
    let env_id = id_of(&app.get(&env_path).await.json());
    assert_eq!(
        e1,
        etag_of(format!("/api/v1/environments/{env_id}")).await,
        "one environment, one tag"
    );

    // The session changes (primary flag, then a direct state change as a runtime would make): new tags.
    app.set_session_state(sid, berth::entity::task_session::SessionState::Stopped, None)
        .await;
    let s2 = etag_of(format!("/api/v1/sessions/{sid}")).await;
    assert_ne!(s1, s2, "a state change is a new session version");

    // Archiving the task changes the task and (through cleanup) its environment's inventory.
    let archived = app.post(&format!("/api/v1/tasks/{task}/archive"), json!({})).await;
    archived.ok(202);
    assert_ne!(etag_of(format!("/api/v1/tasks/{task}")).await, task_v1);
    let within = std::time::Duration::from_secs(30);
    wait_until("the environment's tag to move after archive", within, || async {
        let e = etag_of(format!("/api/v1/environments/{env_id}")).await;
        seen(e != e1, e)
    })
    .await;
}

async fn if_match_is_parsed_strictly(app: TestApp) {
    let task = task_with_repo(&app).await;
    let v1 = app.get(&format!("/api/v1/tasks/{task}")).await.header("etag").unwrap();
    for bad in ["1", "\"1", ""] {
        patch_if(&app, task, bad, "bad").await.problem(400, "validation_failed");
    }
    // A weak tag never matches a strong comparison (RFC 9110), even with the current value.
    patch_if(&app, task, &format!("W/{v1}"), "weak")
        .await
        .problem(412, "precondition_failed");
    assert_eq!(app.get(&format!("/api/v1/tasks/{task}")).await.json()["title"], "first");
}
