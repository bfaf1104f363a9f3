//! The files berth serves an agent (ACP's `fs/read_text_file`, `fs/write_text_file`): only inside the
//! admitted worktree. A path must be absolute, hold no `..`, lie under the worktree, pass through no
//! symbolic link (it is walked from the worktree's descriptor one `openat(O_NOFOLLOW)` at a time, so a
//! link swapped in meanwhile is not followed either), and never name the worktree's `.git`. The same rule as cleanup's managed paths: what
//! berth touches for an agent is proven inside what berth admitted, never reached through a link.
use std::io::{Read, Write};
use std::path::{Component, Path};

use serde_json::{Value, json};

/// ACP's "resource not found" error code (a file that is not there).
pub const RESOURCE_NOT_FOUND: i64 = -32002;
/// The largest file berth reads for an agent.
pub const MAX_READ: u64 = 16 * 1024 * 1024;
/// JSON-RPC "invalid params": a path berth does not serve.
const REFUSED: i64 = -32602;
/// JSON-RPC "internal error": berth could not answer (or not now).
pub const FAILED: i64 = -32603;

#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// The agent's id of its request (answered with the same).
    pub id: Value,
    pub op: Op,
}

#[derive(Clone, PartialEq)]
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

impl Op {
    /// `read` or `write`.
    pub fn name(&self) -> &'static str {
        match self {
            Op::Read { .. } => "read",
            Op::Write { .. } => "write",
        }
    }

    pub fn path(&self) -> &str {
        match self {
            Op::Read { path, .. } | Op::Write { path, .. } => path,
        }
    }

    /// The bytes a write carries (0 for a read): what a log says of it instead of its content.
    pub fn size(&self) -> usize {
        match self {
            Op::Write { content, .. } => content.as_ref().map_or(0, String::len),
            Op::Read { .. } => 0,
        }
    }
}

/// Never the content of a write: a log or a panic message shows its path and size only.
impl std::fmt::Debug for Op {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Op::Read { path, line, limit } => f
                .debug_struct("Read")
                .field("path", path)
                .field("line", line)
                .field("limit", limit)
                .finish(),
            Op::Write { path, content } => f
                .debug_struct("Write")
                .field("path", path)
                .field("bytes", &content.as_ref().map(String::len))
                .finish(),
        }
    }
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
            let mut file = open_inside(worktree, path, libc::O_RDONLY)?;
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
            let mut file = open_inside(worktree, path, libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC)?;
            if !file.metadata().map_err(|e| io_failure(e, path))?.is_file() {
                return Err(refused(format!("{path} is not a regular file")));
            }
            file.write_all(content.as_bytes()).map_err(|e| io_failure(e, path))?;
            Ok(Value::Null)
        }
    }
}

/// The size of the file a read would answer with, when it is one berth would read (for the room its
/// answer needs before it is read); `None` otherwise (serving it then says why). Blocking.
pub fn read_size(worktree: &Path, op: &Op) -> Option<u64> {
    let Op::Read { path, .. } = op else {
        return None;
    };
    let meta = open_inside(worktree, path, libc::O_RDONLY).ok()?.metadata().ok()?;
    (meta.is_file() && meta.len() <= MAX_READ).then_some(meta.len())
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

/// The file at `path`, opened inside the worktree: the path is absolute, holds no `..`, lies under the
/// worktree and does not name its `.git`; then it is walked one directory at a time from the worktree's
/// own descriptor (`openat` with `O_NOFOLLOW`), so no symbolic link is followed anywhere on the way, even
/// one swapped in while berth walks. With `O_CREAT` in `flags`, missing directories are made on the way.
/// Nothing blocks on a FIFO (`O_NONBLOCK`); the caller checks it got a regular file.
fn open_inside(worktree: &Path, path: &str, flags: libc::c_int) -> Result<std::fs::File, Failure> {
    let (at, file) = parent_inside(worktree, path, flags & libc::O_CREAT != 0)?;
    openat(
        &at,
        &file,
        flags | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC,
        0o666,
    )
    .map_err(|e| io_failure(e, path))
}

/// Removes the file at `path` inside the worktree, its directories walked as `open_inside` walks them (no
/// symbolic link followed on the way; a link at the end is removed itself, never what it points at). A
/// file already gone is no error. A restore removes what a checkpoint does not have this way.
pub fn remove_inside(worktree: &Path, path: &str) -> Result<(), Failure> {
    use std::os::fd::AsRawFd;
    let (at, file) = match parent_inside(worktree, path, false) {
        Ok(found) => found,
        Err(f) if f.code == RESOURCE_NOT_FOUND => return Ok(()),
        Err(f) => return Err(f),
    };
    let name = c_name(&file).map_err(|e| io_failure(e, path))?;
    // SAFETY: a valid directory descriptor and a NUL-terminated name.
    let rc = unsafe { libc::unlinkat(at.as_raw_fd(), name.as_ptr(), 0) };
    let e = std::io::Error::last_os_error();
    match rc {
        0 => Ok(()),
        _ if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        _ => Err(io_failure(e, path)),
    }
}

/// The directory holding `path` inside the worktree, opened one `openat(O_NOFOLLOW)` at a time from the
/// worktree's own descriptor, and the file's name in it (see `open_inside`).
fn parent_inside(worktree: &Path, path: &str, create: bool) -> Result<(std::fs::File, std::ffi::OsString), Failure> {
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
    let link = |e: std::io::Error| match e.raw_os_error() {
        Some(libc::ELOOP) | Some(libc::ENOTDIR) => refused(format!("{path} passes through a symbolic link or a file")),
        _ => io_failure(e, path),
    };
    let directory = libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    let mut at = std::fs::File::open(worktree).map_err(|e| io_failure(e, path))?;
    for dir in dirs {
        at = match openat(&at, dir, directory | libc::O_RDONLY, 0) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && create => {
                mkdirat(&at, dir).map_err(link)?;
                openat(&at, dir, directory | libc::O_RDONLY, 0).map_err(link)?
            }
            other => other.map_err(link)?,
        };
    }
    Ok((at, file.to_os_string()))
}

fn c_name(name: &std::ffi::OsStr) -> std::io::Result<std::ffi::CString> {
    use std::os::unix::ffi::OsStrExt;
    std::ffi::CString::new(name.as_bytes()).map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))
}

/// `openat(2)` relative to the directory `dir`.
fn openat(
    dir: &std::fs::File,
    name: &std::ffi::OsStr,
    flags: libc::c_int,
    mode: libc::mode_t,
) -> std::io::Result<std::fs::File> {
    use std::os::fd::{AsRawFd, FromRawFd};
    let name = c_name(name)?;
    // SAFETY: a valid directory descriptor and a NUL-terminated name; the new descriptor is owned by the File.
    let fd = unsafe { libc::openat(dir.as_raw_fd(), name.as_ptr(), flags, mode as libc::c_uint) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: fd is a fresh descriptor nothing else owns.
    Ok(unsafe { std::fs::File::from_raw_fd(fd) })
}

/// `mkdirat(2)` relative to the directory `dir` (an existing one is fine: another writer made it).
fn mkdirat(dir: &std::fs::File, name: &std::ffi::OsStr) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let name = c_name(name)?;
    // SAFETY: a valid directory descriptor and a NUL-terminated name.
    if unsafe { libc::mkdirat(dir.as_raw_fd(), name.as_ptr(), 0o777) } < 0 {
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::AlreadyExists {
            return Err(e);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_removal_never_follows_a_link_out_of_the_worktree() {
        let dir = tempfile::tempdir().unwrap();
        let (wt, outside) = (dir.path().join("wt"), dir.path().join("outside"));
        std::fs::create_dir_all(wt.join("real")).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(outside.join("secret"), "keep").unwrap();
        std::fs::write(wt.join("real/f"), "x").unwrap();
        // An agent swapped a directory for a link to somewhere else, and linked a file too.
        std::os::unix::fs::symlink(&outside, wt.join("dir")).unwrap();
        std::os::unix::fs::symlink(outside.join("secret"), wt.join("link")).unwrap();
        let at = |p: &str| wt.join(p).display().to_string();
        assert!(
            remove_inside(&wt, &at("dir/secret")).is_err(),
            "a link on the way is refused"
        );
        remove_inside(&wt, &at("link")).unwrap();
        assert!(
            std::fs::symlink_metadata(wt.join("link")).is_err(),
            "the link itself goes"
        );
        assert_eq!(std::fs::read_to_string(outside.join("secret")).unwrap(), "keep");
        remove_inside(&wt, &at("real/f")).unwrap();
        assert!(!wt.join("real/f").exists());
        remove_inside(&wt, &at("real/gone")).unwrap();
        assert!(remove_inside(&wt, &at(".git/config")).is_err());
    }

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

    /// A FIFO or a directory where a file is asked for is refused at once (berth never waits on a
    /// writer that does not come), and a file where a directory is needed is refused too.
    #[test]
    fn nothing_but_regular_files_and_no_waiting() {
        let dir = tempfile::tempdir().unwrap();
        let wt = dir.path().canonicalize().unwrap();
        let at = |p: &str| format!("{}/{p}", wt.display());
        let fifo = std::ffi::CString::new(at("pipe")).unwrap();
        // SAFETY: a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
        assert_eq!(read(&wt, &at("pipe")).unwrap_err().code, REFUSED);
        assert_eq!(
            write(&wt, &at("pipe"), "x").unwrap_err().code,
            FAILED,
            "no reader: ENXIO, at once"
        );
        std::fs::create_dir(wt.join("d")).unwrap();
        assert_eq!(read(&wt, &at("d")).unwrap_err().code, REFUSED);
        std::fs::write(wt.join("f"), "plain").unwrap();
        assert_eq!(write(&wt, &at("f/under.txt"), "x").unwrap_err().code, REFUSED);
        assert_eq!(std::fs::read_to_string(wt.join("f")).unwrap(), "plain");
    }
}
