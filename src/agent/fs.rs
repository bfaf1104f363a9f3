//! The files berth serves an agent (ACP's `fs/read_text_file`, `fs/write_text_file`): only inside the
//! admitted worktree. A path must be absolute, hold no `..`, lie under the worktree, pass through no
//! symbolic link (every component below the worktree is checked, and the file itself is opened with
//! `O_NOFOLLOW`), and never name the worktree's `.git`. The same rule as cleanup's managed paths: what
//! berth touches for an agent is proven inside what berth admitted, never reached through a link.
use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Component, Path, PathBuf};

use serde_json::{Value, json};

/// ACP's "resource not found" error code (a file that is not there).
pub const RESOURCE_NOT_FOUND: i64 = -32002;
/// The largest file berth reads for an agent.
pub const MAX_READ: u64 = 16 * 1024 * 1024;
/// JSON-RPC "invalid params": a path berth does not serve.
const REFUSED: i64 = -32602;
const FAILED: i64 = -32603;

#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// The agent's id of its request (answered with the same).
    pub id: Value,
    pub op: Op,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Op {
    Read {
        path: String,
        line: Option<u64>,
        limit: Option<u64>,
    },
    Write {
        path: String,
        content: Option<String>,
    },
}

#[derive(Debug, Clone, PartialEq)]
pub struct Failure {
    pub code: i64,
    pub message: String,
}

fn refused(message: impl Into<String>) -> Failure {
    Failure {
        code: REFUSED,
        message: message.into(),
    }
}

/// Serves one request inside `worktree` (the admitted workspace, canonical). Blocking: call it off the
/// async threads.
pub fn serve(worktree: &Path, op: &Op) -> Result<Value, Failure> {
    match op {
        Op::Read { path, line, limit } => {
            let target = inside(worktree, path, false)?;
            let mut file = std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_NOFOLLOW)
                .open(&target)
                .map_err(|e| io_failure(e, path))?;
            let meta = file.metadata().map_err(|e| io_failure(e, path))?;
            if !meta.is_file() {
                return Err(refused(format!("{path} is not a regular file")));
            }
            if meta.len() > MAX_READ {
                return Err(refused(format!("{path} is larger than {MAX_READ} bytes")));
            }
            let mut bytes = Vec::new();
            file.read_to_end(&mut bytes).map_err(|e| io_failure(e, path))?;
            let text = String::from_utf8(bytes).map_err(|_| refused(format!("{path} is not UTF-8 text")))?;
            let skip = line.map_or(0, |l| l.saturating_sub(1)) as usize;
            let content = match (line, limit) {
                (None, None) => text,
                _ => text
                    .split_inclusive('\n')
                    .skip(skip)
                    .take(limit.map_or(usize::MAX, |l| l as usize))
                    .collect(),
            };
            Ok(json!({ "content": content }))
        }
        Op::Write { path, content } => {
            let content = content.as_deref().ok_or_else(|| refused("content is missing"))?;
            let target = inside(worktree, path, true)?;
            let mut file = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .custom_flags(libc::O_NOFOLLOW)
                .open(&target)
                .map_err(|e| io_failure(e, path))?;
            file.write_all(content.as_bytes()).map_err(|e| io_failure(e, path))?;
            Ok(Value::Null)
        }
    }
}

fn io_failure(e: std::io::Error, path: &str) -> Failure {
    match e.kind() {
        std::io::ErrorKind::NotFound => Failure {
            code: RESOURCE_NOT_FOUND,
            message: format!("Resource not found: {path}"),
        },
        // O_NOFOLLOW on a link.
        _ if e.raw_os_error() == Some(libc::ELOOP) => refused(format!("{path} is a symbolic link")),
        _ => Failure {
            code: FAILED,
            message: format!("{path}: {e}"),
        },
    }
}

/// The path, proven inside the worktree: absolute, no `..`, no symbolic link on the way, not `.git`.
/// With `create`, missing directories on the way are made (inside the worktree).
fn inside(worktree: &Path, path: &str, create: bool) -> Result<PathBuf, Failure> {
    let requested = Path::new(path);
    if !requested.is_absolute() {
        return Err(refused(format!("{path} is not an absolute path")));
    }
    if requested.components().any(|c| matches!(c, Component::ParentDir)) {
        return Err(refused(format!("{path} holds '..'")));
    }
    let rest = requested
        .strip_prefix(worktree)
        .map_err(|_| refused(format!("{path} is outside the session's worktree")))?;
    let parts: Vec<&std::ffi::OsStr> = rest
        .components()
        .filter_map(|c| match c {
            Component::Normal(p) => Some(p),
            _ => None,
        })
        .collect();
    let Some((file, dirs)) = parts.split_last() else {
        return Err(refused(format!("{path} is the worktree itself")));
    };
    if parts.first().is_some_and(|p| *p == ".git") {
        return Err(refused(format!("{path} is the worktree's git link")));
    }
    let mut at = worktree.to_path_buf();
    for dir in dirs {
        at.push(dir);
        match std::fs::symlink_metadata(&at) {
            Ok(m) if m.file_type().is_symlink() => {
                return Err(refused(format!("{path} passes through a symbolic link")));
            }
            Ok(m) if m.is_dir() => {}
            Ok(_) => return Err(refused(format!("{path}: a component is not a directory"))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && create => {
                std::fs::create_dir(&at).map_err(|e| io_failure(e, path))?;
            }
            Err(e) => return Err(io_failure(e, path)),
        }
    }
    at.push(file);
    Ok(at)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(root: &Path, p: &str) -> Result<Value, Failure> {
        serve(
            root,
            &Op::Read {
                path: p.into(),
                line: None,
                limit: None,
            },
        )
    }

    fn write(root: &Path, p: &str, c: &str) -> Result<Value, Failure> {
        serve(
            root,
            &Op::Write {
                path: p.into(),
                content: Some(c.into()),
            },
        )
    }

    #[test]
    fn files_are_served_inside_the_worktree_only() {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().canonicalize().unwrap();
        let wt = base.join("wt");
        std::fs::create_dir(&wt).unwrap();
        std::fs::write(base.join("secret"), "s").unwrap();
        std::fs::write(wt.join(".git"), "gitdir: x").unwrap();
        let at = |p: &str| format!("{}/{p}", wt.display());

        write(&wt, &at("src/new/a.txt"), "one\ntwo\nthree\n").unwrap();
        assert_eq!(read(&wt, &at("src/new/a.txt")).unwrap()["content"], "one\ntwo\nthree\n");
        let part = serve(
            &wt,
            &Op::Read {
                path: at("src/new/a.txt"),
                line: Some(2),
                limit: Some(1),
            },
        )
        .unwrap();
        assert_eq!(part["content"], "two\n");
        assert_eq!(read(&wt, &at("missing")).unwrap_err().code, RESOURCE_NOT_FOUND);

        // Out: a relative path, '..', another directory, a link (as a component or the file), .git.
        std::os::unix::fs::symlink(&base, wt.join("out")).unwrap();
        std::os::unix::fs::symlink(base.join("secret"), wt.join("link")).unwrap();
        for p in [
            "relative.txt".to_string(),
            at("../secret"),
            format!("{}/secret", base.display()),
            at("out/secret"),
            at("link"),
            at(".git"),
            at(".git/config"),
        ] {
            assert_eq!(read(&wt, &p).unwrap_err().code, REFUSED, "read {p}");
            assert_eq!(write(&wt, &p, "x").unwrap_err().code, REFUSED, "write {p}");
        }
        assert_eq!(
            std::fs::read_to_string(base.join("secret")).unwrap(),
            "s",
            "nothing outside changed"
        );
        assert_eq!(std::fs::read_to_string(wt.join(".git")).unwrap(), "gitdir: x");
    }
}
