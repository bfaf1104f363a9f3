//! CORS: pages on the origins in `BERTH_CORS_ORIGINS` (exact matches) may call the API. A preflight from
//! one answers 204 here; every response to one carries `Access-Control-Allow-Origin` and exposes berth's
//! response headers. An origin not listed gets no CORS header at all, and with no origins configured
//! nothing here changes a response. No credentials mode: tokens travel in headers.
use actix_web::body::{EitherBody, MessageBody};
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::header::{self, HeaderValue};
use actix_web::middleware::Next;
use actix_web::{Error, HttpResponse, web};

use super::AppState;

pub const ALLOW_METHODS: &str = "GET, POST, PATCH, DELETE";
pub const ALLOW_HEADERS: &str =
    "Authorization, Content-Type, Last-Event-ID, Idempotency-Key, If-Match, Prefer, X-Request-Id";
pub const EXPOSE_HEADERS: &str =
    "X-Request-Id, Location, Retry-After, ETag, X-Berth-Seq, Idempotent-Replayed, Preference-Applied";
/// How long a browser may cache a preflight (seconds).
pub const MAX_AGE: &str = "600";

pub async fn cors(
    req: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<EitherBody<impl MessageBody + 'static>>, Error> {
    let configured = req
        .app_data::<web::Data<AppState>>()
        .is_some_and(|s| !s.ctx.config.cors_origins.is_empty());
    if !configured {
        return Ok(next.call(req).await?.map_into_left_body());
    }
    let origin = req
        .headers()
        .get(header::ORIGIN)
        .filter(|o| {
            req.app_data::<web::Data<AppState>>()
                .is_some_and(|s| s.ctx.config.cors_origins.iter().any(|a| a.as_bytes() == o.as_bytes()))
        })
        .cloned();
    let preflight = req.method() == actix_web::http::Method::OPTIONS
        && req.headers().contains_key(header::ACCESS_CONTROL_REQUEST_METHOD);
    if let (Some(origin), true) = (&origin, preflight) {
        let res = HttpResponse::NoContent()
            .insert_header((header::ACCESS_CONTROL_ALLOW_ORIGIN, origin.clone()))
            .insert_header((header::ACCESS_CONTROL_ALLOW_METHODS, ALLOW_METHODS))
            .insert_header((header::ACCESS_CONTROL_ALLOW_HEADERS, ALLOW_HEADERS))
            .insert_header((header::ACCESS_CONTROL_MAX_AGE, MAX_AGE))
            .insert_header((header::VARY, "Origin"))
            .finish();
        return Ok(req.into_response(res).map_into_right_body());
    }
    // Handlers' errors are responses by now and get the headers; an error a middleware returns (the
    // NUL check's) passes through as it is: the request cannot be kept for it (routing needs it unshared).
    let mut res = next.call(req).await?.map_into_left_body();
    let headers = res.headers_mut();
    // Responses differ by origin once CORS is on, so caches must key on it.
    headers.append(header::VARY, HeaderValue::from_static("Origin"));
    if let Some(origin) = origin {
        headers.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin);
        headers.insert(
            header::ACCESS_CONTROL_EXPOSE_HEADERS,
            HeaderValue::from_static(EXPOSE_HEADERS),
        );
    }
    Ok(res)
}
