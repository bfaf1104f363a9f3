//! Tasks: creation over one or several repository slots, subtasks, reads and updates.
use serde_json::json;
use uuid::Uuid;

use crate::both_backends;
use crate::helpers::{TestApp, id_of};

both_backends!(
    create_task_over_two_repositories,
    task_refusals_create_nothing,
    inherit_parent_subtask_uses_the_parents_slots,
    patch_updates_and_writes_an_event,
    list_filters_by_parent,
);

async fn create_task_over_two_repositories(app: TestApp) {
    let ws = app.workspace("ws").await;
    let (api, _) = app.repository(ws, "api").await;
    let (web, _) = app.repository(ws, "web").await;
    let r = app
        .post(
            &format!("/api/v1/workspaces/{ws}/tasks"),
            json!({
                "title": "Add login",
                "description": "both sides",
                "repositories": [
                    {"repository_id": api, "branch": "feature/login"},
                    {"repository_id": web, "base_branch": "main"}
                ]
            }),
        )
        .await;
    let task = r.ok(201);
    let id = id_of(&task);
    assert_eq!(r.header("location").unwrap(), format!("/api/v1/tasks/{id}"));
    assert_eq!(task["workspace_id"], ws.to_string());
    assert_eq!(task["kind"], "standard");
    assert_eq!(task["workspace_mode"], "new_workspace");
    assert_eq!(task["session_count"], 0);
    assert!(task["primary_session_id"].is_null());
    assert!(task["archived_at"].is_null());
    let repos = task["repositories"].as_array().unwrap();
    assert_eq!(repos.len(), 2);
    assert_eq!(repos[0]["repository_id"], api.to_string());
    assert_eq!(repos[0]["branch"], "feature/login");
    assert_eq!(repos[0]["branch_slug"], "feature/login");
    assert_eq!(repos[1]["repository_id"], web.to_string());
    assert_eq!(repos[1]["base_branch"], "main");
    assert_eq!(repos[1]["position"], 1);
    assert_eq!(app.get(&format!("/api/v1/tasks/{id}")).await.ok(200), task);

    // The same repository twice is fine on different branches (two slots).
    app.post(
        &format!("/api/v1/workspaces/{ws}/tasks"),
        json!({"title": "two slots", "kind": "quick_chat", "repositories": [{"repository_id": api, "branch": "a"}, {"repository_id": api, "branch": "b"}]}),
    )
    .await
    .ok(201);
    // Events: in commit order, strictly increasing.
    let events = app.events().await;
    let seqs: Vec<i64> = events.iter().map(|e| e.0).collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{seqs:?}");
    assert_eq!(events.iter().filter(|e| e.1 == "task.created").count(), 2);
    assert!(events.iter().any(|e| e.1 == "task.created" && e.2 == Some(id)));
}

async fn task_refusals_create_nothing(app: TestApp) {
    let ws = app.workspace("ws").await;
    let other_ws = app.workspace("other").await;
    let (repo, _) = app.repository(ws, "mine").await;
    let (foreign, _) = app.repository(other_ws, "foreign").await;
    let url = format!("/api/v1/workspaces/{ws}/tasks");
    let before = app.count("events").await;
    let cases = vec![
        (
            "repository of another workspace",
            json!({"title": "t", "repositories": [{"repository_id": foreign}]}),
        ),
        (
            "unknown repository",
            json!({"title": "t", "repositories": [{"repository_id": Uuid::now_v7()}]}),
        ),
        (
            "duplicate slot",
            json!({"title": "t", "repositories": [{"repository_id": repo}, {"repository_id": repo}]}),
        ),
        (
            "bad branch",
            json!({"title": "t", "repositories": [{"repository_id": repo, "branch": "bad branch"}]}),
        ),
        (
            "bad base branch",
            json!({"title": "t", "repositories": [{"repository_id": repo, "base_branch": "x~1"}]}),
        ),
        (
            "inherit without parent",
            json!({"title": "t", "workspace_mode": "inherit_parent"}),
        ),
        (
            "unknown parent",
            json!({"title": "t", "parent_task_id": Uuid::now_v7()}),
        ),
        ("title too long", json!({"title": "x".repeat(501)})),
    ];
    for (case, body) in cases {
        let r = app.post(&url, body).await;
        assert_eq!(r.status.as_u16(), 422, "{case}: {}", r.text);
        r.problem(422, "validation_failed");
    }
    assert_eq!(app.count("tasks").await, 0);
    assert_eq!(app.count("task_repositories").await, 0);
    assert_eq!(app.count("events").await, before);
}

async fn inherit_parent_subtask_uses_the_parents_slots(app: TestApp) {
    let ws = app.workspace("ws").await;
    let (repo, _) = app.repository(ws, "r").await;
    let parent = app
        .post(
            &format!("/api/v1/workspaces/{ws}/tasks"),
            json!({"title": "parent", "repositories": [{"repository_id": repo, "branch": "p"}]}),
        )
        .await
        .ok(201);
    let pid = id_of(&parent);
    let child = app
        .post(
            &format!("/api/v1/workspaces/{ws}/tasks"),
            json!({"title": "child", "parent_task_id": pid, "workspace_mode": "inherit_parent"}),
        )
        .await
        .ok(201);
    assert_eq!(child["parent_task_id"], pid.to_string());
    assert_eq!(child["workspace_mode"], "inherit_parent");
    assert_eq!(child["repositories"], parent["repositories"]);
    // An inherit_parent subtask may not ask for repositories of its own.
    app.post(
        &format!("/api/v1/workspaces/{ws}/tasks"),
        json!({"title": "c2", "parent_task_id": pid, "workspace_mode": "inherit_parent", "repositories": [{"repository_id": repo}]}),
    )
    .await
    .problem(422, "validation_failed");
    // A parent from another workspace is not a parent.
    let ws2 = app.workspace("ws2").await;
    app.post(
        &format!("/api/v1/workspaces/{ws2}/tasks"),
        json!({"title": "c3", "parent_task_id": pid}),
    )
    .await
    .problem(422, "validation_failed");
}

async fn patch_updates_and_writes_an_event(app: TestApp) {
    let ws = app.workspace("ws").await;
    let task = app
        .post(&format!("/api/v1/workspaces/{ws}/tasks"), json!({"title": "old"}))
        .await
        .ok(201);
    let id = id_of(&task);
    let updated = app
        .patch(
            &format!("/api/v1/tasks/{id}"),
            json!({"title": "new", "description": "d"}),
        )
        .await
        .ok(200);
    assert_eq!(updated["title"], "new");
    assert_eq!(updated["description"], "d");
    assert_eq!(updated["created_at"], task["created_at"]);
    assert_ne!(updated["updated_at"], task["updated_at"]);
    assert_eq!(app.get(&format!("/api/v1/tasks/{id}")).await.ok(200), updated);
    let count = app.events().await.iter().filter(|e| e.1 == "task.updated").count();
    assert_eq!(count, 1);
    // A no-op patch changes nothing and writes no event.
    app.patch(&format!("/api/v1/tasks/{id}"), json!({"title": "new"}))
        .await
        .ok(200);
    assert_eq!(app.events().await.iter().filter(|e| e.1 == "task.updated").count(), 1);
    app.patch(&format!("/api/v1/tasks/{id}"), json!({"title": ""}))
        .await
        .problem(422, "validation_failed");
    app.patch(&format!("/api/v1/tasks/{id}"), json!({"kind": "quick_chat"}))
        .await
        .problem(400, "validation_failed");
    assert_eq!(app.get(&format!("/api/v1/tasks/{id}")).await.ok(200)["title"], "new");
}

async fn list_filters_by_parent(app: TestApp) {
    let ws = app.workspace("ws").await;
    let parent = id_of(
        &app.post(&format!("/api/v1/workspaces/{ws}/tasks"), json!({"title": "p"}))
            .await
            .ok(201),
    );
    let child = id_of(
        &app.post(
            &format!("/api/v1/workspaces/{ws}/tasks"),
            json!({"title": "c", "parent_task_id": parent}),
        )
        .await
        .ok(201),
    );
    let all = app.get(&format!("/api/v1/workspaces/{ws}/tasks")).await.ok(200);
    let ids: Vec<String> = all["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(ids, vec![child.to_string(), parent.to_string()], "newest first");
    let kids = app
        .get(&format!("/api/v1/workspaces/{ws}/tasks?parent_task_id={parent}"))
        .await
        .ok(200);
    assert_eq!(kids["items"].as_array().unwrap().len(), 1);
    assert_eq!(kids["items"][0]["id"], child.to_string());
    let archived = app
        .get(&format!("/api/v1/workspaces/{ws}/tasks?archived=true"))
        .await
        .ok(200);
    assert!(archived["items"].as_array().unwrap().is_empty());
}
