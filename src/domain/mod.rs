//! The rules. Handlers call one function here; nothing here knows about HTTP.
pub mod branches;
pub mod checkpoints;
pub mod cleanup;
pub mod columns;
pub mod diff;
pub mod environments;
pub mod events;
pub mod git_status;
pub mod landing;
pub mod nodes;
pub mod pagination;
pub mod precondition;
pub mod repositories;
pub mod retention;
pub mod reviews;
pub mod sessions;
pub mod task_lifecycle;
pub mod tasks;
pub mod transition;
pub mod usage;
pub mod webhooks;
pub mod workspaces;
pub mod writer;

use crate::ids::InstanceId;
use std::sync::Arc;

use crate::config::Config;
use crate::git::cli::GitMutations;
use crate::store::Db;

/// What every domain operation needs: storage, configuration and this process generation's id.
#[derive(Clone)]
pub struct Ctx {
    pub db: Db,
    pub config: Arc<Config>,
    /// Changes with every server start (I26); stamped on every event.
    pub instance_id: InstanceId,
    /// The one way berth mutates git: timeouts and a process-wide concurrency cap.
    pub git: Arc<dyn GitMutations>,
    /// Live fan-out of committed events.
    pub events: Arc<crate::events::Hub>,
    /// The agent processes of this server.
    pub runtime: Arc<crate::runtime::Runtime>,
    /// Wakes the cleanup workers when a job becomes due.
    pub cleanup_wake: Arc<tokio::sync::Notify>,
    /// Wakes what waits here for an environment's writer lease when one is released (`writer`).
    pub writers: Arc<tokio::sync::Notify>,
    /// The metrics this process keeps (one registry per app).
    pub metrics: Arc<crate::metrics::Metrics>,
    /// When each (environment, repository) was last inspected for a live read (I25 rate limit).
    pub git_status_inspected: Arc<git_status::InspectionClock>,
    pub restore_stats: Arc<crate::metrics::RestoreStats>,
    /// The materializations this process is running (a cleanup job waits for one it overtook).
    pub materializing: Arc<environments::Materializing>,
    /// Which nodes and instances hold a lease, as last read.
    pub nodes: Arc<nodes::Nodes>,
    /// Begun on SIGTERM or SIGINT: event streams send their last frame and end.
    pub shutdown: crate::shutdown::Shutdown,
}

impl Ctx {
    /// Commits a transaction that appended events, then wakes the event tailer (and on PostgreSQL the
    /// sequencer). In a request on PostgreSQL the answer then waits until its events are stamped and
    /// published here (`events::written`, once per request), so that the answer follows its events.
    pub async fn commit(&self, txn: sea_orm::DatabaseTransaction) -> crate::error::Result<()> {
        // Registered before the commit, so that the publication cannot be missed.
        let waiting = crate::events::written::take_appended().map(|id| self.events.published_id(id));
        txn.commit().await?;
        self.events.wake();
        if let Some(published) = waiting {
            crate::events::written::committed(published, std::time::Instant::now(), self.metrics.clone());
        }
        Ok(())
    }

    /// [`Ctx::commit`] for a transaction that nothing outside the database acts on before this request's
    /// answer, or before a later flushed commit of the request (a launch records its handle, flushed,
    /// before it spawns). On PostgreSQL, inside a request that waits for the transaction's events, it
    /// returns before the log flush: the answer waits for the events' stamp, a flushed commit later in the
    /// one log, which flushes this one first (or the request flushes the log itself, `events::written`).
    /// The request then pays one flush, shared by every write of the stamping round, instead of two in a
    /// row. Elsewhere it is `commit`.
    ///
    /// Not for a commit followed by work outside the database that depends on it: the election of a
    /// materializer (git runs next), a session delete (its conversation files are removed next).
    pub async fn commit_answered(&self, txn: sea_orm::DatabaseTransaction) -> crate::error::Result<()> {
        if !self.db.is_sqlite() && crate::events::written::will_wait() {
            Db::unflushed(&txn).await?;
            crate::events::written::owe_flush(self.db.conn.clone());
        }
        self.commit(txn).await
    }
}

/// Trims and bounds a required free-text field.
pub(crate) fn required_text(field: &str, value: &str, max_chars: usize) -> crate::error::Result<String> {
    let trimmed = value.trim();
    if trimmed.is_empty() {
        return Err(crate::error::Error::invalid(field, "must not be empty"));
    }
    if trimmed.chars().count() > max_chars {
        return Err(crate::error::Error::invalid(
            field,
            format!("must be at most {max_chars} characters"),
        ));
    }
    if trimmed.chars().any(|c| c.is_control()) {
        return Err(crate::error::Error::invalid(
            field,
            "must not contain control characters",
        ));
    }
    Ok(trimmed.to_string())
}

/// Whether a URL's host is loopback (`localhost` or a loopback address, as written); `None` when it names
/// no host. What plain `http://` may reach without crossing a network.
pub(crate) fn names_loopback(url: &url::Url) -> Option<bool> {
    Some(match url.host()? {
        url::Host::Domain(d) => d.eq_ignore_ascii_case("localhost"),
        url::Host::Ipv4(ip) => ip.is_loopback(),
        url::Host::Ipv6(ip) => ip.is_loopback(),
    })
}
