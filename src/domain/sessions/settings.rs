//! The agent's own settings a person may change while it runs: its mode, and the configuration options
//! it offers (a model selector is one). Carried out by the node that runs the agent, like an answer.
use crate::ids::SessionId;
use serde_json::{Value, json};

use super::Ctx;
use super::access::{SessionView, project, reload, visible};
use crate::agent::{Command, Delivery};
use crate::auth::Principal;
use crate::entity::task_session as session;
use crate::error::{Error, Result};

/// How long berth waits for the agent to take a setting.
const TAKE: std::time::Duration = std::time::Duration::from_secs(30);

/// A setting for the agent.
#[derive(Debug, Clone, PartialEq)]
pub enum Setting {
    Mode(String),
    Option { option_id: String, value: Value },
}

impl Setting {
    fn payload(&self) -> Value {
        match self {
            Setting::Mode(mode) => json!({ "mode_id": mode }),
            Setting::Option { option_id, value } => json!({ "option_id": option_id, "value": value }),
        }
    }

    pub(super) fn from_payload(p: &Value) -> Result<Setting> {
        match (p["mode_id"].as_str(), p["option_id"].as_str()) {
            (Some(mode), None) => Ok(Setting::Mode(mode.to_string())),
            (None, Some(option)) => Ok(Setting::Option {
                option_id: option.to_string(),
                value: p["value"].clone(),
            }),
            _ => Err(Error::invalid("body", "a mode or an option")),
        }
    }
}

/// Sets the agent's mode or one of its options, on whichever node runs it.
pub async fn configure(ctx: &Ctx, p: &Principal, session_id: SessionId, setting: Setting) -> Result<SessionView> {
    let s = visible(&ctx.db.conn, p, session_id).await?;
    if !super::routing::forward(ctx, &s, super::routing::Command::Configure(setting.payload())).await? {
        configure_session(ctx, &s, &setting).await?;
    }
    project(ctx, reload(&ctx.db.conn, s.id).await?).await
}

/// The setting itself, on the node that runs the agent; what the agent then says about its mode and
/// options reaches the snapshot through its own reports.
pub(super) async fn configure_session(ctx: &Ctx, s: &session::Model, setting: &Setting) -> Result<()> {
    let command = match setting {
        Setting::Mode(mode) => Command::SetMode(mode.clone()),
        Setting::Option { option_id, value } => Command::SetOption {
            option_id: option_id.clone(),
            value: value.clone(),
        },
    };
    let field = match setting {
        Setting::Mode(_) => "mode_id",
        Setting::Option { .. } => "value",
    };
    match ctx.runtime.call(s.id, command, TAKE).await {
        Delivery::Accepted(_) | Delivery::NoAnswer => Ok(()),
        Delivery::Gone => Err(Error::InvalidState(
            "the session has no running agent; launch or resume it".into(),
        )),
        Delivery::Unsupported(_) => Err(Error::InvalidState(
            "the session's agent offers no modes or options to set".into(),
        )),
        Delivery::Refused { reason, .. } => Err(Error::invalid(field, format!("the agent refused it: {reason}"))),
        Delivery::Busy => Err(Error::SessionBusy),
    }
}
