//! The push credential goes only where the configuration says, and a push runs nothing the repository
//! names. berth decides the credential from the URL git really pushes to (`pushurl`, `pushInsteadOf`,
//! as git resolves them), parsed strictly: a push URL sent elsewhere than the remote's URL, or a URL git
//! and berth could read two ways, is refused before git sends anything (a second listener records every
//! request it gets), and so is a proxy the repository's own configuration names. Hooks (`.git/hooks`, a `core.hooksPath` the repository names) do not run; a
//! program git does run for the push (the repository's `core.sshCommand`) sees none of berth's
//! environment; the `ext::` transport runs nothing. Real git and git's own HTTP server, both databases.
use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::path::Path;
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};

use crate::both_backends;
use crate::helpers::{TestApp, git};
use crate::landing::{GitServer, Started, agent_writes, started, with_config};

both_backends!(
    a_push_url_pointing_elsewhere_is_refused_and_that_server_hears_nothing,
    a_url_git_and_berth_could_read_two_ways_is_refused_and_sends_nothing,
    a_push_runs_no_hook_and_nothing_git_runs_sees_berths_environment,
    a_redirect_is_not_followed_and_its_target_hears_nothing,
);

/// A loopback HTTP listener that records the head of every request it gets and answers each with a
/// Basic challenge (so a git that had a credential for it would send it).
struct Recorder {
    port: u16,
    heads: Arc<Mutex<Vec<String>>>,
}

impl Recorder {
    fn start() -> Recorder {
        Recorder::answering(None)
    }

    /// One that redirects every request to the same path on `127.0.0.1:<port>`.
    fn redirecting_to(port: u16) -> Recorder {
        Recorder::answering(Some(port))
    }

    fn answering(redirect: Option<u16>) -> Recorder {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let heads = Arc::new(Mutex::new(Vec::new()));
        let seen = heads.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(mut conn) = conn else { continue };
                let mut head = String::new();
                let mut reader = BufReader::new(conn.try_clone().unwrap());
                loop {
                    let mut line = String::new();
                    if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                        break;
                    }
                    head.push_str(&line);
                }
                let path = head.split(' ').nth(1).unwrap_or("/").to_string();
                seen.lock().unwrap().push(head);
                let answer = match redirect {
                    Some(port) => format!(
                        "HTTP/1.1 302 Found\r\nLocation: http://127.0.0.1:{port}{path}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                    ),
                    None => "HTTP/1.1 401 Unauthorized\r\nWWW-Authenticate: Basic realm=\"x\"\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".to_string(),
                };
                let _ = conn.write_all(answer.as_bytes());
            }
        });
        Recorder { port, heads }
    }

    fn heads(&self) -> Vec<String> {
        self.heads.lock().unwrap().clone()
    }
}

/// A berth with a credential for the git server's host, a started task whose repository's `origin`
/// is on that server, and a commit to push.
async fn with_work(app: TestApp) -> (TestApp, Started, GitServer, Vec<tempfile::TempDir>) {
    let server = GitServer::start("berth", "right-password");
    let secrets = tempfile::TempDir::new().unwrap();
    let token = secrets.path().join("token");
    std::fs::write(&token, "right-password\n").unwrap();
    let toml = format!(
        "[remotes.\"127.0.0.1:{}\"]\nusername = \"berth\"\ntoken_file = \"{}\"\n",
        server.port,
        token.display()
    );
    let (app, config) = with_config(app, &toml, &[]).await;
    let s = started(&app).await;
    server.publish(&s.repo_path, "svc.git");
    agent_writes(&app, &s, "work.txt", "work\n").await;
    app.post(
        &format!("/api/v1/environments/{}/commits", s.env),
        json!({ "message": "work" }),
    )
    .await
    .ok(201);
    (app, s, server, vec![secrets, config])
}

async fn push(app: &TestApp, s: &Started) -> crate::helpers::Reply {
    app.post(
        &format!("/api/v1/environments/{}/push", s.env),
        json!({"repository_id": s.repo}),
    )
    .await
}

#[track_caller]
fn refused_for_the_remote(p: &Value) {
    assert_eq!(p["errors"][0]["field"], "remote", "{p}");
    assert!(!p.to_string().contains("right-password"), "{p}");
}

async fn a_push_url_pointing_elsewhere_is_refused_and_that_server_hears_nothing(app: TestApp) {
    let (app, s, server, _keep) = with_work(app).await;
    let other = Recorder::start();
    let repo = &s.repo_path;
    let good = format!("http://127.0.0.1:{}/", server.port);
    let elsewhere = format!("http://127.0.0.1:{}/", other.port);

    // `remote.origin.pushurl` on another port.
    git(
        repo,
        &["config", "remote.origin.pushurl", &format!("{elsewhere}svc.git")],
    );
    refused_for_the_remote(&push(&app, &s).await.problem(422, "validation_failed"));
    // Several push URLs, the right one first.
    git(repo, &["config", "remote.origin.pushurl", &format!("{good}svc.git")]);
    git(
        repo,
        &[
            "config",
            "--add",
            "remote.origin.pushurl",
            &format!("{elsewhere}svc.git"),
        ],
    );
    refused_for_the_remote(&push(&app, &s).await.problem(422, "validation_failed"));
    git(repo, &["config", "--unset-all", "remote.origin.pushurl"]);
    // `pushInsteadOf` rewriting the remote's URL to the other server.
    let key = format!("url.{elsewhere}.pushInsteadOf");
    git(repo, &["config", &key, &good]);
    refused_for_the_remote(&push(&app, &s).await.problem(422, "validation_failed"));
    git(repo, &["config", "--unset", &key]);
    // A proxy the repository's configuration names (it would see a plain-HTTP request's credential), or
    // the host resolved elsewhere.
    let proxy = format!("http://127.0.0.1:{}", other.port);
    let resolve = format!("127.0.0.1:{}:127.0.0.2", server.port);
    for (key, value) in [
        ("http.proxy", proxy.as_str()),
        ("remote.origin.proxy", proxy.as_str()),
        ("http.curloptResolve", resolve.as_str()),
    ] {
        git(repo, &["config", key, value]);
        let p = push(&app, &s).await.problem(422, "validation_failed");
        refused_for_the_remote(&p);
        git(repo, &["config", "--unset", key]);
    }
    assert_eq!(other.heads(), Vec::<String>::new(), "the other server heard from git");

    // The remote as configured still takes the push, with the credential.
    let p = push(&app, &s).await.ok(200);
    assert_eq!(p["remote"], "origin");
    assert_eq!(other.heads(), Vec::<String>::new());
}

async fn a_url_git_and_berth_could_read_two_ways_is_refused_and_sends_nothing(app: TestApp) {
    let (app, s, server, _keep) = with_work(app).await;
    let other = Recorder::start();
    let (good, bad) = (server.port, other.port);
    for url in [
        format!("http://127.0.0.1:{bad}?@127.0.0.1:{good}/svc.git"),
        format!("http://127.0.0.1:{bad}#@127.0.0.1:{good}/svc.git"),
        format!("http://127.0.0.1:{bad}?x@127.0.0.1:{good}/svc.git"),
        format!("http://x@127.0.0.1:{bad}@127.0.0.1:{good}/svc.git"),
    ] {
        git(&s.repo_path, &["remote", "set-url", "origin", &url]);
        let p = push(&app, &s).await.problem(422, "validation_failed");
        refused_for_the_remote(&p);
        assert!(!p.to_string().contains(&format!(":{bad}")), "{p}");
        assert_eq!(
            other.heads(),
            Vec::<String>::new(),
            "{url}: the other server heard from git"
        );
    }
    // Written plainly, the same remote takes the push.
    let url = format!("http://127.0.0.1:{good}/svc.git");
    git(&s.repo_path, &["remote", "set-url", "origin", &url]);
    push(&app, &s).await.ok(200);
}

async fn a_push_runs_no_hook_and_nothing_git_runs_sees_berths_environment(app: TestApp) {
    let (app, s, server, _keep) = with_work(app).await;
    let repo = &s.repo_path;
    let marks = tempfile::TempDir::new().unwrap();
    let hook = |dir: &Path, marker: &Path| {
        std::fs::create_dir_all(dir).unwrap();
        let file = dir.join("pre-push");
        std::fs::write(&file, format!("#!/bin/sh\nenv > '{}'\n", marker.display())).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o755)).unwrap();
    };
    // A pre-push hook in the repository's own hooks directory: the push succeeds, the hook never ran.
    let in_repo = marks.path().join("in-repo");
    hook(&repo.join(".git/hooks"), &in_repo);
    let p = push(&app, &s).await.ok(200);
    let branch = p["branch"].as_str().unwrap().to_string();
    let on_server = server.root.path().join("svc.git");
    assert_eq!(
        git(&on_server, &["rev-parse", &format!("refs/heads/{branch}")]).trim(),
        p["commit"].as_str().unwrap()
    );
    // One in a `core.hooksPath` the repository's configuration names: the same.
    let named = marks.path().join("named");
    let hooks = marks.path().join("hooks");
    hook(&hooks, &named);
    git(repo, &["config", "core.hooksPath", hooks.to_str().unwrap()]);
    agent_writes(&app, &s, "more.txt", "more\n").await;
    app.post(
        &format!("/api/v1/environments/{}/commits", s.env),
        json!({ "message": "more" }),
    )
    .await
    .ok(201);
    push(&app, &s).await.ok(200);
    assert!(!in_repo.exists() && !named.exists(), "a pre-push hook ran");

    // The `ext::` transport would run a command of the URL's choosing: it runs nothing.
    let ran = marks.path().join("ext");
    git(repo, &["config", "protocol.ext.allow", "always"]);
    let ext = format!("ext::sh -c touch% {}", ran.display());
    git(repo, &["remote", "set-url", "origin", &ext]);
    push(&app, &s).await.problem(502, "remote_unreachable");
    assert!(!ran.exists(), "the ext transport ran its command");

    // ssh does run for an ssh remote (its command the repository's `core.sshCommand`), but with none of
    // berth's environment: here the test runner's, which cargo fills with CARGO_* variables.
    let seen = marks.path().join("ssh-env");
    git(repo, &["remote", "set-url", "origin", "ssh://git.invalid/o/r.git"]);
    git(
        repo,
        &[
            "config",
            "core.sshCommand",
            &format!("env > '{}'; false", seen.display()),
        ],
    );
    push(&app, &s).await.problem(502, "remote_unreachable");
    let env = std::fs::read_to_string(&seen).expect("ssh ran");
    assert!(
        std::env::vars().any(|(k, _)| k.starts_with("CARGO")),
        "the runner's environment has CARGO_*"
    );
    let leaked: Vec<&str> = env
        .lines()
        .filter(|l| l.starts_with("CARGO") || l.starts_with("BERTH_") || l.starts_with("RUST"))
        .collect();
    assert!(leaked.is_empty(), "berth's environment reached ssh: {leaked:?}");
    assert!(env.lines().any(|l| l.starts_with("PATH=")), "{env}");
}

/// The configured host answers with a redirect to another: git does not follow it (the credential
/// helper would refuse that host anyway), the push fails typed, and the other server hears nothing.
async fn a_redirect_is_not_followed_and_its_target_hears_nothing(app: TestApp) {
    let other = Recorder::start();
    let redirector = Recorder::redirecting_to(other.port);
    let secrets = tempfile::TempDir::new().unwrap();
    let token = secrets.path().join("token");
    std::fs::write(&token, "right-password\n").unwrap();
    let toml = format!(
        "[remotes.\"127.0.0.1:{}\"]\nusername = \"berth\"\ntoken_file = \"{}\"\n",
        redirector.port,
        token.display()
    );
    let (app, _config) = with_config(app, &toml, &[]).await;
    let s = started(&app).await;
    let url = format!("http://127.0.0.1:{}/svc.git", redirector.port);
    git(&s.repo_path, &["remote", "add", "origin", &url]);
    agent_writes(&app, &s, "work.txt", "work\n").await;
    app.post(
        &format!("/api/v1/environments/{}/commits", s.env),
        json!({ "message": "work" }),
    )
    .await
    .ok(201);
    let p = push(&app, &s).await.problem(502, "remote_unreachable");
    assert!(!p.to_string().contains("right-password"), "{p}");
    assert!(!redirector.heads().is_empty(), "git asked the configured host");
    assert_eq!(
        other.heads(),
        Vec::<String>::new(),
        "the redirect's target heard from git"
    );
}
