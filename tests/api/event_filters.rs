//! `workspace_id`, `task_id`, `session_id` and `types` on `GET /events` and `GET /events/stream`. They
//! narrow what the token sees and never widen it (I33); `seq` stays global, so paging and resuming from
//! the last seq seen lose nothing (I32).
use std::time::Duration;

use reqwest::Method;
use serde_json::{Value, json};
use uuid::Uuid;

use crate::both_backends;
use crate::helpers::{Sse, TestApp, id_of};

both_backends!(
    a_session_filtered_stream_sees_exactly_that_sessions_events_in_order,
    filtered_replay_pages_count_matching_events,
    a_filter_never_reveals_another_workspace,
    types_match_exactly_or_by_prefix,
);

const WAIT: Duration = Duration::from_secs(20);

/// The committed events that pass `keep`, oldest first, as seqs.
async fn committed(app: &TestApp, keep: impl Fn(&berth::entity::event::Model) -> bool) -> Vec<i64> {
    app.event_rows()
        .await
        .into_iter()
        .filter(|e| keep(e))
        .map(|e| e.seq)
        .collect()
}

/// Two sessions on one task, and a task elsewhere in the workspace.
async fn two_sessions(app: &TestApp) -> (Uuid, Uuid, Uuid, Uuid) {
    let f = app.task_with_repo("filters").await;
    let (ws, task) = (f.workspace, f.task);
    let a = id_of(&f.session("worktree").await);
    let b = id_of(&f.session("worktree").await);
    app.task(ws, "other task", &[]).await;
    (ws, task, a, b)
}

/// Frames up to `ready`, as events.
async fn until_ready(sse: &mut Sse) -> Vec<Value> {
    let mut out = Vec::new();
    loop {
        let f = sse.next(WAIT).await.expect("the stream stays open");
        if f.event == "ready" {
            return out;
        }
        assert_eq!(f.event, "message");
        out.push(serde_json::from_str(&f.data).unwrap());
    }
}

fn seq(e: &Value) -> i64 {
    e["seq"].as_i64().unwrap()
}

async fn a_session_filtered_stream_sees_exactly_that_sessions_events_in_order(app: TestApp) {
    let (ws, task, a, b) = two_sessions(&app).await;
    let mut sse = Sse::open(&app, &app.admin, &format!("?session_id={a}"), None).await;
    let mut got: Vec<i64> = until_ready(&mut sse).await.iter().map(seq).collect();
    // Live: events of the other session, the task and the workspace interleave with this one's.
    app.patch(&format!("/api/v1/tasks/{task}"), json!({"title": "renamed"}))
        .await
        .ok(200);
    app.delete(&format!("/api/v1/sessions/{b}")).await;
    app.task(ws, "a third", &[]).await;
    app.delete(&format!("/api/v1/sessions/{a}")).await;
    loop {
        let f = sse.next(WAIT).await.expect("the stream stays open");
        let e: Value = serde_json::from_str(&f.data).unwrap();
        assert_eq!(e["session_id"], a.to_string(), "{e}");
        got.push(seq(&e));
        if e["type"] == "session.deleted" {
            break;
        }
    }
    let want = committed(&app, |e| e.session_id == Some(a.into())).await;
    assert!(want.len() >= 2, "{want:?}");
    assert_eq!(got, want, "exactly the session's events, each once, in seq order");
    // The same through replay, and with the session's token: the filter agrees with the binding.
    let page = app
        .get(&format!("/api/v1/events?session_id={a}&limit=1000"))
        .await
        .ok(200);
    let replayed: Vec<i64> = page["events"].as_array().unwrap().iter().map(seq).collect();
    assert_eq!(replayed, want);
    // A session filter inside the other session's binding shows nothing of it.
    let bound_b = app.token_for("events:read", None, Some(b));
    let page = app
        .call(
            Method::GET,
            &format!("/api/v1/events?session_id={a}"),
            Some(&bound_b),
            None,
        )
        .await
        .ok(200);
    assert_eq!(page["events"], json!([]));
}

/// `limit` counts matching events; a client that resumes from the last seq it saw misses nothing.
async fn filtered_replay_pages_count_matching_events(app: TestApp) {
    let (ws, task, _, _) = two_sessions(&app).await;
    for i in 0..7 {
        app.task(ws, &format!("noise {i}"), &[]).await;
        app.patch(&format!("/api/v1/tasks/{task}"), json!({"title": format!("t{i}")}))
            .await
            .ok(200);
    }
    let want = committed(&app, |e| e.task_id == Some(task.into())).await;
    assert!(want.len() > 9, "{want:?}");
    let mut got = Vec::new();
    let mut after = 0;
    loop {
        let page = app
            .get(&format!("/api/v1/events?task_id={task}&after={after}&limit=3"))
            .await
            .ok(200);
        let events = page["events"].as_array().unwrap();
        assert!(events.len() <= 3);
        if events.is_empty() {
            break;
        }
        if got.len() + 3 <= want.len() {
            assert_eq!(events.len(), 3, "a page is full while matching events remain");
        }
        assert!(events.iter().all(|e| e["task_id"] == task.to_string()));
        after = seq(events.last().unwrap());
        got.extend(events.iter().map(seq));
    }
    assert_eq!(got, want);
    // The stream resumed from the middle of those pages delivers the rest, then live ones.
    let mid = want[want.len() / 2];
    let mut sse = Sse::open(&app, &app.admin, &format!("?task_id={task}&after={mid}"), None).await;
    let rest: Vec<i64> = until_ready(&mut sse).await.iter().map(seq).collect();
    assert_eq!(rest, want.iter().copied().filter(|s| *s > mid).collect::<Vec<_>>());
}

/// I33: filtering by another workspace's ids reveals nothing of it.
async fn a_filter_never_reveals_another_workspace(app: TestApp) {
    let (ws, task, a, _) = two_sessions(&app).await;
    let other = app.workspace("other").await;
    let elsewhere = app.task(other, "elsewhere", &[]).await;
    let limited = app.token_for("events:read", Some(vec![other]), None);
    for query in [
        format!("workspace_id={ws}"),
        format!("task_id={task}"),
        format!("session_id={a}"),
        format!("workspace_id={ws}&types=session."),
    ] {
        let page = app
            .call(Method::GET, &format!("/api/v1/events?{query}"), Some(&limited), None)
            .await
            .ok(200);
        assert_eq!(page["events"], json!([]), "{query}");
        let mut sse = Sse::open(&app, &limited, &format!("?{query}"), None).await;
        assert!(until_ready(&mut sse).await.is_empty(), "{query}");
    }
    // Its own workspace still shows, filtered.
    let page = app
        .call(
            Method::GET,
            &format!("/api/v1/events?task_id={elsewhere}"),
            Some(&limited),
            None,
        )
        .await
        .ok(200);
    let events = page["events"].as_array().unwrap();
    assert_eq!(events.len(), 1);
    assert_eq!(events[0]["type"], "task.created");
    // Malformed ids are refused, not ignored.
    app.get("/api/v1/events?workspace_id=nope")
        .await
        .problem(400, "validation_failed");
}

async fn types_match_exactly_or_by_prefix(app: TestApp) {
    let (_, _, a, _) = two_sessions(&app).await;
    let types_of = |page: &Value| -> Vec<String> {
        page["events"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["type"].as_str().unwrap().to_string())
            .collect()
    };
    let page = app.get("/api/v1/events?types=session.&limit=1000").await.ok(200);
    let seen = types_of(&page);
    assert!(seen.iter().filter(|t| *t == "session.created").count() == 2, "{seen:?}");
    assert!(seen.iter().all(|t| t.starts_with("session.")), "{seen:?}");
    let want = committed(&app, |e| e.event_type.as_str().starts_with("session.")).await;
    assert_eq!(
        page["events"].as_array().unwrap().iter().map(seq).collect::<Vec<_>>(),
        want
    );

    let page = app
        .get("/api/v1/events?types=task.created,repository.&limit=1000")
        .await
        .ok(200);
    let seen = types_of(&page);
    assert_eq!(seen.iter().filter(|t| *t == "task.created").count(), 2, "{seen:?}");
    assert!(seen.contains(&"repository.created".to_string()));
    assert!(
        seen.iter().all(|t| t == "task.created" || t.starts_with("repository.")),
        "{seen:?}"
    );
    // Combined with a session filter on the stream.
    let mut sse = Sse::open(
        &app,
        &app.admin,
        &format!("?session_id={a}&types=session.created"),
        None,
    )
    .await;
    let events = until_ready(&mut sse).await;
    assert_eq!(events.len(), 1);
    assert_eq!(events[0]["session_id"], a.to_string());
    // An entry matching no type is refused: a typo never reads as "nothing happened".
    for bad in ["sesion.", "session", "session.created,nope", "", "session.created,"] {
        let r = app.get(&format!("/api/v1/events?types={bad}")).await;
        let body = r.problem(400, "validation_failed");
        assert!(body["detail"].as_str().unwrap_or_default().contains("types"), "{body}");
        let r = app
            .call(
                Method::GET,
                &format!("/api/v1/events/stream?types={bad}"),
                Some(&app.admin),
                None,
            )
            .await;
        r.problem(400, "validation_failed");
    }
}
