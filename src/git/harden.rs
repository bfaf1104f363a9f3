//! git runs commands its repository's configuration names (hooks, `core.fsmonitor`, clean and smudge
//! filters, merge drivers) for whoever runs git next. An agent may have written that configuration (one
//! without a box, or anything with write access to the repository), so every git command berth runs
//! switches them off, whatever the repository says: as `GIT_CONFIG_COUNT` entries, which weigh as `-c`
//! does, over every configuration file. The agent's box keeps `config`, `hooks/` and `info/` read-only.
use std::path::Path;

/// The settings laid over every git command berth runs, beside the per-driver ones of `for_repository`.
/// (`diff.external` cannot be emptied this way, git would try to run ""; every diff berth asks for says
/// `--no-ext-diff --no-textconv`, and the others list names only.)
/// The `ext::` and `fd::` transports run a command the URL names: never, whatever the configuration allows.
const ALWAYS: [(&str, &str); 4] = [
    ("core.hooksPath", "/dev/null"),
    ("core.fsmonitor", "false"),
    ("protocol.ext.allow", "never"),
    ("protocol.fd.allow", "never"),
];

/// The variables of berth's own environment a git command gets (its environment is cleared first): what
/// git needs to find itself, its user's configuration, ssh's agent and the network's proxies and CAs.
/// Nothing else of berth's (its secrets, a `token_env`, `GIT_DIR` and the like) reaches git or anything
/// git runs (a credential helper, ssh, a remote helper).
const INHERITED: &[&str] = &[
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "LANG",
    "TZ",
    "TMPDIR",
    "XDG_CONFIG_HOME",
    "GIT_CONFIG_GLOBAL",
    "GIT_CONFIG_SYSTEM",
    "GIT_CONFIG_NOSYSTEM",
    "GIT_EXEC_PATH",
    "GIT_SSH",
    "GIT_SSH_COMMAND",
    "GIT_SSH_VARIANT",
    "SSH_AUTH_SOCK",
    "http_proxy",
    "https_proxy",
    "HTTPS_PROXY",
    "all_proxy",
    "ALL_PROXY",
    "no_proxy",
    "NO_PROXY",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "GIT_SSL_CAINFO",
    "GIT_SSL_CAPATH",
    "CURL_CA_BUNDLE",
];

/// The part of berth's environment a git command inherits (`INHERITED`, as far as it is set).
pub fn inherited_env() -> Vec<(&'static str, std::ffi::OsString)> {
    INHERITED
        .iter()
        .filter_map(|k| std::env::var_os(k).map(|v| (*k, v)))
        .collect()
}

/// `GIT_CONFIG_COUNT`, `GIT_CONFIG_KEY_<n>` and `GIT_CONFIG_VALUE_<n>` for a command run in `repo`: hooks
/// and fsmonitor off, and every filter and merge driver the repository's configuration defines emptied
/// (an empty `clean`, `smudge` or `process` runs nothing; `required` off so git does not fail for it).
pub fn config_env(repo: &Path) -> Vec<(String, String)> {
    let mut pairs: Vec<(String, String)> = ALWAYS.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    let (filters, merges) = drivers(repo);
    for name in filters {
        for key in ["clean", "smudge", "process"] {
            pairs.push((format!("filter.{name}.{key}"), String::new()));
        }
        pairs.push((format!("filter.{name}.required"), "false".into()));
    }
    for name in merges {
        // A merge driver of `true` keeps the current side: nothing runs, and a merge berth makes with the
        // plumbing (`merge-tree`) does not consult drivers anyway.
        pairs.push((format!("merge.{name}.driver"), "true".into()));
    }
    let mut env = vec![("GIT_CONFIG_COUNT".to_string(), pairs.len().to_string())];
    for (i, (k, v)) in pairs.into_iter().enumerate() {
        env.push((format!("GIT_CONFIG_KEY_{i}"), k));
        env.push((format!("GIT_CONFIG_VALUE_{i}"), v));
    }
    env
}

/// The names of the filter and merge drivers `repo`'s configuration defines, read with gix (which runs
/// nothing); none when it cannot be read (then git finds none either, or fails on its own).
fn drivers(repo: &Path) -> (Vec<String>, Vec<String>) {
    let Ok(repo) = gix::open_opts(repo, gix::open::Options::isolated()) else {
        return (Vec::new(), Vec::new());
    };
    let config = repo.config_snapshot();
    let names = |section: &str| -> Vec<String> {
        config
            .plumbing()
            .sections_by_name(section)
            .into_iter()
            .flatten()
            .filter_map(|s| s.header().subsection_name().map(|n| n.to_string()))
            .filter(|n| !n.is_empty() && !n.contains('\n'))
            .collect()
    };
    (names("filter"), names("merge"))
}

/// The repository at `path`, opened for reading as git status reads it, with every filter driver its
/// configuration defines made the identity: gix runs a driver's `clean` to compare a changed file, as git
/// does, and fails on an empty one, so `cat` stands in (a long-running `process` is emptied: gix then fails
/// the read instead of running it).
pub fn open_for_status(path: &Path) -> Result<gix::Repository, String> {
    let (filters, _) = drivers(path);
    let planted = gix::open_opts(path, gix::open::Options::isolated()).map_err(|e| e.to_string())?;
    let config = planted.config_snapshot();
    let mut overrides = Vec::new();
    for name in &filters {
        overrides.push(format!("filter.{name}.clean=cat"));
        overrides.push(format!("filter.{name}.smudge=cat"));
        overrides.push(format!("filter.{name}.required=false"));
        if config.string(format!("filter.{name}.process").as_str()).is_some() {
            overrides.push(format!("filter.{name}.process="));
        }
    }
    gix::open_opts(path, gix::open::Options::isolated().config_overrides(overrides)).map_err(|e| e.to_string())
}
