//! The compose deployment's agent side, outside a container (.ci/deploy-check covers the files
//! themselves): the `deploy/berth.toml` compose mounts loads and has the `pi` profile, and a profile's
//! `pass_env` hands exactly the named variables of berth's environment to the agent, so model credentials
//! come from the operator's environment and are never written into the file.
use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::json;
use uuid::Uuid;

use crate::helpers::{Backend, TestApp, seen, uuid, wait_until_every};

const WAIT: Duration = Duration::from_secs(30);

#[test]
fn the_compose_configuration_loads_with_a_pi_profile() {
    let data = tempfile::TempDir::new().unwrap();
    let file = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/berth.toml");
    let env: BTreeMap<String, String> = [
        ("BERTH_CONFIG".to_string(), file.display().to_string()),
        ("BERTH_DATA_DIR".to_string(), data.path().display().to_string()),
    ]
    .into_iter()
    .collect();
    let config = berth::config::Config::load(&env).expect("deploy/berth.toml loads");
    let pi = config.agents.get("pi").expect("a pi profile");
    assert_eq!(pi.command, "pi");
    assert_eq!(pi.protocol, berth::config::AgentProtocol::Pi);
    assert!(pi.pass_env.iter().any(|k| k == "ANTHROPIC_API_KEY"));
    assert!(pi.env.keys().all(|k| !k.contains("KEY")), "no credential in the file");
}

async fn reply(app: &TestApp, session: Uuid, n: usize) -> String {
    let replies = wait_until_every(&format!("reply #{n}"), WAIT, Duration::from_millis(20), || async {
        let replies = crate::agents::replies(app, session).await;
        seen(replies.len() >= n, replies)
    })
    .await;
    replies[n - 1].clone()
}

async fn pass_env_reaches_the_agent(backend: Backend) {
    // Variables cargo sets for the test process: one the profile passes, one it does not.
    let passed = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    assert!(std::env::var("CARGO_PKG_NAME").is_ok(), "cargo sets CARGO_PKG_NAME");
    let agent = std::path::Path::new(env!("CARGO_BIN_EXE_berth-test-agent"))
        .display()
        .to_string();
    let profile = berth::config::AgentProfile {
        command: agent,
        pass_env: vec!["CARGO_MANIFEST_DIR".into(), "BERTH_NEVER_SET_ANYWHERE".into()],
        ..Default::default()
    };
    let Some(app) = TestApp::spawn_with_profiles(backend, &[], vec![("passer".into(), profile)]).await else {
        return;
    };
    let f = app.task_with_repo("Pass").await;
    let s = f.agent_prompted("passer", "env CARGO_MANIFEST_DIR").await;
    let id = uuid(&s["id"]);
    assert_eq!(reply(&app, id, 1).await, passed, "a passed variable reaches the agent");
    app.post(
        &format!("/api/v1/sessions/{id}/messages"),
        json!({"text": "env CARGO_PKG_NAME"}),
    )
    .await
    .ok(202);
    assert_eq!(reply(&app, id, 2).await, "", "an unlisted variable does not");
    app.post(&format!("/api/v1/sessions/{id}/stop"), json!({}))
        .await
        .ok(200);
}

crate::backend_tests!(pass_env_reaches_the_agent: pass_env_reaches_the_agent_sqlite, pass_env_reaches_the_agent_postgres);
