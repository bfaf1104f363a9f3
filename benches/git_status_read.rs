//! The current-git-status read must not grow with the history (issue 7; seed 004): the newest observation
//! per (environment, repository) is one index probe. This measures the read with 10, 10,000 and 1,000,000
//! stored observations on SQLite, and on PostgreSQL when `BERTH_BENCH_POSTGRES_URL` is set (a fresh
//! database is created there and dropped afterwards).
//!
//! `cargo bench --bench git_status_read` (release build). Prints median and p99 per size and the ratio of
//! the 1M read to the 10 read (target: within 2x).
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use berth::config::Config;
use berth::entity::git_status_observation as obs;
use sea_orm::{ActiveValue::Set, ConnectionTrait, DatabaseConnection, EntityTrait, Statement};
use uuid::Uuid;

const SIZES: [usize; 3] = [10, 10_000, 1_000_000];
const READS: usize = 300;

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        println!("| backend | stored observations | median | p99 | ratio to 10 |");
        println!("| --- | --- | --- | --- | --- |");
        if std::env::var("BERTH_BENCH_SKIP_SQLITE").is_err() {
            run("sqlite", None).await;
        }
        if let Ok(url) = std::env::var("BERTH_BENCH_POSTGRES_URL") {
            run("postgres", Some(url)).await;
        } else {
            eprintln!("BERTH_BENCH_POSTGRES_URL is not set: SQLite only");
        }
    });
}

async fn run(backend: &str, pg_server: Option<String>) {
    let dir = tempfile::TempDir::new().unwrap();
    let mut env = BTreeMap::new();
    env.insert("BERTH_DATA_DIR".to_string(), dir.path().display().to_string());
    env.insert(
        "BERTH_JWT_SECRET".to_string(),
        "bench-secret-bench-secret-bench-secret-0123".to_string(),
    );
    let mut pg_db = None;
    if let Some(server) = &pg_server {
        let name = format!("berth_bench_{}", Uuid::new_v4().simple());
        let admin = sea_orm::Database::connect(server.as_str()).await.unwrap();
        admin
            .execute_raw(Statement::from_string(
                admin.get_database_backend(),
                format!("CREATE DATABASE \"{name}\""),
            ))
            .await
            .unwrap();
        let mut url = reqwest::Url::parse(server).unwrap();
        url.set_path(&format!("/{name}"));
        env.insert("BERTH_DATABASE_URL".to_string(), url.to_string());
        pg_db = Some((admin, name));
    }
    let config = Config::load(&env).unwrap();
    let (db, _) = berth::startup::open_database(&config).await.unwrap();
    let conn = db.conn.clone();
    let (env_id, repo) = seed(&conn).await;
    let mut stored = 0;
    let mut base: Option<Duration> = None;
    for size in SIZES {
        insert(&conn, env_id, repo, stored, size).await;
        stored = size;
        let mut times = Vec::with_capacity(READS);
        for _ in 0..READS {
            let t = Instant::now();
            let current = berth::domain::git_status::read_current_on(&conn, env_id, vec![repo])
                .await
                .unwrap();
            times.push(t.elapsed());
            assert_eq!(current.len(), 1);
        }
        times.sort();
        let median = times[READS / 2];
        let p99 = times[READS * 99 / 100];
        let base = *base.get_or_insert(median);
        println!(
            "| {backend} | {size} | {median:?} | {p99:?} | {:.2} |",
            median.as_secs_f64() / base.as_secs_f64()
        );
    }
    conn.close().await.ok();
    if let Some((admin, name)) = pg_db {
        let _ = admin
            .execute_raw(Statement::from_string(
                admin.get_database_backend(),
                format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"),
            ))
            .await;
    }
}

/// The rows an observation hangs on, inserted directly (no git involved).
async fn seed(conn: &DatabaseConnection) -> (Uuid, Uuid) {
    use berth::entity::{repository, task, task_environment as env, workspace};
    let now = chrono::Utc::now();
    let (ws, repo, t, e) = (Uuid::now_v7(), Uuid::now_v7(), Uuid::now_v7(), Uuid::now_v7());
    workspace::Entity::insert(workspace::ActiveModel {
        id: Set(ws),
        name: Set("bench".into()),
        status: Set("active".into()),
        created_at: Set(now),
        updated_at: Set(now),
    })
    .exec_without_returning(conn)
    .await
    .unwrap();
    repository::Entity::insert(repository::ActiveModel {
        id: Set(repo),
        workspace_id: Set(ws),
        name: Set("r".into()),
        path: Set("/bench/r".into()),
        common_git_dir: Set("/bench/r/.git".into()),
        default_branch: Set("main".into()),
        created_at: Set(now),
        updated_at: Set(now),
        deleted_at: Set(None),
    })
    .exec_without_returning(conn)
    .await
    .unwrap();
    task::Entity::insert(task::ActiveModel {
        id: Set(t),
        workspace_id: Set(ws),
        parent_task_id: Set(None),
        title: Set("bench".into()),
        slug: Set("bench".into()),
        description: Set(String::new()),
        kind: Set(task::TaskKind::Standard),
        workspace_mode: Set(task::WorkspaceMode::NewWorkspace),
        archived_at: Set(None),
        last_activity_at: Set(now),
        created_at: Set(now),
        updated_at: Set(now),
    })
    .exec_without_returning(conn)
    .await
    .unwrap();
    env::Entity::insert(env::ActiveModel {
        id: Set(e),
        task_id: Set(t),
        executor_type: Set(env::ExecutorType::Worktree),
        status: Set(env::EnvironmentStatus::Ready),
        workspace_path: Set(None),
        node_id: Set("bench".into()),
        ownership_generation: Set(1),
        materializer_id: Set(None),
        error_message: Set(None),
        created_at: Set(now),
        updated_at: Set(now),
        superseded_at: Set(None),
    })
    .exec_without_returning(conn)
    .await
    .unwrap();
    (e, repo)
}

/// History: completion observations with increasing times, as a long-lived environment accumulates.
async fn insert(conn: &DatabaseConnection, env_id: Uuid, repo: Uuid, from: usize, to: usize) {
    let start = chrono::Utc::now() - chrono::Duration::days(30);
    let files =
        serde_json::json!([{"path": "src/main.rs", "index_status": "unmodified", "worktree_status": "modified"}]);
    let mut i = from;
    while i < to {
        let end = (i + 1000).min(to);
        let rows = (i..end).map(|n| obs::ActiveModel {
            id: Set(Uuid::now_v7()),
            task_environment_id: Set(env_id),
            repository_id: Set(repo),
            session_id: Set(None),
            kind: Set("archive".into()),
            observed_at: Set(start + chrono::Duration::milliseconds(n as i64)),
            branch: Set(Some("berth/bench".into())),
            head_commit: Set(None),
            upstream: Set(None),
            ahead: Set(0),
            behind: Set(0),
            files: Set(files.clone()),
            created_at: Set(start),
        });
        obs::Entity::insert_many(rows)
            .exec_without_returning(conn)
            .await
            .unwrap();
        i = end;
    }
}
