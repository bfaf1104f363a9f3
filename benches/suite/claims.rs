//! Cleanup claims: the workers on no-op jobs against a bare claim loop of the same SQL.
use super::*;
use sea_orm::sea_query::Expr;
use sea_orm::{ColumnTrait, QueryFilter, QueryTrait};

/// Rounds of each loop, alternated (berth, bare, bare with its event, ...): the database's speed drifts
/// within a run, by up to 1.5x between two loops of one minute, so each side's median over the rounds
/// is compared, not one loop each.
const ROUNDS_DEFAULT: usize = 3;

pub(crate) async fn claims(b: &Bench, table: &mut Table) {
    let n = env_usize("BERTH_BENCH_JOBS", 10_000);
    let rounds = env_usize("BERTH_BENCH_CLAIM_ROUNDS", ROUNDS_DEFAULT).max(1);
    let rate = |t: Duration| n as f64 / t.as_secs_f64();
    for workers in [1usize, 4] {
        let (mut ours, mut bare, mut evented) = (Vec::new(), Vec::new(), Vec::new());
        let (mut twice, mut bare_twice) = (0, 0);
        for _ in 0..rounds {
            let (t, claimed_twice) = berth_loop(b, n, workers).await;
            ours.push(rate(t));
            twice += claimed_twice;
            // The bare loop as berth claims (without waiting for the log flush), and with the claim's
            // event in its update (PostgreSQL: what the event costs, its insert and what the sequencer
            // and the tailers then do with it).
            let (t, ids) = bare_loop(b, n, workers, Bare::Unflushed).await;
            bare.push(rate(t));
            let unique: std::collections::HashSet<_> = ids.iter().collect();
            bare_twice += ids.len() - unique.len();
            if b.backend == "postgres" {
                evented.push(rate(bare_loop(b, n, workers, Bare::WithEvent).await.0));
            }
        }
        // For reference, once: as berth claimed before (each claim flushed).
        let flushed_rate = rate(bare_loop(b, n, workers, Bare::Flushed).await.0);
        let (ours_rate, bare_rate) = (*median_by(&mut ours, |r| *r), *median_by(&mut bare, |r| *r));
        let evented = if evented.is_empty() {
            String::new()
        } else {
            let with_event = *median_by(&mut evented, |r| *r);
            format!(
                ", {with_event:.0}/s with its event: berth at {:.0}% of that",
                100.0 * ours_rate / with_event
            )
        };
        let ratio = ours_rate / bare_rate;
        let target = if b.backend == "postgres" { 0.9 } else { 0.5 };
        table.add(
            b.backend,
            &format!("cleanup claims, {n} no-op jobs, {workers} worker(s), median of {rounds} alternated rounds"),
            format!("{ours_rate:.0} jobs/s (claim, run, record); claimed twice: {twice}"),
            format!(
                "{bare_rate:.0} claims/s (same SQL, no job logic; {flushed_rate:.0}/s with a flush each{evented}); claimed twice: {bare_twice}"
            ),
            format!("{:.0}%", ratio * 100.0),
            if b.backend == "postgres" {
                ">= 90% of bare, none twice (issue 19)"
            } else {
                ">= 50% of bare, none twice"
            },
            Some(ratio >= target && twice == 0 && bare_twice == 0),
        );
    }
}

/// The real workers (`worker::cleanup::run`) over `n` fresh no-op jobs: how long they took, and how many
/// jobs were claimed more than once.
async fn berth_loop(b: &Bench, n: usize, workers: usize) -> (Duration, i64) {
    insert_jobs(b, n).await;
    let claimed_before = b.ctx.metrics.cleanup_claims_total();
    let t = Instant::now();
    let handles: Vec<_> = (0..workers)
        .map(|i| tokio::spawn(berth::worker::cleanup::run(b.ctx.clone(), i)).abort_handle())
        .collect();
    let deadline = Instant::now() + Duration::from_secs(1800);
    // Waits on the workers' own claim counter: a query polling the table would load the database the
    // workers are measured on (before, a COUNT every 50 ms ran during berth's loops only).
    loop {
        let claimed = b.ctx.metrics.cleanup_claims_total() - claimed_before;
        if claimed as usize >= n {
            break;
        }
        assert!(Instant::now() < deadline, "claims did not finish: {claimed}/{n}");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let took = t.elapsed();
    handles.iter().for_each(|h| h.abort());
    let done = count(
        &b.ctx.db.conn,
        "SELECT COUNT(*) AS n FROM task_resource_cleanup_jobs WHERE node_id = 'bench-bare' AND state = 'succeeded'",
    )
    .await;
    assert_eq!(done as usize, n, "every claimed no-op job is done in its claim");
    let twice = count(
        &b.ctx.db.conn,
        "SELECT COUNT(*) AS n FROM task_resource_cleanup_jobs WHERE node_id = 'bench-bare' AND attempts <> 1",
    )
    .await;
    exec(
        &b.ctx.db.conn,
        "DELETE FROM task_resource_cleanup_jobs WHERE node_id = 'bench-bare'",
    )
    .await;
    (took, twice)
}

pub(crate) async fn insert_jobs(b: &Bench, n: usize) {
    let now = chrono::Utc::now() - chrono::Duration::seconds(1);
    let snapshot = json!({"task_id": Uuid::nil(), "workspace_id": b.workspace, "environment": null, "sessions": [], "discard_worktree_changes": false, "keep_branches": true});
    let mut i = 0;
    while i < n {
        let end = (i + 500).min(n);
        let rows = (i..end).map(|_| job::ActiveModel {
            id: Set(CleanupJobId::now_v7()),
            operation_id: Set(OperationId::now_v7()),
            task_id: Set(TaskId::now_v7()),
            workspace_id: Set(b.workspace),
            task_environment_id: Set(None),
            trigger: Set(job::CleanupTrigger::Delete),
            state: Set(job::CleanupJobState::Pending),
            attempts: Set(0),
            max_attempts: Set(8),
            next_attempt_at: Set(Some(now)),
            last_error: Set(None),
            resource_snapshot: Set(snapshot.clone()),
            node_id: Set("bench-bare".into()),
            lease_owner: Set(None),
            lease_expires_at: Set(None),
            created_at: Set(now),
            updated_at: Set(now),
            completed_at: Set(None),
            actor_sub: Set(None),
            actor_session_id: Set(None),
        });
        job::Entity::insert_many(rows)
            .exec_without_returning(&b.ctx.db.conn)
            .await
            .unwrap();
        i = end;
    }
    analyze(&b.ctx.db.conn).await;
}

/// How a bare claim commits.
#[derive(Clone, Copy, PartialEq)]
pub(crate) enum Bare {
    /// Without waiting for the log flush, as berth claims.
    Unflushed,
    /// Waiting for it.
    Flushed,
    /// Unflushed, with the claim's event written in the update's statement as berth writes it
    /// (PostgreSQL).
    WithEvent,
}

/// `workers` bare claim loops over `n` fresh jobs: how long they took, and the ids they claimed.
async fn bare_loop(b: &Bench, n: usize, workers: usize, how: Bare) -> (Duration, Vec<CleanupJobId>) {
    insert_jobs(b, n).await;
    let t = Instant::now();
    let loops: Vec<_> = (0..workers)
        .map(|_| {
            let ctx = b.ctx.clone();
            tokio::spawn(async move {
                let mut got = Vec::new();
                while let Some(id) = bare_claim(&ctx, how).await {
                    got.push(id);
                }
                got
            })
        })
        .collect();
    let mut ids = Vec::new();
    for l in loops {
        ids.extend(l.await.unwrap());
    }
    let took = t.elapsed();
    let unique: std::collections::HashSet<_> = ids.iter().collect();
    assert_eq!(unique.len(), n);
    exec(
        &b.ctx.db.conn,
        "DELETE FROM task_resource_cleanup_jobs WHERE node_id = 'bench-bare'",
    )
    .await;
    (took, ids)
}

/// The claim's SQL (the same `next_claimable` queries and update as `worker::cleanup::claim`, and like it
/// without waiting for the log flush unless `Bare::Flushed`), nothing else.
pub(crate) async fn bare_claim(ctx: &Ctx, how: Bare) -> Option<CleanupJobId> {
    let now = chrono::Utc::now();
    let txn = ctx.db.begin_write().await.unwrap();
    if how != Bare::Flushed {
        berth::store::Db::unflushed(&txn).await.unwrap();
    }
    let found = berth::store::cleanup_jobs::next_claimable(&txn, "bench-bare", now)
        .await
        .unwrap()?;
    let update = job::Entity::update_many()
        .col_expr(job::Column::State, Expr::value(job::CleanupJobState::Succeeded))
        .col_expr(job::Column::Attempts, Expr::value(found.attempts + 1))
        .col_expr(job::Column::LeaseOwner, Expr::value(Some("bare".to_string())))
        .col_expr(job::Column::LeaseExpiresAt, Expr::value(Some(now)))
        .col_expr(job::Column::UpdatedAt, Expr::value(now))
        .filter(job::Column::Id.eq(found.id));
    if how == Bare::WithEvent {
        let subject = berth::events::Subject::task(found.workspace_id, found.task_id);
        let data = json!({ "cleanup_job_id": found.id, "state": "succeeded", "trigger": found.trigger });
        let statement = update.build(sea_orm::DbBackend::Postgres);
        let changed = berth::events::append_on_change(
            &txn,
            statement,
            ctx.instance_id,
            berth::events::EventType::CleanupJobUpdated,
            subject,
            data,
        )
        .await
        .unwrap();
        assert!(changed);
    } else {
        update.exec(&txn).await.unwrap();
    }
    if how == Bare::WithEvent {
        // As berth's claim: the tailer (and here the herald) is woken for the event.
        ctx.commit(txn).await.unwrap();
    } else {
        txn.commit().await.unwrap();
    }
    Some(found.id)
}
