//! Prometheus text metrics: request counts and latency histograms by route and status, pool usage.
use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use crate::entity::cleanup_job::CleanupJobState;
use std::time::Duration;

const BUCKETS: [f64; 12] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0,
];

#[derive(Default)]
struct Series {
    count: u64,
    sum: f64,
    buckets: [u64; BUCKETS.len()],
}

#[derive(Default)]
pub struct Metrics {
    requests: Mutex<BTreeMap<(String, String, u16), Series>>,
}

impl Metrics {
    pub fn observe(&self, method: &str, route: &str, status: u16, elapsed: Duration) {
        let secs = elapsed.as_secs_f64();
        let mut map = self.requests.lock().unwrap_or_else(|e| e.into_inner());
        let series = map.entry((method.to_string(), route.to_string(), status)).or_default();
        series.count += 1;
        series.sum += secs;
        for (i, bound) in BUCKETS.iter().enumerate() {
            if secs <= *bound {
                series.buckets[i] += 1;
            }
        }
    }

    pub fn render(&self, pool_open: u32, pool_idle: u32, pool_max: u32) -> String {
        let mut out = String::new();
        let map = self.requests.lock().unwrap_or_else(|e| e.into_inner());
        out.push_str("# HELP berth_http_requests_total HTTP requests by method, route and status.\n");
        out.push_str("# TYPE berth_http_requests_total counter\n");
        for ((method, route, status), s) in map.iter() {
            let _ = writeln!(
                out,
                "berth_http_requests_total{{method=\"{method}\",route=\"{}\",status=\"{status}\"}} {}",
                escape(route),
                s.count
            );
        }
        out.push_str("# HELP berth_http_request_duration_seconds HTTP request latency.\n");
        out.push_str("# TYPE berth_http_request_duration_seconds histogram\n");
        for ((method, route, status), s) in map.iter() {
            let labels = format!("method=\"{method}\",route=\"{}\",status=\"{status}\"", escape(route));
            for (i, bound) in BUCKETS.iter().enumerate() {
                let _ = writeln!(
                    out,
                    "berth_http_request_duration_seconds_bucket{{{labels},le=\"{bound}\"}} {}",
                    s.buckets[i]
                );
            }
            let _ = writeln!(
                out,
                "berth_http_request_duration_seconds_bucket{{{labels},le=\"+Inf\"}} {}",
                s.count
            );
            let _ = writeln!(out, "berth_http_request_duration_seconds_sum{{{labels}}} {}", s.sum);
            let _ = writeln!(out, "berth_http_request_duration_seconds_count{{{labels}}} {}", s.count);
        }
        out.push_str("# HELP berth_db_pool_connections Database pool connections by state.\n");
        out.push_str("# TYPE berth_db_pool_connections gauge\n");
        let _ = writeln!(out, "berth_db_pool_connections{{state=\"open\"}} {pool_open}");
        let _ = writeln!(out, "berth_db_pool_connections{{state=\"idle\"}} {pool_idle}");
        let _ = writeln!(
            out,
            "berth_db_pool_connections{{state=\"in_use\"}} {}",
            pool_open.saturating_sub(pool_idle)
        );
        out.push_str("# HELP berth_db_pool_max_connections Configured pool size.\n");
        out.push_str("# TYPE berth_db_pool_max_connections gauge\n");
        let _ = writeln!(out, "berth_db_pool_max_connections {pool_max}");
        out
    }
}

fn escape(s: &str) -> String {
    s.replace('\\', "\\\\").replace('"', "\\\"")
}

/// Claim counters of the cleanup workers.
#[derive(Default)]
pub struct CleanupStats {
    pub claims: AtomicU64,
    /// Sum of (claimed at − due at), in milliseconds.
    pub claim_latency_ms: AtomicU64,
}

/// What the last restore did.
#[derive(Default)]
pub struct RestoreStats {
    /// The most launches that ran at once (I29: two).
    pub max_concurrent: AtomicUsize,
}

/// Cleanup jobs by state, how long due jobs waited to be claimed, the restore's concurrency and live agents.
pub fn render_cleanup(
    by_state: &[(CleanupJobState, i64)],
    cleanup: &CleanupStats,
    restore: &RestoreStats,
    live_agents: usize,
) -> String {
    use sea_orm::ActiveEnum;
    let mut out = String::from("# HELP berth_cleanup_jobs Cleanup jobs by state.\n# TYPE berth_cleanup_jobs gauge\n");
    for (state, n) in by_state {
        let _ = writeln!(out, "berth_cleanup_jobs{{state=\"{}\"}} {n}", state.to_value());
    }
    let _ = writeln!(
        out,
        "# HELP berth_cleanup_claims_total Cleanup job claims by this process.\n# TYPE berth_cleanup_claims_total counter"
    );
    let _ = writeln!(
        out,
        "berth_cleanup_claims_total {}",
        cleanup.claims.load(Ordering::Relaxed)
    );
    let _ = writeln!(
        out,
        "# HELP berth_cleanup_claim_latency_seconds_sum Time due jobs waited to be claimed.\n# TYPE berth_cleanup_claim_latency_seconds_sum counter"
    );
    let _ = writeln!(
        out,
        "berth_cleanup_claim_latency_seconds_sum {}",
        cleanup.claim_latency_ms.load(Ordering::Relaxed) as f64 / 1000.0
    );
    let _ = writeln!(
        out,
        "# HELP berth_restore_max_concurrent The most session relaunches that ran at once at startup.\n# TYPE berth_restore_max_concurrent gauge"
    );
    let _ = writeln!(
        out,
        "berth_restore_max_concurrent {}",
        restore.max_concurrent.load(Ordering::Relaxed)
    );
    let _ = writeln!(
        out,
        "# HELP berth_agents_live Live agent processes.\n# TYPE berth_agents_live gauge"
    );
    let _ = writeln!(out, "berth_agents_live {live_agents}");
    out
}
