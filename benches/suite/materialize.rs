//! Materialization: the API's first session of a task against the `git worktree add` it runs.
use super::*;

pub(crate) async fn materialize(b: &mut Bench, table: &mut Table, source: &Path) {
    let mut api = Vec::new();
    let mut bare = Vec::new();
    for i in 0..MATERIALIZE_ROUNDS {
        let task = id_of(
            &b.post(
                &format!("/api/v1/workspaces/{}/tasks", b.workspace),
                json!({"title": format!("materialize {i}"), "repositories": [{"repository_id": b.repository}]}),
                201,
            )
            .await,
        );
        let t = Instant::now();
        let s = b
            .post(
                &format!("/api/v1/tasks/{task}/sessions"),
                json!({"executor_type": "worktree", "start": false}),
                201,
            )
            .await;
        api.push(t.elapsed());
        if i == 0 {
            b.task = task.into();
            b.session = id_of(&s).into();
        }
        let path = b.scratch.join(format!("bare/{i}"));
        let t = Instant::now();
        let out = Command::new("git")
            .arg("-C")
            .arg(source)
            .args(["worktree", "add", "-q", "-b", &format!("bare/{i}")])
            .arg(&path)
            .output()
            .unwrap();
        bare.push(t.elapsed());
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    }
    let (api, bare) = (median(&mut api), median(&mut bare));
    let ratio = api.as_secs_f64() / bare.as_secs_f64();
    table.add(
        b.backend,
        "materialize a 1-repository environment (first session, median of 20)",
        fmt_d(api),
        format!("{} (git worktree add)", fmt_d(bare)),
        format!("{ratio:.2}x"),
        "<= 1.3x",
        Some(ratio <= 1.3),
    );
}

/// Tops the workspace up to `n` tasks (rows inserted directly: the size is what matters).
pub(crate) async fn fill_tasks(b: &Bench, n: usize) {
    let conn = &b.ctx.db.conn;
    let have = task::Entity::find().count(conn).await.unwrap() as usize;
    let now = chrono::Utc::now();
    let mut i = have;
    while i < n {
        let end = (i + 1000).min(n);
        let rows = (i..end).map(|k| task::ActiveModel {
            id: Set(berth::ids::TaskId::now_v7()),
            workspace_id: Set(b.workspace),
            parent_task_id: Set(None),
            title: Set(format!("filler {k}")),
            slug: Set(format!("filler-{k}")),
            description: Set(String::new()),
            kind: Set(task::TaskKind::Standard),
            workspace_mode: Set(task::WorkspaceMode::NewWorkspace),
            archived_at: Set(None),
            last_activity_at: Set(now),
            created_at: Set(now),
            updated_at: Set(now),
            row_version: Set(1),
            imported_from: Set(None),
            column_id: Set(None),
        });
        task::Entity::insert_many(rows)
            .exec_without_returning(conn)
            .await
            .unwrap();
        i = end;
    }
    analyze(conn).await;
}

pub(crate) async fn analyze(conn: &DatabaseConnection) {
    exec(conn, "ANALYZE").await;
}
