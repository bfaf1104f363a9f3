//! What the agent did, as a diff. Every kind of change (committed, staged, unstaged, untracked, deleted,
//! renamed, a symlink, a binary file, a file that is not UTF-8) is shown with its status and counts, a
//! `.gitignore`d file never; the three scopes, narrowing by path and repository, paging and cutting at the
//! limits, the ETag; and after every diff the worktree, its index, the stash and every ref are
//! byte-for-byte as before (the diff reads through a temporary index).
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use crate::both_backends;
use crate::helpers::{Reply, TestApp, git, id_of};

both_backends!(
    a_diff_shows_every_change_and_writes_nothing,
    a_large_diff_is_paged_and_cut_at_the_limits,
    a_diff_of_a_worktree_that_is_gone_is_the_typed_conflict,
);

/// A task over a new repository, its environment made (no agent): (environment id, session id,
/// repository id, worktree).
async fn environment(app: &TestApp, name: &str) -> (String, String, String, PathBuf) {
    let ws = app.workspace(name).await;
    let (repo, path) = app.repository(ws, name).await;
    // Files the changes below start from, on the base branch.
    for (f, content) in [
        ("b.txt", "one\ntwo\nthree\n"),
        ("c.txt", "gone soon\n"),
        ("d.txt", "moving\ncontent\nstays\nthe same\n"),
    ] {
        std::fs::write(path.join(f), content).unwrap();
    }
    std::fs::write(path.join("bin.dat"), [0u8, 1, 2, 3, 0, 255]).unwrap();
    std::fs::write(path.join(".gitignore"), "*.log\n").unwrap();
    git(&path, &["add", "-A"]);
    git(&path, &["commit", "-q", "-m", "files"]);
    let task = app.task(ws, name, &[repo]).await;
    let s = app
        .post(
            &format!("/api/v1/tasks/{task}/sessions"),
            json!({"executor_type": "worktree", "start": false}),
        )
        .await
        .ok(201);
    (
        s["task_environment_id"].as_str().unwrap().to_string(),
        id_of(&s).to_string(),
        repo.to_string(),
        PathBuf::from(s["workspace_path"].as_str().unwrap()),
    )
}

/// Everything a diff must not change: every file under the worktree and its git directory (index
/// included), the stash and every ref of the repository.
fn state_of(worktree: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut out = BTreeMap::new();
    let git_dir = PathBuf::from(git(worktree, &["rev-parse", "--absolute-git-dir"]).trim());
    for root in [worktree.to_path_buf(), git_dir] {
        let mut stack = vec![root];
        while let Some(dir) = stack.pop() {
            for entry in std::fs::read_dir(&dir).unwrap() {
                let p = entry.unwrap().path();
                let meta = std::fs::symlink_metadata(&p).unwrap();
                if meta.is_dir() {
                    stack.push(p);
                } else if meta.file_type().is_symlink() {
                    out.insert(
                        p.display().to_string(),
                        std::fs::read_link(&p).unwrap().display().to_string().into_bytes(),
                    );
                } else {
                    out.insert(p.display().to_string(), std::fs::read(&p).unwrap());
                }
            }
        }
    }
    out.insert("stash".into(), git(worktree, &["stash", "list"]).into_bytes());
    out.insert("refs".into(), git(worktree, &["for-each-ref"]).into_bytes());
    out
}

fn file<'a>(diff: &'a Value, path: &str) -> Option<&'a Value> {
    diff["repositories"][0]["files"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["path"] == path)
}

/// The environment's diff, asked for with `If-None-Match: etag`.
async fn diff_unless(app: &TestApp, env: &str, etag: &str) -> Reply {
    let headers = [("If-None-Match", etag)];
    let path = format!("/api/v1/environments/{env}/diff");
    app.call_with(reqwest::Method::GET, &path, Some(&app.admin), None, &headers)
        .await
}

fn paths(diff: &Value) -> Vec<String> {
    let mut v: Vec<String> = diff["repositories"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|r| r["files"].as_array().unwrap().iter())
        .map(|f| f["path"].as_str().unwrap().to_string())
        .collect();
    v.sort();
    v
}

async fn a_diff_shows_every_change_and_writes_nothing(app: TestApp) {
    let (env, session, repo, wt) = environment(&app, "diffs").await;
    // Committed on the task branch.
    std::fs::write(wt.join("a.txt"), "committed\n").unwrap();
    git(&wt, &["add", "a.txt"]);
    git(&wt, &["commit", "-q", "-m", "a"]);
    // Staged, unstaged, deleted, renamed (staged), untracked, ignored, a symlink, binary, not UTF-8.
    std::fs::write(wt.join("staged.txt"), "staged\n").unwrap();
    git(&wt, &["add", "staged.txt"]);
    std::fs::write(wt.join("b.txt"), "one\nTWO\nthree\nfour\n").unwrap();
    std::fs::remove_file(wt.join("c.txt")).unwrap();
    git(&wt, &["mv", "d.txt", "e.txt"]);
    std::fs::write(wt.join("new.txt"), "untracked\n").unwrap();
    std::fs::write(wt.join("noise.log"), "ignored\n").unwrap();
    std::os::unix::fs::symlink("/etc/passwd", wt.join("link")).unwrap();
    std::fs::write(wt.join("bin.dat"), [0u8, 9, 9, 9, 0, 255]).unwrap();
    std::fs::write(wt.join("latin1.txt"), b"caf\xe9\n").unwrap();
    git(&wt, &["stash", "list"]);
    let before = state_of(&wt);

    let r = app.get(&format!("/api/v1/environments/{env}/diff")).await;
    let d = r.ok(200);
    let etag = r.header("etag").expect("an ETag");
    assert_eq!(d["scope"], "all");
    assert_eq!(d["repositories"][0]["repository_id"], repo.as_str());
    assert_eq!(d["repositories"][0]["base_branch"], "main");
    assert!(d["repositories"][0]["base"].is_string() && d["repositories"][0]["head"].is_string());
    let status = |p: &str| file(&d, p).unwrap_or_else(|| panic!("{p} missing: {d}"))["status"].clone();
    assert_eq!(status("a.txt"), "added", "committed since the base");
    assert_eq!(status("staged.txt"), "added");
    assert_eq!(status("b.txt"), "modified");
    assert_eq!(status("c.txt"), "deleted");
    assert_eq!(status("e.txt"), "renamed");
    assert_eq!(file(&d, "e.txt").unwrap()["old_path"], "d.txt");
    assert_eq!(status("new.txt"), "untracked");
    assert_eq!(status("link"), "untracked");
    assert!(file(&d, "noise.log").is_none(), "a .gitignored file never appears");
    let b = file(&d, "b.txt").unwrap();
    assert_eq!((b["additions"].as_u64(), b["deletions"].as_u64()), (Some(2), Some(1)));
    let patch = b["patch"].as_str().unwrap();
    assert!(patch.contains("-two\n+TWO\n") && patch.contains("+four\n"), "{patch}");
    // The symlink is the link: its target as content, never the file it points at.
    let link = file(&d, "link").unwrap();
    assert_eq!(link["new_mode"], "120000");
    assert!(link["patch"].as_str().unwrap().contains("+/etc/passwd"), "{link}");
    assert!(!link["patch"].as_str().unwrap().contains("root:"), "never followed");
    let bin = file(&d, "bin.dat").unwrap();
    assert_eq!(bin["binary"], true);
    assert!(bin["additions"].is_null());
    let latin = file(&d, "latin1.txt").unwrap();
    assert_eq!(latin["patch_encoding"], "base64", "{latin}");
    use base64::Engine;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(latin["patch"].as_str().unwrap())
        .unwrap();
    assert!(bytes.windows(6).any(|w| w == b"+caf\xe9\n"), "the bytes as they are");
    assert_eq!(d["total_files"].as_u64(), Some(9), "{d}");
    assert!(d["next_cursor"].is_null());
    assert_eq!(
        state_of(&wt),
        before,
        "the diff wrote nothing: worktree, index, stash, refs"
    );

    // Unchanged: 304; the session's route gives the same answer.
    let r = diff_unless(&app, &env, &etag).await;
    assert_eq!(r.status.as_u16(), 304);
    let via_session = app.get(&format!("/api/v1/sessions/{session}/diff")).await;
    assert_eq!(via_session.header("etag").as_deref(), Some(etag.as_str()));
    assert_eq!(via_session.ok(200), d);

    // The scopes.
    let uncommitted = app
        .get(&format!("/api/v1/environments/{env}/diff?scope=uncommitted"))
        .await
        .ok(200);
    assert!(file(&uncommitted, "a.txt").is_none(), "committed: not uncommitted");
    assert_eq!(file(&uncommitted, "new.txt").unwrap()["status"], "untracked");
    let committed = app
        .get(&format!("/api/v1/environments/{env}/diff?scope=committed"))
        .await
        .ok(200);
    assert_eq!(paths(&committed), vec!["a.txt"], "{committed}");
    // Narrowed by path and repository; context lines.
    let narrowed = app
        .get(&format!(
            "/api/v1/environments/{env}/diff?paths=b.txt,new.txt&repository_id={repo}&context=0"
        ))
        .await
        .ok(200);
    assert_eq!(paths(&narrowed), vec!["b.txt", "new.txt"]);
    let p = file(&narrowed, "b.txt").unwrap()["patch"].as_str().unwrap().to_string();
    assert!(!p.lines().any(|l| l == " one"), "no context lines: {p}");
    // Bad input: a clear 422, nothing read.
    for q in [
        "scope=everything",
        "context=5000",
        "cursor=nope",
        &format!("repository_id={}", uuid::Uuid::now_v7()),
    ] {
        app.get(&format!("/api/v1/environments/{env}/diff?{q}"))
            .await
            .problem(422, "validation_failed");
    }
    app.get(&format!("/api/v1/environments/{}/diff", uuid::Uuid::now_v7()))
        .await
        .problem(404, "not_found");
    assert_eq!(state_of(&wt), before, "nor did any of the others");

    // A change: a new ETag.
    std::fs::write(wt.join("b.txt"), "changed again\n").unwrap();
    let r = diff_unless(&app, &env, &etag).await;
    assert_eq!(r.status.as_u16(), 200);
    assert_ne!(r.header("etag").as_deref(), Some(etag.as_str()));
}

async fn a_large_diff_is_paged_and_cut_at_the_limits(app: TestApp) {
    let Some(app) = app
        .respawn_with(&[("BERTH_DIFF_MAX_FILES", "2"), ("BERTH_DIFF_MAX_FILE_BYTES", "300")])
        .await
    else {
        return;
    };
    let (env, _, _, wt) = environment(&app, "paged").await;
    for i in 0..4 {
        std::fs::write(wt.join(format!("f{i}.txt")), format!("file {i}\n")).unwrap();
    }
    let long: String = (0..100).map(|i| format!("line {i}\n")).collect();
    std::fs::write(wt.join("long.txt"), &long).unwrap();
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    let mut pages = 0;
    loop {
        let q = cursor.as_ref().map(|c| format!("?cursor={c}")).unwrap_or_default();
        let d = app.get(&format!("/api/v1/environments/{env}/diff{q}")).await.ok(200);
        pages += 1;
        assert_eq!(d["total_files"], 5);
        let page = paths(&d);
        assert!(page.len() <= 2, "{d}");
        seen.extend(page);
        if let Some(f) = d["repositories"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|r| r["files"].as_array().unwrap().iter())
            .find(|f| f["path"] == "long.txt")
        {
            assert_eq!(f["truncated"], true, "{f}");
            let patch = f["patch"].as_str().unwrap();
            assert!(patch.len() <= 300 && patch.ends_with('\n'), "cut at a line: {patch:?}");
            assert_eq!(f["additions"], 100, "the counts are the whole file's");
        }
        match d["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_string()),
            None => break,
        }
    }
    seen.sort();
    assert_eq!(pages, 3);
    assert_eq!(seen, vec!["f0.txt", "f1.txt", "f2.txt", "f3.txt", "long.txt"]);
}

async fn a_diff_of_a_worktree_that_is_gone_is_the_typed_conflict(app: TestApp) {
    let (env, _, _, wt) = environment(&app, "gone").await;
    std::fs::remove_dir_all(&wt).unwrap();
    let problem = app
        .get(&format!("/api/v1/environments/{env}/diff"))
        .await
        .problem(409, "workspace_reuse_unsafe");
    assert_eq!(problem["category"], "workspace_missing", "{problem}");
}
