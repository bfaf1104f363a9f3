//! Berth's side of the protocol is safe against a hostile ACP agent (our own,
//! `tests/acp/hostile/agent.py`: no real agent asks for files outside its worktree). It serves files
//! only inside the admitted worktree, never through `..`, an absolute path elsewhere, a symbolic link or
//! the worktree's `.git`; and an agent that wants authentication fails the launch with a typed reason
//! naming its methods. The profile's MCP servers reach the conversation as the protocol names them.
use std::collections::BTreeMap;
use std::path::Path;

use serde_json::{Value, json};

use crate::both_backends;
use crate::helpers::{TestApp, wait_until};
use crate::pi::{uuid, wait_session};

both_backends!(
    a_hostile_agent_gets_no_file_outside_its_worktree,
    an_agent_wanting_credentials_fails_with_its_methods
);

pub(super) fn profile(auth: bool) -> berth::config::AgentProfile {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/acp/hostile/agent.py");
    let mut env = BTreeMap::new();
    if auth {
        env.insert("HOSTILE_AUTH".to_string(), "1".to_string());
    }
    berth::config::AgentProfile {
        // The system's Python, which the box shows (a pyenv shim first on PATH would need its tree listed
        // in read_only_paths).
        command: "/usr/bin/python3".into(),
        args: vec![script.display().to_string()],
        env,
        protocol: berth::config::AgentProtocol::Acp,
        mcp_servers: vec![
            berth::config::McpServer::Stdio {
                name: "files".into(),
                command: "/usr/bin/mcp-files".into(),
                args: vec!["--root".into()],
                env: [("FILES_TOKEN".to_string(), "t1".to_string())].into(),
            },
            berth::config::McpServer::Remote {
                name: "tickets".into(),
                url: "https://mcp.example.com/tickets".into(),
                transport: berth::config::McpTransport::Sse,
                headers: [("Authorization".to_string(), "Bearer t2".to_string())].into(),
            },
        ],
        ..Default::default()
    }
}

async fn with_hostile(app: TestApp, auth: bool) -> Option<TestApp> {
    let backend = app.backend;
    drop(app);
    TestApp::spawn_with_profiles(backend, &[], vec![("hostile".to_string(), profile(auth))]).await
}

async fn hostile_session(app: &TestApp) -> (uuid::Uuid, String) {
    let f = app.task_with_repo("Hostile").await;
    let s = f.unstarted_agent("worktree", "hostile").await;
    (uuid(&s["id"]), s["workspace_path"].as_str().unwrap().to_string())
}

async fn a_hostile_agent_gets_no_file_outside_its_worktree(app: TestApp) {
    let Some(app) = with_hostile(app, false).await else {
        return;
    };
    let (id, worktree) = hostile_session(&app).await;
    let wt = Path::new(&worktree);
    let outside = wt.parent().unwrap();
    std::fs::write(outside.join("secret.txt"), "secret\n").unwrap();
    let elsewhere = tempfile::TempDir::new().unwrap();
    std::os::unix::fs::symlink(elsewhere.path(), wt.join("link")).unwrap();
    let git_link = std::fs::read(wt.join(".git")).unwrap();
    app.post(&format!("/api/v1/sessions/{id}/launch"), json!({"prompt": "go"}))
        .await
        .ok(200);
    // As long as the real agents' scenarios wait: on a loaded 2-core CI machine this test runs beside
    // four node agents starting at once (it once took over 60 s there).
    let within = std::time::Duration::from_secs(120);
    let report: Value = wait_until("the agent to report", within, || async {
        let snap = app.get(&format!("/api/v1/sessions/{id}/snapshot")).await.ok(200);
        let said = snap["transcript"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["role"] == "assistant")
            .and_then(|m| m["content"]["content"][0]["text"].as_str().map(str::to_string));
        match said {
            Some(text) => Ok(serde_json::from_str(&text).unwrap()),
            None => Err(snap.to_string()),
        }
    })
    .await;
    wait_session(&app, id, "idle", |s| s["state"] == "idle").await;
    // The profile's MCP servers reach the conversation, in the protocol's shape.
    assert_eq!(
        report["mcp"],
        json!([
            {"name": "files", "command": "/usr/bin/mcp-files", "args": ["--root"],
             "env": [{"name": "FILES_TOKEN", "value": "t1"}]},
            {"type": "sse", "name": "tickets", "url": "https://mcp.example.com/tickets",
             "headers": [{"name": "Authorization", "value": "Bearer t2"}]},
        ]),
        "{report}"
    );
    assert_eq!(report["inside"], "ok", "{report}");
    assert_eq!(report["read_inside"], "fine\n", "{report}");
    for refused in ["dotdot", "absolute", "link", "git", "read_outside"] {
        assert_eq!(report[refused], -32602, "{refused} is refused: {report}");
    }
    assert_eq!(std::fs::read_to_string(wt.join("ok/inside.txt")).unwrap(), "fine\n");
    assert!(!outside.join("escaped.txt").exists());
    assert!(!outside.join("absolute.txt").exists());
    assert!(!elsewhere.path().join("linked.txt").exists());
    assert_eq!(
        std::fs::read(wt.join(".git")).unwrap(),
        git_link,
        "the worktree's git link is untouched"
    );
    app.post(&format!("/api/v1/sessions/{id}/stop"), json!({}))
        .await
        .ok(200);
}

async fn an_agent_wanting_credentials_fails_with_its_methods(app: TestApp) {
    let Some(app) = with_hostile(app, true).await else {
        return;
    };
    let (id, _) = hostile_session(&app).await;
    let problem = app
        .post(&format!("/api/v1/sessions/{id}/launch"), json!({}))
        .await
        .problem(409, "agent_auth_required");
    assert!(problem["detail"].as_str().unwrap().contains("hostile-key"), "{problem}");
    let s = wait_session(&app, id, "failed", |s| s["state"] == "failed").await;
    assert_eq!(s["last_error"]["code"], "agent_auth_required", "{s}");
    assert!(s["agent_session_ref"].is_null(), "no conversation was recorded");
}
