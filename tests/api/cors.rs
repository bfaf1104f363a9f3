//! CORS for the origins in `BERTH_CORS_ORIGINS` only (exact matches); none by default.
use reqwest::Method;

use crate::both_backends;
use crate::helpers::{Backend, Reply, TestApp};

both_backends!(
    preflight_and_requests_from_an_allowed_origin,
    an_unlisted_origin_gets_no_cors_header,
    no_setting_sends_no_cors_header,
);

const ALLOWED: &str = "http://board.example:5173";

async fn with_cors(backend: Backend) -> Option<TestApp> {
    TestApp::spawn_with(
        backend,
        &[("BERTH_CORS_ORIGINS", "https://other.example, http://board.example:5173")],
    )
    .await
}

async fn preflight(app: &TestApp, origin: &str, path: &str) -> Reply {
    app.call_with(
        Method::OPTIONS,
        path,
        None,
        None,
        &[
            ("Origin", origin),
            ("Access-Control-Request-Method", "POST"),
            (
                "Access-Control-Request-Headers",
                "authorization, content-type, idempotency-key",
            ),
        ],
    )
    .await
}

fn cors_headers(r: &Reply) -> Vec<String> {
    r.headers
        .keys()
        .map(|k| k.as_str().to_string())
        .filter(|k| k.starts_with("access-control-"))
        .collect()
}

async fn preflight_and_requests_from_an_allowed_origin(app: TestApp) {
    let app = with_cors(app.backend).await.unwrap();
    let r = preflight(&app, ALLOWED, "/api/v1/workspaces").await;
    assert_eq!(r.status, 204, "{}", r.text);
    assert_eq!(r.header("access-control-allow-origin").as_deref(), Some(ALLOWED));
    assert_eq!(
        r.header("access-control-allow-methods").as_deref(),
        Some("GET, POST, PATCH, DELETE")
    );
    let allowed = r.header("access-control-allow-headers").unwrap().to_ascii_lowercase();
    for h in [
        "authorization",
        "content-type",
        "last-event-id",
        "idempotency-key",
        "if-match",
        "prefer",
        "x-request-id",
    ] {
        assert!(allowed.split(", ").any(|a| a == h), "{h} in {allowed}");
    }
    assert!(r.header("access-control-max-age").unwrap().parse::<u64>().unwrap() > 0);
    assert!(
        r.header("access-control-allow-credentials").is_none(),
        "no credentials mode"
    );
    assert!(r.text.is_empty());
    // A preflight needs no token (the browser sends none) and works for any route, even a missing one.
    assert_eq!(preflight(&app, ALLOWED, "/api/v1/events/stream").await.status, 204);

    // The actual requests: success, created, and an error all carry the headers.
    for (method, path, token, status) in [
        (Method::GET, "/api/v1/workspaces", Some(app.admin.clone()), 200),
        (Method::GET, "/api/v1/workspaces", None, 401),
        (Method::GET, "/healthz", None, 200),
    ] {
        let r = app
            .call_with(method, path, token.as_deref(), None, &[("Origin", ALLOWED)])
            .await;
        assert_eq!(r.status, status, "{path}: {}", r.text);
        assert_eq!(
            r.header("access-control-allow-origin").as_deref(),
            Some(ALLOWED),
            "{path}"
        );
        assert!(r.header("vary").unwrap().contains("Origin"));
        assert_eq!(
            r.header("access-control-expose-headers").as_deref(),
            Some("X-Request-Id, Location, Retry-After, ETag, X-Berth-Seq, Idempotent-Replayed, Preference-Applied")
        );
        assert!(r.header("access-control-allow-credentials").is_none());
    }
    let r = app
        .call_with(
            Method::POST,
            "/api/v1/workspaces",
            Some(&app.admin),
            Some(serde_json::json!({"name": "from-a-page"})),
            &[("Origin", ALLOWED)],
        )
        .await;
    assert_eq!(r.status, 201);
    assert_eq!(r.header("access-control-allow-origin").as_deref(), Some(ALLOWED));
    // The other listed origin too, each answered with its own.
    let r = preflight(&app, "https://other.example", "/api/v1/workspaces").await;
    assert_eq!(
        r.header("access-control-allow-origin").as_deref(),
        Some("https://other.example")
    );
}

async fn an_unlisted_origin_gets_no_cors_header(app: TestApp) {
    let app = with_cors(app.backend).await.unwrap();
    // Exact matches only: another scheme, port, host, a suffix, a trailing slash, `null`.
    for origin in [
        "https://board.example:5173",
        "http://board.example",
        "http://board.example:5174",
        "http://evil.board.example:5173",
        "http://board.example:5173/",
        "null",
    ] {
        let r = preflight(&app, origin, "/api/v1/workspaces").await;
        assert_ne!(r.status, 204, "{origin}");
        assert!(cors_headers(&r).is_empty(), "{origin}: {:?}", r.headers);
        let r = app
            .call_with(
                Method::GET,
                "/api/v1/workspaces",
                Some(&app.admin),
                None,
                &[("Origin", origin)],
            )
            .await;
        assert_eq!(r.status, 200, "the request itself is served: the browser withholds it");
        assert!(cors_headers(&r).is_empty(), "{origin}: {:?}", r.headers);
    }
    // No Origin at all (curl, a server): nothing either.
    let r = app.get("/api/v1/workspaces").await;
    assert!(cors_headers(&r).is_empty());
}

async fn no_setting_sends_no_cors_header(app: TestApp) {
    let r = preflight(&app, ALLOWED, "/api/v1/workspaces").await;
    assert_ne!(r.status, 204);
    assert!(cors_headers(&r).is_empty(), "{:?}", r.headers);
    let r = app
        .call_with(
            Method::GET,
            "/api/v1/workspaces",
            Some(&app.admin),
            None,
            &[("Origin", ALLOWED)],
        )
        .await;
    r.ok(200);
    assert!(cors_headers(&r).is_empty(), "{:?}", r.headers);
    assert!(r.header("vary").is_none_or(|v| !v.contains("Origin")));
}
