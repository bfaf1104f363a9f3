//! Building the application: the same function serves `berth serve` and every integration test.
use std::net::TcpListener;
use std::sync::Arc;

use actix_web::middleware::from_fn;
use actix_web::{App, HttpServer, web};
use tracing_actix_web::TracingLogger;
use utoipa::OpenApi;
use utoipa_actix_web::AppExt;
use utoipa_swagger_ui::SwaggerUi;

use crate::api::middleware::{BerthRootSpan, follow_point, reject_nul_text, request_id_and_metrics};
use crate::api::{self, ApiDoc, AppState, problem};
use crate::auth::JwtVerifier;
use crate::config::Config;
use crate::domain::Ctx;
use crate::git::cli::GitCli;
use crate::metrics::Metrics;
use crate::store::Db;
use crate::store::migrate::{self, MigrateOutcome};

pub struct Application {
    port: u16,
    server: actix_web::dev::Server,
    pub state: web::Data<AppState>,
    /// The tailer, listener and sweeps: they run until the process ends or `stop_background` is called.
    background: Vec<tokio::task::AbortHandle>,
}

/// Connects and migrates; nothing else runs before the schema is committed (I35).
pub async fn open_database(config: &Config) -> anyhow::Result<(Db, MigrateOutcome)> {
    open_database_with(config, config.db_max_connections).await
}

/// The HTTP worker threads this process runs.
fn http_workers() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

async fn open_database_with(config: &Config, connections: u32) -> anyhow::Result<(Db, MigrateOutcome)> {
    // SQLite can answer "database is locked" while opening, without waiting out the busy timeout (the
    // switch to WAL needs a moment alone with the file while another process migrates it): tried again
    // until the migration lock's timeout.
    let deadline = std::time::Instant::now() + config.migration_lock_timeout;
    let db = loop {
        match Db::connect(&config.database_url, connections).await {
            Ok(db) => break db,
            Err(e) if e.to_string().contains("database is locked") && std::time::Instant::now() < deadline => {
                tracing::debug!(error = %e, "the database is locked while opening; trying again");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
            Err(e) => return Err(anyhow::anyhow!("cannot open the database: {e}")),
        }
    };
    let outcome = migrate::migrate(&db, &config.data_dir, config.migration_lock_timeout).await?;
    if let MigrateOutcome::Applied { versions, backup } = &outcome {
        tracing::info!(?versions, backup = ?backup, "applied migrations");
    }
    Ok((db, outcome))
}

impl Application {
    pub async fn build(config: Config) -> anyhow::Result<Application> {
        // One bound on this process's connections, whatever the core count.
        let workers = http_workers();
        let pools = crate::store::PoolPlan::new(
            config.db_max_connections,
            workers,
            config.database_url.starts_with("postgres"),
        );
        let (db, _) = open_database_with(&config, pools.shared).await?;
        let verifier = Arc::new(JwtVerifier::from_config(&config)?);
        // An identity provider's key set is read before serving; if it is unreachable, requests read it.
        verifier.warm_up().await;
        let listener =
            TcpListener::bind(config.bind).map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", config.bind))?;
        let port = listener.local_addr()?.port();
        let max_body = config.max_body_bytes;
        let instance_id = crate::ids::InstanceId::now_v7();
        let metrics = Arc::new(Metrics::for_instance(&config.node_id, instance_id));
        let boxes = crate::runtime::sandbox::Boxes::from_config(&config, Some(metrics.clone()));
        let (runtime, runtime_reports) = crate::runtime::Runtime::new(
            config.agent_stop_grace,
            config.agent_term_grace,
            boxes,
            crate::runtime::Limits {
                requests_in_flight: config.agent_max_requests_in_flight,
                queue_bytes: config.agent_stdin_queue_max_bytes,
            },
        );
        let state = api::data(AppState {
            ctx: Ctx {
                db,
                runtime: runtime.clone(),
                cleanup_wake: Arc::new(tokio::sync::Notify::new()),
                writers: Arc::new(tokio::sync::Notify::new()),
                metrics: metrics.clone(),
                git_status_inspected: Default::default(),
                restore_stats: Default::default(),
                materializing: Default::default(),
                nodes: Default::default(),
                shutdown: Default::default(),
                events: crate::events::Hub::new(config.event_buffer),
                git: Arc::new(GitCli::new(config.git_max_concurrent, config.git_timeout).with_metrics(metrics)),
                config: Arc::new(config),
                instance_id,
            },
            verifier,
        });
        let ctx = state.ctx.clone();
        ctx.events.start_at_current(&ctx.db.conn).await?;
        // Counted before any worker or request can move a job, so no transition races the first count.
        ctx.metrics
            .set_cleanup_jobs(&crate::store::cleanup_jobs::count_by_state(&ctx.db.conn).await?);
        // Subscribed before the tailer runs, so it sees every event the tailer publishes.
        let published = ctx.events.subscribe();
        let mut background = vec![
            tokio::spawn(ctx.events.clone().tail(ctx.db.conn.clone(), ctx.config.event_poll)).abort_handle(),
            tokio::spawn(crate::worker::sweep(ctx.clone(), ctx.config.sweep_interval)).abort_handle(),
        ];
        background.push(tokio::spawn(crate::domain::sessions::consume(ctx.clone(), runtime_reports)).abort_handle());
        background.push(tokio::spawn(observe_events(ctx.metrics.clone(), published)).abort_handle());
        background.push(tokio::spawn(count_cleanup_jobs(ctx.clone())).abort_handle());
        // This process is an instance of its node, holding a lease, before it judges any other
        // instance's work (restore leaves a live sibling's agents alone).
        crate::domain::nodes::lease::register(&ctx, port)
            .await
            .map_err(|e| anyhow::anyhow!("recording this instance: {e}"))?;
        background.push(tokio::spawn(crate::domain::nodes::lease::hold(ctx.clone())).abort_handle());
        background.push(tokio::spawn(crate::domain::landing::pull_requests::poll(ctx.clone())).abort_handle());
        background.push(tokio::spawn(crate::domain::webhooks::deliver::run(ctx.clone())).abort_handle());
        // What other replicas route to the agents this node runs.
        background.push(tokio::spawn(crate::domain::sessions::serve_routed(ctx.clone())).abort_handle());
        // Agents a gone instance of this node left are ended before any job may touch a worktree.
        crate::domain::sessions::end_orphans(&ctx)
            .await
            .map_err(|e| anyhow::anyhow!("ending agents a previous instance left: {e}"))?;
        // I35: workers start only now, after the schema committed.
        background.extend(crate::worker::cleanup::start(&ctx));
        // I29: sessions that were open are relaunched through admission before the server serves.
        let restored = crate::domain::sessions::restore(&ctx)
            .await
            .map_err(|e| anyhow::anyhow!("restoring sessions: {e}"))?;
        if restored > 0 {
            tracing::info!(restored, "relaunched open sessions");
        }
        match crate::domain::environments::recover_abandoned(&ctx).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(recovered = n, "took over materializations a previous process abandoned"),
            Err(e) => tracing::warn!(error = %e, "recovering abandoned materializations failed"),
        }
        // Sessions created `preparing` whose preparation a stopped process did not finish: resumed.
        match crate::domain::sessions::resume_preparing(&ctx).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(resumed = n, "resumed preparing sessions"),
            Err(e) => tracing::warn!(error = %e, "resuming preparing sessions failed"),
        }
        if ctx.runtime.live_count() >= 6 {
            tracing::warn!(
                open = ctx.runtime.live_count(),
                "six or more agents are open; expect contention"
            );
        }
        if !ctx.db.is_sqlite() {
            background.push(
                tokio::spawn(crate::events::listen_postgres(ctx.events.clone(), ctx.db.conn.clone())).abort_handle(),
            );
            // Events are stamped by whichever replica leads (this one, or another).
            background.push(
                tokio::spawn(crate::events::sequencer::run(
                    ctx.events.clone(),
                    ctx.db.conn.clone(),
                    ctx.config.event_poll,
                    ctx.metrics.clone(),
                ))
                .abort_handle(),
            );
            background.push(
                tokio::spawn(crate::events::sequencer::herald(
                    ctx.events.clone(),
                    ctx.db.conn.clone(),
                ))
                .abort_handle(),
            );
        }
        let app_state = state.clone();
        let server = HttpServer::new(move || {
            let (app, mut spec) = App::new()
                .into_utoipa_app()
                .openapi(ApiDoc::openapi())
                .app_data(worker_state(&app_state, pools.per_worker))
                .app_data(
                    web::JsonConfig::default()
                        .limit(max_body)
                        .content_type_required(false)
                        .error_handler(move |err, req| problem::json_error(err, req, max_body)),
                )
                .app_data(web::PayloadConfig::default().limit(max_body))
                .app_data(web::PathConfig::default().error_handler(problem::path_error))
                .app_data(web::QueryConfig::default().error_handler(problem::query_error))
                .configure(api::configure)
                .split_for_parts();
            api::finish_spec(&mut spec);
            app.configure(crate::ui::routes)
                .service(web::redirect("/docs", "/docs/"))
                .service(
                    SwaggerUi::new("/docs/{_:.*}")
                        .url("/openapi.json", spec)
                        // The default validator is an online service: the docs page must work offline.
                        .config(utoipa_swagger_ui::Config::default().validator_url("none")),
                )
                .default_service(web::to(api::not_found))
                // Innermost, so the replica that took the request keeps its idempotency.
                .wrap(from_fn(crate::api::forward::forward))
                .wrap(from_fn(follow_point))
                .wrap(from_fn(crate::api::idempotency::idempotency))
                .wrap(from_fn(reject_nul_text))
                .wrap(from_fn(crate::api::cors::cors))
                .wrap(TracingLogger::<BerthRootSpan>::new())
                .wrap(from_fn(request_id_and_metrics))
        })
        .workers(workers)
        .listen(listener)?
        // Berth's own shutdown (`graceful`) stops the server, within its budget.
        .shutdown_signal(ctx.shutdown.begun_owned())
        .shutdown_timeout(crate::shutdown::drain_secs(ctx.config.shutdown_budget))
        .run();
        Ok(Application {
            port,
            server,
            state,
            background,
        })
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub async fn run_until_stopped(self) -> std::io::Result<()> {
        self.server.await
    }

    pub fn handle(&self) -> actix_web::dev::ServerHandle {
        self.server.handle()
    }

    /// Handles to stop the background tasks (tests stop them with the server).
    pub fn background(&self) -> Vec<tokio::task::AbortHandle> {
        self.background.clone()
    }
}

/// The state one HTTP worker thread serves with (its factory runs on that thread, in its runtime). On
/// PostgreSQL, when the connection budget allows (`PoolPlan`), its requests query through a pool of its own, opened lazily on this thread's runtime, so
/// each round trip is driven by the thread that awaits it (`Db::connect_lazy_postgres`); everything else
/// is shared. SQLite's driver runs each connection on a thread of its own anyway: one pool.
fn worker_state(shared: &web::Data<AppState>, per_worker: Option<u32>) -> web::Data<AppState> {
    let Some(connections) = per_worker.filter(|_| !shared.ctx.db.is_sqlite()) else {
        return shared.clone();
    };
    let config = &shared.ctx.config;
    match Db::connect_lazy_postgres(&config.database_url, connections) {
        Ok(db) => api::data(AppState {
            ctx: Ctx {
                db,
                ..shared.ctx.clone()
            },
            verifier: shared.verifier.clone(),
        }),
        Err(e) => {
            tracing::warn!(error = %e, "cannot make an HTTP worker's pool; it uses the shared one");
            shared.clone()
        }
    }
}

/// `berth_event_publish_lag_seconds`: how long after its commit each event reached the streams.
async fn observe_events(
    metrics: Arc<Metrics>,
    mut published: tokio::sync::broadcast::Receiver<Arc<crate::entity::event::Model>>,
) {
    use tokio::sync::broadcast::error::RecvError;
    loop {
        match published.recv().await {
            Ok(e) => metrics.event_published((crate::clock::now() - e.created_at).to_std().unwrap_or_default()),
            Err(RecvError::Lagged(_)) => continue,
            Err(RecvError::Closed) => return,
        }
    }
}

/// `berth_cleanup_jobs`: counted once at start, then moved by every transition this process makes, and
/// counted again every sweep interval to take in what other replicas (and rolled-back transactions) did.
async fn count_cleanup_jobs(ctx: Ctx) {
    let mut every = tokio::time::interval(ctx.config.sweep_interval);
    every.tick().await; // the first tick is at once: `build` has just counted.
    loop {
        every.tick().await;
        match crate::store::cleanup_jobs::count_by_state(&ctx.db.conn).await {
            Ok(by_state) => ctx.metrics.set_cleanup_jobs(&by_state),
            Err(e) => tracing::warn!(error = %e, "counting cleanup jobs for the metrics failed"),
        }
    }
}
