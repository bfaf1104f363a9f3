//! Who did what: every event and every cleanup job records its actor, the token's `sub` and, for an
//! agent's session-bound token, its session; a job's run acts for whoever asked for it;
//! `GET /events?actor=` and the stream's `actor=` narrow to one actor; request logs carry it.
use std::time::Duration;

use reqwest::Method;
use serde_json::{Value, json};

use crate::both_backends;
use crate::helpers::{Sse, TestApp, id_of, mint, uuid, wait_job_settled};

both_backends!(
    events_and_jobs_record_who_did_it,
    events_narrow_to_one_actor_in_replay_and_live,
    request_logs_name_the_actor,
);

const WAIT: Duration = Duration::from_secs(30);

async fn all_events(app: &TestApp, query: &str) -> Vec<Value> {
    let page = app.get(&format!("/api/v1/events?limit=1000{query}")).await.ok(200);
    page["events"].as_array().unwrap().clone()
}

// I32: a person's archive, its job and every event of the job's run name that person; an agent's report
// names the agent's token and session.
async fn events_and_jobs_record_who_did_it(app: TestApp) {
    let alice = mint(&app.config, "alice", "admin", None, None);
    let ws = app.workspace("ws").await;
    let (repo, _) = app.repository(ws, "svc").await;
    let created = app
        .call(
            Method::POST,
            &format!("/api/v1/workspaces/{ws}/tasks"),
            Some(&alice),
            Some(json!({"title": "Who", "repositories": [{"repository_id": repo}]})),
        )
        .await
        .ok(201);
    let task = id_of(&created);
    let s = app.session(task, "worktree").await;
    let sid = uuid(&s["id"]);
    let env = uuid(&s["task_environment_id"]);

    let agent = mint(&app.config, "agent-7", "sessions:write tasks:read", None, Some(sid));
    app.call(
        Method::POST,
        &format!("/api/v1/environments/{env}/git-status/observations"),
        Some(&agent),
        Some(json!({
            "repository_id": repo,
            "kind": "live",
            "observed_at": chrono::Utc::now().to_rfc3339(),
            "session_id": sid,
        })),
    )
    .await
    .ok(201);

    let r = app
        .call(
            Method::POST,
            &format!("/api/v1/tasks/{task}/archive"),
            Some(&alice),
            Some(json!({})),
        )
        .await
        .ok(202);
    let job = wait_job_settled(&app, uuid(&r["cleanup_jobs"][0]["id"])).await;
    assert_eq!(job["state"], "succeeded");
    assert_eq!(job["actor"], json!({"sub": "alice", "session_id": null}), "{job}");

    let events = all_events(&app, &format!("&task_id={task}")).await;
    let of = |kind: &str| -> Vec<&Value> { events.iter().filter(|e| e["type"] == kind).collect() };
    assert_eq!(of("task.created")[0]["actor"]["sub"], "alice");
    assert_eq!(of("task.archived")[0]["actor"]["sub"], "alice");
    let session_created = of("session.created");
    assert!(
        session_created[0]["actor"]["sub"]
            .as_str()
            .is_some_and(|s| s != "alice"),
        "the admin token created the session: {}",
        session_created[0]
    );
    let report = of("git_status.updated");
    assert_eq!(
        report[0]["actor"],
        json!({"sub": "agent-7", "session_id": sid}),
        "an agent's report names its session"
    );
    let job_events = of("cleanup_job.updated");
    assert!(
        job_events.len() >= 3,
        "prepared, pending, running, succeeded: {job_events:?}"
    );
    for e in job_events {
        assert_eq!(e["actor"]["sub"], "alice", "the job's run acts for alice: {e}");
    }
}

// `actor=` narrows what the token sees to one actor's events, in replay and live, with no gap.
async fn events_narrow_to_one_actor_in_replay_and_live(app: TestApp) {
    let alice = mint(&app.config, "alice", "admin", None, None);
    let ws = app.workspace("ws").await;
    let task = app.task(ws, "Narrow", &[]).await;
    let patch = |token: Option<String>, title: &'static str| {
        let app = &app;
        async move {
            app.call(
                Method::PATCH,
                &format!("/api/v1/tasks/{task}"),
                token.as_deref().or(Some(&app.admin)),
                Some(json!({ "title": title })),
            )
            .await
            .ok(200);
        }
    };
    patch(Some(alice.clone()), "one").await;
    patch(None, "two").await;
    let mine = all_events(&app, "&actor=alice").await;
    assert_eq!(mine.len(), 1, "{mine:?}");
    assert_eq!(mine[0]["type"], "task.updated");
    let latest = app.get("/api/v1/events?limit=1").await.ok(200)["latest_seq"].clone();

    let mut sse = Sse::open(&app, &app.admin, &format!("?after={latest}&actor=alice"), None).await;
    assert_eq!(sse.next(WAIT).await.unwrap().event, "ready");
    patch(None, "three").await;
    patch(Some(alice.clone()), "four").await;
    let frame = sse.next(WAIT).await.expect("alice's event");
    let e: Value = serde_json::from_str(&frame.data).unwrap();
    assert_eq!(
        e["actor"]["sub"], "alice",
        "the other actor's event is not delivered: {e}"
    );
    assert_eq!(e["type"], "task.updated");
    assert_eq!(all_events(&app, "&actor=nobody").await.len(), 0);
}

// Request logs carry the actor: every line of an authenticated request's span names the token's `sub`.
async fn request_logs_name_the_actor(app: TestApp) {
    let dir = app.scratch.path().join("logged");
    let log = app.scratch.path().join("berth.log");
    let mut env = crate::faults::process_env(&app, &dir);
    env.insert("RUST_LOG".into(), "debug".into());
    env.insert("BERTH_LOG_FORMAT".into(), "json".into());
    let mut berth = crate::faults::start(&env, None, &log);
    let client = crate::helpers::client();
    crate::faults::wait_ready(&client, &mut berth).await;
    let token = mint(&app.config, "logger-sub", "admin", None, None);
    let r = client
        .post(format!("{}/api/v1/workspaces", berth.base))
        .bearer_auth(&token)
        .json(&json!({"name": "logged"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    drop(berth);
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.lines()
            .any(|l| l.contains(r#""actor":"logger-sub""#) && l.contains(r#""http.route":"/api/v1/workspaces""#)),
        "the request's log lines name its actor:\n{text}"
    );
}
