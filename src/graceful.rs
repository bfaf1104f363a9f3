//! `berth serve` until SIGTERM or SIGINT, then a clean shutdown within `BERTH_SHUTDOWN_SECS`, in order:
//! the HTTP server stops accepting and every event stream gets its last frame (`event: shutdown`) and
//! ends; requests in flight get a quarter of the budget; the agents are stopped with the I28 escalation
//! cut to fit what is left; the process exits. Sessions keep `desired_open`, so the next start restores
//! them (I29).
use tokio::signal::unix::{Signal, SignalKind, signal};
use tokio::time::Instant;

use crate::shutdown::Plan;
use crate::startup::Application;

/// SIGTERM and SIGINT, taken from their default action (which ends the process at once) as early as
/// possible: one that arrives while the server is still starting begins the shutdown once it has.
pub struct Signals {
    term: Signal,
    int: Signal,
}

impl Signals {
    pub fn listen() -> std::io::Result<Signals> {
        Ok(Signals {
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
        })
    }

    async fn next(&mut self) -> &'static str {
        tokio::select! {
            _ = self.term.recv() => "SIGTERM",
            _ = self.int.recv() => "SIGINT",
        }
    }
}

/// Serves until a signal (or `Ctx::shutdown` begun by other code, or the server stopping on its own),
/// then shuts down as the module says.
pub async fn serve(app: Application, mut signals: Signals) -> anyhow::Result<()> {
    let ctx = app.state.ctx.clone();
    let mut server = tokio::spawn(app.run_until_stopped());
    let mut served = None;
    let why = tokio::select! {
        why = signals.next() => why,
        _ = ctx.shutdown.begun() => "requested",
        r = &mut server => {
            served = Some(r);
            "the HTTP server stopped"
        }
    };
    let budget = ctx.config.shutdown_budget;
    let plan = Plan::new(budget, Instant::now());
    tracing::info!(reason = why, budget_secs = budget.as_secs(), "shutting down");
    // Streams send `event: shutdown` and end; the HTTP server stops accepting and drains (its stop signal).
    ctx.shutdown.begin();
    let served = match served {
        Some(r) => Some(r),
        None => match tokio::time::timeout_at(plan.drain_until, &mut server).await {
            Ok(r) => Some(r),
            Err(_) => {
                tracing::warn!("requests still in flight after the drain; stopping the agents");
                None
            }
        },
    };
    ctx.runtime.stop_all_by(plan.agents_until).await;
    // The lease goes back at once; a live instance of this node takes over the open sessions.
    crate::domain::nodes::lease::give_back(&ctx).await;
    crate::domain::webhooks::deliver::give_back(&ctx).await;
    let left = plan.exit_by.saturating_duration_since(Instant::now());
    tracing::info!(left_ms = left.as_millis() as u64, "shut down");
    match served {
        Some(Ok(Err(e))) => Err(e.into()),
        Some(Err(e)) => Err(anyhow::anyhow!("the HTTP server failed: {e}")),
        _ => Ok(()),
    }
}
