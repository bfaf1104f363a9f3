//! Pi on its own: a JSON-lines client over its stdin and stdout, as berth is one, for the tests that drive
//! Pi without berth.
use std::path::Path;
use std::process::Stdio;
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

use super::{Pi, WAIT};

/// A Pi process in `--mode rpc`, spawned by the test. Every line it prints is kept, in order.
pub(super) struct PiProcess {
    pub(super) child: tokio::process::Child,
    stdin: tokio::process::ChildStdin,
    lines: tokio::sync::mpsc::UnboundedReceiver<Value>,
    pub(super) seen: Vec<Value>,
    stderr: Arc<Mutex<String>>,
    next_id: u64,
}

impl PiProcess {
    pub(super) async fn spawn(pi: &Pi, cwd: &Path, session: Option<&Path>) -> PiProcess {
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

    pub(super) async fn send(&mut self, command: Value) {
        let mut line = command.to_string();
        line.push('\n');
        self.stdin.write_all(line.as_bytes()).await.expect("Pi reads its stdin");
        self.stdin.flush().await.unwrap();
    }

    /// The next line satisfying `pred` (every line read on the way is kept in `seen`).
    pub(super) async fn until(&mut self, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
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
    pub(super) async fn next_of(&mut self, kind: &str) -> Value {
        self.until(kind, |l| l["type"] == kind).await
    }

    /// Sends a command with a fresh id and returns its response.
    pub(super) async fn call(&mut self, mut command: Value) -> Value {
        self.next_id += 1;
        let id = format!("t{}", self.next_id);
        command["id"] = json!(id);
        self.send(command).await;
        self.until(&format!("response {id}"), |l| l["type"] == "response" && l["id"] == id)
            .await
    }

    /// `call`, asserting success; returns `data`.
    pub(super) async fn ok(&mut self, command: Value) -> Value {
        let r = self.call(command.clone()).await;
        assert_eq!(r["success"], true, "{command} failed: {r}");
        r["data"].clone()
    }

    /// The lines seen since index `from`, with their types.
    pub(super) fn types_since(&self, from: usize) -> Vec<String> {
        self.seen[from..]
            .iter()
            .map(|l| l["type"].as_str().unwrap_or_default().to_string())
            .collect()
    }

    /// SIGKILL, as a crash.
    pub(super) async fn kill(mut self) {
        self.child.kill().await.unwrap();
    }
}
