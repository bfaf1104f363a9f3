//! Least authority for an agent's token. A session-bound token holding every scope but `admin` walks every
//! route of the spec, aimed at its own workspace, task, environment and session: each route is classified
//! in one table (a route missing from it fails the test), the refused ones answer the session-bound
//! problem, and after the walk nothing was landed: the user's `main` and the task branch are where they
//! were, the agent's file is still uncommitted, no review, no checkpoint restore. Landing needs
//! `tasks:land`, and merging into anything but the base branch needs `admin`. Real git, both databases.
use reqwest::Method;
use serde_json::{Value, json};
use uuid::Uuid;

use crate::both_backends;
use crate::helpers::{TestApp, git};
use crate::landing::{Started, agent_writes, started};

both_backends!(
    a_session_bound_token_is_refused_every_route_beyond_its_session,
    landing_needs_its_own_scope_and_the_base_branch,
);

/// What a session-bound token may do on a route, aimed at its own resources.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Bound {
    /// Refused with `403`: "a session-bound token acts only on its session".
    Refused,
    /// About its own session, task or environment: not refused for being bound.
    Own,
    /// Needs no token.
    Public,
}

/// Every route of the spec. A new route fails the walk until it is listed here.
const ROUTES: &[(&str, &str, Bound)] = {
    use Bound::*;
    &[
        ("GET", "/api/v1/agent-profiles", Own),
        ("GET", "/api/v1/cleanup-jobs", Refused),
        ("GET", "/api/v1/cleanup-jobs/{id}", Refused),
        ("POST", "/api/v1/cleanup-jobs/{id}/cancel", Refused),
        ("POST", "/api/v1/cleanup-jobs/{id}/retry", Refused),
        ("GET", "/api/v1/environments/{id}", Own),
        ("POST", "/api/v1/environments/{id}/commits", Refused),
        ("GET", "/api/v1/environments/{id}/diff", Own),
        ("GET", "/api/v1/environments/{id}/git-status", Own),
        ("POST", "/api/v1/environments/{id}/git-status/observations", Own),
        ("POST", "/api/v1/environments/{id}/git-status/refresh", Own),
        ("POST", "/api/v1/environments/{id}/merge", Refused),
        ("POST", "/api/v1/environments/{id}/pull-requests", Refused),
        ("POST", "/api/v1/environments/{id}/push", Refused),
        ("POST", "/api/v1/environments/{id}/restore", Refused),
        ("GET", "/api/v1/environments/{id}/reviews", Own),
        ("POST", "/api/v1/environments/{id}/reviews", Refused),
        ("GET", "/api/v1/environments/{id}/reviews/{review_id}", Own),
        ("GET", "/api/v1/events", Own),
        ("GET", "/api/v1/events/stream", Own),
        ("POST", "/api/v1/events/tickets", Own),
        ("GET", "/api/v1/nodes", Refused),
        ("POST", "/api/v1/nodes/{id}/decommission", Refused),
        ("GET", "/api/v1/repositories/{id}", Refused),
        ("DELETE", "/api/v1/repositories/{id}", Refused),
        ("GET", "/api/v1/sessions/{id}", Own),
        ("DELETE", "/api/v1/sessions/{id}", Own),
        ("POST", "/api/v1/sessions/{id}/abort", Own),
        // Permissions are a person's to grant, and the mode and options decide what the agent may do
        // unasked and what it costs: an agent sets none of them for itself.
        ("POST", "/api/v1/sessions/{id}/attention/{request_id}", Refused),
        ("PUT", "/api/v1/sessions/{id}/config-options/{option_id}", Refused),
        ("PUT", "/api/v1/sessions/{id}/mode", Refused),
        ("GET", "/api/v1/sessions/{id}/diff", Own),
        ("GET", "/api/v1/sessions/{id}/git-status", Own),
        ("POST", "/api/v1/sessions/{id}/launch", Own),
        ("GET", "/api/v1/sessions/{id}/messages", Own),
        ("POST", "/api/v1/sessions/{id}/messages", Own),
        ("DELETE", "/api/v1/sessions/{id}/messages/{message_id}", Own),
        // Which session leads the task is the task's, not the session's.
        ("POST", "/api/v1/sessions/{id}/primary", Refused),
        ("POST", "/api/v1/sessions/{id}/resume", Own),
        ("GET", "/api/v1/sessions/{id}/snapshot", Own),
        ("POST", "/api/v1/sessions/{id}/stop", Own),
        ("GET", "/api/v1/sessions/{id}/turns", Own),
        ("GET", "/api/v1/sessions/{id}/turns/{number}/diff", Own),
        ("GET", "/api/v1/tasks/{id}", Own),
        ("DELETE", "/api/v1/tasks/{id}", Refused),
        ("PATCH", "/api/v1/tasks/{id}", Refused),
        ("POST", "/api/v1/tasks/{id}/archive", Refused),
        ("GET", "/api/v1/tasks/{id}/environment", Own),
        ("POST", "/api/v1/tasks/{id}/environment/reset", Refused),
        ("GET", "/api/v1/tasks/{id}/sessions", Refused),
        ("POST", "/api/v1/tasks/{id}/sessions", Refused),
        ("POST", "/api/v1/tasks/{id}/unarchive", Refused),
        ("GET", "/api/v1/webhooks", Refused),
        ("POST", "/api/v1/webhooks", Refused),
        ("GET", "/api/v1/webhooks/{id}", Refused),
        ("DELETE", "/api/v1/webhooks/{id}", Refused),
        ("PATCH", "/api/v1/webhooks/{id}", Refused),
        ("GET", "/api/v1/webhooks/{id}/deliveries", Refused),
        ("POST", "/api/v1/webhooks/{id}/secret", Refused),
        ("POST", "/api/v1/webhooks/{id}/test", Refused),
        ("GET", "/api/v1/workspaces", Refused),
        ("POST", "/api/v1/workspaces", Refused),
        ("GET", "/api/v1/workspaces/{id}", Refused),
        ("DELETE", "/api/v1/workspaces/{id}", Refused),
        ("GET", "/api/v1/workspaces/{id}/branches", Refused),
        ("GET", "/api/v1/workspaces/{id}/columns", Refused),
        ("POST", "/api/v1/workspaces/{id}/columns", Refused),
        ("DELETE", "/api/v1/workspaces/{id}/columns/{column_id}", Refused),
        ("PATCH", "/api/v1/workspaces/{id}/columns/{column_id}", Refused),
        ("GET", "/api/v1/workspaces/{id}/leftovers", Refused),
        ("DELETE", "/api/v1/workspaces/{id}/leftovers/{leftover_id}", Refused),
        ("GET", "/api/v1/workspaces/{id}/repositories", Refused),
        ("POST", "/api/v1/workspaces/{id}/repositories", Refused),
        ("GET", "/api/v1/workspaces/{id}/summary", Refused),
        ("GET", "/api/v1/workspaces/{id}/tasks", Refused),
        ("POST", "/api/v1/workspaces/{id}/tasks", Refused),
        ("GET", "/api/v1/workspaces/{id}/usage", Refused),
        ("GET", "/healthz", Public),
        ("GET", "/metrics", Public),
        ("GET", "/readyz", Public),
        ("GET", "/version", Public),
    ]
};

/// Every scope but `admin`: what an over-generous operator might hand an agent.
const ALL_BUT_ADMIN: &str = "workspaces:admin tasks:read tasks:write tasks:land tasks:archive tasks:delete \
     sessions:read sessions:write sessions:delete cleanup:read cleanup:admin events:read webhooks:write";

/// The route with its parameters filled: the token's own ids where the route names one of its resources.
fn concrete(path: &str, s: &Started, workspace: Uuid) -> String {
    let owner = |resource: &str| match resource {
        "workspaces" => workspace.to_string(),
        "tasks" => s.task.to_string(),
        "sessions" => s.session.to_string(),
        "environments" => s.env.clone(),
        "repositories" => s.repo.to_string(),
        _ => Uuid::now_v7().to_string(),
    };
    let segments: Vec<&str> = path.split('/').collect();
    segments
        .iter()
        .enumerate()
        .map(|(i, seg)| match *seg {
            "{id}" => owner(segments[i - 1]),
            "{number}" => "1".to_string(),
            s if s.starts_with('{') => Uuid::now_v7().to_string(),
            s => s.to_string(),
        })
        .collect::<Vec<_>>()
        .join("/")
}

/// A body each write would accept from an unbound token, so a refusal is the binding's and nothing else's.
fn body_for(method: &str, path: &str, s: &Started) -> Option<Value> {
    if method == "GET" || method == "DELETE" {
        return None;
    }
    Some(match path.rsplit('/').next().unwrap() {
        "commits" => json!({"message": "an agent lands its own work"}),
        "merge" => json!({"repository_id": s.repo, "strategy": "merge", "into": "main"}),
        "push" | "pull-requests" => json!({"repository_id": s.repo, "title": "mine"}),
        "reviews" => json!({"body": "looks good to me, says the agent"}),
        "messages" => json!({"text": "hello"}),
        "mode" => json!({"mode_id": "bypassPermissions"}),
        "{option_id}" => json!({"value": "x"}),
        "{request_id}" => json!({"option_id": "allow"}),
        "{id}" if path.starts_with("/api/v1/tasks") => json!({"title": "renamed by the agent"}),
        _ => json!({}),
    })
}

async fn a_session_bound_token_is_refused_every_route_beyond_its_session(app: TestApp) {
    let s = started(&app).await;
    agent_writes(&app, &s, "agent.txt", "written by the agent\n").await;
    let workspace: Uuid = app.get(&format!("/api/v1/tasks/{}", s.task)).await.ok(200)["workspace_id"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    let main_before = git(&s.repo_path, &["rev-parse", "main"]);
    let branch = git(&s.worktree, &["rev-parse", "--abbrev-ref", "HEAD"])
        .trim()
        .to_string();
    let branch_before = git(&s.repo_path, &["rev-parse", &branch]);
    let tasks_before = app.count("tasks").await;
    let columns_before = app.count("workspace_columns").await;

    // Bound to its session, with every scope but admin, and with admin too: the binding decides.
    let agents = [
        app.token_for(ALL_BUT_ADMIN, None, Some(s.session)),
        app.token_for(&format!("{ALL_BUT_ADMIN} admin"), None, Some(s.session)),
    ];
    let spec = app.call(Method::GET, "/openapi.json", None, None).await.ok(200);
    let mut listed = Vec::new();
    for (path, item) in spec["paths"].as_object().unwrap() {
        for method in ["get", "post", "put", "patch", "delete"] {
            if item.get(method).is_some() {
                listed.push((method.to_uppercase(), path.clone()));
            }
        }
    }
    let classified = |m: &str, p: &str| ROUTES.iter().find(|(rm, rp, _)| *rm == m && *rp == p).map(|r| r.2);
    let unclassified: Vec<String> = listed
        .iter()
        .filter(|(m, p)| classified(m, p).is_none())
        .map(|(m, p)| format!("{m} {p}"))
        .collect();
    assert!(
        unclassified.is_empty(),
        "routes not classified for a session-bound token (add them to ROUTES): {unclassified:?}"
    );
    let stale: Vec<_> = ROUTES
        .iter()
        .filter(|(m, p, _)| !listed.iter().any(|(lm, lp)| lm == m && lp == p))
        .collect();
    assert!(
        stale.is_empty(),
        "ROUTES lists routes the spec does not have: {stale:?}"
    );

    // The refused first, then what it may do with its own session (stopping and deleting it last).
    let mut walk: Vec<&(&str, &str, Bound)> = ROUTES.iter().collect();
    walk.sort_by_key(|(m, p, b)| (*b != Bound::Refused, *m == "DELETE" && p.ends_with("/sessions/{id}")));
    for (method, path, bound) in walk {
        for (with_admin, agent) in [false, true].into_iter().zip(&agents) {
            let url = concrete(path, &s, workspace);
            let m = Method::from_bytes(method.as_bytes()).unwrap();
            if path.ends_with("/events/stream") {
                // The stream never ends: its status and headers are the answer.
                let res = app
                    .client
                    .get(format!("{}{url}", app.base))
                    .bearer_auth(agent)
                    .send()
                    .await
                    .unwrap();
                assert_eq!(res.status(), 200, "{path}");
                continue;
            }
            let r = app.call(m, &url, Some(agent), body_for(method, path, &s)).await;
            let session_bound = r.status == 403 && r.text.contains("a session-bound token acts only on its session");
            match bound {
                // Without admin, the node routes refuse the scope first: refused all the same.
                Bound::Refused if !with_admin => {
                    r.problem(403, "insufficient_scope");
                }
                Bound::Refused => assert!(session_bound, "{method} {path}: {} {}", r.status, r.text),
                Bound::Own | Bound::Public => {
                    assert!(!session_bound, "{method} {path} refused its own session: {}", r.text);
                    assert!(r.status.as_u16() < 500, "{method} {path}: {} {}", r.status, r.text);
                }
            }
        }
    }

    // Nothing was landed or changed beyond the session.
    assert_eq!(git(&s.repo_path, &["rev-parse", "main"]), main_before, "main moved");
    assert_eq!(
        git(&s.repo_path, &["rev-parse", &branch]),
        branch_before,
        "the task branch moved"
    );
    let status = git(&s.worktree, &["status", "--porcelain"]);
    assert!(
        status.contains("agent.txt"),
        "the agent's file is no longer uncommitted: {status}"
    );
    assert_eq!(app.count("tasks").await, tasks_before);
    for table in ["reviews", "pull_requests", "webhooks"] {
        assert_eq!(app.count(table).await, 0, "{table}");
    }
    assert_eq!(app.count("workspace_columns").await, columns_before);
    let task = app.get(&format!("/api/v1/tasks/{}", s.task)).await.ok(200);
    assert_eq!(task["title"], "Land it", "{task}");
}

async fn landing_needs_its_own_scope_and_the_base_branch(app: TestApp) {
    let s = started(&app).await;
    agent_writes(&app, &s, "feature.txt", "done\n").await;
    git(&s.repo_path, &["branch", "release", "main"]);
    let writer = app.token("tasks:read tasks:write");
    let lander = app.token("tasks:read tasks:write tasks:land");
    let env = &s.env;
    let commit = json!({"message": "the feature"});
    app.call(
        Method::POST,
        &format!("/api/v1/environments/{env}/commits"),
        Some(&writer),
        Some(commit),
    )
    .await
    .ok(201);
    let merge = |into: &str| json!({"repository_id": s.repo, "strategy": "merge", "into": into});
    let main_before = git(&s.repo_path, &["rev-parse", "main"]);
    let p = app
        .call(
            Method::POST,
            &format!("/api/v1/environments/{env}/merge"),
            Some(&writer),
            Some(merge("main")),
        )
        .await
        .problem(403, "insufficient_scope");
    assert_eq!(p["required_scope"], "tasks:land");
    let p = app
        .call(
            Method::POST,
            &format!("/api/v1/environments/{env}/push"),
            Some(&writer),
            Some(json!({"repository_id": s.repo})),
        )
        .await
        .problem(403, "insufficient_scope");
    assert_eq!(p["required_scope"], "tasks:land");
    // tasks:land lands into the base branch only; another target is an operator's.
    let p = app
        .call(
            Method::POST,
            &format!("/api/v1/environments/{env}/merge"),
            Some(&lander),
            Some(merge("release")),
        )
        .await
        .problem(403, "insufficient_scope");
    assert_eq!(p["required_scope"], "admin");
    assert_eq!(git(&s.repo_path, &["rev-parse", "main"]), main_before);
    let merged = app
        .call(
            Method::POST,
            &format!("/api/v1/environments/{env}/merge"),
            Some(&lander),
            Some(merge("main")),
        )
        .await
        .ok(200);
    assert_eq!(merged["into"], "main");
    assert_ne!(git(&s.repo_path, &["rev-parse", "main"]), main_before);
    // The spec says which scope each landing route needs.
    let spec = app.call(Method::GET, "/openapi.json", None, None).await.ok(200);
    for (path, scope) in [
        ("/api/v1/environments/{id}/commits", "tasks:write"),
        ("/api/v1/environments/{id}/merge", "tasks:land"),
        ("/api/v1/environments/{id}/push", "tasks:land"),
        ("/api/v1/environments/{id}/pull-requests", "tasks:land"),
    ] {
        assert_eq!(spec["paths"][path]["post"]["security"][0]["bearer"][0], scope, "{path}");
    }
}

/// The first start with the secret berth generates prints an admin token; every later start says how to
/// mint one and prints none (a token in every start's log would be in journald for its 7 days).
#[test]
fn serve_prints_an_admin_token_only_on_first_start() {
    let data = tempfile::tempdir().unwrap();
    let start = || {
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_berth"))
            .arg("serve")
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap())
            .env("BERTH_DATA_DIR", data.path())
            .env("BERTH_BIND", "127.0.0.1:0")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("berth starts");
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut lines = Vec::new();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
        // Up to the line after the docs URL: the token's, or the hint's.
        while !lines
            .iter()
            .any(|l: &String| l.starts_with("Mint a token") || l.starts_with("eyJ"))
        {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match rx.recv_timeout(left) {
                Ok(line) => lines.push(line),
                Err(e) => panic!("berth printed {lines:?}, then {e}"),
            }
        }
        let _ = child.kill();
        let _ = child.wait();
        lines.join("\n")
    };
    let first = start();
    assert!(first.contains("Admin token") && first.contains("\neyJ"), "{first}");
    let second = start();
    assert!(!second.contains("eyJ") && !second.contains("Admin token"), "{second}");
    assert!(second.contains("berth token --sub"), "{second}");
}
