//! Every agent in a box: a hostile agent, started as any session's agent, tries what an agent
//! holding berth's user could do, and every attempt fails; what the box allows (its worktree, its home,
//! its listed endpoint) still works; its limits end it alone.
use std::io::Write;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Value, json};
use uuid::Uuid;

use crate::agents::{replies, wait_session};
use crate::both_backends;
use crate::helpers::{TestApp, git, wait_job_settled, wait_until};

both_backends!(
    a_hostile_agent_stays_in_its_box,
    an_agent_past_its_memory_limit_fails_alone,
    a_session_home_is_kept_across_launches_and_removed_with_the_session,
    nothing_planted_in_the_git_directory_runs_for_berth,
);

const WAIT: Duration = Duration::from_secs(30);

/// A server on loopback that greets every connection with `greeting` and closes it.
fn greeter(greeting: &'static str) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for mut stream in listener.incoming().flatten() {
            let _ = stream.write_all(greeting.as_bytes());
        }
    });
    port
}

/// The test agent in its box, as a profile an operator writes, reaching only `endpoints`.
fn boxed(endpoints: Vec<String>, memory_max_mib: Option<u64>, pids_max: Option<u64>) -> berth::config::AgentProfile {
    berth::config::AgentProfile {
        command: env!("CARGO_BIN_EXE_berth-test-agent").to_string(),
        endpoints,
        memory_max_mib,
        pids_max,
        ..Default::default()
    }
}

async fn with_profiles(app: TestApp, profiles: Vec<(&str, berth::config::AgentProfile)>) -> Option<TestApp> {
    let backend = app.backend;
    drop(app);
    let profiles = profiles.into_iter().map(|(n, p)| (n.to_string(), p)).collect();
    TestApp::spawn_with_profiles(backend, &[], profiles).await
}

/// Sends `text` to the session's agent and returns its reply (the `n`th of the session).
async fn ask(app: &TestApp, session: Uuid, text: &str, n: usize) -> String {
    app.post(&format!("/api/v1/sessions/{session}/messages"), json!({"text": text}))
        .await
        .ok(202);
    let all = wait_until(&format!("reply #{n} to {text:?}"), WAIT, || async {
        let r = replies(app, session).await;
        crate::helpers::seen(r.len() >= n, r)
    })
    .await;
    all[n - 1].clone()
}

fn path_of(session: &Value) -> PathBuf {
    PathBuf::from(session["workspace_path"].as_str().unwrap())
}

async fn a_hostile_agent_stays_in_its_box(app: TestApp) {
    let listed = greeter("hello from the listed endpoint");
    let unlisted = greeter("hello from a server nobody listed");
    let profile = boxed(vec![format!("127.0.0.1:{listed}")], None, Some(48));
    let Some(app) = with_profiles(app, vec![("hostile", profile)]).await else {
        return;
    };
    let data_dir = app.config.data_dir.clone();
    // berth's signing secret where berth keeps a generated one, beside whatever else its data dir holds.
    std::fs::write(data_dir.join("jwt-secret"), "a secret only berth may read").unwrap();
    // A file of the operator's own home (berth's HOME), as a key would be.
    let operator_home = PathBuf::from(std::env::var("HOME").unwrap());
    let planted_key = operator_home.join(format!(".berth-box-test-{}", Uuid::now_v7()));
    std::fs::write(&planted_key, "an operator's key").unwrap();

    // Another task's session: its worktree and its home are somebody else's.
    let other = app.task_with_repo_in("neighbours", "other", "Other").await;
    let neighbour = other.started_session("test").await;
    let neighbour_tree = path_of(&neighbour.idle);
    let neighbour_home = data_dir.join("boxes").join(neighbour.id.to_string()).join("home");
    std::fs::write(neighbour_home.join("conversation.json"), "the neighbour's conversation").unwrap();

    let f = app.task_with_repo("Hostile").await;
    let me = f.started_session("hostile").await;
    let tree = path_of(&me.idle);
    let common = f.repo_dir.join(".git");
    let config_before = std::fs::read(common.join("config")).unwrap();
    let mut n = 0;
    let mut ask_me = async |text: &str| {
        n += 1;
        ask(&app, me.id, text, n).await
    };

    // What the box allows works: its own worktree, and the listed endpoint.
    assert_eq!(
        ask_me(&format!("try write {}/inside.txt", tree.display())).await,
        "ok written"
    );
    assert!(tree.join("inside.txt").is_file(), "the worktree is the real one");
    assert_eq!(
        ask_me(&format!("try connect 127.0.0.1:{listed}")).await,
        "ok connected hello from the listed endpoint"
    );

    let mut secrets: Vec<PathBuf> = std::fs::read_dir(&data_dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file())
        .collect();
    assert!(secrets.iter().any(|p| p.ends_with("jwt-secret")));
    secrets.extend([
        neighbour_home.join("conversation.json"),
        neighbour_tree.join(".git"),
        planted_key.clone(),
        PathBuf::from(format!("/proc/{}/environ", std::process::id())),
    ]);
    for secret in &secrets {
        assert!(secret.exists(), "{} is there to be read", secret.display());
        let said = ask_me(&format!("try read {}", secret.display())).await;
        assert!(said.starts_with("refused"), "read {}: {said}", secret.display());
    }
    // Where the box shows a directory read-only, a write is refused; where it shows nothing (berth's data
    // directory, another worktree, the main checkout: all under /tmp here), a write lands in the box's
    // private /tmp at most, never on the host.
    let read_only = [
        common.join("config"),
        common.join("hooks/post-checkout"),
        PathBuf::from("/usr/planted"),
        PathBuf::from("/etc/planted"),
        operator_home.join(".berth-box-planted"),
    ];
    for path in &read_only {
        let existed = path.exists();
        let said = ask_me(&format!("try write {}", path.display())).await;
        assert!(said.starts_with("refused"), "write {}: {said}", path.display());
        assert_eq!(path.exists(), existed, "{} was not created", path.display());
    }
    for path in [
        data_dir.join("planted"),
        neighbour_tree.join("planted"),
        f.repo_dir.join("planted"),
    ] {
        ask_me(&format!("try write {}", path.display())).await;
        assert!(!path.exists(), "{} reached the host", path.display());
    }
    assert_eq!(std::fs::read(common.join("config")).unwrap(), config_before);
    for attempt in ["mount /tmp", "umount /proc", "unshare", "ptrace 1"] {
        let said = ask_me(&format!("try {attempt}")).await;
        assert!(said.starts_with("refused"), "{attempt}: {said}");
    }
    for address in [
        format!("127.0.0.1:{unlisted}"),
        "127.0.0.1:5432".to_string(),
        "169.254.169.254:80".to_string(),
        "example.com:443".to_string(),
    ] {
        let said = ask_me(&format!("try connect {address}")).await;
        assert!(said.starts_with("refused"), "connect {address}: {said}");
    }
    // Its process limit (48, bwrap's own two processes and the agent included) stops a fork bomb.
    let said = ask_me("try fork 200").await;
    let forked: usize = said.strip_prefix("ok forked ").unwrap().parse().unwrap();
    assert!(forked < 48, "{said}");
    // And the listed endpoint still answers; the neighbour's agent never noticed.
    assert_eq!(
        ask_me(&format!("try connect 127.0.0.1:{listed}")).await,
        "ok connected hello from the listed endpoint"
    );
    assert_eq!(
        ask(&app, neighbour.id, "pwd", 1).await,
        neighbour_tree.display().to_string()
    );
    // The name it asked for is a session event, and counted.
    wait_until("the refused name as a session event", WAIT, || async {
        let page = app
            .get("/api/v1/events?after=0&limit=1000&types=session.egress_refused")
            .await
            .ok(200);
        let found = page["events"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["session_id"] == me.id.to_string() && e["data"]["address"] == "example.com");
        crate::helpers::seen_json(found, page)
    })
    .await;
    // Only those who may see the session see its refusals: not another workspace's token, not another
    // session's agent.
    let refusals = |token: String| {
        let app = &app;
        async move {
            let page = app
                .call_with(
                    reqwest::Method::GET,
                    "/api/v1/events?after=0&limit=1000&types=session.egress_refused",
                    Some(&token),
                    None,
                    &[],
                )
                .await
                .ok(200);
            page["events"].as_array().unwrap().len()
        }
    };
    assert_eq!(
        refusals(app.token_for("events:read", Some(vec![other.workspace]), None)).await,
        0
    );
    assert_eq!(
        refusals(app.token_for("events:read", None, Some(neighbour.id))).await,
        0
    );
    assert!(refusals(app.token_for("events:read", Some(vec![f.workspace]), None)).await > 0);
    let metrics = app.get("/metrics").await.text;
    assert!(
        metrics.contains("berth_agent_egress_total{decision=\"refused\"}"),
        "{metrics}"
    );
    assert!(
        metrics.contains("berth_agent_egress_total{decision=\"allowed\"}"),
        "{metrics}"
    );
    std::fs::remove_file(&planted_key).unwrap();
}

async fn an_agent_past_its_memory_limit_fails_alone(app: TestApp) {
    let Some(app) = with_profiles(app, vec![("small", boxed(Vec::new(), Some(64), None))]).await else {
        return;
    };
    if !Path::new("/sys/fs/cgroup/memory").is_dir() && !Path::new("/sys/fs/cgroup/cgroup.controllers").is_file() {
        panic!("this host offers no cgroup: the memory limit cannot be proved here");
    }
    let other = app.task_with_repo_in("bystanders", "other", "Bystander").await;
    let bystander = other.started_session("test").await;
    let f = app.task_with_repo("Greedy").await;
    let me = f.started_session("small").await;
    assert_eq!(ask(&app, me.id, "try alloc 16", 1).await, "ok allocated 16");
    app.post(
        &format!("/api/v1/sessions/{}/messages", me.id),
        json!({"text": "try alloc 512"}),
    )
    .await
    .ok(202);
    let s = wait_session(&app, me.id, "failed at its memory limit", |s| s["state"] == "failed").await;
    assert_eq!(s["last_error"]["code"], "out_of_memory", "{s}");
    // berth and the other agent go on.
    assert_eq!(
        ask(&app, bystander.id, "pwd", 1).await,
        path_of(&bystander.idle).display().to_string()
    );
}

async fn a_session_home_is_kept_across_launches_and_removed_with_the_session(app: TestApp) {
    let f = app.task_with_repo("Home").await;
    let me = f.started_session("test").await;
    let home = app.config.data_dir.join("boxes").join(me.id.to_string()).join("home");
    assert_eq!(ask(&app, me.id, "env HOME", 1).await, home.display().to_string());
    assert_eq!(
        ask(&app, me.id, &format!("try write {}/.agent-state", home.display()), 2).await,
        "ok written"
    );
    app.post(&format!("/api/v1/sessions/{}/stop", me.id), json!({})).await;
    wait_session(&app, me.id, "stopped", |s| {
        s["execution_id"].is_null() || s["state"] != "idle"
    })
    .await;
    app.post(&format!("/api/v1/sessions/{}/launch", me.id), json!({})).await;
    wait_session(&app, me.id, "relaunched", |s| s["state"] == "idle").await;
    let n = replies(&app, me.id).await.len();
    assert_eq!(
        ask(&app, me.id, &format!("try read {}/.agent-state", home.display()), n + 1).await,
        "ok 27 bytes",
        "the home outlives a relaunch"
    );
    let worktree = path_of(&me.idle);
    app.delete(&format!("/api/v1/sessions/{}", me.id)).await;
    wait_until("the session's home to go", WAIT, || async {
        crate::helpers::seen(!home.exists(), home.clone())
    })
    .await;
    assert!(worktree.is_dir(), "a session delete never touches a worktree (I2)");
}

/// Planted from outside, as an agent without a box could: hooks, a `core.fsmonitor` command and a filter
/// driver for every file. Every git operation berth runs (worktree add, git status, diff, checkpoints,
/// restore, commit, merge, push, worktree remove) runs none of them.
async fn nothing_planted_in_the_git_directory_runs_for_berth(app: TestApp) {
    let f = app.task_with_repo_in("planted", "svc", "Planted").await;
    let marks = tempfile::TempDir::new().unwrap();
    let mark = |name: &str| marks.path().join(name).display().to_string();
    let remote = marks.path().join("remote.git");
    git(marks.path(), &["init", "-q", "--bare", remote.to_str().unwrap()]);
    git(&f.repo_dir, &["remote", "add", "origin", remote.to_str().unwrap()]);
    let common = f.repo_dir.join(".git");
    let script = |path: &Path, body: String| {
        std::fs::write(path, format!("#!/bin/sh\n{body}\n")).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
    };
    let hooks = [
        "post-checkout",
        "pre-commit",
        "commit-msg",
        "post-commit",
        "reference-transaction",
        "pre-push",
        "post-merge",
        "pre-merge-commit",
        "post-index-change",
    ];
    for hook in hooks {
        script(&common.join("hooks").join(hook), format!("touch {}", mark(hook)));
    }
    script(&common.join("fsmonitor"), format!("touch {}", mark("fsmonitor")));
    // The test's own last git calls: from here on, only berth runs git in this repository.
    git(
        &f.repo_dir,
        &["config", "core.fsmonitor", common.join("fsmonitor").to_str().unwrap()],
    );
    git(
        &f.repo_dir,
        &["config", "filter.evil.clean", &format!("touch {}; cat", mark("clean"))],
    );
    git(
        &f.repo_dir,
        &[
            "config",
            "filter.evil.smudge",
            &format!("touch {}; cat", mark("smudge")),
        ],
    );
    std::fs::write(common.join("info/attributes"), "* filter=evil\n").unwrap();

    let me = f.started_session("test").await;
    let env = me.idle["task_environment_id"].as_str().unwrap().to_string();
    let turns = |n| crate::turns::wait_turns(&app, me.id, n);
    ask(&app, me.id, "write notes.txt first", 1).await;
    let listed = turns(1).await;
    app.post(&format!("/api/v1/environments/{env}/git-status/refresh"), json!({}))
        .await
        .ok(200);
    app.get(&format!("/api/v1/environments/{env}/diff")).await.ok(200);
    let start = listed["items"][0]["start_checkpoint_id"].as_str().unwrap().to_string();
    app.post(
        &format!("/api/v1/environments/{env}/restore"),
        json!({"checkpoint_id": start, "discard_worktree_changes": true}),
    )
    .await
    .ok(200);
    ask(&app, me.id, "write landed.txt to land", 2).await;
    turns(2).await;
    app.post(
        &format!("/api/v1/environments/{env}/commits"),
        json!({"message": "land it"}),
    )
    .await
    .ok(201);
    app.post(
        &format!("/api/v1/environments/{env}/merge"),
        json!({"repository_id": f.repository, "strategy": "fast_forward"}),
    )
    .await
    .ok(200);
    app.post(
        &format!("/api/v1/environments/{env}/push"),
        json!({"repository_id": f.repository}),
    )
    .await
    .ok(200);
    let r = app.delete(&format!("/api/v1/tasks/{}", f.task)).await.ok(202);
    let job = wait_job_settled(&app, crate::helpers::uuid(&r["cleanup_jobs"][0]["id"])).await;
    assert_eq!(job["state"], "succeeded", "{job}");
    assert!(!path_of(&me.idle).exists(), "the worktree was removed");

    let ran: Vec<String> = std::fs::read_dir(marks.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n != "remote.git")
        .collect();
    assert!(ran.is_empty(), "berth ran what was planted: {ran:?}");
}
