//! The README's example agent for the JSON-lines protocol ("A complete agent") is run as the README
//! gives it: the shell script is read out of README.md, run as a `jsonl` profile, prompted, and its
//! answer must reach the transcript with the session back to `idle`. If the README changes the script,
//! this runs the new one.
use std::collections::BTreeMap;

use crate::both_backends;
use crate::helpers::{TestApp, seen_json, wait_until};
use crate::pi::{uuid, wait_session};

both_backends!(the_readmes_example_agent_runs);

/// The shell block that follows "A complete agent:" in README.md.
fn example_script() -> String {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let after = readme
        .split_once("A complete agent:")
        .expect("README.md has the JSON-lines example agent")
        .1;
    let block = after.split_once("```sh\n").expect("a sh block follows").1;
    block.split_once("```").expect("the block ends").0.to_string()
}

async fn the_readmes_example_agent_runs(app: TestApp) {
    let backend = app.backend;
    drop(app);
    let dir = tempfile::TempDir::new().unwrap();
    let script = dir.path().join("agent.sh");
    std::fs::write(&script, example_script()).unwrap();
    let profile = berth::config::AgentProfile {
        command: "sh".into(),
        args: vec![script.display().to_string()],
        env: BTreeMap::new(),
        ..Default::default()
    };
    let Some(app) = TestApp::spawn_with_profiles(backend, &[], vec![("example".into(), profile)]).await else {
        return;
    };
    let f = app.task_with_repo("Example").await;
    let s = f.agent_prompted("example", "hi").await;
    let id = uuid(&s["id"]);
    let within = std::time::Duration::from_secs(30);
    let snap = wait_until("the example agent's answer", within, || async {
        let snap = app.get(&format!("/api/v1/sessions/{id}/snapshot")).await.ok(200);
        let answered = snap["state"] == "idle" && snap["transcript"].as_array().is_some_and(|t| t.len() == 2);
        seen_json(answered, snap)
    })
    .await;
    let answer = &snap["transcript"][1];
    assert_eq!(answer["role"], "assistant", "{snap}");
    assert_eq!(answer["content"]["content"][0]["text"], "hello", "{snap}");
    assert_eq!(snap["statistics"]["turns"], 1, "{snap}");
    wait_session(&app, id, "idle", |s| s["state"] == "idle").await;
}
