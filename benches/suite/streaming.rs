//! Streaming: 16 sessions each streaming 2,000 deltas at 200/s through the release
//! server (the test agent as their profile), watched by 16 SSE subscribers; then a flooding agent.
use std::collections::HashMap;

use super::*;

const SESSIONS: usize = 16;
const DELTAS: usize = 2000;
const RATE: usize = 200;
const GET_CLIENTS: usize = 4;
const GET_EVERY: Duration = Duration::from_millis(20);
const IDLE_SECS: u64 = 5;
const GIB: usize = 1 << 30;

/// CPU seconds (user + system) of a process and of its live children (the agents).
fn cpu_secs(pid: u32) -> (f64, f64) {
    let own = proc_stat(&pid.to_string()).map_or(0.0, |s| s.own);
    let mut children = 0.0;
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        if let Some(stat) = proc_stat(&entry.file_name().to_string_lossy())
            && stat.ppid == pid
        {
            children += stat.own;
        }
    }
    (own, children)
}

struct Api {
    http: reqwest::Client,
    url: String,
    token: String,
}

impl Api {
    async fn call(&self, method: reqwest::Method, path: &str, body: Option<Value>, expect: u16) -> Value {
        let mut req = self
            .http
            .request(method.clone(), format!("{}{path}", self.url))
            .bearer_auth(&self.token);
        if let Some(body) = body {
            req = req.json(&body);
        }
        let r = req.send().await.unwrap();
        let status = r.status().as_u16();
        let v: Value = r.json().await.unwrap_or(Value::Null);
        assert_eq!(status, expect, "{method} {path}: {v}");
        v
    }
    async fn get(&self, path: &str) -> Value {
        self.call(reqwest::Method::GET, path, None, 200).await
    }
    async fn post(&self, path: &str, body: Value, expect: u16) -> Value {
        self.call(reqwest::Method::POST, path, Some(body), expect).await
    }
    async fn assistant_messages(&self, session: Uuid) -> usize {
        let snap = self.get(&format!("/api/v1/sessions/{session}/snapshot")).await;
        snap["transcript"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|m| m["role"] == "assistant")
            .count()
    }
}

/// `GET /sessions/{id}` from `GET_CLIENTS` clients, each one every `GET_EVERY` (a user's pace, not a
/// load test that would measure how the CPU is shared) until `stop`; the p99 latency.
async fn get_p99(api: Arc<Api>, session: Uuid, stop: Arc<AtomicBool>) -> Duration {
    let clients: Vec<_> = (0..GET_CLIENTS)
        .map(|_| {
            let (api, stop) = (api.clone(), stop.clone());
            tokio::spawn(async move {
                let mut lat = Vec::new();
                let mut tick = tokio::time::interval(GET_EVERY);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                while !stop.load(Ordering::Relaxed) {
                    tick.tick().await;
                    let t = Instant::now();
                    api.get(&format!("/api/v1/sessions/{session}")).await;
                    lat.push(t.elapsed());
                }
                lat
            })
        })
        .collect();
    let mut all = Vec::new();
    for c in clients {
        all.extend(c.await.unwrap());
    }
    all.sort();
    all.get(all.len() * 99 / 100).copied().unwrap_or_default()
}

/// What one subscriber saw of one session: the text rebuilt from its frames, and when each came.
#[derive(Default)]
struct Seen {
    text: String,
    frames: Vec<Instant>,
    done: bool,
}

/// One SSE subscriber of every session's events, until every session's turn ended.
async fn subscribe(
    api: Arc<Api>,
    after: i64,
    sessions: Vec<Uuid>,
    ready: Arc<tokio::sync::Semaphore>,
) -> HashMap<String, Seen> {
    let mut r = api
        .http
        .get(format!("{}/api/v1/events/stream?after={after}", api.url))
        .bearer_auth(&api.token)
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success());
    let mut seen: HashMap<String, Seen> = sessions.iter().map(|s| (s.to_string(), Seen::default())).collect();
    let mut buf = String::new();
    let deadline = Instant::now() + Duration::from_secs(300);
    while seen.values().any(|s| !s.done) && Instant::now() < deadline {
        let Ok(Ok(Some(chunk))) = tokio::time::timeout(Duration::from_secs(60), r.chunk()).await else {
            break;
        };
        buf.push_str(&String::from_utf8_lossy(&chunk));
        while let Some(end) = buf.find("\n\n") {
            let frame: String = buf.drain(..end + 2).collect();
            if frame.contains("event: ready") {
                ready.add_permits(1);
                continue;
            }
            let Some(data) = frame.lines().find_map(|l| l.strip_prefix("data: ")) else {
                continue;
            };
            let e: Value = serde_json::from_str(data).unwrap();
            if e["type"] != "runtime.output" {
                continue;
            }
            let Some(s) = e["session_id"].as_str().and_then(|id| seen.get_mut(id)) else {
                continue;
            };
            let event = &e["data"]["event"];
            match event["type"].as_str() {
                Some("message_update") => {
                    s.text
                        .push_str(event["assistantMessageEvent"]["delta"].as_str().unwrap_or_default());
                    s.frames.push(Instant::now());
                }
                Some("agent_end") => s.done = true,
                _ => {}
            }
        }
    }
    seen
}

/// Posts a prompt and samples the server's VmRSS until the session answers it; the peak, in KiB.
async fn flood(api: &Api, pid: u32, session: Uuid, prompt: &str) -> (u64, Duration) {
    let before = api.assistant_messages(session).await;
    let t = Instant::now();
    api.post(
        &format!("/api/v1/sessions/{session}/messages"),
        json!({"text": prompt}),
        202,
    )
    .await;
    let mut peak = 0;
    let deadline = Instant::now() + Duration::from_secs(900);
    loop {
        peak = peak.max(status_kib(pid, "VmRSS"));
        if api.assistant_messages(session).await > before {
            break;
        }
        assert!(Instant::now() < deadline, "{prompt}: no answer");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    (peak.max(status_kib(pid, "VmRSS")), t.elapsed())
}

pub(crate) async fn streaming(table: &mut Table, backend: &'static str, pg_server: Option<String>) {
    eprintln!("\n== {backend}: streaming");
    let (_dir, _, source, served) = Served::with_test_agent(&pg_server, "bench-server").await;
    let pid = served.pid;
    let api = Arc::new(Api {
        http: served.http.clone(),
        url: served.server.url.clone(),
        token: served.token.clone(),
    });

    let ws = id_of(&api.post("/api/v1/workspaces", json!({"name": "stream"}), 201).await);
    let repo = id_of(
        &api.post(
            &format!("/api/v1/workspaces/{ws}/repositories"),
            json!({"path": source.display().to_string()}),
            201,
        )
        .await,
    );
    let task = id_of(
        &api.post(
            &format!("/api/v1/workspaces/{ws}/tasks"),
            json!({"title": "stream", "repositories": [{"repository_id": repo}]}),
            201,
        )
        .await,
    );
    let mut sessions = Vec::new();
    for _ in 0..SESSIONS {
        let s = api
            .post(
                &format!("/api/v1/tasks/{task}/sessions"),
                json!({"executor_type": "worktree", "agent_profile": "test"}),
                201,
            )
            .await;
        sessions.push(id_of(&s));
    }
    for s in &sessions {
        let deadline = Instant::now() + Duration::from_secs(120);
        while api.get(&format!("/api/v1/sessions/{s}")).await["state"] != "idle" {
            assert!(Instant::now() < deadline, "session {s} never idle");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    // GET p99 idle, then while every session streams.
    let stop = Arc::new(AtomicBool::new(false));
    let idle = tokio::spawn(get_p99(api.clone(), sessions[0], stop.clone()));
    tokio::time::sleep(Duration::from_secs(IDLE_SECS)).await;
    stop.store(true, Ordering::Relaxed);
    let idle_p99 = idle.await.unwrap();

    let latest = api.get("/api/v1/events?limit=1").await["latest_seq"].as_i64().unwrap();
    let ready = Arc::new(tokio::sync::Semaphore::new(0));
    let subscribers: Vec<_> = (0..SESSIONS)
        .map(|_| tokio::spawn(subscribe(api.clone(), latest, sessions.clone(), ready.clone())))
        .collect();
    tokio::time::timeout(Duration::from_secs(60), ready.acquire_many(SESSIONS as u32))
        .await
        .expect("every subscriber is live")
        .unwrap()
        .forget();
    let stop = Arc::new(AtomicBool::new(false));
    let busy = tokio::spawn(get_p99(api.clone(), sessions[0], stop.clone()));
    let start = Instant::now();
    let cpu_before = cpu_secs(pid);
    let prompt = format!("deltas {DELTAS} {RATE}");
    futures_util::future::join_all(sessions.iter().map(|s| {
        let (api, path, body) = (
            api.clone(),
            format!("/api/v1/sessions/{s}/messages"),
            json!({"text": prompt}),
        );
        async move { api.post(&path, body, 202).await }
    }))
    .await;
    let mut seen = Vec::new();
    for s in subscribers {
        seen.push(s.await.unwrap());
    }
    let elapsed = start.elapsed();
    let cpu_after = cpu_secs(pid);
    stop.store(true, Ordering::Relaxed);
    let busy_p99 = busy.await.unwrap();

    // What was written: every event after `latest`, through replay pages.
    let (mut after, mut all, mut outputs, mut updates) = (latest, 0usize, 0usize, 0usize);
    loop {
        let page = api.get(&format!("/api/v1/events?after={after}&limit=1000")).await;
        let events = page["events"].as_array().unwrap();
        let Some(last) = events.last() else { break };
        after = last["seq"].as_i64().unwrap();
        all += events.len();
        for e in events.iter().filter(|e| e["type"] == "runtime.output") {
            outputs += 1;
            updates += usize::from(e["data"]["event"]["type"] == "message_update");
        }
    }
    let expected: String = (0..DELTAS).map(|i| format!("delta {i} ")).collect();
    let exact = seen
        .iter()
        .flat_map(|m| m.values())
        .filter(|s| s.done && s.text == expected)
        .count();
    // Frames a second per session as one subscriber saw them, over the span of its frames.
    let mut rates: Vec<f64> = seen[0]
        .values()
        .map(|s| match (s.frames.first(), s.frames.last()) {
            (Some(a), Some(b)) if b > a => (s.frames.len() - 1) as f64 / (*b - *a).as_secs_f64(),
            _ => 0.0,
        })
        .collect();
    rates.sort_by(|a, b| a.total_cmp(b));
    let secs = elapsed.as_secs_f64();
    let deltas = (SESSIONS * DELTAS) as f64;
    let per_session = updates as f64 / SESSIONS as f64 / secs;
    table.add(
        backend,
        "16 sessions streaming 2,000 deltas at 200/s: write transactions (runtime.output events)",
        format!(
            "{:.0}/s ({per_session:.1} delta writes per session per s); {outputs} runtime.output of {all} events in {secs:.1} s; CPU: berth {:.0}%, the agents {:.0}% of a core",
            outputs as f64 / secs,
            (cpu_after.0 - cpu_before.0) / secs * 100.0,
            (cpu_after.1 - cpu_before.1) / secs * 100.0
        ),
        format!("{:.0} deltas/s printed (one write each before)", deltas / secs),
        format!("{:.3} writes per delta", outputs as f64 / deltas),
        "<= 10 delta writes per session per s (interval 100 ms)",
        Some(per_session <= 10.0),
    );
    let ratio = busy_p99.as_secs_f64() / idle_p99.as_secs_f64().max(1e-9);
    table.add(
        backend,
        "GET /api/v1/sessions/{id} p99 (4 clients, 50/s each) while 16 sessions stream",
        format!("p99 {}", fmt_d(busy_p99)),
        format!("p99 {} idle", fmt_d(idle_p99)),
        format!("{ratio:.2}x"),
        "within 2x of idle",
        Some(ratio <= 2.0),
    );
    table.add(
        backend,
        "16 SSE subscribers rebuild the 16 streamed texts",
        format!(
            "{exact}/{} texts exact; frames per session per s: min {:.1}, median {:.1}",
            SESSIONS * SESSIONS,
            rates[0],
            rates[rates.len() / 2]
        ),
        "-".into(),
        "-".into(),
        "every text exact; >= 9.5 frames/s (one per 100 ms)",
        Some(exact == SESSIONS * SESSIONS && rates[0] >= 9.5),
    );

    // Memory under a flooding agent: an endless 1 GiB line, then 1,024 lines of 1 MiB (1 GiB).
    let rss_before = status_kib(pid, "VmRSS");
    let (line_peak, line_time) = flood(&api, pid, sessions[0], &format!("flood-line {GIB}")).await;
    let rss_quarter = status_kib(pid, "VmRSS");
    let (quarter_peak, quarter_time) = flood(&api, pid, sessions[1], "flood-lines 256").await;
    let rss_between = status_kib(pid, "VmRSS");
    let (lines_peak, lines_time) = flood(&api, pid, sessions[2], "flood-lines 1024").await;
    let hwm = status_kib(pid, "VmHWM");
    // The stated bound (runtime/mod.rs): REPORT_BYTES in flight, one line buffer per flooding agent,
    // STREAM_CAP per session.
    let bound_kib = ((berth::runtime::REPORT_BYTES + berth::runtime::MAX_LINE + SESSIONS * 256 * 1024) / 1024) as u64;
    // Growth is counted from before the first flood: memory the allocator kept from one flood and
    // reused in the next is still the flood's.
    for (what, start, peak, took) in [
        ("an endless 1 GiB line", rss_before, line_peak, line_time),
        ("256 lines of 1 MiB (256 MiB)", rss_quarter, quarter_peak, quarter_time),
        ("1,024 lines of 1 MiB (1 GiB)", rss_between, lines_peak, lines_time),
    ] {
        let (base, growth) = (rss_before, peak.saturating_sub(rss_before));
        table.add(
            backend,
            &format!("server resident memory while one agent prints {what}"),
            format!(
                "VmRSS {} MiB before the floods, {} MiB before this one, peak {} MiB (+{} MiB); VmHWM {} MiB",
                base / 1024,
                start / 1024,
                peak / 1024,
                growth / 1024,
                hwm / 1024
            ),
            format!("printed and answered in {}", fmt_d(took)),
            "-".into(),
            &format!("growth <= {} MiB (in flight + a line + 16 buffers)", bound_kib / 1024),
            Some(growth <= bound_kib),
        );
    }

    served.stop().await;
}
