//! `berth agents check`: each configured profile's agent started as a launch would start it (the same
//! command, arguments and environment), asked who it is (`crate::agent::about`), and stopped. A protocol
//! without a handshake: the check proves the command starts and lives.
//!
//! The agent runs in an empty directory of its own, removed afterwards; nothing is recorded anywhere.
use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

use super::agent_process;
use crate::agent::about::{self, Facts};
use crate::agent::{Reply, Wire};
use crate::config::AgentProfile;

/// Starts the agent of `profile`, asks it who it is within `within`, and stops it.
pub async fn check(profile: &AgentProfile, within: Duration) -> Result<Facts, String> {
    let dir = std::env::temp_dir().join(format!("berth-agents-check-{}", uuid::Uuid::now_v7()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let result = run(profile, &dir, within).await;
    let _ = std::fs::remove_dir_all(&dir);
    result
}

async fn run(profile: &AgentProfile, dir: &std::path::Path, within: Duration) -> Result<Facts, String> {
    let mut process = agent_process(profile);
    process
        .args(Wire::launch_args(profile.protocol, &dir.join("conversation.jsonl")))
        .current_dir(dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    let mut child = process
        .spawn()
        .map_err(|e| format!("cannot start `{}`: {e}", profile.command))?;
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
