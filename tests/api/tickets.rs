//! Stream tickets. A ticket stands in for the `Authorization` header on `GET /events/stream` only:
//! single use (on any replica), valid 60 s, the minting token's principal (I33: a session-bound
//! token's ticket sees its session only), and never written to a log.
use std::time::Duration;

use reqwest::Method;
use serde_json::{Value, json};
use uuid::Uuid;

use crate::both_backends;
use crate::helpers::{Sse, TestApp, id_of, mint};

both_backends!(
    a_ticket_opens_one_stream_once,
    expired_and_forged_tickets_are_refused,
    a_session_bound_ticket_sees_only_its_session,
    a_ticket_minted_on_one_replica_opens_a_stream_on_another,
    a_ticket_never_reaches_the_log_or_metrics,
);

const WAIT: Duration = Duration::from_secs(20);

/// `POST /events/tickets` with this token: 201 and the ticket.
pub(crate) async fn ticket(app: &TestApp, token: &str) -> String {
    let r = app
        .call(Method::POST, "/api/v1/events/tickets", Some(token), None)
        .await;
    assert!(r.header("location").is_none(), "a ticket is not a resource");
    let body = r.ok(201);
    body["ticket"].as_str().expect("a ticket").to_string()
}

/// Opens the stream with a ticket and no `Authorization` header.
pub(crate) async fn open(base: &str, ticket: &str, query: &str) -> reqwest::Response {
    crate::helpers::client()
        .get(format!("{base}/api/v1/events/stream?ticket={ticket}{query}"))
        .send()
        .await
        .unwrap()
}

async fn refused(res: reqwest::Response) {
    assert_eq!(res.status(), 401);
    let body: Value = res.json().await.unwrap();
    assert_eq!(body["code"], "unauthenticated", "{body}");
}

/// Reads frames up to `ready` and returns the events' JSON.
async fn replayed(sse: &mut Sse) -> Vec<Value> {
    let mut events = Vec::new();
    loop {
        let frame = sse.next(WAIT).await.expect("the stream stays open");
        match frame.event.as_str() {
            "ready" => return events,
            "message" => events.push(serde_json::from_str(&frame.data).unwrap()),
            other => panic!("unexpected frame {other}"),
        }
    }
}

async fn a_ticket_opens_one_stream_once(app: TestApp) {
    let ws = app.workspace("ws").await;
    let r = app
        .call(
            Method::POST,
            "/api/v1/events/tickets",
            Some(&app.admin),
            Some(json!({})),
        )
        .await;
    let body = r.ok(201);
    let t = body["ticket"].as_str().unwrap().to_string();
    // 32 random bytes, URL-safe base64 without padding.
    assert_eq!(t.len(), 43, "{t}");
    assert!(t.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'));
    let expires: chrono::DateTime<chrono::Utc> = body["expires_at"].as_str().unwrap().parse().unwrap();
    let ttl = expires - chrono::Utc::now();
    assert!(
        ttl > chrono::Duration::seconds(50) && ttl <= chrono::Duration::seconds(60),
        "{ttl}"
    );
    // Only the hash is stored.
    let rows = berth_tickets(&app).await;
    assert_eq!(rows.len(), 1);
    assert_ne!(rows[0].ticket_hash, t);
    assert_eq!(rows[0].ticket_hash.len(), 64);

    let mut sse = Sse::from_response(open(&app.base, &t, "").await);
    let events = replayed(&mut sse).await;
    assert_eq!(events[0]["type"], "workspace.created");
    assert_eq!(events[0]["workspace_id"], ws.to_string());
    // Live delivery works on a ticket's stream too.
    app.post(&format!("/api/v1/workspaces/{ws}/tasks"), json!({"title": "live"}))
        .await
        .ok(201);
    let live = sse.next(WAIT).await.unwrap();
    assert!(live.data.contains("task.created"), "{}", live.data);
    // Single use: the same ticket again (an EventSource reconnecting) is refused, even after the first
    // stream closed.
    drop(sse);
    refused(open(&app.base, &t, "").await).await;
    assert!(berth_tickets(&app).await[0].used_at.is_some());
    // A ticket is no bearer token anywhere else.
    let t2 = ticket(&app, &app.admin).await;
    app.call(Method::GET, "/api/v1/events", Some(&t2), None)
        .await
        .problem(401, "unauthenticated");
    let r = app
        .client
        .get(format!("{}/api/v1/events?ticket={t2}", app.base))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401, "tickets open streams only");
    // Minting needs events:read, like the stream.
    let reader = app.token("tasks:read");
    app.call(Method::POST, "/api/v1/events/tickets", Some(&reader), None)
        .await
        .problem(403, "insufficient_scope");
    app.call(Method::POST, "/api/v1/events/tickets", None, None)
        .await
        .problem(401, "unauthenticated");
    let scoped = app.token("events:read");
    let t3 = ticket(&app, &scoped).await;
    assert_eq!(open(&app.base, &t3, "").await.status(), 200);
}

async fn berth_tickets(app: &TestApp) -> Vec<berth::entity::event_ticket::Model> {
    use sea_orm::EntityTrait;
    berth::entity::event_ticket::Entity::find().all(app.db()).await.unwrap()
}

async fn expired_and_forged_tickets_are_refused(app: TestApp) {
    use berth::entity::event_ticket as row;
    use sea_orm::sea_query::Expr;
    use sea_orm::{ColumnTrait, EntityTrait, QueryFilter};
    let t = ticket(&app, &app.admin).await;
    // Move the ticket's clock: it expired a second ago (the 60 s are the server's to count, not a sleep's).
    let past = berth::clock::now() - chrono::Duration::seconds(1);
    row::Entity::update_many()
        .col_expr(row::Column::ExpiresAt, Expr::value(past))
        .exec(app.db())
        .await
        .unwrap();
    refused(open(&app.base, &t, "").await).await;
    assert!(
        berth_tickets(&app).await[0].used_at.is_none(),
        "an expired ticket is refused, not spent"
    );
    // The next mint deletes what expired.
    let fresh = ticket(&app, &app.admin).await;
    let rows = berth_tickets(&app).await;
    assert_eq!(rows.len(), 1, "the expired ticket was deleted");
    assert!(rows[0].expires_at > berth::clock::now());
    // Forged: random, empty, the hash of a real one, a real one altered.
    let stored_hash = rows[0].ticket_hash.clone();
    let mut altered = fresh.clone().into_bytes();
    altered[0] = if altered[0] == b'A' { b'B' } else { b'A' };
    let altered = String::from_utf8(altered).unwrap();
    for forged in [
        "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
        "",
        stored_hash.as_str(),
        altered.as_str(),
    ] {
        refused(open(&app.base, forged, "").await).await;
    }
    // None of that spent the real one.
    assert!(
        row::Entity::find()
            .filter(row::Column::UsedAt.is_null())
            .one(app.db())
            .await
            .unwrap()
            .is_some()
    );
    assert_eq!(open(&app.base, &fresh, "").await.status(), 200);
}

/// I33: a ticket carries the minting token's session binding and workspaces.
async fn a_session_bound_ticket_sees_only_its_session(app: TestApp) {
    let f = app.task_with_repo("two sessions").await;
    let ws = f.workspace;
    let mine = id_of(&f.session("worktree").await);
    let theirs = id_of(&f.session("worktree").await);
    let other_ws = app.workspace("other").await;
    app.post(
        &format!("/api/v1/workspaces/{other_ws}/tasks"),
        json!({"title": "elsewhere"}),
    )
    .await
    .ok(201);

    let bound = app.token_for("events:read", Some(vec![ws]), Some(mine));
    let t = ticket(&app, &bound).await;
    let mut sse = Sse::from_response(open(&app.base, &t, "&after=0").await);
    let events = replayed(&mut sse).await;
    assert!(
        events
            .iter()
            .any(|e| e["type"] == "session.created" && e["session_id"] == mine.to_string()),
        "{events:?}"
    );
    let env = events
        .iter()
        .find_map(|e| e["task_environment_id"].as_str())
        .map(str::to_string);
    for e in &events {
        let own = e["session_id"] == mine.to_string();
        let environment = e["task_environment_id"].as_str() == env.as_deref()
            && ["git_status.", "environment."]
                .iter()
                .any(|p| e["type"].as_str().unwrap().starts_with(p));
        assert!(own || environment, "a session-bound ticket saw {e}");
        assert_ne!(e["session_id"], theirs.to_string());
        assert_eq!(e["workspace_id"], ws.to_string());
    }
    // Live: the sibling's events stay invisible, its own arrive.
    app.delete(&format!("/api/v1/sessions/{theirs}")).await;
    app.delete(&format!("/api/v1/sessions/{mine}")).await;
    loop {
        let frame = sse.next(WAIT).await.expect("the stream stays open");
        let e: Value = serde_json::from_str(&frame.data).unwrap();
        assert_ne!(e["session_id"], theirs.to_string(), "{e}");
        if e["session_id"] == mine.to_string() && e["type"] == "session.deleted" {
            break;
        }
    }

    // A workspace-limited token's ticket sees its workspaces only.
    let limited = app.token_for("events:read", Some(vec![other_ws]), None);
    let t = ticket(&app, &limited).await;
    let mut sse = Sse::from_response(open(&app.base, &t, "").await);
    let events = replayed(&mut sse).await;
    assert!(!events.is_empty());
    assert!(
        events.iter().all(|e| e["workspace_id"] == other_ws.to_string()),
        "{events:?}"
    );
}

/// Tickets live in the database: any replica redeems one, and only one replica can.
async fn a_ticket_minted_on_one_replica_opens_a_stream_on_another(app: TestApp) {
    let b = crate::replicas::Replica::start(&app).await;
    let ws = app.workspace("ws").await;
    let t = ticket(&app, &app.admin).await;
    let mut sse = Sse::from_response(open(&b.base, &t, "").await);
    let events = replayed(&mut sse).await;
    assert_eq!(events[0]["workspace_id"], ws.to_string());
    refused(open(&app.base, &t, "").await).await;
    refused(open(&b.base, &t, "").await).await;
    // Two replicas racing for one ticket: exactly one stream opens.
    for _ in 0..5 {
        let t = ticket(&app, &app.admin).await;
        let (x, y) = tokio::join!(open(&app.base, &t, ""), open(&b.base, &t, ""));
        let opened = [x.status(), y.status()].iter().filter(|s| s.as_u16() == 200).count();
        assert_eq!(opened, 1, "{} {}", x.status(), y.status());
    }
    drop(sse);
    b.stop().await;
}

/// The ticket is a credential: the access log (the root span's `http.target`) shows it redacted, in every
/// line, at debug level, for an accepted and a refused stream; metrics labels are routes.
async fn a_ticket_never_reaches_the_log_or_metrics(app: TestApp) {
    let dir = app.scratch.path().join("logged");
    let log = app.scratch.path().join("berth.log");
    let mut env = crate::faults::process_env(&app, &dir);
    env.insert("RUST_LOG".into(), "debug".into());
    env.insert("BERTH_LOG_FORMAT".into(), "json".into());
    let mut berth = crate::faults::start(&env, None, &log);
    let client = crate::helpers::client();
    crate::faults::wait_ready(&client, &mut berth).await;
    let token = mint(&app.config, "logger", "admin", None, None);
    let mint_one = || async {
        let r = client
            .post(format!("{}/api/v1/events/tickets", berth.base))
            .bearer_auth(&token)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 201);
        r.json::<Value>().await.unwrap()["ticket"].as_str().unwrap().to_string()
    };
    let used = mint_one().await;
    let mut sse = Sse::from_response(open(&berth.base, &used, "&after=0").await);
    assert_eq!(sse.next(WAIT).await.unwrap().event, "ready");
    drop(sse);
    // Refused requests log an error event inside the request's span: the reused ticket, a ticket the
    // server never issued, and one hidden behind a percent-encoded parameter name.
    refused(open(&berth.base, &used, "").await).await;
    let forged = Uuid::new_v4().simple().to_string();
    refused(open(&berth.base, &forged, "").await).await;
    let hidden = mint_one().await;
    let r = client
        .get(format!("{}/api/v1/events/stream?ticke%74={hidden}&after=x", berth.base))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let metrics = client
        .get(format!("{}/metrics", berth.base))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    drop(berth);
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.contains(r#""http.target":"/api/v1/events/stream?ticket=[redacted]""#),
        "the access log records the stream request: {text}"
    );
    for secret in [&used, &forged, &hidden] {
        assert!(!text.contains(secret.as_str()), "a ticket reached the log:\n{text}");
        assert!(!metrics.contains(secret.as_str()), "a ticket reached the metrics");
    }
}
