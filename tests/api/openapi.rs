//! The spec cannot drift: the committed file equals the generated one, the served one too, and every
//! operation outside the public list declares the bearer scheme.
use serde_json::Value;

use crate::both_backends;
use crate::helpers::TestApp;

const COMMITTED: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/openapi/openapi.json");

fn generated() -> String {
    berth::api::openapi().to_pretty_json().unwrap() + "\n"
}

/// Only compares: the writer is a separate command, so a run that checks the file cannot also rewrite it.
#[test]
fn committed_openapi_json_is_up_to_date() {
    let committed = std::fs::read_to_string(COMMITTED).unwrap_or_default();
    assert!(
        committed == generated(),
        "openapi/openapi.json is out of date. Regenerate it with:\n    cargo run -q -- openapi > openapi/openapi.json"
    );
}

#[test]
fn every_non_public_operation_declares_bearer() {
    let spec: Value = serde_json::from_str(&generated()).unwrap();
    assert_eq!(spec["info"]["title"], "berth");
    assert_eq!(spec["info"]["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(spec["components"]["securitySchemes"]["bearer"]["scheme"], "bearer");
    let mut operations = 0;
    for (path, item) in spec["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            operations += 1;
            let public = berth::api::PUBLIC_PATHS.contains(&path.as_str());
            let security = op
                .get("security")
                .and_then(|s| s.as_array())
                .cloned()
                .unwrap_or_default();
            let bearer = security.iter().any(|s| s.get("bearer").is_some());
            if public {
                assert!(!bearer, "{method} {path} is public but declares a token");
            } else {
                assert!(bearer, "{method} {path} lacks the bearer security scheme");
                let scopes = security[0]["bearer"].as_array().unwrap();
                assert_eq!(scopes.len(), 1, "{method} {path} should name its one scope");
                assert!(op["responses"].get("401").is_some(), "{method} {path} documents no 401");
            }
        }
    }
    assert!(operations >= 14, "{operations}");
}

#[test]
fn error_codes_are_the_contracts() {
    let spec: Value = serde_json::from_str(&generated()).unwrap();
    let codes: Vec<&str> = spec["components"]["schemas"]["ErrorCode"]["enum"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    // The whole enum, in order: a code added, renamed or dropped is a contract change (design/api.md).
    assert_eq!(
        codes,
        [
            "unauthenticated",
            "insufficient_scope",
            "not_found",
            "validation_failed",
            "conflict",
            "session_busy",
            "task_archived",
            "task_cleanup_in_progress",
            "workspace_preparing",
            "workspace_reuse_unsafe",
            "workspace_reuse_unsupported",
            "agent_session_unavailable",
            "task_delete_dirty_worktree",
            "repository_in_use",
            "not_a_git_repository",
            "path_not_allowed",
            "invalid_cursor",
            "idempotency_key_reused",
            "unavailable",
            "internal",
        ]
    );
}

both_backends!(served_spec_matches_generated_and_docs_work_offline);

async fn served_spec_matches_generated_and_docs_work_offline(app: TestApp) {
    let served = app
        .client
        .get(format!("{}/openapi.json", app.base))
        .send()
        .await
        .unwrap();
    assert_eq!(served.status(), 200);
    let served: Value = served.json().await.unwrap();
    let fresh: Value = serde_json::from_str(&generated()).unwrap();
    assert_eq!(served, fresh);
    // /docs redirects to the UI, which is served from the binary and loads nothing from elsewhere.
    let docs = app.client.get(format!("{}/docs", app.base)).send().await.unwrap();
    assert_eq!(docs.status(), 200);
    let html = docs.text().await.unwrap();
    assert!(html.contains("swagger-ui"), "{html}");
    for asset in ["swagger-ui.css", "swagger-ui-bundle.js", "swagger-initializer.js"] {
        let r = app
            .client
            .get(format!("{}/docs/{asset}", app.base))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{asset}");
        let body = r.text().await.unwrap();
        assert!(
            !body.contains("unpkg.com") && !body.contains("cdn.jsdelivr"),
            "{asset} loads from a CDN"
        );
    }
    let init = app
        .client
        .get(format!("{}/docs/swagger-initializer.js", app.base))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(init.contains("/openapi.json"), "the UI points at our spec: {init}");
}
