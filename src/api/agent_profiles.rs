//! HTTP for agent profiles: read-only, defined in the config file only (decision 7).
use actix_web::{get, web};
use serde::Serialize;
use utoipa::ToSchema;
use utoipa_actix_web::service_config::ServiceConfig;

use super::AppState;
use super::extract::{Authorized, FollowPoint, SessionsRead};
use crate::config::{NetworkMode, SandboxMode};
use crate::error::Error;

pub fn routes(cfg: &mut ServiceConfig) {
    cfg.service(list_agent_profiles);
}

#[derive(Debug, Serialize, ToSchema)]
pub struct AgentProfile {
    pub name: String,
    pub command: String,
    /// `bwrap`: the agent runs in its box (the default). `none`: it runs as berth's own user with berth's
    /// filesystem, and berth warns at every start.
    #[schema(example = "bwrap")]
    pub sandbox: String,
    /// `box`: the box's own network, reaching only `endpoints`. `host`: every address berth reaches.
    #[schema(example = "box")]
    pub network: String,
    /// The `host:port` endpoints the agent reaches from its box.
    pub endpoints: Vec<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct AgentProfileList {
    pub items: Vec<AgentProfile>,
    /// Every event with `seq <= latest_seq` is reflected in this list: follow with
    /// `GET /events/stream?after=<latest_seq>` to miss nothing.
    pub latest_seq: i64,
}

/// List agent profiles
///
/// The agent profiles configured on the server (name, command and what their box allows, never their
/// environment values), which sessions name in `agent_profile`. Profiles are defined only in berth's
/// config file. Scope `sessions:read`.
#[utoipa::path(
    operation_id = "listAgentProfiles",
    tag = "sessions",
    security(("bearer" = ["sessions:read"])),
    responses((status = 200, description = "The configured profiles (never their environment values)", body = AgentProfileList))
)]
#[get("/agent-profiles")]
async fn list_agent_profiles(
    _auth: Authorized<SessionsRead>,
    state: web::Data<AppState>,
    seq: FollowPoint,
) -> Result<web::Json<AgentProfileList>, Error> {
    let items = state
        .ctx
        .config
        .agents
        .iter()
        .map(|(name, p)| AgentProfile {
            name: name.clone(),
            command: p.command.clone(),
            sandbox: match p.sandbox {
                SandboxMode::Bwrap => "bwrap",
                SandboxMode::None => "none",
            }
            .into(),
            network: match p.network {
                NetworkMode::Box => "box",
                NetworkMode::Host => "host",
            }
            .into(),
            endpoints: p.endpoints.clone(),
        })
        .collect();
    Ok(web::Json(AgentProfileList {
        items,
        latest_seq: seq.0,
    }))
}
