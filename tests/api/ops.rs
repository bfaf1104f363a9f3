//! Operations endpoints are public and honest.
use reqwest::Method;

use crate::both_backends;
use crate::helpers::{TestApp, code_and_text, wait_until};

both_backends!(
    health_readiness_and_metrics,
    storage_is_configured_for_concurrency,
    version_and_healthcheck
);

/// `berth healthcheck` with only these variables (no inherited `BERTH_*`): its exit code and output.
fn healthcheck(vars: &[(&str, &str)]) -> (i32, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_berth"))
        .args(["healthcheck", "--timeout", "10s"])
        .env_clear()
        .envs(vars.iter().copied())
        .output()
        .unwrap();
    code_and_text(out)
}

/// `GET /version` is public; `berth healthcheck` exits by `/readyz`, on the address the same settings
/// as `serve` give (variable or file; an unspecified address is reached on loopback).
async fn version_and_healthcheck(app: TestApp) {
    let v = app.call(Method::GET, "/version", None, None).await.ok(200);
    assert_eq!(v["version"], env!("CARGO_PKG_VERSION"));
    let commit = v["commit"].as_str().unwrap();
    assert!(
        commit == "unknown" || (commit.len() == 40 && commit.bytes().all(|b| b.is_ascii_hexdigit())),
        "{v}"
    );
    assert_eq!(commit, berth::version::COMMIT);

    let port = app.base.rsplit(':').next().unwrap().to_string();
    let (code, text) = healthcheck(&[("BERTH_BIND", &format!("127.0.0.1:{port}"))]);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("200"), "{text}");
    let file = app.scratch.path().join("berth.toml");
    std::fs::write(&file, format!("bind = \"0.0.0.0:{port}\"\n")).unwrap();
    let (code, text) = healthcheck(&[("BERTH_CONFIG", file.to_str().unwrap())]);
    assert_eq!(code, 0, "from the file, on loopback: {text}");

    // Nothing listening: not ready.
    let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let free_addr = free.local_addr().unwrap();
    drop(free);
    let (code, text) = healthcheck(&[("BERTH_BIND", &free_addr.to_string())]);
    assert_eq!(code, 1, "{text}");
    // A server answering 503 (what berth's /readyz says without its database): not ready.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let server = std::thread::spawn(move || {
        use std::io::{Read, Write};
        let (mut conn, _) = listener.accept().unwrap();
        let mut buf = [0u8; 1024];
        let n = conn.read(&mut buf).unwrap();
        let request = String::from_utf8_lossy(&buf[..n]).to_string();
        conn.write_all(b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\n\r\n")
            .unwrap();
        request
    });
    let (code, text) = healthcheck(&[("BERTH_BIND", &addr.to_string())]);
    assert_eq!(code, 1, "{text}");
    assert!(text.contains("503"), "{text}");
    assert!(server.join().unwrap().starts_with("GET /readyz HTTP/1.1\r\n"));
    // A bad setting is a usage error, not "not ready".
    let (code, text) = healthcheck(&[("BERTH_BIND", "nonsense")]);
    assert_eq!(code, 2, "{text}");
    assert!(text.contains("BERTH_BIND"), "{text}");
}

/// SQLite runs with WAL, foreign keys and a busy timeout, on a pool of several connections.
async fn storage_is_configured_for_concurrency(app: TestApp) {
    use sea_orm::{ConnectionTrait, Statement};
    if app.backend == crate::helpers::Backend::Postgres {
        assert_eq!(app.db().get_database_backend(), sea_orm::DbBackend::Postgres);
        return;
    }
    let db = app.db();
    let mut values = Vec::new();
    for name in ["journal_mode", "foreign_keys", "busy_timeout"] {
        let row = db
            .query_one_raw(Statement::from_string(
                sea_orm::DbBackend::Sqlite,
                format!("PRAGMA {name}"),
            ))
            .await
            .unwrap()
            .unwrap();
        let value = row
            .try_get_by_index::<String>(0)
            .or_else(|_| row.try_get_by_index::<i64>(0).map(|n| n.to_string()))
            .unwrap();
        values.push(value);
    }
    assert_eq!(values, vec!["wal", "1", "30000"]);
    // A dangling reference is refused by the database itself.
    let r = app
        .db()
        .execute_raw(Statement::from_string(
            sea_orm::DbBackend::Sqlite,
            "INSERT INTO tasks (id, workspace_id, title, description, kind, workspace_mode, last_activity_at, created_at, updated_at) VALUES (X'0190f0f0000070008000000000000001', X'0190f0f0000070008000000000000002', 't', '', 'standard', 'new_workspace', '2026-01-01T00:00:00Z', '2026-01-01T00:00:00Z', '2026-01-01T00:00:00Z')",
        ))
        .await;
    assert!(r.is_err(), "foreign keys are enforced");
    // Concurrent read-then-write transactions on the pool do not fail with "database is locked": a
    // deferred transaction that reads the repositories and then writes would (BEGIN IMMEDIATE does not).
    let ws = app.workspace("busy").await;
    let (repo, _) = app.repository(ws, "busy-repo").await;
    let url = format!("/api/v1/workspaces/{ws}/tasks");
    let writes = (0..24).map(|i| {
        app.post(
            &url,
            serde_json::json!({"title": format!("t{i}"), "repositories": [{"repository_id": repo}]}),
        )
    });
    for r in futures_util::future::join_all(writes).await {
        r.ok(201);
    }
}

type Exposition =
    openmetrics_parser::MetricsExposition<openmetrics_parser::OpenMetricsType, openmetrics_parser::OpenMetricsValue>;

/// `/metrics`, parsed as a scraper would (a strict OpenMetrics parser: types, suffixes, `# EOF`).
async fn scrape(app: &TestApp) -> (Exposition, String) {
    // As Prometheus asks for it.
    let accept = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5";
    let r = app
        .call_with(Method::GET, "/metrics", None, None, &[("Accept", accept)])
        .await;
    assert_eq!(r.status, 200);
    assert!(
        r.header("content-type")
            .unwrap()
            .starts_with("application/openmetrics-text; version=1.0.0"),
        "{:?}",
        r.header("content-type")
    );
    // Anyone else (curl, a Prometheus-text scraper): the text format 0.0.4, read by its own parsers.
    let plain = app.call(Method::GET, "/metrics", None, None).await;
    assert_eq!(
        plain.header("content-type").as_deref(),
        Some("text/plain; version=0.0.4; charset=utf-8")
    );
    prometheus_text_is_valid(&plain.text);
    let parsed = openmetrics_parser::openmetrics::parse_openmetrics(&r.text)
        .unwrap_or_else(|e| panic!("not OpenMetrics: {e:?}\n{}", r.text));
    (parsed, r.text)
}

/// The text format as Prometheus reads it. `promtool check metrics` (Prometheus's own parser and linter,
/// Debian's `prometheus` package, installed by `.ci/run`) must accept it, and a second parser must type
/// every counter on its `_total` name; no OpenMetrics marker remains.
fn prometheus_text_is_valid(text: &str) {
    use openmetrics_parser::PrometheusType as T;
    assert!(!text.contains("# EOF") && !text.contains(" info\n"), "{text}");
    let parsed = openmetrics_parser::prometheus::parse_prometheus(text)
        .unwrap_or_else(|e| panic!("not Prometheus text: {e:?}\n{text}"));
    for (family, kind) in [
        ("berth_http_requests_total", T::Counter),
        ("berth_build_info", T::Gauge),
        ("berth_agents_live", T::Gauge),
        ("berth_http_request_duration_seconds", T::Histogram),
    ] {
        let f = parsed
            .families
            .get(family)
            .unwrap_or_else(|| panic!("no {family} family:\n{text}"));
        assert_eq!(f.family_type, kind, "{family}");
    }
    match std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
    {
        Ok(mut child) => {
            use std::io::Write;
            child.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
            let out = child.wait_with_output().unwrap();
            assert!(
                out.status.success(),
                "promtool refuses the text: {}{}\n{text}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Err(e) if std::env::var_os("CI").is_some_and(|v| !v.is_empty()) => {
            panic!("CI is set but promtool cannot run ({e}): .ci/run installs Debian's prometheus package")
        }
        Err(_) => eprintln!("note: promtool is not installed; the Prometheus text was checked by one parser only"),
    }
}

/// The value of the sample of `family` whose labels include `labels` (a counter's total, a gauge's value,
/// a histogram's count).
fn value(exp: &Exposition, family: &str, labels: &[(&str, &str)]) -> Option<f64> {
    use openmetrics_parser::OpenMetricsValue as V;
    let f = exp.families.get(family)?;
    f.iter_samples().find_map(|s| {
        let set = s.get_labelset().ok()?;
        if !labels.iter().all(|(k, v)| set.get_label_value(k) == Some(*v)) {
            return None;
        }
        match &s.value {
            V::Counter(c) => Some(c.value.as_f64()),
            V::Gauge(g) | V::Unknown(g) => Some(g.as_f64()),
            V::Histogram(h) => h.count.map(|c| c as f64),
            V::Info => Some(1.0),
            _ => None,
        }
    })
}

/// Scrapes until `check` holds, for at most 20 s (a loaded machine), then fails with the last scrape.
async fn until(app: &TestApp, what: &str, check: impl Fn(&Exposition) -> bool) -> Exposition {
    until_within(app, what, 20, check).await
}

async fn until_within(app: &TestApp, what: &str, secs: u64, check: impl Fn(&Exposition) -> bool) -> Exposition {
    wait_until(what, std::time::Duration::from_secs(secs), || async {
        let (exp, text) = scrape(app).await;
        if check(&exp) { Ok(exp) } else { Err(text) }
    })
    .await
}

async fn health_readiness_and_metrics(app: TestApp) {
    use openmetrics_parser::OpenMetricsType as T;
    assert_eq!(
        app.call(Method::GET, "/healthz", None, None).await.ok(200)["status"],
        "ok"
    );
    assert_eq!(
        app.call(Method::GET, "/readyz", None, None).await.ok(200)["status"],
        "ready"
    );
    app.get("/api/v1/workspaces").await.ok(200);
    app.call(Method::GET, "/api/v1/workspaces", None, None)
        .await
        .problem(401, "unauthenticated");
    let (exp, text) = scrape(&app).await;
    // Every family, with its type (the parser has checked each type's samples: a counter's
    // `_total`, a histogram's buckets, `_sum` and `_count`). A labelled family is in the
    // exposition once it has a sample: those are checked below, after what makes one.
    let expected = [
        ("berth_http_requests", T::Counter),
        ("berth_http_request_duration_seconds", T::Histogram),
        ("berth_db_pool_connections", T::Gauge),
        ("berth_db_pool_max_connections", T::Gauge),
        ("berth_cleanup_jobs", T::Gauge),
        ("berth_cleanup_claims", T::Counter),
        ("berth_cleanup_claim_latency_seconds", T::Histogram),
        ("berth_agents_live", T::Gauge),
        ("berth_agent_restarts", T::Counter),
        ("berth_restore_max_concurrent", T::Gauge),
        ("berth_event_streams_open", T::Gauge),
        ("berth_event_publish_lag_seconds", T::Histogram),
        ("berth_build", T::Info),
        ("process_cpu_seconds", T::Counter),
        ("process_resident_memory_bytes", T::Gauge),
        ("process_virtual_memory_bytes", T::Gauge),
        ("process_start_time_seconds", T::Gauge),
        ("process_threads", T::Gauge),
        ("process_open_fds", T::Gauge),
        ("process_max_fds", T::Gauge),
    ];
    let typed = |exp: &Exposition, text: &str, name: &str, kind: T| {
        let f = exp
            .families
            .get(name)
            .unwrap_or_else(|| panic!("{name} missing:\n{text}"));
        assert_eq!(f.family_type, kind, "{name}");
        assert!(!f.help.is_empty(), "{name} has help");
    };
    for (name, kind) in expected {
        typed(&exp, &text, name, kind);
    }
    if exp.families.contains_key("berth_git_command_failures") {
        typed(&exp, &text, "berth_git_command_failures", T::Counter);
    }
    let ws = [("method", "GET"), ("route", "/api/v1/workspaces")];
    assert_eq!(
        value(&exp, "berth_http_requests", &[ws[0], ws[1], ("status", "200")]),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        value(&exp, "berth_http_requests", &[ws[0], ws[1], ("status", "401")]),
        Some(1.0)
    );
    assert_eq!(
        value(
            &exp,
            "berth_http_request_duration_seconds",
            &[ws[0], ws[1], ("status", "200")]
        ),
        Some(1.0)
    );
    assert_eq!(value(&exp, "berth_db_pool_max_connections", &[]), Some(5.0));
    assert!(value(&exp, "berth_db_pool_connections", &[("state", "open")]).is_some_and(|n| n >= 1.0));
    assert_eq!(
        value(
            &exp,
            "berth_build",
            &[
                ("version", env!("CARGO_PKG_VERSION")),
                ("commit", berth::version::COMMIT)
            ]
        ),
        Some(1.0),
        "{text}"
    );
    assert!(value(&exp, "process_resident_memory_bytes", &[]).is_some_and(|b| b > 0.0));
    assert!(value(&exp, "process_open_fds", &[]).is_some_and(|n| n > 0.0));
    assert_eq!(value(&exp, "berth_cleanup_jobs", &[("state", "pending")]), Some(0.0));
    assert_eq!(value(&exp, "berth_event_streams_open", &[]), Some(0.0));

    // A stream counts as open while it is, and no longer once the client goes.
    let sse = crate::helpers::Sse::open(&app, &app.admin, "", None).await;
    until(&app, "one stream open", |e| {
        value(e, "berth_event_streams_open", &[]) == Some(1.0)
    })
    .await;
    drop(sse);
    // The server may only learn that the client went when it next writes: at the latest the 15 s
    // keep-alive, which on a loaded machine can take longer than `until`'s deadline after it.
    until_within(&app, "no stream open", 60, |e| {
        value(e, "berth_event_streams_open", &[]) == Some(0.0)
    })
    .await;
    // A cursor from another server generation is told to reset.
    let mut stale = crate::helpers::Sse::open(
        &app,
        &app.admin,
        &format!("?after=1&instance_id={}", uuid::Uuid::now_v7()),
        None,
    )
    .await;
    let frame = stale.next(std::time::Duration::from_secs(20)).await.unwrap();
    assert_eq!(frame.event, "reset", "{frame:?}");
    let exp = until(&app, "the reset counted", |e| {
        value(e, "berth_event_stream_resets", &[("reason", "truncated")]) == Some(1.0)
    })
    .await;
    typed(&exp, "", "berth_event_stream_resets", T::Counter);

    // git commands (a worktree for a session), events reaching the streams, cleanup jobs moving through
    // their states: each counted by the code that does it.
    let f = app.task_with_repo_in("metrics", "metrics-repo", "Metrics").await;
    let task = f.task;
    f.session("worktree").await;
    let exp = until(&app, "git worktree add timed", |e| {
        value(e, "berth_git_command_duration_seconds", &[("outcome", "ok")]).is_some_and(|n| n >= 1.0)
    })
    .await;
    typed(&exp, "", "berth_git_command_duration_seconds", T::Histogram);
    until(&app, "events published", |e| {
        value(e, "berth_event_publish_lag_seconds", &[]).is_some_and(|n| n >= 1.0)
    })
    .await;
    app.delete(&format!("/api/v1/tasks/{task}")).await.ok(202);
    let exp = until(&app, "the removal job succeeded", |e| {
        value(e, "berth_cleanup_jobs", &[("state", "succeeded")]).is_some_and(|n| n >= 1.0)
    })
    .await;
    // The gauges agree with the table (no job is counted twice or lost between states).
    let total: f64 = [
        "prepared",
        "pending",
        "running",
        "retry_wait",
        "succeeded",
        "failed",
        "cancelled",
    ]
    .iter()
    .map(|s| value(&exp, "berth_cleanup_jobs", &[("state", s)]).unwrap_or(0.0))
    .sum();
    assert_eq!(total as i64, app.count("task_resource_cleanup_jobs").await);
    assert!(value(&exp, "berth_cleanup_claims", &[]).is_some_and(|n| n >= 1.0));
    assert!(value(&exp, "berth_cleanup_claim_latency_seconds", &[]).is_some_and(|n| n >= 1.0));
}
