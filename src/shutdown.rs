//! The server's shutdown: one token that event streams and the HTTP server watch, and how
//! `BERTH_SHUTDOWN_SECS` is shared out between the steps (`graceful` runs them).
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

/// Begun once, never reset: streams send their last frame and end, the HTTP server stops accepting.
#[derive(Clone)]
pub struct Shutdown(Arc<watch::Sender<bool>>);

impl Default for Shutdown {
    fn default() -> Self {
        Shutdown(Arc::new(watch::channel(false).0))
    }
}

impl Shutdown {
    pub fn begin(&self) {
        self.0.send_replace(true);
    }

    pub fn is_begun(&self) -> bool {
        *self.0.borrow()
    }

    /// Resolves once the shutdown has begun (at once if it has).
    pub async fn begun(&self) {
        let mut rx = self.0.subscribe();
        let _ = rx.wait_for(|begun| *begun).await;
    }

    /// `begun` as an owned future, for the HTTP server's stop signal.
    pub fn begun_owned(&self) -> impl Future<Output = ()> + Send + 'static {
        let this = self.clone();
        async move { this.begun().await }
    }
}

/// The budget shared out, from the moment the shutdown began: the HTTP drain (streams end at once; other
/// requests in flight get a quarter), then the agents' escalation, then a little for the exit itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Plan {
    pub drain_until: Instant,
    pub agents_until: Instant,
    pub exit_by: Instant,
}

impl Plan {
    pub fn new(budget: Duration, begun: Instant) -> Plan {
        let exit_by = begun + budget;
        Plan {
            drain_until: begun + drain(budget),
            agents_until: exit_by - (budget / 10).min(Duration::from_secs(1)),
            exit_by,
        }
    }
}

/// The HTTP drain: a quarter of the budget.
pub fn drain(budget: Duration) -> Duration {
    budget / 4
}

/// actix counts its own drain in whole seconds: rounded up, as a backstop behind `Plan::drain_until`.
pub fn drain_secs(budget: Duration) -> u64 {
    drain(budget).as_secs_f64().ceil().max(1.0) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_steps_fit_the_budget_in_order() {
        let t0 = Instant::now();
        for secs in [1, 4, 20, 600] {
            let budget = Duration::from_secs(secs);
            let p = Plan::new(budget, t0);
            assert!(t0 < p.drain_until && p.drain_until < p.agents_until && p.agents_until < p.exit_by);
            assert_eq!(p.exit_by - t0, budget);
            assert!(p.exit_by - p.agents_until <= Duration::from_secs(1));
        }
        let p = Plan::new(Duration::from_secs(20), t0);
        assert_eq!(p.drain_until - t0, Duration::from_secs(5));
        assert_eq!(p.agents_until - t0, Duration::from_secs(19));
        assert_eq!(drain_secs(Duration::from_secs(20)), 5);
        assert_eq!(drain_secs(Duration::from_secs(4)), 1);
        assert_eq!(drain_secs(Duration::from_secs(1)), 1);
    }

    #[tokio::test]
    async fn begun_resolves_for_waiters_before_and_after() {
        let s = Shutdown::default();
        let early = tokio::spawn(s.begun_owned());
        assert!(!s.is_begun());
        s.begin();
        early.await.unwrap();
        tokio::time::timeout(Duration::from_secs(1), s.begun()).await.unwrap();
        assert!(s.is_begun());
    }
}
