//! Workspaces: create, list, get; each change writes its event in the same transaction (I32).
use serde_json::json;

use crate::both_backends;
use crate::helpers::{TestApp, id_of};

both_backends!(create_list_get_workspaces, duplicate_workspace_name_is_a_conflict);

async fn create_list_get_workspaces(app: TestApp) {
    let r = app.post("/api/v1/workspaces", json!({"name": "  team-a  "})).await;
    let created = r.ok(201);
    let id = id_of(&created);
    assert_eq!(created["name"], "team-a", "names are trimmed");
    assert_eq!(created["status"], "active");
    assert_eq!(r.header("location").unwrap(), format!("/api/v1/workspaces/{id}"));
    let got = app.get(&format!("/api/v1/workspaces/{id}")).await.ok(200);
    assert_eq!(got, created);
    let list = app.get("/api/v1/workspaces").await.ok(200);
    assert_eq!(list["items"].as_array().unwrap().len(), 1);
    assert!(list["next_cursor"].is_null());
    let events = app.events().await;
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].1, "workspace.created");
}

async fn duplicate_workspace_name_is_a_conflict(app: TestApp) {
    app.workspace("same").await;
    app.post("/api/v1/workspaces", json!({"name": "same"}))
        .await
        .problem(409, "conflict");
    assert_eq!(app.count("workspaces").await, 1);
    assert_eq!(app.count("events").await, 1, "the refused create wrote no event");
}
