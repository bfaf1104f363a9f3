//! Operations endpoints are public and honest.
use reqwest::Method;

use crate::both_backends;
use crate::helpers::TestApp;

both_backends!(health_readiness_and_metrics, storage_is_configured_for_concurrency);

/// SQLite runs with WAL, foreign keys and a busy timeout, on a pool of several connections.
async fn storage_is_configured_for_concurrency(app: TestApp) {
    use sea_orm::{ConnectionTrait, Statement};
    if app.backend == crate::helpers::Backend::Postgres {
        assert_eq!(app.db().get_database_backend(), sea_orm::DbBackend::Postgres);
        return;
    }
    let db = app.db();
    let mut values = Vec::new();
    for name in ["journal_mode", "foreign_keys", "busy_timeout"] {
        let row = db
            .query_one_raw(Statement::from_string(
                sea_orm::DbBackend::Sqlite,
                format!("PRAGMA {name}"),
            ))
            .await
            .unwrap()
            .unwrap();
        let value = row
            .try_get_by_index::<String>(0)
            .or_else(|_| row.try_get_by_index::<i64>(0).map(|n| n.to_string()))
            .unwrap();
        values.push(value);
    }
    assert_eq!(values, vec!["wal", "1", "30000"]);
    // A dangling reference is refused by the database itself.
    let r = app
        .db()
        .execute_raw(Statement::from_string(
            sea_orm::DbBackend::Sqlite,
            "INSERT INTO tasks (id, workspace_id, title, description, kind, workspace_mode, last_activity_at, created_at, updated_at) VALUES (X'0190f0f0000070008000000000000001', X'0190f0f0000070008000000000000002', 't', '', 'standard', 'new_workspace', '2026-01-01T00:00:00Z', '2026-01-01T00:00:00Z', '2026-01-01T00:00:00Z')",
        ))
        .await;
    assert!(r.is_err(), "foreign keys are enforced");
    // Concurrent read-then-write transactions on the pool do not fail with "database is locked": a
    // deferred transaction that reads the repositories and then writes would (BEGIN IMMEDIATE does not).
    let ws = app.workspace("busy").await;
    let (repo, _) = app.repository(ws, "busy-repo").await;
    let url = format!("/api/v1/workspaces/{ws}/tasks");
    let writes = (0..24).map(|i| {
        app.post(
            &url,
            serde_json::json!({"title": format!("t{i}"), "repositories": [{"repository_id": repo}]}),
        )
    });
    for r in futures_util::future::join_all(writes).await {
        r.ok(201);
    }
}

async fn health_readiness_and_metrics(app: TestApp) {
    assert_eq!(
        app.call(Method::GET, "/healthz", None, None).await.ok(200)["status"],
        "ok"
    );
    assert_eq!(
        app.call(Method::GET, "/readyz", None, None).await.ok(200)["status"],
        "ready"
    );
    app.get("/api/v1/workspaces").await.ok(200);
    app.call(Method::GET, "/api/v1/workspaces", None, None)
        .await
        .problem(401, "unauthenticated");
    let r = app.call(Method::GET, "/metrics", None, None).await;
    assert_eq!(r.status, 200);
    assert!(r.header("content-type").unwrap().starts_with("text/plain"));
    assert!(
        r.text
            .contains(r#"berth_http_requests_total{method="GET",route="/api/v1/workspaces",status="200"} 1"#),
        "{}",
        r.text
    );
    assert!(
        r.text
            .contains(r#"berth_http_requests_total{method="GET",route="/api/v1/workspaces",status="401"} 1"#)
    );
    assert!(r.text.contains("berth_http_request_duration_seconds_bucket{"));
    assert!(r.text.contains("berth_db_pool_connections{state=\"open\"}"));
    assert!(r.text.contains("berth_db_pool_max_connections 5"));
}
