//! Stamps the git commit into the binary for `GET /version` and `berth_build_info`: `BERTH_GIT_COMMIT`
//! when the builder sets it (an image build has no `.git`), else `git rev-parse HEAD`, else nothing
//! (the code then says "unknown").
use std::path::PathBuf;
use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (!text.is_empty()).then_some(text)
}

fn main() {
    println!("cargo:rerun-if-env-changed=BERTH_GIT_COMMIT");
    let commit = std::env::var("BERTH_GIT_COMMIT")
        .ok()
        .filter(|c| !c.trim().is_empty())
        .or_else(|| {
            // Rebuild when HEAD moves: the HEAD file (a branch switch) and the ref it names (a commit).
            if let (Some(git_dir), Some(common)) = (
                git(&["rev-parse", "--absolute-git-dir"]),
                git(&["rev-parse", "--path-format=absolute", "--git-common-dir"]),
            ) {
                let mut watched = vec![
                    PathBuf::from(&git_dir).join("HEAD"),
                    PathBuf::from(&common).join("packed-refs"),
                ];
                if let Some(head_ref) = git(&["symbolic-ref", "-q", "HEAD"]) {
                    watched.push(PathBuf::from(&common).join(head_ref));
                }
                for path in watched.into_iter().filter(|p| p.exists()) {
                    println!("cargo:rerun-if-changed={}", path.display());
                }
            }
            git(&["rev-parse", "HEAD"])
        });
    println!("cargo:rerun-if-changed=build.rs");
    if let Some(commit) = commit {
        println!("cargo:rustc-env=BERTH_GIT_COMMIT={}", commit.trim());
    }
}
