//! A session's one conversation (seed 002 "Identity"), never substituted. Where the protocol keeps it
//! in a file (Pi), berth keeps that file per session under its data directory, hands that exact file back
//! on every relaunch, and records the agent's identity of it (`agent_session_ref`) once the file exists.
//! Where the agent keeps it (ACP), berth records the id the agent gave it and loads that id on every
//! relaunch; an agent that cannot load it refuses the launch. Either way, a relaunch that cannot continue
//! the recorded conversation never starts another in its place.
use crate::ids::SessionId;
use std::io::{BufRead, Read};
use std::path::PathBuf;
use std::time::Duration;

use serde_json::{Value, json};

use super::Ctx;
use crate::agent::Delivery;
use crate::agent::{self, Command, Memory, Notice, Signal};
use crate::config::{AgentProfile, AgentProtocol};
use crate::entity::task_session as session;
use crate::error::{ConversationCategory, Error, Result};
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
pub(super) fn file(ctx: &Ctx, session_id: SessionId) -> PathBuf {
    dir(ctx).join(format!("{session_id}.jsonl"))
}

/// The file berth keeps this profile's conversation in, if it keeps one (the agent's box shows it).
pub(super) fn kept_in_file(ctx: &Ctx, profile: &AgentProfile, session_id: SessionId) -> Option<PathBuf> {
    (agent::memory(profile.protocol) == Memory::File).then(|| file(ctx, session_id))
}

/// The profile to spawn: where berth keeps the conversation in a file, its arguments plus that file.
pub(super) fn launch_profile(ctx: &Ctx, profile: &AgentProfile, session_id: SessionId) -> Result<AgentProfile> {
    let mut profile = profile.clone();
    if agent::memory(profile.protocol) == Memory::File {
        let dir = dir(ctx);
        std::fs::create_dir_all(&dir).map_err(|e| Error::Internal(e.into()))?;
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))
            .map_err(|e| Error::Internal(e.into()))?;
        let file = file(ctx, session_id);
        profile.args.extend(agent::Wire::launch_args(profile.protocol, &file));
    }
    Ok(profile)
}

/// How long an agent may take to open its connection and its conversation (node agents start in
/// seconds; more on a loaded machine).
const OPEN: Duration = Duration::from_secs(120);

/// Why a launched agent could not open the session's conversation.
#[derive(Debug)]
pub(super) enum OpenFailure {
    /// The recorded conversation cannot be continued: the launch is refused, never started afresh.
    Unavailable(ConversationCategory, String),
    /// The agent wants credentials berth does not give it (its auth methods named).
    AuthRequired(String),
    /// The agent did not speak the protocol, or refused.
    Failed(String),
}

/// Where the agent keeps the conversation (ACP): opens the connection, then creates the conversation
/// (first launch, recording its id) or loads the recorded one (every relaunch), in the admitted
/// worktree; sets the profile's mode. Nothing to do for other protocols.
pub(super) async fn open(
    ctx: &Ctx,
    s: &session::Model,
    profile: &AgentProfile,
    cwd: &str,
) -> std::result::Result<(), OpenFailure> {
    if agent::memory(profile.protocol) != Memory::Agent {
        return Ok(());
    }
    let rt = &ctx.runtime;
    match rt.call(s.id, Command::Initialize, OPEN).await {
        Delivery::Accepted(_) => {}
        other => {
            return Err(OpenFailure::Failed(format!(
                "the agent did not initialize: {}",
                said(&other)
            )));
        }
    }
    let intro = rt.introduction(s.id).unwrap_or_default();
    let cwd = cwd.to_string();
    let command = match s.agent_session_ref.clone() {
        None => Command::NewConversation { cwd },
        Some(id) if intro.can_load => Command::LoadConversation { id, cwd },
        Some(id) if intro.can_resume => Command::ResumeConversation { id, cwd },
        Some(_) => {
            return Err(OpenFailure::Unavailable(
                ConversationCategory::Unsupported,
                "the agent cannot load a recorded conversation".into(),
            ));
        }
    };
    let creating = matches!(command, Command::NewConversation { .. });
    let opened = match rt.call(s.id, command, OPEN).await {
        Delivery::Accepted(v) => v,
        Delivery::Refused {
            code: Some(agent::acp::AUTH_REQUIRED),
            ..
        } => {
            let methods: Vec<String> = intro
                .auth_methods
                .iter()
                .map(|m| m["id"].as_str().or(m["name"].as_str()).unwrap_or("?").to_string())
                .collect();
            return Err(OpenFailure::AuthRequired(format!(
                "the agent requires authentication ({}); give it credentials through the profile's env",
                methods.join(", ")
            )));
        }
        other if !creating => {
            return Err(OpenFailure::Unavailable(
                ConversationCategory::Missing,
                format!("the agent could not load the recorded conversation: {}", said(&other)),
            ));
        }
        other => {
            return Err(OpenFailure::Failed(format!(
                "the agent did not open a conversation: {}",
                said(&other)
            )));
        }
    };
    if let Some(mode) = &profile.mode {
        match rt.call(s.id, Command::SetMode(mode.clone()), OPEN).await {
            Delivery::Accepted(_) => {}
            other => {
                return Err(OpenFailure::Failed(format!(
                    "the agent did not take mode {mode}: {}",
                    said(&other)
                )));
            }
        }
    }
    if creating {
        let Some(id) = opened["sessionId"].as_str() else {
            return Err(OpenFailure::Failed("the agent named no conversation".into()));
        };
        let txn = ctx
            .db
            .begin_write()
            .await
            .map_err(|e| OpenFailure::Failed(e.to_string()))?;
        let known = store::find_locked(&txn, s.id)
            .await
            .ok()
            .flatten()
            .and_then(|s| s.agent_state)
            .unwrap_or_else(|| json!({}));
        store::record_agent(&txn, s.id, Some(id), known)
            .await
            .map_err(|e| OpenFailure::Failed(e.to_string()))?;
        txn.commit().await.map_err(|e| OpenFailure::Failed(e.to_string()))?;
    }
    Ok(())
}

fn said(d: &Delivery) -> String {
    match d {
        Delivery::Refused { reason, .. } => reason.clone(),
        Delivery::NoAnswer => "no answer in time".into(),
        Delivery::Gone => "the agent exited".into(),
        Delivery::Unsupported(u) => u.to_string(),
        Delivery::Busy => "busy".into(),
        Delivery::Accepted(_) => "accepted".into(),
    }
}

/// Whether a relaunch may continue the session's recorded conversation: its file is there, is that
/// conversation, and no other live session holds it. A session with nothing recorded starts one.
pub(super) async fn check(
    ctx: &Ctx,
    profile: &AgentProfile,
    s: &session::Model,
) -> Result<Option<ConversationCategory>> {
    if agent::memory(profile.protocol) != Memory::File {
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
        Ok(h) if agent::pi::header_names(&h, recorded) => None,
        _ => Some(ConversationCategory::Corrupt),
    }
}

/// Removes a deleted session's conversation and its box's home, where agents keep theirs (conversations
/// are session data; worktrees are not).
pub(crate) async fn remove(ctx: &Ctx, session_id: SessionId) {
    ctx.runtime.boxes().remove(session_id);
    let path = file(ctx, session_id);
    match tokio::fs::remove_file(&path).await {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => tracing::warn!(session = %session_id, error = %e, "could not remove a conversation file"),
    }
}

/// Asks an agent who it is (its state), and with `full` what it offers (commands, models); records the
/// conversation's identity once its file exists, and the rest for snapshots.
pub(super) async fn learn(ctx: &Ctx, session_id: SessionId, full: bool) -> Result<()> {
    let Some(state) = ask(ctx, session_id, Command::AskState).await else {
        return Ok(());
    };
    let (commands, models) = if full {
        (
            ask(ctx, session_id, Command::AskCommands).await,
            ask(ctx, session_id, Command::AskModels).await,
        )
    } else {
        (None, None)
    };
    let (learned, id) = agent::pi::learned(&state, commands.as_ref(), models.as_ref());
    let learned = Value::Object(learned);
    // The identity only once the agent has written the file berth gave it (Pi writes lazily, after the
    // first message): a recorded conversation must be one that exists.
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

async fn ask(ctx: &Ctx, session_id: SessionId, command: Command) -> Option<Value> {
    match ctx.runtime.call(session_id, command, ASK).await {
        Delivery::Accepted(v) => Some(v),
        _ => None,
    }
}

/// What the agent's notices change in what a snapshot shows (status lines, title, notifications, what
/// it learned); `None` when there is none.
pub(super) fn noticed(known: Option<&Value>, signals: &[Signal]) -> Option<Value> {
    let mut known = known.cloned().unwrap_or_else(|| json!({}));
    let mut changed = false;
    for signal in signals {
        let Signal::Notice(notice) = signal else { continue };
        changed = true;
        match notice {
            Notice::Status { key, text } => {
                if !known["status"].is_object() {
                    known["status"] = json!({});
                }
                match text {
                    Some(text) => known["status"][key] = text.clone().into(),
                    None => {
                        if let Some(status) = known["status"].as_object_mut() {
                            status.remove(key);
                        }
                    }
                }
            }
            Notice::Title(title) => known["title"] = title.clone(),
            Notice::Notify { message, kind } => {
                let mut list = known["notifications"].as_array().cloned().unwrap_or_default();
                list.push(json!({
                    "message": message,
                    "notify_type": kind,
                    "at": crate::clock::now(),
                }));
                let excess = list.len().saturating_sub(NOTIFICATIONS_KEPT);
                list.drain(..excess);
                known["notifications"] = Value::Array(list);
            }
            Notice::Learned(facts) => {
                if let Some(k) = known.as_object_mut() {
                    k.extend(facts.clone());
                }
            }
        }
    }
    changed.then_some(known)
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
            let line = json!({"type": "extension_ui_request", "id": "x"})
                .as_object()
                .cloned()
                .map(|mut o| {
                    o.extend(v.as_object().unwrap().clone());
                    Value::Object(o)
                })
                .unwrap();
            agent::Wire::new(AgentProtocol::Pi).decode(line).signals
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
