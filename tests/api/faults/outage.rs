//! The database goes away under berth: a PostgreSQL cluster of the test's own restarted under load, and a
//! full disk under SQLite. berth answers 503 meanwhile, recovers without a restart and loses nothing.
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use reqwest::Method;
use serde_json::{Value, json};

use super::{
    WAIT, assert_invariants, call, connect, process_env, rows, setup, start, task_with_worktree, wait_jobs_finished,
    wait_ready,
};
use crate::both_backends;
use crate::helpers::{Backend, TestApp, id_of, wait_until_every};

/// Posts the task `title` to `tasks` (every 200 ms, with a deadline) until it is created (201), as writes
/// resume after an outage; returns it.
async fn task_once_writable(client: &reqwest::Client, token: &str, tasks: &str, title: &str) -> Value {
    let every = Duration::from_millis(200);
    wait_until_every("writes to resume", WAIT, every, || async {
        let body = Some(json!({ "title": title }));
        let (status, t) = call(client, token, Method::POST, tasks.to_string(), body).await;
        if status == 201 {
            Ok(t)
        } else {
            Err(format!("{status}: {t}"))
        }
    })
    .await
}

both_backends!(
    postgres_restarting_under_load_answers_503_and_loses_nothing,
    a_full_disk_on_sqlite_answers_503_and_corrupts_nothing,
);

/// A PostgreSQL cluster of the test's own (initdb into a temp dir, run as the `postgres` user), so the
/// test can stop and start it without touching the shared server other tests use.
struct PrivatePostgres {
    bin: PathBuf,
    dir: PathBuf,
    port: u16,
    _tmp: tempfile::TempDir,
}

impl PrivatePostgres {
    fn create() -> Option<PrivatePostgres> {
        let bin = std::fs::read_dir("/usr/lib/postgresql")
            .ok()?
            .flatten()
            .map(|e| e.path().join("bin"))
            .find(|b| b.join("pg_ctl").is_file())?;
        let tmp = tempfile::TempDir::new().unwrap();
        let dir = tmp.path().join("cluster");
        std::fs::create_dir_all(&dir).unwrap();
        // initdb refuses to run as root: the cluster belongs to the postgres user.
        let as_postgres = unsafe { libc::geteuid() } == 0;
        if as_postgres {
            let uid = Command::new("id").args(["-u", "postgres"]).output().ok()?;
            let uid: u32 = String::from_utf8_lossy(&uid.stdout).trim().parse().ok()?;
            let gid = Command::new("id").args(["-g", "postgres"]).output().ok()?;
            let gid: u32 = String::from_utf8_lossy(&gid.stdout).trim().parse().ok()?;
            std::os::unix::fs::chown(tmp.path(), Some(uid), Some(gid)).unwrap();
            std::os::unix::fs::chown(&dir, Some(uid), Some(gid)).unwrap();
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let pg = PrivatePostgres {
            bin,
            dir,
            port,
            _tmp: tmp,
        };
        let ok = pg.run(&[
            "initdb",
            "-D",
            pg.dir.to_str().unwrap(),
            "-U",
            "postgres",
            "--auth=trust",
            "-E",
            "UTF8",
            "--no-sync",
        ]);
        ok.then_some(pg)
    }

    fn run(&self, args: &[&str]) -> bool {
        let program = self.bin.join(args[0]);
        let mut cmd = if unsafe { libc::geteuid() } == 0 {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(&program);
            c
        } else {
            Command::new(&program)
        };
        let out = cmd.args(&args[1..]).current_dir("/").output().expect("runs");
        if !out.status.success() {
            eprintln!(
                "{args:?}: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        out.status.success()
    }

    fn start(&self) {
        let opts = format!(
            "-p {} -c listen_addresses=127.0.0.1 -c unix_socket_directories={} -c fsync=off",
            self.port,
            self.dir.display()
        );
        let log = self.dir.join("server.log");
        assert!(
            self.run(&[
                "pg_ctl",
                "-D",
                self.dir.to_str().unwrap(),
                "-o",
                &opts,
                "-l",
                log.to_str().unwrap(),
                "-w",
                "start"
            ]),
            "the private PostgreSQL starts"
        );
    }

    fn stop(&self) {
        assert!(self.run(&["pg_ctl", "-D", self.dir.to_str().unwrap(), "-m", "fast", "-w", "stop"]));
    }

    fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }
}

impl Drop for PrivatePostgres {
    fn drop(&mut self) {
        let _ = self.run(&["pg_ctl", "-D", self.dir.to_str().unwrap(), "-m", "immediate", "stop"]);
    }
}

// PostgreSQL restarted while requests and cleanup jobs are in flight: berth answers 503 problem+json
// during the outage (not a hang, not a panic), reconnects without a restart, and loses no committed change.
async fn postgres_restarting_under_load_answers_503_and_loses_nothing(app: TestApp) {
    if app.backend == Backend::Sqlite {
        return;
    }
    let Some(pg) = PrivatePostgres::create() else {
        panic!("could not create a private PostgreSQL cluster (initdb under /usr/lib/postgresql)");
    };
    pg.start();
    let data = app.scratch.path().join("outage");
    let mut env = process_env(&app, &data);
    env.insert("BERTH_DATABASE_URL".into(), pg.url());
    let log = app.scratch.path().join("outage.log");
    let client = crate::helpers::client();
    let mut b = start(&env, None, &log);
    wait_ready(&client, &mut b).await;
    let token = app.admin.clone();
    let api = format!("{}/api/v1", b.base);
    let (ws, repo, source) = setup(&client, &b.base, &token, app.scratch.path()).await;
    let mut tasks = Vec::new();
    for i in 0..6 {
        tasks.push(task_with_worktree(&client, &token, &api, ws, repo, &format!("outage {i}")).await);
    }
    // Deletes in flight when the database goes away: their jobs must still finish afterwards.
    for task in &tasks[..3] {
        let (status, r) = call(&client, &token, Method::DELETE, format!("{api}/tasks/{task}"), None).await;
        assert_eq!(status, 202, "{r}");
    }
    pg.stop();
    // During the outage: a 503 problem+json for reads and writes, in bounded time; the process lives.
    for (method, path, body) in [
        (Method::GET, format!("{api}/tasks/{}", tasks[4]), None),
        (
            Method::POST,
            format!("{api}/workspaces/{ws}/tasks"),
            Some(json!({"title": "during the outage"})),
        ),
        (Method::DELETE, format!("{api}/tasks/{}", tasks[5]), None),
    ] {
        let started = std::time::Instant::now();
        let mut req = client
            .request(method.clone(), &path)
            .bearer_auth(&token)
            .timeout(Duration::from_secs(30));
        if let Some(b) = &body {
            req = req.json(b);
        }
        let r = req.send().await.expect("answered during the outage, not hung");
        assert_eq!(r.status().as_u16(), 503, "{method} {path}");
        assert_eq!(
            r.headers().get("content-type").and_then(|v| v.to_str().ok()),
            Some("application/problem+json")
        );
        let p: Value = r.json().await.unwrap();
        assert_eq!(p["code"], "unavailable", "{p}");
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "answered within the acquire timeout"
        );
    }
    let r = client.get(format!("{}/readyz", b.base)).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 503, "not ready while the database is down");
    assert!(b.child.try_wait().unwrap().is_none(), "berth is still running");
    pg.start();
    // Back without a restart: ready again, writes work, and what was committed before is all there.
    task_once_writable(
        &client,
        &token,
        &format!("{api}/workspaces/{ws}/tasks"),
        "after the outage",
    )
    .await;
    assert!(b.child.try_wait().unwrap().is_none(), "berth did not restart");
    for task in &tasks[3..] {
        let (status, t) = call(&client, &token, Method::GET, format!("{api}/tasks/{task}"), None).await;
        assert_eq!(status, 200, "{t}");
    }
    let conn = sea_orm::Database::connect(pg.url()).await.unwrap();
    let jobs = wait_jobs_finished(&conn).await;
    assert_eq!(jobs.len(), 3, "exactly the three deletes made jobs: {jobs:?}");
    assert!(jobs.iter().all(|(s, _)| s == "succeeded"), "{jobs:?}");
    assert_eq!(
        crate::helpers::worktrees_of(&source).len(),
        4,
        "the main work tree and the three surviving tasks' worktrees"
    );
    assert_invariants(&conn, &data.join("worktrees").canonicalize().unwrap()).await;
    conn.close().await.ok();
    drop(b);
}

// The SQLite data directory's disk fills up: writes answer 503 problem+json (never 500), and once space
// returns, writes work again, every write that was answered 201 is there, and the file is intact.
async fn a_full_disk_on_sqlite_answers_503_and_corrupts_nothing(app: TestApp) {
    if app.backend == Backend::Postgres {
        return;
    }
    let mount = app.scratch.path().join("small-disk");
    std::fs::create_dir_all(&mount).unwrap();
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=4m", "tmpfs"])
        .arg(&mount)
        .output()
        .is_ok_and(|o| o.status.success());
    if !mounted {
        eprintln!("NOT RUN: cannot mount a small tmpfs here (needs root); the disk-full fault is untested");
        return;
    }
    struct Unmount(PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg("-l").arg(&self.0).status();
        }
    }
    let _unmount = Unmount(mount.clone());
    let data = mount.join("data");
    let mut env = process_env(&app, &data);
    env.remove("BERTH_DATABASE_URL");
    env.insert(
        "BERTH_WORKTREE_ROOT".into(),
        app.scratch.path().join("worktrees-full").display().to_string(),
    );
    let log = app.scratch.path().join("full.log");
    let client = crate::helpers::client();
    let mut b = start(&env, None, &log);
    wait_ready(&client, &mut b).await;
    let token = app.admin.clone();
    let api = format!("{}/api/v1", b.base);
    let (status, w) = call(
        &client,
        &token,
        Method::POST,
        format!("{api}/workspaces"),
        Some(json!({"name": "ws"})),
    )
    .await;
    assert_eq!(status, 201, "{w}");
    let ws = id_of(&w);
    // Fill the disk, leaving a little room for the first writes.
    let filler = mount.join("filler");
    {
        use std::io::Write;
        let mut f = std::fs::File::create(&filler).unwrap();
        let chunk = vec![0u8; 64 * 1024];
        while f.write_all(&chunk).is_ok() {}
        let _ = f.sync_all();
    }
    let len = std::fs::metadata(&filler).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&filler)
        .unwrap()
        .set_len(len.saturating_sub(256 * 1024))
        .unwrap();
    let description = "x".repeat(19_000);
    let mut created = Vec::new();
    let mut unavailable = 0;
    for i in 0..60 {
        let (status, t) = call(
            &client,
            &token,
            Method::POST,
            format!("{api}/workspaces/{ws}/tasks"),
            Some(json!({"title": format!("full {i}"), "description": description})),
        )
        .await;
        match status {
            201 => created.push(id_of(&t)),
            503 => {
                assert_eq!(t["code"], "unavailable", "{t}");
                unavailable += 1;
                if unavailable >= 3 {
                    break;
                }
            }
            other => panic!(
                "a full disk answered {other}: {t}\n{}",
                std::fs::read_to_string(&log).unwrap_or_default()
            ),
        }
    }
    assert!(
        unavailable > 0,
        "the disk never filled ({} tasks written)",
        created.len()
    );
    assert!(b.child.try_wait().unwrap().is_none(), "berth is still running");
    // Space returns: writes work again without a restart.
    std::fs::remove_file(&filler).unwrap();
    let t = task_once_writable(&client, &token, &format!("{api}/workspaces/{ws}/tasks"), "after").await;
    created.push(id_of(&t));
    for task in &created {
        let (status, _) = call(&client, &token, Method::GET, format!("{api}/tasks/{task}"), None).await;
        assert_eq!(
            status,
            200,
            "a task answered 201 is there\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
    }
    drop(b);
    let conn = connect(&app, &data).await;
    let check = rows(&conn, "PRAGMA integrity_check").await;
    let verdict: String = check[0].try_get_by_index(0).unwrap();
    assert_eq!(verdict, "ok");
    conn.close().await.ok();
}
