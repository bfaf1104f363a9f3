//! HTTP for nodes and their instances (issue 39).
use actix_web::{get, web};
use serde::Serialize;
use utoipa::ToSchema;
use utoipa_actix_web::service_config::ServiceConfig;

use super::AppState;
use super::extract::{Admin, Unbound};
use super::problem::Problem;
use crate::domain::nodes::{self, NodeView};
use crate::error::Error;

pub fn routes(cfg: &mut ServiceConfig) {
    cfg.service(list_nodes);
}

#[derive(Debug, Serialize, ToSchema)]
pub struct NodeList {
    pub items: Vec<NodeView>,
    /// The node and instance that answered.
    pub node_id: String,
    pub instance_id: uuid::Uuid,
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
        (status = 403, description = "The token lacks `admin` (`insufficient_scope`)", body = Problem, content_type = "application/problem+json"),
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
