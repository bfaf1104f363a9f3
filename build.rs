//! Two things for the build:
//! - stamps the git commit into the binary for `GET /version` and `berth_build_info`: `BERTH_GIT_COMMIT`
//!   when the builder sets it (an image build has no `.git`), else `git rev-parse HEAD`, else nothing
//!   (the code then says "unknown");
//! - tells utoipa that each typed id of `src/ids.rs` is a `Uuid` in the OpenAPI document (its alias
//!   config), so `TaskId` is documented as `type: string, format: uuid` like the bare UUID it wraps.
use std::path::PathBuf;
use std::process::Command;

/// The names `typed_ids!` declares in `src/ids.rs`: each line of its list that is a bare `Name,`.
fn typed_ids() -> Vec<String> {
    let text = std::fs::read_to_string("src/ids.rs").expect("src/ids.rs");
    let list = text
        .split("typed_ids! {")
        .nth(1)
        .expect("the typed_ids! list in src/ids.rs");
    list.lines()
        .map(str::trim)
        .take_while(|line| *line != "}")
        .filter_map(|line| line.strip_suffix(','))
        .filter(|name| !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric()))
        .map(str::to_string)
        .collect()
}

fn utoipa_aliases() {
    println!("cargo:rerun-if-changed=src/ids.rs");
    let names = typed_ids();
    let mut config = utoipa_config::Config::new();
    for name in &names {
        config = config.alias_for(name, "Uuid");
    }
    config.write_to_file();
}

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (!text.is_empty()).then_some(text)
}

fn main() {
    utoipa_aliases();
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
