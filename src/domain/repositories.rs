//! Source repositories a workspace may use. Registration proves, read-only, that the path is a canonical,
//! allowed, non-bare git work tree and records its identity; deregistration is refused while a live task
//! uses it and otherwise only hides the row (archived tasks keep their slots).
use crate::ids::{RepositoryId, WorkspaceId};
use std::path::{Component, Path, PathBuf};

use sea_orm::ConnectionTrait;
use serde_json::json;

use super::Ctx;
use super::pagination::{Page, PageRequest};
use crate::auth::{Principal, UnboundPrincipal};
use crate::entity::repository;
use crate::error::{Error, Result, is_unique_violation};
use crate::events::EventType;
use crate::events::{self, Subject};
use crate::git::{self, BranchName, InspectError};
use crate::store::repositories as store;

pub struct NewRepository {
    pub path: String,
    pub name: Option<String>,
    pub default_branch: Option<String>,
}

pub async fn register(
    ctx: &Ctx,
    p: &UnboundPrincipal,
    workspace_id: WorkspaceId,
    input: NewRepository,
) -> Result<repository::Model> {
    super::workspaces::visible(&ctx.db.conn, p, workspace_id).await?;
    let path = allowed_path(&input.path, ctx.config.repo_roots.as_deref(), &ctx.config.worktree_root)?;
    let default_branch = input
        .default_branch
        .as_deref()
        .map(|b| BranchName::parse(b).map_err(|m| Error::invalid("default_branch", m)))
        .transpose()?;
    let name = match input.name.as_deref() {
        Some(name) => RepositoryName::parse(name).map_err(|m| Error::invalid("name", m))?,
        None => RepositoryName::from_dir(&path),
    };

    let identity = identity(ctx, path).await?;
    let default_branch = default_branch
        .map(|b| b.as_str().to_string())
        .or(identity.head_branch)
        .unwrap_or_else(|| "main".to_string());

    let now = crate::clock::now();
    let model = repository::Model {
        id: RepositoryId::now_v7(),
        workspace_id,
        name: name.0,
        path: identity.workdir.to_string_lossy().into_owned(),
        common_git_dir: identity.common_git_dir.to_string_lossy().into_owned(),
        default_branch,
        created_at: now,
        updated_at: now,
        deleted_at: None,
        imported_from: None,
        status: repository::RepositoryStatus::Available,
        // Proven on this node's disk, so it is this node's.
        node_id: Some(ctx.config.node_id.clone()),
    };
    let txn = ctx.db.begin_write().await?;
    match store::insert(&txn, &model).await {
        Err(e) if is_unique_violation(&e) => {
            return Err(Error::AlreadyExists(
                "a repository with this path or name is already registered in this workspace",
            ));
        }
        // The workspace vanished between the check and the insert.
        Err(e) if matches!(e.sql_err(), Some(sea_orm::SqlErr::ForeignKeyConstraintViolation(_))) => {
            return Err(Error::NotFound("workspace"));
        }
        other => other?,
    };
    events::append(
        &txn,
        ctx.instance_id,
        EventType::RepositoryCreated,
        Subject::workspace(workspace_id),
        json!({ "repository_id": model.id, "name": model.name }),
    )
    .await?;
    ctx.commit(txn).await?;
    Ok(model)
}

pub async fn list(
    ctx: &Ctx,
    p: &UnboundPrincipal,
    workspace_id: WorkspaceId,
    page: PageRequest,
) -> Result<Page<repository::Model>> {
    super::workspaces::visible(&ctx.db.conn, p, workspace_id).await?;
    let rows = store::page_of_workspace(&ctx.db.conn, workspace_id, page.before, page.fetch()).await?;
    Ok(Page::from_rows(rows, &page, |r| r.id))
}

pub async fn get(ctx: &Ctx, p: &UnboundPrincipal, id: RepositoryId) -> Result<repository::Model> {
    visible(&ctx.db.conn, p, id).await
}

pub async fn delete(ctx: &Ctx, p: &UnboundPrincipal, id: RepositoryId) -> Result<()> {
    let txn = ctx.db.begin_write().await?;
    // The row lock (PostgreSQL) orders this against task creation, which share-locks the repository.
    let repo = store::lock_registered(&txn, id)
        .await?
        .filter(|r| p.sees_workspace(r.workspace_id))
        .ok_or(Error::NotFound("repository"))?;
    let live_tasks = store::live_task_slots(&txn, id).await?;
    if live_tasks > 0 {
        return Err(Error::RepositoryInUse { task_count: live_tasks });
    }
    store::mark_deleted(&txn, id, crate::clock::now()).await?;
    events::append(
        &txn,
        ctx.instance_id,
        EventType::RepositoryDeleted,
        Subject::workspace(repo.workspace_id),
        json!({ "repository_id": id }),
    )
    .await?;
    ctx.commit(txn).await?;
    Ok(())
}

/// The git identity of an allowed path, read-only; the repository itself must be allowed too.
async fn identity(ctx: &Ctx, path: PathBuf) -> Result<git::RepositoryIdentity> {
    let identity = tokio::task::spawn_blocking(move || git::inspect_repository(&path))
        .await
        .map_err(|e| Error::Internal(e.into()))?
        .map_err(|e| match e {
            InspectError::NotARepository => Error::NotAGitRepository("the path is not a git repository"),
            InspectError::Bare => Error::NotAGitRepository("a bare repository has no work tree"),
            InspectError::NotTheRoot => Error::NotAGitRepository("the path is not the root of a git work tree"),
        })?;
    // The repository itself (its common git directory) must be allowed too, not only the work tree: a
    // linked worktree inside the roots may belong to a repository outside them.
    if !under_roots(&identity.common_git_dir, ctx.config.repo_roots.as_deref()) {
        return Err(Error::PathNotAllowed(
            "the repository's git directory is outside the allowed repository roots",
        ));
    }
    if identity.common_git_dir.starts_with(&ctx.config.worktree_root) {
        return Err(Error::PathNotAllowed(
            "the repository lives inside berth's worktree root",
        ));
    }
    Ok(identity)
}

/// A registered repository the token may see; otherwise `not_found`.
pub(crate) async fn visible<C: ConnectionTrait>(
    conn: &C,
    p: &Principal,
    id: RepositoryId,
) -> Result<repository::Model> {
    store::find_registered(conn, id)
        .await?
        .filter(|r| p.sees_workspace(r.workspace_id))
        .ok_or(Error::NotFound("repository"))
}

/// Checks a path a client asks to register without following it anywhere: absolute, no `..`, inside the
/// allowed roots (decided lexically, before the filesystem is touched, so nothing outside them is probed),
/// no symlink on the way (checked component by component, so nothing behind a symlink is probed either),
/// existing, and not inside berth's own worktree root. Errors name no path.
fn allowed_path(raw: &str, roots: Option<&[PathBuf]>, worktree_root: &Path) -> Result<PathBuf> {
    if raw.trim().is_empty() {
        return Err(Error::invalid("path", "must not be empty"));
    }
    let path = Path::new(raw);
    if !path.is_absolute() {
        return Err(Error::PathNotAllowed("the path must be absolute"));
    }
    const NOT_CANONICAL: &str = "the path must be canonical: no symlinks, '.' or '..'";
    if path.components().any(|c| matches!(c, Component::ParentDir)) {
        return Err(Error::PathNotAllowed(NOT_CANONICAL));
    }
    if !under_roots(path, roots) {
        return Err(Error::PathNotAllowed(
            "the path is outside the allowed repository roots",
        ));
    }
    let mut prefix = PathBuf::new();
    for component in path.components() {
        prefix.push(component);
        match std::fs::symlink_metadata(&prefix) {
            Ok(meta) if meta.file_type().is_symlink() => {
                return Err(Error::PathNotAllowed(NOT_CANONICAL));
            }
            Ok(_) => {}
            Err(_) => {
                return Err(Error::NotAGitRepository("the path does not exist or cannot be read"));
            }
        }
    }
    let canonical = path
        .canonicalize()
        .map_err(|_| Error::NotAGitRepository("the path does not exist or cannot be read"))?;
    if canonical != path || !under_roots(&canonical, roots) {
        return Err(Error::PathNotAllowed(NOT_CANONICAL));
    }
    if canonical.starts_with(worktree_root) {
        return Err(Error::PathNotAllowed("the path is inside berth's worktree root"));
    }
    Ok(canonical)
}

fn under_roots(path: &Path, roots: Option<&[PathBuf]>) -> bool {
    roots.is_none_or(|roots| roots.iter().any(|root| path.starts_with(root)))
}

/// A repository name: it names the repository's worktree directory inside a task root.
struct RepositoryName(String);

impl RepositoryName {
    fn parse(name: &str) -> std::result::Result<RepositoryName, &'static str> {
        let ok = !name.is_empty()
            && name.len() <= 100
            && !name.starts_with('.')
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
        if ok {
            Ok(RepositoryName(name.to_string()))
        } else {
            Err("must be 1 to 100 of A-Z a-z 0-9 . _ - and not start with '.'")
        }
    }

    /// The directory's name, with anything a name may not hold replaced.
    fn from_dir(path: &Path) -> RepositoryName {
        let base = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let mut name: String = base
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                    c
                } else {
                    '-'
                }
            })
            .take(100)
            .collect();
        while name.starts_with('.') {
            name.remove(0);
        }
        if name.is_empty() {
            name = "repository".into();
        }
        RepositoryName(name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_directory_safe() {
        assert!(RepositoryName::parse("api-server_2.x").is_ok());
        for bad in ["", "..", ".git", "a/b", "a b", "ü"] {
            assert!(RepositoryName::parse(bad).is_err(), "{bad:?} should be refused");
        }
        assert_eq!(RepositoryName::from_dir(Path::new("/src/my repo")).0, "my-repo");
        assert_eq!(RepositoryName::from_dir(Path::new("/src/.hidden")).0, "hidden");
    }
}
