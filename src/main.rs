use std::process::ExitCode;

use berth::auth::{JwtVerifier, Scope, parse_ttl};
use berth::config::cli::SettingsArgs;
use berth::config::{Config, Env, JwtKey, ProcessEnv};
use berth::ids::{SessionId, WorkspaceId};
use berth::startup::{Application, open_database};
use berth::store::migrate::MigrateOutcome;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "berth",
    version,
    about = "Control plane for coding agents working in git worktrees"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the server (applies pending migrations first).
    Serve(SettingsArgs),
    /// Apply pending migrations and exit.
    Migrate(SettingsArgs),
    /// Print the effective configuration (flags, variables, file, defaults) as TOML, secrets redacted.
    Config(SettingsArgs),
    /// Print a token signed with the configured key.
    Token {
        /// Who the token is for.
        #[arg(long)]
        sub: String,
        /// Space-separated scopes, e.g. "tasks:read tasks:write".
        #[arg(long)]
        scope: String,
        /// Limit the token to a workspace (repeatable); all workspaces when absent.
        #[arg(long = "workspace")]
        workspaces: Vec<WorkspaceId>,
        /// Bind the token to one session (an agent's token).
        #[arg(long)]
        session: Option<SessionId>,
        /// Lifetime: 90s, 30m, 1h, 7d.
        #[arg(long, default_value = "1h")]
        ttl: String,
        /// Mint even though the data directory had no secret and one was just generated (a server
        /// running with another data directory will reject the token).
        #[arg(long)]
        new_secret: bool,
        #[command(flatten)]
        settings: SettingsArgs,
    },
    /// Print the OpenAPI document.
    Openapi,
    /// Ask the server at the configured bind address whether it is ready (`GET /readyz`): exit 0 when it
    /// answers 200, 1 otherwise, 2 for a bad setting. For a container's health command.
    Healthcheck {
        /// How long to wait for the connection and the answer: 90s, 5s.
        #[arg(long, default_value = "5s")]
        timeout: String,
        #[command(flatten)]
        settings: SettingsArgs,
    },
    /// Import another tool's data into a workspace (berth's database from the usual settings: variables
    /// and BERTH_CONFIG).
    Import {
        #[command(subcommand)]
        source: berth::import::ImportSource,
    },
    /// The agents of the configuration's `[agents.<name>]` profiles.
    Agents {
        #[command(subcommand)]
        action: AgentsAction,
    },
}

#[derive(Subcommand)]
enum AgentsAction {
    /// Start each profile's agent as a launch would, ask who it is (ACP `initialize`: name, version,
    /// capabilities, auth methods; Pi: its model), stop it. Exit 1 if one fails.
    Check {
        /// Check only this profile (repeatable); every profile when absent.
        #[arg(long = "profile")]
        profiles: Vec<String>,
        /// How long each agent has to answer: 30s, 2m.
        #[arg(long, default_value = "60s")]
        timeout: String,
        #[command(flatten)]
        settings: SettingsArgs,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let settings = match &cli.command {
        Command::Serve(s) | Command::Migrate(s) | Command::Config(s) => s.clone(),
        Command::Token { settings, .. }
        | Command::Healthcheck { settings, .. }
        | Command::Agents {
            action: AgentsAction::Check { settings, .. },
        } => settings.clone(),
        Command::Openapi | Command::Import { .. } => SettingsArgs::default(),
    };
    let env = settings.over(&ProcessEnv);
    match &cli.command {
        Command::Openapi => {
            let spec = berth::api::openapi();
            println!("{}", spec.to_pretty_json().expect("the spec serializes"));
            return ExitCode::SUCCESS;
        }
        Command::Healthcheck { timeout, .. } => return healthcheck(&env, timeout),
        _ => {}
    }
    let config = match Config::load(&env) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("berth: {e}");
            return ExitCode::from(2);
        }
    };
    if let Command::Config(_) = cli.command {
        print!("{}", berth::config::cli::render(&config));
        return ExitCode::SUCCESS;
    }
    berth::telemetry::init(config.log_format);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    if let Command::Agents {
        action: AgentsAction::Check { profiles, timeout, .. },
    } = &cli.command
    {
        let code = runtime.block_on(check_agents(&config, profiles, timeout));
        runtime.shutdown_timeout(std::time::Duration::from_millis(200));
        return code;
    }
    if let Command::Import { source } = cli.command {
        return runtime.block_on(berth::import::run_cli(&config, source));
    }
    let result = runtime.block_on(async move {
        match cli.command {
            Command::Serve(_) => serve(config).await,
            Command::Migrate(_) => migrate(config).await,
            Command::Token {
                sub,
                scope,
                workspaces,
                session,
                ttl,
                new_secret,
                ..
            } => token(&config, &sub, &scope, workspaces, session, &ttl, new_secret),
            Command::Openapi
            | Command::Config(_)
            | Command::Healthcheck { .. }
            | Command::Import { .. }
            | Command::Agents { .. } => unreachable!(),
        }
    });
    // Nothing left behind may hold the exit (a blocking task would, were the runtime merely dropped).
    runtime.shutdown_timeout(std::time::Duration::from_millis(200));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("berth: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Exit code from `/readyz` on the address `serve` would bind, read from the same settings; touches no file.
fn healthcheck(env: &dyn Env, timeout: &str) -> ExitCode {
    let timeout = match parse_ttl(timeout) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("berth: --timeout: {e}");
            return ExitCode::from(2);
        }
    };
    let bind = match Config::load_bind(env) {
        Ok(bind) => bind,
        Err(e) => {
            eprintln!("berth: {e}");
            return ExitCode::from(2);
        }
    };
    let addr = berth::healthcheck::target(bind);
    match berth::healthcheck::readyz(addr, timeout) {
        Ok(200) => {
            println!("ready: http://{addr}/readyz answered 200");
            ExitCode::SUCCESS
        }
        Ok(code) => {
            eprintln!("not ready: http://{addr}/readyz answered {code}");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("not ready: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `berth agents check`: one block per profile, `ok` or `FAILED` with the reason.
async fn check_agents(config: &Config, only: &[String], timeout: &str) -> ExitCode {
    let within = match parse_ttl(timeout) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("berth: --timeout: {e}");
            return ExitCode::from(2);
        }
    };
    if let Some(unknown) = only.iter().find(|name| !config.agents.contains_key(*name)) {
        eprintln!("berth: --profile {unknown}: no such profile in the configuration");
        return ExitCode::from(2);
    }
    if config.agents.is_empty() {
        eprintln!("berth: the configuration has no [agents.<name>] profiles (BERTH_CONFIG)");
        return ExitCode::from(2);
    }
    let boxes = berth::runtime::sandbox::Boxes::from_config(config, None);
    let mut failed = 0;
    for (name, profile) in &config.agents {
        if !only.is_empty() && !only.contains(name) {
            continue;
        }
        match berth::runtime::check::check(profile, within, &boxes).await {
            Ok(facts) => {
                println!("{name}: ok");
                for (label, value) in facts {
                    println!("  {label}: {value}");
                }
            }
            Err(reason) => {
                failed += 1;
                println!("{name}: FAILED");
                for line in reason.lines() {
                    println!("  {line}");
                }
            }
        }
    }
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

async fn serve(config: Config) -> anyhow::Result<()> {
    // Not dumpable: processes of the same user (an agent without a box) cannot read berth's memory or its
    // /proc/<pid>/environ, where its secrets are.
    // SAFETY: prctl with constant arguments.
    unsafe {
        libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0);
    }
    let bind = config.bind;
    let admin_token = match &config.jwt_key {
        // Only on the first start with the secret berth keeps itself (a laptop), when it was just made: a
        // token printed at every start would sit in every log (journald, the container's) for its 7 days.
        // An operator-supplied key prints nothing.
        JwtKey::Secret { created: true, .. } => Some(JwtVerifier::from_config(&config)?.mint(
            "admin",
            &[Scope::Admin],
            None,
            None,
            std::time::Duration::from_secs(7 * 86400),
        )?),
        _ => None,
    };
    // Before anything slow: a SIGTERM while starting then waits for the start and shuts down cleanly.
    let signals = berth::graceful::Signals::listen()?;
    let app = Application::build(config).await?;
    let host = if bind.ip().is_unspecified() {
        "127.0.0.1".to_string()
    } else {
        bind.ip().to_string()
    };
    let base = format!("http://{host}:{}", app.port());
    println!("berth is listening on {base}");
    println!("API docs: {base}/docs");
    match admin_token {
        Some(token) => println!(
            "Admin token (valid 7 days; printed only now, on first start; mint others with `berth token`):\n{token}"
        ),
        None => println!("Mint a token with: berth token --sub you --scope admin --ttl 1h (same data directory)"),
    }
    // Until SIGTERM or SIGINT; then streams end, agents stop and we return within BERTH_SHUTDOWN_SECS.
    berth::graceful::serve(app, signals).await
}

async fn migrate(config: Config) -> anyhow::Result<()> {
    let (_db, outcome) = open_database(&config).await?;
    match outcome {
        MigrateOutcome::UpToDate => println!("schema is up to date"),
        MigrateOutcome::Applied { versions, backup } => {
            println!("applied {} migration(s): {}", versions.len(), versions.join(", "));
            if let Some(path) = backup {
                println!("backup taken before migrating: {}", path.display());
            }
        }
    }
    Ok(())
}

fn token(
    config: &Config,
    sub: &str,
    scope: &str,
    workspaces: Vec<WorkspaceId>,
    session: Option<SessionId>,
    ttl: &str,
    new_secret: bool,
) -> anyhow::Result<()> {
    let scopes = scope
        .split_whitespace()
        .map(|s| s.parse::<Scope>())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| anyhow::anyhow!("--scope: {e}"))?;
    if scopes.is_empty() {
        anyhow::bail!("--scope: give at least one scope");
    }
    let ttl = parse_ttl(ttl).map_err(|e| anyhow::anyhow!("--ttl: {e}"))?;
    let workspaces = if workspaces.is_empty() { None } else { Some(workspaces) };
    let dir = config.data_dir.display();
    if let JwtKey::Secret { created: true, .. } = config.jwt_key
        && !new_secret
    {
        // Not left behind: a later `berth serve` here would otherwise adopt a secret nobody asked for.
        let _ = std::fs::remove_file(config.data_dir.join("jwt-secret"));
        anyhow::bail!(
            "data directory {dir} has no JWT secret, so no server using it signed anything: a token signed \
             with a new one would be rejected. Point at the server's data directory (--data-dir or \
             BERTH_DATA_DIR), give its key (BERTH_JWT_SECRET / BERTH_JWT_SECRET_FILE), or pass --new-secret \
             to generate one here"
        );
    }
    let token = JwtVerifier::from_config(config)?.mint(sub, &scopes, workspaces, session, ttl)?;
    // stderr, so `TOKEN=$(berth token ...)` captures only the token.
    match config.jwt_key {
        JwtKey::Secret {
            generated: true,
            created,
            ..
        } => eprintln!(
            "signed with the secret in data directory {dir}{}",
            if created {
                " (generated just now: --new-secret)"
            } else {
                ""
            }
        ),
        _ => eprintln!("signed with the configured key (data directory {dir})"),
    }
    println!("{token}");
    Ok(())
}
