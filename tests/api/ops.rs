//! Operations endpoints are public and honest.
use reqwest::Method;

use crate::both_backends;
use crate::helpers::TestApp;

both_backends!(health_readiness_and_metrics);

async fn health_readiness_and_metrics(app: TestApp) {
    assert_eq!(
        app.call(Method::GET, "/healthz", None, None).await.ok(200)["status"],
        "ok"
    );
    assert_eq!(
        app.call(Method::GET, "/readyz", None, None).await.ok(200)["status"],
        "ready"
    );
    app.get("/api/v1/workspaces").await.ok(200);
    app.call(Method::GET, "/api/v1/workspaces", None, None)
        .await
        .problem(401, "unauthenticated");
    let r = app.call(Method::GET, "/metrics", None, None).await;
    assert_eq!(r.status, 200);
    assert!(r.header("content-type").unwrap().starts_with("text/plain"));
    assert!(
        r.text.contains(
            r#"berth_http_requests_total{method="GET",route="/api/v1/workspaces",status="200"} 1"#
        ),
        "{}",
        r.text
    );
    assert!(r.text.contains(
        r#"berth_http_requests_total{method="GET",route="/api/v1/workspaces",status="401"} 1"#
    ));
    assert!(
        r.text
            .contains("berth_http_request_duration_seconds_bucket{")
    );
    assert!(r.text.contains("berth_db_pool_connections{state=\"open\"}"));
    assert!(r.text.contains("berth_db_pool_max_connections 5"));
}
