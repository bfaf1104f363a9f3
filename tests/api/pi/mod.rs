//! The real Pi (the pinned 0.73.1, `--mode rpc`) run offline against the scripted model server. The
//! `pi_*` tests drive Pi directly, without berth: they pin the behaviours of Pi that berth relies on
//! (conversation files, queues, abort, extension dialogs and notices). The `both_backends!` tests go
//! through the real berth server on both databases and prove berth's Pi support with the model server as
//! the witness: each request it receives carries the whole conversation Pi sent.
//!
//! Pi comes from `BERTH_TEST_PI`, else `tests/pi/node_modules/.bin/pi` (`.ci/pi` installs it). Without it
//! the tests pass without running and say so on stderr; with `CI` set a missing Pi is a failure.
//!
//! This module holds what they share: Pi for a test, and the helpers of the berth tests (other test files
//! use them too); the tests are in the submodules, by concern.
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Once;
use std::time::Duration;

use serde_json::{Value, json};
use tempfile::TempDir;
use uuid::Uuid;

use crate::helpers::{TestApp, seen_json, wait_session_within, wait_until};
use crate::model_server::{ModelRequest, ModelServer, Outcome};

mod conversation;
mod dialogs;
mod pinned;
mod process;
mod queue;

/// Pi is node: starting it takes seconds, more on a loaded 2-core machine.
const WAIT: Duration = Duration::from_secs(60);
const PINNED: &str = "0.73.1";
const PROFILE: &str = "pi";
/// What the scripted model costs, US dollars per million tokens of input and output.
pub(crate) const PRICES: (f64, f64) = (3.0, 15.0);

static PI_MISSING: Once = Once::new();
static PI_VERSION: Once = Once::new();

/// The Pi binary for the tests, or `None` (with a notice past the test harness's output capture) when it is
/// not installed. With `CI` set a missing Pi panics: CI installs it with `.ci/pi`, never skips these tests.
pub fn pi_binary() -> Option<PathBuf> {
    let path = std::env::var_os("BERTH_TEST_PI")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/pi/node_modules/.bin/pi"));
    if !path.is_file() {
        let why = format!(
            "no Pi at {} (set BERTH_TEST_PI, or install the pinned Pi {PINNED} with .ci/pi)",
            path.display()
        );
        if std::env::var_os("CI").is_some_and(|v| !v.is_empty()) {
            panic!("CI is set but the real-Pi tests cannot run: {why}");
        }
        PI_MISSING.call_once(|| {
            let _ = writeln!(
                std::io::stderr(),
                "\nnote: the real-Pi tests did not run: {why}; they pass without running\n"
            );
        });
        return None;
    }
    // The behaviours pinned below are 0.73.1's; another version is worth a warning, not a refusal.
    let version = std::fs::canonicalize(&path)
        .ok()
        .and_then(|cli| Some(cli.parent()?.parent()?.join("package.json")))
        .and_then(|p| std::fs::read_to_string(p).ok())
        .and_then(|s| serde_json::from_str::<Value>(&s).ok())
        .and_then(|v| v["version"].as_str().map(str::to_string));
    if version.as_deref() != Some(PINNED) {
        PI_VERSION.call_once(|| {
            let _ = writeln!(
                std::io::stderr(),
                "\nwarning: {} is Pi {version:?}, the tests pin {PINNED} (.ci/pi installs it)\n",
                path.display()
            );
        });
    }
    Some(path)
}

/// A Pi for one test: the binary, the extension fixture, the scripted model server and an agent dir whose
/// `models.json` points at it (Pi's own settings and sessions never touch the user's `~/.pi`).
pub struct Pi {
    pub binary: PathBuf,
    pub extension: PathBuf,
    pub model: ModelServer,
    agent_dir: TempDir,
}

impl Pi {
    pub async fn start() -> Option<Pi> {
        let binary = pi_binary()?;
        let extension = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/pi/extensions/berth-test.ts");
        assert!(
            extension.is_file(),
            "the extension fixture is missing: {}",
            extension.display()
        );
        let model = ModelServer::start().await;
        let agent_dir = TempDir::new().unwrap();
        let models = json!({"providers": {"scripted": {
            "baseUrl": model.base_url(),
            "api": "openai-completions",
            "apiKey": "none",
            "compat": {"supportsDeveloperRole": false, "supportsReasoningEffort": false},
            // Prices (US dollars per million tokens) so that Pi reports a cost (tests/api/usage.rs).
            "models": [{
                "id": "echo",
                "reasoning": false,
                "cost": {"input": PRICES.0, "output": PRICES.1, "cacheRead": 0, "cacheWrite": 0},
            }],
        }}});
        std::fs::write(agent_dir.path().join("models.json"), models.to_string()).unwrap();
        Some(Pi {
            binary,
            extension,
            model,
            agent_dir,
        })
    }

    /// `--mode rpc` on the scripted model, with the extension fixture; berth appends `--session <file>`.
    pub fn args(&self) -> Vec<String> {
        [
            "--mode",
            "rpc",
            "--provider",
            "scripted",
            "--model",
            "echo",
            "-e",
            self.extension.to_str().unwrap(),
        ]
        .map(str::to_string)
        .to_vec()
    }

    pub fn env(&self) -> BTreeMap<String, String> {
        BTreeMap::from([
            (
                "PI_CODING_AGENT_DIR".to_string(),
                self.agent_dir.path().display().to_string(),
            ),
            ("PI_OFFLINE".to_string(), "1".to_string()),
        ])
    }

    /// The profile as an operator declares it: Pi's protocol.
    pub fn profile(&self) -> berth::config::AgentProfile {
        berth::config::AgentProfile {
            command: self.binary.display().to_string(),
            args: self.args(),
            env: self.env(),
            protocol: berth::config::AgentProtocol::Pi,
            pass_env: Vec::new(),
            mode: None,
            fs_read: None,
            mcp_servers: Vec::new(),
            // In its box: its agent directory (settings, models.json) and the scripted model server.
            writable_paths: vec![self.agent_dir.path().to_path_buf()],
            endpoints: vec![self.model.endpoint()],
            ..Default::default()
        }
    }
}

/// Replaces the app `both_backends!` made with one on the same backend that also has the `pi` profile
/// (and these extra settings). `None` when Pi is not installed (outside CI) or the backend is not configured.
pub(crate) async fn with_pi(app: TestApp, extra: &[(&str, &str)]) -> Option<(TestApp, Pi)> {
    let backend = app.backend;
    drop(app);
    let pi = Pi::start().await?;
    let app = TestApp::spawn_with_profiles(backend, extra, vec![(PROFILE.to_string(), pi.profile())]).await?;
    Some((app, pi))
}

fn texts(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs.iter().map(|(r, t)| (r.to_string(), t.to_string())).collect()
}

/// The header line of a Pi conversation file: `{"type":"session","version":3,"id":...}`.
fn conversation_header(file: &Path) -> Value {
    let text = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    serde_json::from_str(text.lines().next().unwrap_or_default())
        .unwrap_or_else(|e| panic!("{} has no JSON header ({e}): {text}", file.display()))
}

pub(crate) use crate::helpers::uuid;

/// Polls the session until `pred` holds (with a deadline of 60 s).
pub(crate) async fn wait_session(app: &TestApp, id: Uuid, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
    wait_session_within(app, id, WAIT, what, pred).await
}

pub(crate) async fn wait_snapshot(app: &TestApp, id: Uuid, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
    wait_until(
        &format!("the snapshot of session {id} to show {what}"),
        WAIT,
        || async {
            let s = app.get(&format!("/api/v1/sessions/{id}/snapshot")).await.ok(200);
            seen_json(pred(&s), s)
        },
    )
    .await
}

/// Posts a message (`delivery` `None`: the default, auto) and returns it as the 202 answered it.
pub(crate) async fn say(app: &TestApp, session: Uuid, text: &str, delivery: Option<&str>) -> Value {
    let mut body = json!({ "text": text });
    if let Some(d) = delivery {
        body["delivery"] = json!(d);
    }
    let m = app
        .post(&format!("/api/v1/sessions/{session}/messages"), body)
        .await
        .ok(202);
    assert_eq!(m["session_id"], session.to_string());
    assert_eq!(m["text"], text);
    assert_eq!(m["delivery"], delivery.unwrap_or("auto"));
    assert!(m["created_at"].is_string(), "{m}");
    m
}

pub(crate) async fn messages(app: &TestApp, session: Uuid) -> Vec<Value> {
    app.get(&format!("/api/v1/sessions/{session}/messages")).await.ok(200)["items"]
        .as_array()
        .unwrap()
        .clone()
}

/// Waits for a message of the inbox to be in `state`, and returns it.
pub(crate) async fn wait_message(app: &TestApp, session: Uuid, message: &Value, state: &str) -> Value {
    let what = format!("message {:?} to be {state}", message["text"]);
    wait_until(&what, WAIT, || async {
        let all = messages(app, session).await;
        let m = all
            .iter()
            .find(|m| m["id"] == message["id"])
            .unwrap_or_else(|| panic!("{} is not listed: {all:?}", message["id"]))
            .clone();
        seen_json(m["state"] == state, m)
    })
    .await
}

pub(crate) use crate::agents::pid_alive;

pub(crate) async fn execution_pid(app: &TestApp, execution: &Value) -> i64 {
    use sea_orm::EntityTrait;
    let e = berth::entity::agent_execution::Entity::find_by_id(uuid(execution))
        .one(app.db())
        .await
        .unwrap()
        .unwrap();
    e.pid.expect("the durable handle records the pid") as i64
}

pub(crate) async fn agent_session_ref(app: &TestApp, session: Uuid) -> Option<String> {
    use sea_orm::EntityTrait;
    berth::entity::task_session::Entity::find_by_id(session)
        .one(app.db())
        .await
        .unwrap()
        .unwrap()
        .agent_session_ref
}

/// Where berth keeps a Pi session's conversation.
fn conversation_file(app: &TestApp, session: Uuid) -> PathBuf {
    app.config
        .data_dir
        .join("conversations")
        .join(format!("{session}.jsonl"))
}

/// A workspace, a repository, a task and a worktree session on the `pi` profile, launched and idle.
pub(crate) async fn pi_session(app: &TestApp) -> Value {
    let f = app.task_with_repo("Real Pi").await;
    let s = f.agent(PROFILE).await;
    wait_session(app, uuid(&s["id"]), "idle after launch", |s| s["state"] == "idle").await
}

/// Sends `text` and waits for its turn to settle: the model answered request number `n`, the message is
/// `delivered`, the session is idle, and the conversation is recorded: `agent_session_ref` names the
/// conversation in the session's own file. Returns the request the model received.
async fn turn(app: &TestApp, pi: &Pi, session: Uuid, text: &str, n: usize) -> ModelRequest {
    let m = say(app, session, text, None).await;
    let request = pi.model.wait_request(n, Outcome::Completed, WAIT).await;
    assert_eq!(request.last_user_text(), text);
    wait_message(app, session, &m, "delivered").await;
    wait_session(app, session, "idle after the turn", |s| s["state"] == "idle").await;
    let file = conversation_file(app, session);
    let what = format!(
        "the conversation to be recorded (agent_session_ref set and {} written)",
        file.display()
    );
    wait_until(&what, WAIT, || async {
        let recorded = agent_session_ref(app, session).await;
        if recorded.is_some() && file.exists() {
            assert_eq!(
                recorded.as_deref(),
                conversation_header(&file)["id"].as_str(),
                "agent_session_ref is the id of the conversation in the session's file"
            );
            Ok(())
        } else {
            Err(format!(
                "agent_session_ref {recorded:?}, the file there: {}",
                file.exists()
            ))
        }
    })
    .await;
    request
}

/// What the model must receive after `first` was answered and `second` is sent.
fn continued(first: &str, second: &str) -> Vec<(String, String)> {
    texts(&[
        ("user", first),
        ("assistant", &format!("echo: {first}")),
        ("user", second),
    ])
}

/// A berth restarted on the same data dir and database (see `restart`); dropped before the `TestApp`.
pub(crate) struct Restarted {
    handle: actix_web::dev::ServerHandle,
    background: Vec<tokio::task::AbortHandle>,
}

impl Drop for Restarted {
    fn drop(&mut self) {
        for task in &self.background {
            task.abort();
        }
        std::mem::drop(self.handle.stop(false));
    }
}

/// Restarts berth: its agents stop as on a server stop (`desired_open` stays), its server and workers stop,
/// and a new berth starts on the same configuration, data dir and database; `app` then talks to the new one.
pub(crate) async fn restart(app: &mut TestApp) -> Restarted {
    app.app_state.ctx.runtime.stop_all().await;
    app.stop_server();
    let new = berth::startup::Application::build(app.config.clone())
        .await
        .expect("berth restarts");
    app.base = format!("http://127.0.0.1:{}", new.port());
    app.app_state = new.state.clone();
    let restarted = Restarted {
        handle: new.handle(),
        background: new.background(),
    };
    tokio::spawn(new.run_until_stopped());
    restarted
}

pub(crate) async fn stop(app: &TestApp, session: Uuid) {
    app.post(&format!("/api/v1/sessions/{session}/stop"), json!({}))
        .await
        .ok(200);
}
