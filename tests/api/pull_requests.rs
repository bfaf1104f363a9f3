//! Pull requests against a GitHub that checks every request against GitHub's own published OpenAPI
//! description (Prism serving `@octokit/openapi`'s `api.github.com.json`, both pinned in tests/github,
//! installed by .ci/github), behind a small recording layer that keeps what Prism cannot (the state of a
//! pull request) and records Prism's verdict on each request; the test fails if any was refused. The push
//! before it goes through git's own HTTP server with a credential. Then the credential is looked for
//! everywhere it must not be: berth's log at debug level, every event, every answer, the repository's git
//! config.
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use serde_json::{Value, json};

use crate::both_backends;
use crate::helpers::{TestApp, git, seen, seen_json, wait_until_every};
use crate::landing::{GitServer, agent_writes, started, with_config};

both_backends!(a_pull_request_is_opened_on_a_github_that_validates_it_and_followed);

/// GitHub's API as Prism serves it from GitHub's description: one per test process, started on first use
/// (it takes a while to read the description), killed when the process ends.
/// `None` (with a notice) when they are not installed outside CI; with `CI` set that is a failure.
fn prism() -> Option<u16> {
    static PORT: OnceLock<Option<u16>> = OnceLock::new();
    *PORT.get_or_init(|| {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/github");
        let bin = dir.join("node_modules/.bin/prism");
        let spec = dir.join("node_modules/@octokit/openapi/generated/api.github.com.json");
        if !(bin.exists() && spec.exists()) {
            let why = "Prism and GitHub's OpenAPI description are not installed in tests/github (run .ci/github)";
            assert!(
                std::env::var_os("CI").is_none_or(|v| v.is_empty()),
                "CI is set but {why}"
            );
            use std::io::Write as _;
            let _ = writeln!(std::io::stderr(), "\nnote: the pull request tests did not run: {why}\n");
            return None;
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let (tx, rx) = std::sync::mpsc::channel();
        // Spawned from a thread that lives as long as the process: Prism dies with it (PDEATHSIG).
        std::thread::spawn(move || {
            let log = std::env::temp_dir().join(format!("berth-prism-{port}.log"));
            let mut cmd = std::process::Command::new(bin);
            cmd.args([
                "mock",
                "--errors",
                "--ignoreExamples",
                "-h",
                "127.0.0.1",
                "-p",
                &port.to_string(),
            ])
            .arg(spec)
            .stdin(std::process::Stdio::null())
            .stdout(std::fs::File::create(&log).unwrap())
            .stderr(std::process::Stdio::null());
            unsafe {
                std::os::unix::process::CommandExt::pre_exec(&mut cmd, || {
                    libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                    Ok(())
                });
            }
            let child = cmd.spawn().expect("prism starts");
            tx.send(()).unwrap();
            let _keep = child;
            loop {
                std::thread::park();
            }
        });
        rx.recv().unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(180);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(std::time::Instant::now() < deadline, "Prism never listened");
            std::thread::sleep(Duration::from_millis(200));
        }
        Some(port)
    })
}

/// One request berth made, and what Prism said of it.
#[derive(Debug, Clone)]
struct Seen {
    method: String,
    path: String,
    authorization: String,
    body: Value,
    prism_status: u16,
}

#[derive(Default)]
struct Layer {
    seen: Mutex<Vec<Seen>>,
    /// What an answer about a pull request says of its state (Prism keeps none, and makes one up).
    state: Mutex<Option<Value>>,
}

/// The recording layer in front of Prism; its port.
async fn layer(prism: u16, shared: Arc<Layer>) -> (u16, actix_web::dev::ServerHandle) {
    use actix_web::{App, HttpRequest, HttpResponse, HttpServer, web};
    let server = HttpServer::new(move || {
        let shared = shared.clone();
        App::new().default_service(web::to(move |req: HttpRequest, body: web::Bytes| {
            let shared = shared.clone();
            async move {
                let url = format!("http://127.0.0.1:{prism}{}", req.uri());
                let method = reqwest::Method::from_bytes(req.method().as_str().as_bytes()).unwrap();
                let mut out = reqwest::Client::new().request(method, url).body(body.to_vec());
                for (name, value) in req.headers() {
                    if name != "host" {
                        out = out.header(name.as_str(), value.as_bytes());
                    }
                }
                let res = out.send().await.unwrap();
                let status = res.status().as_u16();
                let mut answer: Value = res.json().await.unwrap_or(Value::Null);
                shared.seen.lock().unwrap().push(Seen {
                    method: req.method().to_string(),
                    path: req.path().to_string(),
                    authorization: req
                        .headers()
                        .get("authorization")
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or_default()
                        .to_string(),
                    body: serde_json::from_slice(&body).unwrap_or(Value::Null),
                    prism_status: status,
                });
                if status < 300
                    && let Some(state) = shared.state.lock().unwrap().clone()
                {
                    for (k, v) in state.as_object().unwrap() {
                        answer[k] = v.clone();
                    }
                }
                HttpResponse::build(actix_web::http::StatusCode::from_u16(status).unwrap()).json(answer)
            }
        }))
    })
    .workers(1)
    .bind(("127.0.0.1", 0))
    .unwrap();
    let port = server.addrs()[0].port();
    let server = server.run();
    let handle = server.handle();
    tokio::spawn(server);
    (port, handle)
}

const TOKEN: &str = "ghp_berthTestSecret0123456789abcdef";

async fn a_pull_request_is_opened_on_a_github_that_validates_it_and_followed(app: TestApp) {
    let Some(prism) = tokio::task::spawn_blocking(prism).await.unwrap() else {
        return;
    };
    let shared = Arc::new(Layer::default());
    let (api, layer_handle) = layer(prism, shared.clone()).await;
    let server = GitServer::start("x-access-token", TOKEN);
    let secrets = tempfile::TempDir::new().unwrap();
    let token_file = secrets.path().join("github");
    std::fs::write(&token_file, format!("{TOKEN}\n")).unwrap();
    let toml = format!(
        "[remotes.\"127.0.0.1:{}\"]\ntoken_file = \"{}\"\napi_url = \"http://127.0.0.1:{api}\"\n",
        server.port,
        token_file.display()
    );
    let (app, _config) = with_config(app, &toml, &[("BERTH_PULL_REQUEST_POLL_SECS", "1")]).await;
    *shared.state.lock().unwrap() = Some(json!({"state": "open", "merged": false, "merged_at": null, "draft": true}));
    let s = started(&app).await;
    std::fs::create_dir_all(server.root.path().join("acme")).unwrap();
    let bare = server.publish(&s.repo_path, "acme/svc.git");
    agent_writes(&app, &s, "feature.txt", "a feature\n").await;
    let c = app
        .post(
            &format!("/api/v1/environments/{}/commits", s.env),
            json!({"message": "feature"}),
        )
        .await
        .ok(201);
    let branch = c["commits"][0]["branch"].as_str().unwrap().to_string();

    let pr = app
        .post(
            &format!("/api/v1/environments/{}/pull-requests", s.env),
            json!({"repository_id": s.repo, "title": "A feature", "body": "Made by an agent.", "draft": true}),
        )
        .await
        .ok(201);
    assert_eq!(
        git(&bare, &["rev-parse", &format!("refs/heads/{branch}")]).trim(),
        c["commits"][0]["commit"].as_str().unwrap(),
        "pushed first"
    );
    assert_eq!(
        (pr["head"].as_str(), pr["base"].as_str()),
        (Some(branch.as_str()), Some("main"))
    );
    assert_eq!(pr["state"], "open");
    assert!(pr["number"].as_i64().unwrap() > 0 && pr["url"].is_string(), "{pr}");
    {
        let seen = shared.seen.lock().unwrap();
        let create = seen.iter().find(|r| r.method == "POST").expect("berth asked GitHub");
        assert_eq!(create.path, "/repos/acme/svc/pulls");
        assert_eq!(create.authorization, format!("Bearer {TOKEN}"));
        assert_eq!(
            create.body,
            json!({"title": "A feature", "body": "Made by an agent.", "head": branch, "base": "main", "draft": true})
        );
    }
    let task = app.get(&format!("/api/v1/tasks/{}", s.task)).await.ok(200);
    assert_eq!(task["pull_requests"][0]["number"], pr["number"], "{task}");

    // Merged on GitHub: the poll sees it.
    *shared.state.lock().unwrap() =
        Some(json!({"state": "closed", "merged": true, "merged_at": "2026-12-06T12:00:00Z"}));
    let every = Duration::from_millis(100);
    wait_until_every("the merge to be seen", Duration::from_secs(60), every, || async {
        let t = app.get(&format!("/api/v1/tasks/{}", s.task)).await.ok(200);
        seen_json(t["pull_requests"][0]["state"] == "merged", t)
    })
    .await;
    let events = app.get("/api/v1/events?types=pull_request.updated").await.ok(200);
    let states: Vec<&str> = events["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["data"]["pull_request"]["state"].as_str().unwrap())
        .collect();
    assert_eq!(states, ["open", "merged"]);
    let seen = shared.seen.lock().unwrap().clone();
    assert!(
        seen.iter()
            .any(|r| r.method == "GET" && r.path == format!("/repos/acme/svc/pulls/{}", pr["number"]))
    );
    for r in &seen {
        assert!(
            (200..300).contains(&r.prism_status),
            "GitHub's description refuses a request berth made: {r:?}"
        );
    }

    // The token is nowhere it must not be.
    let everything = app.get("/api/v1/events?limit=1000").await.ok(200).to_string();
    assert!(!everything.contains(TOKEN));
    assert!(!task.to_string().contains(TOKEN) && !pr.to_string().contains(TOKEN));
    assert!(
        !std::fs::read_to_string(s.repo_path.join(".git/config"))
            .unwrap()
            .contains(TOKEN)
    );
    layer_handle.stop(false).await;
}

/// Through the real binary: its log at debug level holds no trace of the credential after a push and a
/// pull request, nor do its events, its answers or the repository's git config.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_credential_appears_in_no_log_event_answer_or_git_config() {
    let Some(prism) = tokio::task::spawn_blocking(prism).await.unwrap() else {
        return;
    };
    let shared = Arc::new(Layer::default());
    let (api, layer_handle) = layer(prism, shared.clone()).await;
    let server = GitServer::start("x-access-token", TOKEN);
    let dir = tempfile::TempDir::new().unwrap();
    let root = dir.path().canonicalize().unwrap();
    let token_file = root.join("token");
    std::fs::write(&token_file, TOKEN).unwrap();
    let config = root.join("berth.toml");
    std::fs::write(
        &config,
        format!(
            "[agents.test]\ncommand = \"{}\"\n\n[remotes.\"127.0.0.1:{}\"]\ntoken_file = \"{}\"\napi_url = \"http://127.0.0.1:{api}\"\n",
            env!("CARGO_BIN_EXE_berth-test-agent"),
            server.port,
            token_file.display()
        ),
    )
    .unwrap();
    let app = TestApp::spawn(crate::helpers::Backend::Sqlite).await.unwrap();
    let mut env: BTreeMap<String, String> = crate::faults::process_env(&app, &root.join("data"));
    env.insert(
        "BERTH_WORKTREE_ROOT".into(),
        root.join("worktrees").display().to_string(),
    );
    env.insert("BERTH_CONFIG".into(), config.display().to_string());
    env.insert("RUST_LOG".into(), "debug".into());
    let log = root.join("berth.log");
    let mut berth = crate::faults::start(&env, None, &log);
    let client = reqwest::Client::new();
    crate::faults::wait_ready(&client, &mut berth).await;
    let admin = app.admin.clone();
    let call = |method: reqwest::Method, path: String, body: Option<Value>| {
        let client = client.clone();
        let url = format!("{}{path}", berth.base);
        let admin = admin.clone();
        async move {
            let mut req = client.request(method, url).bearer_auth(admin);
            if let Some(b) = body {
                req = req.json(&b);
            }
            let res = req.send().await.unwrap();
            let status = res.status().as_u16();
            let text = res.text().await.unwrap();
            (status, text)
        }
    };
    let post = |path: &str, body: Value| call(reqwest::Method::POST, format!("/api/v1{path}"), Some(body));
    let (_, ws) = post("/workspaces", json!({"name": "secrets"})).await;
    let ws: Value = serde_json::from_str(&ws).unwrap();
    let source = crate::helpers::git_repo(&root.join("repos/svc"), "main");
    std::fs::create_dir_all(server.root.path().join("acme")).unwrap();
    server.publish(&source, "acme/svc.git");
    let (status, repo) = post(
        &format!("/workspaces/{}/repositories", ws["id"].as_str().unwrap()),
        json!({"path": source}),
    )
    .await;
    assert_eq!(status, 201, "{repo}");
    let repo: Value = serde_json::from_str(&repo).unwrap();
    let (_, task) = post(
        &format!("/workspaces/{}/tasks", ws["id"].as_str().unwrap()),
        json!({"title": "secret", "repositories": [{"repository_id": repo["id"]}]}),
    )
    .await;
    let task: Value = serde_json::from_str(&task).unwrap();
    let (status, session) = post(
        &format!("/tasks/{}/sessions", task["id"].as_str().unwrap()),
        json!({"executor_type": "worktree", "agent_profile": "test", "prompt": "write s.txt secretless"}),
    )
    .await;
    assert_eq!(status, 201, "{session}");
    let session: Value = serde_json::from_str(&session).unwrap();
    let env_id = session["task_environment_id"].as_str().unwrap().to_string();
    let wt = PathBuf::from(session["workspace_path"].as_str().unwrap());
    // One minute for both: the agent's write, then the commit.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let (left, every) = (|| deadline - tokio::time::Instant::now(), Duration::from_millis(100));
    wait_until_every("the agent to write", left(), every, || async {
        seen(wt.join("s.txt").exists(), "no s.txt")
    })
    .await;
    let mut answers = Vec::new();
    let committed = wait_until_every("a commit", left(), every, || async {
        let (status, text) = post(&format!("/environments/{env_id}/commits"), json!({"message": "s"})).await;
        if status == 201 {
            Ok(text)
        } else {
            Err(format!("{status} {text}"))
        }
    })
    .await;
    answers.push(committed);
    let (status, text) = post(
        &format!("/environments/{env_id}/push"),
        json!({"repository_id": repo["id"]}),
    )
    .await;
    assert_eq!(status, 200, "{text}");
    answers.push(text);
    let (status, text) = post(
        &format!("/environments/{env_id}/pull-requests"),
        json!({"repository_id": repo["id"], "title": "secret"}),
    )
    .await;
    assert_eq!(status, 201, "{text}");
    answers.push(text);
    answers.push(
        call(
            reqwest::Method::GET,
            format!("/api/v1/tasks/{}", task["id"].as_str().unwrap()),
            None,
        )
        .await
        .1,
    );
    let events = call(reqwest::Method::GET, "/api/v1/events?limit=1000".into(), None)
        .await
        .1;
    drop(berth);
    layer_handle.stop(false).await;
    let logged = std::fs::read_to_string(&log).unwrap();
    assert!(
        logged.contains("DEBUG") || logged.contains("\"level\":\"DEBUG\""),
        "the log is at debug level"
    );
    assert!(
        events.contains("environment.pushed") && events.contains("pull_request.updated"),
        "{events}"
    );
    for (what, text) in [
        ("the log", logged.as_str()),
        ("the events", events.as_str()),
        ("the answers", &answers.join("\n")),
        (
            "the repository's git config",
            &std::fs::read_to_string(source.join(".git/config")).unwrap(),
        ),
    ] {
        assert!(!text.contains(TOKEN), "the credential is in {what}");
    }
}
