//! `berth agents check`: each configured profile's agent started as a launch would start it (the same
//! command, arguments and environment), asked who it is (`crate::agent::about`), and stopped. A protocol
//! without a handshake: the check proves the command starts and lives.
//!
//! The agent runs in an empty directory of its own, removed afterwards; nothing is recorded anywhere.
use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

use super::sandbox::{Agent, Boxes, Held};
use super::{agent_env, agent_process};
use crate::agent::about::{self, Facts};
use crate::agent::{Reply, Wire};
use crate::config::AgentProfile;
use crate::config::{NetworkMode, SandboxMode};
use crate::ids::{ExecutionId, SessionId};

/// Starts the agent of `profile` in its box (as a launch would), asks it who it is within `within`, and
/// stops it; the facts end with what its box allows.
pub async fn check(profile: &AgentProfile, within: Duration, boxes: &Boxes) -> Result<Facts, String> {
    let dir = std::env::temp_dir().join(format!("berth-agents-check-{}", uuid::Uuid::now_v7()));
    let work = dir.join("work");
    std::fs::create_dir_all(&work).map_err(|e| format!("cannot create {}: {e}", work.display()))?;
    let result = run(profile, &dir, &work, within, boxes).await;
    let _ = std::fs::remove_dir_all(&dir);
    let mut facts = result?;
    facts.extend(allowed(profile, boxes));
    Ok(facts)
}

/// What the profile's box allows, as `berth agents check` prints it.
fn allowed(profile: &AgentProfile, boxes: &Boxes) -> Facts {
    if profile.sandbox == SandboxMode::None {
        return vec![(
            "box",
            "none (sandbox = \"none\"): the agent can read and write whatever berth's user can".into(),
        )];
    }
    let list = |items: &[String]| {
        if items.is_empty() {
            "none".to_string()
        } else {
            items.join(", ")
        }
    };
    let mut facts: Facts = vec![(
        "box",
        "bubblewrap: own mount, PID, IPC, UTS, user and cgroup namespaces; no capabilities; no_new_privs; seccomp"
            .into(),
    )];
    facts.push((
        "network",
        match profile.network {
            NetworkMode::Host => "host (network = \"host\"): every address berth can reach".into(),
            NetworkMode::Box => format!("its own; endpoints: {}", list(&profile.endpoints)),
        },
    ));
    facts.push((
        "home files",
        list(&[profile.home_files.clone(), profile.home_files_writable.clone()].concat()),
    ));
    let paths = |ps: &[std::path::PathBuf]| ps.iter().map(|p| p.display().to_string()).collect::<Vec<_>>();
    facts.push(("read-only paths", list(&paths(&profile.read_only_paths))));
    facts.push(("writable paths", list(&paths(&profile.writable_paths))));
    for line in boxes.describe() {
        let (label, value) = line.split_once(": ").unwrap_or(("box", &line));
        facts.push((if label == "limits" { "limits" } else { "tool" }, value.to_string()));
    }
    facts
}

async fn run(
    profile: &AgentProfile,
    dir: &std::path::Path,
    work: &std::path::Path,
    within: Duration,
    boxes: &Boxes,
) -> Result<Facts, String> {
    let mut profile = profile.clone();
    profile
        .args
        .extend(Wire::launch_args(profile.protocol, &work.join("conversation.jsonl")));
    let profile = &profile;
    let (mut process, mut held) = match profile.sandbox {
        SandboxMode::Bwrap => boxes
            .boxed(
                Agent {
                    profile,
                    session_id: SessionId::now_v7(),
                    execution_id: ExecutionId::now_v7(),
                    cwd: work,
                    trees: &[],
                    conversation: None,
                    dir: Some(dir.join("box")),
                    refused: None,
                },
                agent_env(profile),
            )
            .map_err(|e| format!("cannot start `{}`: {e}", profile.command))?,
        SandboxMode::None => (agent_process(profile), Held::default()),
    };
    process
        .current_dir(work)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    let child = process.spawn();
    held.filter = None;
    let mut child = child.map_err(|e| format!("cannot start `{}`: {e}", profile.command))?;
    let pgid = child.id().unwrap_or_default();
    let mut stderr = child.stderr.take().expect("piped stderr");
    let tail = tokio::spawn(async move {
        let mut all = Vec::new();
        let _ = stderr.read_to_end(&mut all).await;
        let start = all.len().saturating_sub(2048);
        String::from_utf8_lossy(&all[start..]).trim().to_string()
    });
    let asked = ask(profile, &mut child, within).await;
    super::orphans::signal_group(pgid, libc::SIGKILL);
    let _ = child.wait().await;
    let tail = tail.await.unwrap_or_default();
    asked.map_err(|e| {
        if tail.is_empty() {
            e
        } else {
            format!("{e}; its stderr ends:\n{tail}")
        }
    })
}

async fn ask(profile: &AgentProfile, child: &mut tokio::process::Child, within: Duration) -> Result<Facts, String> {
    let mut wire = Wire::for_profile(profile);
    let Some(command) = about::question(profile.protocol) else {
        // No handshake: the command must start and still be running a moment later (its stdin kept
        // open: `wait` would close it).
        let _stdin = child.stdin.take();
        return match tokio::time::timeout(Duration::from_millis(500), child.wait()).await {
            Ok(status) => Err(format!("the agent exited at once ({})", describe(status))),
            Err(_) => Ok(about::started(profile.protocol)),
        };
    };
    let id = "berth-check".to_string();
    let outgoing = wire
        .encode(&command, id.clone())
        .map_err(|_| "the protocol has no way to ask".to_string())?;
    let mut stdin = child.stdin.take().expect("piped stdin");
    for line in &outgoing.lines {
        let bytes = format!("{line}\n");
        stdin
            .write_all(bytes.as_bytes())
            .await
            .map_err(|e| format!("cannot write to the agent: {e}"))?;
    }
    let _ = stdin.flush().await;
    let mut stdout = BufReader::new(child.stdout.take().expect("piped stdout")).lines();
    let answer = tokio::time::timeout(within, async {
        while let Some(line) = stdout
            .next_line()
            .await
            .map_err(|e| format!("cannot read the agent: {e}"))?
        {
            let Ok(value) = serde_json::from_str::<Value>(&line) else {
                continue;
            };
            if let Some((answered, reply)) = wire.decode(value).reply
                && answered == id
            {
                return Ok(reply);
            }
        }
        Err(format!(
            "the agent exited before answering ({})",
            describe(child.wait().await)
        ))
    })
    .await
    .map_err(|_| format!("no answer within {}s", within.as_secs()))??;
    drop(stdin);
    match answer {
        Reply::Ok(result) => Ok(about::facts(profile.protocol, &result)),
        Reply::Refused { reason, code } => Err(match code {
            Some(code) => format!("the agent refused ({code}): {reason}"),
            None => format!("the agent refused: {reason}"),
        }),
        Reply::Busy => Err("the agent answered busy".into()),
    }
}

fn describe(status: std::io::Result<std::process::ExitStatus>) -> String {
    match status {
        Ok(s) => s.to_string(),
        Err(e) => e.to_string(),
    }
}
