//! Metrics, kept with `prometheus-client` (one registry per running app, so tests that run many apps in
//! one process each see their own) and served as OpenMetrics text. Every value is kept current by the
//! code that changes it, through the one-line calls below; a scrape reads memory and `/proc`, no SQL.
//! A scraper that does not ask for OpenMetrics gets the Prometheus text format ([`prometheus_text`]).
use crate::ids::InstanceId;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::metrics::info::Info;
// Histograms carry their unit in the name only: a `# UNIT` line on a histogram trips some parsers.
use prometheus_client::registry::Registry;
use sea_orm::Iterable;

use crate::entity::cleanup_job::CleanupJobState;

mod process;
mod text;

pub use text::prometheus_text;

/// Latency buckets, in seconds, for requests and git commands.
const LATENCY: [f64; 14] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 30.0,
];
/// How long due cleanup jobs wait to be claimed, in seconds.
const CLAIM_LATENCY: [f64; 10] = [0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 15.0, 60.0, 300.0, 1800.0];
/// From an event's commit to its broadcast to streams, in seconds.
const EVENT_LAG: [f64; 11] = [0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HttpLabels {
    method: &'static str,
    route: String,
    status: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabel {
    state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct GitLabels {
    op: &'static str,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OpLabel {
    op: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TokenLabels {
    model: String,
    agent_profile: String,
    kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CostLabels {
    model: String,
    agent_profile: String,
    currency: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabel {
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DecisionLabel {
    decision: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: &'static str,
}

/// What a git command came to, for `berth_git_command_duration_seconds{outcome}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GitOutcome {
    Ok,
    Failed,
    Timeout,
}

pub struct Metrics {
    registry: Registry,
    http_requests: Family<HttpLabels, Counter>,
    http_duration: Histograms<HttpLabels>,
    pool: Family<StateLabel, Gauge>,
    pool_max: Gauge,
    cleanup_jobs: Family<StateLabel, Gauge>,
    cleanup_claims: Counter,
    cleanup_claim_latency: Histogram,
    git_duration: Histograms<GitLabels>,
    git_failures: Family<OpLabel, Counter>,
    agents_live: Gauge,
    agent_restarts: Counter,
    agent_egress: Family<DecisionLabel, Counter>,
    restore_max_concurrent: Gauge,
    streams_open: Gauge,
    stream_resets: Family<ReasonLabel, Counter>,
    event_lag: Histogram,
    event_stamp: Histogram,
    sequencer_leader: Gauge,
    agent_tokens: Family<TokenLabels, Counter>,
    agent_cost: Family<CostLabels, Counter<f64, AtomicU64>>,
    webhook_attempts: Family<OutcomeLabel, Counter>,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

fn latency() -> Histogram {
    Histogram::new(LATENCY.iter().copied())
}

/// A family of histograms, each made with the same buckets.
type Histograms<L> = Family<L, Histogram, fn() -> Histogram>;

impl Metrics {
    /// The metrics of one berth process, naming its node and instance (`berth_instance_info`).
    pub fn for_instance(node_id: &str, instance_id: InstanceId) -> Metrics {
        let mut m = Metrics::new();
        m.registry.register(
            "berth_instance",
            "The node this process is an instance of, and its instance id",
            Info::new(vec![
                ("node_id", node_id.to_string()),
                ("instance_id", instance_id.to_string()),
            ]),
        );
        m
    }

    pub fn new() -> Metrics {
        let mut registry = Registry::default();
        let http_requests = Family::<HttpLabels, Counter>::default();
        registry.register(
            "berth_http_requests",
            "HTTP requests by method, route and status",
            http_requests.clone(),
        );
        let http_duration: Histograms<HttpLabels> = Family::new_with_constructor(latency);
        registry.register(
            "berth_http_request_duration_seconds",
            "HTTP request latency by method, route and status",
            http_duration.clone(),
        );
        let pool = Family::<StateLabel, Gauge>::default();
        registry.register(
            "berth_db_pool_connections",
            "Database pool connections by state (open, idle, in_use)",
            pool.clone(),
        );
        let pool_max = Gauge::default();
        registry.register(
            "berth_db_pool_max_connections",
            "Configured pool size",
            pool_max.clone(),
        );
        let cleanup_jobs = Family::<StateLabel, Gauge>::default();
        registry.register(
            "berth_cleanup_jobs",
            "Cleanup jobs by state (counted at start, then moved by every transition)",
            cleanup_jobs.clone(),
        );
        let cleanup_claims = Counter::default();
        registry.register(
            "berth_cleanup_claims",
            "Cleanup job claims by this process",
            cleanup_claims.clone(),
        );
        let cleanup_claim_latency = Histogram::new(CLAIM_LATENCY.iter().copied());
        registry.register(
            "berth_cleanup_claim_latency_seconds",
            "How long due cleanup jobs waited to be claimed",
            cleanup_claim_latency.clone(),
        );
        let git_duration: Histograms<GitLabels> = Family::new_with_constructor(latency);
        registry.register(
            "berth_git_command_duration_seconds",
            "git commands by operation and outcome (ok, failed, timeout)",
            git_duration.clone(),
        );
        let git_failures = Family::<OpLabel, Counter>::default();
        registry.register(
            "berth_git_command_failures",
            "git commands that failed or timed out, by operation",
            git_failures.clone(),
        );
        let agents_live = Gauge::default();
        registry.register("berth_agents_live", "Live agent processes", agents_live.clone());
        let agent_restarts = Counter::default();
        registry.register(
            "berth_agent_restarts",
            "Restarts of crashed agents (I30)",
            agent_restarts.clone(),
        );
        let agent_egress = Family::<DecisionLabel, Counter>::default();
        registry.register(
            "berth_agent_egress",
            "Connections agents opened from their boxes to a listed endpoint (allowed: relayed; unreachable: the endpoint did not answer berth)",
            agent_egress.clone(),
        );
        let restore_max_concurrent = Gauge::default();
        registry.register(
            "berth_restore_max_concurrent",
            "The most session relaunches that ran at once at startup",
            restore_max_concurrent.clone(),
        );
        let streams_open = Gauge::default();
        registry.register("berth_event_streams_open", "Open event streams", streams_open.clone());
        let stream_resets = Family::<ReasonLabel, Counter>::default();
        registry.register(
            "berth_event_stream_resets",
            "Event streams told to reset, by reason (truncated, slow_consumer)",
            stream_resets.clone(),
        );
        let event_lag = Histogram::new(EVENT_LAG.iter().copied());
        registry.register(
            "berth_event_publish_lag_seconds",
            "From an event's write to its broadcast to the streams",
            event_lag.clone(),
        );
        let event_stamp = Histogram::new(EVENT_LAG.iter().copied());
        registry.register(
            "berth_event_stamp_seconds",
            "PostgreSQL: from a request's commit to its events' publication on this replica (stamping included)",
            event_stamp.clone(),
        );
        let sequencer_leader = Gauge::default();
        registry.register(
            "berth_event_sequencer_leader",
            "1 while this replica stamps the events of its PostgreSQL database",
            sequencer_leader.clone(),
        );
        let agent_tokens = Family::<TokenLabels, Counter>::default();
        registry.register(
            "berth_agent_tokens",
            "Tokens agents reported, by model, agent profile and kind (input, output, cache_read, cache_write)",
            agent_tokens.clone(),
        );
        let agent_cost = Family::<CostLabels, Counter<f64, AtomicU64>>::default();
        registry.register(
            "berth_agent_cost",
            "What agents reported their model calls cost, by model, agent profile and currency",
            agent_cost.clone(),
        );
        let webhook_attempts = Family::<OutcomeLabel, Counter>::default();
        registry.register(
            "berth_webhook_attempts",
            "Webhook delivery attempts by this process, by outcome (succeeded, failed)",
            webhook_attempts.clone(),
        );
        registry.register(
            "berth_build",
            "The version and commit of this binary",
            Info::new(vec![
                ("version", crate::version::VERSION),
                ("commit", crate::version::COMMIT),
            ]),
        );
        registry.register_collector(Box::new(process::ProcessCollector));
        for state in CleanupJobState::iter() {
            cleanup_jobs.get_or_create(&state_label(state)).set(0);
        }
        Metrics {
            registry,
            http_requests,
            http_duration,
            pool,
            pool_max,
            cleanup_jobs,
            cleanup_claims,
            cleanup_claim_latency,
            git_duration,
            git_failures,
            agents_live,
            agent_restarts,
            agent_egress,
            restore_max_concurrent,
            streams_open,
            stream_resets,
            event_lag,
            event_stamp,
            sequencer_leader,
            agent_tokens,
            agent_cost,
            webhook_attempts,
        }
    }

    /// An agent's reported usage was recorded.
    pub fn usage_recorded(
        &self,
        model: &str,
        agent_profile: &str,
        tokens: [(&'static str, u64); 4],
        cost: Option<(&str, f64)>,
    ) {
        for (kind, n) in tokens {
            if n > 0 {
                let labels = TokenLabels {
                    model: model.to_string(),
                    agent_profile: agent_profile.to_string(),
                    kind,
                };
                self.agent_tokens.get_or_create(&labels).inc_by(n);
            }
        }
        if let Some((currency, amount)) = cost {
            let labels = CostLabels {
                model: model.to_string(),
                agent_profile: agent_profile.to_string(),
                currency: currency.to_string(),
            };
            self.agent_cost.get_or_create(&labels).inc_by(amount);
        }
    }

    /// One webhook delivery attempt came to an answer or a failure.
    pub fn webhook_attempt(&self, succeeded: bool) {
        let outcome = if succeeded { "succeeded" } else { "failed" };
        self.webhook_attempts.get_or_create(&OutcomeLabel { outcome }).inc();
    }

    /// One HTTP request answered.
    pub fn observe(&self, method: &str, route: String, status: u16, elapsed: Duration) {
        let labels = HttpLabels {
            method: method_label(method),
            route,
            status,
        };
        self.http_duration.get_or_create(&labels).observe(elapsed.as_secs_f64());
        self.http_requests.get_or_create(&labels).inc();
    }

    /// The cleanup jobs by state, as one count read them (at start, and by the periodic resync, which
    /// also takes in what other replicas changed).
    pub fn set_cleanup_jobs(&self, by_state: &[(CleanupJobState, i64)]) {
        for state in CleanupJobState::iter() {
            let n = by_state.iter().find(|(s, _)| *s == state).map_or(0, |(_, n)| *n);
            self.cleanup_jobs.get_or_create(&state_label(state)).set(n);
        }
    }

    /// A cleanup job was created in `to` (`from` is `None`) or moved from `from` to `to`.
    pub fn cleanup_job_moved(&self, from: Option<CleanupJobState>, to: CleanupJobState) {
        if let Some(from) = from {
            self.cleanup_jobs.get_or_create(&state_label(from)).dec();
        }
        self.cleanup_jobs.get_or_create(&state_label(to)).inc();
    }

    /// A cleanup job was claimed `waited` after it became due.
    pub fn cleanup_claimed(&self, waited: Duration) {
        self.cleanup_claims.inc();
        self.cleanup_claim_latency.observe(waited.as_secs_f64());
    }

    /// How many cleanup jobs this process claimed (the benches wait on it without querying).
    pub fn cleanup_claims_total(&self) -> u64 {
        self.cleanup_claims.get()
    }

    /// A git command ran for `elapsed` and came to `outcome`.
    pub fn git_command(&self, op: &'static str, elapsed: Duration, outcome: GitOutcome) {
        let label = match outcome {
            GitOutcome::Ok => "ok",
            GitOutcome::Failed => "failed",
            GitOutcome::Timeout => "timeout",
        };
        self.git_duration
            .get_or_create(&GitLabels { op, outcome: label })
            .observe(elapsed.as_secs_f64());
        if outcome != GitOutcome::Ok {
            self.git_failures.get_or_create(&OpLabel { op }).inc();
        }
    }

    /// A crashed agent is being restarted.
    /// A connection from an agent's box to a listed endpoint (`allowed` or `unreachable`).
    pub fn agent_egress(&self, decision: &'static str) {
        self.agent_egress.get_or_create(&DecisionLabel { decision }).inc();
    }

    pub fn agent_restarted(&self) {
        self.agent_restarts.inc();
    }

    /// An event stream opened; it counts as open until the guard drops.
    pub fn stream_opened(&self) -> StreamGuard {
        self.streams_open.inc();
        StreamGuard(self.streams_open.clone())
    }

    /// A stream was told to reset (`truncated`, `slow_consumer`).
    pub fn stream_reset(&self, reason: &'static str) {
        self.stream_resets.get_or_create(&ReasonLabel { reason }).inc();
    }

    /// An event reached the streams `lag` after it was written.
    pub fn event_stamped(&self, wait: Duration) {
        self.event_stamp.observe(wait.as_secs_f64());
    }

    pub fn set_sequencer_leader(&self, leading: bool) {
        self.sequencer_leader.set(i64::from(leading));
    }

    pub fn event_published(&self, lag: Duration) {
        self.event_lag.observe(lag.as_secs_f64());
    }

    /// The exposition: values read from memory at scrape time (pool, live agents) are set first.
    pub fn render(&self, scrape: Scrape) -> String {
        self.pool
            .get_or_create(&StateLabel { state: "open" })
            .set(scrape.pool_open.into());
        self.pool
            .get_or_create(&StateLabel { state: "idle" })
            .set(scrape.pool_idle.into());
        self.pool
            .get_or_create(&StateLabel { state: "in_use" })
            .set(scrape.pool_open.saturating_sub(scrape.pool_idle).into());
        self.pool_max.set(scrape.pool_max.into());
        self.agents_live.set(scrape.live_agents as i64);
        self.restore_max_concurrent.set(scrape.restore_max_concurrent as i64);
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

/// What a scrape reads from the rest of the process.
pub struct Scrape {
    pub pool_open: u32,
    pub pool_idle: u32,
    pub pool_max: u32,
    pub live_agents: usize,
    pub restore_max_concurrent: usize,
}

/// Decrements `berth_event_streams_open` when the stream ends, however it ends.
pub struct StreamGuard(Gauge);

impl Drop for StreamGuard {
    fn drop(&mut self) {
        self.0.dec();
    }
}

fn state_label(state: CleanupJobState) -> StateLabel {
    use CleanupJobState::*;
    StateLabel {
        state: match state {
            Prepared => "prepared",
            Pending => "pending",
            Running => "running",
            RetryWait => "retry_wait",
            Succeeded => "succeeded",
            Failed => "failed",
            Cancelled => "cancelled",
        },
    }
}

/// The methods berth serves; anything else is `other` (a label set must stay small).
fn method_label(method: &str) -> &'static str {
    match method {
        "GET" => "GET",
        "POST" => "POST",
        "PUT" => "PUT",
        "PATCH" => "PATCH",
        "DELETE" => "DELETE",
        "HEAD" => "HEAD",
        "OPTIONS" => "OPTIONS",
        _ => "other",
    }
}

/// What the last restore did.
#[derive(Default)]
pub struct RestoreStats {
    /// The most launches that ran at once (I29: two).
    pub max_concurrent: AtomicUsize,
}

impl RestoreStats {
    pub fn max_concurrent(&self) -> usize {
        self.max_concurrent.load(Ordering::Relaxed)
    }
}
