//! The follow point. Every list body carries `latest_seq` and every successful GET under `/api/v1` carries
//! `X-Berth-Seq`: every event with a seq up to it is reflected in the response, so a client lists, then
//! streams from there, and misses nothing (I32).
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde_json::{Value, json};
use uuid::Uuid;

use crate::both_backends;
use crate::helpers::{Sse, TestApp, id_of, seen, wait_until_every};

both_backends!(
    every_get_and_list_carries_the_follow_point,
    list_then_follow_under_a_concurrent_writer_misses_nothing,
);

const WAIT: Duration = Duration::from_secs(30);

fn seq_header(r: &crate::helpers::Reply) -> i64 {
    r.header("x-berth-seq")
        .unwrap_or_else(|| panic!("no X-Berth-Seq: {}", r.text))
        .parse()
        .unwrap()
}

async fn every_get_and_list_carries_the_follow_point(app: TestApp) {
    let f = app.task_with_repo("follow").await;
    let (ws, repo, task) = (f.workspace, f.repository, f.task);
    let session = f.session("worktree").await;
    let sid = id_of(&session);
    let env = session["task_environment_id"].as_str().unwrap().to_string();
    let newest = app.events().await.last().unwrap().0;
    // The point follows commits (the tailer publishes them): wait for it, with a deadline.
    wait_until_every(
        &format!("the follow point at {newest}"),
        WAIT,
        Duration::from_millis(20),
        || async {
            let seq = seq_header(&app.get("/api/v1/workspaces").await);
            seen(seq >= newest, seq)
        },
    )
    .await;
    let lists = [
        "/api/v1/workspaces".to_string(),
        format!("/api/v1/workspaces/{ws}/repositories"),
        format!("/api/v1/workspaces/{ws}/tasks"),
        format!("/api/v1/tasks/{task}/sessions"),
        format!("/api/v1/sessions/{sid}/messages"),
        format!("/api/v1/environments/{env}/git-status"),
        format!("/api/v1/sessions/{sid}/git-status"),
        "/api/v1/cleanup-jobs".to_string(),
        "/api/v1/agent-profiles".to_string(),
    ];
    for path in &lists {
        let r = app.get(path).await;
        let body = r.ok(200);
        assert!(body["items"].is_array(), "{path}: {body}");
        let point = seq_header(&r);
        assert_eq!(body["latest_seq"].as_i64(), Some(point), "{path}: {body}");
        assert!(
            point >= newest && point <= app.events().await.last().unwrap().0,
            "{path}"
        );
    }
    for path in [
        format!("/api/v1/workspaces/{ws}"),
        format!("/api/v1/tasks/{task}"),
        format!("/api/v1/sessions/{sid}"),
        format!("/api/v1/environments/{env}"),
        format!("/api/v1/repositories/{repo}"),
        "/api/v1/events".to_string(),
    ] {
        let r = app.get(&path).await;
        r.ok(200);
        assert!(seq_header(&r) >= newest, "{path}");
    }
    // Only successful GETs under /api/v1.
    let missing = app.get(&format!("/api/v1/tasks/{}", Uuid::new_v4())).await;
    missing.problem(404, "not_found");
    assert!(missing.header("x-berth-seq").is_none());
    let created = app
        .post(&format!("/api/v1/workspaces/{ws}/tasks"), json!({"title": "post"}))
        .await;
    created.ok(201);
    assert!(created.header("x-berth-seq").is_none());
    assert!(app.get("/healthz").await.header("x-berth-seq").is_none());
}

/// A writer keeps creating tasks while the client lists them, then follows the stream from the list's
/// `latest_seq`: every task is in the list or arrives as an event (none missing), every task whose
/// event is at most `latest_seq` is in the list (the point is a lower bound), and no event at or
/// below `latest_seq` arrives.
async fn list_then_follow_under_a_concurrent_writer_misses_nothing(app: TestApp) {
    let ws = app.workspace("ws").await;
    let total = 60;
    let writer = {
        let (client, base, admin) = (app.client.clone(), app.base.clone(), app.admin.clone());
        tokio::spawn(async move {
            let mut ids = Vec::new();
            for i in 0..total {
                let r = client
                    .post(format!("{base}/api/v1/workspaces/{ws}/tasks"))
                    .bearer_auth(&admin)
                    .json(&json!({"title": format!("w{i}")}))
                    .send()
                    .await
                    .unwrap();
                assert_eq!(r.status(), 201);
                ids.push(id_of(&r.json::<Value>().await.unwrap()));
            }
            ids
        })
    };
    let mut rounds = Vec::new();
    for _ in 0..4 {
        let r = app.get(&format!("/api/v1/workspaces/{ws}/tasks?limit=500")).await;
        let body = r.ok(200);
        let latest = body["latest_seq"].as_i64().unwrap();
        assert_eq!(seq_header(&r), latest);
        let listed: BTreeSet<Uuid> = body["items"].as_array().unwrap().iter().map(id_of).collect();
        let sse = Sse::open(
            &app,
            &app.admin,
            &format!("?after={latest}&workspace_id={ws}&types=task.created"),
            None,
        )
        .await;
        rounds.push((latest, listed, sse));
    }
    let created: BTreeSet<Uuid> = writer.await.unwrap().into_iter().collect();
    assert_eq!(created.len(), total);
    // Where each task's event is.
    let created_at: BTreeMap<Uuid, i64> = app
        .events()
        .await
        .into_iter()
        .filter(|e| e.1 == "task.created")
        .map(|e| (e.2.unwrap(), e.0))
        .collect();
    for (latest, listed, mut sse) in rounds {
        for (task, seq) in &created_at {
            if *seq <= latest {
                assert!(
                    listed.contains(task),
                    "task {task} (seq {seq}) missing from a list at {latest}"
                );
            }
        }
        let mut streamed = BTreeSet::new();
        while !created.iter().all(|t| listed.contains(t) || streamed.contains(t)) {
            let f = sse.next(WAIT).await.expect("the stream stays open");
            if f.event != "message" {
                assert_eq!(f.event, "ready");
                continue;
            }
            let e: Value = serde_json::from_str(&f.data).unwrap();
            assert!(
                f.id.unwrap() > latest,
                "an event at or before latest_seq {latest} arrived"
            );
            let task: Uuid = e["task_id"].as_str().unwrap().parse().unwrap();
            assert!(streamed.insert(task), "a duplicate event");
        }
        assert!(
            listed
                .union(&streamed)
                .copied()
                .collect::<BTreeSet<_>>()
                .is_superset(&created)
        );
    }
    // And the last list, taken after the writer, has everything.
    let all = app
        .get(&format!("/api/v1/workspaces/{ws}/tasks?limit=500"))
        .await
        .ok(200);
    assert_eq!(all["items"].as_array().unwrap().len(), total);
}
