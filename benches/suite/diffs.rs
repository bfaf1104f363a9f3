//! What the agent did, fast enough to click: berth's diff of a 1,000-file change and
//! of a 10 MiB file (`git::diff::changes`, scope `all`: a temporary index, the listing, the patches and
//! the untracked paths) and its checkpoint of a 10,000-file worktree (`git::diff::snapshot`), each
//! against the bare git work done by hand: copy the index, `git add --all` into it, then `git diff
//! --cached <merge base> -M -C` (the merge base computed beforehand) or `git write-tree`. Rounds
//! alternate berth and bare; the medians are compared.
use super::*;

use berth::git::cli::GitCli;
use berth::git::diff::{Request, Scope, changes, snapshot};

const ROUNDS: usize = 7;
const TARGET: f64 = 1.3;

fn commit_all(dir: &Path, message: &str) {
    git(dir, &["add", "--all"]);
    git(
        dir,
        &[
            "-c",
            "user.name=bench",
            "-c",
            "user.email=bench@example.com",
            "commit",
            "-q",
            "-m",
            message,
        ],
    );
}

/// A repository at `root/name` with `files(dir)` committed on main, and a task worktree on its own branch.
fn repository(root: &Path, name: &str, files: impl Fn(&Path)) -> PathBuf {
    let source = root.join(name);
    git_init(&source);
    files(&source);
    commit_all(&source, "content");
    let wt = root.join(format!("{name}-task"));
    git(
        &source,
        &[
            "worktree",
            "add",
            "-q",
            "-b",
            &format!("task/{name}"),
            wt.to_str().unwrap(),
        ],
    );
    wt
}

fn lines(n: usize, tag: &str) -> String {
    (0..n)
        .map(|i| format!("{tag} line {i} of some source text\n"))
        .collect()
}

/// The bare work: the worktree's index copied, everything added to the copy, then `last` with that index.
fn bare(wt: &Path, scratch: &Path, last: &[&str]) -> Vec<u8> {
    let index = scratch.join(format!("bare-{}", Uuid::now_v7()));
    let git_dir = Command::new("git")
        .arg("-C")
        .arg(wt)
        .args(["rev-parse", "--git-path", "index"])
        .output()
        .unwrap();
    let own = PathBuf::from(String::from_utf8_lossy(&git_dir.stdout).trim());
    let own = if own.is_absolute() { own } else { wt.join(own) };
    std::fs::copy(&own, &index).unwrap();
    // As berth does (and as git needs): the copy keeps the index's time, so a file changed in the same
    // clock tick as the index was written is not taken for unchanged.
    let modified = std::fs::metadata(&own).unwrap().modified().unwrap();
    std::fs::File::options()
        .write(true)
        .open(&index)
        .unwrap()
        .set_modified(modified)
        .unwrap();
    let run = |args: &[&str]| {
        let out = Command::new("git")
            .arg("-C")
            .arg(wt)
            .env("GIT_INDEX_FILE", &index)
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "git {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        out.stdout
    };
    run(&["add", "--all", "--", ":/"]);
    let out = run(last);
    let _ = std::fs::remove_file(&index);
    out
}

/// Median of berth's and of the bare side's times, rounds alternated.
async fn compare<F, Fut>(mut ours: F, mut theirs: impl FnMut()) -> (Duration, Duration)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    ours().await;
    theirs();
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        let t = Instant::now();
        ours().await;
        a.push(t.elapsed());
        let t = Instant::now();
        theirs();
        b.push(t.elapsed());
    }
    (median(&mut a), median(&mut b))
}

fn row(table: &mut Table, what: &str, bare_what: &str, (ours, theirs): (Duration, Duration)) {
    let ratio = ours.as_secs_f64() / theirs.as_secs_f64();
    table.add(
        "-",
        what,
        fmt_d(ours),
        format!("{} ({bare_what})", fmt_d(theirs)),
        format!("{ratio:.2}x"),
        "<= 1.3x",
        Some(ratio <= TARGET),
    );
}

pub(crate) async fn diffs(table: &mut Table) {
    let dir = tempfile::TempDir::new().unwrap();
    let root = dir.path().canonicalize().unwrap();
    let scratch = root.join("scratch");
    std::fs::create_dir_all(&scratch).unwrap();
    let cli = GitCli::new(8, Duration::from_secs(300));

    // 1,000 files, each changed in one line.
    let many = repository(&root, "many", |d| {
        for i in 0..1_000 {
            let sub = d.join(format!("src/m{}", i % 20));
            std::fs::create_dir_all(&sub).unwrap();
            std::fs::write(sub.join(format!("f{i}.rs")), lines(40, "old")).unwrap();
        }
    });
    for i in 0..1_000 {
        let p = many.join(format!("src/m{}/f{i}.rs", i % 20));
        let text = std::fs::read_to_string(&p)
            .unwrap()
            .replacen("old line 20", "new line 20", 1);
        std::fs::write(p, text).unwrap();
    }
    // One 10 MiB file, every tenth line changed.
    let big = repository(&root, "big", |d| {
        std::fs::write(d.join("big.txt"), lines(270_000, "old")).unwrap()
    });
    let text: String = std::fs::read_to_string(big.join("big.txt"))
        .unwrap()
        .lines()
        .enumerate()
        .map(|(i, l)| {
            if i % 10 == 0 {
                format!("{}\n", l.replace("old", "new"))
            } else {
                format!("{l}\n")
            }
        })
        .collect();
    std::fs::write(big.join("big.txt"), text).unwrap();
    // 10,000 files, ten of them changed and ten new.
    let wide = repository(&root, "wide", |d| {
        for i in 0..10_000 {
            let sub = d.join(format!("pkg/p{}", i % 100));
            std::fs::create_dir_all(&sub).unwrap();
            std::fs::write(sub.join(format!("f{i}.txt")), format!("file {i}\n")).unwrap();
        }
    });
    for i in 0..10 {
        std::fs::write(wide.join(format!("pkg/p{i}/f{i}.txt")), "changed\n").unwrap();
        std::fs::write(wide.join(format!("new{i}.txt")), "new\n").unwrap();
    }

    for (wt, what, expected) in [
        (
            &many,
            "diff of a 1,000-file change (scope all, 3 lines of context)",
            1_000,
        ),
        (&big, "diff of a 10 MiB file, every tenth line changed", 1),
    ] {
        let base = String::from_utf8(
            Command::new("git")
                .arg("-C")
                .arg(wt)
                .args(["merge-base", "HEAD", "main"])
                .output()
                .unwrap()
                .stdout,
        )
        .unwrap();
        let base = base.trim().to_string();
        let req = Request {
            scope: Scope::All,
            base_branch: "main",
            context: 3,
            paths: &[],
            scratch: &scratch,
            // Whole patches, as the bare side collects them.
            keep: usize::MAX,
            window: 0..usize::MAX,
        };
        let c = changes(&cli, wt, &req).await.unwrap();
        assert_eq!(c.files.len(), expected, "{what}");
        let by_hand = bare(
            wt,
            &scratch,
            &["diff", "--cached", "--no-color", "-M", "-C", "-U3", &base],
        );
        let by_hand = by_hand.windows(11).filter(|w| w == b"diff --git ").count();
        assert_eq!(by_hand, expected, "the bare side does the same work: {what}");
        let times = compare(
            || async {
                changes(&cli, wt, &req).await.unwrap();
            },
            || {
                bare(
                    wt,
                    &scratch,
                    &["diff", "--cached", "--no-color", "-M", "-C", "-U3", &base],
                );
            },
        )
        .await;
        row(table, what, "index copy + git add --all + git diff --cached", times);
    }
    let tree = snapshot(&cli, &wide, &scratch).await.unwrap();
    let by_hand = String::from_utf8(bare(&wide, &scratch, &["write-tree"])).unwrap();
    assert_eq!(tree, by_hand.trim(), "the checkpoint is the tree git writes");
    let times = compare(
        || async {
            snapshot(&cli, &wide, &scratch).await.unwrap();
        },
        || {
            bare(&wide, &scratch, &["write-tree"]);
        },
    )
    .await;
    row(
        table,
        "checkpoint of a 10,000-file worktree (tree of tracked, staged, unstaged, untracked)",
        "index copy + git add --all + git write-tree",
        times,
    );
}
