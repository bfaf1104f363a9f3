//! Hostile input: tokens, paths, branch names and connections crafted to break berth. Each answer is a
//! clean 4xx (never a 5xx or a hang), nothing is written, and the server keeps serving.
use std::time::Duration;

use jsonwebtoken::{Algorithm, EncodingKey, Header, encode};
use reqwest::Method;
use serde_json::{Value, json};

use crate::both_backends;
use crate::helpers::{Backend, SECRET, TestApp, git_repo, openssl, worktrees_of};

both_backends!(
    a_public_key_is_never_accepted_as_an_hmac_secret,
    huge_tokens_are_refused_cleanly,
    nul_bytes_and_invalid_utf8_in_paths_are_refused,
    option_like_branch_names_never_reach_git,
    two_thousand_idle_connections_do_not_take_the_server_down,
    nul_text_anywhere_is_a_422_that_writes_nothing,
    the_spec_declares_what_the_server_answers,
    reported_file_statuses_are_the_specs,
);

fn claims(extra: Value) -> Value {
    let now = chrono::Utc::now().timestamp();
    let mut c =
        json!({"sub": "mallory", "scope": "admin", "exp": now + 600, "iat": now, "iss": "berth", "aud": "berth-api"});
    for (k, v) in extra.as_object().unwrap() {
        c[k] = v.clone();
    }
    c
}

// Algorithm confusion: with an Ed25519 public key configured, an HS256 token whose HMAC key is that
// public key (which anyone has) must not pass, nor `alg: none`; a token signed with the private key does.
async fn a_public_key_is_never_accepted_as_an_hmac_secret(app: TestApp) {
    let backend = app.backend;
    drop(app);
    let keys = tempfile::TempDir::new().unwrap();
    let private = keys.path().join("private.pem");
    let public = keys.path().join("public.pem");
    openssl(&["genpkey", "-algorithm", "ed25519", "-out", private.to_str().unwrap()]);
    openssl(&[
        "pkey",
        "-in",
        private.to_str().unwrap(),
        "-pubout",
        "-out",
        public.to_str().unwrap(),
    ]);
    let Some(app) = TestApp::spawn_with(backend, &[("BERTH_JWT_PUBLIC_KEY_FILE", public.to_str().unwrap())]).await
    else {
        return;
    };
    let public_pem = std::fs::read(&public).unwrap();
    let confused = encode(
        &Header::new(Algorithm::HS256),
        &claims(json!({})),
        &EncodingKey::from_secret(&public_pem).unwrap(),
    )
    .unwrap();
    // The same confusion with the key's base64 body only (what some libraries feed to HMAC).
    let body: String = String::from_utf8(public_pem.clone())
        .unwrap()
        .lines()
        .filter(|l| !l.starts_with("-----"))
        .collect();
    let confused_body = encode(
        &Header::new(Algorithm::HS256),
        &claims(json!({})),
        &EncodingKey::from_secret(body.as_bytes()).unwrap(),
    )
    .unwrap();
    // And the shared secret the other tests use: a public-key server must not fall back to it.
    let old_secret = encode(
        &Header::new(Algorithm::HS256),
        &claims(json!({})),
        &EncodingKey::from_secret(SECRET.as_bytes()).unwrap(),
    )
    .unwrap();
    use base64::Engine;
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let none = format!(
        "{}.{}.",
        b64.encode(r#"{"alg":"none","typ":"JWT"}"#),
        b64.encode(claims(json!({})).to_string())
    );
    for (case, token) in [
        ("HS256 keyed with the public key PEM", confused),
        ("HS256 keyed with the public key body", confused_body),
        ("HS256 with a shared secret", old_secret),
        ("alg none", none),
    ] {
        let r = app.call(Method::GET, "/api/v1/workspaces", Some(&token), None).await;
        assert_eq!(r.status.as_u16(), 401, "{case}: {}", r.text);
        r.problem(401, "unauthenticated");
    }
    // The control: the private key's signature passes, so the refusals above are about the algorithm.
    let good = encode(
        &Header::new(Algorithm::EdDSA),
        &claims(json!({})),
        &EncodingKey::from_ed_pem(&std::fs::read(&private).unwrap()).unwrap(),
    )
    .unwrap();
    app.call(Method::GET, "/api/v1/workspaces", Some(&good), None)
        .await
        .ok(200);
}

// A token with enormous claims: refused before anything heavy happens, with a 4xx; the server goes on.
async fn huge_tokens_are_refused_cleanly(app: TestApp) {
    let key = EncodingKey::from_secret(SECRET.as_bytes()).unwrap();
    for size in [20_000usize, 200_000, 2_000_000] {
        let padded = encode(
            &Header::new(Algorithm::HS256),
            &claims(json!({"pad": "x".repeat(size), "scope": "admin ".repeat(size / 6)})),
            &key,
        )
        .unwrap();
        // A client of its own: the server may close this connection, which must not affect others.
        let r = crate::helpers::client()
            .get(format!("{}/api/v1/workspaces", app.base))
            .bearer_auth(&padded)
            .timeout(Duration::from_secs(30))
            .send()
            .await;
        if let Ok(r) = r {
            let status = r.status().as_u16();
            assert!(
                (400..500).contains(&status) || status == 200,
                "{size}-byte claims: {status}"
            );
        }
        // Either way (answered or connection closed), the server still serves.
        app.get("/api/v1/workspaces").await.ok(200);
    }
    // Thousands of scopes, each unknown: a 401, not a crash or a slow parse.
    let many = encode(
        &Header::new(Algorithm::HS256),
        &claims(json!({"scope": (0..2000).map(|i| format!("s{i}")).collect::<Vec<_>>().join(" ")})),
        &key,
    )
    .unwrap();
    let r = app.call(Method::GET, "/api/v1/workspaces", Some(&many), None).await;
    assert!(matches!(r.status.as_u16(), 401 | 403), "{}", r.text);
}

// NUL bytes and other bytes no path may hold: a 422 (or 400 for a body that is not UTF-8), nothing stored.
async fn nul_bytes_and_invalid_utf8_in_paths_are_refused(app: TestApp) {
    let ws = app.workspace("ws").await;
    let repo = git_repo(&app.scratch.path().join("svc"), "main");
    let path = format!("/api/v1/workspaces/{ws}/repositories");
    for bad in [
        format!("{}\u{0}", repo.display()),
        format!("{}\u{0}/../etc", repo.display()),
        "\u{0}".to_string(),
        format!("{}/\u{202e}gpj", repo.display()),
    ] {
        let r = app.post(&path, json!({ "path": bad })).await;
        assert_eq!(r.status.as_u16(), 422, "{bad:?}: {}", r.text);
        assert!(!r.text.contains('\u{0}'), "the refusal echoes the NUL byte");
    }
    let r = app.post(&path, json!({"path": repo, "name": "a\u{0}b"})).await;
    r.problem(422, "validation_failed");
    // Bytes that are not UTF-8 cannot be JSON: 400 and nothing stored.
    let mut raw = br#"{"path": "/tmp/"#.to_vec();
    raw.extend_from_slice(&[0xff, 0xfe, 0x80]);
    raw.extend_from_slice(br#""}"#);
    let r = app
        .client
        .post(format!("{}{path}", app.base))
        .bearer_auth(&app.admin)
        .header("content-type", "application/json")
        .body(raw)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 400);
    assert_eq!(app.count("repositories").await, 0);
}

// Branch names that look like options, or that git refuses, are refused before git runs; the marker a
// `--upload-pack` payload would create never appears and the repository's worktrees are untouched.
async fn option_like_branch_names_never_reach_git(app: TestApp) {
    let ws = app.workspace("ws").await;
    let repo = git_repo(&app.scratch.path().join("svc"), "main");
    let marker = app.scratch.path().join("pwned");
    let repository = crate::helpers::id_of(
        &app.post(&format!("/api/v1/workspaces/{ws}/repositories"), json!({"path": repo}))
            .await
            .ok(201),
    );
    let before = worktrees_of(&repo);
    for branch in [
        "-f".to_string(),
        "--force".to_string(),
        format!("--upload-pack=touch {}", marker.display()),
        format!("--exec=touch {}", marker.display()),
        "-b".to_string(),
        "a..b".to_string(),
        "feature/x.lock".to_string(),
        "ref with space".to_string(),
        "\u{0}".to_string(),
    ] {
        let r = app
            .post(
                &format!("/api/v1/workspaces/{ws}/tasks"),
                json!({"title": "t", "repositories": [{"repository_id": repository, "branch": branch}]}),
            )
            .await;
        r.problem(422, "validation_failed");
        let r = app
            .post(
                &format!("/api/v1/workspaces/{ws}/tasks"),
                json!({"title": "t", "repositories": [{"repository_id": repository, "base_branch": branch}]}),
            )
            .await;
        assert_eq!(r.status.as_u16(), 422, "base_branch {branch:?}: {}", r.text);
    }
    assert_eq!(app.count("tasks").await, 0);
    assert!(!marker.exists(), "an option-like branch reached git");
    assert_eq!(worktrees_of(&repo), before);
    // A branch that merely contains a dash after the first character is fine, and works end to end.
    let t = app
        .post(
            &format!("/api/v1/workspaces/{ws}/tasks"),
            json!({"title": "t", "repositories": [{"repository_id": repository, "branch": "fix-f--force"}]}),
        )
        .await
        .ok(201);
    app.session(crate::helpers::id_of(&t), "worktree").await;
    assert!(worktrees_of(&repo).len() == before.len() + 1);
    assert!(!marker.exists());
}

// 2,000 idle connections (and some that send half a request and stall) do not stop the server from
// answering a normal request; the stalled ones are timed out and closed.
async fn two_thousand_idle_connections_do_not_take_the_server_down(app: TestApp) {
    if app.backend == Backend::Postgres {
        return; // the database plays no part: once is enough
    }
    use tokio::io::AsyncWriteExt;
    let addr = app.base.trim_start_matches("http://").to_string();
    let mut idle = Vec::with_capacity(2000);
    for i in 0..2000 {
        let mut s = tokio::net::TcpStream::connect(&addr).await.expect("connect");
        if i % 4 == 0 {
            let _ = s.write_all(b"GET /api/v1/workspaces HTTP/1.1\r\nHost: x\r\n").await;
        }
        idle.push(s);
    }
    let r = tokio::time::timeout(Duration::from_secs(30), app.get("/api/v1/workspaces"))
        .await
        .expect("answered while 2,000 connections idle");
    r.ok(200);
    let r = tokio::time::timeout(Duration::from_secs(30), app.get("/readyz"))
        .await
        .expect("ready");
    assert_eq!(r.status.as_u16(), 200);
    drop(idle);
    app.get("/api/v1/workspaces").await.ok(200);
}

// Regressions from spec fuzzing (schemathesis, .ci/spec-fuzz). NUL in any JSON text or query answered
// 500 on PostgreSQL (and was stored on SQLite): now a 422 on both that writes nothing.
async fn nul_text_anywhere_is_a_422_that_writes_nothing(app: TestApp) {
    let ws = app.workspace("ws").await;
    let task = app.task(ws, "t", &[]).await;
    let events_before = app.events().await.len();
    for (method, path, body) in [
        (
            Method::POST,
            format!("/api/v1/workspaces/{ws}/tasks"),
            json!({"title": "t", "description": "a\u{0}b"}),
        ),
        (
            Method::PATCH,
            format!("/api/v1/tasks/{task}"),
            json!({"description": "a\u{0}"}),
        ),
        (
            Method::PATCH,
            format!("/api/v1/tasks/{task}"),
            json!({"title": "\u{0}"}),
        ),
        (
            Method::POST,
            format!("/api/v1/tasks/{task}/sessions"),
            json!({"executor_type": "local", "start": false, "name": "a\u{0}"}),
        ),
        (
            Method::POST,
            "/api/v1/workspaces".to_string(),
            json!({"name": "ws\u{0}"}),
        ),
        (
            Method::POST,
            "/api/v1/workspaces".to_string(),
            json!({"name": "ok", "x\u{0}": 1}),
        ),
    ] {
        let r = app
            .call(method.clone(), &path, Some(&app.admin), Some(body.clone()))
            .await;
        r.problem(422, "validation_failed");
    }
    for query in ["state=%00", "trigger=a%00b", "task_id=%00", "cursor=%00"] {
        let r = app.get(&format!("/api/v1/cleanup-jobs?{query}")).await;
        r.problem(400, "validation_failed");
    }
    assert_eq!(app.count("tasks").await, 1);
    assert_eq!(app.count("task_sessions").await, 0);
    assert_eq!(app.events().await.len(), events_before, "nothing was written");
    // The task is unchanged.
    let t = app.get(&format!("/api/v1/tasks/{task}")).await.ok(200);
    assert_eq!(t["title"], "t");
}

// Regressions from spec fuzzing: what the server answers, the spec declares (413 and 422 on every
// operation with a body, 503 on every authenticated one, 409 on report_observation), and the event
// stream's schema describes an SSE frame rather than a string.
async fn the_spec_declares_what_the_server_answers(app: TestApp) {
    let spec = app.get("/openapi.json").await.ok(200);
    let mut checked = 0;
    for (path, item) in spec["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            // Public operations say `security: []`: they need no token and answer no auth problem.
            if op["security"].as_array().is_none_or(|s| s.is_empty()) {
                continue;
            }
            let responses = op["responses"].as_object().unwrap();
            assert!(responses.contains_key("503"), "{method} {path} lacks 503");
            if op.get("requestBody").is_some() {
                for code in ["413", "422"] {
                    assert!(responses.contains_key(code), "{method} {path} lacks {code}");
                }
            }
            checked += 1;
        }
    }
    assert!(checked > 30, "walked the operations ({checked})");
    let observe = &spec["paths"]["/api/v1/environments/{id}/git-status/observations"]["post"];
    assert!(
        observe["responses"]["409"].is_object(),
        "report_observation declares 409"
    );
    let stream =
        &spec["paths"]["/api/v1/events/stream"]["get"]["responses"]["200"]["content"]["text/event-stream"]["schema"];
    let frame = if let Some(r) = stream["$ref"].as_str() {
        spec["components"]["schemas"][r.rsplit('/').next().unwrap()].clone()
    } else {
        stream.clone()
    };
    assert!(
        frame["properties"]["data"].is_object(),
        "an SSE frame with data: {frame}"
    );
    // And the 413 is real: a body over the limit.
    let big = json!({"name": "x".repeat(300_000)});
    let r = app.post("/api/v1/workspaces", big).await;
    r.problem(413, "validation_failed");
}

// Regression from spec fuzzing: file statuses in a reported observation were free strings (a bogus
// status, or an unknown field inside a file, got 201); the spec now lists them, and the server holds to it.
async fn reported_file_statuses_are_the_specs(app: TestApp) {
    let f = app.task_with_repo("t").await;
    let (repo, task) = (f.repository, f.task);
    f.session("worktree").await;
    let env = crate::helpers::id_of(&app.get(&format!("/api/v1/tasks/{task}/environment")).await.ok(200));
    let path = format!("/api/v1/environments/{env}/git-status/observations");
    let observation = |file: Value| json!({"repository_id": repo, "kind": "live", "observed_at": chrono::Utc::now(), "files": [file]});
    let before = app.count("git_status_observations").await;
    for file in [
        json!({"path": "a", "index_status": "bogus", "worktree_status": "modified"}),
        json!({"path": "a", "index_status": "modified", "worktree_status": "exploded"}),
    ] {
        app.post(&path, observation(file))
            .await
            .problem(422, "validation_failed");
    }
    let r = app
        .post(
            &path,
            observation(json!({"path": "a", "index_status": "added", "worktree_status": "untracked", "extra": 1})),
        )
        .await;
    assert!(matches!(r.status.as_u16(), 400 | 422), "{}", r.text);
    assert_eq!(app.count("git_status_observations").await, before, "nothing stored");
    app.post(
        &path,
        observation(json!({"path": "a", "index_status": "added", "worktree_status": "untracked"})),
    )
    .await
    .ok(201);
}
