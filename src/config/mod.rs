//! Configuration: defaults, then an optional TOML file (`BERTH_CONFIG`), then `BERTH_*` environment
//! variables; secrets may come from `*_FILE` variables. A bad value is a one-line error naming the setting.
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

mod secrets;
use secrets::{load_jwt_key, read_or_create, secret_from_file};

#[derive(Debug, thiserror::Error)]
#[error("invalid {setting}: {reason}")]
pub struct ConfigError {
    pub setting: String,
    pub reason: String,
}

fn bad(setting: &str, reason: impl std::fmt::Display) -> ConfigError {
    ConfigError {
        setting: setting.to_string(),
        reason: reason.to_string(),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Text,
    Json,
}

/// An agent profile: defined only in the config file, never accepted over HTTP (decision 7).
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct AgentProfile {
    pub command: String,
    #[serde(default)]
    pub args: Vec<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Names of berth's own environment variables handed on to the agent, when set (issue 20: model
    /// credentials come from the operator's environment, never written into the configuration file).
    #[serde(default)]
    pub pass_env: Vec<String>,
    /// How berth talks to the agent beyond the JSON-lines commands every agent speaks.
    #[serde(default)]
    pub protocol: AgentProtocol,
}

/// `jsonl`: commands and events as JSON lines, nothing kept between launches. `pi`: the Pi coding agent's
/// RPC mode, whose conversation berth keeps in a file of its own per session and hands back on every
/// relaunch (`--session <file>`), so the agent continues the same conversation (seed 002).
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
pub enum AgentProtocol {
    #[default]
    #[serde(rename = "jsonl")]
    JsonLines,
    #[serde(rename = "pi")]
    Pi,
}

/// Where the JWT verification key comes from.
#[derive(Clone)]
pub enum JwtKey {
    /// HS256 with a shared secret; `generated` when it is the one berth keeps in its data dir.
    Secret { secret: Vec<u8>, generated: bool },
    /// EdDSA or RS256 public key (PEM); berth can verify but not mint.
    PublicKeyPem(Vec<u8>),
}

impl std::fmt::Debug for JwtKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            JwtKey::Secret { generated, .. } => {
                write!(f, "Secret(<redacted>, generated: {generated})")
            }
            JwtKey::PublicKeyPem(_) => write!(f, "PublicKeyPem(<redacted>)"),
        }
    }
}

#[derive(Debug, Clone)]
pub struct Config {
    pub bind: SocketAddr,
    pub data_dir: PathBuf,
    pub database_url: String,
    pub db_max_connections: u32,
    pub jwt_key: JwtKey,
    pub jwt_issuer: String,
    pub jwt_audience: String,
    pub worktree_root: PathBuf,
    pub repo_roots: Option<Vec<PathBuf>>,
    pub node_id: String,
    pub log_format: LogFormat,
    pub max_body_bytes: usize,
    pub migration_lock_timeout: Duration,
    pub git_timeout: Duration,
    pub git_max_concurrent: usize,
    /// How long a `creating` environment stays claimed without a heartbeat from its materializer.
    pub materialize_lease: Duration,
    /// How far a stream subscriber may fall behind before it is told to reset.
    pub event_buffer: usize,
    pub event_retention_count: i64,
    pub event_retention_age: Duration,
    pub event_poll: Duration,
    /// How often a node looks for commands and messages routed to the agents it runs (issue 15, item 4);
    /// PostgreSQL `NOTIFY` wakes it sooner.
    pub routing_poll: Duration,
    pub sse_keep_alive: Duration,
    /// After `abort`, and after closing an agent's stdin: how long before escalating.
    pub agent_stop_grace: Duration,
    /// After SIGTERM: how long before SIGKILL.
    pub agent_term_grace: Duration,
    /// Cleanup jobs: retry delays (the last repeats), attempts before `failed`, workers, poll, lease.
    pub cleanup_retry_delays: Vec<Duration>,
    pub cleanup_max_attempts: u32,
    pub cleanup_workers: usize,
    pub cleanup_poll: Duration,
    pub cleanup_lease: Duration,
    /// A prepared job older than this whose operation is not running is reconciled.
    pub cleanup_prepared_grace: Duration,
    /// Issue 17 item 1: a superseded environment still naming worktrees this long, of a quiet task, gets a
    /// `superseded_cleanup` job (the reconcile pass runs every `sweep_interval`).
    pub superseded_grace: Duration,
    /// A test failpoint in the cleanup worker (`hang_after_claim`).
    pub cleanup_failpoint: Option<String>,
    /// I30: restarts of a crashed agent allowed in `agent_restart_window`, and the first backoff.
    pub agent_restart_max: u32,
    pub agent_restart_window: Duration,
    pub agent_restart_backoff: Duration,
    /// At most one live git inspection per repository per this interval while an agent works (I25).
    pub git_status_interval: Duration,
    /// An agent's streamed deltas are written as one `runtime.output` event per session per interval.
    pub stream_interval: Duration,
    /// A quick-chat task idle this long with no live session is deleted.
    pub quick_chat_retention: Duration,
    /// Period of the background sweeps (event retention).
    pub sweep_interval: Duration,
    pub agents: BTreeMap<String, AgentProfile>,
    /// Origins (`scheme://host[:port]`, compared exactly) whose pages may call the API from a browser
    /// (issue 16, item 1). Empty: no CORS headers at all.
    pub cors_origins: Vec<String>,
}

/// The TOML file: every key optional, unknown keys rejected so typos do not pass silently.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    bind: Option<String>,
    data_dir: Option<PathBuf>,
    database_url: Option<String>,
    db_max_connections: Option<u32>,
    jwt_secret: Option<String>,
    jwt_secret_file: Option<PathBuf>,
    jwt_public_key_file: Option<PathBuf>,
    jwt_issuer: Option<String>,
    jwt_audience: Option<String>,
    worktree_root: Option<PathBuf>,
    repo_roots: Option<Vec<PathBuf>>,
    node_id: Option<String>,
    log_format: Option<String>,
    max_body_bytes: Option<usize>,
    migration_lock_timeout_ms: Option<u64>,
    git_timeout_secs: Option<u64>,
    git_max_concurrent: Option<usize>,
    materialize_lease_secs: Option<u64>,
    event_buffer: Option<usize>,
    event_retention_count: Option<i64>,
    event_retention_secs: Option<u64>,
    event_poll_ms: Option<u64>,
    routing_poll_ms: Option<u64>,
    sse_keep_alive_secs: Option<u64>,
    sweep_interval_ms: Option<u64>,
    agent_stop_grace_ms: Option<u64>,
    cleanup_retry_delays_secs: Option<String>,
    cleanup_max_attempts: Option<u32>,
    cleanup_workers: Option<usize>,
    cleanup_poll_ms: Option<u64>,
    cleanup_lease_secs: Option<u64>,
    cleanup_prepared_grace_secs: Option<u64>,
    superseded_grace_secs: Option<u64>,
    quick_chat_retention_secs: Option<u64>,
    git_status_interval_ms: Option<u64>,
    stream_interval_ms: Option<u64>,
    agent_restart_max: Option<u32>,
    agent_restart_window_secs: Option<u64>,
    agent_restart_backoff_ms: Option<u64>,
    agent_term_grace_ms: Option<u64>,
    cors_origins: Option<Vec<String>>,
    #[serde(default)]
    agents: BTreeMap<String, AgentProfile>,
}

/// A source of `BERTH_*` variables; the process environment in production, a map in tests.
pub trait Env {
    fn get(&self, name: &str) -> Option<String>;
}

pub struct ProcessEnv;
impl Env for ProcessEnv {
    fn get(&self, name: &str) -> Option<String> {
        std::env::var(name).ok().filter(|v| !v.is_empty())
    }
}

impl Env for BTreeMap<String, String> {
    fn get(&self, name: &str) -> Option<String> {
        BTreeMap::get(self, name).cloned().filter(|v| !v.is_empty())
    }
}

impl Config {
    /// Loads the configuration and prepares the data dir (secret and node id are generated on first use).
    pub fn load(env: &dyn Env) -> Result<Config, ConfigError> {
        let file = match env.get("BERTH_CONFIG") {
            Some(path) => {
                let text = std::fs::read_to_string(&path).map_err(|e| bad("BERTH_CONFIG", format!("{path}: {e}")))?;
                toml::from_str::<FileConfig>(&text)
                    .map_err(|e| bad("BERTH_CONFIG", format!("{path}: {}", e.message())))?
            }
            None => FileConfig::default(),
        };

        let pick = |var: &str, from_file: Option<String>| env.get(var).or(from_file);

        let bind = pick("BERTH_BIND", file.bind.clone()).unwrap_or_else(|| "127.0.0.1:8080".into());
        let bind: SocketAddr = bind.parse().map_err(|e| bad("BERTH_BIND", format!("{bind:?}: {e}")))?;

        let data_dir = env
            .get("BERTH_DATA_DIR")
            .map(PathBuf::from)
            .or(file.data_dir.clone())
            .unwrap_or_else(|| "./berth-data".into());
        if data_dir.as_os_str().is_empty() {
            return Err(bad("BERTH_DATA_DIR", "must not be empty"));
        }
        std::fs::create_dir_all(&data_dir)
            .map_err(|e| bad("BERTH_DATA_DIR", format!("{}: {e}", data_dir.display())))?;
        let data_dir = data_dir
            .canonicalize()
            .map_err(|e| bad("BERTH_DATA_DIR", format!("{}: {e}", data_dir.display())))?;

        // The URL may carry a password, so it may come from a file too.
        let database_url = match secret_from_file(env, "BERTH_DATABASE_URL_FILE")? {
            Some(url) => Some(url),
            None => pick("BERTH_DATABASE_URL", file.database_url.clone()),
        };
        let database_url =
            database_url.unwrap_or_else(|| format!("sqlite://{}?mode=rwc", data_dir.join("berth.db").display()));
        if !(database_url.starts_with("sqlite:")
            || database_url.starts_with("postgres://")
            || database_url.starts_with("postgresql://"))
        {
            return Err(bad(
                "BERTH_DATABASE_URL",
                "must start with sqlite:, postgres:// or postgresql://",
            ));
        }

        let db_max_connections = parse_num(env, "BERTH_DB_MAX_CONNECTIONS", file.db_max_connections, 10u32)?;
        if db_max_connections == 0 {
            return Err(bad("BERTH_DB_MAX_CONNECTIONS", "must be at least 1"));
        }
        let max_body_bytes = parse_num(env, "BERTH_MAX_BODY_BYTES", file.max_body_bytes, 256 * 1024usize)?;
        let lock_ms = parse_num(
            env,
            "BERTH_MIGRATION_LOCK_TIMEOUT_MS",
            file.migration_lock_timeout_ms,
            60_000u64,
        )?;

        let git_timeout = parse_num(env, "BERTH_GIT_TIMEOUT_SECS", file.git_timeout_secs, 120u64)?;
        let git_max_concurrent = parse_num(env, "BERTH_GIT_MAX_CONCURRENT", file.git_max_concurrent, 4usize)?;
        if git_timeout == 0 || git_max_concurrent == 0 {
            return Err(bad(
                if git_timeout == 0 {
                    "BERTH_GIT_TIMEOUT_SECS"
                } else {
                    "BERTH_GIT_MAX_CONCURRENT"
                },
                "must be at least 1",
            ));
        }
        let materialize_lease_secs =
            parse_num(env, "BERTH_MATERIALIZE_LEASE_SECS", file.materialize_lease_secs, 120u64)?;
        if materialize_lease_secs == 0 {
            return Err(bad("BERTH_MATERIALIZE_LEASE_SECS", "must be at least 1"));
        }
        let event_buffer = parse_num(env, "BERTH_EVENT_BUFFER", file.event_buffer, 1024usize)?;
        let event_retention_count = parse_num(
            env,
            "BERTH_EVENT_RETENTION_COUNT",
            file.event_retention_count,
            100_000i64,
        )?;
        let event_retention_secs = parse_num(
            env,
            "BERTH_EVENT_RETENTION_SECS",
            file.event_retention_secs,
            7 * 86400u64,
        )?;
        let event_poll_ms = parse_num(env, "BERTH_EVENT_POLL_MS", file.event_poll_ms, 1000u64)?;
        let routing_poll_ms = parse_num(env, "BERTH_ROUTING_POLL_MS", file.routing_poll_ms, 500u64)?;
        let sse_keep_alive_secs = parse_num(env, "BERTH_SSE_KEEPALIVE_SECS", file.sse_keep_alive_secs, 15u64)?;
        let sweep_interval_ms = parse_num(env, "BERTH_SWEEP_INTERVAL_MS", file.sweep_interval_ms, 60_000u64)?;
        let stream_interval_ms = parse_num(env, "BERTH_STREAM_INTERVAL_MS", file.stream_interval_ms, 100u64)?;
        let agent_stop_grace_ms = parse_num(env, "BERTH_AGENT_STOP_GRACE_MS", file.agent_stop_grace_ms, 5000u64)?;
        let agent_term_grace_ms = parse_num(env, "BERTH_AGENT_TERM_GRACE_MS", file.agent_term_grace_ms, 5000u64)?;
        let delays = env
            .get("BERTH_CLEANUP_RETRY_DELAYS_SECS")
            .or(file.cleanup_retry_delays_secs.clone())
            .unwrap_or_else(|| "60,300,900,3600,10800,21600,43200".into());
        let cleanup_retry_delays = delays
            .split(',')
            .map(|d| d.trim().parse::<f64>().map(Duration::from_secs_f64))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| bad("BERTH_CLEANUP_RETRY_DELAYS_SECS", format!("{delays:?}: {e}")))?;
        if cleanup_retry_delays.is_empty() {
            return Err(bad("BERTH_CLEANUP_RETRY_DELAYS_SECS", "give at least one delay"));
        }
        let cleanup_max_attempts = parse_num(env, "BERTH_CLEANUP_MAX_ATTEMPTS", file.cleanup_max_attempts, 8u32)?;
        let cleanup_workers = parse_num(env, "BERTH_CLEANUP_WORKERS", file.cleanup_workers, 2usize)?;
        let cleanup_poll_ms = parse_num(env, "BERTH_CLEANUP_POLL_MS", file.cleanup_poll_ms, 5000u64)?;
        let cleanup_lease_secs = parse_num(env, "BERTH_CLEANUP_LEASE_SECS", file.cleanup_lease_secs, 300u64)?;
        let cleanup_prepared_grace_secs = parse_num(
            env,
            "BERTH_CLEANUP_PREPARED_GRACE_SECS",
            file.cleanup_prepared_grace_secs,
            60u64,
        )?;
        let superseded_grace_secs = parse_num(env, "BERTH_SUPERSEDED_GRACE_SECS", file.superseded_grace_secs, 600u64)?;
        let quick_chat_retention_secs = parse_num(
            env,
            "BERTH_QUICK_CHAT_RETENTION_SECS",
            file.quick_chat_retention_secs,
            7 * 86400u64,
        )?;
        for (name, zero) in [
            ("BERTH_CLEANUP_MAX_ATTEMPTS", cleanup_max_attempts == 0),
            ("BERTH_CLEANUP_POLL_MS", cleanup_poll_ms == 0),
            ("BERTH_CLEANUP_LEASE_SECS", cleanup_lease_secs == 0),
        ] {
            if zero {
                return Err(bad(name, "must be at least 1"));
            }
        }
        for (name, zero) in [
            ("BERTH_EVENT_BUFFER", event_buffer == 0),
            ("BERTH_EVENT_RETENTION_COUNT", event_retention_count < 1),
            ("BERTH_EVENT_POLL_MS", event_poll_ms == 0),
            ("BERTH_ROUTING_POLL_MS", routing_poll_ms == 0),
            ("BERTH_SSE_KEEPALIVE_SECS", sse_keep_alive_secs == 0),
            ("BERTH_SWEEP_INTERVAL_MS", sweep_interval_ms == 0),
            ("BERTH_STREAM_INTERVAL_MS", stream_interval_ms == 0),
        ] {
            if zero {
                return Err(bad(name, "must be at least 1"));
            }
        }
        let jwt_key = load_jwt_key(env, &file, &data_dir)?;
        let jwt_issuer = pick("BERTH_JWT_ISSUER", file.jwt_issuer.clone()).unwrap_or_else(|| "berth".into());
        let jwt_audience = pick("BERTH_JWT_AUDIENCE", file.jwt_audience.clone()).unwrap_or_else(|| "berth-api".into());

        let worktree_root = env
            .get("BERTH_WORKTREE_ROOT")
            .map(PathBuf::from)
            .or(file.worktree_root.clone())
            .unwrap_or_else(|| data_dir.join("worktrees"));
        if !worktree_root.is_absolute() && worktree_root.components().count() == 0 {
            return Err(bad("BERTH_WORKTREE_ROOT", "must not be empty"));
        }
        std::fs::create_dir_all(&worktree_root)
            .map_err(|e| bad("BERTH_WORKTREE_ROOT", format!("{}: {e}", worktree_root.display())))?;
        let worktree_root = worktree_root
            .canonicalize()
            .map_err(|e| bad("BERTH_WORKTREE_ROOT", format!("{}: {e}", worktree_root.display())))?;

        let repo_roots = match env.get("BERTH_REPO_ROOTS") {
            Some(list) => Some(
                list.split(':')
                    .filter(|s| !s.is_empty())
                    .map(PathBuf::from)
                    .collect::<Vec<_>>(),
            ),
            None => file.repo_roots.clone(),
        };
        let repo_roots = match repo_roots {
            Some(roots) => {
                let mut out = Vec::new();
                for root in roots {
                    let canonical = root
                        .canonicalize()
                        .map_err(|e| bad("BERTH_REPO_ROOTS", format!("{}: {e}", root.display())))?;
                    out.push(canonical);
                }
                Some(out)
            }
            None => None,
        };

        let node_id = match pick("BERTH_NODE_ID", file.node_id.clone()) {
            Some(id) => id,
            None => read_or_create(&data_dir.join("node-id"), || {
                uuid::Uuid::now_v7().to_string().into_bytes()
            })
            .map_err(|e| bad("BERTH_NODE_ID", e))
            .map(|(bytes, _)| String::from_utf8_lossy(&bytes).trim().to_string())?,
        };
        if node_id.is_empty() || node_id.len() > 200 {
            return Err(bad("BERTH_NODE_ID", "must be 1 to 200 characters"));
        }

        let log_format = match pick("BERTH_LOG_FORMAT", file.log_format.clone()).as_deref() {
            None | Some("text") => LogFormat::Text,
            Some("json") => LogFormat::Json,
            Some(other) => {
                return Err(bad("BERTH_LOG_FORMAT", format!("{other:?} is not text or json")));
            }
        };

        let cors_origins = match env.get("BERTH_CORS_ORIGINS") {
            Some(list) => list
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_string)
                .collect(),
            None => file.cors_origins.clone().unwrap_or_default(),
        };
        for origin in &cors_origins {
            check_origin(origin).map_err(|reason| bad("BERTH_CORS_ORIGINS", format!("{origin:?}: {reason}")))?;
        }

        Ok(Config {
            bind,
            data_dir,
            database_url,
            db_max_connections,
            jwt_key,
            jwt_issuer,
            jwt_audience,
            worktree_root,
            repo_roots,
            node_id,
            log_format,
            max_body_bytes,
            migration_lock_timeout: Duration::from_millis(lock_ms),
            git_timeout: Duration::from_secs(git_timeout),
            git_max_concurrent,
            materialize_lease: Duration::from_secs(materialize_lease_secs),
            event_buffer,
            event_retention_count,
            event_retention_age: Duration::from_secs(event_retention_secs),
            event_poll: Duration::from_millis(event_poll_ms),
            routing_poll: Duration::from_millis(routing_poll_ms),
            sse_keep_alive: Duration::from_secs(sse_keep_alive_secs),
            sweep_interval: Duration::from_millis(sweep_interval_ms),
            agent_stop_grace: Duration::from_millis(agent_stop_grace_ms),
            cleanup_retry_delays,
            cleanup_max_attempts,
            cleanup_workers,
            cleanup_poll: Duration::from_millis(cleanup_poll_ms),
            cleanup_lease: Duration::from_secs(cleanup_lease_secs),
            cleanup_prepared_grace: Duration::from_secs(cleanup_prepared_grace_secs),
            superseded_grace: Duration::from_secs(superseded_grace_secs),
            quick_chat_retention: Duration::from_secs(quick_chat_retention_secs),
            cleanup_failpoint: env.get("BERTH_CLEANUP_FAILPOINT"),
            agent_restart_max: parse_num(env, "BERTH_AGENT_RESTART_MAX", file.agent_restart_max, 5u32)?,
            agent_restart_window: Duration::from_secs(parse_num(
                env,
                "BERTH_AGENT_RESTART_WINDOW_SECS",
                file.agent_restart_window_secs,
                600u64,
            )?),
            agent_restart_backoff: Duration::from_millis(parse_num(
                env,
                "BERTH_AGENT_RESTART_BACKOFF_MS",
                file.agent_restart_backoff_ms,
                1000u64,
            )?),
            git_status_interval: Duration::from_millis(parse_num(
                env,
                "BERTH_GIT_STATUS_INTERVAL_MS",
                file.git_status_interval_ms,
                2000u64,
            )?),
            agent_term_grace: Duration::from_millis(agent_term_grace_ms),
            stream_interval: Duration::from_millis(stream_interval_ms),
            agents: file.agents,
            cors_origins,
        })
    }

    pub fn is_sqlite(&self) -> bool {
        self.database_url.starts_with("sqlite:")
    }
}

/// An origin as a browser sends it: `http` or `https`, a host, an optional port, nothing else (no path,
/// no trailing slash, no wildcard).
fn check_origin(origin: &str) -> Result<(), &'static str> {
    let rest = origin
        .strip_prefix("https://")
        .or_else(|| origin.strip_prefix("http://"))
        .ok_or("an origin starts with http:// or https://")?;
    let (host, port) = match rest.rsplit_once(':') {
        Some((h, p)) if !p.contains(']') => (h, Some(p)),
        _ => (rest, None),
    };
    if host.is_empty() || !host.bytes().all(|b| b.is_ascii_alphanumeric() || b"-.[]:".contains(&b)) {
        return Err("an origin is scheme://host[:port], exactly as the browser sends it (no path, no wildcard)");
    }
    if let Some(p) = port
        && p.parse::<u16>().is_err()
    {
        return Err("the port is not a number");
    }
    Ok(())
}

fn parse_num<T: std::str::FromStr + Copy>(
    env: &dyn Env,
    var: &str,
    from_file: Option<T>,
    default: T,
) -> Result<T, ConfigError>
where
    T::Err: std::fmt::Display,
{
    match env.get(var) {
        Some(v) => v.trim().parse::<T>().map_err(|e| bad(var, format!("{v:?}: {e}"))),
        None => Ok(from_file.unwrap_or(default)),
    }
}

#[cfg(test)]
mod tests;
