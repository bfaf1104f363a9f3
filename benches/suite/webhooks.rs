//! What webhook delivery costs a busy server: 16 clients PATCHing tasks for a window with no subscription,
//! then with 10 subscriptions (each to a receiver of its own in this process, every `task.updated`), in
//! alternated rounds. Reported: the PATCH throughput of each (target: within 10%), and the delivery lag
//! of every event (from its `created_at` to its arrival at the receiver; p50 and p99), each receiver
//! checked to get every event of its window once and in order.
use std::io::{Read, Write};
use std::sync::Mutex;

use super::*;

const SUBSCRIPTIONS: usize = 10;
const WRITERS: usize = 16;
const DRAIN: Duration = Duration::from_secs(600);

/// What one receiver heard: each delivery's `seq` and its lag.
type Heard = Arc<Mutex<Vec<(i64, Duration)>>>;

/// A plain HTTP/1.1 receiver on a free loopback port, a thread per connection: answers 200 with an empty
/// body to every request, and notes each event's `seq` and the time since its `created_at`.
fn receiver() -> (String, Heard) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    let heard: Heard = Arc::default();
    let h = heard.clone();
    std::thread::spawn(move || {
        for sock in listener.incoming().flatten() {
            let h = h.clone();
            std::thread::spawn(move || connection(sock, &h));
        }
    });
    (url, heard)
}

fn connection(mut sock: std::net::TcpStream, heard: &Heard) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    loop {
        let head_end = loop {
            if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            match sock.read(&mut chunk) {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        };
        let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
        let len: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        while buf.len() < head_end + len {
            match sock.read(&mut chunk) {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
        let arrived = chrono::Utc::now();
        let event: Value = serde_json::from_slice(&buf[head_end..head_end + len]).unwrap_or(Value::Null);
        buf.drain(..head_end + len);
        if let (Some(seq), Some(created)) = (
            event["seq"].as_i64(),
            event["created_at"]
                .as_str()
                .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok()),
        ) {
            let lag = (arrived - created.with_timezone(&chrono::Utc))
                .to_std()
                .unwrap_or_default();
            heard.lock().unwrap().push((seq, lag));
        }
        if sock.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n").is_err() {
            return;
        }
    }
}

/// `WRITERS` clients, each PATCHing its own task as fast as it is answered, for `window`: the PATCHes
/// answered 200, and the rate.
async fn patch_window(b: &Bench, tasks: &[Uuid], window: Duration) -> (u64, f64) {
    let start = Instant::now();
    let writers: Vec<_> = tasks
        .iter()
        .enumerate()
        .map(|(w, task)| {
            let (http, url, token) = (
                b.http.clone(),
                format!("{}/api/v1/tasks/{task}", b.server.url),
                b.token.clone(),
            );
            tokio::spawn(async move {
                let mut done = 0u64;
                while start.elapsed() < window {
                    let r = http
                        .patch(&url)
                        .bearer_auth(&token)
                        .json(&json!({"description": format!("writer {w}, update {done}")}))
                        .send()
                        .await
                        .unwrap();
                    assert_eq!(r.status().as_u16(), 200);
                    done += 1;
                }
                done
            })
        })
        .collect();
    let mut total = 0;
    for w in writers {
        total += w.await.unwrap();
    }
    (total, total as f64 / start.elapsed().as_secs_f64())
}

/// The floor: the same PATCH load while this process posts `per_second` requests in all to the
/// receivers (a real event's body, no berth in between): what the HTTP of the deliveries costs this
/// machine by itself, receivers included.
async fn bare_window(b: &Bench, tasks: &[Uuid], window: Duration, urls: &[String], per_second: f64) -> f64 {
    let event = b.get("/api/v1/events?limit=1").await["events"][0].clone();
    let body = serde_json::to_vec(&event).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let every = Duration::from_secs_f64(urls.len() as f64 / per_second.max(1.0));
    let senders: Vec<_> = urls
        .iter()
        .map(|url| {
            let (http, url, body, stop) = (reqwest::Client::new(), url.clone(), body.clone(), stop.clone());
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(every);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    tick.tick().await;
                    let r = http
                        .post(&url)
                        .header("content-type", "application/json")
                        .header("webhook-id", format!("msg_bare_{n}"))
                        .body(body.clone())
                        .send()
                        .await
                        .unwrap();
                    assert!(r.status().is_success());
                    n += 1;
                }
            })
        })
        .collect();
    let (_, rate) = patch_window(b, tasks, window).await;
    stop.store(true, Ordering::Relaxed);
    for s in senders {
        s.await.unwrap();
    }
    rate
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

pub(crate) async fn webhooks(b: &Bench, table: &mut Table) {
    let window = Duration::from_secs(secs().max(2));
    let rounds = env_usize("BERTH_BENCH_READ_ROUNDS", 3).max(1);
    let mut tasks = Vec::new();
    for i in 0..WRITERS {
        let t = b
            .post(
                &format!("/api/v1/workspaces/{}/tasks", b.workspace),
                json!({"title": format!("webhook load {i}"), "repositories": [{"repository_id": b.repository}]}),
                201,
            )
            .await;
        tasks.push(id_of(&t));
    }
    let receivers: Vec<_> = (0..SUBSCRIPTIONS).map(|_| receiver()).collect();
    let urls: Vec<String> = receivers.iter().map(|(u, _)| u.clone()).collect();
    let (mut none, mut with, mut bare, mut lags) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut faults = Vec::new();
    for round in 0..rounds {
        none.push(patch_window(b, &tasks, window).await.1);

        let mut subscriptions = Vec::new();
        for (url, heard) in &receivers {
            heard.lock().unwrap().clear();
            let w = b
                .post("/api/v1/webhooks", json!({"url": url, "types": ["task.updated"]}), 201)
                .await;
            subscriptions.push(id_of(&w));
        }
        let from = b.get("/api/v1/events?limit=1").await["latest_seq"].as_i64().unwrap();
        let (sent, rate) = patch_window(b, &tasks, window).await;
        with.push(rate);
        let delivered_per_second = (sent * SUBSCRIPTIONS as u64) as f64 / window.as_secs_f64();
        // Every receiver gets every PATCH's event of the window: wait for them, then check once and in order.
        let deadline = Instant::now() + DRAIN;
        for (i, (_, heard)) in receivers.iter().enumerate() {
            loop {
                let n = heard.lock().unwrap().iter().filter(|(seq, _)| *seq > from).count() as u64;
                if n >= sent {
                    break;
                }
                if Instant::now() > deadline {
                    faults.push(format!("round {round}: receiver {i} got {n} of {sent}"));
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            let heard = heard.lock().unwrap();
            let seqs: Vec<i64> = heard.iter().map(|(s, _)| *s).filter(|s| *s > from).collect();
            if !seqs.windows(2).all(|w| w[0] < w[1]) {
                faults.push(format!("round {round}: receiver {i} got events out of order or twice"));
            }
            lags.extend(heard.iter().filter(|(s, _)| *s > from).map(|(_, lag)| *lag));
        }
        for id in subscriptions {
            let r = b
                .http
                .delete(format!("{}/api/v1/webhooks/{id}", b.server.url))
                .bearer_auth(&b.token)
                .send()
                .await
                .unwrap();
            assert_eq!(r.status().as_u16(), 204, "DELETE /webhooks/{id}");
        }
        bare.push(bare_window(b, &tasks, window, &urls, delivered_per_second).await);
        for (_, heard) in &receivers {
            heard.lock().unwrap().clear();
        }
    }
    let (none, with, bare) = (
        *median_by(&mut none, |r| *r),
        *median_by(&mut with, |r| *r),
        *median_by(&mut bare, |r| *r),
    );
    let ratio = with / none;
    table.add(
        b.backend,
        "the floor: PATCH throughput while this process posts as many requests to the receivers (bare HTTP)",
        format!("{bare:.0} req/s"),
        format!("{none:.0} req/s with none"),
        format!("{:.2}x", bare / none),
        "reported",
        None,
    );
    table.add(
        b.backend,
        "PATCH task throughput, 16 clients, with 10 webhook subscriptions delivering every task.updated",
        format!("{with:.0} req/s"),
        format!("{none:.0} req/s with none"),
        format!("{ratio:.2}x"),
        ">= 0.90x (within 10%)",
        Some(ratio >= 0.90),
    );
    lags.sort();
    let (p50, p99) = (percentile(&lags, 0.50), percentile(&lags, 0.99));
    table.add(
        b.backend,
        "webhook delivery lag (event created to received), 10 subscriptions under that load",
        format!("p50 {} / p99 {}", fmt_d(p50), fmt_d(p99)),
        "-".into(),
        format!("{} deliveries in {rounds} rounds", lags.len()),
        "every event once, in order, to every receiver",
        Some(faults.is_empty()),
    );
    for f in faults {
        eprintln!("webhooks: {f}");
    }
}
