//! The normalization rules as pure functions: kandev rows in, a plan out (no database, no disk).
use chrono::{TimeZone, Utc};

use super::mapping::plan;
use super::model::*;

fn at(day: u32) -> Ts {
    Utc.with_ymd_and_hms(2026, 8, day, 10, 0, 0).unwrap()
}

fn source() -> Source {
    Source {
        repositories: vec![Repository {
            id: "r1".into(),
            name: "proj".into(),
            local_path: Some("/src/proj".into()),
            default_branch: None,
            deleted_at: None,
            created_at: at(1),
            updated_at: at(1),
        }],
        tasks: vec![task("t1", None)],
        ..Default::default()
    }
}

fn task(id: &str, parent: Option<&str>) -> Task {
    Task {
        id: id.into(),
        title: id.into(),
        description: None,
        parent_id: parent.map(str::to_string),
        ephemeral: false,
        archived_at: None,
        workspace_mode: parent.map(|_| "inherit_parent".into()),
        created_at: at(1),
        updated_at: at(1),
    }
}

fn env(id: &str, task: &str, updated: u32, flat: Option<&str>) -> Environment {
    Environment {
        id: id.into(),
        task_id: task.into(),
        executor_type: Some("worktree".into()),
        status: Some("ready".into()),
        workspace_path: None,
        flat: flat.map(|w| FlatWorktree {
            repository_id: Some("r1".into()),
            worktree_id: w.into(),
            path: Some(format!("/wt/{w}")),
            branch: Some(format!("b-{w}")),
        }),
        created_at: at(1),
        updated_at: at(updated),
    }
}

fn canonical(id: &str, env: &str, w: &str, deleted: bool) -> EnvRepo {
    EnvRepo {
        id: id.into(),
        env_id: env.into(),
        repository_id: "r1".into(),
        branch_slug: String::new(),
        worktree_id: Some(w.into()),
        path: Some(format!("/wt/{w}")),
        branch: Some(format!("b-{w}")),
        position: 0,
        error_message: None,
        deleted,
        merged: false,
        created_at: at(1),
        updated_at: at(2),
    }
}

fn session(id: &str, task: &str, state: &str, env: Option<&str>, updated: u32) -> Session {
    Session {
        id: id.into(),
        task_id: task.into(),
        state: state.into(),
        env_id: env.map(str::to_string),
        executor_id: None,
        name: None,
        is_primary: false,
        started_at: at(1),
        updated_at: at(updated),
        completed_at: None,
    }
}

fn sw(id: &str, session: &str, w: &str, path: &str, updated: u32) -> SessionWorktree {
    SessionWorktree {
        id: id.into(),
        session_id: session.into(),
        worktree_id: Some(w.into()),
        repository_id: Some("r1".into()),
        branch_slug: String::new(),
        position: 0,
        path: Some(path.into()),
        branch: Some(format!("b-{w}")),
        deleted: false,
        created_at: at(1),
        updated_at: at(updated),
    }
}

fn owners(p: &super::plan::Plan) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = p
        .environments
        .iter()
        .flat_map(|e| e.rows.iter().map(move |r| (e.key.clone(), r.key.clone())))
        .collect();
    out.sort();
    out
}

#[test]
fn the_newest_environment_survives_and_receives_the_older_ones_canonical_rows() {
    let mut s = source();
    s.environments = vec![env("old", "t1", 2, None), env("new", "t1", 5, None)];
    s.env_repos = vec![canonical("er", "old", "w1", false)];
    s.sessions = vec![session("s", "t1", "IDLE", Some("old"), 3)];
    let p = plan(&s);
    assert!(p.refused.is_empty(), "{:?}", p.refused);
    assert_eq!(owners(&p), vec![("new".into(), "w1".into())]);
    assert_eq!(p.sessions[0].env_key, "new");
}

#[test]
fn a_live_session_beats_a_newer_terminal_one_then_the_newest_wins() {
    let mut s = source();
    s.sessions = vec![
        session("done", "t1", "COMPLETED", None, 9),
        session("old", "t1", "RUNNING", None, 2),
        session("new", "t1", "IDLE", None, 3),
    ];
    s.session_worktrees = vec![
        sw("a", "done", "wa", "/wt/a", 9),
        sw("b", "old", "wb", "/wt/b", 2),
        sw("c", "new", "wc", "/wt/c", 3),
    ];
    let p = plan(&s);
    assert_eq!(owners(&p), vec![("task:t1".into(), "wc".into())]);
    let lost: Vec<&str> = p
        .history
        .iter()
        .filter(|h| h.rule == "slot_election_loser")
        .map(|h| h.id.as_str())
        .collect();
    // Reported in election order: the older live one, then the terminal one.
    assert_eq!(lost, vec!["b", "a"]);
}

#[test]
fn equal_timestamps_fall_back_to_the_greater_worktree_id() {
    let mut s = source();
    s.sessions = vec![session("x", "t1", "IDLE", None, 3), session("y", "t1", "IDLE", None, 3)];
    s.session_worktrees = vec![sw("a", "x", "w-a", "/wt/a", 3), sw("b", "y", "w-b", "/wt/b", 3)];
    assert_eq!(owners(&plan(&s)), vec![("task:t1".into(), "w-b".into())]);
}

#[test]
fn one_worktree_with_two_paths_and_no_owner_is_refused_by_every_row() {
    let mut s = source();
    s.sessions = vec![
        session("x", "t1", "IDLE", None, 3),
        session("y", "t1", "RUNNING", None, 4),
    ];
    s.session_worktrees = vec![sw("a", "x", "w", "/wt/one", 3), sw("b", "y", "w", "/wt/two", 4)];
    let p = plan(&s);
    let refused: Vec<(&str, &str)> = p.refused.iter().map(|e| (e.rule, e.id.as_str())).collect();
    assert_eq!(
        refused,
        vec![("incompatible_metadata", "a"), ("incompatible_metadata", "b")]
    );
}

#[test]
fn the_same_worktree_under_a_flat_owner_is_no_conflict() {
    let mut s = source();
    s.environments = vec![env("e", "t1", 2, Some("w"))];
    s.sessions = vec![session("x", "t1", "IDLE", Some("e"), 3)];
    s.session_worktrees = vec![
        sw("a", "x", "w", "/stale/one", 3),
        sw("b", "gone", "w", "/stale/two", 4),
    ];
    let p = plan(&s);
    assert!(p.refused.is_empty(), "{:?}", p.refused);
    assert_eq!(p.environments[0].rows[0].worktree_path.as_deref(), Some("/wt/w"));
    assert!(p.history.iter().any(|h| h.rule == "orphan_represented" && h.id == "b"));
}

#[test]
fn a_deleted_canonical_row_leaves_an_active_orphan_unowned() {
    let mut s = source();
    s.environments = vec![env("e", "t1", 2, Some("w"))];
    s.env_repos = vec![canonical("er", "e", "w", true)];
    s.session_worktrees = vec![sw("a", "gone", "w", "/wt/w", 3)];
    let p = plan(&s);
    assert_eq!(p.refused.len(), 1);
    assert_eq!(
        (p.refused[0].rule, p.refused[0].id.as_str()),
        ("orphan_without_owner", "a")
    );
}

#[test]
fn a_borrower_gets_no_environment_and_every_task_one_primary() {
    let mut s = source();
    s.tasks.push(task("child", Some("t1")));
    s.environments = vec![env("e", "t1", 2, Some("w"))];
    s.sessions = vec![
        session("p1", "t1", "COMPLETED", Some("e"), 2),
        session("p2", "t1", "IDLE", Some("e"), 3),
        session("c1", "child", "IDLE", Some("e"), 4),
    ];
    let p = plan(&s);
    assert_eq!(p.environments.len(), 1);
    assert!(p.sessions.iter().all(|x| x.env_key == "e"));
    let primaries: Vec<&str> = p
        .sessions
        .iter()
        .filter(|x| x.is_primary)
        .map(|x| x.id.as_str())
        .collect();
    assert_eq!(primaries, vec!["p2", "c1"]);
    let child = p.tasks.iter().find(|t| t.id == "child").unwrap();
    assert_eq!(child.mode, crate::entity::task::WorkspaceMode::InheritParent);
    assert_eq!(
        child.slots.len(),
        1,
        "an inherit_parent subtask takes its parent's slots"
    );
}

#[test]
fn a_transcript_is_ordered_by_instant_not_by_text() {
    let mut s = source();
    s.sessions = vec![session("x", "t1", "IDLE", None, 3)];
    let msg = |id: &str, author: &str, kind: &str, day: u32| Message {
        id: id.into(),
        session_id: "x".into(),
        author_type: author.into(),
        kind: kind.into(),
        content: id.into(),
        created_at: at(day),
    };
    s.messages = vec![
        msg("m3", "agent", "message", 4),
        msg("m1", "user", "message", 2),
        msg("tool", "agent", "tool_call", 3),
        msg("m2", "agent", "content", 3),
    ];
    let ids: Vec<String> = plan(&s).messages.iter().map(|m| m.id.clone()).collect();
    assert_eq!(
        ids,
        vec!["m1", "m2", "m3"],
        "tool calls are the agent's notes, not the conversation"
    );
}

#[test]
fn the_text_report_names_each_refused_row_its_metadata_and_rule() {
    let mut s = source();
    s.session_worktrees = vec![sw("a", "gone", "w", "/wt/w", 3)];
    let p = plan(&s);
    let report = super::report::Report {
        refused: p.refused,
        ..Default::default()
    };
    let text = report.to_text();
    for want in [
        "refused: 1 row(s) cannot be reconciled",
        "[orphan_without_owner] task_session_worktrees a",
        "session=gone",
        "worktree=w",
        "repository=proj",
        "path=/wt/w",
        "branch=b-w",
    ] {
        assert!(text.contains(want), "{want:?} not in:\n{text}");
    }
}
