//! berth on separate disks. Each node is a mount namespace holding a private tmpfs at the same path
//! (`unshare --mount`, as root; CI runs as root), so no node sees another's disk, not even under the same
//! path; each berth process runs in its node's namespace (`nsenter`) on one PostgreSQL database. A node
//! SIGKILLed is `down` within its lease and nothing waits for the routing deadline; its delete is
//! accepted and its job runs once it is back; two instances of one node restarted in turn never kill each
//! other's agents and never run one twice. PostgreSQL only: SQLite is one node.
use std::collections::BTreeMap;
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use reqwest::Method;
use sea_orm::{ConnectionTrait, DatabaseConnection, Statement};
use serde_json::{Value, json};
use uuid::Uuid;

use crate::helpers::{PgDatabase, SECRET, SETTLED, client, id_of, mint, seen, seen_json, wait_until, wait_until_every};

const WAIT: Duration = Duration::from_secs(90);
/// How often the slower waiters here probe.
const SLOW: Duration = Duration::from_millis(100);
/// The lease of the processes of the tests that kill a node (seconds): short, so a dead node is seen
/// soon, yet long enough that a live one under a loaded machine's whole test suite keeps it.
const LEASE: u64 = 5;
/// The lease where no node is killed: a live node is never seen down, however loaded the machine.
const LONG_LEASE: &str = "60";

/// A node's disk: a mount namespace holding a private tmpfs at `dir`, kept alive by a sleeping holder.
struct Disk {
    holder: Child,
    dir: PathBuf,
}

impl Disk {
    fn new(dir: &Path) -> Disk {
        std::fs::create_dir_all(dir).unwrap();
        let script = format!(
            "mount -t tmpfs tmpfs '{}' && echo ready && exec sleep 100000",
            dir.display()
        );
        let mut holder = Command::new("unshare")
            .args(["--mount", "--propagation", "private", "sh", "-c", &script])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .expect("unshare runs");
        let mut line = String::new();
        std::io::BufReader::new(holder.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line.trim(), "ready", "the node's tmpfs is mounted");
        Disk {
            holder,
            dir: dir.to_path_buf(),
        }
    }

    fn enter(&self) -> Command {
        let mut c = Command::new("nsenter");
        c.arg(format!("--mount=/proc/{}/ns/mnt", self.holder.id())).arg("--");
        c
    }

    /// Runs a shell script on this node's disk; its standard output.
    fn sh(&self, script: &str) -> String {
        let out = self.enter().args(["sh", "-c", script]).output().unwrap();
        assert!(
            out.status.success(),
            "{script}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn exists(&self, path: &str) -> bool {
        self.enter().args(["test", "-e", path]).status().unwrap().success()
    }

    /// A git repository with one commit on this disk.
    fn repo(&self, name: &str) -> String {
        let path = format!("{}/repos/{name}", self.dir.display());
        self.sh(&format!(
            "mkdir -p {path} && cd {path} && git init -q -b main && echo hello > README.md && git add README.md \
             && git -c user.name=t -c user.email=t@example.com commit -q -m init"
        ));
        path
    }
}

impl Drop for Disk {
    fn drop(&mut self) {
        let _ = self.holder.kill();
        let _ = self.holder.wait();
    }
}

/// One berth process, in a node's namespace.
struct Berth {
    child: Child,
    base: String,
}

impl Drop for Berth {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

struct Fleet {
    db: PgDatabase,
    conn: DatabaseConnection,
    scratch: tempfile::TempDir,
    token: String,
    http: reqwest::Client,
}

impl Fleet {
    /// None without PostgreSQL (the tests then say they did not run, as every PostgreSQL test does).
    async fn new() -> Option<Fleet> {
        if unsafe { libc::geteuid() } != 0 {
            assert!(
                std::env::var_os("CI").is_none(),
                "CI is set but the tests do not run as root: separate disks need unshare --mount"
            );
            eprintln!("fleet tests did not run: separate disks need root (unshare --mount)");
            return None;
        }
        let db = PgDatabase::create().await?;
        let conn = sea_orm::Database::connect(&db.url).await.unwrap();
        let scratch = tempfile::TempDir::new().unwrap();
        let agent = env!("CARGO_BIN_EXE_berth-test-agent");
        std::fs::write(
            scratch.path().join("berth.toml"),
            // `lingering` outlives its berth, as an agent may after a crash (it ignores its stdin's end).
            format!(
                "[agents.test]\ncommand = {agent:?}\n\n[agents.lingering]\ncommand = {agent:?}\nargs = [\"--ignore-eof\"]\n"
            ),
        )
        .unwrap();
        let mut env = BTreeMap::new();
        env.insert("BERTH_JWT_SECRET".to_string(), SECRET.to_string());
        env.insert(
            "BERTH_DATA_DIR".to_string(),
            scratch.path().join("unused").display().to_string(),
        );
        let config = berth::config::Config::load(&env).unwrap();
        Some(Fleet {
            token: mint(&config, "admin", "admin", None, None),
            db,
            conn,
            scratch,
            http: client(),
        })
    }

    /// The path every node mounts its own tmpfs at.
    fn disk_dir(&self) -> PathBuf {
        self.scratch.path().join("disk")
    }

    fn disk(&self) -> Disk {
        Disk::new(&self.disk_dir())
    }

    async fn start(&self, disk: &Disk, node: &str, log: &str) -> Berth {
        self.start_with(disk, node, log, &[]).await
    }

    async fn start_with(&self, disk: &Disk, node: &str, log: &str, extra: &[(&str, &str)]) -> Berth {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let dir = disk.dir.display().to_string();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.scratch.path().join(log))
            .unwrap();
        let child = disk
            .enter()
            .arg(env!("CARGO_BIN_EXE_berth"))
            .arg("serve")
            .env("BERTH_DATABASE_URL", &self.db.url)
            .env("BERTH_JWT_SECRET", SECRET)
            .env("BERTH_NODE_ID", node)
            .env("BERTH_DATA_DIR", format!("{dir}/data"))
            .env("BERTH_WORKTREE_ROOT", format!("{dir}/worktrees"))
            .env("BERTH_CONFIG", self.scratch.path().join("berth.toml"))
            .env("BERTH_BIND", format!("127.0.0.1:{port}"))
            .env("BERTH_NODE_LEASE_SECS", LEASE.to_string())
            .env("BERTH_ROUTING_DEADLINE_MS", "120000")
            .env("BERTH_DB_MAX_CONNECTIONS", "6")
            .env("BERTH_CLEANUP_POLL_MS", "50")
            .env("BERTH_CLEANUP_RETRY_DELAYS_SECS", "0.2")
            .env("BERTH_CLEANUP_MAX_ATTEMPTS", "100")
            .env("BERTH_AGENT_STOP_GRACE_MS", "300")
            .env("BERTH_AGENT_TERM_GRACE_MS", "300")
            .env("RUST_LOG", "info")
            .envs(extra.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("berth starts");
        let base = format!("http://127.0.0.1:{port}");
        let child = std::cell::RefCell::new(child);
        wait_until(&format!("berth {node} to be ready"), WAIT, || async {
            if let Ok(r) = self.http.get(format!("{base}/readyz")).send().await
                && r.status().is_success()
            {
                return Ok(());
            }
            if let Ok(Some(status)) = child.borrow_mut().try_wait() {
                panic!("berth {node} exited while starting: {status}");
            }
            Err("not ready".to_string())
        })
        .await;
        Berth {
            child: child.into_inner(),
            base,
        }
    }

    async fn call(&self, b: &Berth, method: Method, path: &str, body: Option<Value>) -> (u16, Value, Option<String>) {
        let mut req = self
            .http
            .request(method, format!("{}/api/v1{path}", b.base))
            .bearer_auth(&self.token)
            .timeout(Duration::from_secs(150));
        if let Some(body) = body {
            req = req.json(&body);
        }
        let r = req.send().await.expect("the request is answered");
        let status = r.status().as_u16();
        let retry_after = r
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        (status, r.json().await.unwrap_or(Value::Null), retry_after)
    }

    async fn ok(&self, b: &Berth, method: Method, path: &str, body: Option<Value>) -> Value {
        let (status, v, _) = self.call(b, method, path, body).await;
        assert!((200..300).contains(&status), "{path}: {status} {v}");
        v
    }

    async fn wait_node(&self, b: &Berth, node: &str, state: &str) -> Value {
        wait_until_every(&format!("node {node} {state}"), WAIT, SLOW, || async {
            let listed = self.ok(b, Method::GET, "/nodes", None).await;
            match listed["items"].as_array().unwrap().iter().find(|n| n["id"] == node) {
                Some(n) if n["state"] == state => Ok(n.clone()),
                _ => Err(listed.to_string()),
            }
        })
        .await
    }

    async fn wait_session(&self, b: &Berth, id: Uuid, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
        wait_until(&format!("session {id} {what}"), WAIT, || async {
            let s = self.ok(b, Method::GET, &format!("/sessions/{id}"), None).await;
            seen_json(pred(&s), s)
        })
        .await
    }

    /// A task over a new repository of `disk`, registered through `b` (which must be that disk's node),
    /// with an idle `test` agent; the session's id and worktree.
    async fn working_session(&self, b: &Berth, disk: &Disk, name: &str) -> (Uuid, Uuid, String) {
        let ws = self
            .ok(b, Method::POST, "/workspaces", Some(json!({"name": name})))
            .await;
        let ws = id_of(&ws);
        let path = disk.repo(name);
        let repo = self
            .ok(
                b,
                Method::POST,
                &format!("/workspaces/{ws}/repositories"),
                Some(json!({"path": path})),
            )
            .await;
        let task = self
            .ok(
                b,
                Method::POST,
                &format!("/workspaces/{ws}/tasks"),
                Some(json!({"title": name, "repositories": [{"repository_id": id_of(&repo)}]})),
            )
            .await;
        let task = id_of(&task);
        let s = self
            .ok(
                b,
                Method::POST,
                &format!("/tasks/{task}/sessions"),
                Some(json!({"executor_type": "worktree", "agent_profile": "test"})),
            )
            .await;
        let id = id_of(&s);
        let worktree = s["workspace_path"].as_str().unwrap().to_string();
        self.wait_session(b, id, "idle", |s| s["state"] == "idle").await;
        (task, id, worktree)
    }

    /// Waits until the cleanup job is over (succeeded, failed or cancelled) and returns it.
    async fn wait_job(&self, b: &Berth, job: Uuid) -> Value {
        wait_until_every(&format!("cleanup job {job} to settle"), WAIT, SLOW, || async {
            let j = self.ok(b, Method::GET, &format!("/cleanup-jobs/{job}"), None).await;
            seen_json(SETTLED.contains(&j["state"].as_str().unwrap()), j)
        })
        .await
    }

    /// The session's live executions: (execution id, instance id, pid).
    async fn live_executions(&self, session: Uuid) -> Vec<(Uuid, Uuid, i32)> {
        let rows = self
            .conn
            .query_all_raw(Statement::from_string(
                self.conn.get_database_backend(),
                format!(
                    "SELECT id, instance_id, pid FROM agent_executions WHERE session_id = '{session}' \
                     AND state IN ('starting', 'running')"
                ),
            ))
            .await
            .unwrap();
        rows.iter()
            .map(|r| {
                (
                    r.try_get::<Uuid>("", "id").unwrap(),
                    r.try_get::<Uuid>("", "instance_id").unwrap(),
                    r.try_get::<Option<i32>>("", "pid").unwrap().unwrap_or(0),
                )
            })
            .collect()
    }

    /// Waits until the session has exactly one live execution matching `pred`, and returns it.
    async fn wait_one_live(
        &self,
        session: Uuid,
        what: &str,
        pred: impl Fn(&(Uuid, Uuid, i32)) -> bool,
    ) -> (Uuid, Uuid, i32) {
        wait_until(what, WAIT, || async {
            let live = self.live_executions(session).await;
            assert!(live.len() <= 1, "a session never has two live agents (I27): {live:?}");
            if let [one] = live.as_slice()
                && pred(one)
                && one.2 != 0
            {
                return Ok(*one);
            }
            Err(format!("{live:?}"))
        })
        .await
    }

    async fn instance_of(&self, b: &Berth) -> Uuid {
        let ready: Value = self
            .http
            .get(format!("{}/readyz", b.base))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        ready["instance_id"].as_str().unwrap().parse().unwrap()
    }

    /// Waits until instance `id` has renewed its lease twice more (so it has looked for work to take
    /// over at least once since).
    async fn wait_renewals(&self, b: &Berth, node: &str, id: Uuid) {
        let renewed = |listed: &Value| -> Option<String> {
            listed["items"].as_array()?.iter().find(|n| n["id"] == node)?["instances"]
                .as_array()?
                .iter()
                .find(|i| i["id"] == id.to_string())
                .map(|i| i["renewed_at"].as_str().unwrap_or_default().to_string())
        };
        let renewals = std::cell::RefCell::new(Vec::new());
        wait_until_every(&format!("instance {id} to renew"), WAIT, SLOW, || async {
            let listed = self.ok(b, Method::GET, "/nodes", None).await;
            let mut renewals = renewals.borrow_mut();
            if let Some(r) = renewed(&listed)
                && renewals.last() != Some(&r)
            {
                renewals.push(r);
            }
            if renewals.len() < 3 {
                Err(listed.to_string())
            } else {
                Ok(())
            }
        })
        .await;
    }
}

/// Waits (with a deadline) until the process `pid` is gone.
async fn wait_gone(pid: i32, what: &str) {
    wait_until(what, WAIT, || async { seen(!pid_alive(pid), pid) }).await;
}

fn pid_alive(pid: i32) -> bool {
    crate::agents::pid_alive(pid as i64)
}

#[tokio::test]
async fn a_killed_node_strands_nothing_on_separate_disks() {
    let Some(fleet) = Fleet::new().await else { return };
    let (disk_a, disk_b, disk_c) = (fleet.disk(), fleet.disk(), fleet.disk());
    let a = fleet.start(&disk_a, "node-a", "a.log").await;
    let mut b = fleet.start(&disk_b, "node-b", "b.log").await;
    let c = fleet.start(&disk_c, "node-c", "c.log").await;
    for node in ["node-a", "node-b", "node-c"] {
        fleet.wait_node(&a, node, "up").await;
    }
    // Work on node b: its worktree is on b's disk and nowhere else, under the same path.
    let (task, id, worktree) = fleet.working_session(&b, &disk_b, "svc").await;
    let svc_ws = fleet.ok(&a, Method::GET, &format!("/tasks/{task}"), None).await["workspace_id"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(disk_b.exists(&worktree));
    assert!(
        !disk_a.exists(&worktree) && !disk_c.exists(&worktree),
        "no node sees another's disk"
    );
    let s = fleet.ok(&a, Method::GET, &format!("/sessions/{id}"), None).await;
    assert_eq!(s["node"], json!({"id": "node-b", "state": "up"}), "{s}");
    let held = fleet.wait_node(&c, "node-b", "up").await;
    assert_eq!(held["holds"]["environments"], 1, "{held}");
    assert_eq!(held["holds"]["live_sessions"], 1, "{held}");
    // A second workspace with work on b, to be deleted whole while b is down.
    let (web_task, _, web_worktree) = fleet.working_session(&b, &disk_b, "web").await;
    let web_ws = fleet.ok(&a, Method::GET, &format!("/tasks/{web_task}"), None).await["workspace_id"]
        .as_str()
        .unwrap()
        .to_string();
    // An agent request sent to another node is carried out by b.
    fleet
        .ok(&c, Method::POST, &format!("/sessions/{id}/abort"), Some(json!({})))
        .await;
    // A second session of the task, with an agent on b that outlives b, and a conversation on b's disk.
    let other = id_of(
        &fleet
            .ok(
                &a,
                Method::POST,
                &format!("/tasks/{task}/sessions"),
                Some(json!({"executor_type": "worktree", "agent_profile": "lingering"})),
            )
            .await,
    );
    fleet.wait_session(&a, other, "idle", |s| s["state"] == "idle").await;
    let (_, _, other_pid) = fleet.wait_one_live(other, "running on b", |_| true).await;
    let conversation = format!("{}/data/conversations/{other}.jsonl", disk_b.dir.display());
    disk_b.sh(&format!(
        "mkdir -p $(dirname {conversation}) && echo '{{}}' > {conversation}"
    ));
    // Uncommitted work in the task's worktree, on b's disk only.
    disk_b.sh(&format!("printf 'precious\\n' > {worktree}/precious.txt"));
    // b dies.
    b.child.kill().unwrap();
    b.child.wait().unwrap();
    fleet.wait_node(&a, "node-b", "down").await;
    let started = std::time::Instant::now();
    let (status, problem, retry_after) = fleet
        .call(&a, Method::POST, &format!("/sessions/{id}/stop"), Some(json!({})))
        .await;
    assert_eq!(
        (status, problem["code"].as_str()),
        (503, Some("node_unavailable")),
        "{problem}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "answered after {:?}",
        started.elapsed()
    );
    assert_eq!(problem["node_id"], "node-b");
    assert_eq!(retry_after, Some(LEASE.to_string()));
    // Every replica's view of the node follows within a renewal period.
    fleet
        .wait_session(&c, id, "shown on a down node", |s| s["node"]["state"] == "down")
        .await;
    // A session delete is accepted at once: the row goes; its agent and conversation wait for b as a job.
    let (status, v, _) = fleet
        .call(&c, Method::DELETE, &format!("/sessions/{other}"), None)
        .await;
    assert_eq!(status, 204, "{v}");
    let listed = fleet
        .ok(
            &a,
            Method::GET,
            &format!("/cleanup-jobs?task_id={task}&trigger=session_delete"),
            None,
        )
        .await;
    assert_eq!(listed["items"][0]["node_id"], "node-b", "{listed}");
    assert_eq!(listed["items"][0]["state"], "pending", "{listed}");
    let session_job = id_of(&listed["items"][0]);
    // Its task's delete cannot check b's worktree for changes: refused, nothing changed.
    let (status, problem, _) = fleet.call(&a, Method::DELETE, &format!("/tasks/{task}"), None).await;
    assert_eq!(
        (status, problem["code"].as_str()),
        (503, Some("node_unavailable")),
        "{problem}"
    );
    assert_eq!(problem["node_id"], "node-b", "{problem}");
    fleet.ok(&c, Method::GET, &format!("/tasks/{task}"), None).await;
    // Consenting to keep dirty work, it is accepted; the job waits for b, and says so.
    let jobs = fleet
        .ok(
            &a,
            Method::DELETE,
            &format!("/tasks/{task}?keep_dirty_worktrees=true"),
            None,
        )
        .await;
    let job = id_of(&jobs["cleanup_jobs"][0]);
    assert_eq!(jobs["cleanup_jobs"][0]["node_id"], "node-b", "{jobs}");
    let waiting = fleet.ok(&c, Method::GET, &format!("/cleanup-jobs/{job}"), None).await;
    assert_eq!(waiting["state"], "pending", "{waiting}");
    assert_eq!(waiting["waiting_for"]["reason"], "node_unavailable", "{waiting}");
    assert_eq!(waiting["waiting_for"]["node_id"], "node-b", "{waiting}");
    assert!(waiting["waiting_for"]["since"].is_string(), "{waiting}");
    // So is a workspace delete: refused, then with consent its task's job waits for b too.
    let (status, problem, _) = fleet
        .call(
            &c,
            Method::DELETE,
            &format!("/workspaces/{web_ws}?confirm_name=web"),
            None,
        )
        .await;
    assert_eq!(
        (status, problem["code"].as_str()),
        (503, Some("node_unavailable")),
        "{problem}"
    );
    let deleted = fleet
        .ok(
            &c,
            Method::DELETE,
            &format!("/workspaces/{web_ws}?confirm_name=web&keep_dirty_worktrees=true"),
            None,
        )
        .await;
    assert_eq!(deleted["cleanup_jobs"][0]["node_id"], "node-b", "{deleted}");
    let web_job = id_of(&deleted["cleanup_jobs"][0]);
    let held = fleet.wait_node(&a, "node-b", "down").await;
    assert_eq!(held["holds"]["pending_jobs"], 3, "{held}");
    assert!(disk_b.exists(&web_worktree));
    assert!(disk_b.exists(&worktree), "b's disk is untouched while b is down");
    assert!(
        disk_b.exists(&conversation) && pid_alive(other_pid),
        "so are b's agents"
    );
    // b is back: the job runs there and removes the worktree from b's disk.
    let b = fleet.start(&disk_b, "node-b", "b2.log").await;
    let done = fleet.wait_job(&c, job).await;
    assert_eq!(done["state"], "succeeded", "{done}");
    assert!(done["waiting_for"].is_null(), "{done}");
    // The dirty worktree is kept on b's disk, its work byte for byte, and listed as a leftover.
    assert_eq!(disk_b.sh(&format!("cat {worktree}/precious.txt")), "precious\n");
    let kept = fleet
        .ok(&a, Method::GET, &format!("/workspaces/{svc_ws}/leftovers"), None)
        .await;
    let items = kept["items"].as_array().unwrap();
    assert_eq!(items.len(), 1, "{kept}");
    assert_eq!(items[0]["reason"], "dirty_worktree", "{kept}");
    assert_eq!(items[0]["path"], worktree.as_str(), "{kept}");
    assert_eq!(items[0]["node_id"], "node-b", "{kept}");
    let j = fleet.wait_job(&c, web_job).await;
    assert_eq!(j["state"], "succeeded", "{j}");
    assert!(
        !disk_b.exists(&web_worktree),
        "the workspace's worktree, removed on b's disk"
    );
    let j = fleet.wait_job(&c, session_job).await;
    assert_eq!(j["state"], "succeeded", "{j}");
    assert!(
        !disk_b.exists(&conversation),
        "the deleted session's conversation, removed on b's disk"
    );
    assert!(!pid_alive(other_pid), "and its agent ended");
    drop((a, b, c));
}

#[tokio::test]
async fn two_instances_of_one_node_never_fight() {
    let Some(fleet) = Fleet::new().await else { return };
    let disk = fleet.disk();
    let mut first = fleet.start(&disk, "node-c", "c1.log").await;
    let (_, id, _) = fleet.working_session(&first, &disk, "svc").await;
    let one = fleet.instance_of(&first).await;
    let (execution, _, pid) = fleet
        .wait_one_live(id, "run on the first instance", |e| e.1 == one)
        .await;
    // A second instance of the same node starts while the first runs the agent: it leaves it alone.
    let mut second = fleet.start(&disk, "node-c", "c2.log").await;
    let two = fleet.instance_of(&second).await;
    fleet.wait_renewals(&second, "node-c", two).await;
    let now = fleet.wait_one_live(id, "still the first instance's", |_| true).await;
    assert_eq!(now, (execution, one, pid), "the sibling's agent is untouched");
    assert!(pid_alive(pid));
    // The first dies: the second takes its agent over, once.
    first.child.kill().unwrap();
    first.child.wait().unwrap();
    let (_, _, pid2) = fleet
        .wait_one_live(id, "taken over by the second instance", |e| e.1 == two)
        .await;
    assert!(pid_alive(pid2));
    fleet.wait_session(&second, id, "idle", |s| s["state"] == "idle").await;
    wait_gone(pid, "the dead instance's agent to be ended").await;
    // The first comes back while the second runs the agent: nothing is killed, nothing runs twice.
    let third = fleet.start(&disk, "node-c", "c3.log").await;
    let three = fleet.instance_of(&third).await;
    fleet.wait_renewals(&third, "node-c", three).await;
    let now = fleet.wait_one_live(id, "still the second instance's", |_| true).await;
    assert_eq!((now.1, now.2), (two, pid2), "the sibling's agent is untouched");
    assert!(pid_alive(pid2));
    // The second shuts down cleanly: its lease goes back and the third takes the session over.
    // SAFETY: signalling our own child.
    unsafe { libc::kill(second.child.id() as i32, libc::SIGTERM) };
    second.child.wait().unwrap();
    let (_, _, pid3) = fleet
        .wait_one_live(id, "taken over by the third instance", |e| e.1 == three)
        .await;
    assert!(pid_alive(pid3));
    fleet.wait_session(&third, id, "idle", |s| s["state"] == "idle").await;
    drop(third);
}

/// Every request that touches a node's disk or agents, sent to another node, is carried out by the node
/// that holds the work, with the answers it gives itself.
#[tokio::test]
async fn every_disk_and_agent_request_sent_to_another_node_works() {
    let Some(fleet) = Fleet::new().await else { return };
    let (disk_a, disk_b) = (fleet.disk(), fleet.disk());
    let long = [("BERTH_NODE_LEASE_SECS", LONG_LEASE)];
    let a = fleet.start_with(&disk_a, "node-a", "a.log", &long).await;
    let b = fleet.start_with(&disk_b, "node-b", "b.log", &long).await;
    fleet.wait_node(&a, "node-b", "up").await;
    let ws = id_of(
        &fleet
            .ok(&a, Method::POST, "/workspaces", Some(json!({"name": "fleet"})))
            .await,
    );
    // A repository on b's disk, registered through a: b proves the path.
    let on_b = disk_b.repo("svc");
    let (status, refused, _) = fleet
        .call(
            &a,
            Method::POST,
            &format!("/workspaces/{ws}/repositories"),
            Some(json!({"path": on_b})),
        )
        .await;
    assert_eq!(status, 422, "a's disk has no such repository: {refused}");
    let repo = fleet
        .ok(
            &a,
            Method::POST,
            &format!("/workspaces/{ws}/repositories"),
            Some(json!({"path": on_b, "node_id": "node-b"})),
        )
        .await;
    assert_eq!(repo["node_id"], "node-b", "{repo}");
    // A task cannot span nodes.
    let on_a = disk_a.repo("web");
    let repo_a = fleet
        .ok(
            &a,
            Method::POST,
            &format!("/workspaces/{ws}/repositories"),
            Some(json!({"path": on_a})),
        )
        .await;
    assert_eq!(repo_a["node_id"], "node-a");
    let (status, problem, _) = fleet
        .call(
            &a,
            Method::POST,
            &format!("/workspaces/{ws}/tasks"),
            Some(json!({"title": "both", "repositories": [{"repository_id": id_of(&repo)}, {"repository_id": id_of(&repo_a)}]})),
        )
        .await;
    assert_eq!(
        (status, problem["code"].as_str()),
        (422, Some("repositories_on_different_nodes")),
        "{problem}"
    );
    let task = id_of(
        &fleet
            .ok(
                &a,
                Method::POST,
                &format!("/workspaces/{ws}/tasks"),
                Some(json!({"title": "on b", "repositories": [{"repository_id": id_of(&repo)}]})),
            )
            .await,
    );
    // A session created through a: made and run on b.
    let s = fleet
        .ok(
            &a,
            Method::POST,
            &format!("/tasks/{task}/sessions"),
            Some(json!({"executor_type": "worktree", "agent_profile": "test"})),
        )
        .await;
    let id = id_of(&s);
    let worktree = s["workspace_path"].as_str().unwrap().to_string();
    assert!(
        disk_b.exists(&worktree) && !disk_a.exists(&worktree),
        "made on b's disk only"
    );
    let s = fleet.wait_session(&a, id, "idle", |s| s["state"] == "idle").await;
    assert_eq!(s["node"], json!({"id": "node-b", "state": "up"}));
    let env = s["task_environment_id"].as_str().unwrap().to_string();
    // Git status read and refreshed through a: b reads its disk; nothing becomes broken.
    disk_b.sh(&format!("echo change > {worktree}/new.txt"));
    let refreshed = fleet
        .ok(
            &a,
            Method::POST,
            &format!("/environments/{env}/git-status/refresh"),
            Some(json!({})),
        )
        .await;
    assert!(refreshed.to_string().contains("new.txt"), "{refreshed}");
    fleet
        .ok(&a, Method::GET, &format!("/sessions/{id}/git-status"), None)
        .await;
    // Stop through a (routed to the agent), resume through a (forwarded to b).
    fleet
        .ok(&a, Method::POST, &format!("/sessions/{id}/stop"), Some(json!({})))
        .await;
    fleet.wait_session(&a, id, "stopped", |s| s["state"] == "stopped").await;
    fleet
        .ok(&a, Method::POST, &format!("/sessions/{id}/resume"), Some(json!({})))
        .await;
    fleet.wait_session(&a, id, "idle again", |s| s["state"] == "idle").await;
    let env_now = fleet
        .ok(&a, Method::GET, &format!("/tasks/{task}/environment"), None)
        .await;
    assert_eq!(
        env_now["status"], "ready",
        "never broken for not being on a's disk: {env_now}"
    );
    // A reset through a: the dirty worktree is named by b, then removed there with consent.
    fleet
        .ok(&a, Method::POST, &format!("/sessions/{id}/stop"), Some(json!({})))
        .await;
    let (status, problem, _) = fleet
        .call(&a, Method::POST, &format!("/tasks/{task}/environment/reset"), None)
        .await;
    assert_eq!(
        (status, problem["code"].as_str()),
        (409, Some("task_delete_dirty_worktree")),
        "{problem}"
    );
    let reset = fleet
        .ok(
            &a,
            Method::POST,
            &format!("/tasks/{task}/environment/reset?discard_worktree_changes=true"),
            None,
        )
        .await;
    let job = id_of(&reset["cleanup_job"]);
    let j = fleet.wait_job(&a, job).await;
    assert_eq!(j["state"], "succeeded", "the reset's job: {j}");
    assert!(!disk_b.exists(&worktree), "removed on b's disk");
    // Launched again through a: a fresh worktree on b; then the session is deleted through a while
    // its agent runs on b: b stops it first.
    fleet
        .ok(&a, Method::POST, &format!("/sessions/{id}/launch"), Some(json!({})))
        .await;
    fleet
        .wait_session(&a, id, "idle on a fresh worktree", |s| s["state"] == "idle")
        .await;
    let (execution, _, pid) = fleet.wait_one_live(id, "running on b", |_| true).await;
    assert!(pid_alive(pid));
    // The conversation berth keeps for the session is on b's disk: the delete, sent to a, removes it there.
    let conversation = format!("{}/data/conversations/{id}.jsonl", disk_b.dir.display());
    disk_b.sh(&format!(
        "mkdir -p $(dirname {conversation}) && echo '{{}}' > {conversation}"
    ));
    let (status, v, _) = fleet.call(&a, Method::DELETE, &format!("/sessions/{id}"), None).await;
    assert_eq!(status, 204, "{v}");
    assert!(!disk_b.exists(&conversation), "removed on b's disk, where it was");
    wait_gone(
        pid,
        &format!("the agent of execution {execution} to end with its session"),
    )
    .await;
    drop((a, b));
}

/// A node given up on its own disk. Its environment is lost and its session failed with `node_lost`;
/// nothing on its disk is deleted; the task goes on on another node that has the repository at the same
/// path; the node refuses to start until an operator readmits it, and readmitted it deletes nothing.
#[tokio::test]
async fn a_decommissioned_node_deletes_nothing_on_its_disk() {
    let Some(fleet) = Fleet::new().await else { return };
    let (disk_a, disk_b) = (fleet.disk(), fleet.disk());
    let a = fleet.start(&disk_a, "node-a", "a.log").await;
    let mut b = fleet.start(&disk_b, "node-b", "b.log").await;
    fleet.wait_node(&a, "node-b", "up").await;
    let (task, id, worktree) = fleet.working_session(&b, &disk_b, "svc").await;
    let lost_env = fleet.ok(&a, Method::GET, &format!("/sessions/{id}"), None).await["task_environment_id"].clone();
    b.child.kill().unwrap();
    b.child.wait().unwrap();
    fleet.wait_node(&a, "node-b", "down").await;
    let done = fleet
        .ok(
            &a,
            Method::POST,
            "/nodes/node-b/decommission",
            Some(json!({"node_id": "node-b"})),
        )
        .await;
    assert_eq!(
        (done["environments"].as_u64(), done["sessions"].as_u64()),
        (Some(1), Some(1)),
        "{done}"
    );
    let s = fleet.ok(&a, Method::GET, &format!("/sessions/{id}"), None).await;
    assert_eq!(s["state"], "failed", "{s}");
    assert_eq!(s["last_error"]["code"], "node_lost", "{s}");
    let env = fleet
        .ok(
            &a,
            Method::GET,
            &format!("/environments/{}", lost_env.as_str().unwrap()),
            None,
        )
        .await;
    assert_eq!(env["status"], "lost", "{env}");
    // The team has the repository on a too, at the same path: the task goes on there.
    disk_a.repo("svc");
    let fresh = fleet
        .ok(
            &a,
            Method::POST,
            &format!("/tasks/{task}/sessions"),
            Some(json!({"executor_type": "worktree", "agent_profile": "test"})),
        )
        .await;
    assert_ne!(fresh["task_environment_id"], lost_env, "{fresh}");
    assert_eq!(fresh["node"], json!({"id": "node-a", "state": "up"}), "{fresh}");
    let fresh_id = id_of(&fresh);
    fleet
        .wait_session(&a, fresh_id, "idle on a", |s| s["state"] == "idle")
        .await;
    assert!(disk_a.exists(fresh["workspace_path"].as_str().unwrap()));
    // b comes back: it refuses to start, and deletes nothing.
    let status = disk_b
        .enter()
        .arg(env!("CARGO_BIN_EXE_berth"))
        .arg("serve")
        .env("BERTH_DATABASE_URL", &fleet.db.url)
        .env("BERTH_JWT_SECRET", SECRET)
        .env("BERTH_NODE_ID", "node-b")
        .env("BERTH_DATA_DIR", format!("{}/data", disk_b.dir.display()))
        .env("BERTH_WORKTREE_ROOT", format!("{}/worktrees", disk_b.dir.display()))
        .env("BERTH_CONFIG", fleet.scratch.path().join("berth.toml"))
        .env("BERTH_BIND", "127.0.0.1:0")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    assert!(!status.status.success(), "a decommissioned node started");
    let said = String::from_utf8_lossy(&status.stderr);
    assert!(said.contains("BERTH_NODE_READMIT"), "{said}");
    assert!(disk_b.exists(&worktree), "refused, it deleted nothing");
    // Readmitted by its operator: up, and its disk is as it was.
    let b = fleet
        .start_with(&disk_b, "node-b", "b2.log", &[("BERTH_NODE_READMIT", "true")])
        .await;
    fleet.wait_node(&a, "node-b", "up").await;
    assert!(disk_b.exists(&worktree), "readmitted, it deletes nothing");
    let s = fleet.ok(&b, Method::GET, &format!("/sessions/{id}"), None).await;
    assert_eq!(s["state"], "failed", "the lost session stays lost: {s}");
    drop((a, b));
}
