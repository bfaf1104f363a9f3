//! Current git status against the size of the observation history.
use super::*;

pub(crate) async fn git_status(b: &Bench, table: &mut Table) {
    let env: Value = b.get(&format!("/api/v1/tasks/{}/environment", b.task)).await;
    let env_id: EnvironmentId = env["id"].as_str().unwrap().parse().unwrap();
    let conn = &b.ctx.db.conn;
    let mut stored = 0;
    let mut base = None;
    for size in STATUS_SIZES {
        insert_observations(conn, env_id, b.repository, stored, size).await;
        stored = size;
        analyze(conn).await;
        let mut times = Vec::with_capacity(STATUS_READS);
        for _ in 0..STATUS_READS {
            let t = Instant::now();
            let current = berth::domain::git_status::read_current_on(conn, env_id, vec![b.repository])
                .await
                .unwrap();
            times.push(t.elapsed());
            assert_eq!(current.len(), 1);
        }
        times.sort();
        let (med, p99) = (times[STATUS_READS / 2], times[STATUS_READS * 99 / 100]);
        let base = *base.get_or_insert(med);
        let ratio = med.as_secs_f64() / base.as_secs_f64();
        table.add(
            b.backend,
            &format!("current git status read, {size} stored observations"),
            format!("median {}, p99 {}", fmt_d(med), fmt_d(p99)),
            "the 10-observation read".into(),
            format!("{ratio:.2}x"),
            "1M within 2x of 10",
            (size == 1_000_000).then_some(ratio <= 2.0),
        );
    }
}

pub(crate) async fn insert_observations(
    conn: &DatabaseConnection,
    env_id: EnvironmentId,
    repo: RepositoryId,
    from: usize,
    to: usize,
) {
    let start = chrono::Utc::now() - chrono::Duration::days(30);
    let files = json!([{"path": "src/main.rs", "index_status": "unmodified", "worktree_status": "modified"}]);
    let mut i = from;
    while i < to {
        let end = (i + 1000).min(to);
        let rows = (i..end).map(|n| obs::ActiveModel {
            id: Set(berth::ids::ObservationId::now_v7()),
            task_environment_id: Set(env_id),
            repository_id: Set(repo),
            session_id: Set(None),
            kind: Set(obs::ObservationKind::Archive),
            observed_at: Set(start + chrono::Duration::milliseconds(n as i64)),
            branch: Set(Some("berth/bench".into())),
            head_commit: Set(None),
            upstream: Set(None),
            ahead: Set(0),
            behind: Set(0),
            files: Set(files.clone()),
            created_at: Set(start),
            imported_from: Set(None),
        });
        obs::Entity::insert_many(rows)
            .exec_without_returning(conn)
            .await
            .unwrap();
        i = end;
    }
}
