//! In-process git status with gix (read-only: nothing is written back to the index): branch, HEAD,
//! upstream with ahead/behind, and per-file index and worktree status, untracked files included and
//! `.gitignore` respected.
use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct FileStatus {
    pub path: String,
    /// HEAD → index: `unmodified`, `added`, `modified`, `deleted`, `renamed`.
    pub index_status: IndexStatus,
    /// index → worktree: `unmodified`, `modified`, `deleted`, `typechange`, `renamed`, `untracked`,
    /// `conflict`.
    pub worktree_status: WorktreeStatus,
}

/// HEAD → index change of a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum IndexStatus {
    Unmodified,
    Added,
    Modified,
    Deleted,
    Renamed,
}

/// Index → worktree change of a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum WorktreeStatus {
    Unmodified,
    Modified,
    Deleted,
    Typechange,
    Renamed,
    Untracked,
    Conflict,
    /// Intent to add (`git add -N`): berth's own inspection reports it; a monitor may not.
    Added,
}

impl IndexStatus {
    /// The wire value, or `None` for a status berth does not know.
    pub fn parse(raw: &str) -> Option<IndexStatus> {
        serde_json::from_value(serde_json::Value::String(raw.to_string())).ok()
    }
}

impl WorktreeStatus {
    /// A monitor's wire value, or `None` for a status it may not report (`added` is berth's own).
    pub fn parse_reported(raw: &str) -> Option<WorktreeStatus> {
        serde_json::from_value(serde_json::Value::String(raw.to_string()))
            .ok()
            .filter(|s| *s != WorktreeStatus::Added)
    }
}

#[derive(Debug, Clone, Default)]
pub struct StatusSnapshot {
    pub branch: Option<String>,
    pub head_commit: Option<String>,
    pub upstream: Option<String>,
    pub ahead: i32,
    pub behind: i32,
    pub files: Vec<FileStatus>,
}

pub fn inspect(path: &Path) -> Result<StatusSnapshot, String> {
    let repo = super::harden::open_for_status(path)?;
    let branch = repo.head_name().ok().flatten().map(|n| n.shorten().to_string());
    let head_id = repo.head_id().ok().map(|id| id.detach());
    let mut snap = StatusSnapshot {
        branch: branch.clone(),
        head_commit: head_id.map(|id| id.to_string()),
        ..Default::default()
    };

    if let (Some(branch), Some(head)) = (&branch, head_id) {
        let config = repo.config_snapshot();
        let remote = config
            .string(format!("branch.{branch}.remote").as_str())
            .map(|s| s.to_string());
        let merge = config
            .string(format!("branch.{branch}.merge").as_str())
            .map(|s| s.to_string());
        if let (Some(remote), Some(merge)) = (remote, merge) {
            let short = merge.strip_prefix("refs/heads/").unwrap_or(&merge).to_string();
            let full = if remote == "." {
                format!("refs/heads/{short}")
            } else {
                format!("refs/remotes/{remote}/{short}")
            };
            snap.upstream = Some(if remote == "." {
                short.clone()
            } else {
                format!("{remote}/{short}")
            });
            if let Ok(Some(mut r)) = repo.try_find_reference(full.as_str())
                && let Ok(up) = r.peel_to_id()
            {
                let up = up.detach();
                snap.ahead = count(&repo, head, up);
                snap.behind = count(&repo, up, head);
            }
        }
    }

    let mut files: BTreeMap<String, FileStatus> = BTreeMap::new();
    let iter = repo
        .status(gix::progress::Discard)
        .map_err(|e| e.to_string())?
        .untracked_files(gix::status::UntrackedFiles::Files)
        .into_iter(None)
        .map_err(|e| e.to_string())?;
    for item in iter {
        let item = item.map_err(|e| e.to_string())?;
        match item {
            gix::status::Item::TreeIndex(change) => {
                use gix::diff::index::ChangeRef;
                let (loc, status) = match &change {
                    ChangeRef::Addition { location, .. } => (location.to_string(), IndexStatus::Added),
                    ChangeRef::Deletion { location, .. } => (location.to_string(), IndexStatus::Deleted),
                    ChangeRef::Modification { location, .. } => (location.to_string(), IndexStatus::Modified),
                    ChangeRef::Rewrite { location, .. } => (location.to_string(), IndexStatus::Renamed),
                };
                slot(&mut files, &loc).index_status = status;
            }
            gix::status::Item::IndexWorktree(change) => {
                use gix::status::index_worktree::Item as W;
                use gix::status::plumbing::index_as_worktree::{Change, EntryStatus};
                let (loc, status) = match &change {
                    W::Modification { rela_path, status, .. } => {
                        let s = match status {
                            EntryStatus::Conflict { .. } => WorktreeStatus::Conflict,
                            EntryStatus::Change(Change::Removed) => WorktreeStatus::Deleted,
                            EntryStatus::Change(Change::Type { .. }) => WorktreeStatus::Typechange,
                            EntryStatus::Change(Change::Modification { .. }) => WorktreeStatus::Modified,
                            EntryStatus::Change(Change::SubmoduleModification(_)) => WorktreeStatus::Modified,
                            EntryStatus::IntentToAdd => WorktreeStatus::Added,
                            EntryStatus::NeedsUpdate(_) => continue,
                        };
                        (rela_path.to_string(), s)
                    }
                    W::DirectoryContents { entry, .. } => match entry.status {
                        gix::dir::entry::Status::Untracked => (entry.rela_path.to_string(), WorktreeStatus::Untracked),
                        _ => continue,
                    },
                    W::Rewrite { dirwalk_entry, .. } => (dirwalk_entry.rela_path.to_string(), WorktreeStatus::Renamed),
                };
                slot(&mut files, &loc).worktree_status = status;
            }
        }
    }
    snap.files = files.into_values().collect();
    Ok(snap)
}

fn slot<'a>(files: &'a mut BTreeMap<String, FileStatus>, path: &str) -> &'a mut FileStatus {
    files.entry(path.to_string()).or_insert_with(|| FileStatus {
        path: path.to_string(),
        index_status: IndexStatus::Unmodified,
        worktree_status: WorktreeStatus::Unmodified,
    })
}

/// Commits reachable from `from` but not from `hidden`.
fn count(repo: &gix::Repository, from: gix::ObjectId, hidden: gix::ObjectId) -> i32 {
    repo.rev_walk([from])
        .with_hidden([hidden])
        .all()
        .map(|walk| walk.filter(|c| c.is_ok()).count() as i32)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_statuses_keep_their_stored_strings() {
        let f = FileStatus {
            path: "a".into(),
            index_status: IndexStatus::Added,
            worktree_status: WorktreeStatus::Typechange,
        };
        let v = serde_json::to_value(&f).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"path": "a", "index_status": "added", "worktree_status": "typechange"})
        );
        assert_eq!(serde_json::from_value::<FileStatus>(v).unwrap(), f);
    }

    #[test]
    fn reported_statuses_are_the_specs() {
        for s in ["unmodified", "added", "modified", "deleted", "renamed"] {
            assert!(IndexStatus::parse(s).is_some(), "{s}");
        }
        for s in [
            "unmodified",
            "modified",
            "deleted",
            "typechange",
            "renamed",
            "untracked",
            "conflict",
        ] {
            assert!(WorktreeStatus::parse_reported(s).is_some(), "{s}");
        }
        assert_eq!(IndexStatus::parse("bogus"), None);
        assert_eq!(IndexStatus::parse("Added"), None);
        assert_eq!(WorktreeStatus::parse_reported("exploded"), None);
        // berth's own inspection reports intent-to-add; a monitor may not (as before the enum existed).
        assert_eq!(WorktreeStatus::parse_reported("added"), None);
        assert_eq!(
            serde_json::from_str::<WorktreeStatus>("\"added\"").unwrap(),
            WorktreeStatus::Added
        );
    }
}
