//! Reads and session cycles at one database size: berth over HTTP (wrk) against the bare domain calls.
use super::*;

pub(crate) async fn load(b: &Bench, table: &mut Table, size: &str, events: bool) {
    let secs = secs();
    // The read rows alternate short windows (berth, bare, berth, ...) and compare the median window of
    // each side: the machine's speed drifts by up to 2x within minutes, which one window each turns
    // into the ratio.
    let rounds = env_usize("BERTH_BENCH_READ_ROUNDS", 3).max(1);
    let window = (secs / rounds as u64).max(2);
    for (name, path) in [
        ("GET /api/v1/tasks/{id}", format!("/api/v1/tasks/{}", b.task)),
        ("GET /api/v1/sessions/{id}", format!("/api/v1/sessions/{}", b.session)),
    ] {
        // Where each side's CPU goes: the server's and wrk's per request, and this
        // process's per bare read (its SQLite threads included; the server idles meanwhile), summed
        // over the windows.
        let server = b.server.child.id().to_string();
        let (mut ours, mut bare) = (Vec::new(), Vec::new());
        let (mut server_cpu, mut wrk_cpu, mut bare_cpu, mut requests, mut reads) = (0.0, 0.0, 0.0, 0.0, 0.0);
        for _ in 0..rounds {
            let (server_before, _) = cpu_of(&server);
            let (_, wrk_before) = cpu_of("self");
            let w = wrk(b, &path, READ_CONNECTIONS, window, None);
            assert_eq!(w.failures, 0, "{name}: {} failed responses", w.failures);
            requests += w.rate * window as f64;
            server_cpu += cpu_of(&server).0 - server_before;
            wrk_cpu += cpu_of("self").1 - wrk_before;
            ours.push(w);

            let (bench_before, _) = cpu_of("self");
            let started = Instant::now();
            let (ctx, p, task, session) = (b.ctx.clone(), b.principal.clone(), b.task, b.session);
            let is_task = name.contains("tasks");
            let t = concurrent(READ_CONNECTIONS, window, move || {
                let (ctx, p) = (ctx.clone(), p.clone());
                async move {
                    if is_task {
                        berth::domain::tasks::get(&ctx, &p, task).await.unwrap();
                    } else {
                        berth::domain::sessions::get(&ctx, &p, session).await.unwrap();
                    }
                }
            })
            .await;
            reads += t.rate * started.elapsed().as_secs_f64();
            bare_cpu += cpu_of("self").0 - bench_before;
            bare.push(t);
        }
        let (w, t) = (median_by(&mut ours, |w| w.rate), median_by(&mut bare, |t| t.rate));
        let per = |cpu: f64, n: f64| cpu / n * 1e6;
        let ratio = w.rate / t.rate;
        table.add(
            b.backend,
            &format!("{name}, 64 connections, {size}, median of {rounds} alternated {window} s windows"),
            format!(
                "{:.0}/s, p99 {}; CPU per request: server {:.0} µs, wrk {:.0} µs",
                w.rate,
                w.p99,
                per(server_cpu, requests),
                per(wrk_cpu, requests)
            ),
            format!(
                "{:.0}/s, p99 {} (domain SELECTs); {:.0} µs CPU each",
                t.rate,
                fmt_d(t.p99),
                per(bare_cpu, reads)
            ),
            format!("{:.0}%", ratio * 100.0),
            ">= 70% of bare (issue 19)",
            Some(ratio >= 0.7),
        );
    }

    let script = b.scratch.join("cycle.lua");
    std::fs::write(&script, CYCLE_LUA).unwrap();
    let w = wrk(
        b,
        &format!("/api/v1/tasks/{}/sessions", b.task),
        CYCLE_CLIENTS,
        secs,
        Some(&script),
    );
    assert_eq!(
        w.failures, 0,
        "session cycles: {} failed responses\n{}",
        w.failures, w.raw
    );
    let bare = {
        let (ctx, p, task) = (b.ctx.clone(), b.principal.clone(), b.task);
        concurrent(CYCLE_CLIENTS, secs, move || {
            let (ctx, p) = (ctx.clone(), p.clone());
            async move {
                let s = berth::domain::sessions::create(
                    &ctx,
                    &p,
                    task,
                    berth::domain::sessions::NewSession {
                        executor_type: berth::entity::task_environment::ExecutorType::Worktree,
                        agent_profile: None,
                        name: None,
                        prompt: None,
                        start: Some(false),
                    },
                )
                .await
                .unwrap();
                berth::domain::sessions::delete(&ctx, &p, s.session.id).await.unwrap();
            }
        })
        .await
    };
    let ratio = w.cycles_rate / bare.rate;
    table.add(
        b.backend,
        &format!("session create + delete cycle, 16 clients, {size}"),
        format!("{:.0} cycles/s", w.cycles_rate),
        format!("{:.0} cycles/s (domain transactions, events included)", bare.rate),
        format!("{:.0}%", ratio * 100.0),
        ">= 40% of bare",
        Some(ratio >= 0.4),
    );

    if events {
        replay(b, table).await;
        fanout(b, table).await;
    }
}

pub(crate) struct Throughput {
    pub(crate) rate: f64,
    pub(crate) p99: Duration,
}

/// Runs `op` from `n` tasks for `secs` seconds; rate per second and p99 latency.
pub(crate) async fn concurrent<F, Fut>(n: usize, secs: u64, op: F) -> Throughput
where
    F: Fn() -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let op = Arc::new(op);
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let tasks: Vec<_> = (0..n)
        .map(|_| {
            let (op, stop, done) = (op.clone(), stop.clone(), done.clone());
            tokio::spawn(async move {
                let mut lat = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let t = Instant::now();
                    op().await;
                    lat.push(t.elapsed());
                    done.fetch_add(1, Ordering::Relaxed);
                }
                lat
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(secs)).await;
    stop.store(true, Ordering::Relaxed);
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    let elapsed = start.elapsed();
    all.sort();
    Throughput {
        rate: all.len() as f64 / elapsed.as_secs_f64(),
        p99: all.get(all.len() * 99 / 100).copied().unwrap_or_default(),
    }
}

/// wrk's cycle script: a session create, then (on any of the thread's connections) its delete.
pub(crate) const CYCLE_LUA: &str = r#"
local threads = {}
function setup(thread) table.insert(threads, thread) end
function init(args)
  token = args[1]
  pending = {}
  creates, deletes, failures = 0, 0, 0
end
function request()
  local headers = { ["Authorization"] = "Bearer " .. token, ["Content-Type"] = "application/json" }
  local id = table.remove(pending)
  if id then return wrk.format("DELETE", "/api/v1/sessions/" .. id, headers) end
  return wrk.format("POST", nil, headers, '{"executor_type":"worktree","start":false}')
end
function response(status, headers, body)
  if status == 201 then
    creates = creates + 1
    table.insert(pending, string.match(body, '"id":"([^"]+)"'))
  elseif status == 204 then
    deletes = deletes + 1
  else
    failures = failures + 1
  end
end
function done(summary, latency, requests)
  local c, d, f = 0, 0, 0
  for _, t in ipairs(threads) do c = c + t:get("creates"); d = d + t:get("deletes"); f = f + t:get("failures") end
  io.write(string.format("cycles creates=%d deletes=%d failures=%d\n", c, d, f))
end
"#;

pub(crate) struct Wrk {
    pub(crate) rate: f64,
    pub(crate) p99: String,
    pub(crate) failures: u64,
    pub(crate) cycles_rate: f64,
    pub(crate) raw: String,
}

pub(crate) fn wrk(b: &Bench, path: &str, connections: usize, secs: u64, script: Option<&Path>) -> Wrk {
    let mut cmd = Command::new("wrk");
    cmd.args(["-t2", &format!("-c{connections}"), &format!("-d{secs}s"), "--latency"]);
    match script {
        Some(s) => {
            cmd.arg("-s").arg(s);
            cmd.arg(format!("{}{path}", b.server.url)).arg("--").arg(&b.token);
        }
        None => {
            cmd.args(["-H", &format!("Authorization: Bearer {}", b.token)]);
            cmd.arg(format!("{}{path}", b.server.url));
        }
    }
    let out = cmd.output().expect("wrk is installed (benches/run.sh installs it)");
    let raw = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "wrk failed: {raw}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let field = |prefix: &str| {
        raw.lines()
            .find_map(|l| l.trim().strip_prefix(prefix).map(|v| v.trim().to_string()))
    };
    let rate: f64 = field("Requests/sec:").and_then(|v| v.parse().ok()).unwrap_or(0.0);
    let p99 = field("99%").unwrap_or_default();
    let mut failures: u64 = field("Non-2xx or 3xx responses:")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let mut cycles_rate = 0.0;
    if let Some(line) = raw.lines().find(|l| l.starts_with("cycles ")) {
        let get = |k: &str| -> u64 {
            line.split_whitespace()
                .find_map(|kv| kv.strip_prefix(k))
                .and_then(|v| v.parse().ok())
                .unwrap_or(0)
        };
        failures += get("failures=");
        cycles_rate = get("deletes=") as f64 / secs as f64;
    }
    // Socket errors (connect, read, write, timeout) count as failures too.
    if let Some(errors) = field("Socket errors:") {
        failures += errors
            .split(',')
            .filter_map(|p| p.split_whitespace().last()?.parse::<u64>().ok())
            .sum::<u64>();
    }
    Wrk {
        rate,
        p99,
        failures,
        cycles_rate,
        raw,
    }
}
