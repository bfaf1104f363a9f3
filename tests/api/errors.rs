//! Every class of bad input answers problem+json with a 4xx, never a 500 or an HTML page, and writes
//! nothing.
use reqwest::Method;
use serde_json::json;

use crate::both_backends;
use crate::helpers::TestApp;

both_backends!(
    bad_bodies_answer_problem_json_and_write_nothing,
    bad_paths_queries_and_routes,
    request_ids_are_echoed_or_made
);

async fn send_raw(app: &TestApp, method: Method, path: &str, body: &str) -> crate::helpers::Reply {
    let res = app
        .client
        .request(method, format!("{}{path}", app.base))
        .bearer_auth(&app.admin)
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    let status = res.status();
    let headers = res.headers().clone();
    crate::helpers::Reply {
        status,
        headers,
        text: res.text().await.unwrap(),
    }
}

async fn bad_bodies_answer_problem_json_and_write_nothing(app: TestApp) {
    let ws = app.workspace("ws").await;
    let tasks = format!("/api/v1/workspaces/{ws}/tasks");
    let events_before = app.count("events").await;

    send_raw(&app, Method::POST, &tasks, "{\"title\": ")
        .await
        .problem(400, "validation_failed");
    send_raw(&app, Method::POST, &tasks, "not json")
        .await
        .problem(400, "validation_failed");
    let unknown = send_raw(&app, Method::POST, &tasks, r#"{"title": "t", "titel": "typo"}"#)
        .await
        .problem(400, "validation_failed");
    assert!(unknown["detail"].as_str().unwrap().contains("titel"));
    send_raw(&app, Method::POST, &tasks, r#"{"title": 42}"#)
        .await
        .problem(422, "validation_failed");
    send_raw(&app, Method::POST, &tasks, r#"{"title": "t", "kind": "epic"}"#)
        .await
        .problem(422, "validation_failed");
    send_raw(
        &app,
        Method::POST,
        &tasks,
        r#"{"title": "t", "parent_task_id": "not-a-uuid"}"#,
    )
    .await
    .problem(422, "validation_failed");
    send_raw(&app, Method::POST, &tasks, r#"{}"#)
        .await
        .problem(422, "validation_failed");
    send_raw(&app, Method::POST, &tasks, r#"{"title": "   "}"#)
        .await
        .problem(422, "validation_failed");
    send_raw(&app, Method::POST, &tasks, r#"[1, 2]"#)
        .await
        .problem(422, "validation_failed");

    // Oversized: larger than the configured limit (256 KiB by default).
    let huge = format!(r#"{{"title": "t", "description": "{}"}}"#, "x".repeat(300 * 1024));
    send_raw(&app, Method::POST, &tasks, &huge)
        .await
        .problem(413, "validation_failed");

    send_raw(&app, Method::POST, "/api/v1/workspaces", r#"{"name": ""}"#)
        .await
        .problem(422, "validation_failed");
    send_raw(
        &app,
        Method::POST,
        "/api/v1/workspaces",
        r#"{"name": "ok", "extra": true}"#,
    )
    .await
    .problem(400, "validation_failed");

    assert_eq!(app.count("tasks").await, 0, "no bad request created a task");
    assert_eq!(app.count("workspaces").await, 1);
    assert_eq!(
        app.count("events").await,
        events_before,
        "no bad request wrote an event"
    );
}

async fn bad_paths_queries_and_routes(app: TestApp) {
    let ws = app.workspace("ws").await;
    app.get("/api/v1/tasks/not-a-uuid")
        .await
        .problem(400, "validation_failed");
    app.get("/api/v1/workspaces/123")
        .await
        .problem(400, "validation_failed");
    app.get(&format!("/api/v1/workspaces/{ws}/tasks?limit=zero"))
        .await
        .problem(400, "validation_failed");
    app.get(&format!("/api/v1/workspaces/{ws}/tasks?archived=maybe"))
        .await
        .problem(400, "validation_failed");
    app.get(&format!("/api/v1/workspaces/{ws}/tasks?cursor=%%%"))
        .await
        .problem(400, "invalid_cursor");
    let r = app.get("/api/v1/no-such-thing").await;
    r.problem(404, "not_found");
    assert!(!r.text.contains("<html"));
    app.get(&format!("/api/v1/tasks/{}", uuid::Uuid::now_v7()))
        .await
        .problem(404, "not_found");
    app.patch(
        &format!("/api/v1/tasks/{}", uuid::Uuid::now_v7()),
        json!({"title": "x"}),
    )
    .await
    .problem(404, "not_found");
}

async fn request_ids_are_echoed_or_made(app: TestApp) {
    let r = app
        .client
        .get(format!("{}/healthz", app.base))
        .header("X-Request-Id", "trace-me-123")
        .send()
        .await
        .unwrap();
    assert_eq!(r.headers()["x-request-id"], "trace-me-123");
    let r = app.client.get(format!("{}/healthz", app.base)).send().await.unwrap();
    let made = r.headers()["x-request-id"].to_str().unwrap().to_string();
    assert!(uuid::Uuid::parse_str(&made).is_ok());
    // Problems carry it too, so a user can quote it.
    let r = app.call(Method::GET, "/api/v1/workspaces", None, None).await;
    let body = r.problem(401, "unauthenticated");
    assert_eq!(body["request_id"].as_str(), r.header("x-request-id").as_deref());
}
