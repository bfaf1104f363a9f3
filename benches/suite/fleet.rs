//! What it costs to send a request to a node that does not hold the work. Two release
//! berth processes (nodes `fleet-a` and `fleet-b`) on one PostgreSQL database; a task whose repository
//! node a registered; sessions created (`start: false`, attaching to the task's ready environment) through
//! a, which carries them out itself, and through b, which forwards each to a over HTTP and answers with
//! a's answer. Sequential requests, so the numbers are latency, not throughput. PostgreSQL only: SQLite
//! is one node.
use super::*;

const ROUNDS: usize = 200;

struct Node {
    server: Server,
}

fn start(scratch: &Path, env: &BTreeMap<String, String>, node: &str) -> Node {
    let port = free_port();
    let log = std::fs::File::create(scratch.join(format!("{node}.log"))).unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_berth"))
        .arg("serve")
        .envs(env)
        .env("BERTH_BIND", format!("127.0.0.1:{port}"))
        .env("BERTH_NODE_ID", node)
        .env("BERTH_DATA_DIR", scratch.join(node).display().to_string())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    Node {
        server: Server {
            child,
            url: format!("http://127.0.0.1:{port}"),
        },
    }
}

async fn post(http: &reqwest::Client, token: &str, url: String, body: Value, want: u16) -> Value {
    let r = http.post(&url).bearer_auth(token).json(&body).send().await.unwrap();
    assert_eq!(r.status().as_u16(), want, "{url}");
    r.json().await.unwrap()
}

/// Create-session latency through each node: (p50, p95).
async fn latencies(http: &reqwest::Client, token: &str, via: &str, task: Uuid) -> (Duration, Duration) {
    let mut times = Vec::with_capacity(ROUNDS);
    for _ in 0..ROUNDS {
        let started = Instant::now();
        let s = post(
            http,
            token,
            format!("{via}/api/v1/tasks/{task}/sessions"),
            json!({"executor_type": "worktree", "start": false}),
            201,
        )
        .await;
        times.push(started.elapsed());
        let r = http
            .delete(format!("{via}/api/v1/sessions/{}", id_of(&s)))
            .bearer_auth(token)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 204);
    }
    times.sort();
    (times[ROUNDS / 2], times[ROUNDS * 95 / 100])
}

pub(crate) async fn fleet(table: &mut Table, pg_server: &str) {
    eprintln!("\n== fleet (postgres)");
    let dir = tempfile::TempDir::new().unwrap();
    let scratch = dir.path().canonicalize().unwrap();
    for d in ["worktrees", "repos"] {
        std::fs::create_dir_all(scratch.join(d)).unwrap();
    }
    let source = scratch.join("repos/svc");
    git_init(&source);
    let name = format!("berth_bench_{}", Uuid::new_v4().simple());
    let admin = sea_orm::Database::connect(pg_server).await.unwrap();
    exec(&admin, &format!("CREATE DATABASE \"{name}\"")).await;
    let mut url = reqwest::Url::parse(pg_server).unwrap();
    url.set_path(&format!("/{name}"));
    let mut env = BTreeMap::new();
    env.insert("BERTH_DATABASE_URL".to_string(), url.to_string());
    env.insert("BERTH_JWT_SECRET".to_string(), SECRET.to_string());
    env.insert(
        "BERTH_WORKTREE_ROOT".to_string(),
        scratch.join("worktrees").display().to_string(),
    );
    env.insert(
        "BERTH_REPO_ROOTS".to_string(),
        scratch.join("repos").display().to_string(),
    );
    let a = start(&scratch, &env, "fleet-a");
    let http = reqwest::Client::new();
    wait_ready(&http, &a.server.url).await;
    let b = start(&scratch, &env, "fleet-b");
    wait_ready(&http, &b.server.url).await;
    let mut config_env = env.clone();
    config_env.insert(
        "BERTH_DATA_DIR".to_string(),
        scratch.join("fleet-a").display().to_string(),
    );
    let config = berth::config::Config::load(&config_env).unwrap();
    let token = berth::auth::JwtVerifier::from_config(&config)
        .unwrap()
        .mint(
            "bench",
            &[berth::auth::Scope::Admin],
            None,
            None,
            Duration::from_secs(7200),
        )
        .unwrap();
    let (ua, ub) = (a.server.url.clone(), b.server.url.clone());
    let ws = id_of(
        &post(
            &http,
            &token,
            format!("{ua}/api/v1/workspaces"),
            json!({"name": "fleet"}),
            201,
        )
        .await,
    );
    let repo = post(
        &http,
        &token,
        format!("{ua}/api/v1/workspaces/{ws}/repositories"),
        json!({"path": source.display().to_string()}),
        201,
    )
    .await;
    let task = json!({"title": "fleet", "repositories": [{"repository_id": id_of(&repo)}]});
    let task = id_of(&post(&http, &token, format!("{ua}/api/v1/workspaces/{ws}/tasks"), task, 201).await);
    // The environment is made once; every measured create attaches to it.
    post(
        &http,
        &token,
        format!("{ua}/api/v1/tasks/{task}/sessions"),
        json!({"executor_type": "worktree", "start": false}),
        201,
    )
    .await;
    // Warm both paths (connections, pools), then measure.
    latencies(&http, &token, &ua, task).await;
    latencies(&http, &token, &ub, task).await;
    let (local50, local95) = latencies(&http, &token, &ua, task).await;
    let (routed50, routed95) = latencies(&http, &token, &ub, task).await;
    let ms = |d: Duration| format!("{:.2} ms", d.as_secs_f64() * 1000.0);
    table.add(
        "postgres",
        "create session (attach), p50: through another node (forwarded) vs the owning node",
        ms(routed50),
        ms(local50),
        format!("{:.2}", routed50.as_secs_f64() / local50.as_secs_f64()),
        "none (measured)",
        None,
    );
    table.add(
        "postgres",
        "create session (attach), p95: through another node (forwarded) vs the owning node",
        ms(routed95),
        ms(local95),
        format!("{:.2}", routed95.as_secs_f64() / local95.as_secs_f64()),
        "none (measured)",
        None,
    );
    drop((a, b));
    drop(admin);
    let admin = sea_orm::Database::connect(pg_server).await.unwrap();
    exec(&admin, &format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)")).await;
}
