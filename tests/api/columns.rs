//! A workspace's board. It starts with four columns; a task starts in the first, is moved by `PATCH`
//! (with `If-Match`), is listed by column, and moves on its own only where a column says so (a started
//! session: `Backlog` to `In progress`, never backwards). Columns are added, renamed, reordered and
//! removed (only an empty one, never the last), each change an event.
use serde_json::{Value, json};

use crate::both_backends;
use crate::helpers::{TestApp, id_of};

both_backends!(a_workspace_board_moves_tasks_through_its_columns);

fn names(list: &Value) -> Vec<String> {
    list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap().to_string())
        .collect()
}

async fn a_workspace_board_moves_tasks_through_its_columns(app: TestApp) {
    let ws = app.workspace("board").await;
    let (repo, _) = app.repository(ws, "svc").await;
    let cols = app.get(&format!("/api/v1/workspaces/{ws}/columns")).await.ok(200);
    assert_eq!(names(&cols), ["Backlog", "In progress", "In review", "Done"]);
    assert_eq!(cols["items"][1]["moves_in_on"], "session_started");
    assert_eq!(cols["items"][3]["moves_in_on"], "merged");
    let id = |i: usize| cols["items"][i]["id"].as_str().unwrap().to_string();
    let (backlog, progress, review) = (id(0), id(1), id(2));

    // A task starts in the first column; one may start elsewhere.
    let task = app.task(ws, "Work", &[repo]).await;
    let t = app.get(&format!("/api/v1/tasks/{task}")).await.ok(200);
    assert_eq!(t["column_id"], backlog.as_str());
    let reviewing = app
        .post(
            &format!("/api/v1/workspaces/{ws}/tasks"),
            json!({"title": "Reviewing", "repositories": [{"repository_id": repo}], "column_id": review}),
        )
        .await
        .ok(201);
    assert_eq!(reviewing["column_id"], review.as_str());
    app.post(
        &format!("/api/v1/workspaces/{ws}/tasks"),
        json!({"title": "Nowhere", "column_id": uuid::Uuid::now_v7()}),
    )
    .await
    .problem(422, "validation_failed");

    // A started session moves a Backlog task to In progress; a task further on stays where it is.
    app.started_agent(task, "test").await;
    let t = app.get(&format!("/api/v1/tasks/{task}")).await.ok(200);
    assert_eq!(t["column_id"], progress.as_str(), "moved on by the started session");
    let r_id = id_of(&reviewing);
    app.started_agent(r_id, "test").await;
    let r = app.get(&format!("/api/v1/tasks/{r_id}")).await.ok(200);
    assert_eq!(r["column_id"], review.as_str(), "never moved backwards");

    // Moved by hand, with If-Match; a stale version is refused.
    let current = app.get(&format!("/api/v1/tasks/{task}")).await;
    let etag = current.header("etag").unwrap();
    let moved = app
        .call_with(
            reqwest::Method::PATCH,
            &format!("/api/v1/tasks/{task}"),
            Some(&app.admin),
            Some(json!({"column_id": review})),
            &[("If-Match", &etag)],
        )
        .await
        .ok(200);
    assert_eq!(moved["column_id"], review.as_str());
    let stale = app
        .call_with(
            reqwest::Method::PATCH,
            &format!("/api/v1/tasks/{task}"),
            Some(&app.admin),
            Some(json!({"column_id": backlog})),
            &[("If-Match", &etag)],
        )
        .await;
    assert_eq!(stale.status.as_u16(), 412, "{}", stale.text);
    let events = app.get("/api/v1/events?types=task.updated").await.ok(200);
    let reasons: Vec<&Value> = events["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["task_id"] == task.to_string())
        .map(|e| &e["data"]["reason"])
        .collect();
    assert_eq!(reasons, [&json!("session_started"), &json!("requested")], "{events}");

    // Listed by column.
    let in_review = app
        .get(&format!("/api/v1/workspaces/{ws}/tasks?column={review}"))
        .await
        .ok(200);
    let mut listed: Vec<&str> = in_review["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["title"].as_str().unwrap())
        .collect();
    listed.sort();
    assert_eq!(listed, ["Reviewing", "Work"]);
    let in_backlog = app
        .get(&format!("/api/v1/workspaces/{ws}/tasks?column={backlog}"))
        .await
        .ok(200);
    assert_eq!(in_backlog["items"].as_array().unwrap().len(), 0);

    // Columns: add, rename, reorder, remove an empty one; a non-empty one or the last is refused.
    let qa = app
        .post(
            &format!("/api/v1/workspaces/{ws}/columns"),
            json!({"name": "QA", "position": 3}),
        )
        .await
        .ok(201);
    app.post(&format!("/api/v1/workspaces/{ws}/columns"), json!({"name": "QA"}))
        .await
        .problem(409, "conflict");
    app.post(&format!("/api/v1/workspaces/{ws}/columns"), json!({"name": "  "}))
        .await
        .problem(422, "validation_failed");
    let cols = app.get(&format!("/api/v1/workspaces/{ws}/columns")).await.ok(200);
    assert_eq!(names(&cols), ["Backlog", "In progress", "In review", "QA", "Done"]);
    let qa_id = id_of(&qa);
    app.call(
        reqwest::Method::PATCH,
        &format!("/api/v1/workspaces/{ws}/columns/{qa_id}"),
        Some(&app.admin),
        Some(json!({"name": "Testing", "position": 0, "moves_in_on": null})),
    )
    .await
    .ok(200);
    let cols = app.get(&format!("/api/v1/workspaces/{ws}/columns")).await.ok(200);
    assert_eq!(names(&cols), ["Testing", "Backlog", "In progress", "In review", "Done"]);
    let positions: Vec<i64> = cols["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["position"].as_i64().unwrap())
        .collect();
    assert_eq!(positions, [0, 1, 2, 3, 4]);
    app.call(
        reqwest::Method::DELETE,
        &format!("/api/v1/workspaces/{ws}/columns/{review}"),
        Some(&app.admin),
        None,
    )
    .await
    .problem(409, "conflict");
    let r = app
        .call(
            reqwest::Method::DELETE,
            &format!("/api/v1/workspaces/{ws}/columns/{qa_id}"),
            Some(&app.admin),
            None,
        )
        .await;
    assert_eq!(r.status.as_u16(), 204, "{}", r.text);
    let cols = app.get(&format!("/api/v1/workspaces/{ws}/columns")).await.ok(200);
    assert_eq!(
        names(&cols),
        ["Backlog", "In progress", "In review", "Done"],
        "nothing else moved"
    );
    let changes = app.get("/api/v1/events?types=workspace.columns_changed").await.ok(200);
    assert_eq!(changes["events"].as_array().unwrap().len(), 3, "{changes}");
    // Another workspace's column is not this one's.
    let other = app.workspace("other").await;
    app.call(
        reqwest::Method::PATCH,
        &format!("/api/v1/workspaces/{other}/columns/{backlog}"),
        Some(&app.admin),
        Some(json!({"name": "Mine"})),
    )
    .await
    .problem(404, "not_found");
}
