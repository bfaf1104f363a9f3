//! Event sequencing on PostgreSQL with one replica and with three on one database.
//!
//! - Stamping latency at idle: one PATCH at a time (a pause between them) through a random replica,
//!   timed from sending the request to its `task.updated` frame on a stream held open on another
//!   replica. That is an upper bound of commit-to-delivery (it also holds the HTTP request, the
//!   transaction and the commit). The servers' own `berth_event_stamp_seconds` histograms
//!   (commit to publication) are reported beside it.
//! - Throughput: 16 clients PATCHing tasks as fast as they can for the window, first against one
//!   replica alone, then spread over three on the same database; and each PATCH's latency then.
//! - The same for session create + delete cycles (`POST /tasks/{id}/sessions` with `start: false` on a
//!   task whose environment is ready, then `DELETE /sessions/{id}`), 16 clients on one task.
use super::*;

const CLIENTS: usize = 16;
const IDLE_WRITES: usize = 200;

pub(crate) async fn sequencing(table: &mut Table, pg_server: &str) {
    eprintln!("\n== postgres: event sequencing with 1 and 3 replicas");
    let dir = tempfile::TempDir::new().unwrap();
    let scratch = dir.path().canonicalize().unwrap();
    let name = format!("berth_bench_{}", Uuid::new_v4().simple());
    let admin = sea_orm::Database::connect(pg_server).await.unwrap();
    exec(&admin, &format!("CREATE DATABASE \"{name}\"")).await;
    let mut url = reqwest::Url::parse(pg_server).unwrap();
    url.set_path(&format!("/{name}"));
    let http = reqwest::Client::builder()
        .pool_idle_timeout(Duration::from_secs(2))
        .build()
        .unwrap();

    let source = scratch.join("repos/svc");
    std::fs::create_dir_all(scratch.join("worktrees")).unwrap();
    git_init(&source);
    let mut servers = vec![start_replica(&scratch, url.as_str(), 0)];
    wait_ready(&http, &servers[0].url).await;
    let token = mint(&scratch, url.as_str());
    let ws = id_of(
        &post(
            &http,
            &servers[0].url,
            &token,
            "/api/v1/workspaces",
            json!({"name": "seq"}),
        )
        .await,
    );
    let mut tasks = Vec::new();
    for i in 0..CLIENTS {
        let t = post(
            &http,
            &servers[0].url,
            &token,
            &format!("/api/v1/workspaces/{ws}/tasks"),
            json!({"title": format!("t{i}")}),
        )
        .await;
        tasks.push(id_of(&t));
    }

    // The cycles' task: one repository, its environment made ready by a first session.
    let repository = id_of(
        &post(
            &http,
            &servers[0].url,
            &token,
            &format!("/api/v1/workspaces/{ws}/repositories"),
            json!({"path": source.display().to_string()}),
        )
        .await,
    );
    let cycled = id_of(
        &post(
            &http,
            &servers[0].url,
            &token,
            &format!("/api/v1/workspaces/{ws}/tasks"),
            json!({"title": "cycles", "repositories": [{"repository_id": repository}]}),
        )
        .await,
    );
    post(
        &http,
        &servers[0].url,
        &token,
        &format!("/api/v1/tasks/{cycled}/sessions"),
        json!({"executor_type": "worktree", "start": false}),
    )
    .await;

    let one = throughput(&http, &token, &[servers[0].url.clone()], &tasks, Op::Patch).await;
    let one_cycles = throughput(&http, &token, &[servers[0].url.clone()], &tasks, Op::Cycle(cycled)).await;
    for n in 1..3 {
        servers.push(start_replica(&scratch, url.as_str(), n));
    }
    for s in &servers {
        wait_ready(&http, &s.url).await;
    }
    let urls: Vec<String> = servers.iter().map(|s| s.url.clone()).collect();
    let three = throughput(&http, &token, &urls, &tasks, Op::Patch).await;
    let three_cycles = throughput(&http, &token, &urls, &tasks, Op::Cycle(cycled)).await;
    table.add(
        "postgres",
        &format!("task PATCHes, {CLIENTS} clients, 3 replicas on one database (against 1 replica)"),
        format!(
            "{:.0} PATCH/s; PATCH p50 {} p99 {}",
            three.rate,
            fmt_d(three.p50),
            fmt_d(three.p99)
        ),
        format!(
            "{:.0} PATCH/s with 1 replica; p50 {} p99 {}",
            one.rate,
            fmt_d(one.p50),
            fmt_d(one.p99)
        ),
        format!("{:.2}x", three.rate / one.rate),
        "reported (2 cores: the replicas share them)",
        None,
    );
    table.add(
        "postgres",
        &format!("session create + delete cycles, {CLIENTS} clients on one task, 3 replicas on one database (against 1 replica)"),
        format!(
            "{:.0} cycles/s; cycle p50 {} p99 {}",
            three_cycles.rate,
            fmt_d(three_cycles.p50),
            fmt_d(three_cycles.p99)
        ),
        format!(
            "{:.0} cycles/s with 1 replica; p50 {} p99 {}",
            one_cycles.rate,
            fmt_d(one_cycles.p50),
            fmt_d(one_cycles.p99)
        ),
        format!("{:.2}x", three_cycles.rate / one_cycles.rate),
        "reported (2 cores: the replicas share them)",
        None,
    );

    let (p50, p99) = idle_latency(&http, &token, &urls, &tasks).await;
    let mut stamped = String::new();
    for s in &urls {
        let text = http
            .get(format!("{s}/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        let _ = write!(stamped, "{} ", histogram_summary(&text, "berth_event_stamp_seconds"));
    }
    table.add(
        "postgres",
        "event stamping latency at idle, 3 replicas: PATCH sent -> its frame on another replica's stream",
        format!("p50 {} p99 {}", fmt_d(p50), fmt_d(p99)),
        format!("servers' commit -> publication histograms: {}", stamped.trim()),
        "-".into(),
        "p99 < 50 ms",
        Some(p99 < Duration::from_millis(50)),
    );

    drop(servers);
    tokio::time::sleep(Duration::from_millis(200)).await;
    exec(&admin, &format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)")).await;
}

fn mint(scratch: &Path, database: &str) -> String {
    let mut env = BTreeMap::new();
    env.insert("BERTH_JWT_SECRET".to_string(), SECRET.to_string());
    env.insert("BERTH_DATA_DIR".to_string(), scratch.display().to_string());
    env.insert("BERTH_DATABASE_URL".to_string(), database.to_string());
    let config = berth::config::Config::load(&env).unwrap();
    berth::auth::JwtVerifier::from_config(&config)
        .unwrap()
        .mint(
            "bench",
            &[berth::auth::Scope::Admin],
            None,
            None,
            Duration::from_secs(7200),
        )
        .unwrap()
}

fn start_replica(scratch: &Path, database: &str, n: usize) -> Server {
    let data = scratch.join(format!("replica-{n}"));
    std::fs::create_dir_all(&data).unwrap();
    let port = free_port();
    let log = std::fs::File::create(scratch.join(format!("replica-{n}.log"))).unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_berth"))
        .arg("serve")
        .env("BERTH_DATA_DIR", &data)
        .env("BERTH_WORKTREE_ROOT", scratch.join("worktrees"))
        .env("BERTH_REPO_ROOTS", scratch.join("repos"))
        .env("BERTH_JWT_SECRET", SECRET)
        .env("BERTH_DATABASE_URL", database)
        .env("BERTH_BIND", format!("127.0.0.1:{port}"))
        .env("BERTH_NODE_ID", format!("replica-{n}"))
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    Server {
        child,
        url: format!("http://127.0.0.1:{port}"),
    }
}

async fn post(http: &reqwest::Client, base: &str, token: &str, path: &str, body: Value) -> Value {
    let r = http
        .post(format!("{base}{path}"))
        .bearer_auth(token)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "POST {path}: {}", r.status());
    r.json().await.unwrap()
}

struct Throughput {
    rate: f64,
    p50: Duration,
    p99: Duration,
}

/// What each client repeats: a PATCH of its own task, or a session create + delete on one shared task.
#[derive(Clone, Copy)]
enum Op {
    Patch,
    Cycle(Uuid),
}

async fn throughput(http: &reqwest::Client, token: &str, urls: &[String], tasks: &[Uuid], op: Op) -> Throughput {
    let window = Duration::from_secs(secs());
    let done = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let clients: Vec<_> = tasks
        .iter()
        .enumerate()
        .map(|(i, task)| {
            let (http, token, url, task, done) = (
                http.clone(),
                token.to_string(),
                urls[i % urls.len()].clone(),
                *task,
                done.clone(),
            );
            tokio::spawn(async move {
                let mut latencies = Vec::new();
                let mut n = 0u64;
                while started.elapsed() < window {
                    n += 1;
                    let t = Instant::now();
                    match op {
                        Op::Patch => {
                            let r = http
                                .patch(format!("{url}/api/v1/tasks/{task}"))
                                .bearer_auth(&token)
                                .json(&json!({"title": format!("{i}-{n}")}))
                                .send()
                                .await
                                .unwrap();
                            assert!(r.status().is_success(), "PATCH: {}", r.status());
                        }
                        Op::Cycle(shared) => {
                            let session = post(
                                &http,
                                &url,
                                &token,
                                &format!("/api/v1/tasks/{shared}/sessions"),
                                json!({"executor_type": "worktree", "start": false}),
                            )
                            .await;
                            let r = http
                                .delete(format!("{url}/api/v1/sessions/{}", id_of(&session)))
                                .bearer_auth(&token)
                                .send()
                                .await
                                .unwrap();
                            assert!(r.status().is_success(), "DELETE session: {}", r.status());
                        }
                    }
                    latencies.push(t.elapsed());
                    done.fetch_add(1, Ordering::Relaxed);
                }
                latencies
            })
        })
        .collect();
    let mut all = Vec::new();
    for c in clients {
        all.extend(c.await.unwrap());
    }
    let elapsed = started.elapsed();
    all.sort();
    Throughput {
        rate: done.load(Ordering::Relaxed) as f64 / elapsed.as_secs_f64(),
        p50: all[all.len() / 2],
        p99: all[all.len() * 99 / 100],
    }
}

/// One PATCH at a time through replica `n % 3`; its frame awaited on the stream of replica `(n+1) % 3`.
async fn idle_latency(http: &reqwest::Client, token: &str, urls: &[String], tasks: &[Uuid]) -> (Duration, Duration) {
    let mut streams = Vec::new();
    for url in urls {
        let latest = http
            .get(format!("{url}/api/v1/events?limit=1"))
            .bearer_auth(token)
            .send()
            .await
            .unwrap()
            .json::<Value>()
            .await
            .unwrap()["latest_seq"]
            .as_i64()
            .unwrap();
        let resp = http
            .get(format!("{url}/api/v1/events/stream?after={latest}"))
            .bearer_auth(token)
            .send()
            .await
            .unwrap();
        streams.push((resp, String::new()));
    }
    let mut latencies = Vec::new();
    for n in 0..IDLE_WRITES {
        let title = format!("idle-{n}");
        let t = Instant::now();
        let r = http
            .patch(format!("{}/api/v1/tasks/{}", urls[n % urls.len()], tasks[0]))
            .bearer_auth(token)
            .json(&json!({ "title": title }))
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success());
        let (resp, buf) = &mut streams[(n + 1) % urls.len()];
        let deadline = Instant::now() + Duration::from_secs(30);
        while !buf.contains(&format!("\"{title}\"")) {
            assert!(Instant::now() < deadline, "no frame for {title}");
            let chunk = resp.chunk().await.unwrap().expect("the stream stays open");
            buf.push_str(&String::from_utf8_lossy(&chunk));
        }
        latencies.push(t.elapsed());
        buf.clear();
        // Drain what the other streams received, so their buffers stay small.
        for (i, (resp, buf)) in streams.iter_mut().enumerate() {
            if i != (n + 1) % urls.len() {
                while let Ok(Ok(Some(_))) = tokio::time::timeout(Duration::from_millis(1), resp.chunk()).await {}
                buf.clear();
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    latencies.sort();
    (latencies[latencies.len() / 2], latencies[latencies.len() * 99 / 100])
}

/// "count, share under 5 ms and under 50 ms" from a Prometheus histogram's text.
fn histogram_summary(text: &str, name: &str) -> String {
    let bucket = |le: &str| -> f64 {
        let prefix = format!("{name}_bucket{{le=\"{le}\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0.0)
    };
    let count = bucket("+Inf");
    if count == 0.0 {
        return "[none]".into();
    }
    format!(
        "[{count:.0}: {:.0}% <= 5 ms, {:.0}% <= 50 ms]",
        100.0 * bucket("0.005") / count,
        100.0 * bucket("0.05") / count
    )
}
