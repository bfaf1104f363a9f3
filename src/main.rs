use std::process::ExitCode;

use berth::auth::{JwtVerifier, Scope, parse_ttl};
use berth::config::{Config, JwtKey, ProcessEnv};
use berth::startup::{Application, open_database};
use berth::store::migrate::MigrateOutcome;
use clap::{Parser, Subcommand};
use uuid::Uuid;

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
    Serve,
    /// Apply pending migrations and exit.
    Migrate,
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
        workspaces: Vec<Uuid>,
        /// Bind the token to one session (an agent's token).
        #[arg(long)]
        session: Option<Uuid>,
        /// Lifetime: 90s, 30m, 1h, 7d.
        #[arg(long, default_value = "1h")]
        ttl: String,
    },
    /// Print the OpenAPI document.
    Openapi,
    /// Import another tool's data into a workspace.
    Import {
        #[command(subcommand)]
        source: berth::import::ImportSource,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Command::Openapi = cli.command {
        let spec = berth::api::openapi();
        println!("{}", spec.to_pretty_json().expect("the spec serializes"));
        return ExitCode::SUCCESS;
    }
    let config = match Config::load(&ProcessEnv) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("berth: {e}");
            return ExitCode::from(2);
        }
    };
    berth::telemetry::init(config.log_format);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    if let Command::Import { source } = cli.command {
        return runtime.block_on(berth::import::run_cli(&config, source));
    }
    let result = runtime.block_on(async move {
        match cli.command {
            Command::Serve => serve(config).await,
            Command::Migrate => migrate(config).await,
            Command::Token {
                sub,
                scope,
                workspaces,
                session,
                ttl,
            } => token(&config, &sub, &scope, workspaces, session, &ttl),
            Command::Openapi | Command::Import { .. } => unreachable!(),
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("berth: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn serve(config: Config) -> anyhow::Result<()> {
    let bind = config.bind;
    let admin_token = match &config.jwt_key {
        // Only for the secret berth keeps itself (a laptop); an operator-supplied key prints nothing.
        JwtKey::Secret { generated: true, .. } => Some(JwtVerifier::from_config(&config)?.mint(
            "admin",
            &[Scope::Admin],
            None,
            None,
            std::time::Duration::from_secs(7 * 86400),
        )?),
        _ => None,
    };
    let app = Application::build(config).await?;
    let host = if bind.ip().is_unspecified() {
        "127.0.0.1".to_string()
    } else {
        bind.ip().to_string()
    };
    let base = format!("http://{host}:{}", app.port());
    println!("berth is listening on {base}");
    println!("API docs: {base}/docs");
    if let Some(token) = admin_token {
        println!("Admin token (valid 7 days; mint others with `berth token`):\n{token}");
    }
    let runtime = app.state.ctx.runtime.clone();
    app.run_until_stopped().await?;
    // Shutdown keeps each session's desired_open, so the next start restores it (I29).
    runtime.stop_all().await;
    Ok(())
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
    workspaces: Vec<Uuid>,
    session: Option<Uuid>,
    ttl: &str,
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
    let token = JwtVerifier::from_config(config)?.mint(sub, &scopes, workspaces, session, ttl)?;
    println!("{token}");
    Ok(())
}
