//! `berth import kandev`: seed 001's ownership cutover applied to a kandev database, written into
//! berth's. Read kandev read-only → normalize (pure) → refuse, or write in one transaction. Nothing on
//! disk is touched: worktrees are adopted where they are, and admission proves them at first launch.
pub mod connection;
pub mod jobs;
pub mod mapping;
pub mod model;
pub mod normalize;
pub mod plan;
pub mod reader;
pub mod report;
pub mod write;
pub mod write_jobs;

#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::path::Path;
use std::process::ExitCode;

use crate::config::Config;
use crate::store::Db;

use plan::RepoProbe;
use report::{Entry, Report};

/// What can be imported.
#[derive(Debug, clap::Subcommand)]
pub enum ImportSource {
    /// Tasks, environments, worktrees, sessions, transcripts, git status and the cleanup kandev still owed,
    /// from a kandev SQLite file or PostgreSQL database.
    Kandev(KandevArgs),
}

#[derive(Debug, clap::Args)]
pub struct KandevArgs {
    /// kandev's database: its SQLite file, e.g. ~/.kandev/data/kandev.db (or one of its backups), or a
    /// PostgreSQL URL, postgres://user:password@host:5432/kandev; read-only either way.
    #[arg(long)]
    pub from: connection::Location,
    /// The berth workspace to import into: created, or the existing one of that name.
    #[arg(long)]
    pub workspace: String,
    /// Report what would be imported, history or refused, and change nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Print the report as one JSON object.
    #[arg(long)]
    pub json: bool,
}

/// Runs the command: 0 on success or a dry run, 1 when refused or failed, 2 on bad usage.
pub async fn run_cli(config: &Config, source: ImportSource) -> ExitCode {
    let ImportSource::Kandev(args) = source;
    if args.workspace.trim().is_empty() || args.workspace.len() > 200 {
        eprintln!("berth: --workspace: give a name of 1 to 200 characters");
        return ExitCode::from(2);
    }
    if let connection::Location::File(path) = &args.from
        && !path.exists()
    {
        eprintln!("berth: --from: {} does not exist", path.display());
        return ExitCode::from(2);
    }
    let (report, code) = match import(config, &args).await {
        Ok(report) => {
            let code = if report.refused.is_empty() || report.dry_run {
                0
            } else {
                1
            };
            (report, code)
        }
        Err((rule, message)) => {
            eprintln!("berth: import refused: {message}");
            let report = Report {
                dry_run: args.dry_run,
                refused: vec![Entry::new(rule, "", "", message)],
                ..Default::default()
            };
            (report, 1)
        }
    };
    if args.json {
        println!("{}", report.to_json());
    } else {
        print!("{}", report.to_text());
    }
    ExitCode::from(code)
}

type Failure = (&'static str, String);

async fn import(config: &Config, args: &KandevArgs) -> Result<Report, Failure> {
    let source = reader::read(&args.from).await.map_err(|e| {
        let rule = match e {
            reader::ReadError::WriteLocked(_) => "database_write_locked",
            _ => "source_unreadable",
        };
        (rule, e.to_string())
    })?;
    let plan = mapping::plan(&source);
    let mut report = Report {
        dry_run: args.dry_run,
        generation: source.generation,
        kandev_version: source.kandev_version.clone(),
        history: plan.history.clone(),
        refused: plan.refused.clone(),
        ..Default::default()
    };
    if !plan.refused.is_empty() {
        // Fails closed before berth's database is even opened.
        return Ok(report);
    }
    let probes: HashMap<String, RepoProbe> = plan.repositories.iter().map(|r| (r.id.clone(), probe(r))).collect();
    let db = open(config, args.dry_run)
        .await
        .map_err(|e| ("target_unavailable", e))?;
    let written = write::write(&db, &args.workspace, config, &plan, &probes, !args.dry_run)
        .await
        .map_err(|e| ("import_failed", format!("{e:#}; berth's database is unchanged")))?;
    let nothing = written.counts.is_zero()
        && written.messages == 0
        && written.repositories == 0
        && written.cleanup_jobs.is_empty();
    report.history.extend(written.history);
    report.cleanup_jobs = written.cleanup_jobs;
    if args.dry_run {
        // Nothing was written: no job id to name.
        report.cleanup_jobs.iter_mut().for_each(|j| j.job_id = None);
    }
    report.already_imported = nothing && written.seen_before;
    report.imported = written.counts;
    report.messages = written.messages;
    report.repositories = written.repositories;
    report.workspace_id = (!nothing).then_some(written.workspace_id);
    db.conn.close_by_ref().await.ok();
    Ok(report)
}

/// berth's database: migrated first (as `serve` does), except for a dry run, which changes nothing and
/// so needs a database that is already up to date.
async fn open(config: &Config, dry_run: bool) -> Result<Db, String> {
    if !dry_run {
        return crate::startup::open_database(config)
            .await
            .map(|(db, _)| db)
            .map_err(|e| format!("{e:#}"));
    }
    let db = Db::connect(&config.database_url, 2)
        .await
        .map_err(|e| format!("cannot open berth's database: {e}"))?;
    let applied = crate::store::migrate::applied_versions(&db.conn)
        .await
        .map_err(|e| e.to_string())?;
    let mut known = crate::store::migrate::known_versions();
    known.sort();
    let mut applied = applied;
    applied.sort();
    if applied != known {
        return Err(
            "berth's database is not migrated to this version; run `berth migrate` first (a dry run changes nothing)"
                .into(),
        );
    }
    Ok(db)
}

/// Read-only: is the kandev repository's path a git work tree, and which.
fn probe(r: &model::Repository) -> RepoProbe {
    let raw = r.local_path.clone().unwrap_or_default();
    if let Ok(canonical) = Path::new(&raw).canonicalize()
        && let Ok(id) = crate::git::inspect_repository(&canonical)
    {
        return RepoProbe {
            path: id.workdir.to_string_lossy().into_owned(),
            common_git_dir: Some(id.common_git_dir.to_string_lossy().into_owned()),
            head_branch: id.head_branch,
        };
    }
    RepoProbe {
        path: if raw.is_empty() {
            format!("(kandev repository {} has no local path)", r.id)
        } else {
            raw
        },
        common_git_dir: None,
        head_branch: None,
    }
}
