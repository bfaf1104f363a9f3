//! What one writer at a time costs: a turn's prompt-to-first-token and a restore, on the release server
//! in its own process (the test agent as the profile). One task, one repository, one worktree session,
//! idle; then `ROUNDS` rounds, each a turn ("hi": the time from the POST until the turn's first
//! `runtime.output` event arrives on the SSE stream; then the turn settles) and a restore to the turn's
//! end checkpoint (nothing changed since it: no consent), timed from the POST to its answer. Only HTTP,
//! so the same file measures the code before the writer lease and after it.
use super::*;

const ROUNDS: usize = 40;
/// Rounds first run and not counted: the first turn and restore warm the server's pools and caches.
const WARMUP: usize = 3;

struct Api {
    http: reqwest::Client,
    url: String,
    token: String,
}

impl Api {
    async fn call(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> (u16, Value) {
        let mut req = self
            .http
            .request(method, format!("{}/api/v1{path}", self.url))
            .bearer_auth(&self.token)
            .timeout(Duration::from_secs(120));
        if let Some(body) = body {
            req = req.json(&body);
        }
        let r = req.send().await.unwrap();
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(Value::Null))
    }

    async fn ok(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        let (status, v) = self.call(method.clone(), path, body).await;
        assert!((200..300).contains(&status), "{method} {path}: {status} {v}");
        v
    }

    async fn get(&self, path: &str) -> Value {
        self.ok(reqwest::Method::GET, path, None).await
    }

    async fn post(&self, path: &str, body: Value) -> Value {
        self.ok(reqwest::Method::POST, path, Some(body)).await
    }
}

/// The session's `runtime.output` events as they arrive on one SSE stream: (seq, when it arrived).
async fn outputs(
    api: Arc<Api>,
    after: i64,
    session: Uuid,
    ready: tokio::sync::oneshot::Sender<()>,
    tx: tokio::sync::mpsc::UnboundedSender<(i64, Instant)>,
) {
    let mut r = api
        .http
        .get(format!(
            "{}/api/v1/events/stream?after={after}&types=runtime.output",
            api.url
        ))
        .bearer_auth(&api.token)
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "event stream: {}", r.status());
    let mut ready = Some(ready);
    let mut buf = String::new();
    let session = session.to_string();
    while let Ok(Some(chunk)) = r.chunk().await {
        let now = Instant::now();
        buf.push_str(&String::from_utf8_lossy(&chunk));
        while let Some(end) = buf.find("\n\n") {
            let frame: String = buf.drain(..end + 2).collect();
            if frame.contains("event: ready") {
                if let Some(ready) = ready.take() {
                    let _ = ready.send(());
                }
                continue;
            }
            let Some(data) = frame.lines().find_map(|l| l.strip_prefix("data: ")) else {
                continue;
            };
            let Ok(e) = serde_json::from_str::<Value>(data) else {
                continue;
            };
            if e["type"] == "runtime.output"
                && e["session_id"] == session.as_str()
                && let Some(seq) = e["seq"].as_i64()
                && tx.send((seq, now)).is_err()
            {
                return;
            }
        }
    }
}

/// Median and p90 of `v` (sorts it).
fn median_p90(v: &mut [Duration]) -> String {
    v.sort();
    format!(
        "median {}, p90 {}",
        fmt_d(v[v.len() / 2]),
        fmt_d(v[(v.len() * 9 / 10).min(v.len() - 1)])
    )
}

pub(crate) async fn writer(table: &mut Table, backend: &'static str, pg_server: Option<String>) {
    eprintln!("\n== {backend}: writer");
    let (_dir, _, source, served) = Served::with_test_agent(&pg_server, "bench-writer").await;
    let api = Arc::new(Api {
        http: served.http.clone(),
        url: served.server.url.clone(),
        token: served.token.clone(),
    });

    let ws = id_of(&api.post("/workspaces", json!({"name": "writer"})).await);
    let repo = id_of(
        &api.post(
            &format!("/workspaces/{ws}/repositories"),
            json!({"path": source.display().to_string()}),
        )
        .await,
    );
    let task = id_of(
        &api.post(
            &format!("/workspaces/{ws}/tasks"),
            json!({"title": "writer", "repositories": [{"repository_id": repo}]}),
        )
        .await,
    );
    let session = id_of(
        &api.post(
            &format!("/tasks/{task}/sessions"),
            json!({"executor_type": "worktree", "agent_profile": "test"}),
        )
        .await,
    );
    let env = wait_idle(&api, session).await["task_environment_id"]
        .as_str()
        .expect("the session's environment")
        .to_string();

    let latest = api.get("/events?limit=1").await["latest_seq"].as_i64().unwrap();
    let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let reader = tokio::spawn(outputs(api.clone(), latest, session, ready_tx, tx));
    tokio::time::timeout(Duration::from_secs(60), ready_rx)
        .await
        .expect("the event stream is live")
        .unwrap();

    let (mut first_token, mut restores) = (Vec::new(), Vec::new());
    let mut refused = 0usize;
    let mut seen = latest;
    for round in 0..WARMUP + ROUNDS {
        // (a) A turn: from the POST until its first runtime.output arrives, then until it settled.
        let turns = api.get(&format!("/sessions/{session}/turns")).await["items"]
            .as_array()
            .unwrap()
            .len();
        // Only this turn's output counts: nothing at or before the log's end now.
        seen = seen.max(api.get("/events?limit=1").await["latest_seq"].as_i64().unwrap());
        while let Ok((seq, _)) = rx.try_recv() {
            seen = seen.max(seq);
        }
        let t = Instant::now();
        api.post(&format!("/sessions/{session}/messages"), json!({"text": "hi"}))
            .await;
        let first = loop {
            let (seq, at) = tokio::time::timeout(Duration::from_secs(60), rx.recv())
                .await
                .expect("the turn's first runtime.output")
                .expect("the event stream ended");
            if seq > seen {
                seen = seq;
                break at - t;
            }
        };
        let end = wait_settled(&api, session, turns + 1).await;
        wait_idle(&api, session).await;

        // (b) A restore to the checkpoint the turn ended at (nothing changed since it).
        let path = format!("/environments/{env}/restore");
        let took = loop {
            let t = Instant::now();
            let (status, v) = api
                .call(reqwest::Method::POST, &path, Some(json!({"checkpoint_id": end})))
                .await;
            let took = t.elapsed();
            match status {
                200 => break took,
                // The turn's lease is released just after it settled: count it, try again.
                409 if refused < 20 => {
                    refused += 1;
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                _ => panic!("restore: {status} {v}"),
            }
        };
        if round >= WARMUP {
            first_token.push(first);
            restores.push(took);
        }
    }
    reader.abort();

    table.add(
        backend,
        &format!(
            "writer: a turn's prompt-to-first-token (POST messages \"hi\" to its first runtime.output on the SSE stream), {ROUNDS} turns"
        ),
        median_p90(&mut first_token),
        String::new(),
        "-".into(),
        "reported",
        None,
    );
    table.add(
        backend,
        &format!(
            "writer: POST /environments/{{id}}/restore to the last turn's end checkpoint, {ROUNDS} restores{}",
            if refused > 0 {
                format!(" ({refused} refused 409 and retried)")
            } else {
                String::new()
            }
        ),
        median_p90(&mut restores),
        String::new(),
        "-".into(),
        "reported",
        None,
    );

    served.stop().await;
}

async fn wait_idle(api: &Api, session: Uuid) -> Value {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let s = api.get(&format!("/sessions/{session}")).await;
        if s["state"] == "idle" && s["task_environment_id"].is_string() {
            return s;
        }
        assert!(Instant::now() < deadline, "session {session} never idle: {s}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Waits until the session has `count` turns and the last one settled; its end checkpoint.
async fn wait_settled(api: &Api, session: Uuid, count: usize) -> Value {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let turns = api.get(&format!("/sessions/{session}/turns")).await;
        let items = turns["items"].as_array().unwrap();
        if items.len() >= count && items[count - 1]["end_checkpoint_id"].is_string() {
            return items[count - 1]["end_checkpoint_id"].clone();
        }
        assert!(Instant::now() < deadline, "turn {count} never settled: {turns}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
