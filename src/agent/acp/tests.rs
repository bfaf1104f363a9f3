//! The ACP wire, line by line.
use super::*;

fn opened() -> Wire {
    let mut w = Wire::new(true, &[]);
    w.encode(&Command::NewConversation { cwd: "/w".into() }, "berth-n".into())
        .unwrap();
    let d = w.decode(json!({"jsonrpc": "2.0", "id": "berth-n", "result": {"sessionId": "c1",
        "modes": {"currentModeId": "ask", "availableModes": [{"id": "ask", "name": "Ask"}]}}}));
    assert_eq!(
        d.reply.as_ref().unwrap().1,
        Reply::Ok(json!({"sessionId": "c1",
        "modes": {"currentModeId": "ask", "availableModes": [{"id": "ask", "name": "Ask"}]}}))
    );
    assert!(matches!(&d.signals[..], [Signal::Notice(Notice::Learned(f))] if f["mode"] == "ask"));
    w
}

fn update(u: Value) -> Value {
    json!({"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": "c1", "update": u}})
}

#[test]
fn a_prompt_starts_a_turn_and_its_answer_settles_it_with_the_text() {
    let mut w = opened();
    let out = w.encode(&Command::Prompt("hi".into()), "berth-p".into()).unwrap();
    assert_eq!(out.awaits, None, "delivered once written");
    assert_eq!(out.signals, [Signal::TurnStarted]);
    assert_eq!(out.lines[0]["method"], "session/prompt");
    assert_eq!(out.lines[0]["params"]["sessionId"], "c1");
    for piece in ["Hel", "lo"] {
        let d = w.decode(update(
            json!({"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": piece}}),
        ));
        assert_eq!(d.delta.unwrap().text, piece);
        assert!(d.record.is_none());
    }
    let d = w.decode(json!({"jsonrpc": "2.0", "id": "berth-p", "result": {"stopReason": "end_turn"}}));
    assert!(d.reply.is_none());
    assert_eq!(
        d.record,
        Some(json!({"id": "berth-p", "result": {"stopReason": "end_turn"}}))
    );
    assert!(d.signals.contains(&Signal::TurnSettled {
        stop_reason: Some("end_turn".into())
    }));
    assert!(
        d.signals
            .iter()
            .any(|s| matches!(s, Signal::Assistant(m) if m["content"][0]["text"] == "Hello"))
    );
}

#[test]
fn replayed_history_outside_a_turn_is_not_recorded() {
    let mut w = opened();
    let d = w.decode(update(
        json!({"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "old"}}),
    ));
    assert!(d.record.is_none() && d.delta.is_none() && d.signals.is_empty());
    let d = w.decode(update(
        json!({"sessionUpdate": "user_message_chunk", "content": {"type": "text", "text": "old"}}),
    ));
    assert!(d.record.is_none());
    let d = w.decode(update(
        json!({"sessionUpdate": "tool_call", "toolCallId": "t", "title": "x", "status": "completed"}),
    ));
    assert!(d.record.is_none());
    // State is state, whenever it comes.
    let d = w.decode(update(
        json!({"sessionUpdate": "available_commands_update", "availableCommands": [{"name": "init"}]}),
    ));
    assert!(d.record.is_some());
}

#[test]
fn permissions_are_questions_answered_by_option_and_cancelled_by_abort() {
    let mut w = opened();
    w.encode(&Command::Prompt("write".into()), "berth-p".into()).unwrap();
    let d = w.decode(json!({"jsonrpc": "2.0", "id": 7, "method": "session/request_permission", "params": {
        "sessionId": "c1", "toolCall": {"toolCallId": "t1", "title": "Write hello.txt"},
        "options": [{"optionId": "allow", "name": "Allow", "kind": "allow_once"}, {"optionId": "no", "name": "Reject", "kind": "reject_once"}]}}));
    let Signal::Question { request, .. } = &d.signals[0] else {
        panic!("{:?}", d.signals)
    };
    assert_eq!(request["id"], "7");
    assert!(fits(request, &Answer::Option("allow".into())).is_ok());
    assert!(fits(request, &Answer::Option("maybe".into())).is_err());
    assert!(fits(request, &Answer::Value("allow".into())).is_err());
    let out = w
        .encode(
            &Command::Answer {
                request_id: "7".into(),
                answer: Answer::Option("allow".into()),
            },
            "x".into(),
        )
        .unwrap();
    assert_eq!(
        out.lines[0],
        json!({"jsonrpc": "2.0", "id": 7, "result": {"outcome": {"outcome": "selected", "optionId": "allow"}}})
    );
    // A second question, then an abort: cancelled as the protocol requires.
    w.decode(json!({"jsonrpc": "2.0", "id": 8, "method": "session/request_permission", "params": {"options": []}}));
    let out = w.encode(&Command::Abort, "y".into()).unwrap();
    assert_eq!(out.lines[0]["method"], "session/cancel");
    assert_eq!(
        out.lines[1],
        json!({"jsonrpc": "2.0", "id": 8, "result": {"outcome": {"outcome": "cancelled"}}})
    );
    assert_eq!(out.signals, [Signal::QuestionsCleared]);
}

#[test]
fn steering_is_refused_and_unknown_requests_are_answered_not_offered() {
    let mut w = opened();
    assert_eq!(
        w.encode(&Command::Steer("x".into()), "s".into()).unwrap_err(),
        Unsupported::Steer
    );
    let d = w.decode(json!({"jsonrpc": "2.0", "id": 3, "method": "terminal/create", "params": {}}));
    assert_eq!(d.send[0]["error"]["code"], -32601);
    let d = w.decode(json!({"jsonrpc": "2.0", "id": 4, "method": "fs/write_text_file", "params": {"path": "/w/a", "content": "secret"}}));
    assert!(d.serve.is_some());
    assert_eq!(
        d.record.unwrap()["params"],
        json!({"path": "/w/a"}),
        "the content is not recorded"
    );
}

#[test]
fn coalesced_chunks_render_in_the_agents_shape() {
    let mut w = opened();
    w.encode(&Command::Prompt("hi".into()), "p".into()).unwrap();
    let d = w.decode(update(
        json!({"sessionUpdate": "agent_thought_chunk", "messageId": "m", "content": {"type": "text", "text": "a"}}),
    ));
    let delta = d.delta.unwrap();
    assert_eq!(
        render(&delta.run, "abc", 3),
        json!({"method": "session/update", "params": {"sessionId": "c1", "update": {"sessionUpdate": "agent_thought_chunk",
            "messageId": "m", "content": {"type": "text", "text": "abc"}}}, "coalesced": 3})
    );
    // A chunk with more than text is recorded as it came.
    let d = w.decode(update(
        json!({"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "a", "annotations": {}}}),
    ));
    assert!(d.delta.is_none() && d.record.is_some());
}

fn introduced(w: &mut Wire, meta: Value) {
    w.encode(&Command::Initialize, "berth-i".into()).unwrap();
    w.decode(json!({"id": "berth-i", "result": {"protocolVersion": 1, "agentCapabilities": {}, "_meta": meta}}));
}

#[test]
fn a_steer_goes_out_only_to_an_agent_that_advertised_the_extension() {
    let mut plain = opened();
    introduced(&mut plain, json!({}));
    assert!(matches!(
        plain.encode(&Command::Steer("s".into()), "berth-s".into()),
        Err(Unsupported::Steer)
    ));

    let mut w = opened();
    introduced(&mut w, json!({"steering": {"supported": true}}));
    w.encode(&Command::Prompt("go".into()), "berth-p".into()).unwrap();
    let out = w.encode(&Command::Steer("s".into()), "berth-s".into()).unwrap();
    assert_eq!(out.awaits.as_deref(), Some("berth-s"));
    assert_eq!(out.lines[0]["method"], "_session/steering");
    assert_eq!(out.lines[0]["params"]["prompt"][0]["text"], "s");
    assert_eq!(
        out.lines[0]["params"]["_meta"]["steering"]["idleBehavior"], "promptRequired",
        "berth, not the agent, starts a turn for a steer that finds none"
    );
    let d = w.decode(json!({"id": "berth-s", "result": {"outcome": "injected"}}));
    assert_eq!(
        d.reply,
        Some(("berth-s".into(), Reply::Ok(json!({"outcome": "injected"}))))
    );
    assert!(d.record.is_some(), "the agent's answer is recorded");

    // No turn to steer: berth keeps the message for the next prompt.
    w.encode(&Command::Steer("late".into()), "berth-l".into()).unwrap();
    let d = w.decode(json!({"id": "berth-l", "result": {"outcome": "promptRequired", "reason": "noRunningTurn"}}));
    assert_eq!(d.reply, Some(("berth-l".into(), Reply::Busy)));
    w.encode(&Command::Steer("x".into()), "berth-x".into()).unwrap();
    let d = w.decode(json!({"id": "berth-x", "result": {"outcome": "failed"}}));
    assert!(matches!(d.reply, Some((_, Reply::Refused { .. }))));
}

#[test]
fn the_turns_tool_calls_are_kept_with_status_and_paths_and_cleared_by_the_next_prompt() {
    let mut w = opened();
    w.encode(&Command::Prompt("go".into()), "berth-p".into()).unwrap();
    let tools = |d: &Inbound| {
        d.signals.iter().find_map(|s| match s {
            Signal::Notice(Notice::Learned(f)) => f.get("tool_calls").cloned(),
            _ => None,
        })
    };
    let d = w.decode(update(
        json!({"sessionUpdate": "tool_call", "toolCallId": "t1", "title": "Write a.txt",
        "kind": "edit", "status": "pending", "locations": [{"path": "/w/a.txt"}]}),
    ));
    assert_eq!(
        tools(&d),
        Some(json!([{"id": "t1", "title": "Write a.txt", "kind": "edit", "status": "pending", "paths": ["/w/a.txt"]}]))
    );
    let d = w.decode(update(
        json!({"sessionUpdate": "tool_call_update", "toolCallId": "t1", "status": "completed"}),
    ));
    assert_eq!(tools(&d).unwrap()[0]["status"], "completed");
    assert_eq!(
        tools(&d).unwrap()[0]["paths"],
        json!(["/w/a.txt"]),
        "an update keeps what it does not name"
    );
    let d = w.decode(update(
        json!({"sessionUpdate": "tool_call_update", "toolCallId": "t1", "status": "completed"}),
    ));
    assert_eq!(tools(&d), None, "nothing changed, nothing learned");
    w.decode(json!({"id": "berth-p", "result": {"stopReason": "end_turn"}}));
    let out = w.encode(&Command::Prompt("again".into()), "berth-q".into()).unwrap();
    assert!(
        out.signals
            .iter()
            .any(|s| matches!(s, Signal::Notice(Notice::Learned(f)) if f["tool_calls"] == json!([]))),
        "a new turn starts with no tool calls shown"
    );
}
