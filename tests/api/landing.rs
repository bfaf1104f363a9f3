//! Landing the work. Commit what the agent wrote (author from the token's claims, refused while the agent
//! works and when there is nothing to commit); merge without touching anyone's checkout (fast-forward
//! moving the user's clean checkout, a merge commit, a squash, a conflict that changes nothing, a dirty
//! checkout refused and left alone, a target that moved); push through git's own HTTP server with
//! credentials from the configuration (a rejected push, a wrong credential). Real git, both databases.
use std::path::{Path, PathBuf};

use jsonwebtoken::{EncodingKey, Header, encode};
use reqwest::Method;
use serde_json::{Value, json};
use uuid::Uuid;

use crate::both_backends;
use crate::fixture::StartedSession;
use crate::helpers::{SECRET, TestApp, git};

both_backends!(
    a_commit_takes_the_agents_work_and_refuses_what_it_must,
    merges_move_a_branch_only_by_compare_and_set_and_never_a_dirty_checkout,
    a_push_goes_through_a_real_git_server_with_configured_credentials,
);

/// A task with one repository and a worktree session of the test agent, idle.
pub(crate) struct Started {
    pub task: Uuid,
    pub env: String,
    pub session: Uuid,
    pub worktree: PathBuf,
    pub repo: Uuid,
    pub repo_path: PathBuf,
}

pub(crate) async fn started(app: &TestApp) -> Started {
    let f = app.task_with_repo_in("landing", "svc", "Land it").await;
    let StartedSession {
        id: session,
        created: s,
        ..
    } = f.started_session("test").await;
    Started {
        task: f.task,
        env: s["task_environment_id"].as_str().unwrap().to_string(),
        session,
        worktree: PathBuf::from(s["workspace_path"].as_str().unwrap()),
        repo: f.repository,
        repo_path: f.repo_dir,
    }
}

/// The agent writes `name` with `text`; waits for its turn to settle.
pub(crate) async fn agent_writes(app: &TestApp, s: &Started, name: &str, text: &str) {
    let before = app.get(&format!("/api/v1/sessions/{}/turns", s.session)).await.ok(200)["items"]
        .as_array()
        .unwrap()
        .len();
    app.post(
        &format!("/api/v1/sessions/{}/messages", s.session),
        json!({"text": format!("write {name} {text}")}),
    )
    .await
    .ok(202);
    crate::turns::wait_turns(app, s.session, before + 1).await;
    assert_eq!(std::fs::read_to_string(s.worktree.join(name)).unwrap(), text);
}

fn tip(repo: &Path, rev: &str) -> String {
    git(repo, &["rev-parse", rev]).trim().to_string()
}

/// The user commits `name` on the branch checked out in their own checkout.
fn user_commits(repo: &Path, name: &str, text: &str) {
    std::fs::write(repo.join(name), text).unwrap();
    git(repo, &["add", name]);
    git(
        repo,
        &[
            "-c",
            "user.name=user",
            "-c",
            "user.email=user@example.com",
            "commit",
            "-q",
            "-m",
            name,
        ],
    );
}

async fn commit(app: &TestApp, s: &Started, message: &str) -> Value {
    app.post(
        &format!("/api/v1/environments/{}/commits", s.env),
        json!({ "message": message }),
    )
    .await
    .ok(201)
}

async fn merge(app: &TestApp, s: &Started, body: Value) -> crate::helpers::Reply {
    let mut body = body;
    body["repository_id"] = json!(s.repo);
    app.post(&format!("/api/v1/environments/{}/merge", s.env), body).await
}

async fn a_commit_takes_the_agents_work_and_refuses_what_it_must(app: TestApp) {
    let s = started(&app).await;
    let commits = format!("/api/v1/environments/{}/commits", s.env);
    app.post(&commits, json!({"message": "nothing yet"}))
        .await
        .problem(409, "nothing_to_commit");
    agent_writes(&app, &s, "notes.txt", "one\n").await;
    std::fs::write(s.worktree.join("other.txt"), "not this one\n").unwrap();
    app.post(&commits, json!({"message": " "}))
        .await
        .problem(422, "validation_failed");
    let p = app
        .post(&commits, json!({"message": "x", "paths": ["../outside"]}))
        .await
        .problem(422, "validation_failed");
    assert_eq!(p["errors"][0]["field"], "paths[0]");

    // The author is the person the token names; the committer is berth; only the listed path.
    let now = chrono::Utc::now().timestamp();
    let token = encode(
        &Header::default(),
        &json!({"sub": "ada", "scope": "admin", "exp": now + 600, "iat": now, "iss": "berth", "aud": "berth-api",
                "name": "Ada Lovelace", "email": "ada@example.com"}),
        &EncodingKey::from_secret(SECRET.as_bytes()).unwrap(),
    )
    .unwrap();
    let c = app
        .call(
            Method::POST,
            &commits,
            Some(&token),
            Some(json!({"message": "Add notes", "paths": ["notes.txt"]})),
        )
        .await
        .ok(201);
    let sha = c["commits"][0]["commit"].as_str().unwrap().to_string();
    assert_eq!(c["commits"][0]["repository_id"], json!(s.repo));
    let wt = &s.worktree;
    assert_eq!(tip(wt, "HEAD"), sha);
    assert_eq!(
        git(wt, &["log", "-1", "--format=%an <%ae>|%cn|%s"]).trim(),
        "Ada Lovelace <ada@example.com>|berth|Add notes"
    );
    assert_eq!(
        git(wt, &["show", "--name-only", "--format=", "HEAD"]).trim(),
        "notes.txt"
    );
    assert_eq!(
        git(wt, &["status", "--porcelain"]).trim(),
        "?? other.txt",
        "what was not listed stays as it was"
    );
    // Without claims: berth (no BERTH_GIT_AUTHOR here).
    commit(&app, &s, "The rest").await;
    assert_eq!(git(wt, &["log", "-1", "--format=%an"]).trim(), "berth");
    assert!(git(wt, &["status", "--porcelain"]).trim().is_empty());
    let status = app
        .get(&format!("/api/v1/environments/{}/git-status", s.env))
        .await
        .ok(200);
    assert_eq!(status["items"][0]["head_commit"], json!(tip(wt, "HEAD")), "{status}");
    let events = app.get("/api/v1/events?types=environment.committed").await.ok(200);
    assert_eq!(events["events"].as_array().unwrap().len(), 2);

    // Not while the agent works: nothing is staged or committed.
    std::fs::write(wt.join("late.txt"), "late\n").unwrap();
    app.post(
        &format!("/api/v1/sessions/{}/messages", s.session),
        json!({"text": "hang"}),
    )
    .await
    .ok(202);
    crate::agents::wait_session(&app, s.session, "running", |v| v["state"] == "running").await;
    let head = tip(wt, "HEAD");
    app.post(&commits, json!({"message": "while busy"}))
        .await
        .problem(409, "session_busy");
    assert_eq!(tip(wt, "HEAD"), head);
    assert_eq!(git(wt, &["status", "--porcelain"]).trim(), "?? late.txt");
    app.post(&format!("/api/v1/sessions/{}/abort", s.session), json!({}))
        .await
        .ok(200);
}

async fn merges_move_a_branch_only_by_compare_and_set_and_never_a_dirty_checkout(app: TestApp) {
    let s = started(&app).await;
    let user = s.repo_path.clone();
    let branch = git(&s.worktree, &["branch", "--show-current"]).trim().to_string();

    // Fast-forward: main is checked out in the user's clean checkout, which moves with it.
    agent_writes(&app, &s, "a.txt", "one\n").await;
    let t1 = commit(&app, &s, "a").await["commits"][0]["commit"]
        .as_str()
        .unwrap()
        .to_string();
    let before = tip(&user, "main");
    let m = merge(&app, &s, json!({"strategy": "fast_forward"})).await.ok(200);
    assert_eq!(
        (m["previous_commit"].as_str(), m["commit"].as_str()),
        (Some(before.as_str()), Some(t1.as_str()))
    );
    assert_eq!(m["into"], "main");
    assert_eq!(m["checkout_updated"], true);
    assert_eq!(tip(&user, "main"), t1);
    assert_eq!(
        std::fs::read_to_string(user.join("a.txt")).unwrap(),
        "one\n",
        "the user's checkout moved"
    );
    assert!(git(&user, &["status", "--porcelain"]).trim().is_empty());
    assert_eq!(tip(&s.worktree, "HEAD"), t1, "the task branch and worktree are kept");
    let task = app.get(&format!("/api/v1/tasks/{}", s.task)).await.ok(200);
    let columns = app
        .get(&format!(
            "/api/v1/workspaces/{}/columns",
            task["workspace_id"].as_str().unwrap()
        ))
        .await
        .ok(200);
    let done = columns["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "Done")
        .unwrap();
    assert_eq!(task["column_id"], done["id"], "a merge moves the task to Done");
    merge(&app, &s, json!({"strategy": "merge"}))
        .await
        .problem(409, "conflict");

    // A conflict changes nothing: no branch, no index, no worktree, no checkout.
    user_commits(&user, "b.txt", "user\n");
    agent_writes(&app, &s, "b.txt", "agent\n").await;
    commit(&app, &s, "b").await;
    let git_dir = PathBuf::from(git(&s.worktree, &["rev-parse", "--absolute-git-dir"]).trim());
    let kept = || {
        (
            tip(&user, "main"),
            tip(&user, &branch),
            std::fs::read(git_dir.join("index")).unwrap(),
            std::fs::read(s.worktree.join("b.txt")).unwrap(),
            std::fs::read(user.join("b.txt")).unwrap(),
            git(&user, &["status", "--porcelain"]),
        )
    };
    let before = kept();
    let p = merge(&app, &s, json!({"strategy": "merge"}))
        .await
        .problem(409, "merge_conflict");
    assert_eq!(p["conflicting_paths"], json!(["b.txt"]), "{p}");
    merge(&app, &s, json!({"strategy": "squash"}))
        .await
        .problem(409, "merge_conflict");
    merge(&app, &s, json!({"strategy": "fast_forward"}))
        .await
        .problem(409, "conflict");
    assert_eq!(kept(), before, "nothing changed");

    // A merge commit, once the agent agrees with the user.
    agent_writes(&app, &s, "b.txt", "user\n").await;
    let tip_task = commit(&app, &s, "agree").await["commits"][0]["commit"]
        .as_str()
        .unwrap()
        .to_string();
    let old = tip(&user, "main");
    let m = merge(&app, &s, json!({"strategy": "merge", "expected_into_commit": old}))
        .await
        .ok(200);
    let parents = git(&user, &["rev-list", "--parents", "-n1", "main"]);
    assert_eq!(
        parents.split_whitespace().skip(1).collect::<Vec<_>>(),
        vec![old.as_str(), tip_task.as_str()],
        "two parents: the old main and the task branch"
    );
    assert_eq!(m["commit"].as_str().unwrap(), tip(&user, "main"));
    assert_eq!(git(&user, &["log", "-1", "--format=%cn"]).trim(), "berth");

    // A squash: one commit with one parent, holding the change.
    agent_writes(&app, &s, "c.txt", "squashed\n").await;
    commit(&app, &s, "c").await;
    user_commits(&user, "d.txt", "user again\n");
    let old = tip(&user, "main");
    merge(&app, &s, json!({"strategy": "squash", "message": "Squash c"}))
        .await
        .ok(200);
    let parents = git(&user, &["rev-list", "--parents", "-n1", "main"]);
    assert_eq!(
        parents.split_whitespace().skip(1).collect::<Vec<_>>(),
        vec![old.as_str()]
    );
    assert_eq!(git(&user, &["log", "-1", "--format=%s"]).trim(), "Squash c");
    assert_eq!(std::fs::read_to_string(user.join("c.txt")).unwrap(), "squashed\n");

    // The target moved since the caller read it: retryable, nothing changed.
    agent_writes(&app, &s, "e.txt", "e\n").await;
    commit(&app, &s, "e").await;
    let old = tip(&user, "main");
    let p = merge(&app, &s, json!({"strategy": "merge", "expected_into_commit": t1}))
        .await
        .problem(409, "branch_moved");
    assert_eq!(p["retryable"], true);
    assert_eq!(tip(&user, "main"), old);

    // A dirty checkout of the target is refused and left alone; its path is not named.
    std::fs::write(user.join("README.md"), "the user's own edit\n").unwrap();
    let p = merge(&app, &s, json!({"strategy": "merge"}))
        .await
        .problem(409, "target_checked_out");
    assert!(!p.to_string().contains(user.to_str().unwrap()), "{p}");
    assert_eq!(tip(&user, "main"), old);
    assert_eq!(
        std::fs::read_to_string(user.join("README.md")).unwrap(),
        "the user's own edit\n"
    );
    assert!(!user.join("e.txt").exists());

    // A branch checked out nowhere moves by compare-and-set alone.
    git(&user, &["branch", "release", "main"]);
    let release = tip(&user, "release");
    let m = merge(
        &app,
        &s,
        json!({"strategy": "merge", "into": "release", "expected_into_commit": release}),
    )
    .await
    .ok(200);
    assert_eq!(m["checkout_updated"], false);
    assert_eq!(tip(&user, "release"), m["commit"].as_str().unwrap());
    assert_eq!(tip(&user, "main"), old, "main untouched");
    merge(&app, &s, json!({"strategy": "merge", "into": "nope"}))
        .await
        .problem(422, "validation_failed");
    let events = app.get("/api/v1/events?types=environment.merged").await.ok(200);
    assert_eq!(events["events"].as_array().unwrap().len(), 4);
}

/// git's smart-HTTP server behind a loopback web server that checks HTTP Basic auth
/// (tests/gitserver/serve.py), serving the bare repositories under its root.
pub(crate) struct GitServer {
    child: std::process::Child,
    pub port: u16,
    pub root: tempfile::TempDir,
}

impl GitServer {
    pub fn start(user: &str, password: &str) -> GitServer {
        use std::io::BufRead;
        let root = tempfile::TempDir::new().unwrap();
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/gitserver/serve.py");
        let mut child = std::process::Command::new("python3")
            .arg(script)
            .arg(root.path())
            .args([user, password])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("python3 runs the git server");
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let port = line.trim().parse().expect("the git server prints its port");
        GitServer { child, port, root }
    }

    /// A bare repository `name` on the server holding `source`'s main; `source`'s `origin` points at it.
    pub fn publish(&self, source: &Path, name: &str) -> PathBuf {
        let bare = self.root.path().join(name);
        git(
            self.root.path(),
            &["init", "-q", "--bare", "-b", "main", bare.to_str().unwrap()],
        );
        git(&bare, &["config", "http.receivepack", "true"]);
        git(source, &["push", "-q", bare.to_str().unwrap(), "main"]);
        let url = format!("http://127.0.0.1:{}/{name}", self.port);
        git(source, &["remote", "add", "origin", &url]);
        bare
    }
}

impl Drop for GitServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The app `both_backends!` made, replaced by one on the same backend with this configuration file.
pub(crate) async fn with_config(app: TestApp, toml: &str, extra: &[(&str, &str)]) -> (TestApp, tempfile::TempDir) {
    let backend = app.backend;
    drop(app);
    let dir = tempfile::TempDir::new().unwrap();
    let file = dir.path().join("berth.toml");
    std::fs::write(&file, toml).unwrap();
    let mut settings = vec![("BERTH_CONFIG", file.to_str().unwrap())];
    settings.extend_from_slice(extra);
    let app = TestApp::spawn_with(backend, &settings)
        .await
        .expect("the backend was available a moment ago");
    (app, dir)
}

async fn a_push_goes_through_a_real_git_server_with_configured_credentials(app: TestApp) {
    let server = GitServer::start("berth", "right-password");
    let secrets = tempfile::TempDir::new().unwrap();
    let right = secrets.path().join("right");
    let wrong = secrets.path().join("wrong");
    std::fs::write(&right, "right-password\n").unwrap();
    std::fs::write(&wrong, "wrong-password\n").unwrap();
    let toml = format!(
        "[remotes.\"127.0.0.1:{}\"]\nusername = \"berth\"\ntoken_file = \"{}\"\n",
        server.port,
        right.display()
    );
    let (app, _config) = with_config(
        app,
        &toml,
        &[("BERTH_GIT_AUTHOR", "Config Author <author@example.com>")],
    )
    .await;
    let s = started(&app).await;
    let bare = server.publish(&s.repo_path, "svc.git");
    agent_writes(&app, &s, "pushed.txt", "over http\n").await;
    let c = commit(&app, &s, "to push").await;
    let sha = c["commits"][0]["commit"].as_str().unwrap().to_string();
    assert_eq!(
        git(&s.worktree, &["log", "-1", "--format=%an <%ae>"]).trim(),
        "Config Author <author@example.com>"
    );
    let branch = c["commits"][0]["branch"].as_str().unwrap().to_string();
    let push = format!("/api/v1/environments/{}/push", s.env);
    let p = app.post(&push, json!({"repository_id": s.repo})).await.ok(200);
    assert_eq!(
        (p["remote"].as_str(), p["commit"].as_str()),
        (Some("origin"), Some(sha.as_str()))
    );
    assert_eq!(
        tip(&bare, &format!("refs/heads/{branch}")),
        sha,
        "the server has the branch"
    );
    let config = std::fs::read_to_string(s.repo_path.join(".git/config")).unwrap();
    assert!(
        !config.contains("right-password") && !config.contains("credential"),
        "{config}"
    );

    // Someone else moved the remote branch: a plain push is rejected with git's reason; with a lease
    // taken from what berth last fetched it is rejected too (stale), and nothing on the server moves.
    let other = tempfile::TempDir::new().unwrap();
    let clone = other.path().join("c");
    git(
        other.path(),
        &[
            "clone",
            "-q",
            "-b",
            &branch,
            bare.to_str().unwrap(),
            clone.to_str().unwrap(),
        ],
    );
    user_commits(&clone, "theirs.txt", "theirs\n");
    git(&clone, &["push", "-q", "origin", &branch]);
    let theirs = tip(&bare, &format!("refs/heads/{branch}"));
    agent_writes(&app, &s, "second.txt", "second\n").await;
    commit(&app, &s, "second").await;
    let p = app
        .post(&push, json!({"repository_id": s.repo}))
        .await
        .problem(409, "push_rejected");
    assert!(p["detail"].as_str().unwrap().contains("rejected"), "{p}");
    assert_eq!(tip(&bare, &format!("refs/heads/{branch}")), theirs);
    app.post(&push, json!({"repository_id": s.repo, "remote": "nowhere"}))
        .await
        .problem(422, "validation_failed");

    // A wrong credential, then an unreachable remote.
    let backend = app.backend;
    drop(app);
    let toml = format!(
        "[remotes.\"127.0.0.1:{}\"]\nusername = \"berth\"\ntoken_file = \"{}\"\n",
        server.port,
        wrong.display()
    );
    let backend_app = TestApp::spawn(backend)
        .await
        .expect("the backend was available a moment ago");
    let (app, _config2) = with_config(backend_app, &toml, &[]).await;
    let s = started(&app).await;
    server.publish(&s.repo_path, "svc2.git");
    agent_writes(&app, &s, "x.txt", "x\n").await;
    commit(&app, &s, "x").await;
    let push = format!("/api/v1/environments/{}/push", s.env);
    let p = app
        .post(&push, json!({"repository_id": s.repo}))
        .await
        .problem(502, "remote_auth_failed");
    assert!(!p.to_string().contains("wrong-password"));
    git(
        &s.repo_path,
        &["remote", "set-url", "origin", "http://127.0.0.1:9/svc2.git"],
    );
    let p = app
        .post(&push, json!({"repository_id": s.repo}))
        .await
        .problem(502, "remote_unreachable");
    assert_eq!(p["retryable"], true);
}

/// The compare-and-set under a merge: git moves a branch only from the commit berth read (a branch that
/// moved between berth's read and its write is refused, and the merge answers `409 branch_moved`).
#[tokio::test]
async fn a_branch_moves_only_from_the_commit_it_was_read_at() {
    use berth::git::cli::{GitCli, GitMutations};
    use berth::git::land::{BranchMove, Step};
    let dir = tempfile::TempDir::new().unwrap();
    let repo = crate::helpers::git_repo(&dir.path().join("r"), "main");
    let old = tip(&repo, "main");
    let new = git(&repo, &["commit-tree", "HEAD^{tree}", "-p", "HEAD", "-m", "next"])
        .trim()
        .to_string();
    let cli = GitCli::new(2, std::time::Duration::from_secs(30));
    let branch = berth::git::BranchName::parse("main").unwrap();
    let stale = BranchMove {
        branch: branch.clone(),
        from: new.clone(),
        to: new.clone(),
    };
    assert!(
        cli.land(&Step::MoveBranch {
            repo: &repo,
            change: &stale
        })
        .await
        .is_err()
    );
    assert_eq!(tip(&repo, "main"), old, "a branch not where it was read does not move");
    let fresh = BranchMove {
        branch,
        from: old,
        to: new.clone(),
    };
    cli.land(&Step::MoveBranch {
        repo: &repo,
        change: &fresh,
    })
    .await
    .unwrap();
    assert_eq!(tip(&repo, "main"), new);
}
