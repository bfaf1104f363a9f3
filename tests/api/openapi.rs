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
                // `security: []` in so many words: no token, not "unspecified" (I33).
                assert_eq!(op.get("security"), Some(&Value::Array(vec![])), "{method} {path}");
            } else {
                assert!(bearer, "{method} {path} lacks the bearer security scheme");
                let scopes = security[0]["bearer"].as_array().unwrap();
                assert_eq!(scopes.len(), 1, "{method} {path} should name its one scope");
                assert!(op["responses"].get("401").is_some(), "{method} {path} documents no 401");
            }
        }
    }
    assert!(operations >= 14, "{operations}");
    // Each public path the spec lists is one of the public operations (I33).
    for path in ["/healthz", "/readyz", "/version", "/metrics"] {
        assert!(spec["paths"].get(path).is_some(), "{path} is missing from the spec");
    }
}

/// Generated clients name their methods after operation ids, and a reader of the spec sees the summary
/// first: every operation has an explicit verbNoun id that is unique, a summary and a description.
#[test]
fn every_operation_has_an_id_a_summary_and_a_description() {
    let spec: Value = serde_json::from_str(&generated()).unwrap();
    const VERBS: [&str; 17] = [
        "list",
        "get",
        "create",
        "update",
        "delete",
        "register",
        "archive",
        "unarchive",
        "reset",
        "launch",
        "resume",
        "stop",
        "abort",
        "make",
        "answer",
        "send",
        "cancel",
    ];
    const MORE_VERBS: [&str; 12] = [
        "report",
        "refresh",
        "retry",
        "stream",
        "set",
        "decommission",
        "restore",
        "commit",
        "merge",
        "push",
        "rotate",
        "test",
    ];
    let mut ids = std::collections::BTreeSet::new();
    for (path, item) in spec["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            let id = op["operationId"].as_str().unwrap_or_default();
            let verb: String = id.chars().take_while(|c| c.is_ascii_lowercase()).collect();
            assert!(
                VERBS.contains(&verb.as_str()) || MORE_VERBS.contains(&verb.as_str()),
                "{method} {path}: operation id {id:?} should be verbNoun"
            );
            assert!(
                id.len() > verb.len() && id.chars().all(|c| c.is_ascii_alphanumeric()),
                "{method} {path}: operation id {id:?} should be verbNoun"
            );
            assert!(ids.insert(id.to_string()), "operation id {id} is used twice");
            for field in ["summary", "description"] {
                let text = op[field].as_str().unwrap_or_default();
                assert!(text.len() >= 10, "{method} {path} has no {field}");
                assert!(!text.contains("/api/v1"), "{method} {path}: the {field} names a path");
            }
        }
    }
    // The spec fuzzing configures operations by id: an id it names that the spec lacks would silently
    // fuzz nothing there.
    let fuzz = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fuzz/schemathesis.toml")).unwrap();
    for line in fuzz.lines().filter(|l| l.starts_with("include-operation-id")) {
        for named in line.split('"').skip(1).step_by(2) {
            assert!(
                ids.contains(named),
                "tests/fuzz/schemathesis.toml names operation {named}, which the spec lacks"
            );
        }
    }
    // The id says what comes back: the session route answers its environment's git status.
    assert_eq!(
        spec["paths"]["/api/v1/sessions/{id}/git-status"]["get"]["operationId"],
        "getSessionGitStatus"
    );
}

/// The operation with this id, wherever it lives.
fn operation<'a>(spec: &'a Value, id: &str) -> &'a Value {
    spec["paths"]
        .as_object()
        .unwrap()
        .values()
        .flat_map(|item| item.as_object().unwrap().values())
        .find(|op| op["operationId"] == id)
        .unwrap_or_else(|| panic!("no operation {id}"))
}

fn example_values(content: &Value) -> Vec<Value> {
    let examples = content["examples"].as_object().cloned().unwrap_or_default();
    examples.values().map(|e| e["value"].clone()).collect()
}

/// The main flows carry request and response examples, and each request example is a body the handler
/// accepts (the request types refuse unknown fields, so a stale example fails here). Redocly checks every
/// example against its schema (.ci/lint-spec).
#[test]
fn main_flows_have_examples_that_the_handlers_accept() {
    fn parses<T: serde::de::DeserializeOwned>(spec: &Value, id: &str) {
        let content = &operation(spec, id)["requestBody"]["content"]["application/json"];
        let values = example_values(content);
        assert!(!values.is_empty(), "{id} has no request example");
        for v in values {
            serde_json::from_value::<T>(v.clone()).unwrap_or_else(|e| panic!("{id}: {e}: {v}"));
        }
    }
    let spec: Value = serde_json::from_str(&generated()).unwrap();
    parses::<berth::api::workspaces::CreateWorkspace>(&spec, "createWorkspace");
    parses::<berth::api::repositories::RegisterRepository>(&spec, "registerRepository");
    parses::<berth::api::tasks::CreateTask>(&spec, "createTask");
    parses::<berth::api::sessions::CreateSession>(&spec, "createSession");
    parses::<berth::api::session_messages::SendMessage>(&spec, "sendSessionMessage");
    for (id, status) in [
        ("createWorkspace", "201"),
        ("registerRepository", "201"),
        ("createTask", "201"),
        ("createSession", "201"),
        ("sendSessionMessage", "202"),
        ("getSessionSnapshot", "200"),
        ("listEvents", "200"),
        ("archiveTask", "202"),
        ("deleteTask", "202"),
        ("deleteTask", "409"),
    ] {
        let content = operation(&spec, id)["responses"][status]["content"]
            .as_object()
            .and_then(|c| c.values().next().cloned())
            .unwrap_or_default();
        assert!(!example_values(&content).is_empty(), "{id} {status} has no example");
    }
    let problems = spec["components"]["schemas"]["Problem"]["examples"].as_array().unwrap();
    assert!(
        problems
            .iter()
            .all(|p| p["type"].as_str().unwrap().ends_with(p["code"].as_str().unwrap()))
    );
}

/// `Event` is a union discriminated by `type`: every `EventType` berth can append has its own member with
/// a typed `data`, so a new type cannot be forgotten in the spec; the wire stays one flat object.
#[test]
fn every_event_type_has_a_schema_in_the_event_union() {
    use sea_orm::Iterable;
    let spec: Value = serde_json::from_str(&generated()).unwrap();
    let schemas = &spec["components"]["schemas"];
    let event = &schemas["Event"];
    assert_eq!(event["discriminator"]["propertyName"], "type");
    let mapping = event["discriminator"]["mapping"].as_object().unwrap();
    let members: Vec<&str> = event["oneOf"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["$ref"].as_str().unwrap())
        .collect();
    assert_eq!(members.len(), mapping.len(), "one member per mapped type");
    let mut types: Vec<String> = berth::events::EventType::iter()
        .map(|t| t.as_str().to_string())
        .collect();
    // Asynchronous session creation reports progress (appended once that lands).
    if !types.iter().any(|t| t == "environment.progress") {
        types.push("environment.progress".into());
    }
    for t in &types {
        let target = mapping
            .get(t.as_str())
            .and_then(|m| m.as_str())
            .unwrap_or_else(|| panic!("{t} has no member in the Event union"));
        assert!(members.contains(&target), "{t} maps to {target}, which is not a member");
        let name = target.trim_start_matches("#/components/schemas/");
        let member = &schemas[name];
        assert_eq!(member["properties"]["type"]["enum"], serde_json::json!([t]), "{name}");
        let data = member["properties"]["data"]["$ref"].as_str().expect("typed data");
        let data = &schemas[data.trim_start_matches("#/components/schemas/")];
        assert_eq!(data["type"], "object", "{t}: data");
        assert!(
            data["properties"].as_object().is_some_and(|p| !p.is_empty()),
            "{t}: data has no fields"
        );
        for field in ["version", "instance_id", "seq", "type", "data", "created_at"] {
            assert!(
                member["required"].as_array().unwrap().iter().any(|r| r == field),
                "{name} does not require {field}"
            );
        }
    }
    assert_eq!(
        mapping.len(),
        types.len(),
        "a member for a type berth does not know: {mapping:?}"
    );
}

#[test]
fn one_relative_server() {
    let spec: Value = serde_json::from_str(&generated()).unwrap();
    let servers = spec["servers"].as_array().expect("servers");
    assert_eq!(servers.len(), 1, "{servers:?}");
    assert_eq!(servers[0]["url"], "/");
    assert!(servers[0]["description"].as_str().is_some_and(|d| !d.is_empty()));
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
    // The whole enum, in order: a code added, renamed or dropped is a contract change (docs/api.md).
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
            "agent_auth_required",
            "steer_unsupported",
            "task_delete_dirty_worktree",
            "repository_in_use",
            "not_a_git_repository",
            "path_not_allowed",
            "invalid_cursor",
            "precondition_failed",
            "idempotency_key_reused",
            "unavailable",
            // A request that needs a node that is down.
            "node_unavailable",
            "repositories_on_different_nodes",
            // Landing the work: commit, merge, push, pull requests.
            "nothing_to_commit",
            "merge_conflict",
            "branch_moved",
            "target_checked_out",
            "target_in_use",
            "landing_in_progress",
            "restore_in_progress",
            "push_rejected",
            "remote_auth_failed",
            "remote_unreachable",
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

/// Whether `value` fits `schema`, for the parts of JSON Schema the spec's event schemas use; the reason
/// when not.
fn fits(spec: &Value, schema: &Value, value: &Value, at: &str) -> Result<(), String> {
    if let Some(target) = schema["$ref"].as_str() {
        let name = target.trim_start_matches("#/components/schemas/");
        return fits(spec, &spec["components"]["schemas"][name], value, at);
    }
    if let Some(members) = schema["oneOf"].as_array() {
        let matching = members.iter().filter(|m| fits(spec, m, value, at).is_ok()).count();
        return if matching == 1 {
            Ok(())
        } else {
            Err(format!("{at}: {matching} oneOf members match {value}"))
        };
    }
    let types: Vec<&str> = match &schema["type"] {
        Value::String(t) => vec![t.as_str()],
        Value::Array(ts) => ts.iter().filter_map(Value::as_str).collect(),
        _ => vec![],
    };
    let kind = match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    };
    let allowed = types.is_empty() || types.contains(&kind) || (kind == "integer" && types.contains(&"number"));
    if !allowed {
        return Err(format!("{at}: {value} is not {types:?}"));
    }
    if let Some(values) = schema["enum"].as_array()
        && !values.contains(value)
    {
        return Err(format!("{at}: {value} is not one of {values:?}"));
    }
    if let Value::String(s) = value {
        match schema["format"].as_str() {
            Some("uuid") if s.parse::<uuid::Uuid>().is_err() => return Err(format!("{at}: {s} is not a uuid")),
            Some("date-time") if chrono::DateTime::parse_from_rfc3339(s).is_err() => {
                return Err(format!("{at}: {s} is not a date-time"));
            }
            _ => {}
        }
    }
    if let Value::Object(fields) = value {
        for required in schema["required"].as_array().into_iter().flatten() {
            let required = required.as_str().unwrap();
            if !fields.contains_key(required) {
                return Err(format!("{at}: {required} is missing from {value}"));
            }
        }
        for (name, property) in schema["properties"].as_object().into_iter().flatten() {
            if let Some(field) = fields.get(name) {
                fits(spec, property, field, &format!("{at}.{name}"))?;
            }
        }
    }
    if let (Value::Array(items), Some(item)) = (value, schema.get("items")) {
        for (i, v) in items.iter().enumerate() {
            fits(spec, item, v, &format!("{at}[{i}]"))?;
        }
    }
    Ok(())
}

both_backends!(events_on_the_wire_fit_their_member_of_the_event_union);

/// The union describes what berth really writes: a run through the lifecycle (workspace, repository,
/// task, sessions, git status, archive, unarchive, delete) appends events of most types, and each one, as
/// `GET /events` serves it, fits `Event` (exactly one member, by its `type`, with its typed `data`).
async fn events_on_the_wire_fit_their_member_of_the_event_union(app: TestApp) {
    let spec: Value = serde_json::from_str(&generated()).unwrap();
    let f = app.task_with_repo_in("union", "union-repo", "union task").await;
    let task = f.task;
    let first = f.session("worktree").await;
    let second = f.session("worktree").await;
    app.patch(
        &format!("/api/v1/tasks/{task}"),
        serde_json::json!({ "title": "renamed" }),
    )
    .await
    .ok(200);
    app.post(
        &format!("/api/v1/sessions/{}/primary", second["id"].as_str().unwrap()),
        serde_json::json!({}),
    )
    .await
    .ok(200);
    let env = first["task_environment_id"].as_str().unwrap();
    app.post(
        &format!("/api/v1/environments/{env}/git-status/refresh"),
        serde_json::json!({}),
    )
    .await
    .ok(200);
    app.post(
        &format!("/api/v1/sessions/{}/primary", first["id"].as_str().unwrap()),
        serde_json::json!({}),
    )
    .await
    .ok(200);
    app.delete(&format!("/api/v1/sessions/{}", first["id"].as_str().unwrap()))
        .await
        .ok(204);
    app.post(&format!("/api/v1/tasks/{task}/archive"), serde_json::json!({}))
        .await
        .ok(202);
    app.post(&format!("/api/v1/tasks/{task}/unarchive"), serde_json::json!({}))
        .await
        .ok(200);
    app.delete(&format!("/api/v1/tasks/{task}?discard_worktree_changes=true"))
        .await
        .ok(202);
    let other = app.workspace("union-doomed").await;
    app.delete(&format!("/api/v1/workspaces/{other}?confirm_name=union-doomed"))
        .await
        .ok(202);

    let page = app.get("/api/v1/events?limit=1000").await.ok(200);
    let events = page["events"].as_array().unwrap();
    let mut seen = std::collections::BTreeSet::new();
    for e in events {
        fits(&spec, &spec["components"]["schemas"]["Event"], e, "event")
            .unwrap_or_else(|why| panic!("{why}\nthe event: {e}"));
        seen.insert(e["type"].as_str().unwrap().to_string());
    }
    for t in [
        "workspace.created",
        "workspace.deleted",
        "repository.created",
        "task.created",
        "task.updated",
        "task.archived",
        "task.unarchived",
        "task.deleted",
        "environment.created",
        "environment.ready",
        "session.created",
        "session.state_changed",
        "session.primary_changed",
        "session.deleted",
        "git_status.updated",
        "cleanup_job.updated",
    ] {
        assert!(seen.contains(t), "the run appended no {t}: {seen:?}");
    }
    // The check bites: a state no session has, or a type berth does not know, fits no member.
    let event = &spec["components"]["schemas"]["Event"];
    let mut wrong = events
        .iter()
        .find(|e| e["type"] == "session.state_changed")
        .unwrap()
        .clone();
    wrong["data"]["state"] = "daydreaming".into();
    assert!(fits(&spec, event, &wrong, "event").is_err());
    wrong["type"] = "session.daydreamed".into();
    assert!(fits(&spec, event, &wrong, "event").is_err());
}
