//! Pull requests: berth pushes the task branch, then opens a pull request on the GitHub (or GitHub
//! Enterprise) the remote's URL names, through its REST API (`[remotes."<host>"] api_url`), records it on
//! the task, and reads its state again every `BERTH_PULL_REQUEST_POLL_SECS`. GitLab is not supported (no
//! way to prove it here the same way). The token goes only in the request's `Authorization` header; it is
//! never logged, stored or answered.
use crate::ids::{EnvironmentId, PullRequestId, RepositoryId, WorkspaceId};
use std::time::Duration;

use serde::Serialize;
use serde_json::{Value, json};
use utoipa::ToSchema;

use super::{Ctx, landable, slots};
use crate::auth::UnboundPrincipal;
use crate::entity::pull_request as pr;
use crate::error::{Error, Result};
use crate::events::{self, EventType, Subject};

/// How long one call to the host's API may take.
const API_TIMEOUT: Duration = Duration::from_secs(30);

pub struct NewPullRequest {
    pub repository_id: RepositoryId,
    pub title: String,
    pub body: Option<String>,
    pub base: Option<String>,
    pub draft: bool,
}

/// A pull request as a task lists it.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct PullRequest {
    pub id: PullRequestId,
    pub repository_id: RepositoryId,
    pub task_environment_id: EnvironmentId,
    pub url: String,
    pub number: i64,
    /// `open`, `closed` or `merged`, as last read from its host.
    pub state: String,
    pub draft: bool,
    pub head: String,
    pub base: String,
    pub created_at: chrono::DateTime<chrono::Utc>,
    /// When its state was last read from its host.
    pub checked_at: chrono::DateTime<chrono::Utc>,
}

impl From<pr::Model> for PullRequest {
    fn from(m: pr::Model) -> Self {
        PullRequest {
            id: m.id,
            repository_id: m.repository_id,
            task_environment_id: m.task_environment_id,
            url: m.url,
            number: m.number,
            state: m.state,
            draft: m.draft,
            head: m.head,
            base: m.base,
            created_at: m.created_at,
            checked_at: m.checked_at,
        }
    }
}

/// `owner` and `repo` of `https://host/owner/repo(.git)`.
pub(crate) fn owner_and_repo(url: &str) -> Option<(String, String)> {
    let rest = url.strip_prefix("https://").or_else(|| url.strip_prefix("http://"))?;
    let mut parts = rest.split('/').skip(1).filter(|p| !p.is_empty());
    let owner = parts.next()?.to_string();
    let repo = parts.next()?.trim_end_matches(".git").to_string();
    (parts.next().is_none() && !owner.is_empty() && !repo.is_empty()).then_some((owner, repo))
}

fn client() -> Result<reqwest::Client> {
    reqwest::Client::builder()
        .timeout(API_TIMEOUT)
        .redirect(reqwest::redirect::Policy::none())
        .user_agent(concat!("berth/", env!("CARGO_PKG_VERSION")))
        .build()
        .map_err(|e| Error::Internal(e.into()))
}

/// One call to the host's API; its errors as typed problems (never with the token).
async fn call(method: reqwest::Method, url: &str, token: &str, body: Option<&Value>) -> Result<Value> {
    // GitHub takes `application/json` as well as its own media type (which some mocks refuse).
    let mut req = client()?
        .request(method, url)
        .bearer_auth(token)
        .header("Accept", "application/json")
        .header("X-GitHub-Api-Version", "2022-11-28");
    if let Some(b) = body {
        req = req.json(b);
    }
    let res = req.send().await.map_err(|e| {
        Error::RemoteUnreachable(format!(
            "the API did not answer: {}",
            crate::error::with_causes(&e.without_url())
        ))
    })?;
    let status = res.status();
    let text = res.text().await.unwrap_or_default();
    let value: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
    let message = value["message"]
        .as_str()
        .unwrap_or("")
        .chars()
        .take(500)
        .collect::<String>();
    match status.as_u16() {
        200..=299 => Ok(value),
        401 | 403 => Err(Error::RemoteAuthFailed),
        404 => Err(Error::invalid(
            "repository_id",
            format!("the host knows no such repository or pull request ({message})"),
        )),
        422 => Err(Error::InvalidState(format!(
            "the host refused the pull request: {message}"
        ))),
        code => Err(Error::RemoteUnreachable(format!("the API answered {code}: {message}"))),
    }
}

fn state_of(v: &Value) -> (String, bool) {
    let state = if v["merged"].as_bool() == Some(true) || v["merged_at"].is_string() {
        "merged".to_string()
    } else if v["state"].as_str() == Some("closed") {
        "closed".to_string()
    } else {
        "open".to_string()
    };
    (state, v["draft"].as_bool().unwrap_or(false))
}

/// Pushes the task branch and opens a pull request for it.
pub async fn open(ctx: &Ctx, p: &UnboundPrincipal, env_id: EnvironmentId, new: NewPullRequest) -> Result<pr::Model> {
    if new.title.trim().is_empty() || new.title.len() > 1_000 {
        return Err(Error::invalid("title", "must be 1 to 1000 bytes"));
    }
    if new.body.as_ref().is_some_and(|b| b.len() > 60_000) {
        return Err(Error::invalid("body", "must be at most 60000 bytes"));
    }
    let (e, task) = landable(ctx, p, env_id).await?;
    let slot = slots(ctx, &e, Some(&[new.repository_id]), "repository_id")
        .await?
        .pop()
        .ok_or_else(|| Error::invalid("repository_id", "is not a repository of this environment"))?;
    let remote = "origin";
    let url = super::push::remote_url(ctx, &slot.repository, remote).await?;
    let (Some(host), Some((owner, repo))) = (super::push::host_of(&url), owner_and_repo(&url)) else {
        return Err(Error::invalid(
            "repository_id",
            "the repository's origin is not an https://host/owner/repo remote",
        ));
    };
    let conf = ctx.config.remotes.get(&host).ok_or(Error::RemoteAuthFailed)?;
    let token = conf.token.clone().ok_or(Error::RemoteAuthFailed)?;
    let base = new.base.clone().unwrap_or_else(|| slot.base_branch.clone());
    crate::git::BranchName::parse(&base).map_err(|why| Error::invalid("base", why))?;
    super::push(ctx, p, env_id, new.repository_id, remote, false).await?;
    let mut body = json!({
        "title": new.title,
        "head": slot.branch.as_str(),
        "base": base,
        "draft": new.draft,
    });
    if let Some(b) = &new.body {
        body["body"] = json!(b);
    }
    let answer = call(
        reqwest::Method::POST,
        &format!("{}/repos/{owner}/{repo}/pulls", conf.api_url),
        &token,
        Some(&body),
    )
    .await?;
    let number = answer["number"]
        .as_i64()
        .ok_or_else(|| Error::RemoteUnreachable("the API's answer has no pull request number".into()))?;
    let (state, draft) = state_of(&answer);
    let now = crate::clock::now();
    let row = pr::Model {
        id: PullRequestId::now_v7(),
        task_id: task.id,
        task_environment_id: e.id,
        repository_id: new.repository_id,
        api_url: conf.api_url.clone(),
        owner,
        repo,
        number,
        url: answer["html_url"].as_str().unwrap_or_default().to_string(),
        state,
        draft,
        head: slot.branch.as_str().to_string(),
        base,
        created_at: now,
        updated_at: now,
        checked_at: now,
    };
    let txn = ctx.db.begin_write().await?;
    crate::store::pull_requests::insert(&txn, row.clone()).await?;
    announce(&txn, ctx, task.workspace_id, &row).await?;
    ctx.commit(txn).await?;
    Ok(row)
}

async fn announce(
    txn: &sea_orm::DatabaseTransaction,
    ctx: &Ctx,
    workspace_id: WorkspaceId,
    row: &pr::Model,
) -> Result<()> {
    events::append(
        txn,
        ctx.instance_id,
        EventType::PullRequestUpdated,
        Subject {
            task_environment_id: Some(row.task_environment_id),
            ..Subject::task(workspace_id, row.task_id)
        },
        json!({ "pull_request": PullRequest::from(row.clone()) }),
    )
    .await?;
    Ok(())
}

/// Reads every open pull request's state again (the poll, every `BERTH_PULL_REQUEST_POLL_SECS`); a
/// change is recorded with its event. A host that fails is tried again on the next round.
pub async fn refresh_open(ctx: &Ctx) -> Result<()> {
    for row in crate::store::pull_requests::open_ones(&ctx.db.conn).await? {
        let host = row
            .api_url
            .split("://")
            .nth(1)
            .and_then(|r| r.split('/').next())
            .unwrap_or_default()
            .to_string();
        let token = ctx
            .config
            .remotes
            .values()
            .find(|r| r.api_url == row.api_url)
            .or_else(|| ctx.config.remotes.get(&host))
            .and_then(|r| r.token.clone());
        let Some(token) = token else { continue };
        let url = format!("{}/repos/{}/{}/pulls/{}", row.api_url, row.owner, row.repo, row.number);
        let now = crate::clock::now();
        match call(reqwest::Method::GET, &url, &token, None).await {
            Ok(v) => {
                let (state, draft) = state_of(&v);
                if state == row.state && draft == row.draft {
                    crate::store::pull_requests::checked(&ctx.db.conn, row.id, now).await?;
                    continue;
                }
                let Some(task) = crate::store::tasks::find(&ctx.db.conn, row.task_id).await? else {
                    continue;
                };
                let txn = ctx.db.begin_write().await?;
                crate::store::pull_requests::record_state(&txn, row.id, &state, draft, now).await?;
                let updated = pr::Model {
                    state,
                    draft,
                    updated_at: now,
                    checked_at: now,
                    ..row
                };
                announce(&txn, ctx, task.workspace_id, &updated).await?;
                ctx.commit(txn).await?;
            }
            Err(err) => tracing::warn!(pull_request = %row.id, error = %err, "reading a pull request's state"),
        }
    }
    Ok(())
}

/// The poll loop (one per process, stopped with the process's background tasks; a state two replicas
/// both read is recorded by whichever writes first, and again by the other only if it changed since).
pub async fn poll(ctx: Ctx) {
    loop {
        if let Err(err) = refresh_open(&ctx).await {
            tracing::warn!(error = %err, "pull request poll");
        }
        tokio::time::sleep(ctx.config.pull_request_poll).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owner_and_repo_come_from_the_remote_url() {
        assert_eq!(
            owner_and_repo("https://github.com/acme/api.git"),
            Some(("acme".into(), "api".into()))
        );
        assert_eq!(
            owner_and_repo("http://127.0.0.1:9/acme/web"),
            Some(("acme".into(), "web".into()))
        );
        assert_eq!(owner_and_repo("https://github.com/acme"), None);
        assert_eq!(owner_and_repo("git@github.com:acme/api.git"), None);
    }

    #[test]
    fn merged_wins_over_closed() {
        assert_eq!(state_of(&json!({"state": "closed", "merged": true})).0, "merged");
        assert_eq!(state_of(&json!({"state": "closed", "merged": false})).0, "closed");
        assert_eq!(
            state_of(&json!({"state": "open", "draft": true})),
            ("open".into(), true)
        );
    }
}
