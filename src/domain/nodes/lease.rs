//! This process as an instance of its node: recorded at start, its lease renewed a third of
//! `BERTH_NODE_LEASE_SECS` apart, given back at a clean shutdown. Each renewal also refreshes the view of
//! the other instances and lets this one take over what an instance of its node left when it died
//! (`sessions::take_over`).
use std::time::Duration;

use super::Ctx;
use crate::entity::instance;
use crate::store::nodes as store;

/// How long instance rows are kept after their lease ended (the listing shows a day of them).
const FORGET_AFTER: chrono::Duration = chrono::Duration::days(7);

fn period(ctx: &Ctx) -> Duration {
    (ctx.config.node_lease / 3).max(Duration::from_millis(200))
}

fn host() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its length; gethostname NUL-terminates within it on success.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return "unknown".into();
    }
    let end = buf.iter().position(|b| *b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

/// The host this process runs on (an orphaned agent is ended only by an instance on its host).
pub fn this_host() -> &'static str {
    static HOST: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    HOST.get_or_init(host)
}

fn lease_until(ctx: &Ctx, now: chrono::DateTime<chrono::Utc>) -> chrono::DateTime<chrono::Utc> {
    now + chrono::Duration::from_std(ctx.config.node_lease).unwrap_or_else(|_| chrono::Duration::seconds(15))
}

/// Where the other instances reach this one: `BERTH_ADVERTISE_URL`, or the bind address and the port it
/// listens on (this host's name for an unspecified address).
fn advertised(ctx: &Ctx, port: u16) -> String {
    if let Some(url) = &ctx.config.advertise_url {
        return url.clone();
    }
    let ip = ctx.config.bind.ip();
    let host = match ip {
        _ if ip.is_unspecified() => this_host().to_string(),
        std::net::IpAddr::V6(v6) => format!("[{v6}]"),
        std::net::IpAddr::V4(v4) => v4.to_string(),
    };
    format!("http://{host}:{port}")
}

/// An `http://` URL whose host is not a loopback address: what travels to it crosses a network in the clear.
fn plain_beyond_loopback(url: &str) -> bool {
    let Ok(parsed) = reqwest::Url::parse(url) else {
        return false;
    };
    parsed.scheme() == "http" && super::super::names_loopback(&parsed) == Some(false)
}

/// Records this instance (listening on `port`) and takes its first lease (before anything acts on
/// other instances' work).
pub async fn register(ctx: &Ctx, port: u16) -> crate::error::Result<()> {
    // A node given up stays given up until an operator says otherwise; it touches nothing before
    // then.
    let node = &ctx.config.node_id;
    if let Some(n) = store::find_node(&ctx.db.conn, node).await?
        && let Some(at) = n.decommissioned_at
    {
        if !ctx.config.node_readmit {
            return Err(crate::error::Error::InvalidState(format!(
                "node {node} was decommissioned at {at}{}: what it held was declared lost; it does not start. \
                 Check its disk, then start it once with BERTH_NODE_READMIT=true to bring it back",
                n.decommissioned_by.map(|b| format!(" by {b}")).unwrap_or_default()
            )));
        }
        tracing::warn!(node = %node, "readmitting a decommissioned node (BERTH_NODE_READMIT)");
        store::readmit(&ctx.db.conn, node).await?;
    }
    let url = advertised(ctx, port);
    if plain_beyond_loopback(&url) {
        tracing::warn!(
            url = %url,
            "other replicas forward requests here, bearer tokens included, over plain HTTP: put TLS in \
             front of it and set BERTH_ADVERTISE_URL to the https URL (README, Operations)"
        );
    }
    let now = crate::clock::now();
    store::register(
        &ctx.db.conn,
        instance::Model {
            id: ctx.instance_id,
            node_id: ctx.config.node_id.clone(),
            pid: std::process::id() as i32,
            host: this_host().to_string(),
            url,
            version: crate::version::VERSION.to_string(),
            db_max_connections: ctx.config.db_max_connections.min(i32::MAX as u32) as i32,
            started_at: now,
            renewed_at: now,
            lease_until: lease_until(ctx, now),
            ended_at: None,
        },
    )
    .await?;
    super::refresh(ctx).await
}

/// Renews the lease until the process ends (a background task of `startup`).
pub async fn hold(ctx: Ctx) {
    let mut every = tokio::time::interval(period(&ctx));
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    every.tick().await;
    loop {
        every.tick().await;
        if ctx.shutdown.is_begun() {
            return;
        }
        let now = crate::clock::now();
        match store::renew(&ctx.db.conn, ctx.instance_id, now, lease_until(&ctx, now)).await {
            Ok(true) => {}
            Ok(false) => tracing::warn!("this instance's lease row is gone; serving on without one"),
            Err(e) => {
                tracing::warn!(error = %e, "could not renew this instance's lease");
                continue;
            }
        }
        if let Err(e) = super::refresh(&ctx).await {
            tracing::warn!(error = %e, "could not read the other instances' leases");
            continue;
        }
        match crate::domain::sessions::take_over(&ctx).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(sessions = n, "took over agents a dead instance of this node left"),
            Err(e) => tracing::warn!(error = %e, "taking over a dead instance's agents failed"),
        }
        if let Err(e) = store::forget_instances_before(&ctx.db.conn, now - FORGET_AFTER).await {
            tracing::warn!(error = %e, "could not forget old instances");
        }
    }
}

/// A clean shutdown gives the lease back: the node is down at once if this was its last instance, and a
/// sibling takes over the sessions this one stopped.
pub async fn give_back(ctx: &Ctx) {
    if let Err(e) = store::end(&ctx.db.conn, ctx.instance_id, crate::clock::now()).await {
        tracing::warn!(error = %e, "could not give back this instance's lease; it lapses");
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn only_plain_http_beyond_loopback_is_warned_about() {
        assert!(super::plain_beyond_loopback("http://10.0.0.5:8080"));
        assert!(super::plain_beyond_loopback("http://berth-2:8080"));
        assert!(!super::plain_beyond_loopback("http://127.0.0.1:8080"));
        assert!(!super::plain_beyond_loopback("http://[::1]:8080"));
        assert!(!super::plain_beyond_loopback("https://berth-2.internal"));
    }
}
