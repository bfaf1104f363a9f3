//! A git read whose output is handed over as it comes (a diff): berth never holds more of it than the
//! reader keeps. Same rules as every call: a slot under the process-wide cap, the timeout, the hardened
//! environment, no optional lock.
use std::path::Path;
use tokio::io::AsyncReadExt;

use super::{GitCli, GitError};
use crate::metrics::GitOutcome;

/// How much of git's output is read at once.
const CHUNK: usize = 64 * 1024;
/// The most of git's stderr kept (for the error).
const STDERR_KEPT: usize = 64 * 1024;

impl GitCli {
    pub(super) async fn stream_bytes(
        &self,
        op: &'static str,
        repo: &Path,
        args: &[&str],
        envs: &[(&str, &std::ffi::OsStr)],
        sink: &mut (dyn for<'b> FnMut(&'b [u8]) + Send),
    ) -> Result<(), GitError> {
        let _slot = self.slots.acquire().await.expect("the semaphore is never closed");
        let mut cmd = super::command(repo, args, envs);
        cmd.env("GIT_OPTIONAL_LOCKS", "0");
        let started = std::time::Instant::now();
        let run = async {
            let mut child = cmd.spawn()?;
            let mut stdout = child.stdout.take().expect("piped stdout");
            let mut stderr = child.stderr.take().expect("piped stderr");
            let errors = tokio::spawn(async move {
                let mut kept = Vec::new();
                let mut buf = [0u8; 4096];
                while let Ok(n) = stderr.read(&mut buf).await {
                    if n == 0 {
                        break;
                    }
                    let room = STDERR_KEPT.saturating_sub(kept.len());
                    kept.extend_from_slice(&buf[..n.min(room)]);
                }
                kept
            });
            let mut buf = vec![0u8; CHUNK];
            loop {
                let n = stdout.read(&mut buf).await?;
                if n == 0 {
                    break;
                }
                sink(&buf[..n]);
            }
            let status = child.wait().await?;
            let stderr = errors.await.unwrap_or_default();
            Ok::<_, std::io::Error>((status, stderr))
        };
        let out = tokio::time::timeout(self.timeout, run).await;
        if let Some(m) = &self.metrics {
            let outcome = match &out {
                Err(_) => GitOutcome::Timeout,
                Ok(Ok((s, _))) if s.success() => GitOutcome::Ok,
                Ok(_) => GitOutcome::Failed,
            };
            m.git_command(op, started.elapsed(), outcome);
        }
        let (status, stderr) = out.map_err(|_| GitError::Timeout {
            op,
            secs: self.timeout.as_secs(),
        })??;
        if status.success() {
            Ok(())
        } else {
            let stderr = String::from_utf8_lossy(&stderr).trim().chars().take(2000).collect();
            Err(GitError::Failed { op, stderr })
        }
    }
}
