//! The chain most tests begin with, in one call: a workspace, a repository registered in it, a task over
//! that repository, and then the sessions a test starts on the task.
use std::path::PathBuf;
use std::time::Duration;

use serde_json::{Value, json};
use uuid::Uuid;

use crate::helpers::{TestApp, id_of, uuid, wait_session_within};

/// A workspace with one registered repository and a task over it (see [`TestApp::task_with_repo`]).
pub struct Fixture<'a> {
    pub app: &'a TestApp,
    pub workspace: Uuid,
    pub repository: Uuid,
    /// The repository's checkout, canonical (what [`TestApp::repository`] returns).
    pub repo_dir: PathBuf,
    pub task: Uuid,
}

/// A session launched by [`Fixture::started_session`]: as created, and once idle.
pub struct StartedSession {
    pub id: Uuid,
    /// The 201 body of the create.
    pub created: Value,
    /// The session as read once it was idle.
    pub idle: Value,
}

impl TestApp {
    /// Workspace `ws`, repository `svc` (one commit on `main`) in it, and a task `title` over it.
    pub async fn task_with_repo(&self, title: &str) -> Fixture<'_> {
        self.task_with_repo_in("ws", "svc", title).await
    }

    /// A subtask `title` of `parent` in `workspace` that works in its parent's environment
    /// (`workspace_mode: inherit_parent`); returns its id.
    pub async fn subtask(&self, workspace: Uuid, parent: Uuid, title: &str) -> Uuid {
        let body = json!({"title": title, "parent_task_id": parent, "workspace_mode": "inherit_parent"});
        id_of(
            &self
                .post(&format!("/api/v1/workspaces/{workspace}/tasks"), body)
                .await
                .ok(201),
        )
    }

    /// A session of the agent `profile` on `task` (`executor`), created but not launched (`start: false`,
    /// 201 expected); returns it.
    pub async fn unstarted_agent(&self, task: Uuid, executor: &str, profile: &str) -> Value {
        let body = json!({"executor_type": executor, "agent_profile": profile, "start": false});
        self.post(&format!("/api/v1/tasks/{task}/sessions"), body).await.ok(201)
    }

    /// A worktree session on `task` launched with the agent `profile` (201 expected), once idle (20 s at
    /// most, as `agents::wait_session`).
    pub async fn started_agent(&self, task: Uuid, profile: &str) -> StartedSession {
        self.started_agent_within(task, profile, Duration::from_secs(20)).await
    }

    /// [`Self::started_agent`] with `within` as the deadline of the wait.
    pub async fn started_agent_within(&self, task: Uuid, profile: &str, within: Duration) -> StartedSession {
        let body = json!({"executor_type": "worktree", "agent_profile": profile});
        let created = self.post(&format!("/api/v1/tasks/{task}/sessions"), body).await.ok(201);
        let id = uuid(&created["id"]);
        let idle = wait_session_within(self, id, within, "idle", |s| s["state"] == "idle").await;
        StartedSession { id, created, idle }
    }

    /// [`Self::task_with_repo`] with other names for the workspace and the repository.
    pub async fn task_with_repo_in(&self, workspace: &str, repository: &str, title: &str) -> Fixture<'_> {
        let ws = self.workspace(workspace).await;
        let (repo, repo_dir) = self.repository(ws, repository).await;
        let task = self.task(ws, title, &[repo]).await;
        Fixture {
            app: self,
            workspace: ws,
            repository: repo,
            repo_dir,
            task,
        }
    }
}

impl Fixture<'_> {
    /// The task's session collection, `/api/v1/tasks/{task}/sessions`.
    pub fn sessions_url(&self) -> String {
        format!("/api/v1/tasks/{}/sessions", self.task)
    }

    /// Creates a session on the task with this body (201 expected) and returns it.
    pub async fn session_with(&self, body: Value) -> Value {
        self.app.post(&self.sessions_url(), body).await.ok(201)
    }

    /// A session on the task without an agent (`start: false`, 201 expected), as [`TestApp::session`].
    pub async fn session(&self, executor: &str) -> Value {
        self.app.session(self.task, executor).await
    }

    /// [`TestApp::unstarted_agent`] on the task.
    pub async fn unstarted_agent(&self, executor: &str, profile: &str) -> Value {
        self.app.unstarted_agent(self.task, executor, profile).await
    }

    /// A worktree session launched with the agent `profile` (201 expected); returns it as created.
    pub async fn agent(&self, profile: &str) -> Value {
        self.session_with(json!({"executor_type": "worktree", "agent_profile": profile}))
            .await
    }

    /// [`Self::agent`], launched with `prompt` as its first message when there is one.
    pub async fn agent_with(&self, profile: &str, prompt: Option<&str>) -> Value {
        match prompt {
            Some(prompt) => self.agent_prompted(profile, prompt).await,
            None => self.agent(profile).await,
        }
    }

    /// [`Self::agent`], launched with `prompt`.
    pub async fn agent_prompted(&self, profile: &str, prompt: &str) -> Value {
        self.session_with(json!({"executor_type": "worktree", "agent_profile": profile, "prompt": prompt}))
            .await
    }

    /// [`Self::agent`], then waits (20 s at most, as `agents::wait_session`) until the session is idle.
    pub async fn started_session(&self, profile: &str) -> StartedSession {
        self.app.started_agent(self.task, profile).await
    }

    /// [`Self::started_session`] with `within` as the deadline of the wait.
    pub async fn started_session_within(&self, profile: &str, within: Duration) -> StartedSession {
        self.app.started_agent_within(self.task, profile, within).await
    }
}
