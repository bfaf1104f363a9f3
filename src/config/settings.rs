//! Every setting, defined once: its TOML key, from which its `BERTH_*` variable and its `berth serve`
//! flag are derived, its default, its help line, and how `berth config` shows its effective value.
use std::path::Path;
use std::time::Duration;

use toml::Value;

use super::Config;

/// What a setting falls back to when neither a flag, the environment nor the file sets it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fallback {
    /// No value: the feature is off (or another setting provides it).
    None,
    /// This value, parsed as if it had been given.
    Value(&'static str),
    /// Computed at load time (from the data dir); the text says how.
    Computed(&'static str),
}

pub struct Setting {
    /// The TOML key; the variable is `BERTH_` + the key in upper case, the flag `--` + the key with dashes.
    pub key: &'static str,
    pub default: Fallback,
    pub help: &'static str,
    /// Never shown: `berth config` and `--help` redact it.
    pub secret: bool,
    /// A list setting: its items joined by this in a variable or a flag; an array in the file.
    pub separator: Option<char>,
    /// Whether the TOML file may set it (`config`, the file's own path, may not).
    pub in_file: bool,
    /// The effective value, as `berth config` prints it (`None`: unset).
    pub show: fn(&Config) -> Option<Value>,
}

impl Setting {
    pub fn var(&self) -> String {
        format!("BERTH_{}", self.key.to_ascii_uppercase())
    }

    pub fn flag(&self) -> String {
        self.key.replace('_', "-")
    }
}

const fn setting(
    key: &'static str,
    default: Fallback,
    help: &'static str,
    show: fn(&Config) -> Option<Value>,
) -> Setting {
    Setting {
        key,
        default,
        help,
        secret: false,
        separator: None,
        in_file: true,
        show,
    }
}

const fn secret(mut s: Setting) -> Setting {
    s.secret = true;
    s
}

const fn list(mut s: Setting, separator: char) -> Setting {
    s.separator = Some(separator);
    s
}

fn int(n: impl TryInto<i64>) -> Option<Value> {
    Some(Value::Integer(n.try_into().unwrap_or(i64::MAX)))
}
fn ms(d: Duration) -> Option<Value> {
    int(d.as_millis())
}
fn secs(d: Duration) -> Option<Value> {
    int(d.as_secs())
}
fn text(s: impl ToString) -> Option<Value> {
    Some(Value::String(s.to_string()))
}
fn path(p: &Path) -> Option<Value> {
    text(p.display())
}
fn redacted() -> Option<Value> {
    text("<redacted>")
}
fn unset(_: &Config) -> Option<Value> {
    None
}

use Fallback::{Computed, None as Unset, Value as Is};

/// The settings, in the order `--help` lists them.
pub static SETTINGS: &[Setting] = &[
    Setting {
        in_file: false,
        ..setting(
            "config",
            Unset,
            "TOML file with any of these settings (keys as the flags, with underscores) and the agent profiles ([agents.<name>] command, args, env, protocol)",
            |_| None,
        )
    },
    setting("bind", Is("127.0.0.1:8080"), "Listen address", |c| text(c.bind)),
    setting(
        "data_dir",
        Is("./berth-data"),
        "SQLite file, generated secret, node id, backups",
        |c| path(&c.data_dir),
    ),
    secret(setting(
        "database_url",
        Computed("sqlite://<data dir>/berth.db"),
        "sqlite:… or postgres://user:pass@host/db (its password is redacted when shown)",
        |c| text(redact_url(&c.database_url)),
    )),
    setting(
        "database_url_file",
        Unset,
        "File holding the database URL (wins over database_url)",
        unset,
    ),
    setting(
        "db_max_connections",
        Is("10"),
        "The most database connections this process opens, all its pools together",
        |c| int(c.db_max_connections),
    ),
    secret(setting(
        "jwt_secret",
        Computed("generated on first start into <data dir>/jwt-secret (0600)"),
        "HS256 key, at least 32 bytes",
        |c| match c.jwt_key {
            super::JwtKey::Secret { .. } => redacted(),
            _ => None,
        },
    )),
    setting("jwt_secret_file", Unset, "File holding the HS256 key", unset),
    setting(
        "jwt_public_key_file",
        Unset,
        "EdDSA or RS256 public key (PEM) instead of the secret; `berth token` cannot mint then",
        unset,
    ),
    setting(
        "jwt_jwks_url",
        Unset,
        "An identity provider's JWKS (https://…/jwks.json): tokens are verified with the key their kid names; berth cannot mint then",
        |c| match &c.jwt_key {
            super::JwtKey::Jwks {
                source: super::JwksSource::Url(url),
                ..
            } => text(url),
            _ => None,
        },
    ),
    setting(
        "jwt_jwks_file",
        Unset,
        "A JWKS in a local file instead of a URL (read again like the URL's)",
        |c| match &c.jwt_key {
            super::JwtKey::Jwks {
                source: super::JwksSource::File(file),
                ..
            } => path(file),
            _ => None,
        },
    ),
    setting(
        "jwt_jwks_cache_secs",
        Is("300"),
        "The JWKS is read again when it is older than this (a removed key stops working within it)",
        |c| match &c.jwt_key {
            super::JwtKey::Jwks { max_age, .. } => secs(*max_age),
            _ => None,
        },
    ),
    setting(
        "jwt_jwks_min_refresh_secs",
        Is("30"),
        "A token with an unknown kid reads the JWKS again, at most once per this interval",
        |c| match &c.jwt_key {
            super::JwtKey::Jwks { min_refresh, .. } => secs(*min_refresh),
            _ => None,
        },
    ),
    setting("jwt_issuer", Is("berth"), "Expected `iss`", |c| text(&c.jwt_issuer)),
    setting("jwt_audience", Is("berth-api"), "Expected `aud`", |c| {
        text(&c.jwt_audience)
    }),
    setting(
        "jwt_scope_claim",
        Is("scope"),
        "The claim holding the scopes (a space-separated string or a list), e.g. scp",
        |c| text(&c.jwt_scope_claim),
    ),
    setting(
        "jwt_workspaces_claim",
        Is("workspaces"),
        "The claim holding the workspace ids a token is limited to (absent: all)",
        |c| text(&c.jwt_workspaces_claim),
    ),
    setting(
        "worktree_root",
        Computed("<data dir>/worktrees"),
        "The only place berth creates or removes files",
        |c| path(&c.worktree_root),
    ),
    list(
        setting(
            "repo_roots",
            Unset,
            "Colon-separated directories repositories may be registered from (unset: any path)",
            |c| {
                c.repo_roots
                    .as_ref()
                    .map(|roots| Value::Array(roots.iter().filter_map(|r| path(r)).collect()))
            },
        ),
        ':',
    ),
    setting(
        "node_id",
        Computed("generated once into <data dir>/node-id"),
        "The node whose filesystem holds an environment",
        |c| text(&c.node_id),
    ),
    setting("log_format", Is("text"), "text or json (filter with RUST_LOG)", |c| {
        text(match c.log_format {
            super::LogFormat::Text => "text",
            super::LogFormat::Json => "json",
        })
    }),
    setting("max_body_bytes", Is("262144"), "Largest request body", |c| {
        int(c.max_body_bytes)
    }),
    setting(
        "migration_lock_timeout_ms",
        Is("60000"),
        "How long migrations wait for locks (PostgreSQL), and how long opening a locked SQLite file is retried",
        |c| ms(c.migration_lock_timeout),
    ),
    setting("git_timeout_secs", Is("120"), "Bound on each git call", |c| {
        secs(c.git_timeout)
    }),
    setting(
        "diff_max_file_bytes",
        Is("1048576"),
        "The largest patch of one file a diff answer carries; a longer one is cut at a line and marked truncated",
        |c| int(c.diff_max_file_bytes),
    ),
    setting(
        "diff_max_files",
        Is("500"),
        "Files in one diff answer; more are paged by file with a cursor",
        |c| int(c.diff_max_files),
    ),
    setting("git_max_concurrent", Is("4"), "git calls running at once", |c| {
        int(c.git_max_concurrent)
    }),
    setting(
        "git_author",
        Unset,
        "The author (Name <email>) of what berth commits and merges when the token has no name and email claims",
        |c| {
            c.git_author
                .as_ref()
                .map(|a| text(format!("{} <{}>", a.name, a.email)))
                .unwrap_or(None)
        },
    ),
    setting(
        "pull_request_poll_secs",
        Is("300"),
        "How often the state of each open pull request berth opened is read again from its host",
        |c| secs(c.pull_request_poll),
    ),
    setting(
        "webhook_timeout_secs",
        Is("10"),
        "How long berth waits for a webhook receiver to answer one delivery",
        |c| secs(c.webhook_timeout),
    ),
    setting(
        "webhook_retry_horizon_secs",
        Is("86400"),
        "How long berth retries one event (with backoff) before it disables a webhook subscription",
        |c| secs(c.webhook_retry_horizon),
    ),
    setting(
        "webhook_secret_overlap_secs",
        Is("86400"),
        "How long a webhook's rotated-out secret still signs deliveries beside the new one",
        |c| secs(c.webhook_secret_overlap),
    ),
    setting(
        "webhook_lease_secs",
        Is("60"),
        "How long one replica delivers a webhook subscription without renewing (at least twice the timeout)",
        |c| secs(c.webhook_lease),
    ),
    setting(
        "webhook_allow_http",
        Is("false"),
        "Lets webhooks post over plain http to hosts other than loopback",
        |c| Some(Value::Boolean(c.webhook_allow_http)),
    ),
    list(
        setting(
            "webhook_allowed_networks",
            Unset,
            "Comma-separated CIDRs (127.0.0.0/8,::1/128) webhooks may post to besides public addresses; loopback, private, link-local and the like are refused otherwise",
            |c| {
                Some(Value::Array(
                    c.webhook_allowed_networks
                        .iter()
                        .filter_map(|n| text(n.to_string()))
                        .collect(),
                ))
            },
        ),
        ',',
    ),
    setting(
        "webhook_max_lag_secs",
        Is("86400"),
        "How far behind (the age of its oldest undelivered event) a webhook subscription may fall before it no longer holds event retention",
        |c| secs(c.webhook_max_lag),
    ),
    setting(
        "materialize_lease_secs",
        Is("120"),
        "How long a preparing environment stays claimed without a heartbeat",
        |c| secs(c.materialize_lease),
    ),
    setting(
        "advertise_url",
        Computed("http://<bind address>:<port> (this host's name for 0.0.0.0)"),
        "Where the other berth processes reach this one: requests that need this node's disk or agents are forwarded there",
        |c| c.advertise_url.as_ref().map(text).unwrap_or(None),
    ),
    setting(
        "node_readmit",
        Is("false"),
        "Lets a node that was decommissioned start again (true once, after checking what it holds); without it, such a node refuses to start",
        |c| Some(Value::Boolean(c.node_readmit)),
    ),
    setting(
        "node_lease_secs",
        Is("15"),
        "The lease each berth process renews (a third of it apart); a node whose every process let it lapse is down",
        |c| secs(c.node_lease),
    ),
    setting(
        "event_buffer",
        Is("1024"),
        "How far a stream may fall behind before it is reset",
        |c| int(c.event_buffer),
    ),
    setting("event_retention_count", Is("100000"), "Events kept (count)", |c| {
        int(c.event_retention_count)
    }),
    setting("event_retention_secs", Is("604800"), "Events kept (age)", |c| {
        secs(c.event_retention_age)
    }),
    setting(
        "event_poll_ms",
        Is("1000"),
        "Event tail poll (a fallback: commits and PostgreSQL NOTIFY wake it)",
        |c| ms(c.event_poll),
    ),
    setting(
        "routing_poll_ms",
        Is("500"),
        "How often a node looks for aborts, stops, answers and messages routed to its agents (a fallback: NOTIFY wakes it)",
        |c| ms(c.routing_poll),
    ),
    setting(
        "routing_deadline_ms",
        Is("30000"),
        "How long a node waits for the node that runs an agent to carry out a routed abort, stop or answer (then 503; a cleanup job retries)",
        |c| ms(c.routing_deadline),
    ),
    setting("sse_keepalive_secs", Is("15"), "Event stream keep-alive", |c| {
        secs(c.sse_keep_alive)
    }),
    setting(
        "sweep_interval_ms",
        Is("60000"),
        "Period of the retention sweeps",
        |c| ms(c.sweep_interval),
    ),
    setting(
        "stream_interval_ms",
        Is("100"),
        "An agent's streamed deltas become at most one runtime.output event per session per interval",
        |c| ms(c.stream_interval),
    ),
    setting(
        "agent_stop_grace_ms",
        Is("5000"),
        "Stop escalation: after abort and closing stdin, before SIGTERM",
        |c| ms(c.agent_stop_grace),
    ),
    setting(
        "agent_term_grace_ms",
        Is("5000"),
        "Stop escalation: after SIGTERM, before SIGKILL",
        |c| ms(c.agent_term_grace),
    ),
    setting(
        "agent_memory_max_mib",
        Is("4096"),
        "An agent's memory limit (MiB) in its box, for it and what it starts, where cgroups can be used; a profile's memory_max_mib overrides it",
        |c| int(c.agent_memory_max_mib),
    ),
    setting(
        "agent_pids_max",
        Is("512"),
        "An agent's process and thread limit in its box, where cgroups can be used; a profile's pids_max overrides it",
        |c| int(c.agent_pids_max),
    ),
    setting(
        "agent_max_requests_in_flight",
        Is("8"),
        "Requests of one agent to berth (ACP's fs/read_text_file, fs/write_text_file) answered at once; the agent gets a JSON-RPC error for each one past it",
        |c| int(c.agent_max_requests_in_flight),
    ),
    setting(
        "agent_stdin_queue_max_bytes",
        Is("33554432"),
        "Bytes berth holds queued towards one agent's stdin; an agent that stops reading so that its queue would pass this is ended and its session failed with agent_not_reading",
        |c| int(c.agent_stdin_queue_max_bytes),
    ),
    setting(
        "shutdown_secs",
        Is("20"),
        "On SIGTERM or SIGINT: event streams end (clients are told to reconnect), agents are stopped (abort, SIGTERM, SIGKILL) and berth exits within this budget",
        |c| secs(c.shutdown_budget),
    ),
    setting(
        "agent_restart_max",
        Is("5"),
        "Restarts of a crashed agent allowed in agent_restart_window_secs",
        |c| int(c.agent_restart_max),
    ),
    setting(
        "agent_restart_window_secs",
        Is("600"),
        "Window of agent_restart_max",
        |c| secs(c.agent_restart_window),
    ),
    setting(
        "agent_restart_backoff_ms",
        Is("1000"),
        "First backoff before restarting a crashed agent (doubles each time)",
        |c| ms(c.agent_restart_backoff),
    ),
    list(
        setting(
            "cleanup_retry_delays_secs",
            Is("60,300,900,3600,10800,21600,43200"),
            "Cleanup retry schedule, comma-separated (the last delay repeats)",
            |c| {
                Some(Value::Array(
                    c.cleanup_retry_delays
                        .iter()
                        .map(|d| Value::Float(d.as_secs_f64()))
                        .collect(),
                ))
            },
        ),
        ',',
    ),
    setting(
        "cleanup_max_attempts",
        Is("8"),
        "Cleanup attempts before a job is failed",
        |c| int(c.cleanup_max_attempts),
    ),
    setting("cleanup_workers", Is("2"), "Cleanup workers per process", |c| {
        int(c.cleanup_workers)
    }),
    setting(
        "cleanup_poll_ms",
        Is("5000"),
        "Cleanup workers' poll (a fallback: new jobs wake them)",
        |c| ms(c.cleanup_poll),
    ),
    setting(
        "cleanup_lease_secs",
        Is("300"),
        "The lease a running cleanup job holds",
        |c| secs(c.cleanup_lease),
    ),
    setting(
        "cleanup_prepared_grace_secs",
        Is("60"),
        "A prepared cleanup job older than this whose operation is not running is reconciled",
        |c| secs(c.cleanup_prepared_grace),
    ),
    setting(
        "superseded_grace_secs",
        Is("600"),
        "A superseded environment still holding worktrees this long, of a quiet task, gets a superseded_cleanup job",
        |c| secs(c.superseded_grace),
    ),
    setting(
        "quick_chat_retention_secs",
        Is("604800"),
        "Idle time after which a quick-chat task is deleted",
        |c| secs(c.quick_chat_retention),
    ),
    setting(
        "git_status_interval_ms",
        Is("2000"),
        "At most one live git inspection per repository per interval while an agent works",
        |c| ms(c.git_status_interval),
    ),
    list(
        setting(
            "cors_origins",
            Unset,
            "Comma-separated exact origins (https://board.example:8443) whose pages may call the API",
            |c| Some(Value::Array(c.cors_origins.iter().filter_map(text).collect())),
        ),
        ',',
    ),
];

pub fn find(key: &str) -> &'static Setting {
    SETTINGS
        .iter()
        .find(|s| s.key == key)
        .unwrap_or_else(|| panic!("{key} is not in SETTINGS"))
}

/// A URL with its password (if any) replaced by `<redacted>`.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let (authority, tail) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    match authority.rsplit_once('@') {
        Some((userinfo, host)) => {
            let user = userinfo.split(':').next().unwrap_or("");
            let shown = if userinfo.contains(':') {
                format!("{user}:<redacted>")
            } else {
                user.to_string()
            };
            format!("{scheme}://{shown}@{host}{tail}")
        }
        None => url.to_string(),
    }
}
