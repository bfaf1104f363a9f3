//! HTTP for the agent's own settings in a running session: its mode, and the configuration options it
//! offers (ACP agents list them in the snapshot's `agent.modes` and `agent.config_options`).
use crate::ids::SessionId;
use actix_web::{put, web};
use serde::Deserialize;
use utoipa::ToSchema;
use utoipa_actix_web::service_config::ServiceConfig;

use super::AppState;
use super::extract::{SessionsWrite, Unbound};
use super::problem::Problem;
use super::sessions::Session;
use crate::domain::sessions::{self, Setting};
use crate::error::Error;

pub fn routes(cfg: &mut ServiceConfig) {
    cfg.service(set_mode).service(set_config_option);
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ModeChoice {
    /// One of the snapshot's `agent.modes[].id`.
    pub mode_id: String,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct OptionValue {
    /// The new value: for a `select` option one of its `options[].value`, for a `boolean` one `true` or `false`.
    pub value: serde_json::Value,
}

/// Set the agent's mode
///
/// Asks the session's running agent to switch to one of the modes it offers (`agent.modes` in the
/// snapshot; ACP `session/set_mode`). The agent answers: `422` with its reason when it refuses. Carried
/// out by the replica that runs the agent. Scope `sessions:write`; a session-bound
/// token is refused (an agent does not choose its own permission mode).
#[utoipa::path(
    operation_id = "setSessionMode",
    tag = "sessions",
    security(("bearer" = ["sessions:write"])),
    params(("id" = Uuid, Path, description = "Session id")),
    request_body = ModeChoice,
    responses(
        (status = 200, description = "The agent took the mode", body = Session),
        (status = 404, description = "No such session (`not_found`)", body = Problem),
        (status = 409, description = "No running agent, or one that offers no modes (`conflict`)", body = Problem),
        (status = 422, description = "The agent refused the mode (`validation_failed`, its reason in `errors`)", body = Problem),
        (status = 503, description = "Another replica runs the agent and did not carry the request out in time (`unavailable`, retryable)", body = Problem),
    )
)]
#[put("/sessions/{id}/mode")]
async fn set_mode(
    auth: Unbound<SessionsWrite>,
    state: web::Data<AppState>,
    id: web::Path<SessionId>,
    body: web::Json<ModeChoice>,
) -> Result<web::Json<Session>, Error> {
    let mode = body.into_inner().mode_id;
    if mode.trim().is_empty() {
        return Err(Error::invalid("mode_id", "must not be empty"));
    }
    let view = sessions::configure(&state.ctx, &auth, *id, Setting::Mode(mode)).await?;
    Ok(web::Json(view.into()))
}

/// Set one of the agent's configuration options
///
/// Asks the session's running agent to set one of the options it offers (`agent.config_options` in the
/// snapshot, a model selector among them; ACP `session/set_config_option`). The agent answers: `422` with
/// its reason when it refuses. Carried out by the replica that runs the agent. Scope `sessions:write`; a
/// session-bound token is refused (an agent does not choose its own model).
#[utoipa::path(
    operation_id = "setSessionConfigOption",
    tag = "sessions",
    security(("bearer" = ["sessions:write"])),
    params(("id" = Uuid, Path, description = "Session id"), ("option_id" = String, Path, description = "The option's `id`")),
    request_body = OptionValue,
    responses(
        (status = 200, description = "The agent took the value", body = Session),
        (status = 404, description = "No such session (`not_found`)", body = Problem),
        (status = 409, description = "No running agent, or one that offers no options (`conflict`)", body = Problem),
        (status = 422, description = "The agent refused the value (`validation_failed`, its reason in `errors`)", body = Problem),
        (status = 503, description = "Another replica runs the agent and did not carry the request out in time (`unavailable`, retryable)", body = Problem),
    )
)]
#[put("/sessions/{id}/config-options/{option_id}")]
async fn set_config_option(
    auth: Unbound<SessionsWrite>,
    state: web::Data<AppState>,
    path: web::Path<(SessionId, String)>,
    body: web::Json<OptionValue>,
) -> Result<web::Json<Session>, Error> {
    let (id, option_id) = path.into_inner();
    let setting = Setting::Option {
        option_id,
        value: body.into_inner().value,
    };
    let view = sessions::configure(&state.ctx, &auth, id, setting).await?;
    Ok(web::Json(view.into()))
}
