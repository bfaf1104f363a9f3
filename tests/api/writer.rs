//! I36, one writer at a time per environment (`domain::writer`): an agent's turn (a question it waits on
//! included), a restore, a commit, a merge that moves a checkout and a cleanup each hold the
//! environment's writer lease, and whoever finds it held is refused with a problem naming the holder,
//! or, a prompt, waits queued until it is free. Each race runs many times on both databases.
use std::path::{Path, PathBuf};
use std::time::Duration;

use sea_orm::{ActiveModelTrait, ActiveValue::Set, EntityTrait};
use serde_json::{Value, json};
use uuid::Uuid;

use crate::agents::wait_session;
use crate::both_backends;
use crate::helpers::{TestApp, git, id_of, seen_json, wait_job, wait_until};
use crate::landing::{Started, agent_writes, started};
use crate::turns::wait_turns;

both_backends!(
    a_question_keeps_the_turn_and_a_restore_waits_for_it,
    a_prompt_waits_queued_while_a_restore_holds_the_worktrees,
    a_lease_whose_instance_is_gone_is_taken_over,
    an_archive_waits_for_the_writer_and_then_nothing_writes,
    a_commit_never_stages_a_worktree_that_fails_proof,
    a_merge_never_moves_a_checkout_a_local_agent_works_in,
    a_turn_and_a_restore_never_overlap,
    a_restore_and_a_commit_never_overlap,
    no_checkpoint_ref_outlives_the_cleanup,
);

const WAIT: Duration = Duration::from_secs(60);
/// How many times each race runs.
const RUNS: usize = 50;

fn restore_body(checkpoint: &str) -> Value {
    json!({"checkpoint_id": checkpoint, "discard_worktree_changes": true})
}

async fn turns(app: &TestApp, session: Uuid) -> Vec<Value> {
    app.get(&format!("/api/v1/sessions/{session}/turns")).await.ok(200)["items"]
        .as_array()
        .unwrap()
        .clone()
}

/// The checkpoint the session's first turn started from (the worktree as the test repository has it).
async fn first_start(app: &TestApp, s: &Started) -> String {
    agent_writes(app, s, "first.txt", "1").await;
    turns(app, s.session).await[0]["start_checkpoint_id"]
        .as_str()
        .unwrap()
        .to_string()
}

async fn a_question_keeps_the_turn_and_a_restore_waits_for_it(app: TestApp) {
    let s = started(&app).await;
    let start = first_start(&app, &s).await;
    let restore = format!("/api/v1/environments/{}/restore", s.env);
    app.post(
        &format!("/api/v1/sessions/{}/messages", s.session),
        json!({"text": "ask"}),
    )
    .await
    .ok(202);
    wait_session(&app, s.session, "asking", |v| v["state"] == "attention").await;
    // Mid-turn, waiting on a person: its files are not restored under it.
    let refused = app
        .post(&restore, restore_body(&start))
        .await
        .problem(409, "session_busy");
    assert_eq!(refused["writer"]["holder"], "turn", "{refused}");
    assert_eq!(refused["writer"]["holder_id"], json!(s.session), "{refused}");
    assert_eq!(refused["task_environment_id"], json!(s.env), "{refused}");
    assert!(s.worktree.join("first.txt").exists(), "refused: nothing changed");
    let snap = app
        .get(&format!("/api/v1/sessions/{}/snapshot", s.session))
        .await
        .ok(200);
    let question = snap["attention_requests"][0]["id"].as_str().unwrap().to_string();
    app.post(
        &format!("/api/v1/sessions/{}/attention/{question}", s.session),
        json!({"confirmed": true}),
    )
    .await
    .ok(200);
    wait_turns(&app, s.session, 2).await;
    // The turn settled: the restore goes, and the git status berth serves describes what is there now.
    let stored = app
        .get(&format!("/api/v1/environments/{}/git-status", s.env))
        .await
        .ok(200);
    assert!(stored.to_string().contains("first.txt"), "{stored}");
    wait_until("the restore", WAIT, || async {
        let r = app.post(&restore, restore_body(&start)).await;
        seen_json(r.status == 200, r.json())
    })
    .await;
    assert!(!s.worktree.join("first.txt").exists());
    let stored = app
        .get(&format!("/api/v1/environments/{}/git-status", s.env))
        .await
        .ok(200);
    assert!(
        !stored.to_string().contains("first.txt"),
        "the stored status does not describe a file the restore removed: {stored}"
    );
}

/// Writes a lease row as another writer of this instance would hold it.
async fn hold(app: &TestApp, env: &str, holder: &str, instance: Uuid) -> Uuid {
    use berth::entity::writer_lease as lease;
    let token = Uuid::now_v7();
    let writer = match holder {
        "restore" => lease::Writer::Restore,
        "landing" => lease::Writer::Landing,
        _ => lease::Writer::Cleanup,
    };
    lease::ActiveModel {
        task_environment_id: Set(Uuid::parse_str(env).unwrap().into()),
        token: Set(token),
        holder: Set(writer),
        holder_id: Set(None),
        node_id: Set(app.config.node_id.clone()),
        instance_id: Set(instance.into()),
        acquired_at: Set(chrono::Utc::now()),
    }
    .insert(app.db())
    .await
    .unwrap();
    token
}

async fn let_go(app: &TestApp, env: &str) {
    use berth::entity::writer_lease as lease;
    lease::Entity::delete_by_id(Uuid::parse_str(env).unwrap())
        .exec(app.db())
        .await
        .unwrap();
}

async fn a_prompt_waits_queued_while_a_restore_holds_the_worktrees(app: TestApp) {
    let s = started(&app).await;
    let instance: Uuid = app.app_state.ctx.instance_id.into();
    hold(&app, &s.env, "restore", instance).await;
    // Another writer is refused, told who holds it.
    let commit = app
        .post(
            &format!("/api/v1/environments/{}/commits", s.env),
            json!({"message": "m"}),
        )
        .await
        .problem(409, "restore_in_progress");
    assert_eq!(commit["writer"]["holder"], "restore", "{commit}");
    assert_eq!(commit["writer"]["node_id"], app.config.node_id.as_str(), "{commit}");
    // A prompt waits in the inbox, queued: it does not run beside the restore.
    let m = app
        .post(
            &format!("/api/v1/sessions/{}/messages", s.session),
            json!({"text": "write late.txt after"}),
        )
        .await
        .ok(202);
    let messages = format!("/api/v1/sessions/{}/messages", s.session);
    let queued = app.get(&messages).await.ok(200);
    assert_eq!(queued["items"][0]["state"], "queued", "{queued}");
    assert!(turns(&app, s.session).await.is_empty(), "no turn began");
    assert!(!s.worktree.join("late.txt").exists());
    let released_at = chrono::Utc::now();
    let_go(&app, &s.env).await;
    let t = wait_turns(&app, s.session, 1).await;
    let started_at: chrono::DateTime<chrono::Utc> = t["items"][0]["started_at"].as_str().unwrap().parse().unwrap();
    assert!(started_at >= released_at, "the turn began once the lease was free");
    assert_eq!(std::fs::read_to_string(s.worktree.join("late.txt")).unwrap(), "after");
    let _ = m;
}

async fn a_lease_whose_instance_is_gone_is_taken_over(app: TestApp) {
    let s = started(&app).await;
    let start = first_start(&app, &s).await;
    // Held by an instance that holds no instance lease (it crashed): not a writer any more.
    hold(&app, &s.env, "landing", Uuid::now_v7()).await;
    app.post(&format!("/api/v1/environments/{}/restore", s.env), restore_body(&start))
        .await
        .ok(200);
    assert!(!s.worktree.join("first.txt").exists());
}

async fn an_archive_waits_for_the_writer_and_then_nothing_writes(app: TestApp) {
    let s = started(&app).await;
    let start = first_start(&app, &s).await;
    // Back to the repository's state: nothing uncommitted for the archive to keep.
    let restore = format!("/api/v1/environments/{}/restore", s.env);
    app.post(&restore, restore_body(&start)).await.ok(200);
    // A landing holds the worktrees when the archive comes: its cleanup waits for it (spending none of
    // its attempts), and no writer starts after the archive.
    let instance: Uuid = app.app_state.ctx.instance_id.into();
    hold(&app, &s.env, "landing", instance).await;
    let archived = app
        .post(&format!("/api/v1/tasks/{}/archive", s.task), json!({}))
        .await
        .ok(202);
    let job = id_of(&archived["cleanup_jobs"][0]);
    let waiting = wait_until("the job waiting for the writer", WAIT, || async {
        let j = app.get(&format!("/api/v1/cleanup-jobs/{job}")).await.ok(200);
        let waits = j["last_error"].as_str().unwrap_or_default().contains("another writer");
        seen_json(waits, j)
    })
    .await;
    assert_ne!(waiting["state"], "failed", "{waiting}");
    assert!(
        s.worktree.join("README.md").exists(),
        "nothing removed under the writer"
    );
    app.post(&restore, restore_body(&start))
        .await
        .problem(409, "task_archived");
    app.post(
        &format!("/api/v1/environments/{}/commits", s.env),
        json!({"message": "late"}),
    )
    .await
    .problem(409, "task_archived");
    let_go(&app, &s.env).await;
    let done = wait_job(&app, job, WAIT, &["succeeded", "failed"]).await;
    assert_eq!(done["state"], "succeeded", "{done}");
    assert!(!s.worktree.exists());
}

async fn a_commit_never_stages_a_worktree_that_fails_proof(app: TestApp) {
    let s = started(&app).await;
    agent_writes(&app, &s, "work.txt", "agent").await;
    app.post(&format!("/api/v1/sessions/{}/stop", s.session), json!({}))
        .await
        .ok(200);
    wait_session(&app, s.session, "stopped", |v| v["state"] == "stopped").await;
    // Someone re-clones the repository where the worktree was: not berth's worktree any more.
    std::fs::remove_dir_all(&s.worktree).unwrap();
    git(
        Path::new("/"),
        &[
            "clone",
            "-q",
            s.repo_path.to_str().unwrap(),
            s.worktree.to_str().unwrap(),
        ],
    );
    std::fs::write(s.worktree.join("theirs.txt"), "not berth's").unwrap();
    let head = git(&s.worktree, &["rev-parse", "HEAD"]);
    let diff = app.get(&format!("/api/v1/environments/{}/diff", s.env)).await;
    let refused = app
        .post(
            &format!("/api/v1/environments/{}/commits", s.env),
            json!({"message": "m"}),
        )
        .await;
    assert_eq!(
        refused.status,
        diff.status,
        "the same problem as a diff: {}",
        refused.json()
    );
    refused.problem(409, "workspace_reuse_unsafe");
    assert_eq!(git(&s.worktree, &["rev-parse", "HEAD"]), head, "no commit in the clone");
    assert!(
        git(&s.worktree, &["status", "--porcelain"]).contains("?? theirs.txt"),
        "nothing staged in the clone"
    );
}

/// A second task over the same repository whose `local` session works in the repository itself.
async fn local_agent(app: &TestApp, s: &Started) -> (Uuid, Uuid) {
    let ws = app.get(&format!("/api/v1/tasks/{}", s.task)).await.ok(200)["workspace_id"].clone();
    let task = app.task(crate::helpers::uuid(&ws), "local work", &[s.repo]).await;
    let created = app
        .post(
            &format!("/api/v1/tasks/{task}/sessions"),
            json!({"executor_type": "local", "agent_profile": "test"}),
        )
        .await
        .ok(201);
    let id = crate::helpers::uuid(&created["id"]);
    wait_session(app, id, "idle", |v| v["state"] == "idle").await;
    (task, id)
}

async fn a_merge_never_moves_a_checkout_a_local_agent_works_in(app: TestApp) {
    let s = started(&app).await;
    agent_writes(&app, &s, "feature.txt", "done").await;
    app.post(
        &format!("/api/v1/environments/{}/commits", s.env),
        json!({"message": "feature"}),
    )
    .await
    .ok(201);
    let (_, local) = local_agent(&app, &s).await;
    let main_before = git(&s.repo_path, &["rev-parse", "main"]);
    let merge = format!("/api/v1/environments/{}/merge", s.env);
    let body = json!({"repository_id": s.repo, "strategy": "merge"});
    app.post(&merge, body.clone()).await.problem(409, "target_in_use");
    assert_eq!(
        git(&s.repo_path, &["rev-parse", "main"]),
        main_before,
        "main did not move"
    );
    assert!(
        !s.repo_path.join("feature.txt").exists(),
        "the agent's checkout is as it was"
    );
    // Once the local agent is stopped, the checkout moves with the merge.
    app.post(&format!("/api/v1/sessions/{local}/stop"), json!({}))
        .await
        .ok(200);
    wait_session(&app, local, "stopped", |v| v["state"] == "stopped").await;
    let merged = app.post(&merge, body).await.ok(200);
    assert_eq!(merged["checkout_updated"], true, "{merged}");
    assert_eq!(
        std::fs::read_to_string(s.repo_path.join("feature.txt")).unwrap(),
        "done"
    );
}

/// Whether checkpoint id `a` was taken before `b` (ids are time-ordered, v7).
fn before(a: &Value, b: &Value) -> bool {
    a.as_str().unwrap() < b.as_str().unwrap()
}

async fn a_turn_and_a_restore_never_overlap(app: TestApp) {
    let s = started(&app).await;
    let start = first_start(&app, &s).await;
    let restore = format!("/api/v1/environments/{}/restore", s.env);
    let messages = format!("/api/v1/sessions/{}/messages", s.session);
    let (mut refused, mut restored_first, mut restored_after) = (0, 0, 0);
    for n in 0..RUNS {
        let text = format!("run-{n}");
        let (posted, r) = tokio::join!(
            app.post(&messages, json!({"text": format!("write race.txt {text}")})),
            app.post(&restore, restore_body(&start))
        );
        posted.ok(202);
        let t = wait_turns(&app, s.session, n + 2).await;
        let turn = t["items"].as_array().unwrap().last().unwrap().clone();
        let on_disk = std::fs::read_to_string(s.worktree.join("race.txt")).ok();
        match r.status.as_u16() {
            409 => {
                let p = r.problem(409, "session_busy");
                assert_eq!(p["writer"]["holder"], "turn");
                refused += 1;
                assert_eq!(on_disk.as_deref(), Some(text.as_str()), "run {n}");
            }
            200 => {
                let after = r.json()["new_checkpoint_id"].clone();
                if before(&after, &turn["start_checkpoint_id"]) {
                    // The restore was whole before the turn began: the turn's file is there.
                    restored_first += 1;
                    assert_eq!(on_disk.as_deref(), Some(text.as_str()), "run {n}");
                } else {
                    // Whole after the turn's end: the file is gone with it.
                    assert!(
                        before(&turn["end_checkpoint_id"], &after),
                        "run {n}: they overlapped: {turn} {after}"
                    );
                    restored_after += 1;
                    assert_eq!(on_disk, None, "run {n}");
                }
            }
            other => panic!("run {n}: {other} {}", r.json()),
        }
    }
    eprintln!("{RUNS} runs: restore refused {refused}, before the turn {restored_first}, after it {restored_after}");
}

async fn a_restore_and_a_commit_never_overlap(app: TestApp) {
    let s = started(&app).await;
    let start = first_start(&app, &s).await;
    let restore = format!("/api/v1/environments/{}/restore", s.env);
    let commits = format!("/api/v1/environments/{}/commits", s.env);
    const FILES: usize = 40;
    for n in 0..RUNS {
        for i in 0..FILES {
            std::fs::write(s.worktree.join(format!("f{i}.txt")), format!("{n}")).unwrap();
        }
        let (c, r) = tokio::join!(
            app.post(&commits, json!({"message": format!("run {n}")})),
            app.post(&restore, restore_body(&start))
        );
        let present = (0..FILES)
            .filter(|i| s.worktree.join(format!("f{i}.txt")).exists())
            .count();
        match (c.status.as_u16(), r.status.as_u16()) {
            // Both ran, one whole after the other: the commit has every file, the restore removed them.
            (201, 200) | (201, 409) => {
                let files = git(&s.worktree, &["show", "--name-only", "--format=", "HEAD"]);
                let committed = files
                    .lines()
                    .filter(|l| l.starts_with('f') && !l.starts_with("first"))
                    .count();
                assert!(
                    committed == FILES || committed == 0,
                    "run {n}: a commit of part of the files: {files}"
                );
            }
            (409, 200) => {
                let code = c.json()["code"].as_str().unwrap().to_string();
                assert!(
                    ["nothing_to_commit", "restore_in_progress"].contains(&code.as_str()),
                    "run {n}: {code}"
                );
            }
            other => panic!("run {n}: {other:?} {} {}", c.json(), r.json()),
        }
        assert!(
            present == 0 || present == FILES,
            "run {n}: a half-restored worktree ({present} files)"
        );
        if r.status == 409 {
            let p = r.json();
            assert_eq!(p["code"], "landing_in_progress", "run {n}: {p}");
        }
        // Clean for the next run, with berth's own restore (no change since the last checkpoint).
        wait_until("the worktree back to the start", WAIT, || async {
            let r = app.post(&restore, restore_body(&start)).await;
            seen_json(r.status == 200, r.json())
        })
        .await;
    }
}

async fn no_checkpoint_ref_outlives_the_cleanup(app: TestApp) {
    let f = app.task_with_repo_in("cleanup-race", "svc", "Race").await;
    let repo = f.repo_dir.clone();
    let ws = f.workspace;
    for n in 0..RUNS {
        let task = app.task(ws, &format!("race {n}"), &[f.repository]).await;
        let st = app.started_agent(task, "test").await;
        let env = st.created["task_environment_id"].as_str().unwrap().to_string();
        let worktree = PathBuf::from(st.created["workspace_path"].as_str().unwrap());
        // A turn whose end checkpoint races the delete's cleanup.
        app.post(
            &format!("/api/v1/sessions/{}/messages", st.id),
            json!({"text": "write x.txt y"}),
        )
        .await
        .ok(202);
        let jobs = app
            .call(
                reqwest::Method::DELETE,
                &format!("/api/v1/tasks/{task}?discard_worktree_changes=true"),
                Some(&app.admin),
                None,
            )
            .await
            .ok(202);
        for j in jobs["cleanup_jobs"].as_array().into_iter().flatten() {
            wait_job(&app, id_of(j), WAIT, &["succeeded"]).await;
        }
        wait_until("the delete's cleanup", WAIT, || async {
            let refs = git(
                &repo,
                &[
                    "for-each-ref",
                    "--format=%(refname)",
                    &format!("refs/berth/checkpoints/{env}/"),
                ],
            );
            seen_json(refs.trim().is_empty() && !worktree.exists(), json!(refs))
        })
        .await;
        // Whatever the turn was doing, no ref of berth's is written after it (and no lease is left).
        wait_until("no writer lease left", WAIT, || async {
            let left = berth::entity::writer_lease::Entity::find_by_id(Uuid::parse_str(&env).unwrap())
                .one(app.db())
                .await
                .unwrap();
            seen_json(left.is_none(), json!(format!("{left:?}")))
        })
        .await;
        let refs = git(
            &repo,
            &[
                "for-each-ref",
                "--format=%(refname)",
                &format!("refs/berth/checkpoints/{env}/"),
            ],
        );
        assert!(
            refs.trim().is_empty(),
            "run {n}: a checkpoint ref after the cleanup: {refs}"
        );
    }
}
