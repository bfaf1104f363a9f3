//! Request and response examples for the main flows, added to the generated spec by operation id (so the
//! handlers' `#[utoipa::path]` blocks stay as they are). One story runs through them: a workspace, its
//! repository, a task on it, a session with the test agent, a message, the snapshot, the events, then the
//! archive and the delete. Problem examples are real: built from the same `Error` the handlers return.
use serde_json::{Value, json};
use utoipa::openapi::example::ExampleBuilder;
use utoipa::openapi::{Content, OpenApi, RefOr, Schema};

use super::problem::Problem;
use crate::error::{DirtyRepository, Error};

pub const WORKSPACE_ID: &str = "01938a10-2f00-7c21-9a55-4f1e2d3c4b01";
pub const REPOSITORY_ID: &str = "01938a10-2f40-7d10-8b2f-7a6c5d4e3f02";
pub const TASK_ID: &str = "01938a10-3a11-7e3b-a1c4-2b3c4d5e6f03";
pub const ENVIRONMENT_ID: &str = "01938a10-3c20-7f42-b7d1-9e8f7a6b5c04";
pub const SESSION_ID: &str = "01938a10-3c2b-7a53-8e6f-1a2b3c4d5e05";
pub const MESSAGE_ID: &str = "01938a10-4d30-7b64-9f70-3c4d5e6f7a06";
pub const CLEANUP_JOB_ID: &str = "01938a10-5e40-7c75-a081-5e6f7a8b9c07";
pub const OPERATION_ID: &str = "01938a10-5e41-7d86-b192-6f7a8b9c0d08";
pub const INSTANCE_ID: &str = "01938a0f-0001-7e97-8c23-7a8b9c0d1e09";
pub const EXECUTION_ID: &str = "01938a10-3d00-7fa8-9d34-8b9c0d1e2f0a";
const REQUEST_ID: &str = "01938a10-6000-7ab9-8e45-9c0d1e2f3a0b";

/// One example: (summary, value).
type Named = (&'static str, Value);

/// Request body examples by operation id.
fn requests() -> Vec<(&'static str, Named)> {
    vec![
        (
            "createWorkspace",
            ("A workspace for one team", json!({ "name": "payments" })),
        ),
        (
            "registerRepository",
            (
                "A repository under the configured repository roots",
                json!({ "path": "/srv/repos/payments-api", "name": "payments-api", "default_branch": "main" }),
            ),
        ),
        (
            "createTask",
            (
                "A standard task on one repository, on a branch of its own",
                json!({
                    "title": "Retry failed webhooks",
                    "description": "Webhook deliveries that fail with 5xx are retried with backoff.",
                    "kind": "standard",
                    "workspace_mode": "new_workspace",
                    "repositories": [{ "repository_id": REPOSITORY_ID, "base_branch": "main" }]
                }),
            ),
        ),
        (
            "createSession",
            (
                "A worktree session that starts its agent with a first prompt",
                json!({
                    "executor_type": "worktree",
                    "agent_profile": "pi",
                    "name": "implementation",
                    "prompt": "Add retries with exponential backoff to the webhook sender.",
                    "start": true
                }),
            ),
        ),
        (
            "sendSessionMessage",
            (
                "A follow-up prompt, sent when the agent is idle or after its current turn",
                json!({ "text": "Also add a test for the third retry.", "delivery": "auto" }),
            ),
        ),
    ]
}

/// Response body examples by operation id and status.
fn responses() -> Vec<(&'static str, &'static str, Named)> {
    vec![
        ("createWorkspace", "201", ("The new workspace", workspace())),
        ("registerRepository", "201", ("The registered repository", repository())),
        ("createTask", "201", ("The new task (no environment yet)", task(None))),
        (
            "createSession",
            "201",
            ("The session, its agent starting", session("starting")),
        ),
        (
            "sendSessionMessage",
            "202",
            ("Stored, waiting for the agent", message("queued")),
        ),
        (
            "getSessionSnapshot",
            "200",
            ("A session whose agent answered once", snapshot()),
        ),
        ("listEvents", "200", ("A page of events", event_page())),
        (
            "archiveTask",
            "202",
            (
                "Archived; a job removes the clean worktree",
                json!({
                    "task": task(Some("2024-11-28T10:15:00Z")),
                    "cleanup_jobs": [cleanup_job("archive", "pending")]
                }),
            ),
        ),
        (
            "deleteTask",
            "202",
            (
                "Deleted; a job removes the worktree, then the branch berth made (merged into its base)",
                json!({
                    "cleanup_jobs": [cleanup_job("delete", "pending")],
                    "branches": [{
                        "repository_id": REPOSITORY_ID,
                        "branch": "berth/add-login",
                        "action": "delete",
                        "reason": "merged"
                    }]
                }),
            ),
        ),
        (
            "deleteTask",
            "409",
            (
                "A worktree holds uncommitted changes: nothing was changed",
                problem(&Error::TaskDeleteDirtyWorktree(vec![DirtyRepository {
                    repository_id: REPOSITORY_ID.parse().expect("a uuid"),
                    task_environment_id: ENVIRONMENT_ID.parse().expect("a uuid"),
                    dirty_file_count: 3,
                }])),
            ),
        ),
        (
            "createSession",
            "409",
            (
                "Another request is preparing the environment: retry after 1 s",
                problem(&Error::WorkspacePreparing),
            ),
        ),
    ]
}

/// The examples on the `Problem` schema itself, shown with every problem answer.
fn problem_schema_examples() -> Vec<Value> {
    vec![
        problem(&Error::NotFound("task")),
        problem(&Error::TaskDeleteDirtyWorktree(vec![DirtyRepository {
            repository_id: REPOSITORY_ID.parse().expect("a uuid"),
            task_environment_id: ENVIRONMENT_ID.parse().expect("a uuid"),
            dirty_file_count: 3,
        }])),
    ]
}

pub fn workspace() -> Value {
    json!({
        "id": WORKSPACE_ID,
        "name": "payments",
        "status": "active",
        "created_at": "2024-11-28T09:00:00Z",
        "updated_at": "2024-11-28T09:00:00Z"
    })
}

pub fn repository() -> Value {
    json!({
        "id": REPOSITORY_ID,
        "workspace_id": WORKSPACE_ID,
        "name": "payments-api",
        "path": "/srv/repos/payments-api",
        "common_git_dir": "/srv/repos/payments-api/.git",
        "default_branch": "main",
        "status": "available",
        "imported_from": null,
        "created_at": "2024-11-28T09:01:00Z",
        "updated_at": "2024-11-28T09:01:00Z"
    })
}

pub fn task(archived_at: Option<&str>) -> Value {
    json!({
        "id": TASK_ID,
        "workspace_id": WORKSPACE_ID,
        "parent_task_id": null,
        "title": "Retry failed webhooks",
        "description": "Webhook deliveries that fail with 5xx are retried with backoff.",
        "kind": "standard",
        "workspace_mode": "new_workspace",
        "repositories": [{
            "repository_id": REPOSITORY_ID,
            "base_branch": "main",
            "branch": null,
            "branch_slug": "",
            "position": 0
        }],
        "archived_at": archived_at,
        "primary_session_id": if archived_at.is_some() { json!(SESSION_ID) } else { Value::Null },
        "session_count": if archived_at.is_some() { 1 } else { 0 },
        "pull_requests": [],
        "usage": if archived_at.is_some() { usage() } else { no_usage() },
        "created_at": "2024-11-28T09:02:00Z",
        "updated_at": archived_at.unwrap_or("2024-11-28T09:02:00Z")
    })
}

pub fn session(state: &str) -> Value {
    json!({
        "id": SESSION_ID,
        "task_id": TASK_ID,
        "task_environment_id": ENVIRONMENT_ID,
        "name": "implementation",
        "executor_type": "worktree",
        "agent_profile": "pi",
        "state": state,
        "is_primary": true,
        "desired_open": true,
        "workspace_path": "/var/lib/berth/worktrees/01938a10-3a11-7e3b-a1c4-2b3c4d5e6f03",
        "execution_id": EXECUTION_ID,
        "agent_session_ref": null,
        "last_error": null,
        "created_at": "2024-11-28T09:03:00Z",
        "updated_at": "2024-11-28T09:03:01Z",
        "started_at": "2024-11-28T09:03:01Z",
        "ended_at": null
    })
}

pub fn message(state: &str) -> Value {
    json!({
        "id": MESSAGE_ID,
        "session_id": SESSION_ID,
        "text": "Also add a test for the third retry.",
        "delivery": "auto",
        "state": state,
        "reason": null,
        "created_at": "2024-11-28T09:05:00Z"
    })
}

fn snapshot() -> Value {
    json!({
        "session": session("idle"),
        "state": "idle",
        "label": "implementation",
        "transcript": [
            {
                "role": "user",
                "content": [{ "type": "text", "text": "Add retries with exponential backoff to the webhook sender." }],
                "created_at": "2024-11-28T09:03:01Z"
            },
            {
                "role": "assistant",
                "content": [{ "type": "text", "text": "Done: the sender retries 5xx answers up to five times." }],
                "created_at": "2024-11-28T09:04:30Z"
            }
        ],
        "statistics": { "turns": 1, "messages": 2, "input_tokens": 5120, "output_tokens": 830, "cost": 0.0213 },
        "usage": usage(),
        "active_tool": null,
        "queue_length": 0,
        "agent": {
            "model": { "id": "claude-sonnet-4", "provider": "anthropic" },
            "commands": [],
            "models": [],
            "status": {},
            "notifications": [],
            "session_name": null,
            "thinking_level": null,
            "title": null,
            "identity": null,
            "mode": null,
            "modes": [],
            "config_options": [],
            "plan": [],
            "tool_calls": [],
            "usage": null
        },
        "last_activity_at": "2024-11-28T09:04:30Z",
        "attention_requests": [],
        "instance_id": INSTANCE_ID,
        "latest_seq": 42
    })
}

/// What the session's one turn spent (the totals `statistics` summarises).
fn usage() -> Value {
    json!({
        "reports": 1,
        "input_tokens": 5120,
        "output_tokens": 830,
        "cache_read_tokens": 0,
        "cache_write_tokens": 0,
        "cost": [{ "currency": "USD", "amount": 0.0213 }]
    })
}

fn no_usage() -> Value {
    json!({
        "reports": 0, "input_tokens": 0, "output_tokens": 0,
        "cache_read_tokens": 0, "cache_write_tokens": 0, "cost": []
    })
}

fn cleanup_job(trigger: &str, state: &str) -> Value {
    json!({
        "id": CLEANUP_JOB_ID,
        "operation_id": OPERATION_ID,
        "task_id": TASK_ID,
        "workspace_id": WORKSPACE_ID,
        "task_environment_id": ENVIRONMENT_ID,
        "trigger": trigger,
        "state": state,
        "attempts": 0,
        "max_attempts": 8,
        "next_attempt_at": null,
        "last_error": null,
        "resource_snapshot": {},
        "node_id": "berth-1",
        "created_at": "2024-11-28T10:15:00Z",
        "updated_at": "2024-11-28T10:15:00Z",
        "completed_at": null,
        "actor": { "sub": "alice", "session_id": null }
    })
}

/// One event of each family a client meets first, as the wire carries them.
pub fn events() -> Vec<Value> {
    let base = |seq: i64, kind: &str, data: Value| {
        json!({
            "version": "v1",
            "instance_id": INSTANCE_ID,
            "seq": seq,
            "type": kind,
            "workspace_id": WORKSPACE_ID,
            "task_id": TASK_ID,
            "session_id": SESSION_ID,
            "task_environment_id": ENVIRONMENT_ID,
            "execution_id": EXECUTION_ID,
            "data": data,
            "created_at": "2024-11-28T09:04:30Z",
            "actor": null
        })
    };
    vec![
        base(40, "session.state_changed", json!({ "state": "running" })),
        base(
            41,
            "runtime.output",
            json!({ "event": { "type": "message_end", "message": { "role": "assistant", "content": [{ "type": "text", "text": "Done." }] } } }),
        ),
        base(42, "session.state_changed", json!({ "state": "idle" })),
    ]
}

fn event_page() -> Value {
    json!({
        "instance_id": INSTANCE_ID,
        "first_available_seq": 1,
        "latest_seq": 42,
        "truncated": false,
        "events": events()
    })
}

/// A problem body exactly as a handler renders it, with the request id the middleware adds.
fn problem(err: &Error) -> Value {
    let mut p = Problem::from(err);
    p.request_id = Some(REQUEST_ID.into());
    serde_json::to_value(p).expect("a problem serializes")
}

/// Adds every example above to `spec`. An example for an operation or status that is not in the spec is a
/// bug here, so it panics (the spec tests run this).
pub fn add(spec: &mut OpenApi) {
    for (operation_id, (summary, value)) in requests() {
        let op = operation(spec, operation_id);
        let Some(RefOr::T(body)) = op.request_body.as_mut() else {
            panic!("{operation_id} takes no inline body");
        };
        for content in body.content.values_mut() {
            if let RefOr::T(content) = content {
                put(content, summary, value.clone());
            }
        }
    }
    for (operation_id, status, (summary, value)) in responses() {
        let op = operation(spec, operation_id);
        let Some(RefOr::T(response)) = op.responses.responses.get_mut(status) else {
            panic!("{operation_id} has no inline {status} answer");
        };
        let Some(RefOr::T(content)) = response.content.values_mut().next() else {
            panic!("{operation_id} {status} has no body");
        };
        put(content, summary, value);
    }
    let schemas = &mut spec.components.as_mut().expect("components").schemas;
    if let Some(RefOr::T(Schema::Object(problem))) = schemas.get_mut("Problem") {
        problem.examples = problem_schema_examples();
    }
}

fn put(content: &mut Content, summary: &str, value: Value) {
    let key = format!("example{}", content.examples.len() + 1);
    let example = ExampleBuilder::new().summary(summary).value(Some(value)).build();
    content.examples.insert(key, RefOr::T(example));
}

fn operation<'a>(spec: &'a mut OpenApi, operation_id: &str) -> &'a mut utoipa::openapi::path::Operation {
    spec.paths
        .paths
        .values_mut()
        .flat_map(super::operations)
        .find(|op| op.operation_id.as_deref() == Some(operation_id))
        .unwrap_or_else(|| panic!("no operation {operation_id}"))
}
