//! berth's own cost per live agent: 16 real agents (Pi 0.73.1 over its RPC mode, opencode 1.18.33 over the
//! Agent Client Protocol), each streaming 50 tokens a second from a model server in this process, against
//! the agents' own CPU. Measured on the release server's process alone (`/proc/<pid>/stat` and `VmRSS`):
//! resident memory with no agent, with 16 idle agents and every 100 ms while all 16 stream; CPU over the
//! window in which all 16 streams are live. Afterwards every turn must have ended with the whole text.
//! A missing agent fails the group: it measures nothing without the real agents.
use std::collections::HashSet;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::*;

const AGENTS: usize = 16;
/// Tokens a second per agent: one `delta.content` chunk every 20 ms.
const RATE: usize = 50;
const EVERY: Duration = Duration::from_millis(1000 / RATE as u64);
const SAMPLE: Duration = Duration::from_millis(100);
const IDLE_CPU: Duration = Duration::from_secs(5);
/// Node agents start in seconds each, more with 16 starting at once on 2 cores.
const WAIT: Duration = Duration::from_secs(300);
const CPU_TARGET: f64 = 2.0;
const RSS_TARGET_KIB: f64 = 2048.0;

#[derive(Clone, Copy)]
enum Agent {
    Pi,
    Opencode,
}

impl Agent {
    /// Name, protocol, binary and its package.json (relative to the repository), and what installs them.
    fn about(self) -> [&'static str; 5] {
        match self {
            Agent::Pi => [
                "Pi",
                "pi",
                "tests/pi/node_modules/.bin/pi",
                "tests/pi/node_modules/@mariozechner/pi-coding-agent/package.json",
                ".ci/pi",
            ],
            Agent::Opencode => [
                "opencode",
                "acp",
                "tests/acp/opencode/node_modules/opencode-linux-x64/bin/opencode",
                "tests/acp/opencode/node_modules/opencode-linux-x64/package.json",
                ".ci/acp",
            ],
        }
    }

    /// The profile's `[agents.<name>]` table, pointed at the model server; `home` is the agent's own
    /// directory (Pi's agent dir, opencode's HOME).
    fn profile(self, home: &Path, base_url: &str) -> (toml::Table, String) {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let [name, protocol, binary, manifest, installer] = self.about();
        let command = root.join(binary);
        assert!(
            command.is_file(),
            "the agents group needs the real {name} at {} (install it with {installer})",
            command.display()
        );
        let version = std::fs::read_to_string(root.join(manifest))
            .ok()
            .and_then(|s| serde_json::from_str::<Value>(&s).ok())
            .and_then(|v| v["version"].as_str().map(str::to_string))
            .unwrap_or_else(|| panic!("no version in {manifest}"));
        let mut env = toml::Table::new();
        let mut put = |k: &str, v: String| {
            env.insert(k.to_string(), toml::Value::String(v));
        };
        let args: Vec<&str> = match self {
            Agent::Pi => {
                let models = json!({"providers": {"scripted": {
                    "baseUrl": base_url, "api": "openai-completions", "apiKey": "none",
                    "compat": {"supportsDeveloperRole": false, "supportsReasoningEffort": false},
                    "models": [{"id": "echo", "reasoning": false}],
                }}});
                std::fs::write(home.join("models.json"), models.to_string()).unwrap();
                put("PI_CODING_AGENT_DIR", home.display().to_string());
                put("PI_OFFLINE", "1".into());
                vec!["--mode", "rpc", "--provider", "scripted", "--model", "echo"]
            }
            Agent::Opencode => {
                let h = home.display().to_string();
                for (k, v) in [
                    ("HOME", ""),
                    ("XDG_CONFIG_HOME", "/.config"),
                    ("XDG_DATA_HOME", "/.local/share"),
                    ("XDG_CACHE_HOME", "/.cache"),
                    ("XDG_STATE_HOME", "/.local/state"),
                ] {
                    put(k, format!("{h}{v}"));
                }
                put("NO_PROXY", "127.0.0.1,localhost".into());
                let config = home.join("opencode.json");
                let body = json!({
                    "$schema": "https://opencode.ai/config.json", "autoupdate": false, "share": "disabled",
                    "model": "mock/mock-model", "small_model": "mock/mock-model", "enabled_providers": ["mock"],
                    "provider": {"mock": {
                        "npm": "@ai-sdk/openai-compatible", "name": "Mock",
                        "options": {"baseURL": base_url, "apiKey": "dummy"},
                        "models": {"mock-model": {"name": "Mock Model", "tool_call": true,
                            "limit": {"context": 128000, "output": 4096}}},
                    }},
                    "permission": {"edit": "ask", "bash": "ask", "webfetch": "deny"},
                    "lsp": false, "formatter": false,
                });
                std::fs::write(&config, body.to_string()).unwrap();
                put("OPENCODE_CONFIG", config.display().to_string());
                let flags = "AUTOUPDATE MODELS_FETCH LSP_DOWNLOAD DEFAULT_PLUGINS SHARE CLAUDE_CODE EXTERNAL_SKILLS";
                for flag in flags.split(' ').chain(["PROJECT_CONFIG"]) {
                    put(&format!("OPENCODE_DISABLE_{flag}"), "1".into());
                }
                vec!["acp", "--pure"]
            }
        };
        let mut t = toml::Table::new();
        t.insert("command".into(), command.display().to_string().into());
        t.insert(
            "args".into(),
            args.into_iter().map(toml::Value::from).collect::<Vec<_>>().into(),
        );
        t.insert("env".into(), toml::Value::Table(env));
        t.insert("protocol".into(), protocol.into());
        // In its box (the default): its own directory, and the model server as its one endpoint.
        let endpoint = base_url
            .trim_start_matches("http://")
            .split('/')
            .next()
            .unwrap_or_default()
            .to_string();
        t.insert("endpoints".into(), vec![toml::Value::from(endpoint)].into());
        t.insert(
            "writable_paths".into(),
            vec![toml::Value::from(home.display().to_string())].into(),
        );
        (t, version)
    }
}

/// Token `i` of every streamed answer; the answer is their concatenation (no space to trim at either end).
fn token(i: usize) -> String {
    if i == 0 { "t0".into() } else { format!(" t{i}") }
}

/// What the model server saw: turns (requests offering tools) live and finished, requests dropped, side calls.
#[derive(Default)]
struct Streams {
    live: AtomicU64,
    finished: AtomicU64,
    dropped: AtomicU64,
    side: AtomicU64,
    last_end: std::sync::Mutex<Option<Instant>>,
}

/// An OpenAI Chat Completions server (`POST .../chat/completions`, one request per connection): a request
/// offering tools (a turn) gets `tokens` tokens streamed at `RATE` a second; one without (a title) gets a
/// short text at once. Every reply is streamed: `data:` chunks, the last with `finish_reason` and `usage`,
/// then `data: [DONE]`.
async fn model_server(tokens: usize) -> (String, Arc<Streams>, tokio::task::AbortHandle) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/v1", listener.local_addr().unwrap());
    let streams = Arc::new(Streams::default());
    let s = streams.clone();
    let accept = tokio::spawn(async move {
        while let Ok((conn, _)) = listener.accept().await {
            tokio::spawn(answer(conn, tokens, s.clone()));
        }
    });
    (url, streams, accept.abort_handle())
}

async fn answer(mut conn: TcpStream, tokens: usize, s: Arc<Streams>) {
    // Anything else (another path, a reply not streamed) closes the connection, counted: the run fails on it.
    let Some((_, body)) = read_request(&mut conn)
        .await
        .filter(|(p, b)| p.ends_with("/chat/completions") && b["stream"] == true)
    else {
        s.dropped.fetch_add(1, Ordering::Relaxed);
        return;
    };
    let chunk = |delta: Value, finish: Option<&str>| {
        json!({"id": "chatcmpl-bench", "object": "chat.completion.chunk", "created": 0, "model": body["model"],
               "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
    };
    let turn = body["tools"].as_array().is_some_and(|t| !t.is_empty());
    let text: Vec<String> = match turn {
        true => (0..tokens).map(token).collect(),
        false => vec!["Bench title".into()],
    };
    let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n";
    let mut ok = conn.write_all(head.as_bytes()).await.is_ok();
    if turn {
        s.live.fetch_add(1, Ordering::Relaxed);
    }
    let mut tick = tokio::time::interval(EVERY);
    for (i, piece) in text.iter().enumerate() {
        if !ok {
            break;
        }
        if turn {
            tick.tick().await;
        }
        let delta = match i {
            0 => json!({"role": "assistant", "content": piece}),
            _ => json!({"content": piece}),
        };
        ok = conn
            .write_all(format!("data: {}\n\n", chunk(delta, None)).as_bytes())
            .await
            .is_ok();
    }
    let mut last = chunk(json!({}), Some("stop"));
    last["usage"] = json!({"prompt_tokens": 100, "completion_tokens": text.len(), "total_tokens": 100 + text.len()});
    ok = ok
        && conn
            .write_all(format!("data: {last}\n\ndata: [DONE]\n\n").as_bytes())
            .await
            .is_ok();
    let _ = conn.shutdown().await;
    if turn {
        *s.last_end.lock().unwrap() = Some(Instant::now());
        s.live.fetch_sub(1, Ordering::Relaxed);
        s.finished.fetch_add(1, Ordering::Relaxed);
        if !ok {
            s.dropped.fetch_add(1, Ordering::Relaxed);
        }
    } else if ok {
        s.side.fetch_add(1, Ordering::Relaxed);
    } else {
        s.dropped.fetch_add(1, Ordering::Relaxed);
    }
}

/// One request: its path and JSON body (by `content-length`; the agents send no other kind).
async fn read_request(conn: &mut TcpStream) -> Option<(String, Value)> {
    let (mut buf, mut tmp) = (Vec::new(), [0u8; 16384]);
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
            let length: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse().ok())?;
            if buf.len() >= end + 4 + length {
                let path = head.split_whitespace().nth(1)?.to_string();
                return Some((path, serde_json::from_slice(&buf[end + 4..end + 4 + length]).ok()?));
            }
        }
        let n = conn.read(&mut tmp).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&tmp[..n]);
    }
}

/// Every process under `roots` (the roots included): CPU seconds (own and reaped, so a child that ends
/// inside a window still counts) and resident KiB, summed; and their pids.
fn trees(roots: &[u32]) -> (f64, u64, Vec<u32>) {
    let procs: Vec<(u32, ProcStat)> = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().to_string();
            Some((name.parse().ok()?, proc_stat(&name)?))
        })
        .collect();
    let mut inside: HashSet<u32> = roots.iter().copied().collect();
    loop {
        let before = inside.len();
        for (pid, s) in &procs {
            if inside.contains(&s.ppid) {
                inside.insert(*pid);
            }
        }
        if inside.len() == before {
            break;
        }
    }
    let (mut cpu, mut rss) = (0.0, 0);
    for (pid, s) in procs.iter().filter(|(p, _)| inside.contains(p)) {
        cpu += s.own + s.reaped;
        // statm: size, resident, .. in pages.
        rss += std::fs::read_to_string(format!("/proc/{pid}/statm"))
            .ok()
            .and_then(|m| m.split_whitespace().nth(1)?.parse::<u64>().ok())
            .unwrap_or(0)
            * 4;
    }
    (cpu, rss, inside.into_iter().collect())
}

/// The text of the last assistant entry of a session's transcript (Pi's message and ACP's turn both keep
/// `content: [{type: text, text}]`), and its stop reason.
fn last_answer(snapshot: &Value) -> Option<(String, String)> {
    let m = snapshot["transcript"]
        .as_array()?
        .iter()
        .rev()
        .find(|m| m["role"] == "assistant")?;
    let text = m["content"]["content"]
        .as_array()?
        .iter()
        .filter(|p| p["type"] == "text")
        .filter_map(|p| p["text"].as_str())
        .collect();
    Some((text, m["content"]["stopReason"].as_str().unwrap_or("?").to_string()))
}

struct Berth {
    server: Server,
    http: reqwest::Client,
    token: String,
}

impl Berth {
    async fn call(&self, post: Option<Value>, path: &str, expect: u16) -> Value {
        let url = format!("{}{path}", self.server.url);
        let req = match &post {
            Some(body) => self.http.post(url).json(body),
            None => self.http.get(url),
        };
        let r = req.bearer_auth(&self.token).send().await.unwrap();
        let status = r.status().as_u16();
        let v: Value = r.json().await.unwrap_or(Value::Null);
        assert_eq!(status, expect, "{path}: {v}");
        v
    }
}

fn mib(kib: f64) -> String {
    format!("{:.1} MiB", kib / 1024.0)
}

pub(crate) async fn agents(table: &mut Table, backend: &'static str, pg_server: Option<String>) {
    for agent in [Agent::Pi, Agent::Opencode] {
        run(table, backend, pg_server.as_deref(), agent).await;
    }
}

async fn run(table: &mut Table, backend: &'static str, pg_server: Option<&str>, agent: Agent) {
    let [name, protocol, ..] = agent.about();
    eprintln!("\n== {backend}: agents, {name} ({protocol})");
    let tokens = env_usize("BERTH_BENCH_AGENT_SECS", 20) * RATE;
    let (base_url, streams, model) = model_server(tokens).await;
    let dir = tempfile::TempDir::new().unwrap();
    let scratch = dir.path().canonicalize().unwrap();
    for d in ["data", "worktrees", "repos", "agent"] {
        std::fs::create_dir_all(scratch.join(d)).unwrap();
    }
    let source = scratch.join("repos/svc");
    git_init(&source);
    let (profile, version) = agent.profile(&scratch.join("agent"), &base_url);
    let config_file = scratch.join("berth.toml");
    let agents = toml::Table::from_iter([("bench".to_string(), toml::Value::Table(profile))]);
    let config = toml::Table::from_iter([("agents".to_string(), toml::Value::Table(agents))]);
    std::fs::write(&config_file, toml::to_string(&config).unwrap()).unwrap();
    let mut env = BTreeMap::new();
    let mut put = |k: &str, v: String| env.insert(k.to_string(), v);
    put("BERTH_DATA_DIR", scratch.join("data").display().to_string());
    put("BERTH_JWT_SECRET", SECRET.to_string());
    put("BERTH_WORKTREE_ROOT", scratch.join("worktrees").display().to_string());
    put("BERTH_REPO_ROOTS", scratch.join("repos").display().to_string());
    put("BERTH_CONFIG", config_file.display().to_string());
    put("BERTH_BIND", format!("127.0.0.1:{}", free_port()));
    let mut pg_db = None;
    if let Some(server) = pg_server {
        let name = format!("berth_bench_{}", Uuid::new_v4().simple());
        let admin = sea_orm::Database::connect(server).await.unwrap();
        exec(&admin, &format!("CREATE DATABASE \"{name}\"")).await;
        let mut url = reqwest::Url::parse(server).unwrap();
        url.set_path(&format!("/{name}"));
        env.insert("BERTH_DATABASE_URL".to_string(), url.to_string());
        pg_db = Some((admin, name));
    }
    let log = std::fs::File::create(scratch.join("server.log")).unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_berth"))
        .arg("serve")
        .envs(&env)
        .env("BERTH_NODE_ID", "bench-server")
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let url = format!("http://{}", env["BERTH_BIND"]);
    let mut b = Berth {
        server: Server { child, url },
        http: reqwest::Client::new(),
        token: String::new(),
    };
    wait_ready(&b.http, &b.server.url).await;
    let (config, admin) = (berth::config::Config::load(&env).unwrap(), [berth::auth::Scope::Admin]);
    b.token = berth::auth::JwtVerifier::from_config(&config)
        .unwrap()
        .mint("bench", &admin, None, None, Duration::from_secs(7200))
        .unwrap();
    let db = sea_orm::Database::connect(config.database_url.as_str()).await.unwrap();
    let pid = b.server.child.id();

    let ws = id_of(&b.call(Some(json!({"name": "agents"})), "/api/v1/workspaces", 201).await);
    let repo = json!({"path": source.display().to_string()});
    let repo = id_of(
        &b.call(Some(repo), &format!("/api/v1/workspaces/{ws}/repositories"), 201)
            .await,
    );
    let task = json!({"title": "agents", "repositories": [{"repository_id": repo}]});
    let task = id_of(&b.call(Some(task), &format!("/api/v1/workspaces/{ws}/tasks"), 201).await);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let rss_none = b.server.rss_kib() as f64;

    // 16 sessions on the task (one worktree), each with its agent started; all idle.
    let mut sessions = Vec::new();
    for _ in 0..AGENTS {
        let body = json!({"executor_type": "worktree", "agent_profile": "bench"});
        sessions.push(id_of(
            &b.call(Some(body), &format!("/api/v1/tasks/{task}/sessions"), 201).await,
        ));
    }
    let deadline = Instant::now() + WAIT;
    let mut roots = Vec::new();
    for s in &sessions {
        let v = loop {
            let v = b.call(None, &format!("/api/v1/sessions/{s}"), 200).await;
            if v["state"] == "idle" {
                break v;
            }
            assert!(Instant::now() < deadline, "session {s} never idle: {v}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let execution: Uuid = v["execution_id"].as_str().expect("an execution").parse().unwrap();
        let e = berth::entity::agent_execution::Entity::find_by_id(execution)
            .one(&db)
            .await
            .unwrap()
            .unwrap();
        let root = e.pid.expect("the execution records its pid") as u32;
        assert_eq!(
            proc_stat(&root.to_string()).map(|s| s.ppid),
            Some(pid),
            "agent {root} is berth's child"
        );
        roots.push(root);
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rss_idle = b.server.rss_kib() as f64;
    let cpu_idle = cpu_of(&pid.to_string()).0;
    tokio::time::sleep(IDLE_CPU).await;
    let cpu_idle = (cpu_of(&pid.to_string()).0 - cpu_idle) / IDLE_CPU.as_secs_f64() * 100.0;

    // Prompt all 16; the window is from the moment all 16 streams are live to the first one's end.
    let latest = b.call(None, "/api/v1/events?limit=1", 200).await["latest_seq"]
        .as_i64()
        .unwrap();
    let prompted = Instant::now();
    futures_util::future::join_all(sessions.iter().map(|s| {
        let (b, text) = (&b, json!({"text": format!("Stream {tokens} tokens.")}));
        async move { b.call(Some(text), &format!("/api/v1/sessions/{s}/messages"), 202).await }
    }))
    .await;
    while streams.live.load(Ordering::Relaxed) < AGENTS as u64 {
        assert!(
            streams.finished.load(Ordering::Relaxed) == 0,
            "a stream ended before all 16 were live"
        );
        assert!(prompted.elapsed() < WAIT, "not every agent called the model");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let ramp = prompted.elapsed();
    let t0 = Instant::now();
    let (berth0, agents0, bench0) = (cpu_of(&pid.to_string()).0, trees(&roots).0, cpu_of("self").0);
    // VmRSS every 100 ms until the first stream ends (looked at every 5 ms).
    let (mut rss, mut next) = (Vec::new(), t0);
    while streams.finished.load(Ordering::Relaxed) == 0 {
        if Instant::now() >= next {
            rss.push(b.server.rss_kib() as f64);
            next += SAMPLE;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let (berth1, (agents1, agents_rss, tree)) = (cpu_of(&pid.to_string()).0, trees(&roots));
    let (bench1, window) = (cpu_of("self").0, t0.elapsed());
    // What to end by pid if berth leaves any of it: each process with its command line (never a reused pid).
    let tree: Vec<_> = tree
        .into_iter()
        .map(|p| (p, std::fs::read(format!("/proc/{p}/cmdline")).ok()))
        .collect();
    let secs = window.as_secs_f64();
    let berth_cpu = (berth1 - berth0) / secs * 100.0;
    let agents_cpu = (agents1 - agents0) / secs * 100.0;
    let bench_cpu = (bench1 - bench0) / secs * 100.0;

    // Every turn ended with the whole text.
    let expected: String = (0..tokens).map(token).collect();
    let (mut exact, mut reasons) = (0, Vec::new());
    let deadline = Instant::now() + WAIT;
    for s in &sessions {
        loop {
            let snap = b.call(None, &format!("/api/v1/sessions/{s}/snapshot"), 200).await;
            if snap["session"]["state"] == "idle"
                && let Some((text, reason)) = last_answer(&snap)
            {
                exact += usize::from(text == expected);
                reasons.push(reason);
                break;
            }
            assert!(Instant::now() < deadline, "session {s}'s turn never ended");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    let settled = streams.last_end.lock().unwrap().map_or(Duration::ZERO, |t| t.elapsed());
    reasons.sort();
    reasons.dedup();
    // The events written, and the agent's delta lines they hold (`coalesced`, Pi's and ACP's alike).
    let (mut after, mut outputs, mut deltas) = (latest, 0usize, 0u64);
    loop {
        let path = format!("/api/v1/events?after={after}&limit=1000");
        let events = b.call(None, &path, 200).await["events"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let Some(last) = events.last() else { break };
        after = last["seq"].as_i64().unwrap();
        for e in events.iter().filter(|e| e["type"] == "runtime.output") {
            outputs += 1;
            deltas += e["data"]["event"]["coalesced"].as_u64().unwrap_or(0);
        }
    }

    let n = AGENTS as f64;
    let what = format!("16 {name} agents ({protocol}) streaming 50 tokens/s each");
    table.add(
        backend,
        &format!("{what}: berth CPU, {secs:.1} s with all 16 live"),
        format!(
            "{berth_cpu:.1}% of a core, {:.2}% per agent (16 idle agents: {cpu_idle:.1}%)",
            berth_cpu / n
        ),
        format!(
            "the agents {agents_cpu:.0}% of a core, {:.1}% per agent; the model server {bench_cpu:.1}%",
            agents_cpu / n
        ),
        format!("{:.3} of the agents' CPU", berth_cpu / agents_cpu.max(1e-9)),
        "<= 2% of a core per agent",
        Some(berth_cpu / n <= CPU_TARGET),
    );
    let peak = rss.iter().copied().fold(0.0, f64::max);
    let median = *median_by(&mut rss, |v| *v);
    let per_peak = (peak - rss_none) / n;
    table.add(
        backend,
        &format!("{what}: berth resident memory, sampled every 100 ms"),
        format!(
            "VmRSS {} with no agent, {} with 16 idle; streaming peak {}, median {}; per agent: +{} peak, +{} median (idle +{})",
            mib(rss_none),
            mib(rss_idle),
            mib(peak),
            mib(median),
            mib(per_peak),
            mib((median - rss_none) / n),
            mib((rss_idle - rss_none) / n)
        ),
        format!("the agents' trees {} ({} each)", mib(agents_rss as f64), mib(agents_rss as f64 / n)),
        format!("{:.4} of the agents' memory", (peak - rss_none) / (agents_rss as f64).max(1.0)),
        "<= 2 MiB per agent (peak growth from no agent)",
        Some(per_peak <= RSS_TARGET_KIB),
    );
    let dropped = streams.dropped.load(Ordering::Relaxed);
    table.add(
        backend,
        &format!("{what}: the turns ({name} {version})"),
        format!(
            "{exact}/16 transcripts exact ({tokens} tokens); stop reasons {reasons:?}; {outputs} runtime.output events holding {deltas} delta lines; streams live {:.1} s after the prompts; last turn idle {:.1} s after its last token",
            ramp.as_secs_f64(),
            settled.as_secs_f64()
        ),
        format!(
            "{} streams served, {dropped} dropped; {} side calls",
            streams.finished.load(Ordering::Relaxed),
            streams.side.load(Ordering::Relaxed)
        ),
        "-".into(),
        "every turn ends with the whole text",
        Some(exact == AGENTS && dropped == 0),
    );

    // berth stops its agents on SIGTERM; anything left of their trees is ended by pid.
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    let deadline = Instant::now() + Duration::from_secs(30);
    while b.server.child.try_wait().unwrap().is_none() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for (p, cmdline) in tree {
        if cmdline.is_some() && std::fs::read(format!("/proc/{p}/cmdline")).ok() == cmdline {
            unsafe { libc::kill(p as i32, libc::SIGKILL) };
        }
    }
    drop(b);
    model.abort();
    drop(db);
    if let Some((admin, name)) = pg_db {
        tokio::time::sleep(Duration::from_millis(200)).await;
        exec(&admin, &format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)")).await;
    }
}
