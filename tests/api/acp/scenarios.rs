//! The agents of the Agent Client Protocol, each, through the real berth server on both databases: a
//! permission question before the agent's own tool writes a file (allowed: the file is in the worktree; rejected: it is not),
//! a streamed answer rebuilt exactly from the events, a second turn whose model request carries the
//! first, a berth restart after which the next model request carries both, an abort mid-stream that ends
//! the turn `cancelled` with the agent alive, a message sent mid-turn delivered after it, and the agent's
//! usage on the event stream and in berth's totals exactly as the agent reported it (the tokens whole
//! replies of the model server's).
use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};
use uuid::Uuid;

use super::{Kind, with_agent};
use crate::agents::all_events;
use crate::helpers::{TestApp, seen, wait_until_every};
use crate::model_server::{DEFAULT_USAGE, Gate, ModelRequest, Outcome, Reply};
use crate::pi::{
    agent_session_ref, execution_pid, pid_alive, restart, say, stop, uuid, wait_message, wait_session, wait_snapshot,
};

/// Node agents start in seconds, more on a loaded 2-core machine.
const WAIT: Duration = Duration::from_secs(120);

macro_rules! per_agent {
    ($($scenario:ident),* $(,)?) => {
        $(
            mod $scenario {
                use super::Kind;
                use crate::helpers::TestApp;
                async fn opencode(app: TestApp) { super::$scenario(app, Kind::Opencode).await }
                async fn claude(app: TestApp) { super::$scenario(app, Kind::Claude).await }
                async fn codex(app: TestApp) { super::$scenario(app, Kind::Codex).await }
                async fn gemini(app: TestApp) { super::$scenario(app, Kind::Gemini).await }
                crate::both_backends!(opencode, claude, codex, gemini);
            }
        )*
    };
}

per_agent!(
    tools_streams_and_one_conversation_across_a_restart,
    abort_and_a_message_mid_turn
);

/// A workspace, a repository, a task and a worktree session on the agent's profile, not yet started.
async fn session(app: &TestApp, kind: Kind) -> (Uuid, String) {
    let f = app.task_with_repo("ACP").await;
    let s = f.unstarted_agent("worktree", kind.name()).await;
    let path = s["workspace_path"].as_str().expect("the worktree's path").to_string();
    (uuid(&s["id"]), path)
}

async fn launch(app: &TestApp, id: Uuid, prompt: Option<&str>) {
    let body = prompt.map_or(json!({}), |p| json!({ "prompt": p }));
    app.post(&format!("/api/v1/sessions/{id}/launch"), body).await.ok(200);
}

async fn idle(app: &TestApp, id: Uuid, what: &str) -> Value {
    wait_session(app, id, what, |s| s["state"] == "idle").await
}

/// What the agent printed for this session, as berth recorded it (`runtime.output`), in order.
async fn outputs(app: &TestApp, id: Uuid) -> Vec<Value> {
    all_events(app)
        .await
        .into_iter()
        .filter(|e| e["type"] == "runtime.output" && e["session_id"] == id.to_string())
        .map(|e| e["data"]["event"].clone())
        .collect()
}

/// The text of each turn, rebuilt from the recorded message chunks (split at each prompt's answer).
fn turn_texts(outputs: &[Value]) -> Vec<String> {
    let mut turns = vec![String::new()];
    for o in outputs {
        let update = &o["params"]["update"];
        if update["sessionUpdate"] == "agent_message_chunk" {
            turns
                .last_mut()
                .unwrap()
                .push_str(update["content"]["text"].as_str().unwrap_or_default());
        }
        if o["result"]["stopReason"].is_string() || o["error"].is_object() {
            turns.push(String::new());
        }
    }
    turns
}

/// The model request of a turn (the one offering tools whose user text is `text`).
async fn turn_request(agent: &super::Agent, text: &str, outcome: Outcome) -> ModelRequest {
    let requests = agent
        .model
        .wait_until(&format!("the turn {text:?} {outcome:?}"), WAIT, |rs| {
            rs.iter()
                .any(|r| r.outcome == outcome && !r.tool_names().is_empty() && r.last_user_text().contains(text))
        })
        .await;
    requests
        .into_iter()
        .rev()
        .find(|r| r.outcome == outcome && !r.tool_names().is_empty() && r.last_user_text().contains(text))
        .unwrap()
}

/// Waits for the permission question, checks how the snapshot and the stream show it, and answers it
/// with the first option of `kind` (`allow_once`, `reject_once`).
async fn answer_permission(app: &TestApp, id: Uuid, kind: &str) {
    let snap = wait_snapshot(app, id, "a permission question, the session in attention", |s| {
        s["attention_requests"].as_array().is_some_and(|a| !a.is_empty()) && s["session"]["state"] == "attention"
    })
    .await;
    let q = &snap["attention_requests"][0];
    assert_eq!(q["method"], "request_permission", "{q}");
    let option = q["options"]
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["kind"] == kind)
        .unwrap_or_else(|| panic!("no {kind} option in {q}"));
    let recorded = outputs(app, id).await;
    assert!(
        recorded.iter().any(|o| o["method"] == "session/request_permission"),
        "the question is on the stream: {recorded:?}"
    );
    let request_id = q["id"].as_str().unwrap();
    // A wrong shape is refused and the question stays.
    app.post(
        &format!("/api/v1/sessions/{id}/attention/{request_id}"),
        json!({"confirmed": true}),
    )
    .await
    .problem(422, "validation_failed");
    app.post(
        &format!("/api/v1/sessions/{id}/attention/{request_id}"),
        json!({"option_id": option["optionId"]}),
    )
    .await
    .ok(200);
}

const WRITE: &str = "Write the greeting file, please.";
const REJECTED: &str = "Write the other file, please.";
const STREAM: &str = "Tell me about the release.";
const AFTER: &str = "And after the restart?";

async fn tools_streams_and_one_conversation_across_a_restart(app: TestApp, kind: Kind) {
    let Some((mut app, agent)) = with_agent(app, kind).await else {
        return;
    };
    let (id, worktree) = session(&app, kind).await;
    let hello = format!("{worktree}/hello.txt");
    agent.model.reply_to(
        WRITE,
        Reply::tool_write(&hello, "hello from the model\n").then(Reply::text("I wrote it.")),
    );
    launch(&app, id, Some(WRITE)).await;
    // Read once the launch answered, so after the agent opened its conversation (gemini names the
    // conversation's file after that minute: a clock read before the launch can fall in the minute
    // before, and the restart then lands in the opening minute; CI saw it).
    let opened_at = chrono::Utc::now();
    answer_permission(&app, id, "allow_once").await;
    idle(&app, id, "idle after the write").await;
    assert_eq!(std::fs::read_to_string(&hello).unwrap(), "hello from the model\n");
    let snap = app.get(&format!("/api/v1/sessions/{id}/snapshot")).await.ok(200);
    assert!(
        snap["agent"]["identity"]["name"].is_string(),
        "the agent's introduction: {snap}"
    );
    assert!(
        agent_session_ref(&app, id).await.is_some(),
        "the conversation's id is recorded"
    );

    // A rejection keeps the file out.
    let other = format!("{worktree}/rejected.txt");
    agent.model.reply_to(
        REJECTED,
        Reply::tool_write(&other, "no\n").then(Reply::text("Understood.")),
    );
    say(&app, id, REJECTED, None).await;
    answer_permission(&app, id, "reject_once").await;
    idle(&app, id, "idle after the rejection").await;
    assert!(
        !Path::new(&other).exists(),
        "a rejected write never reaches the worktree"
    );

    // A streamed answer, rebuilt exactly from the events; its request carries the first turn.
    let long: String = (0..40).map(|i| format!("word{i} ")).collect();
    agent
        .model
        .reply_to(STREAM, Reply::text(&long).slow(20, Duration::from_millis(15)));
    say(&app, id, STREAM, None).await;
    let request = turn_request(&agent, STREAM, Outcome::Completed).await;
    assert!(request.mentions_substring(WRITE), "the second turn carries the first");
    idle(&app, id, "idle after the stream").await;
    let recorded = outputs(&app, id).await;
    assert!(
        turn_texts(&recorded).iter().any(|t| t == &long),
        "the streamed text is rebuilt exactly from the events: {:?}",
        turn_texts(&recorded)
    );
    assert!(
        recorded.iter().any(|o| o["coalesced"].as_u64().is_some_and(|n| n > 1)),
        "chunks are coalesced"
    );
    let recorded_ref = agent_session_ref(&app, id).await;

    // berth restarts: the session is relaunched, the agent loads the same conversation.
    if kind == Kind::Gemini {
        next_minute_after(opened_at).await;
    }
    let s = app.get(&format!("/api/v1/sessions/{id}")).await.ok(200);
    let restarted = restart(&mut app).await;
    wait_session(&app, id, "relaunched", |v| {
        v["state"] == "idle" && v["execution_id"].is_string() && v["execution_id"] != s["execution_id"]
    })
    .await;
    let m = say(&app, id, AFTER, None).await;
    let request = turn_request(&agent, AFTER, Outcome::Completed).await;
    assert!(
        request.mentions_substring(WRITE) && request.mentions_substring(STREAM),
        "the turn after the restart carries both earlier turns: {:?}",
        request.conversation()
    );
    wait_message(&app, id, &m, "delivered").await;
    idle(&app, id, "idle after the restart's turn").await;
    assert_eq!(agent_session_ref(&app, id).await, recorded_ref, "the same conversation");
    // The replayed history was not recorded a second time.
    let after = turn_texts(&outputs(&app, id).await);
    assert_eq!(after.iter().filter(|t| *t == &long).count(), 1, "{after:?}");
    stop(&app, id).await;
    drop(restarted);
}

/// Picks another value of the agent's first select option with two values or more (else another mode),
/// sets it through the API and waits for the snapshot to show it; then a value the agent refuses.
async fn choose_a_setting(app: &TestApp, id: Uuid) {
    let snap = app.get(&format!("/api/v1/sessions/{id}/snapshot")).await.ok(200);
    let agent = &snap["agent"];
    let option = agent["config_options"].as_array().into_iter().flatten().find(|o| {
        o["type"] == "select" && o["options"].as_array().is_some_and(|v| v.len() > 1) && o["category"] != "model"
    });
    if let Some(option) = option {
        let option_id = option["id"].as_str().unwrap();
        let other = option["options"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v["value"].clone())
            .find(|v| *v != option["currentValue"])
            .unwrap();
        app.put(
            &format!("/api/v1/sessions/{id}/config-options/{option_id}"),
            json!({ "value": other }),
        )
        .await
        .ok(200);
        wait_snapshot(app, id, "the option set", |s| {
            s["agent"]["config_options"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|o| o["id"] == option_id && o["currentValue"] == other)
        })
        .await;
        app.put(
            &format!("/api/v1/sessions/{id}/config-options/{option_id}"),
            json!({ "value": "no-such-value" }),
        )
        .await
        .problem(422, "validation_failed");
        return;
    }
    // A mode the agent takes: some refuse privileged modes in a folder they do not trust (422 with why).
    let modes = agent["modes"].as_array().cloned().unwrap_or_default();
    let mut refused = Vec::new();
    for other in modes.iter().map(|m| m["id"].clone()).filter(|m| *m != agent["mode"]) {
        let r = app
            .put(&format!("/api/v1/sessions/{id}/mode"), json!({ "mode_id": other }))
            .await;
        if r.status == 422 {
            refused.push(r.json()["detail"].clone());
            continue;
        }
        r.ok(200);
        wait_snapshot(app, id, "the mode set", |s| s["agent"]["mode"] == other).await;
        app.put(
            &format!("/api/v1/sessions/{id}/mode"),
            json!({ "mode_id": "no-such-mode" }),
        )
        .await
        .problem(422, "validation_failed");
        return;
    }
    panic!("the agent took no mode and offers no option to choose: {agent}; refused: {refused:?}");
}

/// gemini-cli 0.61 names a conversation's file after the wall-clock minute it opens it in: a process that
/// loads the conversation within the minute it was created writes over that file and finds nothing
/// (`session/load`: "No previous sessions found"). Its users restart it in a later minute; so does this test.
async fn next_minute_after(t: chrono::DateTime<chrono::Utc>) {
    use chrono::Timelike;
    let minute = |t: chrono::DateTime<chrono::Utc>| (t.date_naive(), t.hour(), t.minute());
    let every = Duration::from_millis(250);
    wait_until_every(
        "the clock to reach the next minute",
        Duration::from_secs(70),
        every,
        || async {
            let now = chrono::Utc::now();
            seen(minute(now) != minute(t), now)
        },
    )
    .await;
}

const FIRST: &str = "Start a long answer.";
const MID: &str = "A message sent mid-turn.";
const ABORTED: &str = "An answer to abort.";
const NEXT: &str = "After the abort.";

async fn abort_and_a_message_mid_turn(app: TestApp, kind: Kind) {
    let Some((app, agent)) = with_agent(app, kind).await else {
        return;
    };
    let (id, _) = session(&app, kind).await;
    launch(&app, id, None).await;
    let s = idle(&app, id, "idle after launch").await;

    // A message sent mid-turn waits in berth and is delivered after the turn.
    let gate = Gate::new();
    agent
        .model
        .reply_to(FIRST, Reply::text("The long answer.").gated(&gate));
    say(&app, id, FIRST, None).await;
    turn_request(&agent, FIRST, Outcome::Held).await;
    wait_session(&app, id, "running", |v| v["state"] == "running").await;
    let mid = say(&app, id, MID, None).await;
    assert_eq!(wait_message(&app, id, &mid, "queued").await["state"], "queued");
    gate.release();
    let request = turn_request(&agent, MID, Outcome::Completed).await;
    assert!(request.mentions_substring(FIRST), "{:?}", request.conversation());
    wait_message(&app, id, &mid, "delivered").await;
    idle(&app, id, "idle after the second turn").await;

    // Abort mid-stream: the turn ends `cancelled`, the agent lives on and takes the next message.
    let held = Gate::new();
    agent
        .model
        .reply_to(ABORTED, Reply::text("never finished").gated(&held));
    say(&app, id, ABORTED, None).await;
    turn_request(&agent, ABORTED, Outcome::Held).await;
    wait_session(&app, id, "running", |v| v["state"] == "running").await;
    app.post(&format!("/api/v1/sessions/{id}/abort"), json!({}))
        .await
        .ok(200);
    idle(&app, id, "idle after the abort").await;
    let recorded = outputs(&app, id).await;
    assert!(
        recorded.iter().any(|o| o["result"]["stopReason"] == "cancelled"),
        "the turn ended cancelled: {recorded:?}"
    );
    assert!(
        pid_alive(execution_pid(&app, &s["execution_id"]).await),
        "the agent lives on"
    );
    let next = say(&app, id, NEXT, None).await;
    turn_request(&agent, NEXT, Outcome::Completed).await;
    wait_message(&app, id, &next, "delivered").await;
    idle(&app, id, "idle after the turn after the abort").await;
    held.release();

    // Usage the agent reports reaches the events (gemini-cli 0.61 reports none), and berth's totals are
    // what the agent said, to the token and the billionth.
    if kind != Kind::Gemini {
        let recorded = outputs(&app, id).await;
        assert!(
            recorded
                .iter()
                .any(|o| o["params"]["update"]["sessionUpdate"] == "usage_update"),
            "usage reaches the events"
        );
    }
    usage_is_what_the_agent_reported(&app, &agent, id, kind).await;
    // The modes and options the agent offers can be set; a refused value says why and changes nothing.
    choose_a_setting(&app, id).await;

    // Steering: an agent that advertises the extension (Claude Code, Codex) takes a message into the
    // running turn, and the model sees it in that turn; the others refuse it with a typed 409, never
    // downgraded to a follow-up.
    let snap = app.get(&format!("/api/v1/sessions/{id}/snapshot")).await.ok(200);
    let steering = matches!(kind, Kind::Claude | Kind::Codex);
    assert_eq!(snap["agent"]["identity"]["steering"], steering, "{}", snap["agent"]);
    if steering {
        steer_into_a_running_turn(&app, &agent, id).await;
    } else {
        app.post(
            &format!("/api/v1/sessions/{id}/messages"),
            json!({"text": "steer me", "delivery": "steer"}),
        )
        .await
        .problem(409, "steer_unsupported");
    }
    stop(&app, id).await;
}

/// Sums what the agent reported over ACP for the session: each prompt answer's `usage` (tokens) and the
/// last `usage_update` cost (a running total). Berth's totals on `GET /sessions/{id}` must be exactly
/// these; the tokens are checked against what the model server told the agent.
async fn usage_is_what_the_agent_reported(app: &TestApp, agent: &super::Agent, id: Uuid, kind: Kind) {
    let recorded = outputs(app, id).await;
    let (mut input, mut output, mut cache_read, mut cache_write, mut turns) = (0, 0, 0, 0, 0);
    let mut cost: Option<(String, f64)> = None;
    for o in &recorded {
        let usage = &o["result"]["usage"];
        if o["result"]["stopReason"].is_string() && usage.is_object() {
            input += usage["inputTokens"].as_u64().unwrap_or(0);
            output += usage["outputTokens"].as_u64().unwrap_or(0);
            cache_read += usage["cachedReadTokens"].as_u64().unwrap_or(0);
            cache_write += usage["cachedWriteTokens"].as_u64().unwrap_or(0);
            turns += 1;
        }
        let update = &o["params"]["update"];
        if update["sessionUpdate"] == "usage_update" && update["cost"].is_object() {
            let currency = update["cost"]["currency"].as_str().unwrap_or_default().to_string();
            cost = Some((currency, update["cost"]["amount"].as_f64().unwrap()));
        }
    }
    let told = app.get(&format!("/api/v1/sessions/{id}")).await.ok(200);
    let usage = &told["usage"];
    let said = format!("{kind:?}: berth {usage}; the agent {turns} turns, {input}/{output}, cost {cost:?}");
    assert_eq!(usage["input_tokens"], input, "{said}");
    assert_eq!(usage["output_tokens"], output, "{said}");
    assert_eq!(usage["cache_read_tokens"], cache_read, "{said}");
    assert_eq!(usage["cache_write_tokens"], cache_write, "{said}");
    // A running total of zero (opencode's free test model) adds nothing to spend.
    match cost {
        Some((ref currency, amount)) if amount > 0.0 => {
            assert_eq!(
                usage["cost"],
                json!([{"currency": currency, "amount": amount}]),
                "{said}"
            )
        }
        _ => assert_eq!(usage["cost"], json!([]), "{said}"),
    }
    // The tokens are the model server's: whole replies of its default usage, no more than it served.
    let served = agent.model.requests();
    if kind == Kind::Gemini {
        assert_eq!(usage["reports"], 0, "gemini-cli 0.61 reports no usage: {said}");
        return;
    }
    let replies = input / DEFAULT_USAGE.input;
    assert!(replies > 0, "{said}");
    assert_eq!(
        (input, output),
        (replies * DEFAULT_USAGE.input, replies * DEFAULT_USAGE.output),
        "{said}"
    );
    assert!(replies as usize <= served.len(), "{said}; served {}", served.len());
    if kind == Kind::Claude {
        assert!(
            cost.is_some_and(|(c, a)| c == "USD" && a > 0.0),
            "Claude Code prices its turns: {said}"
        );
    }
}

const STEERED: &str = "Begin a turn to steer.";
const STEER: &str = "A steer into the running turn.";

/// A steer sent while the model answers is delivered at once (not held for the turn like a follow-up)
/// and reaches the model within the same turn.
async fn steer_into_a_running_turn(app: &TestApp, agent: &super::Agent, id: Uuid) {
    let gate = Gate::new();
    agent
        .model
        .reply_to(STEERED, Reply::text("Working on it.").gated(&gate));
    say(app, id, STEERED, None).await;
    turn_request(agent, STEERED, Outcome::Held).await;
    wait_session(app, id, "running", |v| v["state"] == "running").await;
    let steer = say(app, id, STEER, Some("steer")).await;
    wait_message(app, id, &steer, "delivered").await;
    gate.release();
    let requests = agent
        .model
        .wait_until("a model request carrying the steer", WAIT, |rs| {
            rs.iter()
                .any(|r| r.mentions_substring(STEER) && r.mentions_substring(STEERED))
        })
        .await;
    assert!(
        requests
            .iter()
            .any(|r| r.mentions_substring(STEER) && r.mentions_substring(STEERED)),
        "the steer joined the turn"
    );
    idle(app, id, "idle after the steered turn").await;
    let recorded = outputs(app, id).await;
    let answers = recorded.iter().filter(|o| o["result"]["outcome"] == "injected").count();
    assert_eq!(answers, 1, "the agent took the steer into its turn: {recorded:?}");
}
