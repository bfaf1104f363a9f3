//! Event replay and SSE fan-out, on the load the reads left behind.
use super::*;

/// Replay of 10,000 events through `GET /events` pages, against writing them (one transaction each).
pub(crate) async fn replay(b: &Bench, table: &mut Table) {
    let latest = b.get("/api/v1/events?limit=1").await["latest_seq"].as_i64().unwrap();
    let t = Instant::now();
    for i in 0..REPLAY_EVENTS {
        let txn = b.ctx.db.begin_write().await.unwrap();
        berth::events::append(
            &txn,
            b.ctx.instance_id,
            berth::events::EventType::TaskUpdated,
            berth::events::Subject::task(b.workspace, b.task),
            json!({"id": b.task, "title": "bench", "n": i}),
        )
        .await
        .unwrap();
        b.ctx.commit(txn).await.unwrap();
    }
    // On PostgreSQL the sequencer stamps them after their commits: the write is done when
    // the last one is readable.
    while b.get("/api/v1/events?limit=1").await["latest_seq"].as_i64().unwrap() < latest + REPLAY_EVENTS as i64 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let write = t.elapsed();
    let t = Instant::now();
    let mut after = latest;
    let mut got = 0;
    while got < REPLAY_EVENTS {
        let page = b.get(&format!("/api/v1/events?after={after}&limit=1000")).await;
        let events = page["events"].as_array().unwrap();
        assert!(!events.is_empty(), "replay ended early at {got}");
        got += events.len();
        after = events.last().unwrap()["seq"].as_i64().unwrap();
    }
    let read = t.elapsed();
    let rate = got as f64 / read.as_secs_f64();
    let write_rate = REPLAY_EVENTS as f64 / write.as_secs_f64();
    table.add(
        b.backend,
        "event replay of 10,000 events (pages of 1,000 over HTTP)",
        format!("{rate:.0} events/s"),
        format!("{write_rate:.0} events/s written (one transaction each)"),
        format!("{:.1}x the write rate", rate / write_rate),
        ">= 50,000 events/s",
        Some(rate >= 50_000.0),
    );
}

/// 200 SSE subscribers, 1,000 events written through the API (PATCH task), every subscriber gets all.
pub(crate) async fn fanout(b: &Bench, table: &mut Table) {
    let latest = b.get("/api/v1/events?limit=1").await["latest_seq"].as_i64().unwrap();
    let ready = Arc::new(tokio::sync::Semaphore::new(0));
    let subscribers: Vec<_> = (0..SUBSCRIBERS)
        .map(|_| {
            let (http, url, token, ready) = (
                reqwest::Client::new(),
                format!("{}/api/v1/events/stream?after={latest}", b.server.url),
                b.token.clone(),
                ready.clone(),
            );
            let task = b.task.to_string();
            tokio::spawn(async move {
                let mut r = http.get(url).bearer_auth(token).send().await.unwrap();
                assert!(r.status().is_success());
                let (mut buf, mut got, mut resets) = (String::new(), 0usize, 0usize);
                let deadline = Instant::now() + Duration::from_secs(300);
                while got < FANOUT_EVENTS && Instant::now() < deadline {
                    let Ok(Ok(Some(chunk))) = tokio::time::timeout(Duration::from_secs(30), r.chunk()).await else {
                        break;
                    };
                    buf.push_str(&String::from_utf8_lossy(&chunk));
                    while let Some(end) = buf.find("\n\n") {
                        let frame: String = buf.drain(..end + 2).collect();
                        if frame.contains("event: ready") {
                            ready.add_permits(1);
                        } else if frame.contains("event: reset") {
                            resets += 1;
                        } else if frame.contains("\"task.updated\"") && frame.contains(&task) {
                            got += 1;
                        }
                    }
                }
                (got, resets, Instant::now())
            })
        })
        .collect();
    let all_ready = ready.acquire_many(SUBSCRIBERS as u32);
    tokio::time::timeout(Duration::from_secs(120), all_ready)
        .await
        .expect("every subscriber is live within 2 minutes")
        .unwrap()
        .forget();
    let start = Instant::now();
    let writers: Vec<_> = (0..4)
        .map(|w| {
            let (http, url, token) = (
                b.http.clone(),
                format!("{}/api/v1/tasks/{}", b.server.url, b.task),
                b.token.clone(),
            );
            tokio::spawn(async move {
                for i in (w..FANOUT_EVENTS).step_by(4) {
                    let r = http
                        .patch(&url)
                        .bearer_auth(&token)
                        .json(&json!({"description": format!("update {i}")}))
                        .send()
                        .await
                        .unwrap();
                    assert_eq!(r.status().as_u16(), 200);
                }
            })
        })
        .collect();
    for w in writers {
        w.await.unwrap();
    }
    let written = start.elapsed();
    let (mut complete, mut resets, mut last) = (0, 0, start);
    for s in subscribers {
        let (got, r, at) = s.await.unwrap();
        complete += usize::from(got == FANOUT_EVENTS);
        resets += r;
        last = last.max(at);
    }
    let delivered = last - start;
    let ok = complete == SUBSCRIBERS && resets == 0;
    table.add(
        b.backend,
        "SSE fan-out: 1,000 events (PATCH task) to 200 subscribers",
        format!(
            "all delivered {} after the first write; {complete}/200 complete, {resets} resets",
            fmt_d(delivered)
        ),
        format!("{} to write them (4 writers)", fmt_d(written)),
        format!("{:.2}x the write time", delivered.as_secs_f64() / written.as_secs_f64()),
        "every subscriber gets all 1,000, none reset",
        Some(ok),
    );
}
