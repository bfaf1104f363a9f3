//! Process groups: signalling an agent's, and ending one a previous berth left behind when it crashed
//! (or was SIGKILLed) before the session is relaunched (I27, I29). Linux: members are found in `/proc`.
use crate::ids::ExecutionId;
use std::time::Duration;

/// What `end_orphan` found of an execution's process group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Orphan {
    /// Nothing of it runs (or what runs under that group id is not that execution's).
    Gone,
    /// It ran; it was SIGKILLed and no member is left.
    Ended,
    /// It was SIGKILLed but a member still exists after the wait (uninterruptible sleep).
    Lingering,
}

/// Ends the process group a previous berth left running for an execution. `pid` was the agent's, the
/// leader of its own group (`process_group(0)`). The group is that agent's only if a live member carries
/// `BERTH_EXECUTION_ID=<execution_id>` in its environment: the kernel reuses no id while a group holds it,
/// so a recycled pid is left alone. The leader itself may be gone (it ends when its stdin closes) while a
/// tool it started still runs in the group: that is found too. Returns once no member is left, or after
/// `within`.
pub async fn end_orphan(pid: u32, execution_id: ExecutionId, within: Duration) -> Orphan {
    let mark = format!("BERTH_EXECUTION_ID={execution_id}");
    if !members(pid).iter().any(|m| carries(*m, &mark)) {
        return Orphan::Gone;
    }
    signal_group(pid, libc::SIGKILL);
    let deadline = tokio::time::Instant::now() + within;
    while !members(pid).is_empty() {
        if tokio::time::Instant::now() >= deadline {
            return Orphan::Lingering;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Orphan::Ended
}

/// The processes of group `pgid` that still run (a zombie has ended; only its parent's wait is missing).
fn members(pgid: u32) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
                return false;
            };
            // `pid (comm) state ppid pgrp ...`: comm may hold spaces and parentheses, so split after the last `)`.
            let Some((_, rest)) = stat.rsplit_once(')') else {
                return false;
            };
            let mut fields = rest.split_whitespace();
            let state = fields.next().unwrap_or("Z");
            let pgrp = fields.nth(1).and_then(|g| g.parse::<u32>().ok());
            pgrp == Some(pgid) && !matches!(state, "Z" | "X")
        })
        .collect()
}

fn carries(pid: u32, mark: &str) -> bool {
    std::fs::read(format!("/proc/{pid}/environ"))
        .is_ok_and(|environ| environ.split(|b| *b == 0).any(|v| v == mark.as_bytes()))
}

pub(super) fn signal_group(pgid: u32, signal: i32) {
    if pgid == 0 {
        return;
    }
    // SAFETY: kill(2) on a process group we created with process_group(0); no memory is involved.
    unsafe {
        libc::kill(-(pgid as i32), signal);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A group of its own: `sh` as leader with a `sleep` child, carrying the mark, like an agent and its tool.
    fn group(mark: &str) -> std::process::Child {
        use std::os::unix::process::CommandExt;
        std::process::Command::new("sh")
            .args(["-c", "sleep 600 & wait"])
            .env("BERTH_EXECUTION_ID", mark)
            .process_group(0)
            .spawn()
            .unwrap()
    }

    async fn wait_members(pgid: u32, n: usize) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while members(pgid).len() < n {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the group never had {n} members"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    #[tokio::test]
    async fn a_group_is_ended_only_with_its_mark_and_also_without_its_leader() {
        let id = ExecutionId::now_v7();
        let mut other = group(&ExecutionId::now_v7().to_string());
        let pgid = other.id();
        wait_members(pgid, 2).await;
        assert_eq!(end_orphan(pgid, id, Duration::from_secs(5)).await, Orphan::Gone);
        assert_eq!(members(pgid).len(), 2, "another execution's group is left alone");
        signal_group(pgid, libc::SIGKILL);
        let _ = other.wait();

        let mut ours = group(&id.to_string());
        let pgid = ours.id();
        wait_members(pgid, 2).await;
        // The leader ends (as an agent does when its stdin closes); its tool runs on in the group.
        // SAFETY: a signal to our own child.
        unsafe { libc::kill(pgid as i32, libc::SIGKILL) };
        let _ = ours.wait();
        wait_members(pgid, 1).await;
        assert_eq!(end_orphan(pgid, id, Duration::from_secs(5)).await, Orphan::Ended);
        assert!(members(pgid).is_empty());
        assert_eq!(end_orphan(pgid, id, Duration::from_secs(5)).await, Orphan::Gone);
    }
}
