//! Configuration: defaults, then an optional TOML file (`BERTH_CONFIG`), then `BERTH_*` environment
//! variables (and `berth serve` flags over them), every setting defined once in `settings`; secrets may
//! come from `*_FILE` settings. A bad value is a one-line error naming the setting.
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

pub mod cli;
mod profile;
pub mod remotes;
mod secrets;
pub mod settings;
pub mod signature;
mod source;
pub use profile::{AgentProfile, AgentProtocol, McpServer, McpTransport, NetworkMode, SandboxMode};
use secrets::{load_jwt_key, read_or_create, secret_from_file};
use settings::SETTINGS;
use source::Source;

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

/// Where the JWT verification key comes from.
#[derive(Clone)]
pub enum JwtKey {
    /// HS256 with a shared secret; `generated` when it is the one berth keeps in its data dir, `created`
    /// when this load wrote it there (so nothing running can know it yet).
    Secret {
        secret: Vec<u8>,
        generated: bool,
        created: bool,
    },
    /// EdDSA or RS256 public key (PEM); berth can verify but not mint.
    PublicKeyPem(Vec<u8>),
    /// An identity provider's key set, chosen by `kid`; berth can verify but not mint.
    Jwks {
        source: JwksSource,
        /// Reads of the set on an unknown `kid` are at least this far apart.
        min_refresh: Duration,
        /// The set is read again when it is older than this.
        max_age: Duration,
    },
}

/// Where a JWKS comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JwksSource {
    Url(String),
    File(PathBuf),
}

impl std::fmt::Debug for JwtKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            JwtKey::Secret { generated, created, .. } => {
                write!(f, "Secret(<redacted>, generated: {generated}, created: {created})")
            }
            JwtKey::PublicKeyPem(_) => write!(f, "PublicKeyPem(<redacted>)"),
            JwtKey::Jwks { source, .. } => write!(f, "Jwks({source:?})"),
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
    /// The claims a token's scopes and workspace list are read from.
    pub jwt_scope_claim: String,
    pub jwt_workspaces_claim: String,
    pub worktree_root: PathBuf,
    pub repo_roots: Option<Vec<PathBuf>>,
    pub node_id: String,
    pub log_format: LogFormat,
    pub max_body_bytes: usize,
    pub migration_lock_timeout: Duration,
    pub git_timeout: Duration,
    pub git_max_concurrent: usize,
    /// The limits of one diff answer.
    pub diff_max_file_bytes: usize,
    pub diff_max_files: usize,
    /// How long a `creating` environment stays claimed without a heartbeat from its materializer.
    pub materialize_lease: Duration,
    /// The lease this process holds as an instance of its node: renewed a third of it apart.
    pub node_lease: Duration,
    /// How far a stream subscriber may fall behind before it is told to reset.
    pub event_buffer: usize,
    pub event_retention_count: i64,
    pub event_retention_age: Duration,
    pub event_poll: Duration,
    /// How often a node looks for commands and messages routed to the agents it runs; PostgreSQL
    /// `NOTIFY` wakes it sooner.
    pub routing_poll: Duration,
    /// How long a node waits for the node that runs an agent to carry out a routed command.
    pub routing_deadline: Duration,
    pub sse_keep_alive: Duration,
    /// After `abort`, and after closing an agent's stdin: how long before escalating.
    pub agent_stop_grace: Duration,
    /// After SIGTERM: how long before SIGKILL.
    pub agent_term_grace: Duration,
    /// Limits of each agent's box (cgroups), unless its profile sets its own.
    pub agent_memory_max_mib: u64,
    pub agent_pids_max: u64,
    /// Requests of one agent to berth answered at once (excess ones get a JSON-RPC error).
    pub agent_max_requests_in_flight: usize,
    /// Bytes queued towards one agent's stdin before berth ends it as not reading.
    pub agent_stdin_queue_max_bytes: usize,
    /// From SIGTERM or SIGINT to exit, streams closed and agents stopped on the way.
    pub shutdown_budget: Duration,
    /// Cleanup jobs: retry delays (the last repeats), attempts before `failed`, workers, poll, lease.
    pub cleanup_retry_delays: Vec<Duration>,
    pub cleanup_max_attempts: u32,
    pub cleanup_workers: usize,
    pub cleanup_poll: Duration,
    pub cleanup_lease: Duration,
    /// A prepared job older than this whose operation is not running is reconciled.
    pub cleanup_prepared_grace: Duration,
    /// A superseded environment still naming worktrees this long, of a quiet task, gets a
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
    /// Credentials and API endpoints per remote host (`[remotes."<host>"]`).
    pub remotes: BTreeMap<String, remotes::RemoteHost>,
    /// The author of what berth commits when the token names nobody (`Name <email>`).
    pub git_author: Option<signature::Signature>,
    /// How often open pull requests' states are read again.
    pub pull_request_poll: Duration,
    /// Webhook delivery. How long a receiver may take to answer; how long one event is retried before its
    /// subscription is disabled; how long a rotated-out secret still signs; how long a replica delivers a
    /// subscription between renewals of its lease; plain http to hosts other than loopback.
    pub webhook_timeout: Duration,
    pub webhook_retry_horizon: Duration,
    pub webhook_secret_overlap: Duration,
    pub webhook_lease: Duration,
    pub webhook_allow_http: bool,
    /// Networks webhooks may post to besides public addresses (loopback, private ranges and the like are
    /// refused unless listed here).
    pub webhook_allowed_networks: Vec<ipnet::IpNet>,
    /// A subscription whose oldest undelivered event is older than this no longer holds event retention.
    pub webhook_max_lag: Duration,
    /// Origins (`scheme://host[:port]`, compared exactly) whose pages may call the API from a browser.
    /// Empty: no CORS headers at all.
    pub cors_origins: Vec<String>,
    /// Where the other berth processes reach this one; derived from the bind address when unset.
    pub advertise_url: Option<String>,
    /// An operator lets this decommissioned node start again.
    pub node_readmit: bool,
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
        let mut file = read_file(env)?;
        let agents = take_agents(env, &mut file)?;
        let remotes = remotes::take_remotes(env, &mut file)?;
        let src = Source { env, file };
        let bind = resolve_bind(&src)?;

        let data_dir = PathBuf::from(src.get("data_dir")?.unwrap_or_default());
        if data_dir.as_os_str().is_empty() {
            return Err(bad("BERTH_DATA_DIR", "must not be empty"));
        }
        std::fs::create_dir_all(&data_dir)
            .map_err(|e| bad("BERTH_DATA_DIR", format!("{}: {e}", data_dir.display())))?;
        let data_dir = data_dir
            .canonicalize()
            .map_err(|e| bad("BERTH_DATA_DIR", format!("{}: {e}", data_dir.display())))?;

        // The URL may carry a password, so it may come from a file too.
        let database_url = match secret_from_file("BERTH_DATABASE_URL_FILE", src.get("database_url_file")?)? {
            Some(url) => Some(url),
            None => src.get("database_url")?,
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

        let db_max_connections = src.positive("db_max_connections")?;
        let max_body_bytes = src.num("max_body_bytes")?;
        let lock_ms = src.num("migration_lock_timeout_ms")?;
        let git_timeout = src.positive("git_timeout_secs")?;
        let git_max_concurrent = src.positive("git_max_concurrent")?;
        let diff_max_file_bytes = src.positive("diff_max_file_bytes")?;
        let diff_max_files = src.positive("diff_max_files")?;
        let materialize_lease_secs = src.positive("materialize_lease_secs")?;
        let node_lease_secs = src.positive("node_lease_secs")?;
        let event_buffer = src.positive("event_buffer")?;
        let event_retention_count = src.positive("event_retention_count")?;
        let event_retention_secs = src.num("event_retention_secs")?;
        let event_poll_ms = src.positive("event_poll_ms")?;
        let routing_poll_ms = src.positive("routing_poll_ms")?;
        let routing_deadline_ms = src.positive("routing_deadline_ms")?;
        let sse_keep_alive_secs = src.positive("sse_keepalive_secs")?;
        let sweep_interval_ms = src.positive("sweep_interval_ms")?;
        let stream_interval_ms = src.positive("stream_interval_ms")?;
        let agent_stop_grace_ms = src.num("agent_stop_grace_ms")?;
        let agent_term_grace_ms = src.num("agent_term_grace_ms")?;
        let agent_memory_max_mib = src.positive("agent_memory_max_mib")?;
        let agent_pids_max = src.positive("agent_pids_max")?;
        let agent_max_requests_in_flight = src.positive("agent_max_requests_in_flight")?;
        let agent_stdin_queue_max_bytes = src.positive("agent_stdin_queue_max_bytes")?;
        let shutdown_secs = src.positive("shutdown_secs")?;
        let delays = src.get("cleanup_retry_delays_secs")?.unwrap_or_default();
        let cleanup_retry_delays = delays
            .split(',')
            .map(|d| d.trim().parse::<f64>().map(Duration::from_secs_f64))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| bad("BERTH_CLEANUP_RETRY_DELAYS_SECS", format!("{delays:?}: {e}")))?;
        if cleanup_retry_delays.is_empty() {
            return Err(bad("BERTH_CLEANUP_RETRY_DELAYS_SECS", "give at least one delay"));
        }
        let cleanup_max_attempts = src.positive("cleanup_max_attempts")?;
        let cleanup_workers = src.num("cleanup_workers")?;
        let cleanup_poll_ms = src.positive("cleanup_poll_ms")?;
        let cleanup_lease_secs = src.positive("cleanup_lease_secs")?;
        let cleanup_prepared_grace_secs = src.num("cleanup_prepared_grace_secs")?;
        let superseded_grace_secs = src.num("superseded_grace_secs")?;
        let quick_chat_retention_secs = src.num("quick_chat_retention_secs")?;
        let jwt_key = load_jwt_key(&src, &data_dir)?;
        let jwt_issuer = src.get("jwt_issuer")?.unwrap_or_default();
        let jwt_audience = src.get("jwt_audience")?.unwrap_or_default();
        let jwt_scope_claim = src.get("jwt_scope_claim")?.unwrap_or_default();
        let jwt_workspaces_claim = src.get("jwt_workspaces_claim")?.unwrap_or_default();
        for (var, claim) in [
            ("BERTH_JWT_SCOPE_CLAIM", &jwt_scope_claim),
            ("BERTH_JWT_WORKSPACES_CLAIM", &jwt_workspaces_claim),
        ] {
            if claim.trim().is_empty() {
                return Err(bad(var, "must not be empty"));
            }
        }

        let worktree_root = src
            .get("worktree_root")?
            .map(PathBuf::from)
            .unwrap_or_else(|| data_dir.join("worktrees"));
        if !worktree_root.is_absolute() && worktree_root.components().count() == 0 {
            return Err(bad("BERTH_WORKTREE_ROOT", "must not be empty"));
        }
        std::fs::create_dir_all(&worktree_root)
            .map_err(|e| bad("BERTH_WORKTREE_ROOT", format!("{}: {e}", worktree_root.display())))?;
        let worktree_root = worktree_root
            .canonicalize()
            .map_err(|e| bad("BERTH_WORKTREE_ROOT", format!("{}: {e}", worktree_root.display())))?;

        let repo_roots = match src.get("repo_roots")? {
            Some(list) => {
                let mut out = Vec::new();
                for root in list.split(':').filter(|s| !s.is_empty()).map(PathBuf::from) {
                    let canonical = root
                        .canonicalize()
                        .map_err(|e| bad("BERTH_REPO_ROOTS", format!("{}: {e}", root.display())))?;
                    out.push(canonical);
                }
                Some(out)
            }
            None => None,
        };

        let node_id = match src.get("node_id")? {
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

        let log_format = match src.get("log_format")?.as_deref() {
            None | Some("text") => LogFormat::Text,
            Some("json") => LogFormat::Json,
            Some(other) => {
                return Err(bad("BERTH_LOG_FORMAT", format!("{other:?} is not text or json")));
            }
        };

        let cors_origins: Vec<String> = src
            .get("cors_origins")?
            .unwrap_or_default()
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .collect();
        for origin in &cors_origins {
            check_origin(origin).map_err(|reason| bad("BERTH_CORS_ORIGINS", format!("{origin:?}: {reason}")))?;
        }

        let advertise_url = src.get("advertise_url")?.map(|u| u.trim_end_matches('/').to_string());
        if let Some(u) = &advertise_url
            && !(u.starts_with("http://") || u.starts_with("https://"))
        {
            return Err(bad(
                "BERTH_ADVERTISE_URL",
                format!("{u:?} is not an http:// or https:// URL"),
            ));
        }

        let node_readmit = src.boolean("node_readmit")?;

        let webhook_allow_http = src.boolean("webhook_allow_http")?;
        let webhook_allowed_networks = src
            .get("webhook_allowed_networks")?
            .unwrap_or_default()
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(|n| {
                n.parse::<ipnet::IpNet>()
                    .or_else(|_| n.parse::<std::net::IpAddr>().map(ipnet::IpNet::from))
                    .map_err(|e| {
                        bad(
                            "BERTH_WEBHOOK_ALLOWED_NETWORKS",
                            format!("{n:?}: {e} (give CIDRs, e.g. 127.0.0.0/8,::1/128)"),
                        )
                    })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let webhook_timeout = Duration::from_secs(src.positive("webhook_timeout_secs")?);
        let webhook_lease = Duration::from_secs(src.positive("webhook_lease_secs")?);
        // A deliverer renews its lease between attempts: an attempt must fit in a lease twice over, or a
        // slow receiver would let another replica take the subscription mid-attempt.
        if webhook_lease < webhook_timeout * 2 {
            return Err(bad(
                "BERTH_WEBHOOK_LEASE_SECS",
                "must be at least twice BERTH_WEBHOOK_TIMEOUT_SECS",
            ));
        }

        Ok(Config {
            node_readmit,
            advertise_url,
            bind,
            data_dir,
            database_url,
            db_max_connections,
            jwt_key,
            jwt_issuer,
            jwt_audience,
            jwt_scope_claim,
            jwt_workspaces_claim,
            worktree_root,
            repo_roots,
            node_id,
            log_format,
            max_body_bytes,
            migration_lock_timeout: Duration::from_millis(lock_ms),
            git_timeout: Duration::from_secs(git_timeout),
            git_max_concurrent,
            diff_max_file_bytes,
            diff_max_files,
            materialize_lease: Duration::from_secs(materialize_lease_secs),
            node_lease: Duration::from_secs(node_lease_secs),
            event_buffer,
            event_retention_count,
            event_retention_age: Duration::from_secs(event_retention_secs),
            event_poll: Duration::from_millis(event_poll_ms),
            routing_poll: Duration::from_millis(routing_poll_ms),
            routing_deadline: Duration::from_millis(routing_deadline_ms),
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
            // Only code that builds a Config (the tests) sets it: no variable, flag or key reaches it.
            cleanup_failpoint: None,
            agent_restart_max: src.num("agent_restart_max")?,
            agent_restart_window: Duration::from_secs(src.num("agent_restart_window_secs")?),
            agent_restart_backoff: Duration::from_millis(src.num("agent_restart_backoff_ms")?),
            git_status_interval: Duration::from_millis(src.num("git_status_interval_ms")?),
            agent_term_grace: Duration::from_millis(agent_term_grace_ms),
            agent_memory_max_mib,
            agent_pids_max,
            agent_max_requests_in_flight,
            agent_stdin_queue_max_bytes,
            shutdown_budget: Duration::from_secs(shutdown_secs),
            stream_interval: Duration::from_millis(stream_interval_ms),
            agents,
            remotes,
            git_author: match src.get("git_author")? {
                None => None,
                Some(a) => Some(parse_author(&a).ok_or_else(|| bad("BERTH_GIT_AUTHOR", "must be Name <email>"))?),
            },
            pull_request_poll: Duration::from_secs(src.positive("pull_request_poll_secs")?),
            webhook_timeout,
            webhook_retry_horizon: Duration::from_secs(src.positive("webhook_retry_horizon_secs")?),
            webhook_secret_overlap: Duration::from_secs(src.num("webhook_secret_overlap_secs")?),
            webhook_lease,
            webhook_allow_http,
            webhook_allowed_networks,
            webhook_max_lag: Duration::from_secs(src.positive("webhook_max_lag_secs")?),
            cors_origins,
        })
    }

    /// The listen address alone, as `load` resolves it, touching nothing on disk (`berth healthcheck`).
    pub fn load_bind(env: &dyn Env) -> Result<SocketAddr, ConfigError> {
        resolve_bind(&Source {
            env,
            file: read_file(env)?,
        })
    }

    pub fn is_sqlite(&self) -> bool {
        self.database_url.starts_with("sqlite:")
    }
}

/// The TOML file as a table: unknown keys are refused so typos do not pass silently.
fn read_file(env: &dyn Env) -> Result<toml::Table, ConfigError> {
    let Some(path) = env.get("BERTH_CONFIG") else {
        return Ok(toml::Table::new());
    };
    let text = std::fs::read_to_string(&path).map_err(|e| bad("BERTH_CONFIG", format!("{path}: {e}")))?;
    let table =
        toml::from_str::<toml::Table>(&text).map_err(|e| bad("BERTH_CONFIG", format!("{path}: {}", e.message())))?;
    for key in table.keys() {
        let known = key == "agents" || key == "remotes" || SETTINGS.iter().any(|s| s.in_file && s.key == key);
        if !known {
            return Err(bad("BERTH_CONFIG", format!("{path}: unknown key {key:?}")));
        }
    }
    Ok(table)
}

/// `[agents.<name>]` tables of the file (decision 7: agent profiles come from the file only).
fn take_agents(env: &dyn Env, file: &mut toml::Table) -> Result<BTreeMap<String, AgentProfile>, ConfigError> {
    match file.remove("agents") {
        None => Ok(BTreeMap::new()),
        Some(value) => value.try_into().map_err(|e: toml::de::Error| {
            let path = env.get("BERTH_CONFIG").unwrap_or_default();
            bad("BERTH_CONFIG", format!("{path}: agents: {}", e.message()))
        }),
    }
}

fn resolve_bind(src: &Source) -> Result<SocketAddr, ConfigError> {
    let bind = src.get("bind")?.unwrap_or_default();
    bind.parse().map_err(|e| bad("BERTH_BIND", format!("{bind:?}: {e}")))
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

/// `Name <email>`.
fn parse_author(s: &str) -> Option<signature::Signature> {
    let (name, rest) = s.split_once('<')?;
    let email = rest.strip_suffix('>')?.trim();
    let name = name.trim();
    (!name.is_empty() && email.contains('@')).then(|| signature::Signature {
        name: name.into(),
        email: email.into(),
    })
}

#[cfg(test)]
mod tests;
