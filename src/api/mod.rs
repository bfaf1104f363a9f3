//! HTTP: one file per resource, thin handlers, request/response types with `ToSchema`.
pub mod agent_profiles;
pub mod cleanup_jobs;
pub mod columns;
pub mod cors;
pub mod diff;
pub mod environments;
pub mod error_code;
pub mod event_schema;
pub mod events;
pub mod examples;
pub mod extract;
pub mod forward;
pub mod git_status;
pub mod idempotency;
pub mod landing;
pub mod leftovers;
pub mod middleware;
pub mod nodes;
pub mod ops;
pub mod problem;
pub mod repositories;
pub mod reviews;
pub mod session_messages;
pub mod session_settings;
pub mod session_snapshot;
pub mod sessions;
pub mod tasks;
pub mod turns;
pub mod usage;
pub mod webhooks;
pub mod workspaces;

use std::sync::Arc;

use actix_web::{HttpResponse, web};
use serde::Deserialize;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{RefOr, Response};
use utoipa::{IntoParams, Modify, OpenApi};
use utoipa_actix_web::service_config::ServiceConfig;

use crate::auth::JwtVerifier;
use crate::domain::Ctx;
use crate::error::Error;

pub struct AppState {
    pub ctx: Ctx,
    pub verifier: Arc<JwtVerifier>,
}

/// Routes that need no token (I33). Everything else declares the bearer scheme. `/docs` and `/ui` (the
/// board's static files) are pages, not operations: neither is in the spec.
pub const PUBLIC_PATHS: [&str; 7] = [
    "/healthz",
    "/readyz",
    "/version",
    "/metrics",
    "/openapi.json",
    "/docs",
    "/ui",
];

#[derive(OpenApi)]
#[openapi(
    info(
        title = "berth",
        description = "Control plane for coding agents working in git worktrees. A task owns its environment and worktrees; sessions only use them.",
        license(name = "MIT", identifier = "MIT")
    ),
    servers((url = "/", description = "The berth serving this spec (it serves it at `/openapi.json`): paths are relative to that origin, whatever host and port a deployment listens on (`berth serve` defaults to 127.0.0.1:8080).")),
    components(schemas(problem::Problem, problem::ErrorCode, crate::error::FieldError, crate::error::ReuseCategory, crate::entity::cleanup_job::CleanupJobState, crate::entity::cleanup_job::CleanupTrigger, events::Actor)),
    modifiers(&SecurityAddon),
    tags(
        (name = "workspaces", description = "Workspaces: the tenancy boundary"),
        (name = "repositories", description = "Source repositories a workspace may use"),
        (name = "tasks", description = "Tasks: the owners of environments and worktrees"),
        (name = "environments", description = "The task-owned workspace and its worktree inventory"),
        (name = "sessions", description = "Agent conversations that use their task's environment and own nothing physical"),
        (name = "git-status", description = "The environment's current git status: one per repository, newest observation wins"),
        (name = "diffs", description = "What changed in an environment's worktrees, read without writing to them"),
        (name = "landing", description = "Commit, merge, push and open pull requests for a task's work"),
        (name = "cleanup", description = "Durable cleanup jobs: the only way berth removes files"),
        (name = "events", description = "One global event sequence: replay and a server-sent event stream"),
        (name = "webhooks", description = "Signed webhooks: durable, ordered, at-least-once delivery of the event log"),
        (name = "operations", description = "Health, readiness and metrics")
    )
)]
pub struct ApiDoc;

struct SecurityAddon;

impl Modify for SecurityAddon {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .bearer_format("JWT")
                    .build(),
            ),
        );
        // `GET /events/stream` also accepts a single-use ticket from `POST /events/tickets`.
        components.add_security_scheme(
            "ticket",
            SecurityScheme::ApiKey(utoipa::openapi::security::ApiKey::Query(
                utoipa::openapi::security::ApiKeyValue::with_description(
                    "ticket",
                    "A single-use stream ticket from `POST /api/v1/events/tickets` (for `EventSource`)",
                ),
            )),
        );
    }
}

/// A problem+json answer of the spec, for the responses added by post-processing.
fn problem(description: &str) -> RefOr<Response> {
    RefOr::T(
        utoipa::openapi::ResponseBuilder::new()
            .description(description)
            .content(
                "application/problem+json",
                utoipa::openapi::ContentBuilder::new()
                    .schema(Some(utoipa::openapi::Ref::from_schema_name("Problem")))
                    .build(),
            )
            .build(),
    )
}

/// The operations of a path, whatever their method.
pub(super) fn operations(
    item: &mut utoipa::openapi::path::PathItem,
) -> impl Iterator<Item = &mut utoipa::openapi::path::Operation> {
    [
        &mut item.get,
        &mut item.post,
        &mut item.put,
        &mut item.patch,
        &mut item.delete,
    ]
    .into_iter()
    .flatten()
}

/// Adds the answers every authenticated operation can give, so each handler lists only its own.
fn add_common_responses(openapi: &mut utoipa::openapi::OpenApi) {
    for item in openapi.paths.paths.values_mut() {
        for op in operations(item) {
            if op.security.as_ref().is_none_or(|s| s.is_empty()) {
                continue;
            }
            let has_body = op.request_body.is_some();
            let responses = &mut op.responses.responses;
            for (code, text) in [
                ("400", "Malformed request (`validation_failed`)"),
                ("401", "Missing or invalid token (`unauthenticated`)"),
                ("403", "The token lacks the scope (`insufficient_scope`)"),
                ("500", "Unexpected error (`internal`)"),
                (
                    "503",
                    "The database or git is unavailable right now; nothing changed; retry (`unavailable`)",
                ),
            ] {
                responses.entry(code.to_string()).or_insert_with(|| problem(text));
            }
            if has_body {
                for (code, text) in [
                    ("413", "The body is over `BERTH_MAX_BODY_BYTES` (`validation_failed`)"),
                    (
                        "422",
                        "A field has the wrong type or an invalid value (`validation_failed`)",
                    ),
                ] {
                    responses.entry(code.to_string()).or_insert_with(|| problem(text));
                }
            }
        }
    }
}

/// `Idempotency-Key` on every POST and DELETE under /api/v1 (issue 16; `idempotency` serves it), with the
/// answers it adds.
fn add_idempotency_key(openapi: &mut utoipa::openapi::OpenApi) {
    use utoipa::openapi::path::{ParameterBuilder, ParameterIn};
    use utoipa::openapi::{ObjectBuilder, Required, Type};
    let parameter = ParameterBuilder::new()
        .name("Idempotency-Key")
        .parameter_in(ParameterIn::Header)
        .required(Required::False)
        .description(Some(
            "Makes a retry safe: 1 to 255 visible ASCII characters, unique per request. The first final answer \
             (2xx or a non-retryable 4xx) is kept for 24 hours per token subject and key, and a repeat with the \
             same method, path, query and body gets it again (status, body, `Location`, `ETag`) with \
             `Idempotent-Replayed: true`, without running again. A retryable problem or a 5xx keeps nothing.",
        ))
        .schema(Some(
            ObjectBuilder::new()
                .schema_type(Type::String)
                .min_length(Some(1))
                .max_length(Some(255))
                .pattern(Some("^[\\x21-\\x7E]+$")),
        ))
        .example(Some(serde_json::json!("3f1c9a52-create-task-1")))
        .build();
    for (path, item) in openapi.paths.paths.iter_mut() {
        if !idempotency::covers(path) {
            continue;
        }
        for op in [&mut item.post, &mut item.delete].into_iter().flatten() {
            op.parameters
                .get_or_insert_with(Vec::new)
                .push(RefOr::T(parameter.clone()));
            for (code, text) in [
                (
                    "422",
                    "The `Idempotency-Key` was used for another method, path, query or body (`idempotency_key_reused`)",
                ),
                (
                    "409",
                    "A request with the same `Idempotency-Key` is still in progress (`conflict`, retryable)",
                ),
            ] {
                match op.responses.responses.get_mut(code) {
                    Some(RefOr::T(existing)) => {
                        existing.description = format!("{}; or: {}", existing.description, text);
                    }
                    Some(RefOr::Ref(_)) => {}
                    None => {
                        op.responses.responses.insert(code.to_string(), problem(text));
                    }
                }
            }
        }
    }
}

/// The spec as served and committed: generated from the same route table the server uses.
pub fn openapi() -> utoipa::openapi::OpenApi {
    use utoipa_actix_web::AppExt;
    let (_, mut spec) = actix_web::App::new()
        .into_utoipa_app()
        .openapi(ApiDoc::openapi())
        .configure(configure)
        .split_for_parts();
    finish_spec(&mut spec);
    spec
}

pub fn finish_spec(spec: &mut utoipa::openapi::OpenApi) {
    spec.info.version = env!("CARGO_PKG_VERSION").to_string();
    mark_public_operations(spec);
    problems_as_problem_json(spec);
    add_common_responses(spec);
    add_follow_point_header(spec);
    add_idempotency_key(spec);
    examples::add(spec);
}

/// Every error answer is problem+json: a handler declares `(status = 4xx, description = "...", body =
/// Problem)`, and this says its media type once, for all of them.
fn problems_as_problem_json(spec: &mut utoipa::openapi::OpenApi) {
    let problem = utoipa::openapi::Ref::from_schema_name("Problem");
    for item in spec.paths.paths.values_mut() {
        for op in operations(item) {
            for response in op.responses.responses.values_mut() {
                let RefOr::T(response) = response else { continue };
                let is_problem = response.content.get("application/json").is_some_and(
                    |c| matches!(c, RefOr::T(c) if matches!(&c.schema, Some(RefOr::Ref(r)) if r == &problem)),
                );
                if is_problem && response.content.len() == 1 {
                    let content = response.content.shift_remove("application/json").unwrap();
                    response.content.insert("application/problem+json".to_string(), content);
                }
            }
        }
    }
}

/// `security: []` on every operation under PUBLIC_PATHS: the spec says in so many words that they need
/// no token (I33), instead of leaving a client to guess from a missing field.
fn mark_public_operations(spec: &mut utoipa::openapi::OpenApi) {
    for (path, item) in spec.paths.paths.iter_mut() {
        if !PUBLIC_PATHS.contains(&path.as_str()) {
            continue;
        }
        for op in operations(item) {
            op.security = Some(Vec::new());
        }
    }
}

/// Issue 16, item 3: every successful GET under `/api/v1` carries `X-Berth-Seq` (the `follow_point`
/// middleware sets it for all of them, so the spec says so for all of them here).
fn add_follow_point_header(openapi: &mut utoipa::openapi::OpenApi) {
    use utoipa::openapi::schema::{ObjectBuilder, Type};
    let header = utoipa::openapi::HeaderBuilder::new()
        .schema(Some(ObjectBuilder::new().schema_type(Type::Integer).format(Some(
            utoipa::openapi::SchemaFormat::KnownFormat(utoipa::openapi::KnownFormat::Int64),
        ))))
        .description(Some(
            "Every event with `seq` up to this is reflected in the response: follow with \
             `GET /api/v1/events/stream?after=<X-Berth-Seq>` to miss nothing",
        ))
        .build();
    for (path, item) in openapi.paths.paths.iter_mut() {
        let Some(op) = item.get.as_mut().filter(|_| path.starts_with("/api/v1/")) else {
            continue;
        };
        for (code, response) in op.responses.responses.iter_mut() {
            if let (true, RefOr::T(response)) = (code.starts_with('2'), response) {
                response
                    .headers
                    .insert("X-Berth-Seq".to_string(), RefOr::T(header.clone()));
            }
        }
    }
}

/// Every route. `startup` and `openapi()` both build from this, so the spec cannot miss a route.
pub fn configure(cfg: &mut ServiceConfig) {
    cfg.service(ops::healthz)
        .service(ops::readyz)
        .service(ops::version)
        .service(ops::metrics)
        .service(
            utoipa_actix_web::scope("/api/v1")
                .configure(workspaces::routes)
                .configure(repositories::routes)
                .configure(tasks::routes)
                .configure(environments::routes)
                .configure(sessions::routes)
                .configure(session_messages::routes)
                .configure(session_snapshot::routes)
                .configure(session_settings::routes)
                .configure(events::routes)
                .configure(agent_profiles::routes)
                .configure(cleanup_jobs::routes)
                .configure(leftovers::routes)
                .configure(nodes::routes)
                .configure(git_status::routes)
                .configure(diff::routes)
                .configure(columns::routes)
                .configure(turns::routes)
                .configure(reviews::routes)
                .configure(landing::routes)
                .configure(usage::routes)
                .configure(webhooks::routes),
        );
}

/// `?limit=&cursor=` on every list.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct PageQuery {
    /// Page size, 1 to 500 (default 50).
    #[param(minimum = 1, maximum = 500)]
    pub limit: Option<u64>,
    /// The `next_cursor` of the previous page.
    pub cursor: Option<String>,
}

impl PageQuery {
    pub fn page(&self) -> Result<crate::domain::pagination::PageRequest, Error> {
        crate::domain::pagination::PageRequest::parse(self.limit, self.cursor.as_deref())
    }
}

/// `201 Created` with a `Location` header.
pub fn created<T: serde::Serialize>(location: String, body: &T) -> HttpResponse {
    HttpResponse::Created()
        .insert_header((actix_web::http::header::LOCATION, location))
        .json(body)
}

/// Puts a resource's `ETag` (its row version, issue 16) on an answer.
pub fn tagged(mut res: HttpResponse, etag: &str) -> HttpResponse {
    if let Ok(value) = actix_web::http::header::HeaderValue::from_str(etag) {
        res.headers_mut().insert(actix_web::http::header::ETAG, value);
    }
    res
}

/// `200 OK` with a JSON body and the resource's `ETag`.
pub fn ok_tagged<T: serde::Serialize>(etag: &str, body: &T) -> HttpResponse {
    tagged(HttpResponse::Ok().json(body), etag)
}

/// Unmatched routes answer problem+json too, never an empty or HTML page.
pub async fn not_found() -> Result<HttpResponse, Error> {
    Err(Error::NotFound("route"))
}

pub fn data(state: AppState) -> web::Data<AppState> {
    web::Data::new(state)
}
