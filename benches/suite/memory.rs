//! berth's memory against a hostile agent and big diffs, on the release server in its own process:
//! an ACP agent (`tests/acp/hostile/flood.py`) asking 60 `fs/read_text_file` of a ~16 MiB file at once
//! and never reading its stdin again, until berth ends it (`agent_not_reading`); a diff of three 150 MB
//! untracked files, then four of them at once. `VmRSS` sampled every 20 ms, `VmHWM` before and after.
use super::*;

const MIB: u64 = 1024;

struct Api {
    http: reqwest::Client,
    url: String,
    token: String,
}

impl Api {
    async fn call(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        let mut req = self
            .http
            .request(method.clone(), format!("{}/api/v1{path}", self.url))
            .bearer_auth(&self.token)
            .timeout(Duration::from_secs(600));
        if let Some(body) = body {
            req = req.json(&body);
        }
        let r = req.send().await.unwrap();
        let status = r.status();
        let v: Value = r.json().await.unwrap_or(Value::Null);
        assert!(status.is_success(), "{method} {path}: {status} {v}");
        v
    }

    /// A session on a fresh task over `source`: of `profile` (started, no prompt) or without an agent.
    async fn session(&self, source: &Path, profile: Option<&str>) -> Value {
        let ws = id_of(
            &self
                .call(
                    reqwest::Method::POST,
                    "/workspaces",
                    Some(json!({"name": format!("memory-{}", Uuid::new_v4())})),
                )
                .await,
        );
        let repo = id_of(
            &self
                .call(
                    reqwest::Method::POST,
                    &format!("/workspaces/{ws}/repositories"),
                    Some(json!({"path": source.display().to_string()})),
                )
                .await,
        );
        let task = id_of(
            &self
                .call(
                    reqwest::Method::POST,
                    &format!("/workspaces/{ws}/tasks"),
                    Some(json!({"title": "memory", "repositories": [{"repository_id": repo}]})),
                )
                .await,
        );
        let body = match profile {
            Some(p) => json!({"executor_type": "worktree", "agent_profile": p}),
            None => json!({"executor_type": "worktree", "start": false}),
        };
        self.call(reqwest::Method::POST, &format!("/tasks/{task}/sessions"), Some(body))
            .await
    }

    async fn wait_state(&self, id: Uuid, done: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + Duration::from_secs(300);
        loop {
            let s = self.call(reqwest::Method::GET, &format!("/sessions/{id}"), None).await;
            if done(&s) {
                return s;
            }
            assert!(Instant::now() < deadline, "session {id}: {s}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// Samples `VmRSS` every 20 ms until `stop`; the peak in KiB.
fn sampler(pid: u32, stop: Arc<AtomicBool>) -> tokio::task::JoinHandle<u64> {
    tokio::spawn(async move {
        let mut peak = 0;
        while !stop.load(Ordering::Relaxed) {
            peak = peak.max(status_kib(pid, "VmRSS"));
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        peak.max(status_kib(pid, "VmRSS"))
    })
}

pub(crate) async fn memory(table: &mut Table, backend: &'static str, pg_server: Option<String>) {
    eprintln!("\n== {backend}: memory");
    let dir = tempfile::TempDir::new().unwrap();
    let scratch = dir.path().canonicalize().unwrap();
    for d in ["data", "worktrees", "repos"] {
        std::fs::create_dir_all(scratch.join(d)).unwrap();
    }
    let source = scratch.join("repos/svc");
    git_init(&source);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/acp/hostile/flood.py");
    let config_file = scratch.join("berth.toml");
    std::fs::write(
        &config_file,
        format!(
            "[agents.flood]\ncommand = \"/usr/bin/python3\"\nargs = [{:?}]\nprotocol = \"acp\"\nsandbox = \"none\"\n\
             env = {{ FLOOD_MODE = \"flood\", FLOOD_COUNT = \"60\" }}\n",
            script.display().to_string()
        ),
    )
    .unwrap();
    let served = Served::start(&scratch, &config_file, &pg_server, "bench-memory").await;
    let pid = served.pid;
    let api = Api {
        http: served.http.clone(),
        url: served.server.url.clone(),
        token: served.token.clone(),
    };
    let bound = 64 * MIB;

    // The hostile agent: measured from its session idle (agent started, turn-start checkpoint taken).
    let s = id_of(&api.session(&source, Some("flood")).await);
    api.wait_state(s, |v| v["state"] == "idle").await;
    let (rss0, hwm0) = (status_kib(pid, "VmRSS"), status_kib(pid, "VmHWM"));
    let stop = Arc::new(AtomicBool::new(false));
    let peak = sampler(pid, stop.clone());
    let t = Instant::now();
    api.call(
        reqwest::Method::POST,
        &format!("/sessions/{s}/messages"),
        Some(json!({"text": "go"})),
    )
    .await;
    let ended = api.wait_state(s, |v| v["state"] == "failed").await;
    let took = t.elapsed();
    stop.store(true, Ordering::Relaxed);
    let peak = peak.await.unwrap();
    let hwm = status_kib(pid, "VmHWM");
    let grown = hwm.saturating_sub(hwm0).max(peak.saturating_sub(rss0));
    table.add(
        backend,
        "server memory: an ACP agent asks 60 fs/read_text_file of a ~16 MiB file and stops reading its stdin",
        format!(
            "VmRSS {} MiB before, peak {} MiB; VmHWM {} -> {} MiB (+{} MiB); ended `{}`",
            rss0 / MIB,
            peak / MIB,
            hwm0 / MIB,
            hwm / MIB,
            grown / MIB,
            ended["last_error"]["code"].as_str().unwrap_or("-")
        ),
        format!("ended in {}", fmt_d(took)),
        "-".into(),
        "growth < 64 MiB; ended agent_not_reading",
        Some(grown < bound && ended["last_error"]["code"] == "agent_not_reading"),
    );

    // Three untracked 150 MB text files, one diff, then four at once.
    let s = api.session(&source, None).await;
    let s = id_of(&s);
    let v = api.wait_state(s, |v| v["workspace_path"].is_string()).await;
    let wt = PathBuf::from(v["workspace_path"].as_str().unwrap());
    let block = format!("{}\n", "y".repeat(99)).repeat(10_000);
    for name in ["one.txt", "two.txt", "three.txt"] {
        use std::io::Write;
        let mut f = std::io::BufWriter::new(std::fs::File::create(wt.join(name)).unwrap());
        for _ in 0..150 {
            f.write_all(block.as_bytes()).unwrap();
        }
        f.flush().unwrap();
    }
    for (what, at_once, limit) in [("one diff", 1, bound), ("four diffs at once", 4, 2 * bound)] {
        let (rss0, hwm0) = (status_kib(pid, "VmRSS"), status_kib(pid, "VmHWM"));
        let stop = Arc::new(AtomicBool::new(false));
        let peak = sampler(pid, stop.clone());
        let t = Instant::now();
        let path = format!("/sessions/{s}/diff");
        let answers =
            futures_util::future::join_all((0..at_once).map(|_| api.call(reqwest::Method::GET, &path, None))).await;
        let took = t.elapsed();
        stop.store(true, Ordering::Relaxed);
        let peak = peak.await.unwrap();
        let hwm = status_kib(pid, "VmHWM");
        let cut = answers.iter().all(|d| {
            d["repositories"][0]["files"]
                .as_array()
                .is_some_and(|f| f.len() == 3 && f.iter().all(|f| f["truncated"] == true))
        });
        let grown = hwm.saturating_sub(hwm0).max(peak.saturating_sub(rss0));
        table.add(
            backend,
            &format!("server memory: {what} of three untracked 150 MB files"),
            format!(
                "VmRSS {} MiB before, peak {} MiB; VmHWM {} -> {} MiB (+{} MiB); every file cut: {cut}",
                rss0 / MIB,
                peak / MIB,
                hwm0 / MIB,
                hwm / MIB,
                grown / MIB
            ),
            format!("answered in {}", fmt_d(took)),
            "-".into(),
            &format!("growth < {} MiB", limit / MIB),
            Some(grown < limit && cut),
        );
    }

    served.stop().await;
}
