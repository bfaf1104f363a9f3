//! Small things.
use super::*;

pub(crate) fn git(dir: &Path, args: &[&str]) {
    let out = Command::new("git").arg("-C").arg(dir).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

pub(crate) fn git_init(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    git(dir, &["init", "-q", "-b", "main"]);
    std::fs::write(dir.join("README.md"), "bench\n").unwrap();
    git(dir, &["add", "."]);
    git(
        dir,
        &[
            "-c",
            "user.name=bench",
            "-c",
            "user.email=bench@example.com",
            "commit",
            "-q",
            "-m",
            "init",
        ],
    );
}

pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

pub(crate) async fn wait_ready(http: &reqwest::Client, url: &str) {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        if let Ok(r) = http.get(format!("{url}/readyz")).send().await
            && r.status().is_success()
        {
            return;
        }
        assert!(Instant::now() < deadline, "the server did not become ready");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

pub(crate) async fn exec(conn: &DatabaseConnection, sql: &str) {
    conn.execute_raw(Statement::from_string(conn.get_database_backend(), sql.to_string()))
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
}

pub(crate) async fn count(conn: &DatabaseConnection, sql: &str) -> i64 {
    let row = conn
        .query_one_raw(Statement::from_string(conn.get_database_backend(), sql.to_string()))
        .await
        .unwrap()
        .unwrap();
    row.try_get("", "n").unwrap()
}

pub(crate) fn id_of(v: &Value) -> Uuid {
    v["id"]
        .as_str()
        .unwrap_or_else(|| panic!("no id in {v}"))
        .parse()
        .unwrap()
}

pub(crate) fn median(v: &mut [Duration]) -> Duration {
    v.sort();
    v[v.len() / 2]
}

pub(crate) fn fmt_d(d: Duration) -> String {
    if d < Duration::from_millis(1) {
        format!("{:.0} µs", d.as_secs_f64() * 1e6)
    } else if d < Duration::from_secs(1) {
        format!("{:.2} ms", d.as_secs_f64() * 1e3)
    } else {
        format!("{:.2} s", d.as_secs_f64())
    }
}

/// What the suite reads of `/proc/<pid>/stat` (`pid` may be `self`).
pub(crate) struct ProcStat {
    pub(crate) ppid: u32,
    /// CPU seconds of the process itself (user + system, every thread).
    pub(crate) own: f64,
    /// CPU seconds of the children it has reaped (a finished `wrk`).
    pub(crate) reaped: f64,
}

pub(crate) fn proc_stat(pid: &str) -> Option<ProcStat> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command's closing parenthesis: state (3rd), ppid, .., utime (14th), stime, cutime,
    // cstime; in clock ticks (100 a second).
    let rest: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let secs = |i: usize| rest.get(i).and_then(|f| f.parse::<f64>().ok()).unwrap_or(0.0) / 100.0;
    Some(ProcStat {
        ppid: rest.get(1)?.parse().ok()?,
        own: secs(11) + secs(12),
        reaped: secs(13) + secs(14),
    })
}

/// CPU seconds of `pid`: its own, and its reaped children's ([`ProcStat`]).
pub(crate) fn cpu_of(pid: &str) -> (f64, f64) {
    proc_stat(pid).map_or((0.0, 0.0), |s| (s.own, s.reaped))
}

/// The median element of `items` by `key` (reorders them).
pub(crate) fn median_by<T>(items: &mut [T], key: impl Fn(&T) -> f64) -> &T {
    items.sort_by(|a, b| key(a).total_cmp(&key(b)));
    &items[items.len() / 2]
}
