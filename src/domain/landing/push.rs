//! Push a task branch to a remote of the user's repository, with the credentials the configuration
//! gives for the remote's host (`[remotes."host"]`), handed to git by berth's credential helper for
//! that one process: never written into the repository's config, never in a log, an event or an answer.
//! git's refusals become typed problems.
use crate::ids::{EnvironmentId, RepositoryId};
use serde::Serialize;
use serde_json::json;
use utoipa::ToSchema;

use super::{Ctx, git_failed, landable, slots};
use crate::auth::UnboundPrincipal;
use crate::error::{Error, Result};
use crate::events::{self, EventType, Subject};
use crate::git::land::{Credential, PushFailure, Step, push_failure};

#[derive(Debug, Serialize, ToSchema)]
pub struct Pushed {
    pub task_environment_id: EnvironmentId,
    pub repository_id: RepositoryId,
    pub remote: String,
    /// The task branch, pushed under its own name.
    pub branch: String,
    /// The commit the remote branch now points at.
    pub commit: String,
}

/// A remote name git would take (no option, no path trickery).
fn remote_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 100
        && !name.starts_with('-')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || "._-".contains(c));
    if ok {
        Ok(())
    } else {
        Err(Error::invalid("remote", "is not a remote name"))
    }
}

pub async fn push(
    ctx: &Ctx,
    p: &UnboundPrincipal,
    env_id: EnvironmentId,
    repository_id: RepositoryId,
    remote: &str,
    force_with_lease: bool,
) -> Result<Pushed> {
    remote_name(remote)?;
    let (e, task) = landable(ctx, p, env_id).await?;
    let slot = slots(ctx, &e, Some(&[repository_id]), "repository_id")
        .await?
        .pop()
        .ok_or_else(|| Error::invalid("repository_id", "is not a repository of this environment"))?;
    let repo = slot.repository.as_path();
    let url = remote_url(ctx, repo, remote).await?;
    let pushes = remote_urls(ctx, repo, remote, true).await?;
    let credential = decide_credential(&url, &pushes, &ctx.config.remotes)?;
    if credential.is_some() {
        refuse_local_transport(ctx, repo, remote).await?;
    }
    let tip = ctx
        .git
        .branch_tip(repo, &slot.branch)
        .await
        .map_err(git_failed("push"))?
        .ok_or_else(|| Error::InvalidState("the task branch has no commit to push".into()))?;
    let step = Step::Push {
        repo,
        remote,
        branch: &slot.branch,
        force_with_lease,
        credential: credential.as_ref(),
    };
    if let Err(err) = ctx.git.land(&step).await {
        let crate::git::cli::GitError::Failed { stderr, .. } = &err else {
            return Err(Error::RemoteUnreachable(format!("{err}")));
        };
        return Err(match push_failure(stderr) {
            PushFailure::Rejected(why) => Error::PushRejected(why),
            PushFailure::AuthFailed => Error::RemoteAuthFailed,
            PushFailure::Unreachable(why) => Error::RemoteUnreachable(why),
        });
    }
    let pushed = Pushed {
        task_environment_id: e.id,
        repository_id,
        remote: remote.to_string(),
        branch: slot.branch.as_str().to_string(),
        commit: tip,
    };
    let txn = ctx.db.begin_write().await?;
    events::append(
        &txn,
        ctx.instance_id,
        EventType::EnvironmentPushed,
        Subject {
            task_environment_id: Some(e.id),
            ..Subject::task(task.workspace_id, task.id)
        },
        json!({ "repository_id": repository_id, "remote": pushed.remote, "branch": pushed.branch, "commit": pushed.commit }),
    )
    .await?;
    ctx.commit(txn).await?;
    Ok(pushed)
}

/// The remote's URL as the repository's config has it (`422 remote` when there is no such remote).
pub(crate) async fn remote_url(ctx: &Ctx, repo: &std::path::Path, remote: &str) -> Result<String> {
    Ok(remote_urls(ctx, repo, remote, false).await?.swap_remove(0))
}

/// The URLs git resolves for the remote, by git itself (`insteadOf`; with `push`, `pushurl` and
/// `pushInsteadOf` too): every one it would push to.
async fn remote_urls(ctx: &Ctx, repo: &std::path::Path, remote: &str, push: bool) -> Result<Vec<String>> {
    let mut args = vec!["remote", "get-url"];
    if push {
        args.extend(["--push", "--all"]);
    }
    args.extend(["--", remote]);
    let out = ctx
        .git
        .read_bytes("remote", repo, &args, &[])
        .await
        .map_err(|_| Error::invalid("remote", "the repository has no such remote"))?;
    let urls: Vec<String> = String::from_utf8_lossy(&out)
        .lines()
        .map(|l| l.trim().to_string())
        .filter(|l| !l.is_empty())
        .collect();
    if urls.is_empty() {
        return Err(Error::invalid("remote", "the repository has no such remote"));
    }
    Ok(urls)
}

/// Where an HTTP push goes, as git names it to a credential helper: `protocol` and `host` (with the
/// port when the URL writes one).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HttpOrigin {
    pub protocol: String,
    pub host: String,
}

/// The origin of an `http(s)://` URL, `Ok(None)` for any other kind of remote (ssh, a path: berth hands
/// those no credential). A URL that git, curl and berth could read differently is refused: its
/// authority must hold nothing but an optional plain user name and `host[:port]`, written exactly as the
/// `url` crate writes it back (lowercase host, no default port), and its path no query, fragment,
/// backslash, percent-escape or dot segment.
pub(crate) fn http_origin(url: &str) -> std::result::Result<Option<HttpOrigin>, &'static str> {
    let lower = url.get(..8).unwrap_or(url).to_ascii_lowercase();
    let (protocol, rest) = if let Some(rest) = url.strip_prefix("https://") {
        ("https", rest)
    } else if let Some(rest) = url.strip_prefix("http://") {
        ("http", rest)
    } else if lower.starts_with("http:") || lower.starts_with("https:") {
        return Err("is an HTTP URL not written as http:// or https://");
    } else {
        return Ok(None);
    };
    let clean = |c: char| c.is_ascii_graphic() && !"?#\\%\"<>`{}|^[]".contains(c);
    if !rest.chars().all(clean) {
        return Err("has characters git and berth could read differently (?, #, \\, %, spaces)");
    }
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let host = match authority.split_once('@') {
        None => authority,
        Some((user, host)) => {
            let plain = |c: char| c.is_ascii_alphanumeric() || "._-".contains(c);
            if user.is_empty() || !user.chars().all(plain) || host.contains('@') {
                return Err("has user information other than a plain user name");
            }
            host
        }
    };
    let parsed = url::Url::parse(url).map_err(|_| "does not parse as a URL")?;
    let written = match (parsed.host_str(), parsed.port()) {
        (Some(h), Some(p)) => format!("{h}:{p}"),
        (Some(h), None) => h.to_string(),
        (None, _) => return Err("names no host"),
    };
    let same_path = parsed.path() == path || (path.is_empty() && parsed.path() == "/");
    if host.is_empty() || written != host || !same_path || parsed.query().is_some() || parsed.fragment().is_some() {
        return Err("is not written the one way git and berth both read it (lowercase host, no default port)");
    }
    Ok(Some(HttpOrigin {
        protocol: protocol.into(),
        host: host.into(),
    }))
}

/// `host[:port]` of an `http(s)://` URL written unambiguously (credentials go to HTTP remotes only).
pub(crate) fn host_of(url: &str) -> Option<String> {
    http_origin(url).ok().flatten().map(|o| o.host)
}

/// The credential for a push, decided from the URLs git will really push to (`pushes`, as git resolves
/// them) and the remote's own URL (`fetch`): the configured one for the push URL's host, bound to that
/// protocol and host (berth's credential helper answers nothing else). Refused, before git sends
/// anything: a URL that could be read two ways, several push URLs, and an HTTP push URL that goes to
/// another protocol or host than the remote's URL when berth holds a credential for either.
pub(crate) fn decide_credential(
    fetch: &str,
    pushes: &[String],
    remotes: &std::collections::BTreeMap<String, crate::config::remotes::RemoteHost>,
) -> Result<Option<Credential>> {
    let refuse = |why: String| Error::invalid("remote", why);
    let [push] = pushes else {
        return Err(refuse("the remote names several push URLs; berth pushes to one".into()));
    };
    let push_origin = http_origin(push).map_err(|why| refuse(format!("its push URL {why}")))?;
    let fetch_origin = http_origin(fetch).map_err(|why| refuse(format!("its URL {why}")))?;
    let held = |o: &Option<HttpOrigin>| {
        o.as_ref()
            .and_then(|o| remotes.get(&o.host))
            .is_some_and(|r| r.token.is_some())
    };
    if push_origin.is_some() && push_origin != fetch_origin && (held(&push_origin) || held(&fetch_origin)) {
        let name = |o: &Option<HttpOrigin>| match o {
            Some(o) => format!("{}://{}", o.protocol, o.host),
            None => "a non-HTTP remote".into(),
        };
        return Err(refuse(format!(
            "its push URL goes to {}, not to {} as its URL says: berth hands a credential only where the remote's URL points",
            name(&push_origin),
            name(&fetch_origin)
        )));
    }
    let Some(origin) = push_origin else {
        return Ok(None);
    };
    let Some(r) = remotes.get(&origin.host) else {
        return Ok(None);
    };
    Ok(r.token.clone().map(|password| Credential {
        username: r.username.clone(),
        password,
        protocol: origin.protocol,
        host: origin.host,
    }))
}

/// The HTTP settings that decide where a request really goes and whether its peer is checked (a proxy
/// sees a plain-HTTP request's `Authorization`; an unchecked or another CA lets anyone be the host).
const TRANSPORT_KEYS: &[&str] = &[
    "proxy",
    "proxyauthmethod",
    "curloptresolve",
    "sslverify",
    "sslcainfo",
    "sslcapath",
    "sslbackend",
    "pinnedpubkey",
    "followredirects",
];

/// Whether a `git config --show-scope --get-regexp` line sets, in the repository's own configuration
/// (`local`, `worktree`, or a file either includes), one of the `TRANSPORT_KEYS` for HTTP or the remote.
fn sets_transport_locally(line: &str, remote: &str) -> Option<String> {
    let (scope, rest) = line.split_once('\t')?;
    let key = rest.split(' ').next()?.to_ascii_lowercase();
    if !matches!(scope, "local" | "worktree") {
        return None;
    }
    let var = key.rsplit('.').next()?;
    let of_remote = key.strip_prefix("remote.").and_then(|k| k.strip_suffix(var))
        == Some(&format!("{}.", remote.to_ascii_lowercase()));
    let hit = (key.starts_with("http.") && TRANSPORT_KEYS.contains(&var)) || (of_remote && var.starts_with("proxy"));
    hit.then_some(key)
}

/// A push with a credential goes as berth's and the user's own configuration say: the repository's
/// configuration (which an agent may have written) may not proxy it, resolve its host elsewhere or turn
/// off the check of its peer (`422 remote`, before git sends anything).
async fn refuse_local_transport(ctx: &Ctx, repo: &std::path::Path, remote: &str) -> Result<()> {
    let args = ["config", "--show-scope", "--get-regexp", "^(http|remote)\\."];
    let (code, out) = ctx
        .git
        .read_answer("config", repo, &args)
        .await
        .map_err(git_failed("config"))?;
    if code != 0 {
        return Ok(());
    }
    let text = String::from_utf8_lossy(&out);
    match text.lines().find_map(|l| sets_transport_locally(l, remote)) {
        None => Ok(()),
        Some(key) => Err(Error::invalid(
            "remote",
            format!("the repository's own configuration sets {key}: berth does not push with a credential through it"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::remotes::RemoteHost;
    use std::collections::BTreeMap;

    #[test]
    fn hosts_come_from_http_urls_only_and_without_user_info() {
        assert_eq!(host_of("https://github.com/o/r.git").as_deref(), Some("github.com"));
        assert_eq!(
            host_of("http://u@127.0.0.1:8080/r.git").as_deref(),
            Some("127.0.0.1:8080")
        );
        assert_eq!(host_of("git@github.com:o/r.git"), None);
        assert_eq!(host_of("/srv/git/r.git"), None);
        assert!(remote_name("origin").is_ok() && remote_name("--upload-pack=x").is_err());
    }

    #[test]
    fn the_repositorys_own_proxy_resolve_and_tls_settings_are_found() {
        let found = |l: &str| sets_transport_locally(l, "origin");
        assert_eq!(found("local\thttp.proxy http://x").as_deref(), Some("http.proxy"));
        assert_eq!(
            found("worktree\thttp.https://a.b/.sslVerify false").as_deref(),
            Some("http.https://a.b/.sslverify")
        );
        assert_eq!(
            found("local\thttp.curloptResolve a:1:2").as_deref(),
            Some("http.curloptresolve")
        );
        assert_eq!(
            found("local\tremote.origin.proxy y").as_deref(),
            Some("remote.origin.proxy")
        );
        assert_eq!(found("local\tremote.upstream.proxy y"), None);
        assert_eq!(found("local\tremote.origin.url http://x/r"), None);
        assert_eq!(found("local\thttp.postBuffer 1"), None);
        assert_eq!(found("global\thttp.proxy http://x"), None);
    }

    #[test]
    fn a_url_git_and_berth_could_read_two_ways_is_refused() {
        let origin = |p: &str, h: &str| {
            Ok(Some(HttpOrigin {
                protocol: p.into(),
                host: h.into(),
            }))
        };
        assert_eq!(http_origin("https://github.com/o/r.git"), origin("https", "github.com"));
        assert_eq!(http_origin("http://127.0.0.1:8080"), origin("http", "127.0.0.1:8080"));
        assert_eq!(http_origin("ssh://git@github.com/o/r.git"), Ok(None));
        assert_eq!(http_origin("file:///srv/r.git"), Ok(None));
        for url in [
            "http://127.0.0.1:1?@127.0.0.1:2/o/r",
            "http://127.0.0.1:1#@127.0.0.1:2/o/r",
            "http://127.0.0.1:1\\@127.0.0.1:2/o/r",
            "http://a@b@127.0.0.1:2/o/r",
            "http://u:p@127.0.0.1:2/o/r",
            "http://%61@127.0.0.1:2/o/r",
            "http://127.0.0.1:2/o/r?x=1",
            "http://127.0.0.1:2/o/../r",
            "http://127.0.0.1:2/o/%2e%2e/r",
            "https://GitHub.com/o/r",
            "https://github.com:443/o/r",
            "http://127.1:2/o/r",
            "http://[::1]:2/o/r",
            "http:/github.com/o/r",
            "HTTPS://github.com/o/r",
            "https:///o/r",
            "https://@github.com/o/r",
        ] {
            assert!(http_origin(url).is_err(), "{url}");
        }
    }

    fn remotes(hosts: &[&str]) -> BTreeMap<String, RemoteHost> {
        hosts
            .iter()
            .map(|h| {
                let r = RemoteHost {
                    username: "berth".into(),
                    token: Some(format!("token-for-{h}")),
                    api_url: String::new(),
                };
                (h.to_string(), r)
            })
            .collect()
    }

    #[test]
    fn the_credential_follows_the_url_git_pushes_to_and_only_where_the_remote_points() {
        let conf = remotes(&["127.0.0.1:1", "github.com"]);
        let one = |u: &str| vec![u.to_string()];
        let c = decide_credential("http://127.0.0.1:1/r", &one("http://127.0.0.1:1/r"), &conf)
            .unwrap()
            .unwrap();
        assert_eq!((c.protocol.as_str(), c.host.as_str()), ("http", "127.0.0.1:1"));
        assert_eq!(c.password, "token-for-127.0.0.1:1");
        // Another path on the same host is the same origin (a fork).
        assert!(
            decide_credential("https://github.com/a/r", &one("https://github.com/b/r"), &conf)
                .unwrap()
                .is_some()
        );
        // An ssh push URL for an HTTPS remote gets no credential, and is no refusal.
        assert!(
            decide_credential("https://github.com/a/r", &one("git@github.com:a/r.git"), &conf)
                .unwrap()
                .is_none()
        );
        // No credential for either side: pushed as git would, without one.
        assert!(
            decide_credential("http://h:9/r", &one("http://other:9/r"), &conf)
                .unwrap()
                .is_none()
        );
        for (fetch, push) in [
            ("http://127.0.0.1:1/r", one("http://127.0.0.1:2/r")),
            ("http://127.0.0.1:2/r", one("http://127.0.0.1:1/r")),
            ("https://github.com/o/r", one("http://github.com/o/r")),
            ("http://127.0.0.1:1/r", one("http://127.0.0.1:2?@127.0.0.1:1/r")),
            ("http://127.0.0.1:2?@127.0.0.1:1/r", one("http://127.0.0.1:1/r")),
            (
                "http://127.0.0.1:1/r",
                vec!["http://127.0.0.1:1/r".into(), "http://127.0.0.1:2/r".into()],
            ),
        ] {
            let e = decide_credential(fetch, &push, &conf).unwrap_err();
            assert!(matches!(e, Error::Invalid { .. }), "{fetch} {push:?}: {e:?}");
            assert!(!format!("{e:?}").contains("token-for"));
        }
    }
}
