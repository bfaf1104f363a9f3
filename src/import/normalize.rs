//! Seed 001's "Schema normalization" as pure functions over kandev's rows: who owns each physical
//! worktree after the cutover, what is history, and what is irreconcilable.
//!
//! Precedence, per physical `worktree_id` (exact, non-empty): a canonical `task_environment_repos` row,
//! then the surviving environment's flat `worktree_*` fields, then `task_session_worktrees`. Path and
//! branch are metadata that may drift on a lower source; they never make a second owner.
use std::collections::{BTreeMap, HashMap, HashSet};

use super::model::*;
use super::report::Entry;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TargetState {
    Active,
    Merged,
    /// A canonical row recording a repository that failed to prepare (no worktree).
    Failed,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SourceKind {
    Canonical,
    Flat,
    Session,
}

/// One normalized inventory row: the owner of a (environment, repository, branch slot).
#[derive(Debug, Clone)]
pub struct Target {
    pub env_key: String,
    pub repository_id: String,
    pub branch_slug: String,
    pub worktree_id: Option<String>,
    pub path: Option<String>,
    pub branch: Option<String>,
    pub position: i64,
    pub error_message: Option<String>,
    pub state: TargetState,
    pub source: SourceKind,
    /// The kandev row it was built from.
    pub source_id: String,
    pub created_at: Ts,
    pub updated_at: Ts,
}

#[derive(Debug, Default)]
pub struct Ownership {
    /// Every environment id of a live task → its task's surviving environment id.
    pub env_alias: HashMap<String, String>,
    /// Every environment key (surviving kandev id, or `task:<id>` for one the import creates) → its task.
    pub env_task: BTreeMap<String, String>,
    /// Session id → the environment key it is bound to after the cutover.
    pub session_env: HashMap<String, String>,
    pub targets: Vec<Target>,
    pub history: Vec<Entry>,
    pub refused: Vec<Entry>,
}

type Slot = (String, String, String);

/// The environment key the import creates for a task that has sessions but no environment.
pub fn created_env_key(task_id: &str) -> String {
    format!("task:{task_id}")
}

pub fn normalize(src: &Source) -> Ownership {
    let mut n = Normalizer {
        src,
        out: Ownership::default(),
        tasks: src.tasks.iter().map(|t| t.id.as_str()).collect(),
        survivor: HashMap::new(),
        deleted_ids: HashSet::new(),
    };
    n.survivors();
    n.canonical();
    n.flat();
    n.sessions();
    n.session_worktrees();
    n.out
}

struct Normalizer<'a> {
    src: &'a Source,
    out: Ownership,
    tasks: HashSet<&'a str>,
    /// Task id → its surviving environment id.
    survivor: HashMap<String, String>,
    /// Physical ids that only a deleted normalized target carries.
    deleted_ids: HashSet<String>,
}

impl<'a> Normalizer<'a> {
    fn repo_name(&self, id: Option<&str>) -> Option<String> {
        let id = id?;
        self.src
            .repositories
            .iter()
            .find(|r| r.id == id)
            .map(|r| r.name.clone())
    }

    fn history(&mut self, e: Entry) {
        self.out.history.push(e);
    }

    fn refuse(&mut self, e: Entry) {
        self.out.refused.push(e);
    }

    fn live_ids(&self) -> HashMap<String, usize> {
        self.out
            .targets
            .iter()
            .enumerate()
            .filter_map(|(i, t)| t.worktree_id.clone().map(|w| (w, i)))
            .collect()
    }

    fn slot_taken(&self, slot: &Slot) -> bool {
        self.out
            .targets
            .iter()
            .any(|t| t.env_key == slot.0 && t.repository_id == slot.1 && t.branch_slug == slot.2)
    }

    /// A task's surviving environment: the newest `updated_at`, then `created_at` (then the greater id).
    fn survivors(&mut self) {
        let src = self.src;
        let mut by_task: BTreeMap<&str, Vec<&Environment>> = BTreeMap::new();
        for e in &src.environments {
            if self.tasks.contains(e.task_id.as_str()) {
                by_task.entry(e.task_id.as_str()).or_default().push(e);
            }
        }
        for (task, envs) in by_task {
            let best = envs
                .iter()
                .max_by(|a, b| (a.updated_at, a.created_at, &a.id).cmp(&(b.updated_at, b.created_at, &b.id)))
                .expect("a task listed here has an environment");
            for e in &envs {
                self.out.env_alias.insert(e.id.clone(), best.id.clone());
            }
            self.survivor.insert(task.to_string(), best.id.clone());
            self.out.env_task.insert(best.id.clone(), task.to_string());
        }
    }

    fn env_repo_entry(&self, rule: &'static str, r: &EnvRepo, msg: &str) -> Entry {
        Entry {
            environment_id: Some(r.env_id.clone()),
            worktree_id: r.worktree_id.clone(),
            repository_id: Some(r.repository_id.clone()),
            repository: self.repo_name(Some(&r.repository_id)),
            path: r.path.clone(),
            branch: r.branch.clone(),
            ..Entry::new(rule, "task_environment_repos", &r.id, msg)
        }
    }

    /// Canonical rows, re-homed onto their task's surviving environment. The original environment id is
    /// no ownership condition after re-homing.
    fn canonical(&mut self) {
        let src = self.src;
        let mut slots: BTreeMap<Slot, Vec<&EnvRepo>> = BTreeMap::new();
        for r in &src.env_repos {
            match self.out.env_alias.get(&r.env_id) {
                Some(env) => slots
                    .entry((env.clone(), r.repository_id.clone(), r.branch_slug.clone()))
                    .or_default()
                    .push(r),
                None => {
                    let e = self.env_repo_entry(
                        "environment_without_task",
                        r,
                        "its environment or task does not exist; nothing can own it",
                    );
                    self.history(e);
                }
            }
        }
        for (slot, rows) in slots {
            let (deleted, mut live): (Vec<&EnvRepo>, Vec<&EnvRepo>) = rows.into_iter().partition(|r| r.deleted);
            for r in deleted {
                if let Some(w) = &r.worktree_id {
                    self.deleted_ids.insert(w.clone());
                }
                let e = self.env_repo_entry("deleted_inventory_row", r, "a deleted inventory row is history");
                self.history(e);
            }
            live.sort_by(|a, b| (b.updated_at, b.created_at, &b.id).cmp(&(a.updated_at, a.created_at, &a.id)));
            let mut live = live.into_iter();
            let Some(winner) = live.next() else { continue };
            for r in live {
                let e = self.env_repo_entry(
                    "collapsed_inventory_superseded",
                    r,
                    "two inventory rows of collapsed environments share one slot; the newest keeps it",
                );
                self.history(e);
            }
            let state = match (&winner.worktree_id, winner.merged) {
                (None, _) => TargetState::Failed,
                (Some(_), true) => TargetState::Merged,
                (Some(_), false) => TargetState::Active,
            };
            self.out.targets.push(Target {
                env_key: slot.0,
                repository_id: slot.1,
                branch_slug: slot.2,
                worktree_id: winner.worktree_id.clone(),
                path: winner.path.clone(),
                branch: winner.branch.clone(),
                position: winner.position,
                error_message: winner.error_message.clone(),
                state,
                source: SourceKind::Canonical,
                source_id: winner.id.clone(),
                created_at: winner.created_at,
                updated_at: winner.updated_at,
            });
        }
        // One physical worktree on two canonical slots has no single owner.
        let mut seen: HashMap<String, Vec<usize>> = HashMap::new();
        for (i, t) in self.out.targets.iter().enumerate() {
            if let Some(w) = &t.worktree_id {
                seen.entry(w.clone()).or_default().push(i);
            }
        }
        for idx in seen.into_values().filter(|v| v.len() > 1) {
            for i in idx {
                let t = self.out.targets[i].clone();
                let r = self
                    .src
                    .env_repos
                    .iter()
                    .find(|r| r.id == t.source_id)
                    .expect("a canonical target comes from a row");
                let e = self.env_repo_entry(
                    "worktree_on_two_slots",
                    r,
                    "one physical worktree is the inventory of two slots; it cannot have one owner",
                );
                self.refuse(e);
            }
        }
    }

    fn flat_entry(&self, rule: &'static str, e: &Environment, f: &FlatWorktree, msg: &str) -> Entry {
        Entry {
            task_id: Some(e.task_id.clone()),
            environment_id: Some(e.id.clone()),
            worktree_id: Some(f.worktree_id.clone()),
            repository_id: f.repository_id.clone(),
            repository: self.repo_name(f.repository_id.as_deref()),
            path: f.path.clone(),
            branch: f.branch.clone(),
            ..Entry::new(rule, "task_environments", &e.id, msg)
        }
    }

    /// The surviving environment's flat fields own `(repository_id, '')` unless a canonical row does.
    fn flat(&mut self) {
        let src = self.src;
        for e in &src.environments {
            let Some(f) = &e.flat else { continue };
            let Some(survivor) = self.out.env_alias.get(&e.id).cloned() else {
                let h = self.flat_entry(
                    "environment_without_task",
                    e,
                    f,
                    "its task does not exist; nothing can own it",
                );
                self.history(h);
                continue;
            };
            let live = self.live_ids();
            if live.contains_key(&f.worktree_id) {
                // The same physical worktree as a higher source: its metadata is authoritative.
                continue;
            }
            if survivor != e.id {
                let h = self.flat_entry(
                    "collapsed_environment_flat",
                    e,
                    f,
                    "the flat worktree of an environment that collapsed into its task's newest one",
                );
                self.history(h);
                continue;
            }
            if self.deleted_ids.contains(&f.worktree_id) {
                let h = self.flat_entry(
                    "absorbed_into_deleted_row",
                    e,
                    f,
                    "the same physical worktree's inventory row is deleted; a flat copy is not an active owner",
                );
                self.history(h);
                continue;
            }
            let Some(repository_id) = f.repository_id.clone() else {
                let r = self.flat_entry(
                    "flat_without_repository",
                    e,
                    f,
                    "flat worktree fields name no repository, so the worktree has no slot",
                );
                self.refuse(r);
                continue;
            };
            let slot = (e.id.clone(), repository_id.clone(), String::new());
            if self.slot_taken(&slot) {
                let h = self.flat_entry(
                    "flat_superseded_by_inventory",
                    e,
                    f,
                    "a canonical inventory row owns this slot with another worktree",
                );
                self.history(h);
                continue;
            }
            self.out.targets.push(Target {
                env_key: e.id.clone(),
                repository_id,
                branch_slug: String::new(),
                worktree_id: Some(f.worktree_id.clone()),
                path: f.path.clone(),
                branch: f.branch.clone(),
                position: 0,
                error_message: None,
                state: TargetState::Active,
                source: SourceKind::Flat,
                source_id: e.id.clone(),
                created_at: e.created_at,
                updated_at: e.updated_at,
            });
        }
    }

    /// Every session's environment: the one it names (re-homed to that task's survivor, possibly another
    /// task's: borrowing), else its task's, else one the import creates for its task.
    fn sessions(&mut self) {
        let src = self.src;
        for s in &src.sessions {
            if !self.tasks.contains(s.task_id.as_str()) {
                continue;
            }
            let env = s
                .env_id
                .as_ref()
                .and_then(|e| self.out.env_alias.get(e).cloned())
                .or_else(|| self.survivor.get(&s.task_id).cloned())
                .unwrap_or_else(|| {
                    let key = created_env_key(&s.task_id);
                    self.out.env_task.insert(key.clone(), s.task_id.clone());
                    key
                });
            self.out.session_env.insert(s.id.clone(), env);
        }
    }

    fn sw_entry(&self, rule: &'static str, r: &SessionWorktree, msg: &str) -> Entry {
        let session = self.src.sessions.iter().find(|s| s.id == r.session_id);
        Entry {
            task_id: session.map(|s| s.task_id.clone()),
            session_id: Some(r.session_id.clone()),
            environment_id: self.out.session_env.get(&r.session_id).cloned(),
            worktree_id: r.worktree_id.clone(),
            repository_id: r.repository_id.clone(),
            repository: self.repo_name(r.repository_id.as_deref()),
            path: r.path.clone(),
            branch: r.branch.clone(),
            ..Entry::new(rule, "task_session_worktrees", &r.id, msg)
        }
    }

    fn session_worktrees(&mut self) {
        let src = self.src;
        let sessions: HashMap<&str, &Session> = src.sessions.iter().map(|s| (s.id.as_str(), s)).collect();
        // Candidates for election, per physical id: (row, environment key, repository, live session).
        let mut candidates: BTreeMap<String, Vec<(&SessionWorktree, String, String, bool)>> = BTreeMap::new();
        for r in &src.session_worktrees {
            let live = self.live_ids();
            let session = sessions.get(r.session_id.as_str());
            let Some(w) = r.worktree_id.clone() else {
                let h = self.sw_entry(
                    "no_worktree_identity",
                    r,
                    "a row without a physical worktree id owns nothing",
                );
                self.history(h);
                continue;
            };
            if session.is_none() {
                if r.deleted {
                    let h = self.sw_entry("orphan_deleted", r, "its session is gone and the row is deleted");
                    self.history(h);
                } else if live.contains_key(&w) {
                    let h = self.sw_entry(
                        "orphan_represented",
                        r,
                        "its session is gone; the same worktree's task-owned row is authoritative",
                    );
                    self.history(h);
                } else {
                    let e = self.sw_entry(
                        "orphan_without_owner",
                        r,
                        "an active row whose session is gone, and no task-owned row carries its worktree: its task and environment cannot be recovered",
                    );
                    self.refuse(e);
                }
                continue;
            }
            if r.deleted {
                let h = self.sw_entry("session_worktree_deleted", r, "a deleted session worktree is history");
                self.history(h);
                continue;
            }
            let session = session.expect("checked above");
            let Some(env) = self.out.session_env.get(&session.id).cloned() else {
                let e = self.sw_entry(
                    "no_resolvable_environment",
                    r,
                    "its session's task does not exist, so the worktree has no environment",
                );
                self.refuse(e);
                continue;
            };
            if live.contains_key(&w) {
                // A repeat of a higher-precedence owner's worktree, possibly with stale metadata: no second owner.
                continue;
            }
            if self.deleted_ids.contains(&w) {
                let h = self.sw_entry(
                    "absorbed_into_deleted_row",
                    r,
                    "the same physical worktree's inventory row is deleted",
                );
                self.history(h);
                continue;
            }
            let repository = r.repository_id.clone().or_else(|| {
                src.session_worktrees
                    .iter()
                    .filter(|o| o.worktree_id.as_deref() == Some(w.as_str()))
                    .find_map(|o| o.repository_id.clone())
            });
            let Some(repository) = repository else {
                let e = self.sw_entry(
                    "repository_unresolvable",
                    r,
                    "no row names the repository of this worktree",
                );
                self.refuse(e);
                continue;
            };
            let slot = (env.clone(), repository.clone(), r.branch_slug.clone());
            if self.slot_taken(&slot) {
                let h = self.sw_entry(
                    "slot_owned_by_task_source",
                    r,
                    "a task-owned row owns this repository and branch slot with another worktree",
                );
                self.history(h);
                continue;
            }
            candidates
                .entry(w)
                .or_default()
                .push((r, env, repository, !session.is_terminal()));
        }
        self.elect(candidates);
    }

    /// No higher owner: rows repeating one physical id must agree; then one worktree per slot, a live
    /// session's first, then the newest (`updated_at`, `created_at`, the greater id).
    fn elect(&mut self, candidates: BTreeMap<String, Vec<(&SessionWorktree, String, String, bool)>>) {
        let src = self.src;
        let mut by_slot: BTreeMap<Slot, Vec<Target>> = BTreeMap::new();
        let mut live_by_id: HashMap<String, bool> = HashMap::new();
        for (w, rows) in candidates {
            let slots: HashSet<Slot> = rows
                .iter()
                .map(|(r, env, repo, _)| (env.clone(), repo.clone(), r.branch_slug.clone()))
                .collect();
            let paths: HashSet<&str> = rows.iter().filter_map(|(r, ..)| r.path.as_deref()).collect();
            let branches: HashSet<&str> = rows.iter().filter_map(|(r, ..)| r.branch.as_deref()).collect();
            let conflict = if slots.len() > 1 {
                Some((
                    "worktree_on_two_slots",
                    "one physical worktree is registered for two slots and no task-owned row decides",
                ))
            } else if paths.len() > 1 || branches.len() > 1 {
                Some((
                    "incompatible_metadata",
                    "one physical worktree recorded with different paths or branches and no task-owned row decides",
                ))
            } else {
                None
            };
            if let Some((rule, msg)) = conflict {
                for (r, ..) in &rows {
                    let e = self.sw_entry(rule, r, msg);
                    self.refuse(e);
                }
                continue;
            }
            let newest = rows
                .iter()
                .max_by(|a, b| {
                    (a.0.updated_at, a.0.created_at, &a.0.id).cmp(&(b.0.updated_at, b.0.created_at, &b.0.id))
                })
                .expect("a candidate has rows");
            let (r, env, repo, _) = newest;
            live_by_id.insert(w.clone(), rows.iter().any(|(.., live)| *live));
            by_slot
                .entry((env.clone(), repo.clone(), r.branch_slug.clone()))
                .or_default()
                .push(Target {
                    env_key: env.clone(),
                    repository_id: repo.clone(),
                    branch_slug: r.branch_slug.clone(),
                    worktree_id: Some(w.clone()),
                    path: rows.iter().find_map(|(r, ..)| r.path.clone()),
                    branch: rows.iter().find_map(|(r, ..)| r.branch.clone()),
                    position: rows.iter().map(|(r, ..)| r.position).min().unwrap_or(0),
                    error_message: None,
                    state: TargetState::Active,
                    source: SourceKind::Session,
                    source_id: r.id.clone(),
                    created_at: rows.iter().map(|(r, ..)| r.created_at).max().unwrap_or(r.created_at),
                    updated_at: r.updated_at,
                });
        }
        for (_, mut contenders) in by_slot {
            let key = |t: &Target| {
                (
                    live_by_id[t.worktree_id.as_deref().unwrap_or("")],
                    t.updated_at,
                    t.created_at,
                    t.worktree_id.clone(),
                )
            };
            contenders.sort_by_key(|t| std::cmp::Reverse(key(t)));
            let mut it = contenders.into_iter();
            let winner = it.next().expect("a slot has a contender");
            for lost in it {
                let w = lost.worktree_id.clone().unwrap_or_default();
                for r in src
                    .session_worktrees
                    .iter()
                    .filter(|r| r.worktree_id.as_deref() == Some(w.as_str()) && !r.deleted)
                {
                    let e = self.sw_entry(
                        "slot_election_loser",
                        r,
                        "several worktrees for one slot: a live session's, then the newest, keeps it; this one stays on disk as history",
                    );
                    self.history(e);
                }
            }
            self.out.targets.push(winner);
        }
    }
}
