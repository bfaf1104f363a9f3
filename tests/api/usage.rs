//! What agents spend, recorded where it happens. The real Pi against the suite's model
//! server, which reports known token counts, with prices in Pi's model table so that Pi reports a cost:
//! the totals berth shows must be exactly what those figures make. The records outlive their session and
//! task in the workspace's rollups. A report that claims what no call can (a negative count) is refused.
use std::time::Duration;

use reqwest::Method;
use serde_json::Value;

use crate::both_backends;
use crate::helpers::{TestApp, seen, uuid, wait_until};
use crate::model_server::Reply;
use crate::pi::{PRICES, pi_session, say, wait_message, wait_session, wait_snapshot, with_pi};

both_backends!(
    pi_usage_is_recorded_summed_and_outlives_its_session_and_task,
    absurd_usage_is_refused
);

const WAIT: Duration = Duration::from_secs(60);

/// What Pi reports a call with these counts cost (its own arithmetic), in billionths of a dollar.
fn nanos(input: u64, output: u64) -> i64 {
    let dollars = (PRICES.0 / 1_000_000.0) * input as f64 + (PRICES.1 / 1_000_000.0) * output as f64;
    (dollars * 1e9).round() as i64
}

fn usd(usage: &Value) -> i64 {
    let cost = usage["cost"].as_array().expect("cost is a list");
    assert!(cost.len() <= 1, "one currency: {usage}");
    cost.first().map_or(0, |c| {
        assert_eq!(c["currency"], "USD", "{usage}");
        (c["amount"].as_f64().unwrap() * 1e9).round() as i64
    })
}

fn assert_totals(usage: &Value, reports: u64, input: u64, output: u64, cost: i64, what: &str) {
    assert_eq!(usage["reports"], reports, "{what}: {usage}");
    assert_eq!(usage["input_tokens"], input, "{what}: {usage}");
    assert_eq!(usage["output_tokens"], output, "{what}: {usage}");
    assert_eq!(usage["cache_read_tokens"], 0, "{what}: {usage}");
    assert_eq!(usage["cache_write_tokens"], 0, "{what}: {usage}");
    assert_eq!(usd(usage), cost, "{what}: {usage}");
}

async fn rollup(app: &TestApp, ws: &str, group_by: &str) -> Value {
    app.get(&format!("/api/v1/workspaces/{ws}/usage?group_by={group_by}"))
        .await
        .ok(200)
}

async fn pi_usage_is_recorded_summed_and_outlives_its_session_and_task(app: TestApp) {
    let Some((app, pi)) = with_pi(app, &[]).await else {
        return;
    };
    let calls = [("count one", 1200u64, 340u64), ("count two", 5000, 77)];
    for (text, input, output) in calls {
        pi.model.reply_to(text, Reply::text("counted").usage(input, output));
    }
    let s = pi_session(&app).await;
    let id = uuid(&s["id"]);
    let task = s["task_id"].as_str().unwrap().to_string();
    for (text, _, _) in calls {
        let m = say(&app, id, text, None).await;
        wait_message(&app, id, &m, "delivered").await;
        wait_session(&app, id, "idle after the turn", |s| s["state"] == "idle").await;
    }
    let input: u64 = calls.iter().map(|c| c.1).sum();
    let output: u64 = calls.iter().map(|c| c.2).sum();
    let cost: i64 = calls.iter().map(|c| nanos(c.1, c.2)).sum();
    assert!(cost > 0);
    // The session's totals: each assistant message's usage, as Pi reported it.
    let session = wait_session(&app, id, "with both reports", |s| s["usage"]["reports"] == 2).await;
    assert_totals(&session["usage"], 2, input, output, cost, "the session");
    let snap = app.get(&format!("/api/v1/sessions/{id}/snapshot")).await.ok(200);
    assert_totals(&snap["usage"], 2, input, output, cost, "the snapshot");
    assert_eq!(snap["statistics"]["input_tokens"], input);
    assert_eq!(snap["statistics"]["output_tokens"], output);
    let task_view = app.get(&format!("/api/v1/tasks/{task}")).await.ok(200);
    assert_totals(&task_view["usage"], 2, input, output, cost, "the task");
    let ws = task_view["workspace_id"].as_str().unwrap().to_string();
    // The rollups, each way.
    let today = chrono::Utc::now().format("%Y-%m-%d").to_string();
    for (group_by, key) in [
        ("model", "echo"),
        ("agent_profile", "pi"),
        ("task", task.as_str()),
        ("day", &today),
    ] {
        let r = rollup(&app, &ws, group_by).await;
        assert_totals(&r["total"], 2, input, output, cost, group_by);
        let groups = r["groups"].as_array().unwrap();
        assert_eq!(groups.len(), 1, "{group_by}: {r}");
        assert_eq!(groups[0]["key"], key, "{group_by}: {r}");
        assert_totals(&groups[0]["usage"], 2, input, output, cost, group_by);
    }
    // Prometheus: tokens by model, profile and kind.
    let metrics = app.call(Method::GET, "/metrics", None, None).await.text;
    let line = metrics
        .lines()
        .find(|l| {
            l.starts_with("berth_agent_tokens_total{") && l.contains("model=\"echo\"") && l.contains("kind=\"input\"")
        })
        .unwrap_or_else(|| panic!("no input token counter for echo:\n{metrics}"));
    assert!(line.contains("agent_profile=\"pi\""), "{line}");
    assert!(line.ends_with(&format!(" {input}")), "{line}");
    assert!(metrics.contains("berth_agent_cost_total{"), "{metrics}");

    // Deleting the session deletes its conversation, not the money it spent; nor does deleting the task.
    crate::pi::stop(&app, id).await;
    wait_session(&app, id, "stopped", |s| {
        s["state"] == "stopped" || s["state"] == "cancelled"
    })
    .await;
    app.delete(&format!("/api/v1/sessions/{id}")).await.ok(204);
    let task_view = app.get(&format!("/api/v1/tasks/{task}")).await.ok(200);
    assert_totals(
        &task_view["usage"],
        2,
        input,
        output,
        cost,
        "the task after its session went",
    );
    app.delete(&format!("/api/v1/tasks/{task}")).await;
    wait_until("the task to be deleted", WAIT, || async {
        let status = app.get(&format!("/api/v1/tasks/{task}")).await.status;
        seen(status.as_u16() == 404, status)
    })
    .await;
    let r = rollup(&app, &ws, "task").await;
    assert_totals(&r["total"], 2, input, output, cost, "the workspace after its task went");
    assert_eq!(r["groups"][0]["key"], task.as_str());
}

/// An agent that reports a negative count or an impossible cost is not believed: nothing is recorded,
/// the turn goes on. (The test agent speaks Pi's protocol; `usage` makes it report these figures.)
async fn absurd_usage_is_refused(app: TestApp) {
    let f = app.task_with_repo("Liar").await;
    let id = f.started_session_within("test", WAIT).await.id;
    for (n, text) in ["usage -5 3 0.1", "usage 4 2 -1", "usage 7 1 1e9", "usage 10 20 0.25"]
        .iter()
        .enumerate()
    {
        let m = say(&app, id, text, None).await;
        wait_message(&app, id, &m, "delivered").await;
        wait_snapshot(&app, id, "the turn answered", |s| {
            s["statistics"]["turns"] == n as u64 + 1 && s["state"] == "idle"
        })
        .await;
    }
    let session = wait_session(&app, id, "with the one believable report", |s| {
        s["usage"]["reports"] == 1
    })
    .await;
    assert_totals(&session["usage"], 1, 10, 20, 250_000_000, "only the believable report");
}
