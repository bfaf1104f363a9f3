//! The board at `/ui`: plain HTML, CSS and ES modules embedded in the binary (no build step, nothing
//! fetched from elsewhere). Public like `/docs`: the files hold no data, and the page is a client of
//! the public API with the token the person pastes.
use actix_web::http::header::{CACHE_CONTROL, CONTENT_SECURITY_POLICY, CONTENT_TYPE, HeaderName};
use actix_web::{HttpResponse, web};

use crate::error::Error;

/// Scripts and styles only from this origin, no inline script, no frames, no plugins; the page talks
/// only to this origin's API.
pub const CSP: &str = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

const HTML: &str = "text/html; charset=utf-8";
const JS: &str = "text/javascript; charset=utf-8";
const CSS: &str = "text/css; charset=utf-8";

/// Every file of the board: name under `/ui/`, content type, body.
pub const FILES: &[(&str, &str, &str)] = &[
    ("index.html", HTML, include_str!("index.html")),
    ("style.css", CSS, include_str!("style.css")),
    ("app.js", JS, include_str!("app.js")),
    ("api.js", JS, include_str!("api.js")),
    ("dom.js", JS, include_str!("dom.js")),
    ("live.js", JS, include_str!("live.js")),
    ("workspace.js", JS, include_str!("workspace.js")),
    ("task.js", JS, include_str!("task.js")),
    ("session.js", JS, include_str!("session.js")),
    ("agent.js", JS, include_str!("agent.js")),
    ("cleanup.js", JS, include_str!("cleanup.js")),
    ("changes.js", JS, include_str!("changes.js")),
    ("turns.js", JS, include_str!("turns.js")),
    ("landing.js", JS, include_str!("landing.js")),
    ("usage.js", JS, include_str!("usage.js")),
    ("notify.js", JS, include_str!("notify.js")),
];

/// `/ui`, `/ui/` and `/ui/<file>`.
pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.route("/ui", web::get().to(index))
        .route("/ui/", web::get().to(index))
        .route("/ui/{file}", web::get().to(file));
}

async fn index() -> HttpResponse {
    serve("index.html").expect("the board has an index")
}

async fn file(name: web::Path<String>) -> Result<HttpResponse, Error> {
    serve(&name).ok_or(Error::NotFound("route"))
}

fn serve(name: &str) -> Option<HttpResponse> {
    let (_, content_type, body) = FILES.iter().find(|(n, _, _)| *n == name)?;
    Some(
        HttpResponse::Ok()
            .insert_header((CONTENT_TYPE, *content_type))
            // The files change with the binary: revalidate every time (they are small).
            .insert_header((CACHE_CONTROL, "no-cache"))
            .insert_header((CONTENT_SECURITY_POLICY, CSP))
            .insert_header((HeaderName::from_static("x-content-type-options"), "nosniff"))
            .insert_header((HeaderName::from_static("referrer-policy"), "no-referrer"))
            .body(*body),
    )
}
