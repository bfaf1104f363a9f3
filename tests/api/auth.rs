//! The auth matrix (I33): every way a token can be wrong is a 401 with `WWW-Authenticate`; a valid token
//! without the scope is a 403; another workspace is a 404; a session-bound token stays on its session.
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use jsonwebtoken::{Algorithm, EncodingKey, Header, encode};
use reqwest::Method;
use serde_json::{Value, json};
use uuid::Uuid;

use crate::both_backends;
use crate::helpers::{SECRET, TestApp, id_of};

both_backends!(
    every_bad_token_is_401,
    missing_scope_is_403_and_names_the_scope,
    other_workspace_answers_404,
    session_bound_token_stays_on_its_session,
    every_non_public_operation_requires_a_token,
    berth_token_cli_mints_a_working_token,
);

fn claims(overrides: Value) -> Value {
    let now = chrono::Utc::now().timestamp();
    let mut c =
        json!({"sub": "mallory", "scope": "admin", "exp": now + 600, "iat": now, "iss": "berth", "aud": "berth-api"});
    for (k, v) in overrides.as_object().unwrap() {
        if v.is_null() {
            c.as_object_mut().unwrap().remove(k);
        } else {
            c[k] = v.clone();
        }
    }
    c
}

fn hs(alg: Algorithm, secret: &str, claims: &Value) -> String {
    encode(
        &Header::new(alg),
        claims,
        &EncodingKey::from_secret(secret.as_bytes()).unwrap(),
    )
    .unwrap()
}

async fn every_bad_token_is_401(app: TestApp) {
    let path = "/api/v1/workspaces";
    let now = chrono::Utc::now().timestamp();
    let unsigned = format!(
        "{}.{}.",
        URL_SAFE_NO_PAD.encode(r#"{"alg":"none","typ":"JWT"}"#),
        URL_SAFE_NO_PAD.encode(claims(json!({})).to_string())
    );
    let cases: Vec<(&str, Option<String>)> = vec![
        ("missing", None),
        ("malformed", Some("not-a-jwt".into())),
        (
            "expired",
            Some(hs(Algorithm::HS256, SECRET, &claims(json!({"exp": now - 3600})))),
        ),
        (
            "wrong signature",
            Some(hs(
                Algorithm::HS256,
                "another-secret-another-secret-another-secret",
                &claims(json!({})),
            )),
        ),
        (
            "wrong algorithm HS384",
            Some(hs(Algorithm::HS384, SECRET, &claims(json!({})))),
        ),
        ("alg none", Some(unsigned)),
        (
            "wrong issuer",
            Some(hs(Algorithm::HS256, SECRET, &claims(json!({"iss": "evil"})))),
        ),
        (
            "wrong audience",
            Some(hs(Algorithm::HS256, SECRET, &claims(json!({"aud": "other-api"})))),
        ),
        (
            "no audience",
            Some(hs(Algorithm::HS256, SECRET, &claims(json!({"aud": null})))),
        ),
        (
            "no expiry",
            Some(hs(Algorithm::HS256, SECRET, &claims(json!({"exp": null})))),
        ),
    ];
    for (case, token) in cases {
        let r = app.call(Method::GET, path, token.as_deref(), None).await;
        let body = r.problem(401, "unauthenticated");
        assert!(
            r.header("www-authenticate").is_some_and(|v| v.starts_with("Bearer")),
            "{case}: no WWW-Authenticate"
        );
        if let Some(t) = &token {
            assert!(!r.text.contains(t.as_str()), "{case}: the body echoes the token");
        }
        assert!(body["detail"].is_string(), "{case}");
    }
    // A non-Bearer scheme is refused the same way.
    let r = app
        .client
        .get(format!("{}{path}", app.base))
        .header("Authorization", format!("Basic {}", URL_SAFE_NO_PAD.encode("a:b")))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    // And the control: the well-formed token passes.
    let ok = hs(Algorithm::HS256, SECRET, &claims(json!({})));
    app.call(Method::GET, path, Some(&ok), None).await.ok(200);
}

async fn missing_scope_is_403_and_names_the_scope(app: TestApp) {
    let reader = app.token("tasks:read");
    let r = app
        .call(
            Method::POST,
            "/api/v1/workspaces",
            Some(&reader),
            Some(json!({"name": "x"})),
        )
        .await;
    let body = r.problem(403, "insufficient_scope");
    assert_eq!(body["required_scope"], "workspaces:admin");
    assert_eq!(app.count("workspaces").await, 0, "a refused request created nothing");

    // sessions:delete grants nothing else.
    let deleter = app.token("sessions:delete");
    app.call(Method::GET, "/api/v1/workspaces", Some(&deleter), None)
        .await
        .problem(403, "insufficient_scope");

    // The right scope works, and `admin` implies every scope.
    let writer = app.token("workspaces:admin");
    app.call(
        Method::POST,
        "/api/v1/workspaces",
        Some(&writer),
        Some(json!({"name": "x"})),
    )
    .await
    .ok(201);
    app.call(Method::GET, "/api/v1/workspaces", Some(&app.admin), None)
        .await
        .ok(200);
}

async fn other_workspace_answers_404(app: TestApp) {
    let mine = app.workspace("mine").await;
    let theirs = app.workspace("theirs").await;
    let (their_repo, _) = app.repository(theirs, "their-repo").await;
    let their_task = id_of(
        &app.post(
            &format!("/api/v1/workspaces/{theirs}/tasks"),
            json!({"title": "secret"}),
        )
        .await
        .ok(201),
    );

    let token = app.token_for("tasks:read tasks:write workspaces:admin", Some(vec![mine]), None);
    let t = Some(token.as_str());
    app.call(Method::GET, &format!("/api/v1/workspaces/{mine}"), t, None)
        .await
        .ok(200);
    for path in [
        format!("/api/v1/workspaces/{theirs}"),
        format!("/api/v1/workspaces/{theirs}/tasks"),
        format!("/api/v1/workspaces/{theirs}/repositories"),
        format!("/api/v1/repositories/{their_repo}"),
        format!("/api/v1/tasks/{their_task}"),
    ] {
        app.call(Method::GET, &path, t, None).await.problem(404, "not_found");
    }
    // Writes into it are 404 too, and change nothing.
    app.call(
        Method::PATCH,
        &format!("/api/v1/tasks/{their_task}"),
        t,
        Some(json!({"title": "pwned"})),
    )
    .await
    .problem(404, "not_found");
    app.call(Method::DELETE, &format!("/api/v1/repositories/{their_repo}"), t, None)
        .await
        .problem(404, "not_found");
    app.call(
        Method::POST,
        &format!("/api/v1/workspaces/{theirs}/tasks"),
        t,
        Some(json!({"title": "x"})),
    )
    .await
    .problem(404, "not_found");
    assert_eq!(
        app.get(&format!("/api/v1/tasks/{their_task}")).await.ok(200)["title"],
        "secret"
    );
    app.get(&format!("/api/v1/repositories/{their_repo}")).await.ok(200);

    // A limited token cannot create workspaces (names are global: it would learn other tenants' names).
    app.call(Method::POST, "/api/v1/workspaces", t, Some(json!({"name": "theirs"})))
        .await
        .problem(403, "insufficient_scope");
    // The list shows only the token's workspaces.
    let list = app.call(Method::GET, "/api/v1/workspaces", t, None).await.ok(200);
    let ids: Vec<&str> = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, vec![mine.to_string()]);
}

async fn session_bound_token_stays_on_its_session(app: TestApp) {
    let ws = app.workspace("ws").await;
    let task = id_of(
        &app.post(&format!("/api/v1/workspaces/{ws}/tasks"), json!({"title": "t"}))
            .await
            .ok(201),
    );
    // A token bound to a session that is not this task's: the task is not visible.
    let agent = app.token_for("tasks:read tasks:write sessions:read", None, Some(Uuid::now_v7()));
    let t = Some(agent.as_str());
    app.call(Method::GET, &format!("/api/v1/tasks/{task}"), t, None)
        .await
        .problem(404, "not_found");
    app.call(Method::GET, &format!("/api/v1/workspaces/{ws}"), t, None)
        .await
        .problem(403, "insufficient_scope");
    app.call(Method::GET, "/api/v1/workspaces", t, None)
        .await
        .problem(403, "insufficient_scope");
    app.call(Method::GET, &format!("/api/v1/workspaces/{ws}/tasks"), t, None)
        .await
        .problem(403, "insufficient_scope");
    app.call(
        Method::POST,
        &format!("/api/v1/workspaces/{ws}/tasks"),
        t,
        Some(json!({"title": "x"})),
    )
    .await
    .problem(403, "insufficient_scope");
    app.call(
        Method::PATCH,
        &format!("/api/v1/tasks/{task}"),
        t,
        Some(json!({"title": "x"})),
    )
    .await
    .problem(403, "insufficient_scope");
    assert_eq!(app.count("tasks").await, 1);
}

/// I33, from the spec itself: every operation outside the public list answers 401 without a token.
async fn every_non_public_operation_requires_a_token(app: TestApp) {
    let spec = app.call(Method::GET, "/openapi.json", None, None).await.ok(200);
    let mut checked = 0;
    for (path, item) in spec["paths"].as_object().unwrap() {
        if berth::api::PUBLIC_PATHS.contains(&path.as_str()) {
            continue;
        }
        let concrete = regex_free_fill(path);
        for method in ["get", "post", "put", "patch", "delete"] {
            if item.get(method).is_none() {
                continue;
            }
            let m = Method::from_bytes(method.to_uppercase().as_bytes()).unwrap();
            let body = if matches!(method, "post" | "put" | "patch") {
                Some(json!({}))
            } else {
                None
            };
            let r = app.call(m, &concrete, None, body).await;
            r.problem(401, "unauthenticated");
            checked += 1;
        }
    }
    assert!(checked >= 10, "only {checked} operations checked");
}

fn regex_free_fill(path: &str) -> String {
    path.split('/')
        .map(|seg| {
            if seg.starts_with('{') {
                Uuid::now_v7().to_string()
            } else {
                seg.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("/")
}

async fn berth_token_cli_mints_a_working_token(app: TestApp) {
    let ws = app.workspace("cli").await;
    let run = |args: &[&str]| {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_berth"));
        cmd.args(args);
        for (k, v) in &app.env {
            cmd.env(k, v);
        }
        cmd.output().unwrap()
    };
    let ws_s = ws.to_string();
    let out = run(&[
        "token",
        "--sub",
        "alice",
        "--scope",
        "tasks:read tasks:write",
        "--workspace",
        &ws_s,
        "--ttl",
        "1h",
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let token = String::from_utf8(out.stdout).unwrap().trim().to_string();
    app.call(
        Method::GET,
        &format!("/api/v1/workspaces/{ws}/tasks"),
        Some(&token),
        None,
    )
    .await
    .ok(200);
    app.call(
        Method::POST,
        &format!("/api/v1/workspaces/{ws}/tasks"),
        Some(&token),
        Some(json!({"title": "from cli"})),
    )
    .await
    .ok(201);
    // The token is limited to its workspace and its scopes.
    let other = app.workspace("other").await;
    app.call(Method::GET, &format!("/api/v1/workspaces/{other}"), Some(&token), None)
        .await
        .problem(404, "not_found");
    app.call(
        Method::POST,
        "/api/v1/workspaces",
        Some(&token),
        Some(json!({"name": "n"})),
    )
    .await
    .problem(403, "insufficient_scope");

    let bad = run(&["token", "--sub", "alice", "--scope", "tasks:fly"]);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("unknown scope"));
    let bad_ttl = run(&["token", "--sub", "alice", "--scope", "admin", "--ttl", "soon"]);
    assert!(!bad_ttl.status.success());
}
