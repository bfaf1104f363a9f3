//! Review comments go back to the agent. A review's comments are checked against the environment's
//! diff (a line the diff does not show is 422 naming the comment's field, and nothing is stored or
//! sent); a review sent to a session reaches its agent as one message quoting each commented line with
//! its file and number, and names the review; reading the diff for it changed nothing in the worktree,
//! its index, the stash or any branch.
use std::path::PathBuf;

use serde_json::{Value, json};

use crate::both_backends;
use crate::fixture::StartedSession;
use crate::helpers::TestApp;

both_backends!(a_review_is_checked_against_the_diff_and_reaches_the_agent);

async fn a_review_is_checked_against_the_diff_and_reaches_the_agent(app: TestApp) {
    let f = app.task_with_repo_in("reviews", "svc", "Reviewed").await;
    let repo = f.repository;
    let StartedSession { id, created: s, .. } = f.started_session("test").await;
    let env = s["task_environment_id"].as_str().unwrap().to_string();
    let wt = PathBuf::from(s["workspace_path"].as_str().unwrap());
    app.post(
        &format!("/api/v1/sessions/{id}/messages"),
        json!({"text": "write notes.txt one\ntwo\nthree\n"}),
    )
    .await
    .ok(202);
    crate::turns::wait_turns(&app, id, 1).await;
    // The person's own change to a tracked file: a line it removed is commented on its old side.
    std::fs::write(wt.join("README.md"), "hello again\n").unwrap();
    let before = crate::turns::kept(&wt);
    let reviews = format!("/api/v1/environments/{env}/reviews");
    let comment = |path: &str, line: u32, side: &str| json!({"repository_id": repo, "path": path, "line": line, "side": side, "body": "why?"});

    // Refused, naming the field, and nothing stored or sent.
    let refused = [
        (json!({"body": "  "}), "body"),
        (
            json!({"body": "x", "comments": [comment("notes.txt", 2, "new"), comment("notes.txt", 9, "new")]}),
            "comments[1].line",
        ),
        (
            json!({"body": "x", "comments": [comment("notes.txt", 1, "old")]}),
            "comments[0].line",
        ),
        (
            json!({"body": "x", "comments": [comment("src/nowhere.rs", 1, "new")]}),
            "comments[0].path",
        ),
        (
            json!({"body": "x", "comments": [{"repository_id": uuid::Uuid::now_v7(), "path": "notes.txt", "line": 1, "side": "new", "body": "b"}]}),
            "comments[0].repository_id",
        ),
        (
            json!({"body": "x", "comments": [{"repository_id": repo, "path": "notes.txt", "line": 1, "side": "new", "body": ""}]}),
            "comments[0].body",
        ),
    ];
    for (body, field) in refused {
        let mut body = body;
        body["session_id"] = json!(id);
        let p = app.post(&reviews, body).await.problem(422, "validation_failed");
        assert_eq!(p["errors"][0]["field"], field, "{p}");
    }
    app.post(&reviews, json!({"body": "x", "session_id": uuid::Uuid::now_v7()}))
        .await
        .problem(404, "not_found");
    assert_eq!(app.get(&reviews).await.ok(200)["items"], json!([]));
    let inbox = app.get(&format!("/api/v1/sessions/{id}/messages")).await.ok(200);
    assert_eq!(
        inbox["items"].as_array().unwrap().len(),
        1,
        "only the first prompt: {inbox}"
    );

    // Stored, and sent to the session as one message.
    let r = app
        .post(
            &reviews,
            json!({
                "body": "Nearly there.",
                "session_id": id,
                "comments": [
                    {"repository_id": repo, "path": "notes.txt", "line": 2, "side": "new", "body": "say 2, not two"},
                    {"repository_id": repo, "path": "README.md", "line": 1, "side": "old", "body": "keep the greeting"},
                ],
            }),
        )
        .await
        .ok(201);
    let review = r["id"].as_str().unwrap().to_string();
    assert_eq!(r["comments"][0]["quote"], "two", "{r}");
    assert_eq!(r["comments"][1]["quote"], "hello", "{r}");
    assert!(r["message_id"].is_string(), "{r}");
    assert_eq!(
        crate::turns::kept(&wt),
        before,
        "reading the diff left the index, the stash and the branches as they were"
    );
    assert_eq!(std::fs::read_to_string(wt.join("README.md")).unwrap(), "hello again\n");

    // The agent had it as its next prompt, naming each file and line, and the review.
    let turns = crate::turns::wait_turns(&app, id, 2).await;
    let prompt = turns["items"][1]["prompt"].as_str().unwrap();
    assert!(prompt.contains("Nearly there."), "{prompt}");
    assert!(prompt.contains("notes.txt line 2:\n> two\nsay 2, not two"), "{prompt}");
    assert!(
        prompt.contains("README.md line 1 (before your change):\n> hello\nkeep the greeting"),
        "{prompt}"
    );
    assert!(prompt.contains(&format!("{reviews}/{review}")), "{prompt}");
    let inbox = app.get(&format!("/api/v1/sessions/{id}/messages")).await.ok(200);
    let sent = inbox["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["id"] == r["message_id"])
        .cloned()
        .unwrap_or(Value::Null);
    assert_eq!(sent["state"], "delivered", "{inbox}");

    // Listed, and found by the path the message names.
    let list = app.get(&reviews).await.ok(200);
    assert_eq!(list["items"].as_array().unwrap().len(), 1);
    assert_eq!(list["items"][0]["comments"][0]["path"], "notes.txt");
    let one = app.get(&format!("{reviews}/{review}")).await.ok(200);
    assert_eq!(one["body"], "Nearly there.");
    app.get(&format!("{reviews}/{}", uuid::Uuid::now_v7()))
        .await
        .problem(404, "not_found");
    let events = app.get("/api/v1/events?types=review.created").await.ok(200);
    let events = events["events"].as_array().unwrap();
    assert_eq!(events.len(), 1);
    assert_eq!(events[0]["data"]["review_id"], json!(review));
    assert_eq!(events[0]["data"]["comments"], 2);

    // A review kept for later (no session) needs no running agent, and is not sent.
    let kept = app.post(&reviews, json!({"body": "for the record"})).await.ok(201);
    assert!(kept["message_id"].is_null());
}
