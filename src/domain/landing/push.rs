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
    let credential = credential_for(ctx, &url);
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
    let out = ctx
        .git
        .read_bytes("remote", repo, &["remote", "get-url", "--", remote], &[])
        .await
        .map_err(|_| Error::invalid("remote", "the repository has no such remote"))?;
    Ok(String::from_utf8_lossy(&out).trim().to_string())
}

/// `host[:port]` of an `http(s)://` URL (credentials are given only to HTTP remotes).
pub(crate) fn host_of(url: &str) -> Option<String> {
    let rest = url.strip_prefix("https://").or_else(|| url.strip_prefix("http://"))?;
    let authority = rest.split('/').next()?;
    let host = authority.rsplit('@').next()?;
    (!host.is_empty()).then(|| host.to_ascii_lowercase())
}

/// The configured credential for the remote's host, if any.
pub(crate) fn credential_for(ctx: &Ctx, url: &str) -> Option<Credential> {
    let host = host_of(url)?;
    let r = ctx.config.remotes.get(&host)?;
    Some(Credential {
        username: r.username.clone(),
        password: r.token.clone()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_come_from_http_urls_only_and_without_user_info() {
        assert_eq!(host_of("https://github.com/o/r.git").as_deref(), Some("github.com"));
        assert_eq!(
            host_of("http://u:p@127.0.0.1:8080/r.git").as_deref(),
            Some("127.0.0.1:8080")
        );
        assert_eq!(host_of("git@github.com:o/r.git"), None);
        assert_eq!(host_of("/srv/git/r.git"), None);
        assert!(remote_name("origin").is_ok() && remote_name("--upload-pack=x").is_err());
    }
}
