//! What this binary is: the package version and the git commit it was built from (`build.rs`).

/// The package version (`Cargo.toml`).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The commit the build script found (`BERTH_GIT_COMMIT`, else `git rev-parse HEAD`), or "unknown".
pub const COMMIT: &str = match option_env!("BERTH_GIT_COMMIT") {
    Some(commit) => commit,
    None => "unknown",
};
