//! Request ids (echoed or generated, on every response and log line) and request metrics.
use std::time::Instant;

use actix_web::body::MessageBody;
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::header::{HeaderName, HeaderValue};
use actix_web::middleware::Next;
use actix_web::{Error, HttpMessage, web};
use tracing_actix_web::{DefaultRootSpanBuilder, RootSpanBuilder};

use super::AppState;

pub const REQUEST_ID_HEADER: &str = "x-request-id";

#[derive(Clone, Debug)]
pub struct RequestId(pub String);

tokio::task_local! {
    static REQUEST_ID: String;
}

/// The id of the request being served, for problem bodies.
pub fn current_request_id() -> Option<String> {
    REQUEST_ID.try_with(|id| id.clone()).ok()
}

/// Runs `fut` with the request id of the request being served (for work moved to another task).
pub async fn with_request_id<F: std::future::Future>(id: Option<String>, fut: F) -> F::Output {
    match id {
        Some(id) => REQUEST_ID.scope(id, fut).await,
        None => fut.await,
    }
}

/// Accepts a caller's id if it is short printable ASCII; otherwise makes one.
fn request_id_for(req: &ServiceRequest) -> String {
    req.headers()
        .get(REQUEST_ID_HEADER)
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty() && v.len() <= 128 && v.bytes().all(|b| b.is_ascii_graphic()))
        .map(str::to_string)
        .unwrap_or_else(|| uuid::Uuid::now_v7().to_string())
}

/// Outermost middleware: sets the request id before logging starts, records metrics after the response.
pub async fn request_id_and_metrics(
    req: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<impl MessageBody + 'static>, Error> {
    let id = request_id_for(&req);
    req.extensions_mut().insert(RequestId(id.clone()));
    let state = req.app_data::<web::Data<AppState>>().cloned();
    let method = req.method().clone();
    let started = Instant::now();
    let mut res = REQUEST_ID.scope(id.clone(), next.call(req)).await?;
    if let Ok(value) = HeaderValue::from_str(&id) {
        res.headers_mut()
            .insert(HeaderName::from_static(REQUEST_ID_HEADER), value);
    }
    if let Some(state) = state {
        let route = res.request().match_pattern().unwrap_or_else(|| "unmatched".to_string());
        state
            .metrics
            .observe(method.as_str(), &route, res.status().as_u16(), started.elapsed());
    }
    Ok(res)
}

/// Puts our request id (not tracing-actix-web's own) on the root span of every request.
pub struct BerthRootSpan;

impl RootSpanBuilder for BerthRootSpan {
    fn on_request_start(request: &ServiceRequest) -> tracing::Span {
        let id = request
            .extensions()
            .get::<RequestId>()
            .map(|r| r.0.clone())
            .unwrap_or_default();
        tracing_actix_web::root_span!(request, request_id = %id)
    }

    fn on_request_end<B: MessageBody>(span: tracing::Span, outcome: &Result<ServiceResponse<B>, Error>) {
        DefaultRootSpanBuilder::on_request_end(span, outcome);
    }
}

/// NUL is not text: PostgreSQL cannot store it and SQLite would, so both refuse it here, in one place,
/// before any handler runs (a 422 that changed nothing). Bodies are checked when their length is known
/// and within the body limit (larger ones get their 413 from the JSON extractor); query strings always.
pub async fn reject_nul_text(
    mut req: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<impl MessageBody + 'static>, Error> {
    use crate::error::Error as DomainError;
    if req.query_string().contains("%00") {
        // A malformed query is a 400, as every other query the server cannot use.
        return Err(DomainError::BadRequest("the query must not contain NUL characters".into()).into());
    }
    let limit = req
        .app_data::<web::Data<AppState>>()
        .map(|s| s.ctx.config.max_body_bytes)
        .unwrap_or(0);
    let length = req
        .headers()
        .get(actix_web::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if let Some(n) = length
        && n > 0
        && n <= limit
    {
        let body = req.extract::<web::Bytes>().await?;
        // Only JSON can smuggle NUL (as `\u0000`); what does not parse is the extractor's to refuse.
        if let Ok(value) = serde_json::from_slice::<serde_json::Value>(&body)
            && holds_nul(&value)
        {
            return Err(DomainError::invalid("body", "text must not contain NUL (\\u0000) characters").into());
        }
        req.set_payload(actix_web::dev::Payload::from(body));
    }
    next.call(req).await
}

fn holds_nul(v: &serde_json::Value) -> bool {
    match v {
        serde_json::Value::String(s) => s.contains('\0'),
        serde_json::Value::Array(items) => items.iter().any(holds_nul),
        serde_json::Value::Object(map) => map.iter().any(|(k, v)| k.contains('\0') || holds_nul(v)),
        _ => false,
    }
}
