//! Landing an environment's work: a commit in berth's own worktree, a merge computed in the object
//! store (`git merge-tree --write-tree`, never in a worktree), a branch moved only by compare-and-set
//! on its old value, a clean checkout fast-forwarded, a push with credentials handed to git by a
//! credential helper berth controls (never written into any config, never on a command line).
//!
//! Every step that changes something takes the proof that it may: the managed worktree (`ManagedPath`),
//! the branch's old value (`BranchMove`), a checkout found clean at a known commit (`CleanCheckout`).
use std::ffi::OsStr;
use std::path::{Path, PathBuf};

use super::BranchName;
use super::error::GitError;
use crate::managed_path::ManagedPath;

/// What the steps run git with: a mutation under the repository's lock (`GitCli`).
#[async_trait::async_trait]
pub(super) trait Runner: Sync {
    async fn mutate_bytes(
        &self,
        op: &'static str,
        repo: &Path,
        args: &[&str],
        envs: &[(&str, &OsStr)],
    ) -> Result<Vec<u8>, GitError>;
}

pub use super::signature::Signature;

/// The committer of every commit berth writes.
pub fn committer() -> Signature {
    Signature {
        name: "berth".into(),
        email: "berth@localhost".into(),
    }
}

/// A branch to move from the commit it was read at to another (`git update-ref <ref> <to> <from>`: git
/// refuses when the branch no longer points at `from`).
#[derive(Debug, Clone)]
pub struct BranchMove {
    pub branch: BranchName,
    pub from: String,
    pub to: String,
}

/// A checkout (the user's, typically) found clean with `head` checked out, just before it is moved.
#[derive(Debug, Clone)]
pub struct CleanCheckout {
    pub path: PathBuf,
    pub head: String,
}

/// Credentials for one push, from the configuration (never stored in the repository), bound to the one
/// `protocol` and `host` (`host[:port]`, as git names it to a credential helper) berth decided the push
/// goes to: the helper answers git about nothing else.
#[derive(Clone)]
pub struct Credential {
    pub username: String,
    pub password: String,
    pub protocol: String,
    pub host: String,
}

impl std::fmt::Debug for Credential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Credential({}, <redacted>, {}://{})",
            self.username, self.protocol, self.host
        )
    }
}

/// One landing step, carried out by `GitMutations::land`.
pub enum Step<'a> {
    /// Stage `paths` (every change when empty) in the managed worktree and commit them.
    Commit {
        target: &'a ManagedPath,
        paths: &'a [String],
        message: &'a str,
        author: &'a Signature,
    },
    /// Moves a branch by compare-and-set.
    MoveBranch { repo: &'a Path, change: &'a BranchMove },
    /// `git merge --ff-only <to>` in a checkout proven clean at the commit the branch had.
    FastForward { checkout: &'a CleanCheckout, to: &'a str },
    /// Pushes `branch` to `remote` (its own name there).
    Push {
        repo: &'a Path,
        remote: &'a str,
        branch: &'a BranchName,
        force_with_lease: bool,
        credential: Option<&'a Credential>,
    },
}

/// What a step did.
#[derive(Debug, PartialEq, Eq)]
pub enum Landed {
    /// The new commit.
    Committed(String),
    /// There was nothing to commit; nothing changed.
    NothingToCommit,
    Done,
}

/// How a push failed, from git's words.
#[derive(Debug, PartialEq, Eq)]
pub enum PushFailure {
    /// The remote refused the update (not a fast-forward, a stale lease, a hook): git's reason.
    Rejected(String),
    AuthFailed,
    Unreachable(String),
}

/// Sorts a failed push's stderr into what the caller can do about it.
pub fn push_failure(stderr: &str) -> PushFailure {
    let lower = stderr.to_ascii_lowercase();
    if lower.contains("authentication failed")
        || lower.contains("could not read username")
        || lower.contains("could not read password")
        || lower.contains("returned error: 401")
        || lower.contains("returned error: 403")
        || lower.contains("permission denied")
    {
        return PushFailure::AuthFailed;
    }
    if let Some(line) = stderr
        .lines()
        .find(|l| l.contains("[rejected]") || l.contains("[remote rejected]") || l.contains("stale info"))
    {
        return PushFailure::Rejected(line.trim().trim_start_matches('!').trim().to_string());
    }
    if lower.contains("rejected") || lower.contains("non-fast-forward") {
        let line = stderr
            .lines()
            .find(|l| l.to_ascii_lowercase().contains("reject"))
            .unwrap_or(stderr);
        return PushFailure::Rejected(line.trim().to_string());
    }
    PushFailure::Unreachable(stderr.lines().last().unwrap_or_default().trim().to_string())
}

/// The helper git asks for credentials (`sh`, run by git with `get`, `store` or `erase` and the request
/// on stdin). It answers only a `get` whose `protocol` and `host` are exactly the ones berth decided
/// (`BERTH_GIT_PROTOCOL`, `BERTH_GIT_HOST`), with what berth put in the push's environment; any other
/// request (another host or port after a redirect or a rewritten URL) gets `quit=1`, so git asks nobody
/// else and sends nothing. Its text holds no secret: the secret is only in that one process's environment.
pub const HELPER_SCRIPT: &str = r#"f() { test "$1" = get || exit 0; p=; h=; while IFS= read -r l; do case "$l" in protocol=*) p=${l#protocol=};; host=*) h=${l#host=};; esac; done; if test -n "$BERTH_GIT_HOST" && test "$p" = "$BERTH_GIT_PROTOCOL" && test "$h" = "$BERTH_GIT_HOST"; then printf 'username=%s\npassword=%s\n' "$BERTH_GIT_USERNAME" "$BERTH_GIT_PASSWORD"; else echo quit=1; fi; }; f"#;

pub(super) async fn run(git: &dyn Runner, step: &Step<'_>) -> Result<Landed, GitError> {
    match step {
        Step::Commit {
            target,
            paths,
            message,
            author,
        } => commit(git, target, paths, message, author).await,
        Step::MoveBranch { repo, change } => {
            let name = format!("refs/heads/{}", change.branch.as_str());
            git.mutate_bytes(
                "update-ref",
                repo,
                &["update-ref", "-m", "berth: merge", &name, &change.to, &change.from],
                &[],
            )
            .await?;
            Ok(Landed::Done)
        }
        Step::FastForward { checkout, to } => {
            let path = checkout.path.as_path();
            let head = git.mutate_bytes("rev-parse", path, &["rev-parse", "HEAD"], &[]).await?;
            if String::from_utf8_lossy(&head).trim() != checkout.head {
                return Err(GitError::Failed {
                    op: "merge",
                    stderr: "the checkout moved since it was found clean".into(),
                });
            }
            git.mutate_bytes(
                "merge",
                path,
                &["-c", "core.hooksPath=/dev/null", "merge", "--ff-only", "--no-edit", to],
                &[],
            )
            .await?;
            Ok(Landed::Done)
        }
        Step::Push {
            repo,
            remote,
            branch,
            force_with_lease,
            credential,
        } => {
            let refspec = format!("refs/heads/{0}:refs/heads/{0}", branch.as_str());
            let lease = format!("--force-with-lease=refs/heads/{}", branch.as_str());
            let helper = format!("credential.helper=!{HELPER_SCRIPT}");
            // Only the default program answers on the remote's side (a local or ssh remote runs it), no
            // signing program runs (`push.gpgSign`); hooks are off here as everywhere (`harden`), and
            // `--no-verify` says so once more.
            let receive_pack = format!("remote.{remote}.receivepack=git-receive-pack");
            let mut args = vec![
                "-c",
                "credential.helper=",
                "-c",
                "core.askPass=",
                "-c",
                "core.hooksPath=/dev/null",
                "-c",
                &receive_pack,
                "-c",
                "push.gpgSign=false",
            ];
            if credential.is_some() {
                // A redirect would carry the push to a host berth did not decide: not followed.
                args.extend(["-c", &helper, "-c", "http.followRedirects=false"]);
            }
            // Not `--porcelain`: its per-ref verdicts go to stdout, and a refusal's reason is wanted in stderr.
            args.extend(["push", "--no-verify"]);
            if *force_with_lease {
                args.push(&lease);
            }
            args.extend(["--", remote, &refspec]);
            let mut envs: Vec<(&str, &OsStr)> = vec![("GIT_ASKPASS", OsStr::new("/bin/false"))];
            if let Some(c) = credential {
                envs.push(("BERTH_GIT_USERNAME", OsStr::new(&c.username)));
                envs.push(("BERTH_GIT_PASSWORD", OsStr::new(&c.password)));
                envs.push(("BERTH_GIT_PROTOCOL", OsStr::new(&c.protocol)));
                envs.push(("BERTH_GIT_HOST", OsStr::new(&c.host)));
            }
            git.mutate_bytes("push", repo, &args, &envs).await?;
            Ok(Landed::Done)
        }
    }
}

async fn commit(
    git: &dyn Runner,
    target: &ManagedPath,
    paths: &[String],
    message: &str,
    author: &Signature,
) -> Result<Landed, GitError> {
    let wt = target.as_path();
    let spec: Vec<String> = if paths.is_empty() {
        vec![":/".into()]
    } else {
        paths.iter().map(|p| format!(":(literal){p}")).collect()
    };
    let spec: Vec<&str> = spec.iter().map(String::as_str).collect();
    let mut add = vec!["-c", "core.hooksPath=/dev/null", "add", "--all", "--"];
    add.extend(&spec);
    git.mutate_bytes("add", wt, &add, &[]).await?;
    let mut staged = vec!["diff", "--cached", "--name-only", "-z"];
    let head = git
        .mutate_bytes(
            "rev-parse",
            wt,
            &["rev-parse", "--verify", "--quiet", "HEAD^{commit}"],
            &[],
        )
        .await
        .ok();
    if head.is_some() {
        staged.push("HEAD");
    }
    staged.push("--");
    staged.extend(&spec);
    if git.mutate_bytes("diff", wt, &staged, &[]).await?.is_empty() {
        return Ok(Landed::NothingToCommit);
    }
    let c = committer();
    let envs: [(&str, &OsStr); 4] = [
        ("GIT_AUTHOR_NAME", OsStr::new(&author.name)),
        ("GIT_AUTHOR_EMAIL", OsStr::new(&author.email)),
        ("GIT_COMMITTER_NAME", OsStr::new(&c.name)),
        ("GIT_COMMITTER_EMAIL", OsStr::new(&c.email)),
    ];
    let mut commit = vec![
        "-c",
        "core.hooksPath=/dev/null",
        "-c",
        "commit.gpgSign=false",
        "commit",
        "--no-verify",
        "--quiet",
        "-m",
        message,
    ];
    if !paths.is_empty() {
        commit.push("--");
        commit.extend(&spec);
    }
    git.mutate_bytes("commit", wt, &commit, &envs).await?;
    let head = git.mutate_bytes("rev-parse", wt, &["rev-parse", "HEAD"], &[]).await?;
    Ok(Landed::Committed(String::from_utf8_lossy(&head).trim().to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn push_failures_are_sorted_by_what_the_caller_can_do() {
        assert_eq!(
            push_failure(
                "To http://x/r.git\n ! [rejected]        main -> main (non-fast-forward)\nerror: failed to push"
            ),
            PushFailure::Rejected("[rejected]        main -> main (non-fast-forward)".into())
        );
        assert_eq!(
            push_failure("remote: Unauthorized\nfatal: Authentication failed for 'http://x/r.git/'"),
            PushFailure::AuthFailed
        );
        assert!(matches!(
            push_failure(
                "fatal: unable to access 'http://127.0.0.1:40137/r.git/': Failed to connect to 127.0.0.1 port 40137"
            ),
            PushFailure::Unreachable(_)
        ));
        assert!(
            !format!(
                "{:?}",
                Credential {
                    username: "u".into(),
                    password: "s3cret".into(),
                    protocol: "https".into(),
                    host: "github.com".into(),
                }
            )
            .contains("s3cret")
        );
    }

    /// The helper as git runs it (`sh -c '<helper> get'`), with a request on stdin: its answer.
    fn ask(request: &str, env: &[(&str, &str)]) -> String {
        use std::io::Write;
        let mut child = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!("{HELPER_SCRIPT} get"))
            .env_clear()
            .envs(env.iter().copied())
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(request.as_bytes()).unwrap();
        String::from_utf8(child.wait_with_output().unwrap().stdout).unwrap()
    }

    #[test]
    fn the_credential_helper_answers_only_the_protocol_and_host_berth_decided() {
        let env = [
            ("BERTH_GIT_USERNAME", "berth"),
            ("BERTH_GIT_PASSWORD", "s3cret"),
            ("BERTH_GIT_PROTOCOL", "https"),
            ("BERTH_GIT_HOST", "git.example.com:8443"),
        ];
        let given = "username=berth\npassword=s3cret\n";
        let asked = |protocol: &str, host: &str| {
            format!(
                "capability[]=authtype\nprotocol={protocol}\nhost={host}\npath=o/r.git\nwwwauth[]=Basic realm=\"x\"\n"
            )
        };
        assert_eq!(ask(&asked("https", "git.example.com:8443"), &env), given);
        for (protocol, host) in [
            ("https", "git.example.com"),
            ("https", "git.example.com:8444"),
            ("https", "evil.example.com:8443"),
            ("http", "git.example.com:8443"),
            ("https", "git.example.com:8443.evil.example"),
            ("https", ""),
        ] {
            assert_eq!(ask(&asked(protocol, host), &env), "quit=1\n", "{protocol}://{host}");
        }
        // No host or protocol in the request, or none decided: nothing.
        assert_eq!(ask("path=o/r.git\n", &env), "quit=1\n");
        assert_eq!(
            ask(&asked("https", ""), &[("BERTH_GIT_PASSWORD", "s3cret")]),
            "quit=1\n"
        );
        // `store` and `erase` print nothing.
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!("{HELPER_SCRIPT} store"))
            .envs(env)
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        assert!(out.stdout.is_empty());
    }
}
