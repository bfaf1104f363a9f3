//! Executors: where an environment's files live and how they come to exist. `worktree` creates one git
//! worktree per repository slot under `BERTH_WORKTREE_ROOT`; `local` uses the registered repository itself
//! and never creates or removes anything. What they create or remove is a `ManagedPath` (I13).
pub mod admission;
pub mod worktree;

use crate::ids::TaskId;

/// The directory of a task under the root: a readable slug of its title and a unique suffix of its id.
pub fn task_dir_name(title: &str, task_id: TaskId) -> String {
    let mut slug = String::new();
    for c in title.chars().flat_map(char::to_lowercase) {
        if c.is_ascii_alphanumeric() {
            slug.push(c);
        } else if !slug.ends_with('-') && !slug.is_empty() {
            slug.push('-');
        }
        if slug.len() >= 40 {
            break;
        }
    }
    let slug = slug.trim_end_matches('-');
    let hex = task_id.uuid().simple().to_string();
    let suffix = &hex[hex.len() - 12..];
    if slug.is_empty() {
        format!("task-{suffix}")
    } else {
        format!("{slug}-{suffix}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn task_dirs_are_readable_and_unique() {
        let id: TaskId = "0190f0f0-0000-7000-8000-00000000abcd".parse().unwrap();
        assert_eq!(task_dir_name("Add login: OAuth!", id), "add-login-oauth-00000000abcd");
        assert_eq!(task_dir_name("***", id), "task-00000000abcd");
    }
}
