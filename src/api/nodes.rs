//! HTTP for nodes and their instances.
use actix_web::{get, post, web};
use serde::Serialize;
use utoipa::ToSchema;
use utoipa_actix_web::service_config::ServiceConfig;

use super::AppState;
use super::extract::{Admin, Unbound};
use super::problem::Problem;
use crate::domain::nodes::decommission::{self, Decommissioned};
use crate::domain::nodes::{self, NodeView};
use crate::error::Error;

pub fn routes(cfg: &mut ServiceConfig) {
    cfg.service(list_nodes).service(decommission_node);
}

#[derive(Debug, Serialize, ToSchema)]
pub struct NodeList {
    pub items: Vec<NodeView>,
    /// The node and instance that answered.
    pub node_id: String,
    pub instance_id: crate::ids::InstanceId,
}

/// List nodes and their instances
///
/// Every node berth has seen (a node is the filesystem a set of berth processes reach, `BERTH_NODE_ID`),
/// by id: its state (`up` while any of its instances holds its lease, `down` when none does,
/// `decommissioned` once given up), its instances (process id, host, version, connections, lease) that
/// hold a lease or held one in the last day, and what it holds: environments on its disk, agents
/// running there, cleanup jobs that wait to run there. Scope `admin`.
#[utoipa::path(
    operation_id = "listNodes",
    tag = "operations",
    security(("bearer" = ["admin"])),
    responses(
        (status = 200, description = "The nodes, by id", body = NodeList),
        (status = 403, description = "The token lacks `admin` (`insufficient_scope`)", body = Problem),
    )
)]
#[get("/nodes")]
async fn list_nodes(_auth: Unbound<Admin>, state: web::Data<AppState>) -> Result<web::Json<NodeList>, Error> {
    let ctx = &state.ctx;
    Ok(web::Json(NodeList {
        items: nodes::list(ctx).await?,
        node_id: ctx.config.node_id.clone(),
        instance_id: ctx.instance_id,
    }))
}

#[derive(Debug, serde::Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DecommissionNode {
    /// The id of the node to decommission, repeated: a decommission cannot be undone by the API.
    pub node_id: String,
}

/// Decommission a node
///
/// Gives up a node that is `down` and will not come back: its environments become `lost` (the next
/// session of their tasks gets a new environment where it is carried out), its sessions `failed` with
/// `node_lost`, and its cleanup jobs that were waiting for it end `cancelled`, their `last_error` naming
/// what they would have removed. Nothing is deleted anywhere. The body repeats the node id. A
/// decommissioned node that comes back refuses to start until an operator sets
/// `BERTH_NODE_READMIT=true`. Scope `admin`.
#[utoipa::path(
    operation_id = "decommissionNode",
    tag = "operations",
    security(("bearer" = ["admin"])),
    params(("id" = String, Path, description = "Node id")),
    request_body = DecommissionNode,
    responses(
        (status = 200, description = "Decommissioned: what it ended", body = Decommissioned),
        (status = 404, description = "No such node (`not_found`)", body = Problem),
        (status = 409, description = "The node is up, or decommissioned already (`conflict`); nothing changed", body = Problem),
        (status = 422, description = "The body does not repeat the node id (`validation_failed`); nothing changed", body = Problem),
    )
)]
#[post("/nodes/{id}/decommission")]
async fn decommission_node(
    auth: Unbound<Admin>,
    state: web::Data<AppState>,
    id: web::Path<String>,
    body: web::Json<DecommissionNode>,
) -> Result<web::Json<Decommissioned>, Error> {
    let by = Some(auth.sub.clone());
    Ok(web::Json(
        decommission::decommission(&state.ctx, by, &id, &body.node_id).await?,
    ))
}
