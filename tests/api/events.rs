//! One global event sequence (I32): replay pages, and a stream that replays then goes live with no gap
//! and no duplicate, across reconnects, under concurrent writers, on both databases.
use std::collections::BTreeSet;
use std::time::Duration;

use reqwest::Method;
use serde_json::{Value, json};
use uuid::Uuid;

use crate::both_backends;
use crate::helpers::{Backend, Sse, TestApp, id_of, seen, seen_json, wait_until, wait_until_every};

both_backends!(
    replay_pages_in_seq_order_and_validates_cursors,
    stream_replays_then_goes_live_with_no_gap_across_reconnects,
    a_late_committing_writer_is_never_skipped,
    truncation_after_retention_and_instance_mismatch,
    tokens_see_only_their_workspaces_and_sessions,
    another_instance_on_the_same_database_delivers_live,
    a_slow_subscriber_catches_up_never_skipped,
    a_slow_subscriber_whose_events_were_trimmed_is_reset,
    keep_alive_comments_flow,
    an_answered_write_is_already_in_the_log,
);

const WAIT: Duration = Duration::from_secs(20);

async fn replay(app: &TestApp, token: &str, query: &str) -> Value {
    app.call(Method::GET, &format!("/api/v1/events{query}"), Some(token), None)
        .await
        .ok(200)
}

fn seqs(page: &Value) -> Vec<i64> {
    page["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["seq"].as_i64().unwrap())
        .collect()
}

async fn replay_pages_in_seq_order_and_validates_cursors(app: TestApp) {
    let ws = app.workspace("ws").await;
    for i in 0..12 {
        app.post(
            &format!("/api/v1/workspaces/{ws}/tasks"),
            json!({"title": format!("t{i}")}),
        )
        .await
        .ok(201);
    }
    let mut all = Vec::new();
    let mut after = 0;
    loop {
        let page = replay(&app, &app.admin, &format!("?after={after}&limit=5")).await;
        assert_eq!(page["truncated"], false);
        assert_eq!(page["first_available_seq"], 1);
        assert_eq!(page["latest_seq"], 13);
        assert_eq!(
            page["instance_id"].as_str().unwrap(),
            app.app_state.ctx.instance_id.to_string()
        );
        let s = seqs(&page);
        if s.is_empty() {
            break;
        }
        after = *s.last().unwrap();
        all.extend(s);
    }
    assert_eq!(all, (1..=13).collect::<Vec<_>>(), "every event once, in order");
    let first = replay(&app, &app.admin, "?after=0&limit=1").await;
    let e = &first["events"][0];
    assert_eq!(e["version"], "v1");
    assert_eq!(e["type"], "workspace.created");
    assert_eq!(e["workspace_id"], ws.to_string());
    for bad in ["?after=-1", "?after=abc", "?after=1.5"] {
        app.get(&format!("/api/v1/events{bad}"))
            .await
            .problem(400, "invalid_cursor");
    }
    app.get("/api/v1/events?limit=0")
        .await
        .problem(400, "validation_failed");
    app.get("/api/v1/events?limit=1001")
        .await
        .problem(400, "validation_failed");
    app.get("/api/v1/events?instance_id=nope")
        .await
        .problem(400, "validation_failed");
    let reader = app.token("tasks:read");
    app.call(Method::GET, "/api/v1/events", Some(&reader), None)
        .await
        .problem(403, "insufficient_scope");
}

/// A writer creates tasks while a client streams, disconnects twice and reconnects with Last-Event-ID:
/// the union of what it received is exactly the committed set, each once, in order.
async fn stream_replays_then_goes_live_with_no_gap_across_reconnects(app: TestApp) {
    let ws = app.workspace("ws").await;
    let url = format!("/api/v1/workspaces/{ws}/tasks");
    for i in 0..5 {
        app.post(&url, json!({"title": format!("before{i}")})).await.ok(201);
    }
    let writer = {
        let (client, base, admin, url) = (app.client.clone(), app.base.clone(), app.admin.clone(), url.clone());
        tokio::spawn(async move {
            for i in 0..60 {
                let r = client
                    .post(format!("{base}{url}"))
                    .bearer_auth(&admin)
                    .json(&json!({"title": format!("w{i}")}))
                    .send()
                    .await
                    .unwrap();
                assert_eq!(r.status(), 201);
            }
        })
    };
    let mut received: Vec<i64> = Vec::new();
    let mut last = 0;
    // Two rounds that leave mid-stream while the writer runs, then one that stays to the end.
    for round in 0..2 {
        let mut sse = Sse::open(&app, &app.admin, "", if round == 0 { None } else { Some(last) }).await;
        let mut taken = 0;
        while taken < 10 {
            let frame = sse.next(WAIT).await.expect("the stream stays open");
            if frame.event == "message" {
                let seq = frame.id.unwrap();
                let e: Value = serde_json::from_str(&frame.data).unwrap();
                assert_eq!(e["seq"].as_i64(), Some(seq));
                received.push(seq);
                last = seq;
                taken += 1;
            } else {
                assert_eq!(frame.event, "ready");
            }
        }
    }
    writer.await.unwrap();
    let newest = app.events().await.last().unwrap().0;
    let mut sse = Sse::open(&app, &app.admin, "", Some(last)).await;
    while last < newest {
        let frame = sse.next(WAIT).await.expect("the stream stays open");
        if frame.event == "message" {
            last = frame.id.unwrap();
            received.push(last);
        }
    }
    let committed: Vec<i64> = app.events().await.into_iter().map(|e| e.0).collect();
    assert_eq!(received, committed, "no gap, no duplicate, in order");
}

/// I32 with a late committer. SQLite: a transaction holding the writer lock makes the next writer wait,
/// so seq order is commit order. PostgreSQL: the next writer does not wait for it at all (no shared
/// row); its event is stamped and delivered first, and the held one, stamped when it commits, comes
/// next with the next seq: the stream never skips an event that commits late.
async fn a_late_committing_writer_is_never_skipped(app: TestApp) {
    let ws = app.workspace("ws").await;
    let mut sse = Sse::open(
        &app,
        &app.admin,
        &format!("?after={}", app.events().await.last().unwrap().0),
        None,
    )
    .await;
    assert_eq!(sse.next(WAIT).await.unwrap().event, "ready");
    let ctx = app.app_state.ctx.clone();
    let txn = ctx.db.begin_write().await.unwrap();
    berth::events::append(
        &txn,
        ctx.instance_id,
        berth::events::EventType::WorkspaceCreated,
        berth::events::Subject::workspace(ws.into()),
        json!({"held": true}),
    )
    .await
    .unwrap();
    let other = {
        let (client, base, admin) = (app.client.clone(), app.base.clone(), app.admin.clone());
        tokio::spawn(async move {
            client
                .post(format!("{base}/api/v1/workspaces/{ws}/tasks"))
                .bearer_auth(&admin)
                .json(&json!({"title": "late"}))
                .send()
                .await
                .unwrap()
                .status()
        })
    };
    let (first, second) = if app.backend == Backend::Postgres {
        // Answered while the other transaction is still open: writers no longer queue behind it.
        assert_eq!(tokio::time::timeout(WAIT, other).await.unwrap().unwrap(), 201);
        let task = sse.next(WAIT).await.unwrap();
        ctx.commit(txn).await.unwrap();
        (task, sse.next(WAIT).await.unwrap())
    } else {
        ctx.commit(txn).await.unwrap();
        assert_eq!(other.await.unwrap(), 201);
        let held = sse.next(WAIT).await.unwrap();
        (held, sse.next(WAIT).await.unwrap())
    };
    let (task, held) = if app.backend == Backend::Postgres {
        (&first, &second)
    } else {
        (&second, &first)
    };
    assert!(task.data.contains("task.created"), "{task:?}");
    assert!(held.data.contains("\"held\":true"), "{held:?}");
    let (a, b) = (first.id.unwrap(), second.id.unwrap());
    assert_eq!(b, a + 1, "contiguous: nothing skipped, nothing between");
}

async fn truncation_after_retention_and_instance_mismatch(app: TestApp) {
    let Some(app) = app
        .respawn_with(&[("BERTH_EVENT_RETENTION_COUNT", "5"), ("BERTH_SWEEP_INTERVAL_MS", "50")])
        .await
    else {
        return;
    };
    let ws = app.workspace("ws").await;
    for i in 0..10 {
        app.post(
            &format!("/api/v1/workspaces/{ws}/tasks"),
            json!({"title": format!("t{i}")}),
        )
        .await
        .ok(201);
    }
    // Wait (with a deadline) for the sweep to trim to the newest five.
    let page = wait_until_every("retention to trim", WAIT, Duration::from_millis(20), || async {
        let page = replay(&app, &app.admin, "?after=0").await;
        // The bounds are read after the page, so a page can predate the trim its bounds report.
        seen_json(
            page["first_available_seq"] == 7 && seqs(&page) == vec![7, 8, 9, 10, 11],
            page,
        )
    })
    .await;
    assert_eq!(page["latest_seq"], 11);
    assert_eq!(page["truncated"], true, "events after the cursor were trimmed");
    assert_eq!(seqs(&page), vec![7, 8, 9, 10, 11]);
    assert_eq!(replay(&app, &app.admin, "?after=6").await["truncated"], false);
    assert_eq!(replay(&app, &app.admin, "?after=5").await["truncated"], true);
    // Another instance id: reload.
    let here = app.app_state.ctx.instance_id;
    assert_eq!(
        replay(&app, &app.admin, &format!("?after=10&instance_id={}", Uuid::now_v7())).await["truncated"],
        true
    );
    assert_eq!(
        replay(&app, &app.admin, &format!("?after=10&instance_id={here}")).await["truncated"],
        false
    );
    // The stream says so first, and ends.
    for query in [
        "?after=2".to_string(),
        format!("?after=10&instance_id={}", Uuid::now_v7()),
    ] {
        let mut sse = Sse::open(&app, &app.admin, &query, None).await;
        let first = sse.next(WAIT).await.unwrap();
        assert_eq!(first.event, "reset", "{query}");
        assert!(sse.next(WAIT).await.is_none(), "the stream ends after reset");
    }
    let mut ok = Sse::open(&app, &app.admin, &format!("?after=10&instance_id={here}"), None).await;
    assert_eq!(ok.next(WAIT).await.unwrap().id, Some(11));
}

async fn tokens_see_only_their_workspaces_and_sessions(app: TestApp) {
    let mine = app.workspace("mine").await;
    let theirs = app.workspace("theirs").await;
    let (repo, _) = app.repository(mine, "svc").await;
    let task = app.task(mine, "t", &[repo]).await;
    let s1 = id_of(&app.session(task, "worktree").await);
    let s2 = id_of(&app.session(task, "worktree").await);
    app.post(
        &format!("/api/v1/workspaces/{theirs}/tasks"),
        json!({"title": "secret"}),
    )
    .await
    .ok(201);

    let limited = app.token_for("events:read", Some(vec![mine]), None);
    let page = replay(&app, &limited, "?after=0&limit=1000").await;
    let events = page["events"].as_array().unwrap();
    assert!(!events.is_empty());
    assert!(events.iter().all(|e| e["workspace_id"] == mine.to_string()), "{page}");

    let agent = app.token_for("events:read", None, Some(s1));
    let page = replay(&app, &agent, "?after=0&limit=1000").await;
    let events = page["events"].as_array().unwrap();
    assert!(
        events.iter().any(|e| e["session_id"] == s1.to_string()),
        "its own session's events: {page}"
    );
    for e in events {
        let own = e["session_id"] == s1.to_string();
        let env_wide = e["type"].as_str().unwrap().starts_with("environment.")
            || e["type"].as_str().unwrap().starts_with("git_status.");
        assert!(
            own || (env_wide && e["session_id"] != s2.to_string()),
            "not the sibling's: {e}"
        );
    }
    // Live, too: the agent's stream carries its session's event and not the sibling's.
    let mut sse = Sse::open(
        &app,
        &agent,
        &format!("?after={}", app.events().await.last().unwrap().0),
        None,
    )
    .await;
    assert_eq!(sse.next(WAIT).await.unwrap().event, "ready");
    app.post(&format!("/api/v1/sessions/{s2}/primary"), json!({}))
        .await
        .ok(200);
    app.post(&format!("/api/v1/sessions/{s1}/primary"), json!({}))
        .await
        .ok(200);
    let got = sse.next(WAIT).await.unwrap();
    let e: Value = serde_json::from_str(&got.data).unwrap();
    assert_eq!(e["type"], "session.primary_changed");
    assert_eq!(e["session_id"], s1.to_string(), "the sibling's event was filtered out");
}

/// Two berth instances on one database: a change through one reaches streams open on the other. On
/// PostgreSQL the second instance polls only every minute, so only NOTIFY can deliver in time.
async fn another_instance_on_the_same_database_delivers_live(app: TestApp) {
    let mut config = app.config.clone();
    if app.backend == Backend::Postgres {
        config.event_poll = Duration::from_secs(60);
    } else {
        config.event_poll = Duration::from_millis(100);
    }
    let other = berth::startup::Application::build(config).await.unwrap();
    let other_base = format!("http://127.0.0.1:{}", other.port());
    let background = other.background();
    let handle = other.handle();
    tokio::spawn(other.run_until_stopped());
    let resp = app
        .client
        .get(format!("{other_base}/api/v1/events/stream"))
        .bearer_auth(&app.admin)
        .send()
        .await
        .unwrap();
    let mut sse = crate::helpers::Sse::from_response(resp);
    assert_eq!(sse.next(WAIT).await.unwrap().event, "ready");
    let ws = app.workspace("via-first").await;
    let frame = sse.next(WAIT).await.unwrap();
    let e: Value = serde_json::from_str(&frame.data).unwrap();
    assert_eq!(e["type"], "workspace.created");
    assert_eq!(e["workspace_id"], ws.to_string());
    assert_eq!(
        e["instance_id"],
        app.app_state.ctx.instance_id.to_string(),
        "written by the first instance"
    );
    for b in background {
        b.abort();
    }
    handle.stop(false).await;
}

/// A subscriber that stops reading falls behind the broadcast and then catches up from the database:
/// nothing skipped, nothing twice, no reset.
async fn a_slow_subscriber_catches_up_never_skipped(app: TestApp) {
    use tokio::io::AsyncReadExt;
    let Some(app) = app.respawn_with(&[("BERTH_EVENT_BUFFER", "4")]).await else {
        return;
    };
    let ws = app.workspace("ws").await;
    let start = app.events().await.last().unwrap().0;
    let (mut stream, mut raw) = stalled_subscriber(&app, start).await;
    let mut buf = [0u8; 4096];
    // Stop reading; write far more than the buffers hold.
    flood(&app, ws).await;
    // Now read everything: the subscriber fell behind the broadcast (4 slots) and catches up from the
    // database: every event, in order, once, and no reset.
    // Only complete lines count: a read may end mid-line.
    let ids = |raw: &[u8]| -> Vec<i64> {
        let text = String::from_utf8_lossy(raw);
        let complete = &text[..text.rfind('\n').map_or(0, |i| i + 1)];
        complete
            .lines()
            .filter_map(|l| l.strip_prefix("id: "))
            .map(|v| v.trim().parse().unwrap())
            .collect()
    };
    while ids(&raw).last().copied().unwrap_or(start) < start + 4000 {
        let n = tokio::time::timeout(WAIT, stream.read(&mut buf))
            .await
            .expect("the stream keeps delivering")
            .unwrap();
        assert!(n > 0, "the stream ended: {}", String::from_utf8_lossy(&raw));
        raw.extend_from_slice(&buf[..n]);
    }
    let text = String::from_utf8_lossy(&raw);
    assert!(!text.contains("event: reset"), "no reset while the events are retained");
    let got = ids(&raw);
    let expected: Vec<i64> = (start + 1..=start + 4000).collect();
    assert_eq!(got, expected, "every event, in order, once");
    let set: BTreeSet<i64> = got.iter().copied().collect();
    assert_eq!(set.len(), got.len());
}

/// A stalled subscriber whose missed events were trimmed meanwhile is told to reset: what it got before
/// is a gap-free prefix, and nothing after the gap is passed off as continuous.
async fn a_slow_subscriber_whose_events_were_trimmed_is_reset(app: TestApp) {
    use tokio::io::AsyncReadExt;
    let Some(app) = app
        .respawn_with(&[
            ("BERTH_EVENT_BUFFER", "4"),
            ("BERTH_EVENT_RETENTION_COUNT", "50"),
            ("BERTH_SWEEP_INTERVAL_MS", "100"),
        ])
        .await
    else {
        return;
    };
    let ws = app.workspace("ws").await;
    let start = app.events().await.last().unwrap().0;
    let (mut stream, mut raw) = stalled_subscriber(&app, start).await;
    let mut buf = [0u8; 4096];
    flood(&app, ws).await;
    // Wait until retention trimmed what the stalled subscriber has not read.
    wait_until("retention to trim", WAIT, || async {
        let n = app.count("events").await;
        seen(n <= 60, n)
    })
    .await;
    loop {
        let n = tokio::time::timeout(WAIT, stream.read(&mut buf))
            .await
            .expect("the stream should end after reset")
            .unwrap();
        if n == 0 {
            break;
        }
        raw.extend_from_slice(&buf[..n]);
        if String::from_utf8_lossy(&raw).contains("event: reset")
            && String::from_utf8_lossy(&raw).ends_with("\r\n0\r\n\r\n")
        {
            break;
        }
    }
    let text = String::from_utf8_lossy(&raw);
    assert!(text.contains("event: reset"), "the subscriber was told to reset");
    let ids: Vec<i64> = text
        .lines()
        .filter_map(|l| l.strip_prefix("id: "))
        .map(|v| v.trim().parse().unwrap())
        .collect();
    let expected: Vec<i64> = (start + 1..=start + ids.len() as i64).collect();
    assert_eq!(ids, expected, "a gap-free prefix before the reset");
    assert!(ids.len() < 4000, "it did miss events");
}

/// A raw-TCP subscriber with a tiny receive buffer, read up to `ready` and then left unread.
async fn stalled_subscriber(app: &TestApp, start: i64) -> (tokio::net::TcpStream, Vec<u8>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(1024).unwrap();
    let addr: std::net::SocketAddr = app.base.trim_start_matches("http://").parse().unwrap();
    let mut stream = socket.connect(addr).await.unwrap();
    let request = format!(
        "GET /api/v1/events/stream?after={start} HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {}\r\nAccept: text/event-stream\r\n\r\n",
        app.admin
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&raw).contains("event: ready") {
        let n = tokio::time::timeout(WAIT, stream.read(&mut buf))
            .await
            .unwrap()
            .unwrap();
        assert!(n > 0);
        raw.extend_from_slice(&buf[..n]);
    }
    (stream, raw)
}

/// 4,000 events in 40 transactions: far more than a stalled subscriber's buffers hold.
async fn flood(app: &TestApp, ws: Uuid) {
    let ctx = app.app_state.ctx.clone();
    for _ in 0..40 {
        let txn = ctx.db.begin_write().await.unwrap();
        for _ in 0..100 {
            berth::events::append(
                &txn,
                ctx.instance_id,
                berth::events::EventType::WorkspaceCreated,
                berth::events::Subject::workspace(ws.into()),
                json!({"pad": "x".repeat(200)}),
            )
            .await
            .unwrap();
        }
        ctx.commit(txn).await.unwrap();
    }
}

async fn keep_alive_comments_flow(app: TestApp) {
    let Some(app) = app.respawn_with(&[("BERTH_SSE_KEEPALIVE_SECS", "1")]).await else {
        return;
    };
    let mut sse = Sse::open(&app, &app.admin, "", None).await;
    assert_eq!(sse.next(WAIT).await.unwrap().event, "ready");
    sse.return_comments = true;
    let frame = sse.next(WAIT).await.unwrap();
    assert_eq!(frame.event, "comment");
    assert_eq!(frame.data, "keep-alive");
}

/// I32 with the PostgreSQL sequencer: an event is stamped after its transaction commits, by whichever
/// replica leads; a request's commit waits for that, so the log already holds what a client was just
/// answered for (read-your-writes). On SQLite the seq is assigned in the transaction.
async fn an_answered_write_is_already_in_the_log(app: TestApp) {
    let ws = app.workspace("ws").await;
    let task = app.task(ws, "t", &[]).await;
    let mut after = app.events().await.last().unwrap().0;
    for i in 0..20 {
        let title = format!("title {i}");
        app.patch(&format!("/api/v1/tasks/{task}"), json!({ "title": title }))
            .await
            .ok(200);
        let page = replay(&app, &app.admin, &format!("?after={after}")).await;
        let events = page["events"].as_array().unwrap();
        assert!(
            events
                .iter()
                .any(|e| e["type"] == "task.updated" && e.to_string().contains(&title)),
            "write {i} answered before its event was in the log: {page}"
        );
        after = events.last().unwrap()["seq"].as_i64().unwrap();
    }
    // PostgreSQL: the first session of a task. Its environment is made in a task of its own, whose
    // commits the answer waits for too: when the answer arrives, this replica has already published the
    // session's `session.created`, the request's newest event (no replay's settle involved). On SQLite
    // the event is numbered in its transaction and nothing waits.
    let ctx = app.app_state.ctx.clone();
    let (repo, _) = app.repository(ws, "r").await;
    for i in 0..if app.backend == Backend::Postgres { 3 } else { 0 } {
        let task = app.task(ws, &format!("first {i}"), &[repo]).await;
        let session = id_of(&app.session(task, "worktree").await);
        let published = ctx.events.published();
        let page = replay(&app, &app.admin, &format!("?after={after}")).await;
        let events = page["events"].as_array().unwrap();
        let created = events
            .iter()
            .find(|e| e["type"] == "session.created" && e["session_id"] == json!(session))
            .unwrap_or_else(|| panic!("no session.created for {session}: {page}"));
        assert!(
            created["seq"].as_i64().unwrap() <= published,
            "first session {i} answered before its session.created (seq {}) was published here ({published})",
            created["seq"]
        );
        after = events.last().unwrap()["seq"].as_i64().unwrap();
    }
    // A write no request waits for (a worker's, a restore's): the next replay still holds it, as the
    // state a reader saw before it would (`sequencer::settle`).
    for i in 0..20 {
        let txn = ctx.db.begin_write().await.unwrap();
        berth::events::append(
            &txn,
            ctx.instance_id,
            berth::events::EventType::WorkspaceCreated,
            berth::events::Subject::workspace(ws.into()),
            json!({ "background": i }),
        )
        .await
        .unwrap();
        ctx.commit(txn).await.unwrap();
        let page = replay(&app, &app.admin, &format!("?after={after}")).await;
        let events = page["events"].as_array().unwrap();
        assert!(
            events.iter().any(|e| e["data"]["background"] == i),
            "background write {i} missing from the next replay: {page}"
        );
        after = events.last().unwrap()["seq"].as_i64().unwrap();
    }
    let metrics = app.call(Method::GET, "/metrics", None, None).await.text;
    let leading = metrics.lines().any(|l| l == "berth_event_sequencer_leader 1");
    assert_eq!(
        leading,
        app.backend == Backend::Postgres,
        "only PostgreSQL has a sequencer to lead"
    );
}
