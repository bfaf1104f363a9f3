//! Keyset pagination: under concurrent inserts a page never skips or repeats a row that existed when
//! paging began.
use std::collections::HashSet;

use serde_json::json;

use crate::both_backends;
use crate::helpers::{TestApp, id_of};

both_backends!(
    pages_never_skip_or_repeat_under_concurrent_inserts,
    cursor_and_limit_are_validated
);

async fn pages_never_skip_or_repeat_under_concurrent_inserts(app: TestApp) {
    let ws = app.workspace("ws").await;
    let url = format!("/api/v1/workspaces/{ws}/tasks");
    let mut existing = HashSet::new();
    for i in 0..25 {
        existing.insert(id_of(&app.post(&url, json!({"title": format!("t{i}")})).await.ok(201)).to_string());
    }
    // A writer inserts while a reader pages through with a small page size.
    let writer = {
        let client = app.client.clone();
        let (base, admin, url) = (app.base.clone(), app.admin.clone(), url.clone());
        tokio::spawn(async move {
            for i in 0..25 {
                let r = client
                    .post(format!("{base}{url}"))
                    .bearer_auth(&admin)
                    .json(&json!({"title": format!("new{i}")}))
                    .send()
                    .await
                    .unwrap();
                assert_eq!(r.status(), 201);
            }
        })
    };
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    let mut pages = 0;
    loop {
        let q = match &cursor {
            Some(c) => format!("{url}?limit=4&cursor={c}"),
            None => format!("{url}?limit=4"),
        };
        let page = app.get(&q).await.ok(200);
        let items = page["items"].as_array().unwrap();
        assert!(items.len() <= 4);
        seen.extend(items.iter().map(|t| t["id"].as_str().unwrap().to_string()));
        pages += 1;
        match page["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_string()),
            None => break,
        }
        assert!(pages < 100, "paging does not end");
    }
    writer.await.unwrap();
    let unique: HashSet<&String> = seen.iter().collect();
    assert_eq!(unique.len(), seen.len(), "a row was repeated");
    for id in &existing {
        assert!(unique.contains(id), "row {id} that existed before paging was skipped");
    }
    // Newest first, strictly.
    let ids: Vec<uuid::Uuid> = seen.iter().map(|s| s.parse().unwrap()).collect();
    assert!(ids.windows(2).all(|w| w[0] > w[1]));
}

async fn cursor_and_limit_are_validated(app: TestApp) {
    let ws = app.workspace("ws").await;
    let url = format!("/api/v1/workspaces/{ws}/tasks");
    for i in 0..3 {
        app.post(&url, json!({"title": format!("t{i}")})).await.ok(201);
    }
    app.get(&format!("{url}?cursor=garbage"))
        .await
        .problem(400, "invalid_cursor");
    app.get(&format!("{url}?limit=0"))
        .await
        .problem(400, "validation_failed");
    app.get(&format!("{url}?limit=501"))
        .await
        .problem(400, "validation_failed");
    let first = app.get(&format!("{url}?limit=2")).await.ok(200);
    let cursor = first["next_cursor"].as_str().unwrap();
    let second = app.get(&format!("{url}?limit=2&cursor={cursor}")).await.ok(200);
    assert_eq!(second["items"].as_array().unwrap().len(), 1);
    assert!(second["next_cursor"].is_null());
    // The same cursor works for workspaces and repositories lists too (opaque, keyset on id).
    let ws_page = app.get("/api/v1/workspaces?limit=1").await.ok(200);
    assert!(ws_page["next_cursor"].is_null());
}
