//! A Pi session's conversation (seed 002 "Identity"): berth keeps it in a file of its own per session,
//! under its data directory, hands that exact file back on every relaunch, and never lets the agent
//! substitute another one. The agent's own identity of it (`sessionId`) is recorded as the session's
//! `agent_session_ref` once the file exists.
use std::io::{BufRead, Read};
use std::path::PathBuf;
use std::time::Duration;

use serde_json::{Value, json};
use uuid::Uuid;

use super::Ctx;
use crate::config::{AgentProfile, AgentProtocol};
use crate::entity::task_session as session;
use crate::error::{ConversationCategory, Result};
use crate::store::sessions as store;

/// How long berth waits for the agent to answer one of its questions about itself.
const ASK: Duration = Duration::from_secs(30);
/// The notifications a snapshot keeps, newest last.
const NOTIFICATIONS_KEPT: usize = 20;

/// The protocol of the session's agent profile (`jsonl` when it has none, or it is gone).
pub(super) fn protocol_of(ctx: &Ctx, s: &session::Model) -> AgentProtocol {
    s.agent_profile
        .as_ref()
        .and_then(|name| ctx.config.agents.get(name))
        .map(|p| p.protocol)
        .unwrap_or_default()
}

/// The directory of conversations (owner-only: they hold everything said to and by the agents).
fn dir(ctx: &Ctx) -> PathBuf {
    ctx.config.data_dir.join("conversations")
}

/// The one file a session's conversation lives in; derived from the session id, never from a stored path.
pub(super) fn file(ctx: &Ctx, session_id: Uuid) -> PathBuf {
    dir(ctx).join(format!("{session_id}.jsonl"))
}

/// The profile to spawn: for Pi, its arguments plus the session's own conversation file.
pub(super) fn launch_profile(ctx: &Ctx, profile: &AgentProfile, session_id: Uuid) -> Result<AgentProfile> {
    let mut profile = profile.clone();
    if profile.protocol == AgentProtocol::Pi {
        let dir = dir(ctx);
        std::fs::create_dir_all(&dir).map_err(|e| crate::error::Error::Internal(e.into()))?;
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))
            .map_err(|e| crate::error::Error::Internal(e.into()))?;
        profile.args.push("--session".into());
        profile.args.push(file(ctx, session_id).display().to_string());
    }
    Ok(profile)
}

/// Whether a relaunch may continue the session's recorded conversation: its file is there, is that
/// conversation, and no other live session holds it. A session with nothing recorded starts one.
pub(super) async fn check(
    ctx: &Ctx,
    profile: &AgentProfile,
    s: &session::Model,
) -> Result<Option<ConversationCategory>> {
    if profile.protocol != AgentProtocol::Pi {
        return Ok(None);
    }
    let Some(recorded) = s.agent_session_ref.as_deref() else {
        return Ok(None);
    };
    let path = file(ctx, s.id);
    let recorded_id = recorded.to_string();
    let on_disk = tokio::task::spawn_blocking(move || header_of(&path, &recorded_id))
        .await
        .map_err(|e| crate::error::Error::Internal(e.into()))?;
    if let Some(category) = on_disk {
        return Ok(Some(category));
    }
    if store::holding_conversation(&ctx.db.conn, s.id, recorded).await? > 0 {
        return Ok(Some(ConversationCategory::Leased));
    }
    Ok(None)
}

/// `None` when the file's header names the recorded conversation.
fn header_of(path: &std::path::Path, recorded: &str) -> Option<ConversationCategory> {
    let f = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Some(ConversationCategory::Missing),
        Err(_) => return Some(ConversationCategory::Corrupt),
    };
    let mut first = String::new();
    let mut reader = std::io::BufReader::new(f.take(64 * 1024));
    if reader.read_line(&mut first).is_err() {
        return Some(ConversationCategory::Corrupt);
    }
    match serde_json::from_str::<Value>(first.trim_end()) {
        Ok(h) if h["type"] == "session" && h["id"] == recorded => None,
        _ => Some(ConversationCategory::Corrupt),
    }
}

/// Removes a deleted session's conversation (conversations are session data; worktrees are not).
pub(crate) async fn remove(ctx: &Ctx, session_id: Uuid) {
    let path = file(ctx, session_id);
    match tokio::fs::remove_file(&path).await {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => tracing::warn!(session = %session_id, error = %e, "could not remove a conversation file"),
    }
}

/// Asks a Pi agent who it is (`get_state`), and with `full` what it offers (`get_commands`,
/// `get_available_models`); records the conversation's identity once its file exists, and the rest for
/// snapshots.
pub(super) async fn learn(ctx: &Ctx, session_id: Uuid, full: bool) -> Result<()> {
    let Some(state) = ask(ctx, session_id, "get_state").await else {
        return Ok(());
    };
    let mut learned = json!({
        "model": state["model"],
        "thinking_level": state["thinkingLevel"],
        "session_name": state["sessionName"],
    });
    if full {
        if let Some(c) = ask(ctx, session_id, "get_commands").await {
            learned["commands"] = c["commands"].clone();
        }
        if let Some(m) = ask(ctx, session_id, "get_available_models").await {
            learned["models"] = m["models"].clone();
        }
    }
    // The identity only once Pi has written the file berth gave it (it writes lazily, after the first
    // message): a recorded conversation must be one that exists.
    let id = state["sessionId"].as_str().map(str::to_string);
    let exists = tokio::fs::metadata(file(ctx, session_id)).await.is_ok();
    let reference = id.filter(|_| exists);
    // Merged into what is known under the row's lock: notices recorded meanwhile are kept.
    let txn = ctx.db.begin_write().await?;
    let Some(s) = store::find_locked(&txn, session_id).await? else {
        return Ok(());
    };
    let mut known = s.agent_state.unwrap_or_else(|| json!({}));
    if let (Some(known), Some(learned)) = (known.as_object_mut(), learned.as_object()) {
        known.extend(learned.clone());
    }
    store::record_agent(&txn, session_id, reference.as_deref(), known).await?;
    txn.commit().await?;
    Ok(())
}

async fn ask(ctx: &Ctx, session_id: Uuid, command: &str) -> Option<Value> {
    let answer = ctx.runtime.request(session_id, json!({ "type": command }), ASK).await?;
    (answer["success"] == true).then(|| answer["data"].clone())
}

/// What a fire-and-forget UI notice changes in what a snapshot shows (status lines, title,
/// notifications); `None` for anything else.
pub(super) fn noticed(known: Option<&Value>, event: &Value) -> Option<Value> {
    if event["type"] != "extension_ui_request" {
        return None;
    }
    let mut known = known.cloned().unwrap_or_else(|| json!({}));
    match event["method"].as_str()? {
        "setStatus" => {
            let key = event["statusKey"].as_str().unwrap_or("status").to_string();
            if !known["status"].is_object() {
                known["status"] = json!({});
            }
            match event["statusText"].as_str() {
                Some(text) => known["status"][key] = text.into(),
                None => {
                    known["status"].as_object_mut()?.remove(&key);
                }
            }
        }
        "setTitle" => known["title"] = event["title"].clone(),
        "notify" => {
            let mut list = known["notifications"].as_array().cloned().unwrap_or_default();
            list.push(json!({
                "message": event["message"],
                "notify_type": event["notifyType"].as_str().unwrap_or("info"),
                "at": crate::clock::now(),
            }));
            let excess = list.len().saturating_sub(NOTIFICATIONS_KEPT);
            list.drain(..excess);
            known["notifications"] = Value::Array(list);
        }
        _ => return None,
    }
    Some(known)
}

/// The questions pending on the agent, kept with what it said about itself so that any replica's snapshot
/// shows them (the agent's own node holds them in memory); `None` when nothing changed.
pub(super) fn with_attention(known: Option<&Value>, pending: &[Value]) -> Option<Value> {
    let stored = known
        .and_then(|k| k["attention"].as_array())
        .map(Vec::as_slice)
        .unwrap_or(&[]);
    if stored == pending {
        return None;
    }
    let mut known = known.cloned().unwrap_or_else(|| json!({}));
    known["attention"] = Value::Array(pending.to_vec());
    Some(known)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_conversation_file_is_checked_against_the_recorded_identity() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.jsonl");
        assert_eq!(header_of(&path, "a"), Some(ConversationCategory::Missing));
        std::fs::write(&path, "garbage\n").unwrap();
        assert_eq!(header_of(&path, "a"), Some(ConversationCategory::Corrupt));
        std::fs::write(&path, "{\"type\":\"session\",\"id\":\"b\"}\n").unwrap();
        assert_eq!(
            header_of(&path, "a"),
            Some(ConversationCategory::Corrupt),
            "another conversation"
        );
        std::fs::write(&path, "{\"type\":\"session\",\"id\":\"a\"}\n{}\n").unwrap();
        assert_eq!(header_of(&path, "a"), None);
    }

    #[test]
    fn notices_update_status_title_and_notifications() {
        let n = |v: Value| {
            json!({"type": "extension_ui_request", "id": "x"})
                .as_object()
                .cloned()
                .map(|mut o| {
                    o.extend(v.as_object().unwrap().clone());
                    Value::Object(o)
                })
                .unwrap()
        };
        let k = noticed(
            None,
            &n(json!({"method": "setStatus", "statusKey": "ext", "statusText": "busy"})),
        )
        .unwrap();
        assert_eq!(k["status"]["ext"], "busy");
        let k = noticed(Some(&k), &n(json!({"method": "setTitle", "title": "pi - x"}))).unwrap();
        assert_eq!(k["title"], "pi - x");
        let k = noticed(Some(&k), &n(json!({"method": "setStatus", "statusKey": "ext"}))).unwrap();
        assert!(k["status"].as_object().unwrap().is_empty());
        let mut k = k;
        for i in 0..25 {
            k = noticed(Some(&k), &n(json!({"method": "notify", "message": format!("m{i}")}))).unwrap();
        }
        let list = k["notifications"].as_array().unwrap();
        assert_eq!(list.len(), NOTIFICATIONS_KEPT);
        assert_eq!(list.last().unwrap()["message"], "m24");
        assert!(noticed(None, &n(json!({"method": "confirm"}))).is_none());
    }
}
