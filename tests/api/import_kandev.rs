//! `berth import kandev` applies seed 001's ownership cutover to kandev databases of both generations
//! (scenarios 8-22 of seed 001, a normalized and a mixed file), fails closed, is idempotent, and adopts
//! worktrees that admission then proves at the first launch. Each test's kandev database is on the
//! backend its berth runs on, so the PostgreSQL half imports the same fixture from a PostgreSQL kandev;
//! the cleanup kandev still owed is carried over (`carry`).
mod fixture;

use std::path::Path;

use berth::entity::{task, task_environment as env, task_environment_repo as env_repo, task_session as session};
use sea_orm::{ColumnTrait, EntityTrait, QueryFilter};
use serde_json::{Value, json};
use uuid::Uuid;

use crate::both_backends;
use crate::helpers::{TestApp, worktrees_of};
use fixture::*;

both_backends!(
    s08_deleted_history_beside_a_canonical_row,
    s09_canonical_path_beats_a_drifted_flat_path,
    s10_canonical_worktree_beats_a_different_flat_worktree,
    s11_a_rehomed_canonical_row_beats_the_survivors_flat_worktree,
    s12_a_resumable_session_keeps_its_state_and_canonical_metadata_wins,
    s13_flat_metadata_beats_a_stale_session_reference,
    s14_a_terminal_sessions_older_worktree_is_history,
    s15_an_orphan_repeating_a_task_owned_worktree_is_history,
    s16_a_deleted_orphan_is_history,
    s17_an_active_orphan_without_owner_refuses,
    s18_an_active_orphan_beside_only_a_deleted_target_refuses,
    s19_a_hybrid_file_keeps_normalized_rows_and_imports_session_worktrees,
    s20_a_borrowing_task_gains_no_environment,
    s21_several_worktrees_for_one_slot_elect_one_owner,
    s22_contradicting_metadata_without_owner_refuses,
    a_normalized_file_imports_sessions_transcripts_and_git_status,
    a_mixed_file_imports_everything_once,
    every_failure_point_leaves_berth_unchanged,
    an_imported_session_launches_in_the_adopted_worktree,
    an_imported_task_is_archived_deleted_and_reset_like_a_native_one,
    a_write_locked_kandev_database_is_refused,
    a_dry_run_changes_nothing,
    kandev_pending_cleanup_becomes_berth_cleanup_jobs,
    the_worker_does_the_cleanup_kandev_owed,
);

// ---- helpers ----

fn rules(report: &Value, list: &str) -> Vec<(String, String)> {
    report[list]
        .as_array()
        .unwrap_or_else(|| panic!("no {list} in {report}"))
        .iter()
        .map(|e| {
            (
                e["rule"].as_str().unwrap().to_string(),
                e["id"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

/// The entry of `list` with this rule and kandev id.
#[track_caller]
pub(crate) fn has(report: &Value, list: &str, rule: &str, id: &str) -> Value {
    let r = rules(report, list);
    let at = r
        .iter()
        .position(|(ru, i)| ru == rule && i == id)
        .unwrap_or_else(|| panic!("{list} has no {rule} for {id}: {report}"));
    report[list][at].clone()
}

#[track_caller]
pub(crate) fn succeeded(run: &Run) {
    assert_eq!(run.code, 0, "{}\n{}", run.report, run.stderr);
    assert_eq!(run.report["refused"], json!([]), "{}", run.report);
}

pub(crate) async fn inventory(app: &TestApp) -> Vec<env_repo::Model> {
    env_repo::Entity::find()
        .filter(env_repo::Column::ImportedFrom.is_not_null())
        .all(app.db())
        .await
        .unwrap()
}

pub(crate) async fn env_of(app: &TestApp, kandev: &str) -> Option<env::Model> {
    env::Entity::find()
        .filter(env::Column::ImportedFrom.eq(kandev))
        .one(app.db())
        .await
        .unwrap()
}

pub(crate) async fn task_of(app: &TestApp, kandev: &str) -> task::Model {
    task::Entity::find()
        .filter(task::Column::ImportedFrom.eq(kandev))
        .one(app.db())
        .await
        .unwrap()
        .unwrap_or_else(|| panic!("task {kandev} was not imported"))
}

pub(crate) async fn session_of(app: &TestApp, kandev: &str) -> session::Model {
    session::Entity::find()
        .filter(session::Column::ImportedFrom.eq(kandev))
        .one(app.db())
        .await
        .unwrap()
        .unwrap_or_else(|| panic!("session {kandev} was not imported"))
}

/// The one active inventory row of a slot, with its kandev worktree id.
#[track_caller]
pub(crate) fn only_owner(rows: &[env_repo::Model], env: Uuid) -> &env_repo::Model {
    let active: Vec<&env_repo::Model> = rows
        .iter()
        .filter(|r| r.task_environment_id == env && r.status == env_repo::EnvironmentRepoStatus::Active)
        .collect();
    assert_eq!(active.len(), 1, "exactly one owner: {active:?}");
    active[0]
}

pub(crate) fn p(path: &Path) -> Option<String> {
    Some(path.display().to_string())
}

/// kandev's database of this generation with the world's repository as `r1` (`proj`) and a task `t1`.
pub(crate) async fn kandev_with_task(w: &World, generation: Gen) -> Kandev {
    let mut k = w.kandev(generation).await;
    k.repo("r1", "proj", &w.repo).await;
    k.task("t1", "First").await;
    k
}

/// Imports kandev's database into the workspace `ws` and asserts that it succeeded.
pub(crate) async fn imported(app: &TestApp, k: Kandev) -> Run {
    let db = k.finish().await;
    let run = import(app, &db, "ws", &[], &[]).await;
    succeeded(&run);
    run
}

/// Imports and asserts that it was refused with `rule` naming `id`, and that berth did not change.
pub(crate) async fn refused(app: &TestApp, db: &KandevDb, rule: &str, id: &str) -> Run {
    // Into an existing workspace with rows of its own, so "unchanged" has something to compare.
    let ws = app.workspace("ws").await;
    app.repository(ws, "already-here").await;
    let before = dump(app).await;
    let run = import(app, db, "ws", &[], &[]).await;
    assert_eq!(run.code, 1, "{}\n{}", run.report, run.stderr);
    has(&run.report, "refused", rule, id);
    assert_eq!(run.report["imported"]["tasks"], 0);
    assert_unchanged(&before, &dump(app).await);
    run
}

// ---- seed 001, scenarios 8-22 ----

// 8: deleted session-worktree history and a canonical row for the same workspace: the cutover completes
// and keeps the canonical row.
async fn s08_deleted_history_beside_a_canonical_row(app: TestApp) {
    let w = World::new(&app);
    let wt = w.worktree("t1", "feature/a");
    let old = w.worktree("t1-old", "feature/old");
    let mut k = kandev_with_task(&w, Gen::Preview).await;
    k.env("e1", "t1", T2, None).await;
    k.env_repo("er1", "e1", "r1", "", "wt-1", &wt, "feature/a", "active")
        .await;
    k.session("s1", "t1", "COMPLETED", "e1", T2).await;
    k.session_worktree("sw1", "s1", "wt-old", "r1", "", &old, "feature/old", "deleted", T2)
        .await;
    let run = imported(&app, k).await;
    has(&run.report, "history", "session_worktree_deleted", "sw1");
    let e = env_of(&app, "e1").await.expect("the environment is imported");
    let rows = inventory(&app).await;
    let owner = only_owner(&rows, e.id.into());
    assert_eq!(owner.imported_from.as_deref(), Some("wt-1"));
    assert_eq!(owner.worktree_path, p(&wt));
    assert_eq!(rows.len(), 1, "the deleted row is no owner: {rows:?}");
    assert_eq!(run.report["imported"]["worktrees"], 1);
    assert!(old.is_dir(), "nothing on disk is touched");
}

// 9: the flat path differs from the canonical row for the same physical worktree: canonical path and
// branch are kept.
async fn s09_canonical_path_beats_a_drifted_flat_path(app: TestApp) {
    let w = World::new(&app);
    let wt = w.worktree("t1", "feature/a");
    let mut k = kandev_with_task(&w, Gen::Legacy).await;
    let stale = w.home.join("tasks/old-place/proj");
    k.env("e1", "t1", T2, Some(("r1", "wt-1", &stale, "feature/stale")))
        .await;
    k.env_repo("er1", "e1", "r1", "", "wt-1", &wt, "feature/a", "active")
        .await;
    imported(&app, k).await;
    let e = env_of(&app, "e1").await.unwrap();
    let rows = inventory(&app).await;
    let owner = only_owner(&rows, e.id.into());
    assert_eq!(owner.worktree_path, p(&wt));
    assert_eq!(owner.worktree_branch.as_deref(), Some("feature/a"));
    assert_eq!(e.workspace_path, p(&wt), "one repository works in its worktree");
}

// 10: a canonical row and flat fields hold different worktree ids for the same empty slot: the canonical
// row owns it, the flat worktree is history (and stays on disk).
async fn s10_canonical_worktree_beats_a_different_flat_worktree(app: TestApp) {
    let w = World::new(&app);
    let wt = w.worktree("t1", "feature/a");
    let flat = w.worktree("t1-flat", "feature/flat");
    let mut k = kandev_with_task(&w, Gen::Legacy).await;
    k.env("e1", "t1", T2, Some(("r1", "wt-flat", &flat, "feature/flat")))
        .await;
    k.env_repo("er1", "e1", "r1", "", "wt-1", &wt, "feature/a", "active")
        .await;
    let run = imported(&app, k).await;
    let h = has(&run.report, "history", "flat_superseded_by_inventory", "e1");
    assert_eq!(
        (h["worktree_id"].as_str(), h["path"].as_str()),
        (Some("wt-flat"), flat.to_str())
    );
    let rows = inventory(&app).await;
    let owner = only_owner(&rows, (env_of(&app, "e1").await.unwrap().id).into());
    assert_eq!(owner.imported_from.as_deref(), Some("wt-1"));
    assert!(flat.is_dir() && worktrees_of(&w.repo).contains(&flat.display().to_string()));
}

// 11: a surviving flat environment and a canonical row only in an older environment of the same task
// that collapses into it: the re-homed canonical row owns the slot; the flat worktree is history.
async fn s11_a_rehomed_canonical_row_beats_the_survivors_flat_worktree(app: TestApp) {
    let w = World::new(&app);
    let wt = w.worktree("t1", "feature/a");
    let flat = w.worktree("t1-new", "feature/new");
    let mut k = kandev_with_task(&w, Gen::Legacy).await;
    k.env("e-old", "t1", T1, None).await;
    k.env("e-new", "t1", T3, Some(("r1", "wt-new", &flat, "feature/new")))
        .await;
    k.env_repo("er1", "e-old", "r1", "", "wt-1", &wt, "feature/a", "active")
        .await;
    k.session("s1", "t1", "IDLE", "e-old", T2).await;
    let run = imported(&app, k).await;
    has(&run.report, "history", "flat_superseded_by_inventory", "e-new");
    assert!(
        env_of(&app, "e-old").await.is_none(),
        "the collapsed environment is not imported"
    );
    let e = env_of(&app, "e-new").await.unwrap();
    let rows = inventory(&app).await;
    assert_eq!(only_owner(&rows, e.id.into()).imported_from.as_deref(), Some("wt-1"));
    assert_eq!(
        session_of(&app, "s1").await.task_environment_id,
        Some(e.id),
        "its session moves along"
    );
}

// 12: a resumable legacy session and a canonical row with the same worktree id but other metadata: the
// canonical metadata is kept and the session keeps its (resumable) lifecycle.
async fn s12_a_resumable_session_keeps_its_state_and_canonical_metadata_wins(app: TestApp) {
    let w = World::new(&app);
    let wt = w.worktree("t1", "feature/a");
    let mut k = kandev_with_task(&w, Gen::Legacy).await;
    k.env("e1", "t1", T2, None).await;
    k.env_repo("er1", "e1", "r1", "", "wt-1", &wt, "feature/a", "active")
        .await;
    k.session("s1", "t1", "WAITING_FOR_INPUT", "e1", T3).await;
    let stale = w.home.join("elsewhere/proj");
    k.session_worktree("sw1", "s1", "wt-1", "r1", "", &stale, "feature/stale", "active", T4)
        .await;
    imported(&app, k).await;
    let e = env_of(&app, "e1").await.unwrap();
    let rows = inventory(&app).await;
    let owner = only_owner(&rows, e.id.into());
    assert_eq!(
        (owner.worktree_path.clone(), owner.worktree_branch.as_deref()),
        (p(&wt), Some("feature/a"))
    );
    let s = session_of(&app, "s1").await;
    // Nothing runs after an import: a live kandev session is a resumable, stopped berth session.
    assert_eq!(s.state, session::SessionState::Stopped);
    assert_eq!(s.task_environment_id, Some(e.id));
}

// 13: no canonical row; a session repeats the flat worktree id with stale metadata: the flat metadata
// is kept.
async fn s13_flat_metadata_beats_a_stale_session_reference(app: TestApp) {
    let w = World::new(&app);
    let wt = w.worktree("t1", "feature/a");
    let mut k = kandev_with_task(&w, Gen::Legacy).await;
    k.env("e1", "t1", T2, Some(("r1", "wt-1", &wt, "feature/a"))).await;
    k.session("s1", "t1", "RUNNING", "e1", T3).await;
    let stale = w.home.join("elsewhere/proj");
    k.session_worktree("sw1", "s1", "wt-1", "r1", "", &stale, "feature/stale", "active", T4)
        .await;
    imported(&app, k).await;
    let rows = inventory(&app).await;
    let owner = only_owner(&rows, (env_of(&app, "e1").await.unwrap().id).into());
    assert_eq!(
        (owner.worktree_path.clone(), owner.worktree_branch.as_deref()),
        (p(&wt), Some("feature/a"))
    );
    assert_eq!(rows.len(), 1);
}

// 14: a terminal session references an older worktree for the flat environment's slot: the flat
// environment stays the owner.
async fn s14_a_terminal_sessions_older_worktree_is_history(app: TestApp) {
    let w = World::new(&app);
    let wt = w.worktree("t1", "feature/a");
    let old = w.worktree("t1-old", "feature/old");
    let mut k = kandev_with_task(&w, Gen::Legacy).await;
    k.env("e1", "t1", T2, Some(("r1", "wt-1", &wt, "feature/a"))).await;
    k.session("s1", "t1", "COMPLETED", "e1", T3).await;
    k.session_worktree("sw-old", "s1", "wt-old", "r1", "", &old, "feature/old", "active", T4)
        .await;
    let run = imported(&app, k).await;
    has(&run.report, "history", "slot_owned_by_task_source", "sw-old");
    let rows = inventory(&app).await;
    assert_eq!(
        only_owner(&rows, (env_of(&app, "e1").await.unwrap().id).into())
            .imported_from
            .as_deref(),
        Some("wt-1")
    );
    assert!(old.is_dir());
}

// 15: an orphaned session-worktree row (its session is gone) repeats a worktree a surviving flat
// environment carries: the task-owned source is authoritative and the orphan contributes nothing.
async fn s15_an_orphan_repeating_a_task_owned_worktree_is_history(app: TestApp) {
    let w = World::new(&app);
    let wt = w.worktree("t1", "feature/a");
    let mut k = kandev_with_task(&w, Gen::Legacy).await;
    k.env("e1", "t1", T2, Some(("r1", "wt-1", &wt, "feature/a"))).await;
    let stale = w.home.join("elsewhere/proj");
    k.session_worktree(
        "sw-orphan",
        "gone",
        "wt-1",
        "r1",
        "",
        &stale,
        "feature/stale",
        "active",
        T4,
    )
    .await;
    let run = imported(&app, k).await;
    has(&run.report, "history", "orphan_represented", "sw-orphan");
    let rows = inventory(&app).await;
    assert_eq!(
        only_owner(&rows, (env_of(&app, "e1").await.unwrap().id).into()).worktree_path,
        p(&wt)
    );
}

// 16: a deleted session-worktree row of a missing session is history and does not block.
async fn s16_a_deleted_orphan_is_history(app: TestApp) {
    let w = World::new(&app);
    let wt = w.worktree("t1", "feature/a");
    let mut k = kandev_with_task(&w, Gen::Legacy).await;
    k.env("e1", "t1", T2, Some(("r1", "wt-1", &wt, "feature/a"))).await;
    let gone = w.home.join("tasks/gone/proj");
    k.session_worktree(
        "sw-orphan",
        "gone",
        "wt-gone",
        "r1",
        "",
        &gone,
        "feature/gone",
        "deleted",
        T4,
    )
    .await;
    let run = imported(&app, k).await;
    has(&run.report, "history", "orphan_deleted", "sw-orphan");
    assert_eq!(inventory(&app).await.len(), 1);
}

// 17: an active orphan whose worktree no higher source carries: the import fails closed, naming it.
async fn s17_an_active_orphan_without_owner_refuses(app: TestApp) {
    let w = World::new(&app);
    let wt = w.worktree("t1", "feature/a");
    let lost = w.worktree("lost", "feature/lost");
    let mut k = kandev_with_task(&w, Gen::Legacy).await;
    k.env("e1", "t1", T2, Some(("r1", "wt-1", &wt, "feature/a"))).await;
    k.session_worktree(
        "sw-orphan",
        "gone",
        "wt-lost",
        "r1",
        "",
        &lost,
        "feature/lost",
        "active",
        T4,
    )
    .await;
    let db = k.finish().await;
    let run = refused(&app, &db, "orphan_without_owner", "sw-orphan").await;
    let e = &run.report["refused"][0];
    assert_eq!(e["worktree_id"], "wt-lost");
    assert_eq!(e["repository"], "proj");
    assert_eq!(e["path"], lost.display().to_string());
    assert_eq!(e["branch"], "feature/lost");
    assert!(lost.is_dir());
}

// 18: a surviving flat row, a deleted canonical row and an active orphan share one worktree id; merging
// leaves only a deleted target: fail closed rather than drop the only active evidence.
async fn s18_an_active_orphan_beside_only_a_deleted_target_refuses(app: TestApp) {
    let w = World::new(&app);
    let wt = w.worktree("t1", "feature/a");
    let mut k = kandev_with_task(&w, Gen::Preview).await;
    k.env("e1", "t1", T2, Some(("r1", "wt-1", &wt, "feature/a"))).await;
    k.env_repo("er1", "e1", "r1", "", "wt-1", &wt, "feature/a", "deleted")
        .await;
    k.session_worktree("sw-orphan", "gone", "wt-1", "r1", "", &wt, "feature/a", "active", T4)
        .await;
    let db = k.finish().await;
    refused(&app, &db, "orphan_without_owner", "sw-orphan").await;
}

// 19: normalized environments and a stale session-worktree table from an intermediate build: the
// normalized rows are kept and the remaining session-worktree inventory is imported.
async fn s19_a_hybrid_file_keeps_normalized_rows_and_imports_session_worktrees(app: TestApp) {
    let w = World::new(&app);
    let lib = w.second_repo("lib");
    let wt = w.worktree("t1", "feature/a");
    let wt_lib = w.worktree_of(&lib, "t1", "feature/a");
    let mut k = w.kandev(Gen::Hybrid).await;
    k.repo("r1", "proj", &w.repo).await;
    k.repo("r2", "lib", &lib).await;
    k.task("t1", "First").await;
    k.env("e1", "t1", T2, None).await;
    k.env_repo("er1", "e1", "r1", "", "wt-1", &wt, "feature/a", "active")
        .await;
    k.session("s1", "t1", "IDLE", "e1", T3).await;
    k.session_worktree("sw-lib", "s1", "wt-lib", "r2", "", &wt_lib, "feature/a", "active", T3)
        .await;
    let run = imported(&app, k).await;
    assert_eq!(run.report["generation"], "hybrid");
    let e = env_of(&app, "e1").await.unwrap();
    let mut rows: Vec<(String, Option<String>)> = inventory(&app)
        .await
        .into_iter()
        .map(|r| (r.imported_from.unwrap(), r.worktree_path))
        .collect();
    rows.sort();
    assert_eq!(rows, vec![("wt-1".into(), p(&wt)), ("wt-lib".into(), p(&wt_lib))]);
    assert_eq!(
        e.workspace_path,
        p(&w.home.join("tasks/t1")),
        "several repositories work in the task directory"
    );
}

// 20: a session of one task is bound to another task's environment and carries a session-worktree row for
// it: the worktree stays on the owner's environment, both sessions keep it, the borrower gets none.
async fn s20_a_borrowing_task_gains_no_environment(app: TestApp) {
    let w = World::new(&app);
    let wt = w.worktree("parent", "feature/a");
    let mut k = w.kandev(Gen::Legacy).await;
    k.repo("r1", "proj", &w.repo).await;
    k.task("ta", "Parent").await;
    k.task_with("tb", "Child", "ta", r#"{"workspace":{"mode":"inherit_parent"}}"#)
        .await;
    k.env("ea", "ta", T2, Some(("r1", "wt-1", &wt, "feature/a"))).await;
    k.session("sa", "ta", "COMPLETED", "ea", T2).await;
    k.session("sb", "tb", "IDLE", "ea", T3).await;
    k.session_worktree("sw-b", "sb", "wt-1", "r1", "", &wt, "feature/a", "active", T3)
        .await;
    let db = k.finish().await;
    let run = import(&app, &db, "ws", &[], &[]).await;
    succeeded(&run);
    let ea = env_of(&app, "ea").await.unwrap();
    let (ta, tb) = (task_of(&app, "ta").await, task_of(&app, "tb").await);
    assert_eq!(ea.task_id, ta.id);
    let borrower_envs = env::Entity::find()
        .filter(env::Column::TaskId.eq(tb.id))
        .all(app.db())
        .await
        .unwrap();
    assert!(borrower_envs.is_empty(), "the borrowing task gains no environment");
    assert_eq!(tb.parent_task_id, Some(ta.id));
    assert_eq!(tb.workspace_mode, task::WorkspaceMode::InheritParent);
    for s in ["sa", "sb"] {
        assert_eq!(session_of(&app, s).await.task_environment_id, Some(ea.id), "{s}");
    }
    assert_eq!(inventory(&app).await.len(), 1, "one owner for the shared worktree");
    assert_eq!(run.report["imported"]["environments"], 1);
}

// 21: several sessions of one task registered different worktrees for one slot and nothing task-owned
// decides: the newest live session's worktree keeps it; the others are history, still on disk.
async fn s21_several_worktrees_for_one_slot_elect_one_owner(app: TestApp) {
    let w = World::new(&app);
    let (a, b, c) = (
        w.worktree("a", "feature/a"),
        w.worktree("b", "feature/b"),
        w.worktree("c", "feature/c"),
    );
    let mut k = kandev_with_task(&w, Gen::Legacy).await;
    k.session("s-done", "t1", "COMPLETED", "", T4).await;
    k.session("s-live-old", "t1", "RUNNING", "", T2).await;
    k.session("s-live-new", "t1", "IDLE", "", T3).await;
    k.session_worktree("sw-a", "s-done", "wt-a", "r1", "", &a, "feature/a", "active", T4)
        .await;
    k.session_worktree("sw-b", "s-live-old", "wt-b", "r1", "", &b, "feature/b", "active", T2)
        .await;
    k.session_worktree("sw-c", "s-live-new", "wt-c", "r1", "", &c, "feature/c", "active", T3)
        .await;
    let run = imported(&app, k).await;
    has(&run.report, "history", "slot_election_loser", "sw-a");
    has(&run.report, "history", "slot_election_loser", "sw-b");
    let e = env_of(&app, "task:t1")
        .await
        .expect("a task with sessions and no environment gets one");
    assert_eq!(e.executor_type, env::ExecutorType::Worktree);
    let rows = inventory(&app).await;
    assert_eq!(only_owner(&rows, e.id.into()).imported_from.as_deref(), Some("wt-c"));
    assert_eq!(rows.len(), 1);
    for s in ["s-done", "s-live-old", "s-live-new"] {
        assert_eq!(session_of(&app, s).await.task_environment_id, Some(e.id));
    }
    assert!(a.is_dir() && b.is_dir(), "no directory is removed");
}

// 22: two live sessions record one worktree with contradicting paths and no owner decides: fail closed.
async fn s22_contradicting_metadata_without_owner_refuses(app: TestApp) {
    let w = World::new(&app);
    let a = w.worktree("a", "feature/a");
    let mut k = kandev_with_task(&w, Gen::Legacy).await;
    k.session("s1", "t1", "RUNNING", "", T2).await;
    k.session("s2", "t1", "IDLE", "", T3).await;
    k.session_worktree("sw1", "s1", "wt-a", "r1", "", &a, "feature/a", "active", T2)
        .await;
    let other = w.home.join("tasks/other/proj");
    k.session_worktree("sw2", "s2", "wt-a", "r1", "", &other, "feature/a", "active", T3)
        .await;
    let db = k.finish().await;
    let run = refused(&app, &db, "incompatible_metadata", "sw1").await;
    has(&run.report, "refused", "incompatible_metadata", "sw2");
}

mod carry;
mod more;
use carry::*;
use more::*;
