//! The replay-then-live protocol of one stream (I32): subscribe first, replay committed events after the
//! cursor, announce `ready`, then forward live events, dropping any seq already sent. A subscriber that
//! falls behind the bounded broadcast catches up from the database (events are durable), so a burst
//! costs it nothing; only when what it missed was already trimmed is it told to `reset` (and the stream
//! ends). It never skips silently.
use std::sync::Arc;
use std::time::Duration;

use sea_orm::DatabaseConnection;
use tokio::sync::{broadcast, mpsc};

use super::{Filter, Hub, after};
use crate::entity::event;

#[derive(Debug, Clone)]
pub enum Frame {
    Event(Arc<event::Model>),
    /// Replay is done; what follows is live.
    Ready,
    /// The client must reload snapshots; the stream ends after this.
    Reset(&'static str),
    KeepAlive,
}

pub struct StreamRequest {
    pub after: i64,
    pub filter: Filter,
    /// Send `Reset` at once (the cursor is evicted or from another instance).
    pub truncated: bool,
    pub keep_alive: Duration,
    /// Frames buffered towards the HTTP response before the subscriber counts as slow.
    pub buffer: usize,
}

/// Starts the stream's task and returns the frames it produces.
pub fn open(hub: Arc<Hub>, db: DatabaseConnection, req: StreamRequest) -> mpsc::Receiver<Frame> {
    let (tx, rx) = mpsc::channel(req.buffer.max(1));
    // Subscribe before replay, so nothing committed from here on can fall between the two.
    let live = hub.subscribe();
    tokio::spawn(async move {
        if req.truncated {
            let _ = tx.send(Frame::Reset("truncated")).await;
            return;
        }
        let _ = run(db, live, req, tx).await;
    });
    rx
}

async fn run(
    db: DatabaseConnection,
    mut live: broadcast::Receiver<Arc<event::Model>>,
    req: StreamRequest,
    tx: mpsc::Sender<Frame>,
) -> Result<(), ()> {
    let send = |f: Frame| {
        let tx = tx.clone();
        async move { tx.send(f).await.map_err(|_| ()) }
    };
    let mut last = req.after;
    if !replay(&db, &req.filter, &mut last, &send).await? {
        let _ = send(Frame::Reset("truncated")).await;
        return Ok(());
    }
    send(Frame::Ready).await?;
    let mut ticker = tokio::time::interval(req.keep_alive);
    ticker.tick().await;
    loop {
        tokio::select! {
            got = live.recv() => match got {
                Ok(e) => {
                    if e.seq <= last {
                        continue;
                    }
                    if e.seq > last + 1 {
                        // A hole in the broadcast: seqs are contiguous, so the events between were
                        // trimmed before the tailer published them. The database says what is left.
                        if !replay(&db, &req.filter, &mut last, &send).await? {
                            let _ = send(Frame::Reset("truncated")).await;
                            return Ok(());
                        }
                        if e.seq <= last {
                            continue;
                        }
                    }
                    last = e.seq;
                    if req.filter.admits(&e) {
                        send(Frame::Event(e)).await?;
                    }
                }
                Err(broadcast::error::RecvError::Lagged(_)) => {
                    // Behind the broadcast (a burst, or a slow reader): read what was missed from the
                    // database, unless retention already trimmed it.
                    if !replay(&db, &req.filter, &mut last, &send).await? {
                        let _ = send(Frame::Reset("slow_consumer")).await;
                        return Ok(());
                    }
                }
                Err(broadcast::error::RecvError::Closed) => return Ok(()),
            },
            _ = ticker.tick() => send(Frame::KeepAlive).await?,
            _ = tx.closed() => return Ok(()),
        }
    }
}

/// Sends every committed event after `last` that the filter admits, in pages. `last` advances over
/// every event read, admitted or not, so it is the stream's position in the one global sequence.
/// `Ok(false)`: retention trimmed events after `last`, so what follows would have a gap; nothing of
/// that page was sent.
async fn replay<F, Fut>(db: &DatabaseConnection, filter: &Filter, last: &mut i64, send: &F) -> Result<bool, ()>
where
    F: Fn(Frame) -> Fut,
    Fut: std::future::Future<Output = Result<(), ()>>,
{
    loop {
        let from = *last;
        let page = after(db, from, 500, &Filter::default())
            .await
            .map_err(|e| tracing::warn!(error = %e, "replay failed"))?;
        // Checked after the read, not before: trimming removes a prefix, so if the oldest retained event
        // is still within reach of `from` now, nothing after `from` was gone when the page was read.
        let (first_available, _) = super::bounds(db)
            .await
            .map_err(|e| tracing::warn!(error = %e, "replay failed"))?;
        if first_available > from + 1 {
            return Ok(false);
        }
        let n = page.len();
        for e in page {
            *last = e.seq;
            if filter.admits(&e) {
                send(Frame::Event(Arc::new(e))).await?;
            }
        }
        if n < 500 {
            return Ok(true);
        }
    }
}
