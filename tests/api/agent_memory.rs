//! berth's memory stays bounded against hostile agents and big diffs, on a `berth serve` of the test's
//! own (its peak resident memory, `VmHWM` in `/proc/<pid>/status`, is the process's alone): an ACP agent
//! that floods `fs/read_text_file` and stops reading its stdin is ended with `agent_not_reading` while
//! berth grows less than 64 MiB; requests past `BERTH_AGENT_MAX_REQUESTS_IN_FLIGHT` get JSON-RPC errors;
//! a refused write is logged with its path and size, never its content; a diff of three 150 MB untracked
//! files is read as a stream, each file cut as it arrives (less than 64 MiB again). The margins are
//! generous: the base code grew by gigabytes here.
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use reqwest::Method;
use serde_json::{Value, json};
use uuid::Uuid;

use crate::both_backends;
use crate::faults::{Berth, process_env, start, wait_ready};
use crate::helpers::{TestApp, git_repo, id_of, seen_json, wait_until};

both_backends!(
    a_flooding_agent_that_stops_reading_is_ended_and_berth_stays_small,
    requests_past_the_in_flight_limit_get_errors,
    a_refused_write_is_logged_without_its_content,
    a_diff_of_big_untracked_files_is_cut_as_it_streams,
);

const WAIT: Duration = Duration::from_secs(120);
const MIB: u64 = 1024 * 1024;

/// A `berth serve` with the flooding agent's profiles (`tests/acp/hostile/flood.py`, unboxed), logging
/// at `info` into `log`.
struct Served {
    berth: Berth,
    log: PathBuf,
    client: reqwest::Client,
    token: String,
    scratch: PathBuf,
}

async fn serve(app: &TestApp) -> Served {
    let data = app.scratch.path().join("served");
    let mut env: BTreeMap<String, String> = process_env(app, &data);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/acp/hostile/flood.py");
    let mut config = String::new();
    for (name, mode, count) in [("flood", "flood", 60), ("burst", "burst", 20), ("write", "write", 1)] {
        config.push_str(&format!(
            "[agents.{name}]\ncommand = \"/usr/bin/python3\"\nargs = [{script:?}]\nprotocol = \"acp\"\n\
             sandbox = \"none\"\nenv = {{ FLOOD_MODE = \"{mode}\", FLOOD_COUNT = \"{count}\" }}\n\n",
            script = script.display().to_string()
        ));
    }
    let path = data.join("berth.toml");
    std::fs::write(&path, config).unwrap();
    env.insert("BERTH_CONFIG".into(), path.display().to_string());
    env.insert("RUST_LOG".into(), "info".into());
    let log = app.scratch.path().join("served.log");
    let mut berth = start(&env, None, &log);
    wait_ready(&app.client, &mut berth).await;
    Served {
        berth,
        log,
        client: app.client.clone(),
        token: app.admin.clone(),
        scratch: app.scratch.path().to_path_buf(),
    }
}

impl Served {
    async fn call(&self, method: Method, path: &str, body: Option<Value>) -> Value {
        let mut req = self
            .client
            .request(method, format!("{}/api/v1{path}", self.berth.base))
            .bearer_auth(&self.token)
            .timeout(Duration::from_secs(300));
        if let Some(b) = body {
            req = req.json(&b);
        }
        let r = req.send().await.unwrap();
        let status = r.status();
        let v: Value = r.json().await.unwrap_or(Value::Null);
        assert!(status.is_success(), "{path}: {status} {v}");
        v
    }

    /// A session of `profile` on a fresh task over a fresh repository (no agent without a profile),
    /// launched with the prompt `go` unless `prompt` is false.
    async fn session(&self, name: &str, profile: Option<&str>) -> Value {
        self.session_with(name, profile, true).await
    }

    async fn session_with(&self, name: &str, profile: Option<&str>, prompt: bool) -> Value {
        let ws = id_of(
            &self
                .call(Method::POST, "/workspaces", Some(json!({"name": name})))
                .await,
        );
        let source = git_repo(&self.scratch.join(name), "main");
        let repo = self
            .call(
                Method::POST,
                &format!("/workspaces/{ws}/repositories"),
                Some(json!({"path": source})),
            )
            .await;
        let task = self
            .call(
                Method::POST,
                &format!("/workspaces/{ws}/tasks"),
                Some(json!({"title": name, "repositories": [{"repository_id": id_of(&repo)}]})),
            )
            .await;
        let body = match profile {
            Some(p) if prompt => json!({"executor_type": "worktree", "agent_profile": p, "prompt": "go"}),
            Some(p) => json!({"executor_type": "worktree", "agent_profile": p}),
            None => json!({"executor_type": "worktree", "start": false}),
        };
        self.call(Method::POST, &format!("/tasks/{}/sessions", id_of(&task)), Some(body))
            .await
    }

    async fn wait_session(&self, id: Uuid, what: &str, done: impl Fn(&Value) -> bool) -> Value {
        wait_until(&format!("session {id} {what}"), WAIT, || async {
            let s = self.call(Method::GET, &format!("/sessions/{id}"), None).await;
            seen_json(done(&s), s)
        })
        .await
    }

    /// What the agent said as its message (the flooding agent's JSON report).
    async fn report(&self, id: Uuid) -> Value {
        wait_until("the agent to report", WAIT, || async {
            let snap = self.call(Method::GET, &format!("/sessions/{id}/snapshot"), None).await;
            let said = snap["transcript"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|m| m["role"] == "assistant")
                .and_then(|m| m["content"]["content"][0]["text"].as_str().map(str::to_string));
            match said {
                Some(text) => Ok(serde_json::from_str(&text).unwrap()),
                None => Err(snap.to_string()),
            }
        })
        .await
    }

    /// berth's peak resident memory so far, in bytes.
    fn peak(&self) -> u64 {
        status_kib(self.berth.child.id(), "VmHWM") * 1024
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// A field of `/proc/<pid>/status` given in kB.
fn status_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("{field} in {status}"))
}

async fn a_flooding_agent_that_stops_reading_is_ended_and_berth_stays_small(app: TestApp) {
    let served = serve(&app).await;
    let s = served.session_with("flood", Some("flood"), false).await;
    let id = id_of(&s);
    served.wait_session(id, "running", |s| s["state"] == "idle").await;
    // What berth holds before the flood: the session, its agent, the checkpoint a turn starts from.
    let before = served.peak();
    served
        .call(
            Method::POST,
            &format!("/sessions/{id}/messages"),
            Some(json!({"text": "go"})),
        )
        .await;
    let failed = served.wait_session(id, "failed", |s| s["state"] == "failed").await;
    assert_eq!(failed["last_error"]["code"], "agent_not_reading", "{failed}");
    let grown = served.peak().saturating_sub(before);
    assert!(
        grown < 64 * MIB,
        "berth grew {} MiB for an agent asking 60 reads of 16 MiB and reading none",
        grown / MIB
    );
}

async fn requests_past_the_in_flight_limit_get_errors(app: TestApp) {
    let served = serve(&app).await;
    let s = served.session("burst", Some("burst")).await;
    let report = served.report(id_of(&s)).await;
    // Eight answered (the default limit: the first answer waits in the pipe while the agent reads
    // nothing), the other twelve refused at once with a JSON-RPC error.
    assert_eq!(report["served"], 8, "{report}");
    assert_eq!(report["errors"], 12, "{report}");
    assert_eq!(report["codes"], json!([-32603]), "{report}");
    assert!(
        report["message"]
            .as_str()
            .unwrap()
            .contains("already answering 8 requests"),
        "{report}"
    );
}

async fn a_refused_write_is_logged_without_its_content(app: TestApp) {
    let served = serve(&app).await;
    let s = served.session("write", Some("write")).await;
    let report = served.report(id_of(&s)).await;
    assert_eq!(report["code"], -32602, "refused: {report}");
    let log = wait_until("the refusal in the log", WAIT, || async {
        let log = served.log();
        seen_json(log.contains("refused an agent's file request"), Value::String(log))
    })
    .await;
    let log = log.as_str().unwrap();
    let line = log
        .lines()
        .find(|l| l.contains("refused an agent's file request"))
        .unwrap();
    assert!(line.contains("/.git"), "the path: {line}");
    assert!(line.contains("4103"), "the size (MARKER- and 4096 bytes): {line}");
    assert!(!log.contains("MARKER-"), "never the content: {line}");
}

async fn a_diff_of_big_untracked_files_is_cut_as_it_streams(app: TestApp) {
    let served = serve(&app).await;
    let s = served.session("big", None).await;
    let id = id_of(&s);
    let s = served
        .wait_session(id, "a worktree", |s| s["workspace_path"].is_string())
        .await;
    let wt = PathBuf::from(s["workspace_path"].as_str().unwrap());
    // Text (git diffs it line by line): 150 MB each.
    let line = format!("{}\n", "y".repeat(99));
    let block = line.repeat(10_000);
    for name in ["one.txt", "two.txt", "three.txt"] {
        use std::io::Write;
        let mut f = std::io::BufWriter::new(std::fs::File::create(wt.join(name)).unwrap());
        for _ in 0..150 {
            f.write_all(block.as_bytes()).unwrap();
        }
        f.flush().unwrap();
    }
    let before = served.peak();
    let diff = served.call(Method::GET, &format!("/sessions/{id}/diff"), None).await;
    let grown = served.peak().saturating_sub(before);
    let files: Vec<&Value> = diff["repositories"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|r| r["files"].as_array().unwrap())
        .collect();
    assert_eq!(files.len(), 3, "{}", diff["total_files"]);
    for f in files {
        assert_eq!(f["status"], "untracked", "{}", f["path"]);
        assert_eq!(f["truncated"], true, "{}", f["path"]);
        assert_eq!(f["additions"], 1_500_000, "counted whole: {}", f["path"]);
        let patch = f["patch"].as_str().unwrap();
        assert!(patch.len() as u64 <= MIB && patch.ends_with('\n'), "{}", f["path"]);
    }
    assert!(
        grown < 64 * MIB,
        "berth grew {} MiB for a diff of three 150 MB files",
        grown / MIB
    );
}
