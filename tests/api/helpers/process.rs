//! Commands the tests run besides berth's server: openssl, and the `berth` binary's own subcommands.
use std::process::{Command, Output};

/// Runs `openssl` with `args`, asserts that it succeeded, and returns what it wrote to stdout.
pub fn openssl(args: &[&str]) -> Vec<u8> {
    let out = Command::new("openssl").args(args).output().expect("openssl runs");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// A finished command's exit code (-1 when a signal ended it) and its stdout then stderr, as text.
pub fn code_and_text(out: Output) -> (i32, String) {
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().unwrap_or(-1), text)
}
