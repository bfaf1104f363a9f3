//! Admission (criterion): in-process gix against spawning git.
use super::*;

pub(crate) fn admission(table: &mut Table) {
    use berth::entity::task_environment::ExecutorType;
    use berth::executor::admission::{Candidate, Row as InvRow, Slot, admit};
    let dir = tempfile::TempDir::new().unwrap();
    let root = dir.path().canonicalize().unwrap();
    let task_root = root.join("worktrees/task");
    let mut slots = Vec::new();
    let mut rows = Vec::new();
    for name in ["api", "web", "lib"] {
        let source = root.join(name);
        git_init(&source);
        let wt = task_root.join(name);
        git(
            &source,
            &[
                "worktree",
                "add",
                "-q",
                "-b",
                &format!("berth/{name}"),
                wt.to_str().unwrap(),
            ],
        );
        let repo_info = berth::git::inspect_worktree(&source).unwrap();
        let wt_info = berth::git::inspect_worktree(&wt).unwrap();
        let id = berth::ids::RepositoryId::now_v7();
        slots.push(Slot {
            repository_id: id,
            branch_slug: name.into(),
            common_git_dir: repo_info.common_git_dir,
            source_path: source,
        });
        rows.push(InvRow {
            repository_id: id,
            branch_slug: name.into(),
            worktree_path: Some(wt),
            worktree_id: wt_info.worktree_id,
        });
    }
    let candidate = Candidate {
        environment_id: berth::ids::EnvironmentId::now_v7(),
        executor: ExecutorType::Worktree,
        ready: true,
        task_root: &task_root,
        slots: &slots,
        rows: &rows,
    };
    assert!(
        admit(&candidate, ExecutorType::Worktree).is_ok(),
        "the bench environment is admissible"
    );
    let mut c = criterion::Criterion::default()
        .sample_size(50)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(5))
        .without_plots();
    c.bench_function("admission_gix_3_repositories", |b| {
        b.iter(|| admit(&candidate, ExecutorType::Worktree).unwrap())
    });
    c.bench_function("admission_spawn_git_rev_parse_3_repositories", |b| {
        b.iter(|| {
            for r in &rows {
                let out = Command::new("git")
                    .arg("-C")
                    .arg(r.worktree_path.as_ref().unwrap())
                    .args(["rev-parse", "--git-common-dir", "--show-toplevel"])
                    .output()
                    .unwrap();
                assert!(out.status.success());
            }
        })
    });
    let ours = criterion_median("admission_gix_3_repositories");
    let bare = criterion_median("admission_spawn_git_rev_parse_3_repositories");
    let speedup = bare.as_secs_f64() / ours.as_secs_f64();
    table.add(
        "-",
        "launch admission, 3 repositories (criterion median)",
        fmt_d(ours),
        format!("{} (spawn git rev-parse x3)", fmt_d(bare)),
        format!("{speedup:.1}x faster"),
        ">= 10x faster",
        Some(speedup >= 10.0),
    );
}

/// Criterion's median estimate for a benchmark it just ran.
pub(crate) fn criterion_median(id: &str) -> Duration {
    let base = std::env::var("CRITERION_HOME").map(PathBuf::from).unwrap_or_else(|_| {
        std::env::var("CARGO_TARGET_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|_| Path::new(env!("CARGO_MANIFEST_DIR")).join("target"))
            .join("criterion")
    });
    let path = base.join(id).join("new/estimates.json");
    let v: Value =
        serde_json::from_slice(&std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))).unwrap();
    Duration::from_nanos(v["median"]["point_estimate"].as_f64().unwrap() as u64)
}
