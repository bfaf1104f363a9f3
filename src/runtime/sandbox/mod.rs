//! Every agent in a box: the one place the box is built. bubblewrap (`bwrap`, what Flatpak and
//! Claude Code's sandbox use) makes it from Linux namespaces: its own mount, PID, IPC, UTS, cgroup and user
//! namespaces, every capability dropped, `no_new_privs`, and the seccomp filter of `seccomp.rs`. Its own
//! network namespace is made here (`net.rs`), with a relay per listed endpoint, and its limits with cgroups
//! (`cgroup.rs`).
//!
//! What the box shows: the system read-only (`/usr`, `/bin`, `/lib*`, `/etc` less its secrets), the agent's
//! installation read-only, the session's worktrees read-write with what a commit needs of the repository's
//! git directory (objects, refs, logs, the worktree's own directory; `config`, `hooks/` and `info/` stay
//! read-only), a private `/tmp`, a home of the session's own, the profile's allowances. Nothing else exists
//! in it: not berth's data directory, config or tokens, not another task's worktree, not the operator's home.
use std::ffi::OsString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::config::{AgentProfile, Config, NetworkMode};
use crate::executor::admission::Tree;
use crate::ids::{ExecutionId, SessionId};
use crate::metrics::Metrics;

pub mod cgroup;
pub mod net;
pub mod seccomp;

/// Files of `/etc` that hold secrets of the host: replaced by an empty file (or directory) in the box.
const ETC_SECRET_FILES: [&str; 6] = [
    "/etc/shadow",
    "/etc/shadow-",
    "/etc/gshadow",
    "/etc/gshadow-",
    "/etc/sudoers",
    "/etc/machine-id",
];
const ETC_SECRET_DIRS: [&str; 4] = ["/etc/ssh", "/etc/ssl/private", "/etc/sudoers.d", "/etc/berth"];
/// The system, read-only (a symlink such as `/bin -> usr/bin` is recreated as the same symlink).
const SYSTEM: [&str; 8] = ["/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc"];

/// What every box of this berth shares: where sessions' homes live, the limits, the cgroup hierarchy.
pub struct Boxes {
    /// `<data dir>/boxes`: one owner-only directory per session (its home, its hosts file).
    root: PathBuf,
    /// berth's own files that must not appear even where the box shows their directory.
    hidden: Vec<PathBuf>,
    memory_mib: u64,
    pids_max: u64,
    cgroups: Result<cgroup::Hierarchy, String>,
    bwrap: Option<PathBuf>,
    metrics: Option<Arc<Metrics>>,
}

/// What lives as long as a boxed agent: its network and its cgroup.
#[derive(Default)]
pub struct Held {
    pub net: Option<net::BoxNet>,
    pub cgroup: Option<cgroup::Group>,
    /// The seccomp filter's pipe: drop it once the process is spawned (the child holds its own copy).
    pub filter: Option<OwnedFd>,
}

impl Boxes {
    pub fn from_config(config: &Config, metrics: Option<Arc<Metrics>>) -> Boxes {
        let mut hidden = vec![config.data_dir.clone()];
        // The config file and every secret berth read from a file (`BERTH_*_FILE`).
        for (key, value) in std::env::vars() {
            if key == "BERTH_CONFIG" || (key.starts_with("BERTH_") && key.ends_with("_FILE")) {
                hidden.push(PathBuf::from(value));
            }
        }
        let cgroups = cgroup::Hierarchy::detect();
        match &cgroups {
            Ok(h) => h.sweep(),
            Err(why) => tracing::warn!(%why, "agents run without memory and process limits"),
        }
        Boxes {
            root: config.data_dir.join("boxes"),
            hidden,
            memory_mib: config.agent_memory_max_mib,
            pids_max: config.agent_pids_max,
            cgroups,
            bwrap: find_on_path("bwrap"),
            metrics,
        }
    }

    /// For `berth agents check` and unit tests: homes under `root`, no metrics.
    pub fn at(root: PathBuf, memory_mib: u64, pids_max: u64) -> Boxes {
        Boxes {
            hidden: Vec::new(),
            memory_mib,
            pids_max,
            cgroups: cgroup::Hierarchy::detect(),
            bwrap: find_on_path("bwrap"),
            metrics: None,
            root,
        }
    }

    /// The session's directory: its home (kept across relaunches, removed with the session).
    pub fn dir_of(&self, session_id: SessionId) -> PathBuf {
        self.root.join(session_id.to_string())
    }

    pub fn home_of(&self, session_id: SessionId) -> PathBuf {
        self.dir_of(session_id).join("home")
    }

    /// Removes a deleted session's box directory (its home); never a worktree.
    pub fn remove(&self, session_id: SessionId) {
        let dir = self.dir_of(session_id);
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => tracing::warn!(session = %session_id, error = %e, "could not remove a session's home"),
        }
    }

    /// What the boxes of this berth can and cannot do, for `berth agents check` and the start log.
    pub fn describe(&self) -> Vec<String> {
        vec![
            match &self.bwrap {
                Some(p) => format!("box: bubblewrap ({})", p.display()),
                None => {
                    "box: bubblewrap is not installed: boxed profiles cannot start (apt-get install bubblewrap)".into()
                }
            },
            match &self.cgroups {
                Ok(h) => format!(
                    "limits: {} (default {} MiB, {} processes)",
                    h.describe(),
                    self.memory_mib,
                    self.pids_max
                ),
                Err(why) => format!("limits: none ({why})"),
            },
        ]
    }

    /// The agent's process in its box, and what must live as long as it. `env` is the agent's environment
    /// (the allow-list, then the profile's), laid over the box's own `HOME` and `TMPDIR`.
    pub fn boxed(
        &self,
        agent: Agent<'_>,
        env: Vec<(OsString, OsString)>,
    ) -> Result<(tokio::process::Command, Held), String> {
        let bwrap = self
            .bwrap
            .as_ref()
            .ok_or("bubblewrap (bwrap) is not installed; install it or set the profile's sandbox = \"none\"")?;
        let profile = agent.profile;
        // A command that is not there fails the launch here, as it does unboxed, not inside the box.
        let runnable = |p: &Path| p.is_file();
        if !(if profile.command.contains('/') {
            runnable(Path::new(&profile.command))
        } else {
            find_on_path(&profile.command).is_some()
        }) {
            return Err(format!("the agent command {:?} was not found", profile.command));
        }
        let dir = agent.dir.clone().unwrap_or_else(|| self.dir_of(agent.session_id));
        let home = dir.join("home");
        private_dir(&self.root).map_err(|e| format!("cannot create {}: {e}", self.root.display()))?;
        private_dir(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        std::fs::create_dir_all(&home).map_err(|e| format!("cannot create {}: {e}", home.display()))?;

        let mut b = Args::default();
        b.flags(&[
            "--unshare-user",
            "--unshare-ipc",
            "--unshare-pid",
            "--unshare-uts",
            "--unshare-cgroup-try",
            "--cap-drop",
            "ALL",
            "--hostname",
            "berth-agent",
        ]);
        for path in SYSTEM {
            let p = Path::new(path);
            match std::fs::read_link(p) {
                Ok(target) => b.pair("--symlink", &target, p),
                Err(_) if p.is_dir() => b.pair("--ro-bind", p, p),
                Err(_) => {}
            }
        }
        b.flags(&["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--tmpfs", "/run"]);
        for f in ETC_SECRET_FILES {
            if Path::new(f).is_file() {
                b.pair("--ro-bind", Path::new("/dev/null"), Path::new(f));
            }
        }
        for d in ETC_SECRET_DIRS {
            if Path::new(d).is_dir() {
                b.flag("--tmpfs");
                b.path(Path::new(d));
            }
        }
        for path in installation(&profile.command) {
            b.pair("--ro-bind", &path, &path);
        }
        // A script the command runs (`python3 /opt/agents/x.py`): that file, or its npm project.
        for arg in profile
            .args
            .iter()
            .map(Path::new)
            .filter(|a| a.is_absolute() && a.is_file())
        {
            for path in script(arg) {
                b.pair("--ro-bind", &path, &path);
            }
        }
        for path in &profile.read_only_paths {
            b.pair("--ro-bind", path, path);
        }
        for path in &profile.writable_paths {
            b.pair("--bind", path, path);
        }
        // berth's own files, where a directory shown so far holds them; what follows is shown over them.
        let hidden_now: Vec<PathBuf> = self.hidden.iter().filter(|h| b.shows(h)).cloned().collect();
        hide(&mut b, &hidden_now);
        if !agent.trees.iter().any(|t| t.path == agent.cwd) {
            b.pair("--bind", agent.cwd, agent.cwd);
        }
        for tree in agent.trees {
            show_tree(&mut b, tree);
        }
        // Again inside what the workspace shows (a `local` repository holding berth's data directory).
        let inside: Vec<PathBuf> = self
            .hidden
            .iter()
            .filter(|h| agent.trees.iter().any(|t| h.starts_with(&t.path)) || h.starts_with(agent.cwd))
            .cloned()
            .collect();
        hide(&mut b, &inside);
        // The session's own, shown over berth's hidden files that hold them.
        b.pair("--bind", &home, &home);
        let operator_home = std::env::var_os("HOME").map(PathBuf::from);
        for (files, how) in [
            (&profile.home_files, "--ro-bind"),
            (&profile.home_files_writable, "--bind"),
        ] {
            for file in files {
                let (source, relative) = home_file(file, operator_home.as_deref())?;
                if source.exists() {
                    b.pair(how, &source, &home.join(relative));
                }
            }
        }
        if let Some(file) = agent.conversation {
            if !file.exists() {
                // Pi starts a conversation in an empty file as in a missing one; a bind needs the file.
                std::fs::write(file, b"").map_err(|e| format!("cannot create {}: {e}", file.display()))?;
            }
            b.pair("--bind", file, file);
        }

        let mut held = Held::default();
        if profile.network == NetworkMode::Box {
            let endpoints = profile
                .endpoints
                .iter()
                .map(|e| net::Endpoint::parse(e))
                .collect::<Result<Vec<_>, _>>()?;
            let made = net::create(
                &endpoints,
                agent.session_id,
                self.metrics.clone(),
                agent.refused.clone(),
            );
            let hosts_text = match made {
                Ok(boxnet) => {
                    let text = boxnet.hosts.clone();
                    held.net = Some(boxnet);
                    text
                }
                // berth without CAP_SYS_ADMIN (a laptop user): bwrap makes a namespace with loopback only,
                // which is all a box without endpoints needs.
                Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied && endpoints.is_empty() => {
                    b.flag("--unshare-net");
                    net::LOOPBACK_HOSTS.to_string()
                }
                Err(e) => {
                    return Err(format!(
                        "cannot make the box's network with its endpoints (berth needs CAP_SYS_ADMIN for it: run it as root or `setcap cap_sys_admin+ep` its binary, or set the profile's network = \"host\"): {e}"
                    ));
                }
            };
            let hosts = dir.join("hosts");
            std::fs::write(&hosts, hosts_text).map_err(|e| format!("cannot write {}: {e}", hosts.display()))?;
            let resolv = dir.join("resolv.conf");
            // No name server answers in the box: names are the hosts file's, or nothing.
            std::fs::write(&resolv, "nameserver 127.0.0.53\noptions timeout:1 attempts:1\n")
                .map_err(|e| format!("cannot write {}: {e}", resolv.display()))?;
            b.pair("--ro-bind", &hosts, Path::new("/etc/hosts"));
            if !Path::new("/etc/resolv.conf").is_symlink() {
                b.pair("--ro-bind", &resolv, Path::new("/etc/resolv.conf"));
            }
        }
        if let Ok(h) = &self.cgroups {
            let memory = profile.memory_max_mib.unwrap_or(self.memory_mib);
            let pids = profile.pids_max.unwrap_or(self.pids_max);
            match h.group(agent.execution_id, memory, pids) {
                Ok(g) => held.cgroup = Some(g),
                Err(e) => tracing::warn!(error = %e, "could not make the agent's cgroup; it runs without limits"),
            }
        }

        let filter = seccomp_pipe().map_err(|e| format!("cannot pass the seccomp filter: {e}"))?;
        b.flag("--seccomp");
        b.flag(&filter.as_raw_fd().to_string());
        b.flag("--chdir");
        b.path(agent.cwd);
        b.flag("--");
        b.flag(&profile.command);
        tracing::debug!(session = %agent.session_id, args = ?b.0, "the agent's box");
        let mut process = tokio::process::Command::new(bwrap);
        process.args(b.0).args(&profile.args).env_clear().envs(env);
        // The box's own home and /tmp, unless the profile names its own.
        if !profile.env.contains_key("HOME") {
            process.env("HOME", &home);
        }
        if !profile.env.contains_key("TMPDIR") {
            process.env("TMPDIR", "/tmp");
        }
        let namespace = held.net.as_ref().map(|n| n.namespace.as_raw_fd());
        let join = held.cgroup.as_ref().map(cgroup::Group::joiner);
        let seccomp_fd = filter.as_raw_fd();
        // SAFETY: runs in the forked child before exec, calling only async-signal-safe functions (setns,
        // fcntl, open, write, close); the descriptors and the group live until `spawn` returns.
        unsafe {
            process.pre_exec(move || {
                if let Some(fd) = namespace
                    && libc::setns(fd, libc::CLONE_NEWNET) != 0
                {
                    return Err(std::io::Error::last_os_error());
                }
                if libc::fcntl(seccomp_fd, libc::F_SETFD, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                if let Some(join) = &join {
                    join.join()?;
                }
                Ok(())
            });
        }
        held.filter = Some(filter);
        Ok((process, held))
    }
}

/// The launch a box is built for.
pub struct Agent<'a> {
    pub profile: &'a AgentProfile,
    pub session_id: SessionId,
    pub execution_id: ExecutionId,
    /// The working directory (the admitted workspace), shown read-write.
    pub cwd: &'a Path,
    pub trees: &'a [Tree],
    /// Pi's conversation file, when berth keeps one.
    pub conversation: Option<&'a Path>,
    /// Where the home lives when not under berth's boxes (`berth agents check`).
    pub dir: Option<PathBuf>,
    /// Told each name the agent asked for that its box does not let it reach.
    pub refused: Option<net::OnRefused>,
}

/// Covers berth's own files: an empty directory over a directory, `/dev/null` over a file.
fn hide(b: &mut Args, paths: &[PathBuf]) {
    for hidden in paths {
        if hidden.is_dir() {
            b.flag("--tmpfs");
            b.path(hidden);
        } else if hidden.is_file() {
            b.pair("--ro-bind", Path::new("/dev/null"), hidden);
        }
    }
}

/// bwrap's arguments, and the places they show (to know whether a hidden file would appear).
#[derive(Default)]
struct Args(Vec<OsString>, Vec<PathBuf>);

impl Args {
    fn flag(&mut self, f: &str) {
        self.0.push(f.into());
    }
    fn flags(&mut self, fs: &[&str]) {
        for f in fs {
            self.flag(f);
        }
    }
    fn path(&mut self, p: &Path) {
        self.0.push(p.as_os_str().to_owned());
    }
    fn pair(&mut self, how: &str, source: &Path, dest: &Path) {
        self.flag(how);
        self.path(source);
        self.path(dest);
        if how != "--symlink" {
            self.1.push(dest.to_path_buf());
        }
    }
    fn shows(&self, path: &Path) -> bool {
        self.1.iter().any(|d| path.starts_with(d))
    }
}

/// A worktree and what a commit in it needs of the repository's git directory. The git directory's
/// `config`, `hooks/` and `info/` stay read-only: git runs commands named there for whoever runs git next.
fn show_tree(b: &mut Args, tree: &Tree) {
    b.pair("--bind", &tree.path, &tree.path);
    let common = tree
        .common_git_dir
        .canonicalize()
        .unwrap_or_else(|_| tree.common_git_dir.clone());
    if tree.local {
        for part in ["config", "hooks", "info"] {
            let p = common.join(part);
            if p.exists() {
                b.pair("--ro-bind", &p, &p);
            }
        }
        return;
    }
    b.pair("--ro-bind", &common, &common);
    for part in ["objects", "refs", "logs"] {
        let p = common.join(part);
        if p.is_dir() {
            b.pair("--bind", &p, &p);
        }
    }
    if let Some(own) = worktree_admin_dir(&tree.path, &common) {
        b.pair("--bind", &own, &own);
    }
}

/// `<common>/worktrees/<id>`, read from the worktree's `.git` file (and only if it is inside `common`).
fn worktree_admin_dir(worktree: &Path, common: &Path) -> Option<PathBuf> {
    let text = std::fs::read_to_string(worktree.join(".git")).ok()?;
    let dir = PathBuf::from(text.strip_prefix("gitdir:")?.trim());
    let dir = if dir.is_absolute() { dir } else { worktree.join(dir) };
    let dir = dir.canonicalize().ok()?;
    dir.starts_with(common.join("worktrees")).then_some(dir)
}

/// Where the agent's program lives, to show read-only: the project holding its `node_modules` for an npm
/// install, else the directory of the executable; nothing when it is part of the system.
fn installation(command: &str) -> Vec<PathBuf> {
    let named = if command.contains('/') {
        Some(PathBuf::from(command))
    } else {
        find_on_path(command)
    };
    let Some(named) = named else {
        return Vec::new();
    };
    let parent = |p: &Path| p.parent().unwrap_or(Path::new("/")).to_path_buf();
    // The program as named (a symlink in `.bin`, say) is shown too, when it lies elsewhere.
    shown_for(&named, parent, |n| named_dir(n, command))
}

/// What a script argument needs shown: its npm project, or the file alone; nothing inside the system.
fn script(arg: &Path) -> Vec<PathBuf> {
    shown_for(arg, Path::to_path_buf, |_| Some(arg.to_path_buf()))
}

/// The npm project holding `named`'s real file, else `otherwise(real)`; then `also(named)` when that lies
/// outside what is already shown. Nothing for a file of the system.
fn shown_for(
    named: &Path,
    otherwise: impl Fn(&Path) -> PathBuf,
    also: impl Fn(&Path) -> Option<PathBuf>,
) -> Vec<PathBuf> {
    let Ok(real) = named.canonicalize() else {
        return Vec::new();
    };
    if SYSTEM.iter().any(|s| real.starts_with(s)) {
        return Vec::new();
    }
    let project = real
        .ancestors()
        .filter(|a| a.file_name().is_some_and(|n| n == "node_modules"))
        .last()
        .and_then(Path::parent)
        .map(Path::to_path_buf);
    let mut shown = vec![project.unwrap_or_else(|| otherwise(&real))];
    if let Some(extra) = also(named)
        && !shown.iter().any(|s| extra.starts_with(s))
    {
        shown.push(extra);
    }
    shown
}

/// The directory of a command named by path, as named (not resolved); none for a bare name.
fn named_dir(named: &Path, command: &str) -> Option<PathBuf> {
    if !command.contains('/') {
        return None;
    }
    named.parent().and_then(|p| p.canonicalize().ok())
}

/// A home file named `~/x` (or an absolute path under the operator's home): where it is, and where it goes
/// under the session's home.
fn home_file(file: &str, operator_home: Option<&Path>) -> Result<(PathBuf, PathBuf), String> {
    let home = operator_home.ok_or("home_files need berth's HOME to be set")?;
    let source = match file.strip_prefix("~/") {
        Some(rest) => home.join(rest),
        None => PathBuf::from(file),
    };
    let relative = source
        .strip_prefix(home)
        .map_err(|_| format!("home file {file:?} is not in the operator's home"))?
        .to_path_buf();
    if relative
        .components()
        .any(|c| !matches!(c, std::path::Component::Normal(_)))
    {
        return Err(format!("home file {file:?} must name a file under the home"));
    }
    Ok((source, relative))
}

fn find_on_path(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| Path::new(d).join(name))
        .find(|p| p.is_file())
}

fn private_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(dir)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
}

/// The filter in a pipe whose read end bwrap reads (`--seccomp FD`): small enough for the pipe's buffer.
fn seccomp_pipe() -> std::io::Result<OwnedFd> {
    let program = seccomp::program();
    let mut fds = [0; 2];
    // SAFETY: pipe2 fills two descriptors, each owned once below.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    use std::io::Write;
    std::fs::File::from(write).write_all(&program)?;
    Ok(read)
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    #[test]
    fn home_files_stay_under_the_operator_home() {
        let home = Path::new("/home/op");
        assert_eq!(
            super::home_file("~/.codex/auth.json", Some(home)).unwrap(),
            (
                PathBuf::from("/home/op/.codex/auth.json"),
                PathBuf::from(".codex/auth.json")
            )
        );
        assert!(super::home_file("/etc/passwd", Some(home)).is_err());
        assert!(super::home_file("~/../other/.ssh/id", Some(home)).is_err());
    }
}
