//! Event sequencing on PostgreSQL stays correct with three replicas, eight concurrent writers and
//! subscribers on every replica reconnecting at random, while the replica that leads sequencing is
//! killed (I32: every committed event reaches every subscriber exactly once, in `seq` order, with no
//! gap).
//!
//! Three `berth serve` processes share one database. Five writers go through HTTP to a random live
//! replica (task creates and PATCHes); three write events straight into the table the way
//! `events::append` does (unstamped, in their own transactions), holding some open for up to a second
//! on purpose and rolling one in four back: the late and the aborted writers a service meets. Halfway,
//! the sequencing leader is SIGKILLed; another replica must take over. Afterwards the table is the truth:
//! its stamped seqs are contiguous, every committed marker is there once and no rolled-back one is, and
//! each subscriber's received seqs are exactly the table's, in order.
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sea_orm::{ConnectionTrait, Database, DatabaseConnection, Statement, TransactionTrait};
use serde_json::{Value, json};
use tokio::sync::watch;
use uuid::Uuid;

use crate::faults::{Berth, process_env, start, wait_ready};
use crate::helpers::{self, Backend, TestApp, client, scalar, uuid};

const WAIT: Duration = Duration::from_secs(60);
const HTTP_WRITERS: u64 = 5;
const SQL_WRITERS: u64 = 3;
const ROUNDS: u64 = 30;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_replicas_deliver_every_committed_event_once_in_order_through_a_leader_kill() {
    let Some(app) = TestApp::spawn(Backend::Postgres).await else {
        return;
    };
    // The in-process server would campaign too: this test's sequencers are the three processes.
    app.stop_background();
    let http = client();
    let mut replicas: Vec<Berth> = Vec::new();
    for n in 0..3 {
        let data = app.scratch.path().join(format!("replica-{n}"));
        let log = app.scratch.path().join(format!("replica-{n}.log"));
        let mut b = start(&process_env(&app, &data), None, &log);
        wait_ready(&http, &mut b).await;
        replicas.push(b);
    }
    let bases: Vec<String> = replicas.iter().map(|b| b.base.clone()).collect();
    let live = Arc::new(Mutex::new(bases.clone()));
    let token = app.admin.clone();
    let leader = wait_leader(&http, &bases, &[]).await;

    let ws = post(&http, &bases[0], &token, "/api/v1/workspaces", json!({"name": "seq"})).await;
    let ws = uuid(&ws["id"]);
    let db = Database::connect(app.env["BERTH_DATABASE_URL"].as_str()).await.unwrap();
    let start_seq = latest_stamped(&db).await;

    // Subscribers: two per replica, each reconnecting at random (to any live replica) from its cursor.
    let (done_tx, done_rx) = watch::channel(None::<i64>);
    let mut subscribers = Vec::new();
    for n in 0..6u64 {
        subscribers.push(tokio::spawn(subscribe(
            http.clone(),
            live.clone(),
            token.clone(),
            start_seq,
            n as usize % 3,
            done_rx.clone(),
            0x5e0_0000 + n,
        )));
    }

    // Writers.
    let mut writers = Vec::new();
    for w in 0..HTTP_WRITERS {
        writers.push(tokio::spawn(http_writer(
            http.clone(),
            live.clone(),
            token.clone(),
            ws,
            w,
        )));
    }
    let markers: Arc<Mutex<BTreeMap<String, bool>>> = Arc::default();
    for w in 0..SQL_WRITERS {
        let url = app.env["BERTH_DATABASE_URL"].clone();
        writers.push(tokio::spawn(sql_writer(url, ws, w, markers.clone())));
    }

    // Halfway through, the leader dies; another replica must take over.
    wait_until("the writers are halfway", || async {
        latest_stamped(&db).await > start_seq + 60
    })
    .await;
    live.lock().unwrap().retain(|b| *b != bases[leader]);
    let killed = &mut replicas[leader];
    // SAFETY: a signal to our own child process.
    unsafe {
        libc::kill(killed.child.id() as i32, libc::SIGKILL);
    }
    let _ = killed.child.wait();
    let killed_at = std::time::Instant::now();
    let survivors: Vec<usize> = (0..3).filter(|n| *n != leader).collect();
    let successor = wait_leader(&http, &bases, &survivors).await;
    assert_ne!(successor, leader);
    eprintln!(
        "replica {leader} led and was killed; replica {successor} took over in {:?}",
        killed_at.elapsed()
    );

    for w in writers {
        w.await.unwrap();
    }
    // Everything committed gets stamped.
    wait_until("every committed event is stamped", || async {
        scalar(&db, "SELECT count(*) AS n FROM events WHERE seq IS NULL").await == 0
    })
    .await;
    let truth = stamped_after(&db, start_seq).await;
    let latest = *truth.keys().last().expect("the workload wrote events");
    let seqs: Vec<i64> = truth.keys().copied().collect();
    assert_eq!(
        seqs,
        ((start_seq + 1)..=latest).collect::<Vec<_>>(),
        "stamped seqs are contiguous"
    );
    // The SQL writers' markers: committed ones once, rolled-back ones never.
    let mut found: BTreeMap<String, usize> = BTreeMap::new();
    for data in truth.values() {
        if let Some(m) = data["marker"].as_str() {
            *found.entry(m.to_string()).or_default() += 1;
        }
    }
    let markers = markers.lock().unwrap().clone();
    let committed = markers.values().filter(|c| **c).count();
    assert!(
        committed > 0 && committed < markers.len(),
        "some commit, some roll back: {markers:?}"
    );
    for (marker, was_committed) in &markers {
        let expected = usize::from(*was_committed);
        assert_eq!(found.get(marker).copied().unwrap_or(0), expected, "marker {marker}");
    }

    eprintln!(
        "{} events stamped; SQL markers: {committed} committed, {} rolled back",
        seqs.len(),
        markers.len() - committed
    );
    done_tx.send(Some(latest)).unwrap();
    for (n, s) in subscribers.into_iter().enumerate() {
        let (received, reconnects) = s.await.unwrap();
        eprintln!("subscriber {n}: {} events over {reconnects} streams", received.len());
        assert!(reconnects > 1, "subscriber {n} reconnected");
        assert_eq!(
            received, seqs,
            "subscriber {n}: every committed event once, in seq order, no gap"
        );
    }
    drop(replicas);
}

/// The index of the replica (among `among`, or all when empty) whose `/metrics` says it leads.
async fn wait_leader(http: &reqwest::Client, bases: &[String], among: &[usize]) -> usize {
    helpers::wait_until("a replica to take sequencing leadership", WAIT, || async {
        for (n, base) in bases.iter().enumerate() {
            if !among.is_empty() && !among.contains(&n) {
                continue;
            }
            let Ok(r) = http.get(format!("{base}/metrics")).send().await else {
                continue;
            };
            let text = r.text().await.unwrap_or_default();
            if text.lines().any(|l| l == "berth_event_sequencer_leader 1") {
                return Ok(n);
            }
        }
        Err("no leader".to_string())
    })
    .await
}

/// [`helpers::wait_until`] for a yes/no `check`, with this file's deadline.
async fn wait_until<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    helpers::wait_until(what, WAIT, || {
        let done = check();
        async move { helpers::seen(done.await, false) }
    })
    .await;
}

async fn post(http: &reqwest::Client, base: &str, token: &str, path: &str, body: Value) -> Value {
    let r = http
        .post(format!("{base}{path}"))
        .bearer_auth(token)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{path}: {}", r.status());
    r.json().await.unwrap()
}

/// Task creates and PATCHes through a random live replica; a request cut off by the kill is retried
/// elsewhere (whether it committed is the table's to say).
async fn http_writer(http: reqwest::Client, live: Arc<Mutex<Vec<String>>>, token: String, ws: Uuid, w: u64) {
    let mut rng = Rng(0xabc0 + w);
    let mut task = None;
    for i in 0..ROUNDS {
        let base = rng.pick(&live.lock().unwrap().clone());
        let req = match task {
            Some(t) if rng.below(3) > 0 => http
                .patch(format!("{base}/api/v1/tasks/{t}"))
                .json(&json!({"title": format!("w{w} edit {i}")})),
            _ => http
                .post(format!("{base}/api/v1/workspaces/{ws}/tasks"))
                .json(&json!({"title": format!("w{w} task {i}")})),
        };
        match req.bearer_auth(&token).timeout(Duration::from_secs(30)).send().await {
            Ok(r) if r.status() == 201 => task = Some(uuid(&r.json::<Value>().await.unwrap()["id"])),
            Ok(r) => assert!(r.status().is_success(), "writer {w}: {}", r.status()),
            Err(_) => {} // the replica died under it
        }
    }
}

/// Events written as `events::append` writes them, each in its own transaction: some held open on
/// purpose (up to a second, so later writers commit first), one in four rolled back.
async fn sql_writer(url: String, ws: Uuid, w: u64, markers: Arc<Mutex<BTreeMap<String, bool>>>) {
    let db = Database::connect(url.as_str()).await.unwrap();
    let mut rng = Rng(0xdef0 + w);
    for i in 0..ROUNDS {
        let marker = format!("sql-{w}-{i}");
        let txn = db.begin().await.unwrap();
        txn.execute_raw(Statement::from_sql_and_values(
            sea_orm::DbBackend::Postgres,
            "INSERT INTO events (instance_id, type, workspace_id, data, created_at) VALUES ($1, 'task.updated', $2, $3, now())",
            [Uuid::now_v7().into(), ws.into(), json!({ "marker": marker }).into()],
        ))
        .await
        .unwrap();
        let hold = match rng.below(10) {
            0 => 1000,
            1..=3 => 200,
            _ => rng.below(30),
        };
        tokio::time::sleep(Duration::from_millis(hold)).await;
        let commit = rng.below(4) > 0;
        if commit {
            txn.commit().await.unwrap();
        } else {
            txn.rollback().await.unwrap();
        }
        markers.lock().unwrap().insert(marker, commit);
    }
}

/// Reads the stream in short sessions, each on a random live replica (the first on `home`), resuming
/// from the last seq received, until it has `done`. Returns the seqs in the order received and how many
/// streams it opened. A `reset` would mean the replica gave up on it: a failure here.
async fn subscribe(
    http: reqwest::Client,
    live: Arc<Mutex<Vec<String>>>,
    token: String,
    mut cursor: i64,
    home: usize,
    done: watch::Receiver<Option<i64>>,
    seed: u64,
) -> (Vec<i64>, usize) {
    let mut rng = Rng(seed);
    let mut received = Vec::new();
    let mut opened = 0;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(240);
    loop {
        if done.borrow().is_some_and(|last| cursor >= last) {
            return (received, opened);
        }
        assert!(tokio::time::Instant::now() < deadline, "subscriber stuck at {cursor}");
        let bases = live.lock().unwrap().clone();
        let base = if opened == 0 {
            bases[home.min(bases.len() - 1)].clone()
        } else {
            rng.pick(&bases)
        };
        let url = format!("{base}/api/v1/events/stream?after={cursor}");
        let Ok(mut resp) = http.get(url).bearer_auth(&token).send().await else {
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        };
        assert_eq!(resp.status(), 200);
        opened += 1;
        let until = tokio::time::Instant::now() + Duration::from_millis(50 + rng.below(600));
        let mut buf = String::new();
        'stream: while let Ok(Ok(Some(chunk))) = tokio::time::timeout_at(until, resp.chunk()).await {
            buf.push_str(&String::from_utf8_lossy(&chunk));
            while let Some(end) = buf.find("\n\n") {
                let frame: String = buf.drain(..end + 2).collect();
                assert!(!frame.contains("event: reset"), "told to reset: {frame}");
                let Some(id) = frame.lines().find_map(|l| l.strip_prefix("id: ")) else {
                    continue;
                };
                let seq: i64 = id.parse().unwrap();
                assert!(seq > cursor, "out of order or again: {seq} after {cursor}");
                received.push(seq);
                cursor = seq;
                if done.borrow().is_some_and(|last| cursor >= last) {
                    break 'stream;
                }
            }
        }
    }
}

async fn latest_stamped(db: &DatabaseConnection) -> i64 {
    scalar(db, "SELECT last_seq AS n FROM event_sequence WHERE id = 1").await
}

async fn stamped_after(db: &DatabaseConnection, after: i64) -> BTreeMap<i64, Value> {
    let rows = db
        .query_all_raw(Statement::from_sql_and_values(
            sea_orm::DbBackend::Postgres,
            "SELECT seq, data FROM events WHERE seq > $1 ORDER BY seq",
            [after.into()],
        ))
        .await
        .unwrap();
    rows.into_iter()
        .map(|r| {
            (
                r.try_get::<i64>("", "seq").unwrap(),
                r.try_get::<Value>("", "data").unwrap(),
            )
        })
        .collect()
}

/// A small deterministic generator (the same run every time).
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % n.max(1)
    }
    fn pick(&mut self, items: &[String]) -> String {
        items[self.below(items.len() as u64) as usize].clone()
    }
}
