//! `berth agents check` starts every configured profile's agent as a launch would, asks
//! it who it is and prints the answer: for a real agent (opencode) its name, version, capabilities and
//! auth methods; an agent wanting a login still introduces itself with its methods; a command that does
//! not start, or an agent that quits without answering, fails the check and the exit code says so.
use std::process::Command;

use tempfile::TempDir;

use super::{Agent, Kind, hostile};
use crate::helpers::code_and_text;

/// One `[agents.<name>]` table as an operator writes it.
fn table(profile: &berth::config::AgentProfile) -> toml::Table {
    let mut t = toml::Table::new();
    t.insert("command".into(), profile.command.clone().into());
    t.insert("args".into(), profile.args.clone().into());
    let env: toml::Table = profile.env.iter().map(|(k, v)| (k.clone(), v.clone().into())).collect();
    t.insert("env".into(), env.into());
    t.insert("protocol".into(), "acp".into());
    if let Some(fs_read) = profile.fs_read {
        t.insert("fs_read".into(), fs_read.into());
    }
    t.insert("endpoints".into(), profile.endpoints.clone().into());
    let writable: Vec<String> = profile.writable_paths.iter().map(|p| p.display().to_string()).collect();
    t.insert("writable_paths".into(), writable.into());
    t
}

fn check(dir: &TempDir, args: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_berth"))
        .args(["agents", "check", "--timeout", "120s"])
        .args(args)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("BERTH_CONFIG", dir.path().join("berth.toml"))
        .env("BERTH_DATA_DIR", dir.path().join("data"))
        .output()
        .unwrap();
    code_and_text(out)
}

#[tokio::test]
async fn agents_check_introduces_each_profile_and_fails_for_a_broken_one() {
    let Some(opencode) = Agent::start(Kind::Opencode).await else {
        return;
    };
    let dir = TempDir::new().unwrap();
    let mut agents = toml::Table::new();
    agents.insert("opencode".into(), table(&opencode.profile()).into());
    agents.insert("wants-login".into(), table(&hostile::profile(true)).into());
    let missing = berth::config::AgentProfile {
        command: "/nonexistent/agent".into(),
        ..Default::default()
    };
    agents.insert("missing".into(), table(&missing).into());
    let quits = berth::config::AgentProfile {
        // Reads the question, then quits without a word.
        command: "sh".into(),
        args: vec!["-c".into(), "read line; exit 3".into()],
        ..Default::default()
    };
    agents.insert("quits".into(), table(&quits).into());
    let mut config = toml::Table::new();
    config.insert("agents".into(), agents.into());
    std::fs::write(dir.path().join("berth.toml"), config.to_string()).unwrap();

    let (code, out) = check(&dir, &[]);
    assert_eq!(code, 1, "one failed profile fails the check:\n{out}");
    assert!(out.contains("opencode: ok\n"), "{out}");
    assert!(out.contains("  protocol: acp, version 1\n"), "{out}");
    assert!(out.contains("  name: OpenCode\n"), "{out}");
    assert!(
        out.contains(&format!("  version: {}\n", Kind::Opencode.pinned())),
        "{out}"
    );
    assert!(out.contains("  capabilities: {"), "{out}");
    assert!(out.contains("loadSession"), "{out}");
    // What its box allows, as the profile says.
    assert!(out.contains("  box: bubblewrap: own mount, PID"), "{out}");
    assert!(
        out.contains(&format!(
            "  network: its own; endpoints: {}\n",
            opencode.model.endpoint()
        )),
        "{out}"
    );
    assert!(out.contains("wants-login: ok\n"), "{out}");
    assert!(out.contains("  auth methods: hostile-key (Hostile key)\n"), "{out}");
    assert!(
        out.contains("missing: FAILED\n  cannot start `/nonexistent/agent`"),
        "{out}"
    );
    assert!(
        out.contains("quits: FAILED\n  the agent exited before answering (exit status: 3)"),
        "{out}"
    );

    let (code, out) = check(&dir, &["--profile", "opencode", "--profile", "wants-login"]);
    assert_eq!(code, 0, "the profiles asked for are fine:\n{out}");
    assert!(
        !out.contains("missing"),
        "only the profiles asked for are checked:\n{out}"
    );

    let (code, out) = check(&dir, &["--profile", "nope"]);
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("--profile nope: no such profile"), "{out}");
}
