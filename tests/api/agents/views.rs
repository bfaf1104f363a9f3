//! What clients read of live agents: the workspace summary per directory, and a snapshot followed by the
//! event stream while an agent streams.
use std::time::Duration;

use serde_json::{Value, json};

use super::{WAIT, all_events, uuid, wait_session};
use crate::both_backends;
use crate::helpers::TestApp;

both_backends!(
    the_summary_counts_agents_per_directory,
    a_snapshot_then_the_stream_loses_nothing_while_an_agent_streams,
);

// Seed 002 "summary": open, working, attention and error counts per environment directory, from stored
// state; six or more open sessions in one directory add a warning, never a cap.
async fn the_summary_counts_agents_per_directory(app: TestApp) {
    let f = app.task_with_repo("Busy dir").await;
    let ws = f.workspace;
    let mut ids = Vec::new();
    for i in 0..6 {
        let prompt = if i == 0 { "hang" } else { "pwd" };
        let s = f.agent_prompted("test", prompt).await;
        ids.push(uuid(&s["id"]));
    }
    wait_session(&app, ids[0], "working", |s| s["state"] == "running").await;
    // I36: one writer of the worktree at a time: the other five agents are live, their prompts wait
    // queued while the first one's turn runs (a session launched with a prompt reads `running` from its
    // launch on).
    for id in &ids[1..] {
        wait_session(&app, *id, "live", |s| s["state"] == "running" || s["state"] == "idle").await;
    }
    crate::helpers::wait_until("six live agents", Duration::from_secs(20), || async {
        let n = app.app_state.ctx.runtime.live_count();
        crate::helpers::seen_json(n == 6, json!(n))
    })
    .await;
    let sum = app.get(&format!("/api/v1/workspaces/{ws}/summary")).await.ok(200);
    assert_eq!(sum["tasks_active"], 1);
    assert_eq!(sum["sessions"]["open"], 6);
    assert!(sum["sessions"]["working"].as_u64().unwrap() >= 1, "{sum}");
    assert_eq!(sum["sessions"]["attention"], 0);
    let dirs = sum["directories"].as_array().unwrap();
    assert_eq!(dirs.len(), 1);
    assert_eq!(dirs[0]["open"], 6);
    assert!(dirs[0]["warning"].is_string(), "{sum}");
    for id in ids {
        app.post(&format!("/api/v1/sessions/{id}/stop"), json!({}))
            .await
            .ok(200);
    }
    let after = app.get(&format!("/api/v1/workspaces/{ws}/summary")).await.ok(200);
    assert_eq!(after["sessions"]["open"], 0);
    assert!(after["directories"][0]["warning"].is_null());
}

// Seed 002: load the snapshot while an agent streams, follow the stream from its latest_seq: nothing is
// missing and nothing repeats.
async fn a_snapshot_then_the_stream_loses_nothing_while_an_agent_streams(app: TestApp) {
    let f = app.task_with_repo("Streaming").await;
    let id = f.started_session("test").await.id;
    app.post(
        &format!("/api/v1/sessions/{id}/messages"),
        json!({"text": "stream 500"}),
    )
    .await
    .ok(202);
    wait_session(&app, id, "working", |s| s["state"] == "running").await;
    let snap = app.get(&format!("/api/v1/sessions/{id}/snapshot")).await.ok(200);
    let from = snap["latest_seq"].as_i64().unwrap();
    let mut sse = crate::helpers::Sse::open(&app, &app.admin, &format!("?after={from}"), None).await;
    let mut streamed = Vec::new();
    loop {
        let frame = sse.next(WAIT).await.expect("the stream stays open");
        if frame.event != "message" {
            continue;
        }
        streamed.push(frame.id.unwrap());
        let e: Value = serde_json::from_str(&frame.data).unwrap();
        if e["type"] == "runtime.output" && e["data"]["event"]["type"] == "agent_end" {
            break;
        }
    }
    let events = all_events(&app).await;
    let committed: Vec<i64> = events
        .iter()
        .map(|e| e["seq"].as_i64().unwrap())
        .filter(|s| *s > from && *s <= *streamed.last().unwrap())
        .collect();
    assert_eq!(streamed, committed, "every event after the snapshot, once, in order");
    assert!(!streamed.is_empty(), "output arrived live after the snapshot");
    // Together, what preceded the snapshot and what streamed after it hold the whole turn. Streamed
    // deltas are coalesced: the events rebuild the 500 chunks, in order.
    let chunks: String = events
        .iter()
        .filter(|e| e["session_id"] == id.to_string() && e["data"]["event"]["type"] == "message_update")
        .map(|e| e["data"]["event"]["delta"].as_str().unwrap())
        .collect();
    assert_eq!(chunks, (0..500).map(|i| format!("chunk {i} ")).collect::<String>());
    let done = app.get(&format!("/api/v1/sessions/{id}/snapshot")).await.ok(200);
    assert_eq!(done["statistics"]["input_tokens"], 10);
    assert_eq!(done["statistics"]["output_tokens"], 20);
    assert_eq!(done["statistics"]["cost"], 0.5);
    assert!(done["active_tool"].is_null(), "the tool ended");
    app.post(&format!("/api/v1/sessions/{id}/stop"), json!({}))
        .await
        .ok(200);
}
