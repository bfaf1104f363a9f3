//! Nodes and instances. Every berth process is an instance of a node, the filesystem it reaches
//! (`BERTH_NODE_ID`). An instance holds a lease it renews a third of `BERTH_NODE_LEASE_SECS` apart
//! (`lease`); a node is `up` while any of its instances holds one, `down` when none does, and
//! `decommissioned` once an operator gave it up.
//!
//! Each process keeps a view of who holds a lease, refreshed at every renewal: an `up` answer from it is
//! at most a renewal period old (so a dead node is seen within the lease plus that period); a `down`
//! answer is checked against the database before anything acts on it, so an instance started a moment
//! ago is never taken for dead.
pub mod decommission;
pub mod lease;
pub mod placement;

use crate::ids::InstanceId;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::RwLock;

use serde::Serialize;
use utoipa::ToSchema;

use super::Ctx;
use crate::entity::instance;
use crate::error::{Error, Result};
use crate::store::nodes as store;

/// Whether a node's disk and agents can be reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum NodeState {
    /// An instance holds a lease.
    Up,
    /// No instance holds a lease: its agents and its disk cannot be reached until one starts.
    Down,
    /// An operator gave it up: its environments are lost, its jobs ended.
    Decommissioned,
}

/// Who held a lease at the last look.
#[derive(Default)]
struct View {
    live_instances: HashSet<InstanceId>,
    up: HashSet<String>,
    decommissioned: HashSet<String>,
}

/// This process's view of the nodes (in `Ctx`).
#[derive(Default)]
pub struct Nodes {
    view: RwLock<View>,
}

impl Nodes {
    /// The state at the last look (a node never seen is `down`).
    pub fn cached(&self, node_id: &str) -> NodeState {
        let v = self.view.read().unwrap();
        if v.decommissioned.contains(node_id) {
            NodeState::Decommissioned
        } else if v.up.contains(node_id) {
            NodeState::Up
        } else {
            NodeState::Down
        }
    }

    fn set(&self, live: &[instance::Model], decommissioned: HashSet<String>) {
        let mut v = self.view.write().unwrap();
        v.live_instances = live.iter().map(|i| i.id).collect();
        v.up = live.iter().map(|i| i.node_id.clone()).collect();
        v.decommissioned = decommissioned;
    }
}

/// Reads who holds a lease now into the view.
pub async fn refresh(ctx: &Ctx) -> Result<()> {
    let now = crate::clock::now();
    let live = store::live_instances(&ctx.db.conn, now).await?;
    let decommissioned = store::all_nodes(&ctx.db.conn)
        .await?
        .into_iter()
        .filter(|n| n.decommissioned_at.is_some())
        .map(|n| n.id)
        .collect();
    ctx.nodes.set(&live, decommissioned);
    Ok(())
}

/// A node's state, to act on: `up` from the view; anything else read again first.
pub async fn state(ctx: &Ctx, node_id: &str) -> Result<NodeState> {
    if node_id == ctx.config.node_id || ctx.nodes.cached(node_id) == NodeState::Up {
        return Ok(NodeState::Up);
    }
    refresh(ctx).await?;
    Ok(ctx.nodes.cached(node_id))
}

/// Whether an instance holds its lease, to act on (this one always does): `true` from the view; a
/// `false` read again first.
pub async fn instance_alive(ctx: &Ctx, instance_id: InstanceId) -> Result<bool> {
    if instance_id == ctx.instance_id || ctx.nodes.view.read().unwrap().live_instances.contains(&instance_id) {
        return Ok(true);
    }
    refresh(ctx).await?;
    Ok(ctx.nodes.view.read().unwrap().live_instances.contains(&instance_id))
}

/// Whether the instance that recorded some work of this node still runs it, to decide whether this
/// instance may end or relaunch that work. Alive: it holds its lease, and when it ran on this host its
/// process is still there. At this instance's start (`starting`), an instance recorded by this very
/// process is an earlier one, gone (one process is one instance at a time; a test's restart makes such a
/// pair). An instance never recorded (work from before instances were) holds no lease.
pub async fn sibling_alive(ctx: &Ctx, instance_id: InstanceId, starting: bool) -> Result<bool> {
    if instance_id == ctx.instance_id {
        return Ok(true);
    }
    let Some(i) = store::find_instance(&ctx.db.conn, instance_id).await? else {
        return Ok(false);
    };
    if !i.holds_lease(crate::clock::now()) {
        return Ok(false);
    }
    if i.host == lease::this_host() {
        let pid = i.pid as u32;
        if pid == std::process::id() {
            return Ok(!starting);
        }
        return Ok(process_exists(pid));
    }
    Ok(true)
}

/// Whether a process with this id exists (signal 0 checks without sending).
fn process_exists(pid: u32) -> bool {
    // SAFETY: kill with signal 0 only checks that the process exists and may be signalled.
    let rc = unsafe { libc::kill(pid as libc::pid_t, 0) };
    rc == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// The error for a request that needs a node that is not up: `503 node_unavailable` (retryable while it
/// is down, with `Retry-After` of one lease).
pub fn unavailable(ctx: &Ctx, node_id: &str, state: NodeState) -> Error {
    Error::NodeUnavailable {
        node_id: node_id.to_string(),
        decommissioned: state == NodeState::Decommissioned,
        retry_after: ctx.config.node_lease,
    }
}

/// `Ok` when the node is this one (its disk is here to read or write); otherwise `503 node_unavailable`
/// with that node's state (a request that reaches here for another node's disk was not forwarded: the
/// node is down, or given up).
pub async fn here(ctx: &Ctx, node_id: &str) -> Result<()> {
    if node_id == ctx.config.node_id {
        return Ok(());
    }
    let state = state(ctx, node_id).await?;
    Err(unavailable(ctx, node_id, state))
}

/// `Ok` when the node is up; `503 node_unavailable` otherwise.
pub async fn require_up(ctx: &Ctx, node_id: &str) -> Result<()> {
    match state(ctx, node_id).await? {
        NodeState::Up => Ok(()),
        other => Err(unavailable(ctx, node_id, other)),
    }
}

/// One process of a node, as `GET /nodes` shows it.
#[derive(Debug, Serialize, ToSchema)]
pub struct InstanceView {
    pub id: InstanceId,
    pub pid: i32,
    pub host: String,
    /// Where the other instances reach it.
    pub url: String,
    /// The scheme of `url`: `http` means requests forwarded to it (and the tokens they carry) cross the
    /// network in the clear, unless a TLS proxy or a private network is in between.
    pub scheme: String,
    pub version: String,
    /// The most database connections it opens (`BERTH_DB_MAX_CONNECTIONS`), all its pools together.
    pub db_max_connections: i32,
    pub started_at: chrono::DateTime<chrono::Utc>,
    pub renewed_at: chrono::DateTime<chrono::Utc>,
    pub lease_until: chrono::DateTime<chrono::Utc>,
    /// When it shut down cleanly (its lease given back).
    pub ended_at: Option<chrono::DateTime<chrono::Utc>>,
    /// Whether it holds its lease now.
    pub live: bool,
}

/// What a node holds.
#[derive(Debug, Default, Serialize, ToSchema)]
pub struct Holdings {
    /// Task environments on its disk (superseded ones not counted).
    pub environments: u64,
    /// Agents recorded as starting or running there.
    pub live_sessions: u64,
    /// Cleanup jobs not yet over (pending, running or waiting to retry): they run there.
    pub pending_jobs: u64,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct NodeView {
    pub id: String,
    pub state: NodeState,
    pub first_seen_at: chrono::DateTime<chrono::Utc>,
    pub decommissioned_at: Option<chrono::DateTime<chrono::Utc>>,
    /// Its instances holding a lease, and those that held one within the last day, newest first.
    pub instances: Vec<InstanceView>,
    pub holds: Holdings,
    /// The database connections its live instances may open together.
    pub db_max_connections: u64,
}

/// How long an instance that let its lease go is still listed.
const LISTED_FOR: chrono::Duration = chrono::Duration::days(1);

/// Every node berth has seen, by id, with its instances and what it holds.
pub async fn list(ctx: &Ctx) -> Result<Vec<NodeView>> {
    let conn = &ctx.db.conn;
    let now = crate::clock::now();
    let nodes = store::all_nodes(conn).await?;
    let mut instances: BTreeMap<String, Vec<instance::Model>> = BTreeMap::new();
    for i in store::instances_since(conn, now - LISTED_FOR).await? {
        instances.entry(i.node_id.clone()).or_default().push(i);
    }
    let (envs, live, jobs): (HashMap<_, _>, HashMap<_, _>, HashMap<_, _>) = (
        store::environments_per_node(conn).await?,
        store::live_executions_per_node(conn).await?,
        store::open_jobs_per_node(conn).await?,
    );
    Ok(nodes
        .into_iter()
        .map(|n| {
            let mine = instances.remove(&n.id).unwrap_or_default();
            let any_live = mine.iter().any(|i| i.holds_lease(now));
            let state = match (n.decommissioned_at, any_live) {
                (Some(_), _) => NodeState::Decommissioned,
                (None, true) => NodeState::Up,
                (None, false) => NodeState::Down,
            };
            let db_max_connections = mine
                .iter()
                .filter(|i| i.holds_lease(now))
                .map(|i| i.db_max_connections.max(0) as u64)
                .sum();
            NodeView {
                holds: Holdings {
                    environments: envs.get(&n.id).copied().unwrap_or(0),
                    live_sessions: live.get(&n.id).copied().unwrap_or(0),
                    pending_jobs: jobs.get(&n.id).copied().unwrap_or(0),
                },
                instances: mine
                    .into_iter()
                    .map(|i| InstanceView {
                        live: i.holds_lease(now),
                        id: i.id,
                        pid: i.pid,
                        host: i.host,
                        scheme: i
                            .url
                            .split_once("://")
                            .map_or("", |(scheme, _)| scheme)
                            .to_ascii_lowercase(),
                        url: i.url,
                        version: i.version,
                        db_max_connections: i.db_max_connections,
                        started_at: i.started_at,
                        renewed_at: i.renewed_at,
                        lease_until: i.lease_until,
                        ended_at: i.ended_at,
                    })
                    .collect(),
                id: n.id,
                state,
                first_seen_at: n.first_seen_at,
                decommissioned_at: n.decommissioned_at,
                db_max_connections,
            }
        })
        .collect())
}
