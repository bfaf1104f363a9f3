//! Memory and process limits for a box, with cgroups: v2 where the host has a unified hierarchy with the
//! `memory` and `pids` controllers, else v1's `memory` and `pids` hierarchies. Each agent gets a group of its
//! own under `berth/`, and only the agent's own process moves into it (from the child, before it execs), so
//! berth and every other agent stay outside. An agent past its memory limit is OOM-killed alone.
use std::ffi::CString;
use std::path::{Path, PathBuf};

use crate::ids::ExecutionId;

/// The hierarchy berth can use, found once at start.
#[derive(Debug, Clone)]
pub enum Hierarchy {
    V2(PathBuf),
    V1 { memory: PathBuf, pids: PathBuf },
}

impl Hierarchy {
    /// The writable hierarchy of this host, or why there is none.
    pub fn detect() -> Result<Hierarchy, String> {
        let v2 = Path::new("/sys/fs/cgroup");
        if let Ok(controllers) = std::fs::read_to_string(v2.join("cgroup.controllers")) {
            let has = |c| controllers.split_whitespace().any(|x| x == c);
            if has("memory") && has("pids") {
                // berth's own group, where it may make children (its delegated subtree).
                let own = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
                let own = own.lines().find_map(|l| l.strip_prefix("0::")).unwrap_or("/");
                let parent = v2.join(own.trim_start_matches('/')).join("berth-agents");
                return match std::fs::create_dir_all(&parent)
                    .and_then(|_| std::fs::write(parent.join("cgroup.subtree_control"), "+memory +pids"))
                {
                    Ok(()) => Ok(Hierarchy::V2(parent)),
                    Err(e) => Err(format!("cgroup v2 at {} is not writable: {e}", parent.display())),
                };
            }
        }
        let memory = Path::new("/sys/fs/cgroup/memory/berth-agents");
        let pids = Path::new("/sys/fs/cgroup/pids/berth-agents");
        match std::fs::create_dir_all(memory).and_then(|_| std::fs::create_dir_all(pids)) {
            Ok(()) => Ok(Hierarchy::V1 {
                memory: memory.to_path_buf(),
                pids: pids.to_path_buf(),
            }),
            Err(e) => Err(format!(
                "no cgroup v2 with memory and pids, and cgroup v1 is not writable: {e}"
            )),
        }
    }

    /// Removes the empty groups a previous berth left (killed before it could): a group still holding a
    /// process (an orphaned box, ended by restore) is kept.
    pub fn sweep(&self) {
        let roots = match self {
            Hierarchy::V2(root) => vec![root.clone()],
            Hierarchy::V1 { memory, pids } => vec![memory.clone(), pids.clone()],
        };
        for root in roots {
            let Ok(entries) = std::fs::read_dir(&root) else {
                continue;
            };
            for e in entries.flatten() {
                if e.file_name().to_string_lossy().starts_with("agent-") {
                    let _ = std::fs::remove_dir(e.path());
                }
            }
        }
    }

    pub fn describe(&self) -> String {
        match self {
            Hierarchy::V2(p) => format!("cgroup v2 ({})", p.display()),
            Hierarchy::V1 { memory, pids } => format!("cgroup v1 ({}, {})", memory.display(), pids.display()),
        }
    }

    /// A group for one execution, its limits written.
    pub fn group(&self, execution_id: ExecutionId, memory_mib: u64, pids: u64) -> std::io::Result<Group> {
        let bytes = memory_mib.saturating_mul(1024 * 1024).to_string();
        let name = format!("agent-{execution_id}");
        let dirs = match self {
            Hierarchy::V2(root) => {
                let dir = root.join(&name);
                std::fs::create_dir_all(&dir)?;
                std::fs::write(dir.join("memory.max"), &bytes)?;
                // Past the limit the agent is killed, not swapped out for ever.
                let _ = std::fs::write(dir.join("memory.swap.max"), "0");
                let _ = std::fs::write(dir.join("memory.oom.group"), "1");
                std::fs::write(dir.join("pids.max"), pids.to_string())?;
                vec![dir]
            }
            Hierarchy::V1 { memory, pids: p } => {
                let mem = memory.join(&name);
                let pid = p.join(&name);
                std::fs::create_dir_all(&mem)?;
                std::fs::create_dir_all(&pid)?;
                std::fs::write(mem.join("memory.limit_in_bytes"), &bytes)?;
                let _ = std::fs::write(mem.join("memory.memsw.limit_in_bytes"), &bytes);
                std::fs::write(pid.join("pids.max"), pids.to_string())?;
                vec![mem, pid]
            }
        };
        let procs = dirs
            .iter()
            .map(|d| CString::new(d.join("cgroup.procs").into_os_string().into_encoded_bytes()))
            .collect::<Result<Vec<_>, _>>()
            .map_err(std::io::Error::other)?;
        Ok(Group {
            v2: matches!(self, Hierarchy::V2(_)),
            dirs,
            procs,
        })
    }
}

/// The group's `cgroup.procs` files, for the child.
pub struct Joiner(Vec<CString>);

impl Joiner {
    /// Moves the calling process into the group. Runs in the forked child before exec: only
    /// async-signal-safe calls (open, write, close), on paths prepared before the fork.
    pub fn join(&self) -> std::io::Result<()> {
        for path in &self.0 {
            // SAFETY: a NUL-terminated path made before the fork; "0" moves the writer itself.
            unsafe {
                let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                if fd < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                let n = libc::write(fd, b"0".as_ptr().cast(), 1);
                libc::close(fd);
                if n != 1 {
                    return Err(std::io::Error::last_os_error());
                }
            }
        }
        Ok(())
    }
}

/// One execution's group: the child joins it before exec; it is read for an OOM kill after the exit and
/// removed.
#[derive(Debug)]
pub struct Group {
    v2: bool,
    dirs: Vec<PathBuf>,
    procs: Vec<CString>,
}

impl Group {
    /// What the child runs to join the group (its paths copied before the fork).
    pub fn joiner(&self) -> Joiner {
        Joiner(self.procs.clone())
    }

    /// Whether the kernel killed something in the group for want of memory.
    pub fn out_of_memory(&self) -> bool {
        let count = |file: &Path, key: &str| {
            std::fs::read_to_string(file).ok().and_then(|t| {
                t.lines()
                    .find_map(|l| l.strip_prefix(key).map(|n| n.trim().parse::<u64>().unwrap_or(0)))
            })
        };
        if self.v2 {
            count(&self.dirs[0].join("memory.events"), "oom_kill ").unwrap_or(0) > 0
        } else {
            let dir = &self.dirs[0];
            count(&dir.join("memory.oom_control"), "oom_kill ")
                .or_else(|| count(&dir.join("memory.failcnt"), ""))
                .unwrap_or(0)
                > 0
        }
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        // Empty once the box is gone; a group that still holds a process is left for the next start's sweep.
        for dir in &self.dirs {
            let _ = std::fs::remove_dir(dir);
        }
    }
}
