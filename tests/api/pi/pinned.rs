//! The behaviours of Pi that berth relies on, pinned without berth: conversation files, the queues while
//! it streams, abort, and the extension's dialogs and notices over RPC.
use serde_json::{Value, json};
use tempfile::TempDir;

use super::process::PiProcess;
use super::{Pi, WAIT, conversation_header, texts};
use crate::model_server::{Gate, Outcome, Reply};

// Without berth: the model server and the extension against the real Pi. Pi streams the echo in chunks,
// its second request carries the first turn, and a relaunch on the same `--session` file after a SIGKILL
// continues that conversation (the file is created lazily, after the first message).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pi_speaks_to_the_scripted_model_server() {
    let Some(pi) = Pi::start().await else { return };
    let dir = TempDir::new().unwrap();
    let file = dir.path().join("conversation.jsonl");
    let mut p = PiProcess::spawn(&pi, dir.path(), Some(&file)).await;
    let state = p.ok(json!({"type": "get_state"})).await;
    assert_eq!(state["sessionFile"], file.display().to_string());
    assert_eq!(state["model"]["id"], "echo");
    assert_eq!(state["model"]["provider"], "scripted");
    assert_eq!(state["isStreaming"], false);
    let session_id = state["sessionId"]
        .as_str()
        .expect("a session id before any message")
        .to_string();
    assert!(
        !file.exists(),
        "Pi writes its conversation file only after the first message"
    );
    // The extension is loaded with -e: its commands are listed.
    let commands = p.ok(json!({"type": "get_commands"})).await;
    let mut names: Vec<&str> = commands["commands"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["source"] == "extension")
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["confirm-me", "notice"]);

    let from = p.seen.len();
    p.ok(json!({"type": "prompt", "message": "hello there"})).await;
    let end = p.next_of("agent_end").await;
    let deltas: Vec<&str> = p.seen[from..]
        .iter()
        .filter(|l| l["type"] == "message_update" && l["assistantMessageEvent"]["type"] == "text_delta")
        .map(|l| l["assistantMessageEvent"]["delta"].as_str().unwrap())
        .collect();
    assert!(deltas.len() >= 2, "streamed in several chunks: {deltas:?}");
    assert_eq!(deltas.concat(), "echo: hello there");
    let last = end["messages"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(last["role"], "assistant");
    assert_eq!(last["content"][0]["text"], "echo: hello there");
    assert_eq!(last["stopReason"], "stop");
    let first = pi.model.wait_request(1, Outcome::Completed, WAIT).await;
    assert_eq!(first.conversation(), texts(&[("user", "hello there")]));
    assert_eq!(first.body["model"], "echo");

    p.ok(json!({"type": "prompt", "message": "second"})).await;
    p.next_of("agent_end").await;
    let second = pi.model.wait_request(2, Outcome::Completed, WAIT).await;
    assert_eq!(
        second.conversation(),
        texts(&[
            ("user", "hello there"),
            ("assistant", "echo: hello there"),
            ("user", "second")
        ]),
        "the second request carries the first turn"
    );
    let header = conversation_header(&file);
    assert_eq!(header["type"], "session");
    assert_eq!(header["version"], 3);
    assert_eq!(
        header["id"],
        session_id.as_str(),
        "the file is the conversation get_state named"
    );

    // A crash, then a relaunch on the same file: the same conversation goes on.
    p.kill().await;
    let mut p = PiProcess::spawn(&pi, dir.path(), Some(&file)).await;
    let state = p.ok(json!({"type": "get_state"})).await;
    assert_eq!(state["sessionId"], session_id.as_str());
    assert_eq!(state["messageCount"], 4);
    p.ok(json!({"type": "prompt", "message": "third"})).await;
    p.next_of("agent_end").await;
    let third = pi.model.wait_request(3, Outcome::Completed, WAIT).await;
    assert_eq!(
        third.conversation(),
        texts(&[
            ("user", "hello there"),
            ("assistant", "echo: hello there"),
            ("user", "second"),
            ("assistant", "echo: second"),
            ("user", "third"),
        ])
    );
    p.kill().await;
}

// Why berth checks a recorded conversation before launching: given a missing or a corrupt `--session` file,
// Pi silently starts a new conversation (and overwrites the corrupt file).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pi_silently_replaces_a_missing_or_corrupt_conversation() {
    let Some(pi) = Pi::start().await else { return };
    let dir = TempDir::new().unwrap();
    let file = dir.path().join("conversation.jsonl");
    let mut p = PiProcess::spawn(&pi, dir.path(), Some(&file)).await;
    let original = p.ok(json!({"type": "get_state"})).await["sessionId"].clone();
    p.ok(json!({"type": "prompt", "message": "remember me"})).await;
    p.next_of("agent_end").await;
    p.kill().await;
    assert_eq!(conversation_header(&file)["id"], original);

    std::fs::write(&file, "this is not a conversation\n").unwrap();
    let mut p = PiProcess::spawn(&pi, dir.path(), Some(&file)).await;
    let state = p.ok(json!({"type": "get_state"})).await;
    assert_ne!(state["sessionId"], original, "a corrupt file: a new conversation");
    assert_eq!(state["messageCount"], 0);
    p.ok(json!({"type": "prompt", "message": "fresh"})).await;
    p.next_of("agent_end").await;
    let fresh = pi.model.wait_request(2, Outcome::Completed, WAIT).await;
    assert_eq!(
        fresh.conversation(),
        texts(&[("user", "fresh")]),
        "the model saw nothing earlier"
    );
    p.kill().await;
    assert_eq!(
        conversation_header(&file)["id"],
        state["sessionId"],
        "the corrupt file was overwritten"
    );

    let missing = dir.path().join("missing.jsonl");
    let mut p = PiProcess::spawn(&pi, dir.path(), Some(&missing)).await;
    let state = p.ok(json!({"type": "get_state"})).await;
    assert_eq!(state["messageCount"], 0, "a missing file: a new, empty conversation");
    assert_eq!(state["sessionFile"], missing.display().to_string());
    p.kill().await;
}

// While Pi streams: a plain prompt is refused (the message berth used to drop), `follow_up` and `steer`
// queue (`queue_update`), the steer runs as the next turn and the follow-up after it, all in one agent run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pi_queues_steers_and_follow_ups_while_it_streams() {
    let Some(pi) = Pi::start().await else { return };
    let dir = TempDir::new().unwrap();
    let mut p = PiProcess::spawn(&pi, dir.path(), Some(&dir.path().join("c.jsonl"))).await;
    let gate = Gate::new();
    pi.model.reply_to("first", Reply::echo().gated(&gate));
    let from = p.seen.len();
    p.ok(json!({"type": "prompt", "message": "first"})).await;
    pi.model.wait_request(1, Outcome::Held, WAIT).await;
    let refused = p.call(json!({"type": "prompt", "message": "plain"})).await;
    assert_eq!(refused["success"], false);
    assert!(
        refused["error"].as_str().unwrap().contains("already processing"),
        "{refused}"
    );
    p.ok(json!({"type": "follow_up", "message": "later"})).await;
    p.ok(json!({"type": "steer", "message": "now"})).await;
    // Each queue change is a `queue_update` (printed before the command's response).
    assert!(
        p.seen.iter().any(|l| l["type"] == "queue_update"
            && l["steering"] == json!(["now"])
            && l["followUp"] == json!(["later"])),
        "{:#?}",
        p.seen
    );
    let state = p.ok(json!({"type": "get_state"})).await;
    assert_eq!(state["isStreaming"], true);
    assert_eq!(state["pendingMessageCount"], 2);
    assert_eq!(pi.model.requests().len(), 1, "nothing queued reached the model yet");

    gate.release();
    p.next_of("agent_end").await;
    let requests = pi.model.wait_completed(3, WAIT).await;
    assert_eq!(
        requests[1].conversation(),
        texts(&[("user", "first"), ("assistant", "echo: first"), ("user", "now")]),
        "the steer went first"
    );
    assert_eq!(
        requests[2].conversation(),
        texts(&[
            ("user", "first"),
            ("assistant", "echo: first"),
            ("user", "now"),
            ("assistant", "echo: now"),
            ("user", "later"),
        ]),
        "the follow-up after it"
    );
    assert!(
        !requests.iter().any(|r| r.mentions("plain")),
        "the refused prompt never reached the model"
    );
    let types = p.types_since(from);
    let count = |t: &str| types.iter().filter(|x| *x == t).count();
    assert_eq!(
        (count("agent_start"), count("turn_start"), count("agent_end")),
        (1, 3, 1),
        "one agent run holds the three turns: {types:?}"
    );
    p.kill().await;
}

// Pi's `abort`: the model request is dropped mid-reply (the model server survives it), `agent_end` comes
// before the abort's response, Pi stays alive and idle, and it keeps its own follow-up queue: the
// follow-up runs after the next prompt. The aborted partial reply is not sent to the model again. This is
// why berth holds follow-ups itself until a turn settles.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pi_abort_drops_the_request_and_keeps_its_own_follow_up_queue() {
    let Some(pi) = Pi::start().await else { return };
    let dir = TempDir::new().unwrap();
    let mut p = PiProcess::spawn(&pi, dir.path(), Some(&dir.path().join("c.jsonl"))).await;
    let gate = Gate::new();
    pi.model.reply_to("first", Reply::echo().gated(&gate));
    p.ok(json!({"type": "prompt", "message": "first"})).await;
    pi.model.wait_request(1, Outcome::Held, WAIT).await;
    p.ok(json!({"type": "follow_up", "message": "kept"})).await;
    let from = p.seen.len();
    p.ok(json!({"type": "abort"})).await;
    // `ok` returns at the abort's response: the run had ended by then.
    let types = p.types_since(from);
    assert!(
        types.contains(&"agent_end".to_string()),
        "agent_end before the response: {types:?}"
    );
    let aborted = p.seen[from..]
        .iter()
        .find(|l| l["type"] == "message_end" && l["message"]["role"] == "assistant")
        .expect("the partial reply ends")
        .clone();
    assert_eq!(aborted["message"]["stopReason"], "aborted");
    pi.model.wait_request(1, Outcome::Dropped, WAIT).await;
    let state = p.ok(json!({"type": "get_state"})).await;
    assert_eq!(state["isStreaming"], false);
    assert_eq!(state["pendingMessageCount"], 1, "abort kept Pi's follow-up queue");
    assert!(p.child.try_wait().unwrap().is_none(), "Pi is alive");

    p.ok(json!({"type": "prompt", "message": "next"})).await;
    let requests = pi
        .model
        .wait_until("three requests", WAIT, |r| {
            r.len() == 3 && r[2].outcome == Outcome::Completed
        })
        .await;
    assert_eq!(
        requests[1].conversation(),
        texts(&[("user", "first"), ("user", "next")]),
        "the aborted partial reply is not sent again"
    );
    assert_eq!(
        requests[2].last_user_text(),
        "kept",
        "the old follow-up ran after the next prompt"
    );
    p.kill().await;
}

// The extension fixture over RPC. Commands sent as `prompt` run at once, even while Pi streams, and never
// call the model. `/notice` sends notify, setStatus and setTitle and needs no answer. `/confirm-me` sends
// a `confirm` request and waits: meanwhile Pi answers other commands, and the prompt's response comes only
// after the dialog is answered; the answer (or a cancel) reaches the extension, which notifies it. A
// response with an unknown id is ignored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pi_extension_dialogs_and_notices_over_rpc() {
    let Some(pi) = Pi::start().await else { return };
    let dir = TempDir::new().unwrap();
    let mut p = PiProcess::spawn(&pi, dir.path(), Some(&dir.path().join("c.jsonl"))).await;
    p.ok(json!({"type": "get_state"})).await;

    let from = p.seen.len();
    p.ok(json!({"type": "prompt", "message": "/notice hello"})).await;
    let ui: Vec<Value> = p.seen[from..]
        .iter()
        .filter(|l| l["type"] == "extension_ui_request")
        .cloned()
        .collect();
    let methods: Vec<&str> = ui.iter().map(|l| l["method"].as_str().unwrap()).collect();
    assert_eq!(methods, ["notify", "setStatus", "setTitle"]);
    assert!(
        ui.iter().all(|l| l["id"].is_string()),
        "fire-and-forget requests carry ids too"
    );
    assert_eq!(ui[0]["message"], "hello");
    assert_eq!(ui[0]["notifyType"], "info");
    assert_eq!(
        (&ui[1]["statusKey"], &ui[1]["statusText"]),
        (&json!("berth-test"), &json!("status: hello"))
    );
    assert_eq!(ui[2]["title"], "title: hello");
    assert!(
        !p.types_since(from).contains(&"agent_start".to_string()),
        "no agent run"
    );

    p.send(json!({"id": "dialog", "type": "prompt", "message": "/confirm-me Ship it?"}))
        .await;
    let ask = p.next_of("extension_ui_request").await;
    assert_eq!(ask["method"], "confirm");
    assert_eq!(ask["title"], "Ship it?");
    assert_eq!(ask["message"], "berth test dialog");
    let from = p.seen.len();
    let state = p.ok(json!({"type": "get_state"})).await;
    assert_eq!(state["isStreaming"], false, "a dialog is not a turn");
    assert!(
        !p.seen[from..].iter().any(|l| l["id"] == "dialog"),
        "the prompt's response waits for the dialog"
    );
    p.send(json!({"type": "extension_ui_response", "id": "nope", "confirmed": true}))
        .await;
    p.send(json!({"type": "extension_ui_response", "id": ask["id"], "confirmed": true}))
        .await;
    let told = p.next_of("extension_ui_request").await;
    assert_eq!(
        (&told["method"], &told["message"]),
        (&json!("notify"), &json!("confirmed: true"))
    );
    let done = p.until("the prompt's response", |l| l["id"] == "dialog").await;
    assert_eq!(done["success"], true);
    assert!(
        !p.seen.iter().any(|l| l["id"] == "nope"),
        "an unknown dialog id gets no answer"
    );

    p.send(json!({"type": "prompt", "message": "/confirm-me Again?"})).await;
    let ask = p.next_of("extension_ui_request").await;
    p.send(json!({"type": "extension_ui_response", "id": ask["id"], "cancelled": true}))
        .await;
    let told = p.next_of("extension_ui_request").await;
    assert_eq!(told["message"], "confirmed: false", "a cancelled confirm is false");

    // While streaming, an extension command runs at once.
    let gate = Gate::new();
    pi.model.reply_to("long", Reply::echo().gated(&gate));
    p.ok(json!({"type": "prompt", "message": "long"})).await;
    pi.model.wait_request(1, Outcome::Held, WAIT).await;
    p.ok(json!({"type": "prompt", "message": "/notice mid-turn"})).await;
    assert_eq!(
        pi.model.requests()[0].outcome,
        Outcome::Held,
        "the command ran inside the turn"
    );
    assert!(
        p.seen
            .iter()
            .any(|l| l["method"] == "notify" && l["message"] == "mid-turn")
    );
    gate.release();
    p.next_of("agent_end").await;
    assert_eq!(
        pi.model.requests().len(),
        1,
        "extension commands never called the model"
    );
    p.kill().await;
}
