//! The real Pi (the pinned 0.73.1, `--mode rpc`) run offline against the scripted model server. The
//! `pi_*` tests drive Pi directly, without berth: they pin the behaviours of Pi that berth relies on
//! (conversation files, queues, abort, extension dialogs and notices). The `both_backends!` tests go
//! through the real berth server on both databases and prove berth's Pi support with the model server as
//! the witness: each request it receives carries the whole conversation Pi sent.
//!
//! Pi comes from `BERTH_TEST_PI`, else `tests/pi/node_modules/.bin/pi` (`.ci/pi` installs it). Without it
//! the tests pass without running and say so on stderr; with `CI` set a missing Pi is a failure.
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex, Once};
use std::time::Duration;

use serde_json::{Value, json};
use tempfile::TempDir;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use uuid::Uuid;

use crate::both_backends;
use crate::helpers::TestApp;
use crate::model_server::{Gate, ModelRequest, ModelServer, Outcome, Reply};

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
            "models": [{"id": "echo", "reasoning": false, "cost": {"input": PRICES.0, "output": PRICES.1, "cacheRead": 0, "cacheWrite": 0}}],
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

// ---------------------------------------------------------------------------------------------------
// Pi on its own: a JSON-lines client over its stdin/stdout, as berth is one.

/// A Pi process in `--mode rpc`, spawned by the test. Every line it prints is kept, in order.
struct PiProcess {
    child: tokio::process::Child,
    stdin: tokio::process::ChildStdin,
    lines: tokio::sync::mpsc::UnboundedReceiver<Value>,
    seen: Vec<Value>,
    stderr: Arc<Mutex<String>>,
    next_id: u64,
}

impl PiProcess {
    async fn spawn(pi: &Pi, cwd: &Path, session: Option<&Path>) -> PiProcess {
        let mut cmd = tokio::process::Command::new(&pi.binary);
        cmd.args(pi.args());
        if let Some(file) = session {
            cmd.arg("--session").arg(file);
        }
        let mut child = cmd
            .envs(pi.env())
            .current_dir(cwd)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("Pi starts");
        let stdin = child.stdin.take().unwrap();
        let (tx, lines) = tokio::sync::mpsc::unbounded_channel();
        // RPC framing is LF-delimited JSON (rpc.md): split on '\n' only.
        let mut out = BufReader::new(child.stdout.take().unwrap()).lines();
        tokio::spawn(async move {
            while let Ok(Some(line)) = out.next_line().await {
                let v = serde_json::from_str(&line).unwrap_or_else(|_| json!({"type": "<not json>", "line": line}));
                if tx.send(v).is_err() {
                    return;
                }
            }
        });
        let stderr = Arc::new(Mutex::new(String::new()));
        {
            let stderr = stderr.clone();
            let mut err = BufReader::new(child.stderr.take().unwrap()).lines();
            tokio::spawn(async move {
                while let Ok(Some(line)) = err.next_line().await {
                    let mut s = stderr.lock().unwrap();
                    s.push_str(&line);
                    s.push('\n');
                }
            });
        }
        PiProcess {
            child,
            stdin,
            lines,
            seen: Vec::new(),
            stderr,
            next_id: 0,
        }
    }

    async fn send(&mut self, command: Value) {
        let mut line = command.to_string();
        line.push('\n');
        self.stdin.write_all(line.as_bytes()).await.expect("Pi reads its stdin");
        self.stdin.flush().await.unwrap();
    }

    /// The next line satisfying `pred` (every line read on the way is kept in `seen`).
    async fn until(&mut self, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let line = match tokio::time::timeout_at(deadline, self.lines.recv()).await {
                Ok(Some(line)) => line,
                Ok(None) => panic!("Pi exited before {what}; stderr: {}", self.stderr.lock().unwrap()),
                Err(_) => panic!(
                    "Pi sent no {what} within {WAIT:?}; last lines: {:#?}; stderr: {}",
                    &self.seen[self.seen.len().saturating_sub(10)..],
                    self.stderr.lock().unwrap()
                ),
            };
            self.seen.push(line.clone());
            if pred(&line) {
                return line;
            }
        }
    }

    /// The next line of this `type`.
    async fn next_of(&mut self, kind: &str) -> Value {
        self.until(kind, |l| l["type"] == kind).await
    }

    /// Sends a command with a fresh id and returns its response.
    async fn call(&mut self, mut command: Value) -> Value {
        self.next_id += 1;
        let id = format!("t{}", self.next_id);
        command["id"] = json!(id);
        self.send(command).await;
        self.until(&format!("response {id}"), |l| l["type"] == "response" && l["id"] == id)
            .await
    }

    /// `call`, asserting success; returns `data`.
    async fn ok(&mut self, command: Value) -> Value {
        let r = self.call(command.clone()).await;
        assert_eq!(r["success"], true, "{command} failed: {r}");
        r["data"].clone()
    }

    /// The lines seen since index `from`, with their types.
    fn types_since(&self, from: usize) -> Vec<String> {
        self.seen[from..]
            .iter()
            .map(|l| l["type"].as_str().unwrap_or_default().to_string())
            .collect()
    }

    /// SIGKILL, as a crash.
    async fn kill(mut self) {
        self.child.kill().await.unwrap();
    }
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

// Without berth: the model server and the extension against the real Pi. Pi streams the echo in chunks,
// its second request carries the first turn, and a relaunch on the same `--session` file after a SIGKILL
// continues that conversation (the file is created lazily, after the first message).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pi_speaks_to_the_scripted_model_server() {
    let Some(pi) = Pi::start().await else { return };
    let dir = TempDir::new().unwrap();
    let file = dir.path().join("conversation.jsonl");
    let mut p = PiProcess::spawn(&pi, dir.path(), Some(&file)).await;
    let state = p.ok(json!({"type": "get_state"})).await;
    assert_eq!(state["sessionFile"], file.display().to_string());
    assert_eq!(state["model"]["id"], "echo");
    assert_eq!(state["model"]["provider"], "scripted");
    assert_eq!(state["isStreaming"], false);
    let session_id = state["sessionId"]
        .as_str()
        .expect("a session id before any message")
        .to_string();
    assert!(
        !file.exists(),
        "Pi writes its conversation file only after the first message"
    );
    // The extension is loaded with -e: its commands are listed.
    let commands = p.ok(json!({"type": "get_commands"})).await;
    let mut names: Vec<&str> = commands["commands"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["source"] == "extension")
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["confirm-me", "notice"]);

    let from = p.seen.len();
    p.ok(json!({"type": "prompt", "message": "hello there"})).await;
    let end = p.next_of("agent_end").await;
    let deltas: Vec<&str> = p.seen[from..]
        .iter()
        .filter(|l| l["type"] == "message_update" && l["assistantMessageEvent"]["type"] == "text_delta")
        .map(|l| l["assistantMessageEvent"]["delta"].as_str().unwrap())
        .collect();
    assert!(deltas.len() >= 2, "streamed in several chunks: {deltas:?}");
    assert_eq!(deltas.concat(), "echo: hello there");
    let last = end["messages"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(last["role"], "assistant");
    assert_eq!(last["content"][0]["text"], "echo: hello there");
    assert_eq!(last["stopReason"], "stop");
    let first = pi.model.wait_request(1, Outcome::Completed, WAIT).await;
    assert_eq!(first.conversation(), texts(&[("user", "hello there")]));
    assert_eq!(first.body["model"], "echo");

    p.ok(json!({"type": "prompt", "message": "second"})).await;
    p.next_of("agent_end").await;
    let second = pi.model.wait_request(2, Outcome::Completed, WAIT).await;
    assert_eq!(
        second.conversation(),
        texts(&[
            ("user", "hello there"),
            ("assistant", "echo: hello there"),
            ("user", "second")
        ]),
        "the second request carries the first turn"
    );
    let header = conversation_header(&file);
    assert_eq!(header["type"], "session");
    assert_eq!(header["version"], 3);
    assert_eq!(
        header["id"],
        session_id.as_str(),
        "the file is the conversation get_state named"
    );

    // A crash, then a relaunch on the same file: the same conversation goes on.
    p.kill().await;
    let mut p = PiProcess::spawn(&pi, dir.path(), Some(&file)).await;
    let state = p.ok(json!({"type": "get_state"})).await;
    assert_eq!(state["sessionId"], session_id.as_str());
    assert_eq!(state["messageCount"], 4);
    p.ok(json!({"type": "prompt", "message": "third"})).await;
    p.next_of("agent_end").await;
    let third = pi.model.wait_request(3, Outcome::Completed, WAIT).await;
    assert_eq!(
        third.conversation(),
        texts(&[
            ("user", "hello there"),
            ("assistant", "echo: hello there"),
            ("user", "second"),
            ("assistant", "echo: second"),
            ("user", "third"),
        ])
    );
    p.kill().await;
}

// Why berth checks a recorded conversation before launching: given a missing or a corrupt `--session` file,
// Pi silently starts a new conversation (and overwrites the corrupt file).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pi_silently_replaces_a_missing_or_corrupt_conversation() {
    let Some(pi) = Pi::start().await else { return };
    let dir = TempDir::new().unwrap();
    let file = dir.path().join("conversation.jsonl");
    let mut p = PiProcess::spawn(&pi, dir.path(), Some(&file)).await;
    let original = p.ok(json!({"type": "get_state"})).await["sessionId"].clone();
    p.ok(json!({"type": "prompt", "message": "remember me"})).await;
    p.next_of("agent_end").await;
    p.kill().await;
    assert_eq!(conversation_header(&file)["id"], original);

    std::fs::write(&file, "this is not a conversation\n").unwrap();
    let mut p = PiProcess::spawn(&pi, dir.path(), Some(&file)).await;
    let state = p.ok(json!({"type": "get_state"})).await;
    assert_ne!(state["sessionId"], original, "a corrupt file: a new conversation");
    assert_eq!(state["messageCount"], 0);
    p.ok(json!({"type": "prompt", "message": "fresh"})).await;
    p.next_of("agent_end").await;
    let fresh = pi.model.wait_request(2, Outcome::Completed, WAIT).await;
    assert_eq!(
        fresh.conversation(),
        texts(&[("user", "fresh")]),
        "the model saw nothing earlier"
    );
    p.kill().await;
    assert_eq!(
        conversation_header(&file)["id"],
        state["sessionId"],
        "the corrupt file was overwritten"
    );

    let missing = dir.path().join("missing.jsonl");
    let mut p = PiProcess::spawn(&pi, dir.path(), Some(&missing)).await;
    let state = p.ok(json!({"type": "get_state"})).await;
    assert_eq!(state["messageCount"], 0, "a missing file: a new, empty conversation");
    assert_eq!(state["sessionFile"], missing.display().to_string());
    p.kill().await;
}

// While Pi streams: a plain prompt is refused (the message berth used to drop), `follow_up` and `steer`
// queue (`queue_update`), the steer runs as the next turn and the follow-up after it, all in one agent run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pi_queues_steers_and_follow_ups_while_it_streams() {
    let Some(pi) = Pi::start().await else { return };
    let dir = TempDir::new().unwrap();
    let mut p = PiProcess::spawn(&pi, dir.path(), Some(&dir.path().join("c.jsonl"))).await;
    let gate = Gate::new();
    pi.model.reply_to("first", Reply::echo().gated(&gate));
    let from = p.seen.len();
    p.ok(json!({"type": "prompt", "message": "first"})).await;
    pi.model.wait_request(1, Outcome::Held, WAIT).await;
    let refused = p.call(json!({"type": "prompt", "message": "plain"})).await;
    assert_eq!(refused["success"], false);
    assert!(
        refused["error"].as_str().unwrap().contains("already processing"),
        "{refused}"
    );
    p.ok(json!({"type": "follow_up", "message": "later"})).await;
    p.ok(json!({"type": "steer", "message": "now"})).await;
    // Each queue change is a `queue_update` (printed before the command's response).
    assert!(
        p.seen.iter().any(|l| l["type"] == "queue_update"
            && l["steering"] == json!(["now"])
            && l["followUp"] == json!(["later"])),
        "{:#?}",
        p.seen
    );
    let state = p.ok(json!({"type": "get_state"})).await;
    assert_eq!(state["isStreaming"], true);
    assert_eq!(state["pendingMessageCount"], 2);
    assert_eq!(pi.model.requests().len(), 1, "nothing queued reached the model yet");

    gate.release();
    p.next_of("agent_end").await;
    let requests = pi
        .model
        .wait_until("three completed requests", WAIT, |r| {
            r.len() == 3 && r.iter().all(|r| r.outcome == Outcome::Completed)
        })
        .await;
    assert_eq!(
        requests[1].conversation(),
        texts(&[("user", "first"), ("assistant", "echo: first"), ("user", "now")]),
        "the steer went first"
    );
    assert_eq!(
        requests[2].conversation(),
        texts(&[
            ("user", "first"),
            ("assistant", "echo: first"),
            ("user", "now"),
            ("assistant", "echo: now"),
            ("user", "later"),
        ]),
        "the follow-up after it"
    );
    assert!(
        !requests.iter().any(|r| r.mentions("plain")),
        "the refused prompt never reached the model"
    );
    let types = p.types_since(from);
    let count = |t: &str| types.iter().filter(|x| *x == t).count();
    assert_eq!(
        (count("agent_start"), count("turn_start"), count("agent_end")),
        (1, 3, 1),
        "one agent run holds the three turns: {types:?}"
    );
    p.kill().await;
}

// Pi's `abort`: the model request is dropped mid-reply (the model server survives it), `agent_end` comes
// before the abort's response, Pi stays alive and idle, and it keeps its own follow-up queue: the
// follow-up runs after the next prompt. The aborted partial reply is not sent to the model again. This is
// why berth holds follow-ups itself until a turn settles.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pi_abort_drops_the_request_and_keeps_its_own_follow_up_queue() {
    let Some(pi) = Pi::start().await else { return };
    let dir = TempDir::new().unwrap();
    let mut p = PiProcess::spawn(&pi, dir.path(), Some(&dir.path().join("c.jsonl"))).await;
    let gate = Gate::new();
    pi.model.reply_to("first", Reply::echo().gated(&gate));
    p.ok(json!({"type": "prompt", "message": "first"})).await;
    pi.model.wait_request(1, Outcome::Held, WAIT).await;
    p.ok(json!({"type": "follow_up", "message": "kept"})).await;
    let from = p.seen.len();
    p.ok(json!({"type": "abort"})).await;
    // `ok` returns at the abort's response: the run had ended by then.
    let types = p.types_since(from);
    assert!(
        types.contains(&"agent_end".to_string()),
        "agent_end before the response: {types:?}"
    );
    let aborted = p.seen[from..]
        .iter()
        .find(|l| l["type"] == "message_end" && l["message"]["role"] == "assistant")
        .expect("the partial reply ends")
        .clone();
    assert_eq!(aborted["message"]["stopReason"], "aborted");
    pi.model.wait_request(1, Outcome::Dropped, WAIT).await;
    let state = p.ok(json!({"type": "get_state"})).await;
    assert_eq!(state["isStreaming"], false);
    assert_eq!(state["pendingMessageCount"], 1, "abort kept Pi's follow-up queue");
    assert!(p.child.try_wait().unwrap().is_none(), "Pi is alive");

    p.ok(json!({"type": "prompt", "message": "next"})).await;
    let requests = pi
        .model
        .wait_until("three requests", WAIT, |r| {
            r.len() == 3 && r[2].outcome == Outcome::Completed
        })
        .await;
    assert_eq!(
        requests[1].conversation(),
        texts(&[("user", "first"), ("user", "next")]),
        "the aborted partial reply is not sent again"
    );
    assert_eq!(
        requests[2].last_user_text(),
        "kept",
        "the old follow-up ran after the next prompt"
    );
    p.kill().await;
}

// The extension fixture over RPC. Commands sent as `prompt` run at once, even while Pi streams, and never
// call the model. `/notice` sends notify, setStatus and setTitle and needs no answer. `/confirm-me` sends
// a `confirm` request and waits: meanwhile Pi answers other commands, and the prompt's response comes only
// after the dialog is answered; the answer (or a cancel) reaches the extension, which notifies it. A
// response with an unknown id is ignored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pi_extension_dialogs_and_notices_over_rpc() {
    let Some(pi) = Pi::start().await else { return };
    let dir = TempDir::new().unwrap();
    let mut p = PiProcess::spawn(&pi, dir.path(), Some(&dir.path().join("c.jsonl"))).await;
    p.ok(json!({"type": "get_state"})).await;

    let from = p.seen.len();
    p.ok(json!({"type": "prompt", "message": "/notice hello"})).await;
    let ui: Vec<Value> = p.seen[from..]
        .iter()
        .filter(|l| l["type"] == "extension_ui_request")
        .cloned()
        .collect();
    let methods: Vec<&str> = ui.iter().map(|l| l["method"].as_str().unwrap()).collect();
    assert_eq!(methods, ["notify", "setStatus", "setTitle"]);
    assert!(
        ui.iter().all(|l| l["id"].is_string()),
        "fire-and-forget requests carry ids too"
    );
    assert_eq!(ui[0]["message"], "hello");
    assert_eq!(ui[0]["notifyType"], "info");
    assert_eq!(
        (&ui[1]["statusKey"], &ui[1]["statusText"]),
        (&json!("berth-test"), &json!("status: hello"))
    );
    assert_eq!(ui[2]["title"], "title: hello");
    assert!(
        !p.types_since(from).contains(&"agent_start".to_string()),
        "no agent run"
    );

    p.send(json!({"id": "dialog", "type": "prompt", "message": "/confirm-me Ship it?"}))
        .await;
    let ask = p.next_of("extension_ui_request").await;
    assert_eq!(ask["method"], "confirm");
    assert_eq!(ask["title"], "Ship it?");
    assert_eq!(ask["message"], "berth test dialog");
    let from = p.seen.len();
    let state = p.ok(json!({"type": "get_state"})).await;
    assert_eq!(state["isStreaming"], false, "a dialog is not a turn");
    assert!(
        !p.seen[from..].iter().any(|l| l["id"] == "dialog"),
        "the prompt's response waits for the dialog"
    );
    p.send(json!({"type": "extension_ui_response", "id": "nope", "confirmed": true}))
        .await;
    p.send(json!({"type": "extension_ui_response", "id": ask["id"], "confirmed": true}))
        .await;
    let told = p.next_of("extension_ui_request").await;
    assert_eq!(
        (&told["method"], &told["message"]),
        (&json!("notify"), &json!("confirmed: true"))
    );
    let done = p.until("the prompt's response", |l| l["id"] == "dialog").await;
    assert_eq!(done["success"], true);
    assert!(
        !p.seen.iter().any(|l| l["id"] == "nope"),
        "an unknown dialog id gets no answer"
    );

    p.send(json!({"type": "prompt", "message": "/confirm-me Again?"})).await;
    let ask = p.next_of("extension_ui_request").await;
    p.send(json!({"type": "extension_ui_response", "id": ask["id"], "cancelled": true}))
        .await;
    let told = p.next_of("extension_ui_request").await;
    assert_eq!(told["message"], "confirmed: false", "a cancelled confirm is false");

    // While streaming, an extension command runs at once.
    let gate = Gate::new();
    pi.model.reply_to("long", Reply::echo().gated(&gate));
    p.ok(json!({"type": "prompt", "message": "long"})).await;
    pi.model.wait_request(1, Outcome::Held, WAIT).await;
    p.ok(json!({"type": "prompt", "message": "/notice mid-turn"})).await;
    assert_eq!(
        pi.model.requests()[0].outcome,
        Outcome::Held,
        "the command ran inside the turn"
    );
    assert!(
        p.seen
            .iter()
            .any(|l| l["method"] == "notify" && l["message"] == "mid-turn")
    );
    gate.release();
    p.next_of("agent_end").await;
    assert_eq!(
        pi.model.requests().len(),
        1,
        "extension commands never called the model"
    );
    p.kill().await;
}

// ---------------------------------------------------------------------------------------------------
// Through berth, both databases.

both_backends!(
    a_pi_conversation_survives_a_berth_restart,
    a_pi_conversation_survives_a_crash_of_the_agent,
    a_pi_conversation_survives_stop_and_resume,
    a_follow_up_sent_mid_turn_reaches_the_model_after_the_turn,
    a_steer_reaches_the_model_inside_the_turn_ahead_of_follow_ups,
    abort_cancels_queued_messages_and_keeps_the_agent,
    a_confirm_dialog_asks_for_attention_and_the_answer_reaches_the_agent,
    notices_from_pi_leave_the_state_alone,
    a_missing_or_corrupt_conversation_is_refused_never_replaced,
);

pub(crate) fn uuid(v: &Value) -> Uuid {
    v.as_str()
        .unwrap_or_else(|| panic!("not a string: {v}"))
        .parse()
        .unwrap()
}

pub(crate) async fn wait_session(app: &TestApp, id: Uuid, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let s = app.get(&format!("/api/v1/sessions/{id}")).await.ok(200);
        if pred(&s) {
            return s;
        }
        assert!(tokio::time::Instant::now() < deadline, "session never {what}: {s}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

pub(crate) async fn wait_snapshot(app: &TestApp, id: Uuid, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let s = app.get(&format!("/api/v1/sessions/{id}/snapshot")).await.ok(200);
        if pred(&s) {
            return s;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the snapshot never showed {what}: {s}"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
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
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let all = messages(app, session).await;
        let m = all
            .iter()
            .find(|m| m["id"] == message["id"])
            .unwrap_or_else(|| panic!("{} is not listed: {all:?}", message["id"]))
            .clone();
        if m["state"] == state {
            return m;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "message {:?} never {state}: {m}",
            message["text"]
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

pub(crate) fn pid_alive(pid: i64) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
        && !std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .unwrap_or_default()
            .contains(") Z ")
}

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
    let ws = app.workspace("ws").await;
    let (repo, _) = app.repository(ws, "svc").await;
    let task = app.task(ws, "Real Pi", &[repo]).await;
    let s = app
        .post(
            &format!("/api/v1/tasks/{task}/sessions"),
            json!({"executor_type": "worktree", "agent_profile": PROFILE}),
        )
        .await
        .ok(201);
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
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let recorded = agent_session_ref(app, session).await;
        if recorded.is_some() && file.exists() {
            assert_eq!(
                recorded.as_deref(),
                conversation_header(&file)["id"].as_str(),
                "agent_session_ref is the id of the conversation in the session's file"
            );
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the conversation was never recorded: ref {recorded:?}, file {} exists: {}",
            file.display(),
            file.exists()
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
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

// I26, I29: after a berth restart the open session is relaunched (a new execution) on its own conversation
// file, and the model receives the earlier turn with the next message.
async fn a_pi_conversation_survives_a_berth_restart(app: TestApp) {
    let Some((mut app, pi)) = with_pi(app, &[]).await else {
        return;
    };
    let s = pi_session(&app).await;
    let id = uuid(&s["id"]);
    turn(&app, &pi, id, "before the restart", 1).await;
    let recorded = agent_session_ref(&app, id).await;
    let old_pid = execution_pid(&app, &s["execution_id"]).await;
    let restarted = restart(&mut app).await;
    assert!(!pid_alive(old_pid), "the first berth's Pi is gone");
    let back = wait_session(&app, id, "relaunched", |v| {
        v["state"] == "idle" && v["execution_id"].is_string() && v["execution_id"] != s["execution_id"]
    })
    .await;
    assert!(pid_alive(execution_pid(&app, &back["execution_id"]).await));
    let after = turn(&app, &pi, id, "after the restart", 2).await;
    assert_eq!(
        after.conversation(),
        continued("before the restart", "after the restart")
    );
    assert_eq!(agent_session_ref(&app, id).await, recorded, "the same conversation");
    stop(&app, id).await;
    drop(restarted);
}

// I30: SIGKILL of the agent; berth restarts it (recovering, a new execution) on the same conversation
// file, and the model receives the earlier turn.
async fn a_pi_conversation_survives_a_crash_of_the_agent(app: TestApp) {
    let Some((app, pi)) = with_pi(app, &[("BERTH_AGENT_RESTART_BACKOFF_MS", "10")]).await else {
        return;
    };
    let s = pi_session(&app).await;
    let id = uuid(&s["id"]);
    turn(&app, &pi, id, "before the crash", 1).await;
    let recorded = agent_session_ref(&app, id).await;
    let pid = execution_pid(&app, &s["execution_id"]).await;
    // SAFETY: kill(2) on the pid of the agent this test's berth started; no memory is involved.
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGKILL) }, 0);
    let back = wait_session(&app, id, "restarted after the crash", |v| {
        v["state"] == "idle" && v["execution_id"].is_string() && v["execution_id"] != s["execution_id"]
    })
    .await;
    assert_eq!(back["workspace_path"], s["workspace_path"]);
    let page = app.get("/api/v1/events?after=0&limit=1000").await.ok(200);
    assert!(
        page["events"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["type"] == "session.state_changed"
                && e["session_id"] == id.to_string()
                && e["data"]["state"] == "recovering"),
        "the restart went through recovering"
    );
    let after = turn(&app, &pi, id, "after the crash", 2).await;
    assert_eq!(after.conversation(), continued("before the crash", "after the crash"));
    assert_eq!(agent_session_ref(&app, id).await, recorded);
    stop(&app, id).await;
}

// I27, I28: stop keeps the conversation; resume, and launch after another stop, continue it; deleting the
// session deletes it.
async fn a_pi_conversation_survives_stop_and_resume(app: TestApp) {
    let Some((app, pi)) = with_pi(app, &[]).await else {
        return;
    };
    let s = pi_session(&app).await;
    let id = uuid(&s["id"]);
    turn(&app, &pi, id, "one", 1).await;
    let recorded = agent_session_ref(&app, id).await;
    let pid = execution_pid(&app, &s["execution_id"]).await;
    let dir = conversation_file(&app, id).parent().unwrap().to_path_buf();
    let mode = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&dir).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o700, "conversations are owner-only");
    // I27: resuming a live session returns it as it is, no second process.
    let same = app
        .post(&format!("/api/v1/sessions/{id}/resume"), json!({}))
        .await
        .ok(200);
    assert_eq!(same["execution_id"], s["execution_id"]);
    assert_eq!(app.app_state.ctx.runtime.live_count(), 1);
    stop(&app, id).await;
    assert!(!pid_alive(pid));
    assert!(conversation_file(&app, id).exists(), "stop keeps the conversation");
    app.post(&format!("/api/v1/sessions/{id}/resume"), json!({}))
        .await
        .ok(200);
    wait_session(&app, id, "idle after resume", |v| v["state"] == "idle").await;
    let two = turn(&app, &pi, id, "two", 2).await;
    assert_eq!(two.conversation(), continued("one", "two"));
    stop(&app, id).await;
    app.post(&format!("/api/v1/sessions/{id}/launch"), json!({}))
        .await
        .ok(200);
    wait_session(&app, id, "idle after launch", |v| v["state"] == "idle").await;
    let three = turn(&app, &pi, id, "three", 3).await;
    assert_eq!(
        three.conversation(),
        texts(&[
            ("user", "one"),
            ("assistant", "echo: one"),
            ("user", "two"),
            ("assistant", "echo: two"),
            ("user", "three"),
        ])
    );
    assert_eq!(agent_session_ref(&app, id).await, recorded);
    stop(&app, id).await;
    // The conversation is session data: deleting the session deletes it (the worktree stays).
    app.delete(&format!("/api/v1/sessions/{id}")).await.ok(204);
    assert!(
        !conversation_file(&app, id).exists(),
        "the conversation file went with the session"
    );
    assert!(Path::new(s["workspace_path"].as_str().unwrap()).is_dir());
}

/// Sends `first` with a gated reply and waits until the turn runs: the model holds it, berth says `running`.
async fn gated_turn(app: &TestApp, pi: &Pi, session: Uuid, first: &str) -> Gate {
    let gate = Gate::new();
    pi.model.reply_to(first, Reply::echo().gated(&gate));
    say(app, session, first, None).await;
    pi.model.wait_request(1, Outcome::Held, WAIT).await;
    wait_session(app, session, "running", |v| v["state"] == "running").await;
    gate
}

// Messages sent while Pi works are held in berth's inbox (`queued`) and reach the model after the turn,
// one turn each, in order; none is refused or lost.
async fn a_follow_up_sent_mid_turn_reaches_the_model_after_the_turn(app: TestApp) {
    let Some((app, pi)) = with_pi(app, &[]).await else {
        return;
    };
    let id = uuid(&pi_session(&app).await["id"]);
    let gate = gated_turn(&app, &pi, id, "first").await;
    let auto = say(&app, id, "second", None).await;
    let follow = say(&app, id, "third", Some("follow_up")).await;
    let withdrawn = say(&app, id, "withdrawn", None).await;
    assert_eq!(auto["state"], "queued", "held while the agent works: {auto}");
    assert_eq!(follow["state"], "queued", "{follow}");
    let d = app
        .delete(&format!("/api/v1/sessions/{id}/messages/{}", uuid(&withdrawn["id"])))
        .await
        .ok(200);
    assert_eq!(d["state"], "cancelled", "{d}");
    let snap = app.get(&format!("/api/v1/sessions/{id}/snapshot")).await.ok(200);
    assert_eq!(snap["queue_length"], 2, "{snap}");
    assert_eq!(pi.model.requests().len(), 1, "nothing reached the model mid-turn");
    gate.release();
    let requests = pi
        .model
        .wait_until("three completed requests", WAIT, |r| {
            r.len() == 3 && r.iter().all(|r| r.outcome == Outcome::Completed)
        })
        .await;
    assert_eq!(requests[1].conversation(), continued("first", "second"));
    assert_eq!(
        requests[2].conversation(),
        texts(&[
            ("user", "first"),
            ("assistant", "echo: first"),
            ("user", "second"),
            ("assistant", "echo: second"),
            ("user", "third"),
        ])
    );
    wait_message(&app, id, &auto, "delivered").await;
    wait_message(&app, id, &follow, "delivered").await;
    wait_session(&app, id, "idle", |v| v["state"] == "idle").await;
    let snap = app.get(&format!("/api/v1/sessions/{id}/snapshot")).await.ok(200);
    assert_eq!(snap["queue_length"], 0);
    assert_eq!(
        pi.model.requests().len(),
        3,
        "the withdrawn message never reached the model"
    );
    app.delete(&format!("/api/v1/sessions/{id}/messages/{}", uuid(&auto["id"])))
        .await
        .problem(409, "conflict");
    let page = app.get("/api/v1/events?after=0&limit=1000").await.ok(200);
    let updates: Vec<&str> = page["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["type"] == "session.message_updated" && e["data"]["message"]["id"] == auto["id"])
        .map(|e| e["data"]["message"]["state"].as_str().unwrap())
        .collect();
    assert_eq!(
        updates.last(),
        Some(&"delivered"),
        "each change is an event: {updates:?}"
    );
    stop(&app, id).await;
}

// A steer is forwarded at once while Pi works (delivered mid-turn, counted in the queue from Pi's
// queue_update) and reaches the model before a follow-up that berth holds until the turn ends.
async fn a_steer_reaches_the_model_inside_the_turn_ahead_of_follow_ups(app: TestApp) {
    let Some((app, pi)) = with_pi(app, &[]).await else {
        return;
    };
    let id = uuid(&pi_session(&app).await["id"]);
    let gate = gated_turn(&app, &pi, id, "first").await;
    let follow = say(&app, id, "afterwards", Some("follow_up")).await;
    let steer = say(&app, id, "change course", Some("steer")).await;
    wait_message(&app, id, &steer, "delivered").await;
    let held = pi.model.requests();
    assert_eq!(held.len(), 1);
    assert_eq!(
        held[0].outcome,
        Outcome::Held,
        "the steer was delivered inside the turn"
    );
    assert_eq!(wait_message(&app, id, &follow, "queued").await["state"], "queued");
    wait_snapshot(&app, id, "one queued in berth and one in Pi", |s| {
        s["queue_length"] == 2
    })
    .await;
    gate.release();
    let requests = pi
        .model
        .wait_until("three completed requests", WAIT, |r| {
            r.len() == 3 && r.iter().all(|r| r.outcome == Outcome::Completed)
        })
        .await;
    assert_eq!(requests[1].conversation(), continued("first", "change course"));
    assert_eq!(requests[2].last_user_text(), "afterwards");
    assert!(
        requests[2].mentions("echo: change course"),
        "the follow-up came after the steer's turn"
    );
    wait_message(&app, id, &follow, "delivered").await;
    wait_session(&app, id, "idle", |v| v["state"] == "idle").await;
    stop(&app, id).await;
}

// Abort stops the turn at once (the model request is dropped), cancels what berth queued (never
// sent to the model), and leaves the session idle with the same agent alive.
async fn abort_cancels_queued_messages_and_keeps_the_agent(app: TestApp) {
    let Some((app, pi)) = with_pi(app, &[]).await else {
        return;
    };
    let s = pi_session(&app).await;
    let id = uuid(&s["id"]);
    let _gate = gated_turn(&app, &pi, id, "first").await;
    let queued = say(&app, id, "never sent", None).await;
    assert_eq!(queued["state"], "queued");
    let r = app
        .post(&format!("/api/v1/sessions/{id}/abort"), json!({}))
        .await
        .ok(200);
    assert_eq!(r["id"], id.to_string(), "abort answers the session");
    let cancelled = wait_message(&app, id, &queued, "cancelled").await;
    assert!(cancelled["reason"].is_string(), "{cancelled}");
    pi.model.wait_request(1, Outcome::Dropped, WAIT).await;
    let idle = wait_session(&app, id, "idle after abort", |v| v["state"] == "idle").await;
    assert_eq!(idle["execution_id"], s["execution_id"], "the same agent");
    assert!(pid_alive(execution_pid(&app, &s["execution_id"]).await));
    let snap = app.get(&format!("/api/v1/sessions/{id}/snapshot")).await.ok(200);
    assert_eq!(snap["queue_length"], 0, "{snap}");
    // The agent takes the next message.
    let after = say(&app, id, "after the abort", None).await;
    let request = pi.model.wait_request(2, Outcome::Completed, WAIT).await;
    assert_eq!(request.last_user_text(), "after the abort");
    assert!(request.mentions("first"), "the conversation goes on");
    wait_message(&app, id, &after, "delivered").await;
    wait_session(&app, id, "idle", |v| v["state"] == "idle").await;
    let all = pi.model.requests();
    assert_eq!(all.len(), 2, "nothing else reached the model");
    assert!(
        !all.iter().any(|r| r.mentions("never sent")),
        "the cancelled message was never sent"
    );
    stop(&app, id).await;
}

/// The texts of the snapshot's latest notifications (`agent.notifications`, each with a `message`).
fn notification_texts(snap: &Value) -> Vec<String> {
    snap["agent"]["notifications"]
        .as_array()
        .unwrap_or_else(|| panic!("no notifications in the snapshot: {snap}"))
        .iter()
        .filter_map(|n| n["message"].as_str().map(str::to_string))
        .collect()
}

// I31: Pi's `confirm` dialog puts the session in `attention`; the answer (the shape the method takes)
// reaches the extension, which notifies it; the session leaves attention. The command never calls the
// model.
async fn a_confirm_dialog_asks_for_attention_and_the_answer_reaches_the_agent(app: TestApp) {
    let Some((app, pi)) = with_pi(app, &[]).await else {
        return;
    };
    let id = uuid(&pi_session(&app).await["id"]);
    let m = say(&app, id, "/confirm-me Ship it?", None).await;
    wait_session(&app, id, "asking", |v| v["state"] == "attention").await;
    let snap = app.get(&format!("/api/v1/sessions/{id}/snapshot")).await.ok(200);
    let requests = snap["attention_requests"].as_array().unwrap();
    assert_eq!(requests.len(), 1, "{snap}");
    assert_eq!(requests[0]["method"], "confirm");
    assert_eq!(requests[0]["title"], "Ship it?");
    let request_id = requests[0]["id"].as_str().unwrap().to_string();
    app.post(
        &format!("/api/v1/sessions/{id}/attention/{request_id}"),
        json!({"confirmed": true}),
    )
    .await
    .ok(200);
    let snap = wait_snapshot(&app, id, "the answer notified back", |s| {
        notification_texts(s).contains(&"confirmed: true".to_string())
    })
    .await;
    assert!(snap["attention_requests"].as_array().unwrap().is_empty(), "{snap}");
    wait_session(&app, id, "idle after the answer", |v| v["state"] == "idle").await;
    wait_message(&app, id, &m, "delivered").await;
    assert!(
        pi.model.requests().is_empty(),
        "an extension command never calls the model"
    );
    stop(&app, id).await;
}

// I31: notify, setStatus and setTitle from Pi are shown by the snapshot and never put the session in
// attention.
async fn notices_from_pi_leave_the_state_alone(app: TestApp) {
    let Some((app, pi)) = with_pi(app, &[]).await else {
        return;
    };
    let id = uuid(&pi_session(&app).await["id"]);
    let m = say(&app, id, "/notice all is well", None).await;
    let snap = wait_snapshot(&app, id, "the notice", |s| {
        s["agent"]["notifications"].is_array()
            && notification_texts(s).contains(&"all is well".to_string())
            && s["agent"]["title"].is_string()
    })
    .await;
    assert_eq!(snap["agent"]["status"]["berth-test"], "status: all is well", "{snap}");
    assert_eq!(snap["agent"]["title"], "title: all is well", "{snap}");
    assert!(snap["attention_requests"].as_array().unwrap().is_empty(), "{snap}");
    wait_message(&app, id, &m, "delivered").await;
    wait_session(&app, id, "idle", |v| v["state"] == "idle").await;
    let page = app.get("/api/v1/events?after=0&limit=1000").await.ok(200);
    let states: Vec<&str> = page["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["type"] == "session.state_changed" && e["session_id"] == id.to_string())
        .map(|e| e["data"]["state"].as_str().unwrap())
        .collect();
    assert!(
        !states.contains(&"attention"),
        "a notice asked for attention: {states:?}"
    );
    assert!(pi.model.requests().is_empty());
    stop(&app, id).await;
}

// I29: a recorded conversation whose file is missing, or corrupt, is never replaced by a new one: the
// launch is refused with 409 `agent_session_unavailable` and its category, the session is failed with
// that code, no process starts, and the file is left as it is.
async fn a_missing_or_corrupt_conversation_is_refused_never_replaced(app: TestApp) {
    let Some((app, pi)) = with_pi(app, &[]).await else {
        return;
    };
    let id = uuid(&pi_session(&app).await["id"]);
    turn(&app, &pi, id, "remember this", 1).await;
    stop(&app, id).await;
    let file = conversation_file(&app, id);
    let kept = std::fs::read_to_string(&file).unwrap();
    let executions = app.count("agent_executions").await;
    let moved = file.with_extension("moved");
    std::fs::rename(&file, &moved).unwrap();
    for (category, break_it) in [
        ("missing", Box::new(|| {}) as Box<dyn Fn()>),
        (
            "corrupt",
            Box::new(|| std::fs::write(&file, "not a conversation\n").unwrap()),
        ),
    ] {
        break_it();
        let before = std::fs::read(&file).ok();
        let r = app.post(&format!("/api/v1/sessions/{id}/resume"), json!({})).await;
        let p = r.problem(409, "agent_session_unavailable");
        assert_eq!(p["category"], category, "{}", r.text);
        assert!(
            !r.text.contains(&app.config.data_dir.display().to_string()),
            "no path in the body"
        );
        let failed = app.get(&format!("/api/v1/sessions/{id}")).await.ok(200);
        assert_eq!(failed["state"], "failed");
        assert_eq!(failed["last_error"]["code"], "agent_session_unavailable");
        assert_eq!(
            std::fs::read(&file).ok(),
            before,
            "{category}: the file is left as it was"
        );
        assert_eq!(
            app.count("agent_executions").await,
            executions,
            "{category}: no process"
        );
        assert_eq!(app.app_state.ctx.runtime.live_count(), 0);
    }
    assert_eq!(pi.model.requests().len(), 1, "the model heard nothing more");
    // Mended, the same conversation goes on.
    std::fs::rename(&moved, &file).unwrap();
    assert_eq!(std::fs::read_to_string(&file).unwrap(), kept);
    app.post(&format!("/api/v1/sessions/{id}/resume"), json!({}))
        .await
        .ok(200);
    wait_session(&app, id, "idle after the mend", |v| v["state"] == "idle").await;
    let next = turn(&app, &pi, id, "still there?", 2).await;
    assert_eq!(next.conversation(), continued("remember this", "still there?"));
    stop(&app, id).await;
}
