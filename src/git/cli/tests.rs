//! The git CLI's lock handling and concurrency.
use super::*;

#[test]
fn lock_contention_is_told_from_other_failures() {
    for contended in [
        "fatal: Unable to create '/r/.git/index.lock': File exists.\n\nAnother git process seems to be running in this repository",
        "error: cannot lock ref 'refs/heads/berth/t': Unable to create '/r/.git/refs/heads/berth/t.lock': File exists.",
        "error: could not lock config file /r/.git/config: File exists",
        "fatal: Unable to create '/r/.git/packed-refs.lock': File exists.",
    ] {
        assert!(is_lock_contention(contended), "{contended}");
    }
    for other in [
        "fatal: a branch named 'berth/t' already exists",
        "fatal: '/w/svc' already exists",
        "fatal: cannot remove a locked working tree, lock reason: on a drive",
        "fatal: '/w/svc' contains modified or untracked files, use --force to delete it",
    ] {
        assert!(!is_lock_contention(other), "{other}");
    }
}

#[test]
fn backoff_grows_and_stays_bounded() {
    assert!(backoff(0) >= LOCK_BACKOFF_FIRST && backoff(0) < LOCK_BACKOFF_FIRST * 2);
    assert!(backoff(3) >= LOCK_BACKOFF_FIRST * 8);
    assert!(backoff(40) <= LOCK_BACKOFF_MAX + LOCK_BACKOFF_MAX / 2 + Duration::from_millis(1));
}

#[tokio::test]
async fn one_repository_mutates_one_at_a_time_and_others_do_not_wait() {
    let locks = Arc::new(RepoLocks::default());
    let dir = tempfile::TempDir::new().unwrap();
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    std::fs::create_dir_all(&a).unwrap();
    std::fs::create_dir_all(&b).unwrap();
    let held = locks.lock(&a).await;
    // Another spelling of the same repository waits; another repository does not.
    let same = a.join("..").join("a");
    assert!(
        tokio::time::timeout(Duration::from_millis(50), locks.lock(&same))
            .await
            .is_err()
    );
    let other = tokio::time::timeout(Duration::from_millis(50), locks.lock(&b)).await;
    assert!(other.is_ok());
    drop(other);
    drop(held);
    drop(
        tokio::time::timeout(Duration::from_secs(5), locks.lock(&same))
            .await
            .unwrap(),
    );
    assert!(locks.0.lock().unwrap().is_empty(), "nobody waits: no entries kept");
}
