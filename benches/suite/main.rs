//! Berth against the bare work it wraps, measured side by side in one run on SQLite and, when
//! `BERTH_BENCH_POSTGRES_URL` is set, on PostgreSQL (a fresh database there, dropped afterwards).
//!
//! `benches/run.sh` is the one command (it installs `wrk`, then runs `cargo bench --bench suite`). The
//! server under load is the release `berth` binary in its own process, so its resident memory is its own.
//! The bare comparisons run in this process on a pool of the same size against the same database: the
//! domain functions the handlers call (the same SELECTs and transactions, events included, without HTTP,
//! auth and JSON), a claim loop with the claim's SQL and no job logic, `git worktree add`, and spawning
//! `git rev-parse`. Admission uses criterion. Results: stdout and `target/bench-results.md`.
//!
//! Knobs: `BERTH_BENCH_SECS` (each throughput window, default 8), `BERTH_BENCH_SKIP_SQLITE`,
//! `BERTH_BENCH_GROWTH` (largest task count, default 100000), `BERTH_BENCH_JOBS` (default 10000).
//! A filter argument runs only the groups whose name contains it: `admission`, `backend` (everything
//! measured on `run_backend`'s server), `claims` (only the claim rows of each backend), `materialize`
//! (only its materialization row), `reads` (materialization, then the GET and session-cycle rows at
//! 1,000 tasks, twice), `sequencing`
//! (PostgreSQL event sequencing with 1 and 3 replicas), `agents` (berth's CPU and memory per live agent,
//! 16 real Pi and opencode agents streaming; fails when they are not installed), `fleet` (PostgreSQL:
//! create-session latency through a node that forwards it against the owning node), `streaming` (`cargo bench
//! --bench suite -- streaming`), `diffs` (a diff of 1,000 files and of a 10 MiB file, a checkpoint of
//! 10,000 files, against bare git), `webhooks` (PATCH throughput with 10 subscriptions delivering against
//! none, and the delivery lag), `memory` (an ACP agent flooding `fs/read_text_file` while not reading its
//! stdin, and diffs of three 150 MB untracked files, one and four at once: the server's VmRSS and VmHWM),
//! `writer` (a turn's prompt-to-first-token and a restore, 40 of each, median and p90: what the writer
//! lease costs).
mod admission;
mod agents;
mod backend;
mod claims;
mod diffs;
mod events;
mod fleet;
mod git_status;
mod load;
mod materialize;
mod memory;
mod sequencing;
mod streaming;
mod util;
mod webhooks;
mod writer;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use berth::auth::UnboundPrincipal;
use berth::domain::Ctx;
use berth::entity::{cleanup_job as job, git_status_observation as obs, task};
use berth::ids::{CleanupJobId, EnvironmentId, OperationId, RepositoryId, SessionId, TaskId, WorkspaceId};
use sea_orm::{ActiveValue::Set, ConnectionTrait, DatabaseConnection, EntityTrait, PaginatorTrait, Statement};
use serde_json::{Value, json};
use uuid::Uuid;

use admission::*;
use agents::*;
use backend::*;
use claims::*;
use diffs::*;
use events::*;
use fleet::*;
use git_status::*;
use load::*;
use materialize::*;
use memory::*;
use sequencing::*;
use streaming::*;
use util::*;
use webhooks::*;
use writer::*;

pub(crate) const SECRET: &str = "bench-secret-bench-secret-bench-secret-0123";
pub(crate) const READ_CONNECTIONS: usize = 64;
pub(crate) const CYCLE_CLIENTS: usize = 16;
pub(crate) const MATERIALIZE_ROUNDS: usize = 20;
pub(crate) const REPLAY_EVENTS: usize = 10_000;
pub(crate) const FANOUT_EVENTS: usize = 1_000;
pub(crate) const SUBSCRIBERS: usize = 200;
pub(crate) const STATUS_SIZES: [usize; 3] = [10, 10_000, 1_000_000];
pub(crate) const STATUS_READS: usize = 300;

/// One line of the results table.
pub(crate) struct Row {
    pub(crate) backend: String,
    pub(crate) what: String,
    pub(crate) berth: String,
    pub(crate) bare: String,
    pub(crate) ratio: String,
    pub(crate) target: String,
    pub(crate) met: Option<bool>,
}

#[derive(Default)]
pub(crate) struct Table(Vec<Row>);

impl Table {
    #[allow(clippy::too_many_arguments)]
    fn add(
        &mut self,
        backend: &str,
        what: &str,
        berth: String,
        bare: String,
        ratio: String,
        target: &str,
        met: Option<bool>,
    ) {
        let row = Row {
            backend: backend.into(),
            what: what.into(),
            berth,
            bare,
            ratio,
            target: target.into(),
            met,
        };
        println!(
            "| {} | {} | {} | {} | {} | {} | {} |",
            row.backend,
            row.what,
            row.berth,
            row.bare,
            row.ratio,
            row.target,
            verdict(row.met)
        );
        self.0.push(row);
    }

    fn markdown(&self) -> String {
        let mut s = String::from(
            "| backend | what | berth | bare | ratio | target | met |\n| --- | --- | --- | --- | --- | --- | --- |\n",
        );
        for r in &self.0 {
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {} | {} | {} |",
                r.backend,
                r.what,
                r.berth,
                r.bare,
                r.ratio,
                r.target,
                verdict(r.met)
            );
        }
        s
    }
}

pub(crate) fn verdict(met: Option<bool>) -> &'static str {
    match met {
        Some(true) => "yes",
        Some(false) => "**no**",
        None => "reported",
    }
}

pub(crate) fn secs() -> u64 {
    std::env::var("BERTH_BENCH_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(8)
}

pub(crate) fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|s| s.parse().ok()).unwrap_or(default)
}

pub(crate) fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut table = Table::default();
    println!("| backend | what | berth | bare | ratio | target | met |\n| --- | --- | --- | --- | --- | --- | --- |");
    let filter = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    let wants = |group: &str| filter.as_deref().is_none_or(|f| group.contains(f));
    if wants("admission") {
        admission(&mut table);
    }
    rt.block_on(async {
        if wants("diffs") {
            diffs(&mut table).await;
        }
        let mut backends = Vec::new();
        if std::env::var("BERTH_BENCH_SKIP_SQLITE").is_err() {
            backends.push(("sqlite", None));
        }
        match std::env::var("BERTH_BENCH_POSTGRES_URL") {
            Ok(url) => backends.push(("postgres", Some(url))),
            Err(_) => eprintln!("BERTH_BENCH_POSTGRES_URL is not set: SQLite only"),
        }
        for (backend, url) in backends {
            if wants("backend") {
                run_backend(&mut table, backend, url.clone(), None).await;
            } else if let Some(only) = ["claims", "materialize", "reads", "webhooks"]
                .into_iter()
                .find(|g| wants(g))
            {
                run_backend(&mut table, backend, url.clone(), Some(only)).await;
            }
            if let Some(url) = &url
                && wants("sequencing")
            {
                sequencing(&mut table, url).await;
            }
            if let Some(url) = &url
                && wants("fleet")
            {
                fleet(&mut table, url).await;
            }
            if wants("agents") {
                agents(&mut table, backend, url.clone()).await;
            }
            if wants("memory") {
                memory(&mut table, backend, url.clone()).await;
            }
            if wants("writer") {
                writer(&mut table, backend, url.clone()).await;
            }
            if wants("streaming") {
                streaming(&mut table, backend, url).await;
            }
        }
    });
    let target = std::env::var("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| Path::new(env!("CARGO_MANIFEST_DIR")).join("target"));
    let out = target.join("bench-results.md");
    std::fs::create_dir_all(&target).unwrap();
    std::fs::write(&out, table.markdown()).unwrap();
    eprintln!("\nresults written to {}", out.display());
}
