//! Configuration: defaults, files, environment and secrets, and the errors that name the setting.
use super::*;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

fn env(pairs: &[(&str, &str)], dir: &Path) -> BTreeMap<String, String> {
    let mut m: BTreeMap<String, String> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    m.entry("BERTH_DATA_DIR".into())
        .or_insert_with(|| dir.display().to_string());
    m
}

#[test]
fn defaults_need_no_configuration_and_keep_generated_values() {
    let dir = tempfile::TempDir::new().unwrap();
    let c = Config::load(&env(&[], dir.path())).unwrap();
    let data = dir.path().canonicalize().unwrap();
    assert_eq!(c.bind.to_string(), "127.0.0.1:8080");
    assert_eq!(
        c.database_url,
        format!("sqlite://{}?mode=rwc", data.join("berth.db").display())
    );
    assert_eq!(c.worktree_root, data.join("worktrees"));
    assert!(c.worktree_root.is_dir());
    assert_eq!((c.jwt_issuer.as_str(), c.jwt_audience.as_str()), ("berth", "berth-api"));
    assert_eq!(c.log_format, LogFormat::Text);
    assert!(c.repo_roots.is_none());
    let JwtKey::Secret { secret, generated, .. } = &c.jwt_key else {
        panic!("expected a secret")
    };
    assert!(generated);
    let mode = std::fs::metadata(data.join("jwt-secret")).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "the secret is private");
    // A second start reads the same secret and node id.
    let again = Config::load(&env(&[], dir.path())).unwrap();
    let JwtKey::Secret { secret: secret2, .. } = &again.jwt_key else {
        panic!()
    };
    assert_eq!(secret, secret2);
    assert_eq!(c.node_id, again.node_id);
}

#[test]
fn bad_values_name_the_setting() {
    let dir = tempfile::TempDir::new().unwrap();
    let cases = [
        ("BERTH_BIND", "nonsense"),
        ("BERTH_LOG_FORMAT", "xml"),
        ("BERTH_DB_MAX_CONNECTIONS", "many"),
        ("BERTH_DB_MAX_CONNECTIONS", "0"),
        ("BERTH_STREAM_INTERVAL_MS", "0"),
        ("BERTH_DATABASE_URL", "mysql://x"),
        ("BERTH_JWT_SECRET", "short"),
        ("BERTH_JWT_SECRET_FILE", "/nonexistent/secret"),
        ("BERTH_REPO_ROOTS", "/nonexistent/root"),
        ("BERTH_CONFIG", "/nonexistent/berth.toml"),
        ("BERTH_CORS_ORIGINS", "*"),
        ("BERTH_CORS_ORIGINS", "https://app.example/"),
        ("BERTH_CORS_ORIGINS", "app.example"),
        ("BERTH_CORS_ORIGINS", "https://ok.example,http://x:port"),
    ];
    for (var, value) in cases {
        let err = Config::load(&env(&[(var, value)], dir.path())).unwrap_err();
        assert_eq!(err.setting, var, "{err}");
        assert!(err.to_string().starts_with(&format!("invalid {var}: ")), "{err}");
        assert!(!err.to_string().contains('\n'), "one line: {err}");
    }
}

#[test]
fn file_then_environment_then_secret_files() {
    let dir = tempfile::TempDir::new().unwrap();
    let file = dir.path().join("berth.toml");
    std::fs::write(
        &file,
        "bind = \"127.0.0.1:9000\"\njwt_issuer = \"from-file\"\nlog_format = \"json\"\n[agents.pi]\ncommand = \"pi\"\nargs = [\"--mode\", \"rpc\"]\n",
    )
    .unwrap();
    let secret = dir.path().join("secret");
    std::fs::write(&secret, "0123456789abcdef0123456789abcdef\n").unwrap();
    let url = dir.path().join("url");
    std::fs::write(&url, "postgres://u:p@db/berth\n").unwrap();
    let c = Config::load(&env(
        &[
            ("BERTH_CONFIG", file.to_str().unwrap()),
            ("BERTH_BIND", "127.0.0.1:9001"),
            ("BERTH_JWT_SECRET_FILE", secret.to_str().unwrap()),
            ("BERTH_DATABASE_URL_FILE", url.to_str().unwrap()),
        ],
        dir.path(),
    ))
    .unwrap();
    assert_eq!(c.bind.port(), 9001, "the environment wins over the file");
    assert_eq!(c.jwt_issuer, "from-file");
    assert_eq!(c.log_format, LogFormat::Json);
    assert_eq!(c.database_url, "postgres://u:p@db/berth");
    assert_eq!(c.agents["pi"].args, vec!["--mode", "rpc"]);
    assert!(c.cors_origins.is_empty(), "no CORS by default");
    let JwtKey::Secret { secret, generated, .. } = &c.jwt_key else {
        panic!()
    };
    assert_eq!(secret.as_slice(), b"0123456789abcdef0123456789abcdef");
    assert!(!generated);
    // Unknown keys in the file are refused, naming the file setting.
    std::fs::write(&file, "bnid = \"x\"\n").unwrap();
    let err = Config::load(&env(&[("BERTH_CONFIG", file.to_str().unwrap())], dir.path())).unwrap_err();
    assert_eq!(err.setting, "BERTH_CONFIG");
    assert!(err.reason.contains("bnid"), "{err}");
}

/// Each setting's variable and flag come from its key; the file takes the same keys.
#[test]
fn one_definition_gives_the_variable_flag_and_key() {
    let s = settings::find("sse_keepalive_secs");
    assert_eq!(s.var(), "BERTH_SSE_KEEPALIVE_SECS");
    assert_eq!(s.flag(), "sse-keepalive-secs");
    let mut keys: Vec<&str> = SETTINGS.iter().map(|s| s.key).collect();
    keys.sort();
    keys.dedup();
    assert_eq!(keys.len(), SETTINGS.len(), "keys are unique");
    assert!(SETTINGS.iter().all(|s| {
        s.key
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
    }));
}

/// Every in-file setting set to a non-default value through its variable, rendered by `berth config`,
/// then loaded back from that output as a file: the same configuration (so the file's keys and the
/// variables reach the same fields, and the output is a valid configuration).
#[test]
fn the_rendered_configuration_loads_back_the_same() {
    let dir = tempfile::TempDir::new().unwrap();
    let roots = dir.path().join("roots");
    std::fs::create_dir_all(&roots).unwrap();
    let pairs = [
        ("BERTH_BIND", "127.0.0.1:9123".to_string()),
        ("BERTH_DB_MAX_CONNECTIONS", "3".into()),
        ("BERTH_JWT_ISSUER", "iss-x".into()),
        ("BERTH_JWT_AUDIENCE", "aud-x".into()),
        ("BERTH_WORKTREE_ROOT", dir.path().join("wt").display().to_string()),
        ("BERTH_REPO_ROOTS", roots.display().to_string()),
        ("BERTH_NODE_ID", "node-x".into()),
        ("BERTH_LOG_FORMAT", "json".into()),
        ("BERTH_MAX_BODY_BYTES", "1000".into()),
        ("BERTH_MIGRATION_LOCK_TIMEOUT_MS", "7".into()),
        ("BERTH_GIT_TIMEOUT_SECS", "9".into()),
        ("BERTH_GIT_MAX_CONCURRENT", "2".into()),
        ("BERTH_MATERIALIZE_LEASE_SECS", "11".into()),
        ("BERTH_EVENT_BUFFER", "12".into()),
        ("BERTH_EVENT_RETENTION_COUNT", "13".into()),
        ("BERTH_EVENT_RETENTION_SECS", "14".into()),
        ("BERTH_EVENT_POLL_MS", "15".into()),
        ("BERTH_ROUTING_POLL_MS", "16".into()),
        ("BERTH_ROUTING_DEADLINE_MS", "1600".into()),
        ("BERTH_SSE_KEEPALIVE_SECS", "17".into()),
        ("BERTH_SWEEP_INTERVAL_MS", "18".into()),
        ("BERTH_STREAM_INTERVAL_MS", "19".into()),
        ("BERTH_AGENT_STOP_GRACE_MS", "20".into()),
        ("BERTH_AGENT_TERM_GRACE_MS", "21".into()),
        ("BERTH_AGENT_RESTART_MAX", "22".into()),
        ("BERTH_AGENT_RESTART_WINDOW_SECS", "23".into()),
        ("BERTH_AGENT_RESTART_BACKOFF_MS", "24".into()),
        ("BERTH_CLEANUP_RETRY_DELAYS_SECS", "0.5,2".into()),
        ("BERTH_CLEANUP_MAX_ATTEMPTS", "25".into()),
        ("BERTH_CLEANUP_WORKERS", "3".into()),
        ("BERTH_CLEANUP_POLL_MS", "26".into()),
        ("BERTH_CLEANUP_LEASE_SECS", "27".into()),
        ("BERTH_CLEANUP_PREPARED_GRACE_SECS", "28".into()),
        ("BERTH_QUICK_CHAT_RETENTION_SECS", "29".into()),
        ("BERTH_GIT_STATUS_INTERVAL_MS", "30".into()),
        ("BERTH_CORS_ORIGINS", "https://a.example,http://b.example:81".into()),
    ];
    let vars: Vec<(&str, &str)> = pairs.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let c = Config::load(&env(&vars, dir.path())).unwrap();
    let rendered = cli::render(&c);
    // Every in-file setting that has a value appears uncommented (only the secret is commented out).
    for s in SETTINGS
        .iter()
        .filter(|s| s.in_file && !s.secret && (s.show)(&c).is_some())
    {
        assert!(
            rendered.contains(&format!("\n{} = ", s.key)),
            "{} missing:\n{rendered}",
            s.key
        );
    }
    // Every variable set above changed what is shown from the default.
    let defaults = cli::render(&Config::load(&env(&[], dir.path())).unwrap());
    for (var, _) in &pairs {
        let key = var.trim_start_matches("BERTH_").to_ascii_lowercase();
        let line = |text: &str| {
            text.lines()
                .find(|l| l.starts_with(&format!("{key} = ")))
                .map(str::to_string)
        };
        assert_ne!(line(&rendered), line(&defaults), "{var} reaches what is shown");
    }
    let file = dir.path().join("effective.toml");
    std::fs::write(&file, &rendered).unwrap();
    let back = Config::load(&env(&[("BERTH_CONFIG", file.to_str().unwrap())], dir.path())).unwrap();
    assert_eq!(cli::render(&back), rendered);
}

#[test]
fn secrets_are_redacted_and_the_failpoint_is_no_setting() {
    let dir = tempfile::TempDir::new().unwrap();
    let c = Config::load(&env(
        &[
            ("BERTH_JWT_SECRET", "0123456789abcdef0123456789abcdef-topsecret"),
            ("BERTH_DATABASE_URL", "postgres://berth:hunter2-pass@db:5432/berth"),
            ("BERTH_CLEANUP_FAILPOINT", "hang_after_claim"),
        ],
        dir.path(),
    ))
    .unwrap();
    let mut c = c;
    assert_eq!(c.cleanup_failpoint, None, "no variable reaches the failpoint");
    c.agents.insert(
        "pi".into(),
        AgentProfile {
            command: "pi".into(),
            env: [("ANTHROPIC_API_KEY".to_string(), "sk-model-credential".to_string())].into(),
            ..Default::default()
        },
    );
    let out = cli::render(&c);
    for secret in ["topsecret", "hunter2-pass", "sk-model-credential"] {
        assert!(!out.contains(secret), "{secret} shown:\n{out}");
    }
    assert!(
        out.contains("# database_url = \"postgres://berth:<redacted>@db:5432/berth\""),
        "{out}"
    );
    assert!(out.contains("# jwt_secret = \"<redacted>\""), "{out}");
    assert!(out.contains("ANTHROPIC_API_KEY = \"<redacted>\""), "{out}");
    assert_eq!(
        settings::redact_url("sqlite:///x/berth.db?mode=rwc"),
        "sqlite:///x/berth.db?mode=rwc"
    );
    assert_eq!(settings::redact_url("postgres://u@h/db"), "postgres://u@h/db");
}

/// Flags (laid over the environment by `main`) win over variables, which win over the file.
#[test]
fn flags_then_variables_then_file() {
    use clap::{Args, FromArgMatches};
    let dir = tempfile::TempDir::new().unwrap();
    let file = dir.path().join("berth.toml");
    std::fs::write(
        &file,
        "bind = \"127.0.0.1:7001\"\njwt_issuer = \"file\"\nevent_buffer = 5\n",
    )
    .unwrap();
    let cmd = cli::SettingsArgs::augment_args(clap::Command::new("serve"));
    let matches = cmd
        .try_get_matches_from([
            "serve",
            "--bind",
            "127.0.0.1:7003",
            "--cleanup-retry-delays-secs",
            "1,2",
        ])
        .unwrap();
    let flags = cli::SettingsArgs::from_arg_matches(&matches).unwrap();
    assert_eq!(flags.flags.len(), 2, "defaults are not flags: {:?}", flags.flags);
    let base = env(
        &[
            ("BERTH_CONFIG", file.to_str().unwrap()),
            ("BERTH_BIND", "127.0.0.1:7002"),
            ("BERTH_JWT_ISSUER", "env"),
        ],
        dir.path(),
    );
    let c = Config::load(&flags.over(&base)).unwrap();
    assert_eq!(c.bind.port(), 7003);
    assert_eq!(c.jwt_issuer, "env");
    assert_eq!(c.event_buffer, 5);
    assert_eq!(
        c.cleanup_retry_delays,
        vec![Duration::from_secs(1), Duration::from_secs(2)]
    );
    // A file value of the wrong shape names the setting.
    std::fs::write(&file, "event_buffer = [1]\n").unwrap();
    let err = Config::load(&env(&[("BERTH_CONFIG", file.to_str().unwrap())], dir.path())).unwrap_err();
    assert_eq!(err.setting, "BERTH_EVENT_BUFFER", "{err}");
}

/// `[[agents.<name>.mcp_servers]]`: a server the agent starts or one it reaches by URL; a table that is
/// neither is refused; `berth config` never shows their env or header values.
#[test]
fn mcp_servers_are_read_from_the_file_and_their_secrets_redacted() {
    let dir = tempfile::TempDir::new().unwrap();
    let file = dir.path().join("berth.toml");
    std::fs::write(
        &file,
        r#"
[agents.claude]
command = "claude-agent-acp"
protocol = "acp"

[[agents.claude.mcp_servers]]
name = "files"
command = "/usr/bin/mcp-files"
args = ["--root", "."]
env = { FILES_TOKEN = "secret-token-1" }

[[agents.claude.mcp_servers]]
name = "tickets"
url = "https://mcp.example.com/tickets"
headers = { Authorization = "Bearer secret-token-2" }
"#,
    )
    .unwrap();
    let c = Config::load(&env(&[("BERTH_CONFIG", file.to_str().unwrap())], dir.path())).unwrap();
    let servers = &c.agents["claude"].mcp_servers;
    assert_eq!(servers.len(), 2);
    assert!(matches!(&servers[0], McpServer::Stdio { name, args, .. } if name == "files" && args.len() == 2));
    assert!(matches!(
        &servers[1],
        McpServer::Remote { transport: McpTransport::Http, url, .. } if url.ends_with("/tickets")
    ));
    let out = cli::render(&c);
    for secret in ["secret-token-1", "secret-token-2"] {
        assert!(!out.contains(secret), "{secret} shown:\n{out}");
    }
    assert!(out.contains("FILES_TOKEN = \"<redacted>\""), "{out}");
    let back = dir.path().join("back.toml");
    std::fs::write(&back, &out).unwrap();
    let again = Config::load(&env(&[("BERTH_CONFIG", back.to_str().unwrap())], dir.path())).unwrap();
    assert_eq!(again.agents["claude"].mcp_servers.len(), 2, "what is shown reads back");

    std::fs::write(
        &file,
        "[agents.x]\ncommand = \"x\"\n[[agents.x.mcp_servers]]\nname = \"neither\"\n",
    )
    .unwrap();
    let err = Config::load(&env(&[("BERTH_CONFIG", file.to_str().unwrap())], dir.path())).unwrap_err();
    assert_eq!(err.setting, "BERTH_CONFIG", "{err}");
}
