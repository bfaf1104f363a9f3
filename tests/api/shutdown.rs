//! Clean shutdown within a budget, with the real `berth serve` process: on SIGTERM every event stream gets
//! a last `event: shutdown` frame and ends; an agent that ignores abort, a closed stdin and SIGTERM is
//! SIGKILLed; the process exits 0, all within `BERTH_SHUTDOWN_SECS`. After a SIGKILL of berth, the next
//! start ends what its agents left running (an agent, or a tool whose agent is gone) before it relaunches
//! their sessions.
use std::collections::BTreeMap;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;

use serde_json::{Value, json};
use uuid::Uuid;

use crate::both_backends;
use crate::faults::process_env;
use crate::helpers::{TestApp, git_repo, id_of, seen, seen_json, wait_until_every};

both_backends!(
    sigterm_ends_every_stream_with_a_shutdown_frame,
    sigterm_kills_a_stubborn_agent_and_exits_within_the_budget,
    a_start_after_sigkill_ends_the_leftover_groups_before_relaunching,
);

/// The budget the processes run with: smaller than the agents' own graces (5 s + 5 s + 5 s), which it cuts.
const BUDGET: Duration = Duration::from_secs(4);
/// What a loaded CI machine may add to the budget.
const MARGIN: Duration = Duration::from_secs(3);
const WAIT: Duration = Duration::from_secs(60);
/// How often the waiters here probe.
const EVERY: Duration = Duration::from_millis(20);

/// A `berth serve` child process, stopped (SIGTERM, so it stops its agents; then SIGKILL) if a test ends
/// before it exits.
struct Served {
    child: Child,
    base: String,
    log: std::path::PathBuf,
}

impl Drop for Served {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            self.signal(libc::SIGTERM);
            let deadline = std::time::Instant::now() + BUDGET + MARGIN;
            while matches!(self.child.try_wait(), Ok(None)) && std::time::Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Served {
    fn signal(&self, signal: i32) {
        // SAFETY: a signal to our own child process.
        assert_eq!(unsafe { libc::kill(self.child.id() as i32, signal) }, 0);
    }

    /// Waits for the exit, at most `within`.
    async fn exit(&mut self, within: Duration) -> ExitStatus {
        let log = self.log.clone();
        let child = std::cell::RefCell::new(&mut self.child);
        wait_until_every("berth to exit", within, EVERY, || async {
            match child.borrow_mut().try_wait().unwrap() {
                Some(status) => Ok(status),
                None => Err(format!(
                    "its log:\n{}",
                    std::fs::read_to_string(&log).unwrap_or_default()
                )),
            }
        })
        .await
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// The process settings (the test's database, a data dir of its own), the agent profiles and the budget.
fn settings(app: &TestApp) -> BTreeMap<String, String> {
    let data = app.scratch.path().join("served");
    let mut env = process_env(app, &data);
    let agent = env!("CARGO_BIN_EXE_berth-test-agent");
    let config = data.join("berth.toml");
    std::fs::write(
        &config,
        format!(
            "[agents.test]\ncommand = {agent:?}\nsandbox = \"none\"\n\n\
             [agents.lingering]\ncommand = {agent:?}\nargs = [\"--ignore-eof\"]\nsandbox = \"none\"\n\n\
             [agents.boxed_lingering]\ncommand = {agent:?}\nargs = [\"--ignore-eof\"]\n\n\
             [agents.stubborn]\ncommand = {agent:?}\nargs = [\"--ignore-abort\", \"--ignore-term\", \"--ignore-eof\"]\n"
        ),
    )
    .unwrap();
    env.insert("BERTH_CONFIG".into(), config.display().to_string());
    env.insert("BERTH_SHUTDOWN_SECS".into(), BUDGET.as_secs().to_string());
    env
}

async fn serve(app: &TestApp, env: &BTreeMap<String, String>) -> Served {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let log = app.scratch.path().join("served.log");
    let served = Served {
        child: Command::new(env!("CARGO_BIN_EXE_berth"))
            .arg("serve")
            .envs(env)
            .env("BERTH_BIND", format!("127.0.0.1:{port}"))
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&log)
                    .unwrap(),
            )
            .spawn()
            .expect("berth starts"),
        base: format!("http://127.0.0.1:{port}"),
        log,
    };
    let served = std::cell::RefCell::new(served);
    wait_until_every("berth to be ready", WAIT, EVERY, || async {
        let readyz = format!("{}/readyz", served.borrow().base);
        if let Ok(r) = app.client.get(readyz).send().await
            && r.status().is_success()
        {
            return Ok(());
        }
        let mut served = served.borrow_mut();
        if let Some(status) = served.child.try_wait().unwrap() {
            panic!("berth exited while starting: {status}\n{}", served.log());
        }
        Err("not ready".to_string())
    })
    .await;
    served.into_inner()
}

async fn call(app: &TestApp, served: &Served, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
    let mut req = app
        .client
        .request(method, format!("{}/api/v1{path}", served.base))
        .bearer_auth(&app.admin)
        .timeout(Duration::from_secs(30));
    if let Some(b) = body {
        req = req.json(&b);
    }
    let r = req.send().await.unwrap();
    let status = r.status();
    let v: Value = r.json().await.unwrap_or(Value::Null);
    assert!(status.is_success(), "{path}: {status} {v}");
    v
}

/// A session of `profile` on a fresh task over a fresh repository, launched with `prompt`.
async fn session(app: &TestApp, served: &Served, ws: Uuid, name: &str, profile: &str, prompt: &str) -> Uuid {
    let source = git_repo(&app.scratch.path().join(name), "main");
    let post = reqwest::Method::POST;
    let repo = call(
        app,
        served,
        post.clone(),
        &format!("/workspaces/{ws}/repositories"),
        Some(json!({"path": source})),
    )
    .await;
    let task = call(
        app,
        served,
        post.clone(),
        &format!("/workspaces/{ws}/tasks"),
        Some(json!({"title": name, "repositories": [{"repository_id": id_of(&repo)}]})),
    )
    .await;
    let s = call(
        app,
        served,
        post,
        &format!("/tasks/{}/sessions", id_of(&task)),
        Some(json!({"executor_type": "worktree", "agent_profile": profile, "prompt": prompt})),
    )
    .await;
    id_of(&s)
}

async fn wait_state(app: &TestApp, served: &Served, id: Uuid, state: &str) -> Value {
    wait_until_every(&format!("session {id} {state}"), WAIT, EVERY, || async {
        let s = call(app, served, reqwest::Method::GET, &format!("/sessions/{id}"), None).await;
        seen_json(s["state"] == state, s)
    })
    .await
}

/// The live (not zombie) processes started for a session: its agent and what the agent started, all
/// carrying `BERTH_SESSION_ID` in their environment.
fn processes_of(session: Uuid) -> Vec<u32> {
    let mark = format!("BERTH_SESSION_ID={session}");
    let mut out: Vec<u32> = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| crate::agents::pid_alive(i64::from(*pid)))
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/environ"))
                .is_ok_and(|env| env.split(|b| *b == 0).any(|v| v == mark.as_bytes()))
        })
        .collect();
    out.sort();
    out
}

async fn wait_processes(session: Uuid, what: &str, pred: impl Fn(&[u32]) -> bool) -> Vec<u32> {
    wait_until_every(what, WAIT, EVERY, || async {
        let pids = processes_of(session);
        seen(pred(&pids), pids)
    })
    .await
}

fn leader(pid: u32) -> bool {
    // SAFETY: getpgid(2) reads a process attribute; no memory is involved.
    unsafe { libc::getpgid(pid as i32) == pid as i32 }
}

// (a) A client holding the stream gets `event: shutdown` (reconnect, no `id`, a `retry`) as its last
// frame, then the end of the body; the process exits 0 within the budget.
async fn sigterm_ends_every_stream_with_a_shutdown_frame(app: TestApp) {
    let env = settings(&app);
    let mut served = serve(&app, &env).await;
    let mut stream = app
        .client
        .get(format!("{}/api/v1/events/stream?after=0", served.base))
        .bearer_auth(&app.admin)
        .send()
        .await
        .unwrap();
    assert_eq!(stream.status(), 200);
    let deadline = tokio::time::Instant::now() + WAIT;
    let mut text = String::new();
    while !text.contains("event: ready\n") {
        let chunk = tokio::time::timeout_at(deadline, stream.chunk()).await;
        let chunk = chunk
            .expect("no `ready` frame")
            .unwrap()
            .expect("the stream ended before `ready`");
        text.push_str(&String::from_utf8_lossy(&chunk));
    }
    let before = text.len();
    let stopped = tokio::time::Instant::now();
    served.signal(libc::SIGTERM);
    let ended = loop {
        match tokio::time::timeout_at(stopped + BUDGET, stream.chunk()).await {
            Err(_) => panic!("the stream was still open after the budget: {:?}", &text[before..]),
            Ok(Ok(Some(chunk))) => text.push_str(&String::from_utf8_lossy(&chunk)),
            Ok(Ok(None)) => break Ok(()),
            Ok(Err(e)) => break Err(e),
        }
    };
    assert!(ended.is_ok(), "the body ends cleanly, not cut off: {ended:?}");
    let after = &text[before..];
    let frames: Vec<&str> = after.split("\n\n").filter(|f| !f.trim().is_empty()).collect();
    let last = *frames
        .last()
        .unwrap_or_else(|| panic!("no frame after SIGTERM: {after:?}"));
    let lines: Vec<&str> = last.lines().collect();
    assert_eq!(lines.first(), Some(&"event: shutdown"), "the last frame: {last:?}");
    assert!(
        lines.iter().all(|l| !l.starts_with("id:")),
        "no id moves Last-Event-ID: {last:?}"
    );
    let retry: u64 = lines
        .iter()
        .find_map(|l| l.strip_prefix("retry: "))
        .unwrap_or_else(|| panic!("a retry line: {last:?}"))
        .parse()
        .unwrap();
    assert!(retry > 0);
    let data: Value = serde_json::from_str(lines.iter().find_map(|l| l.strip_prefix("data: ")).unwrap()).unwrap();
    assert_eq!(data["reason"], "shutdown");
    assert_eq!(data["reconnect"], true);
    assert!(data["instance_id"].is_string(), "{data}");
    let status = served.exit(BUDGET + MARGIN).await;
    assert_eq!(status.code(), Some(0), "{}", served.log());
    assert!(stopped.elapsed() < BUDGET + MARGIN, "{:?}", stopped.elapsed());
}

// (b) An agent that ignores abort, the end of its stdin and SIGTERM is SIGKILLed, and berth exits 0, within
// a budget shorter than the agents' configured graces (the escalation is cut to fit).
async fn sigterm_kills_a_stubborn_agent_and_exits_within_the_budget(app: TestApp) {
    let env = settings(&app);
    let mut served = serve(&app, &env).await;
    let ws = workspace(&app, &served).await;
    let id = session(&app, &served, ws, "stubborn", "stubborn", "hang").await;
    // Running: the agent took the prompt and works (it hangs, ignoring abort).
    wait_state(&app, &served, id, "running").await;
    // In its box: bwrap's own process, the box's init and the agent.
    wait_processes(id, "the agent runs in its box", |p| p.len() == 3).await;
    let stopped = tokio::time::Instant::now();
    served.signal(libc::SIGTERM);
    let status = served.exit(BUDGET + 2 * MARGIN).await;
    let took = stopped.elapsed();
    let log = served.log();
    assert_eq!(status.code(), Some(0), "{log}");
    assert!(
        took < BUDGET + MARGIN,
        "berth took {took:?} for a {BUDGET:?} budget:\n{log}"
    );
    assert!(
        processes_of(id).is_empty(),
        "the agent and its box are gone when berth exits"
    );
    assert!(log.contains("agent ignored SIGTERM; sending SIGKILL"), "{log}");
}

// (c) berth is SIGKILLed with agents running. One agent ends with its stdin and leaves the tool it started
// in its group; another stays itself. The next start ends both groups before its server answers (restore
// runs first) and relaunches both sessions with new agents.
async fn a_start_after_sigkill_ends_the_leftover_groups_before_relaunching(app: TestApp) {
    let env = settings(&app);
    let mut served = serve(&app, &env).await;
    let ws = workspace(&app, &served).await;
    let tool = session(&app, &served, ws, "tool", "test", "child").await;
    let lingering = session(&app, &served, ws, "lingering", "lingering", "child").await;
    let boxed = session(&app, &served, ws, "boxed", "boxed_lingering", "child").await;
    let mut old = Vec::new();
    for id in [tool, lingering] {
        wait_state(&app, &served, id, "idle").await;
        old.extend(wait_processes(id, "the agent and its tool run", |p| p.len() == 2).await);
    }
    // In its box: bwrap, the box's init, the agent and its tool.
    wait_state(&app, &served, boxed, "idle").await;
    old.extend(wait_processes(boxed, "the boxed agent and its tool run", |p| p.len() == 4).await);
    served.signal(libc::SIGKILL);
    served.exit(WAIT).await;
    // The first agent ends when its stdin closes; its tool runs on without it. The second stays.
    let left = wait_processes(tool, "only the tool is left", |p| p.len() == 1).await;
    assert!(!leader(left[0]), "what is left is the tool, not the agent");
    assert_eq!(
        processes_of(lingering).len(),
        2,
        "the lingering agent and its tool run on"
    );
    assert_eq!(
        processes_of(boxed).len(),
        4,
        "the boxed agent, its box and its tool run on"
    );
    drop(served);

    let served = serve(&app, &env).await;
    // Ready means restore ran: nothing of the old groups is left, without waiting.
    let still: Vec<u32> = old
        .iter()
        .copied()
        .filter(|p| crate::agents::pid_alive(i64::from(*p)))
        .collect();
    assert!(
        still.is_empty(),
        "left running after restore: {still:?}\n{}",
        served.log()
    );
    for id in [tool, lingering, boxed] {
        let s = wait_state(&app, &served, id, "idle").await;
        assert_eq!(s["desired_open"], true);
        let now = wait_processes(id, "a new agent", |p| !p.is_empty()).await;
        assert!(now.iter().all(|p| !old.contains(p)), "{now:?} vs {old:?}");
    }
    assert!(
        served.log().contains("ended an agent a previous berth left running"),
        "{}",
        served.log()
    );
    // And this one stops its new agents on SIGTERM (the lingering one needs the SIGKILL).
    let mut served = served;
    served.signal(libc::SIGTERM);
    assert_eq!(served.exit(BUDGET + MARGIN).await.code(), Some(0), "{}", served.log());
    for id in [tool, lingering, boxed] {
        assert!(processes_of(id).is_empty(), "an agent outlived berth's shutdown");
    }
}

/// A workspace made through the served process.
async fn workspace(app: &TestApp, served: &Served) -> Uuid {
    id_of(
        &call(
            app,
            served,
            reqwest::Method::POST,
            "/workspaces",
            Some(json!({"name": "ws"})),
        )
        .await,
    )
}
