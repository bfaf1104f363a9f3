//! Request ids (echoed or generated, on every response and log line) and request metrics.
use std::time::Instant;

use actix_web::body::MessageBody;
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::header::{HeaderName, HeaderValue};
use actix_web::middleware::Next;
use actix_web::{Error, HttpMessage, web};
use tracing_actix_web::RootSpanBuilder;

use super::AppState;

pub const REQUEST_ID_HEADER: &str = "x-request-id";

#[derive(Clone, Debug)]
pub struct RequestId(pub String);

/// The route pattern the request matched (`/api/v1/tasks/{id}`), `None` for no route: matched once,
/// by the outermost middleware, for both the log span and the metrics (matching runs the router's
/// regular expressions again).
#[derive(Clone, Debug)]
pub struct RoutePattern(pub Option<String>);

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
    let route = req.match_pattern();
    req.extensions_mut().insert(RequestId(id.clone()));
    req.extensions_mut().insert(RoutePattern(route.clone()));
    let state = req.app_data::<web::Data<AppState>>().cloned();
    let method = req.method().clone();
    let started = Instant::now();
    // The actor slot wraps everything below: authentication fills it.
    let mut res = REQUEST_ID
        .scope(
            id.clone(),
            crate::actor::request_scope(crate::events::written::request_scope(next.call(req))),
        )
        .await?;
    if let Ok(value) = HeaderValue::from_str(&id) {
        res.headers_mut()
            .insert(HeaderName::from_static(REQUEST_ID_HEADER), value);
    }
    if let Some(state) = state {
        let route = route.unwrap_or_else(|| "unmatched".to_string());
        state
            .ctx
            .metrics
            .observe(method.as_str(), route, res.status().as_u16(), started.elapsed());
    }
    Ok(res)
}

/// The root span of every request: the request's method, route, redacted target, client address, user
/// agent and request id (ours, not tracing-actix-web's), then its status, the actor once authentication
/// proved one, and for an error its message. Its `root_span!` records the raw query as `http.target`,
/// which would put a stream ticket (`?ticket=`) in every log line of that request; so the span is built
/// here. berth exports no OpenTelemetry spans, so the `otel.*`, flavor, scheme and host fields of the
/// default span are left out: every field is formatted for every request (issue 19 item 3).
pub struct BerthRootSpan;

impl RootSpanBuilder for BerthRootSpan {
    fn on_request_start(request: &ServiceRequest) -> tracing::Span {
        // Before the extensions are borrowed: the connection info is cached in them.
        let client_ip = request.connection_info().realip_remote_addr().map(str::to_string);
        let extensions = request.extensions();
        let id = extensions.get::<RequestId>().map_or("", |r| r.0.as_str());
        let route = match extensions.get::<RoutePattern>() {
            Some(RoutePattern(route)) => route.as_deref().unwrap_or("default"),
            None => "default",
        };
        let user_agent = request
            .headers()
            .get("User-Agent")
            .and_then(|h| h.to_str().ok())
            .unwrap_or("");
        tracing::info_span!(
            "HTTP request",
            http.method = %request.method(),
            http.route = %route,
            http.target = %redacted_target(request.uri()),
            http.client_ip = %client_ip.as_deref().unwrap_or(""),
            http.user_agent = %user_agent,
            http.status_code = tracing::field::Empty,
            request_id = %id,
            actor = tracing::field::Empty,
            actor_session_id = tracing::field::Empty,
            exception.message = tracing::field::Empty,
            exception.details = tracing::field::Empty,
        )
    }

    fn on_request_end<B: MessageBody>(span: tracing::Span, outcome: &Result<ServiceResponse<B>, Error>) {
        // The access log: one line per request, inside its span. The only line of a refused request.
        // `RUST_LOG=berth::access=warn` silences it.
        let (status, error) = match outcome {
            Ok(res) => (res.status(), res.response().error().map(|e| e.as_response_error())),
            Err(e) => (e.as_response_error().status_code(), Some(e.as_response_error())),
        };
        if let Some(error) = error {
            span.record("exception.message", tracing::field::display(error));
            span.record("exception.details", tracing::field::debug(error));
        }
        let status = status.as_u16();
        span.record("http.status_code", status);
        span.in_scope(|| tracing::info!(target: "berth::access", status, "request finished"));
    }
}

/// Query parameters whose values are credentials: never logged.
const SECRET_PARAMS: [&str; 1] = ["ticket"];

/// The path and query of `uri` with the value of every secret parameter replaced by `[redacted]`. A name
/// is compared after percent-decoding, as the query extractor decodes it.
pub fn redacted_target(uri: &actix_web::http::Uri) -> String {
    let Some(query) = uri.query() else {
        return uri.path().to_string();
    };
    let pairs: Vec<String> = query
        .split('&')
        .map(|pair| {
            let name = pair.split('=').next().unwrap_or("");
            if SECRET_PARAMS
                .iter()
                .any(|s| percent_decoded(name).eq_ignore_ascii_case(s))
            {
                format!("{name}=[redacted]")
            } else {
                pair.to_string()
            }
        })
        .collect();
    format!("{}?{}", uri.path(), pairs.join("&"))
}

fn percent_decoded(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                match std::str::from_utf8(&bytes[i + 1..i + 3])
                    .ok()
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
                {
                    Some(b) => {
                        out.push(b);
                        i += 2;
                    }
                    None => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

pub const SEQ_HEADER: &str = "x-berth-seq";

/// The follow point (issue 16, item 3). Before the handler runs: the in-process tailer's last published
/// seq, put in the request's extensions for list handlers (`extract::FollowPoint`). It is a lower bound
/// of what the handler's queries will see, without a query of its own: the tailer publishes seq N only
/// after reading it as committed, and seq order is commit order (I32), so every event up to N committed
/// before this request read N. After: `X-Berth-Seq` on every successful GET under `/api/v1`.
pub async fn follow_point(
    req: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<impl MessageBody + 'static>, Error> {
    let api = req.path().starts_with("/api/v1/");
    let point = match req.app_data::<web::Data<AppState>>() {
        Some(state) if api => Some(state.ctx.events.published()),
        _ => None,
    };
    if let Some(seq) = point {
        req.extensions_mut().insert(super::extract::FollowPoint(seq));
    }
    let get = req.method() == actix_web::http::Method::GET;
    let mut res = next.call(req).await?;
    if let Some(seq) = point
        && get
        && res.status().is_success()
    {
        res.headers_mut()
            .insert(HeaderName::from_static(SEQ_HEADER), HeaderValue::from(seq));
    }
    Ok(res)
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

#[cfg(test)]
mod tests {
    use super::redacted_target;

    #[test]
    fn ticket_values_never_reach_the_log_target() {
        for (uri, want) in [
            ("/api/v1/events/stream", "/api/v1/events/stream"),
            (
                "/api/v1/events/stream?ticket=abc&after=3",
                "/api/v1/events/stream?ticket=[redacted]&after=3",
            ),
            ("/x?after=3&ticket=abc", "/x?after=3&ticket=[redacted]"),
            ("/x?ticke%74=abc", "/x?ticke%74=[redacted]"),
            ("/x?TICKET=abc&ticket", "/x?TICKET=[redacted]&ticket=[redacted]"),
            ("/x?tickets=abc", "/x?tickets=abc"),
        ] {
            assert_eq!(redacted_target(&uri.parse().unwrap()), want, "{uri}");
        }
    }
}
