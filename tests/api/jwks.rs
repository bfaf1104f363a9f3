//! Tokens from an identity provider. berth verifies with the key of a JWKS that the token's `kid`
//! names, served here by a local JWKS server on loopback: rotation (a new key, both valid), an
//! unknown `kid` (refused, the set read at most once per minimum interval), a key removed (refused
//! once the cache ages out), a local JWKS file, and the claim names a provider uses.
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use jsonwebtoken::{Algorithm, EncodingKey, Header, encode};
use reqwest::Method;
use serde_json::{Value, json};

use crate::both_backends;
use crate::helpers::{SECRET, TestApp, openssl, seen, wait_until_every};

both_backends!(
    keys_rotate_by_kid_and_removed_keys_stop_working,
    a_jwks_file_and_provider_claim_names
);

/// An Ed25519 key made with openssl: what signs tokens, and its public half as a JWK.
struct TestKey {
    kid: String,
    signing: EncodingKey,
    jwk: Value,
}

fn key(dir: &Path, kid: &str) -> TestKey {
    let private = dir.join(format!("{kid}.pem"));
    openssl(&["genpkey", "-algorithm", "ed25519", "-out", private.to_str().unwrap()]);
    // The DER public key ends with the 32 raw bytes a JWK's `x` holds.
    let der = openssl(&["pkey", "-in", private.to_str().unwrap(), "-pubout", "-outform", "DER"]);
    use base64::Engine;
    let x = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(&der[der.len() - 32..]);
    TestKey {
        kid: kid.to_string(),
        signing: EncodingKey::from_ed_pem(&std::fs::read(&private).unwrap()).unwrap(),
        jwk: json!({"kty": "OKP", "crv": "Ed25519", "x": x, "kid": kid, "use": "sig", "alg": "EdDSA"}),
    }
}

fn set(keys: &[&TestKey]) -> String {
    json!({"keys": keys.iter().map(|k| k.jwk.clone()).collect::<Vec<_>>()}).to_string()
}

fn token(key: &TestKey, claims: Value) -> String {
    let now = chrono::Utc::now().timestamp();
    let mut c = json!({"sub": "idp-user", "exp": now + 600, "iat": now, "iss": "berth", "aud": "berth-api"});
    for (k, v) in claims.as_object().unwrap() {
        c[k] = v.clone();
    }
    let mut header = Header::new(Algorithm::EdDSA);
    header.kid = Some(key.kid.clone());
    encode(&header, &c, &key.signing).unwrap()
}

/// A JWKS server on loopback: serves `document` and counts the reads. It ends with the test's runtime.
struct JwksServer {
    url: String,
    document: Arc<Mutex<String>>,
    reads: Arc<AtomicUsize>,
}

async fn jwks_server(initial: String) -> JwksServer {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/.well-known/jwks.json", listener.local_addr().unwrap());
    let document = Arc::new(Mutex::new(initial));
    let reads = Arc::new(AtomicUsize::new(0));
    let (doc, count) = (document.clone(), reads.clone());
    tokio::spawn(async move {
        loop {
            let Ok((mut conn, _)) = listener.accept().await else {
                return;
            };
            let (doc, count) = (doc.clone(), count.clone());
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match conn.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                count.fetch_add(1, Ordering::SeqCst);
                let body = doc.lock().unwrap().clone();
                let reply = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = conn.write_all(reply.as_bytes()).await;
            });
        }
    });
    JwksServer { url, document, reads }
}

async fn status(app: &TestApp, token: &str) -> u16 {
    app.call(Method::GET, "/api/v1/workspaces", Some(token), None)
        .await
        .status
        .as_u16()
}

/// Calls until the answer is `want`, for at most 20 s (the cache and the minimum interval are 1 s here).
async fn until_status(app: &TestApp, token: &str, want: u16, what: &str) {
    let every = Duration::from_millis(100);
    wait_until_every(what, Duration::from_secs(20), every, || async {
        let got = status(app, token).await;
        seen(got == want, got)
    })
    .await;
}

async fn keys_rotate_by_kid_and_removed_keys_stop_working(app: TestApp) {
    let backend = app.backend;
    drop(app);
    let dir = tempfile::TempDir::new().unwrap();
    let (k1, k2, stranger) = (key(dir.path(), "k1"), key(dir.path(), "k2"), key(dir.path(), "k3"));
    let idp = jwks_server(set(&[&k1])).await;
    let Some(app) = TestApp::spawn_with(
        backend,
        &[
            ("BERTH_JWT_JWKS_URL", idp.url.as_str()),
            ("BERTH_JWT_JWKS_MIN_REFRESH_SECS", "1"),
            ("BERTH_JWT_JWKS_CACHE_SECS", "1"),
        ],
    )
    .await
    else {
        return;
    };
    assert!(idp.reads.load(Ordering::SeqCst) >= 1, "read at startup");
    let t1 = token(&k1, json!({"scope": "admin"}));
    assert_eq!(status(&app, &t1).await, 200);
    let verifier = berth::auth::JwtVerifier::from_config(&app.config).unwrap();
    assert!(
        verifier
            .mint("x", &[berth::auth::Scope::Admin], None, None, Duration::from_secs(60))
            .is_err()
    );

    // Rotation: the provider publishes k2 beside k1; a k2 token names a kid berth has not seen, which
    // reads the set again (once the minimum interval has passed), and then both keys verify.
    *idp.document.lock().unwrap() = set(&[&k1, &k2]);
    let t2 = token(&k2, json!({"scope": "admin"}));
    until_status(&app, &t2, 200, "the new key verifies").await;
    assert_eq!(status(&app, &t1).await, 200, "the old key still verifies");

    // An unknown kid is refused; a burst of them reads the set at most once per minimum interval.
    let forged = token(&stranger, json!({"scope": "admin"}));
    let before = idp.reads.load(Ordering::SeqCst);
    let started = Instant::now();
    for _ in 0..10 {
        app.call(Method::GET, "/api/v1/workspaces", Some(&forged), None)
            .await
            .problem(401, "unauthenticated");
    }
    let reads = idp.reads.load(Ordering::SeqCst) - before;
    let allowed = 1 + started.elapsed().as_secs() as usize;
    assert!(reads <= allowed, "{reads} reads in {:?}", started.elapsed());

    // A key confused with an HMAC secret: an HS256 token naming k1 is refused (the key's algorithm is pinned).
    let mut header = Header::new(Algorithm::HS256);
    header.kid = Some("k1".into());
    let now = chrono::Utc::now().timestamp();
    let confused = encode(
        &header,
        &json!({"sub": "x", "scope": "admin", "exp": now + 600, "iss": "berth", "aud": "berth-api"}),
        &EncodingKey::from_secret(k1.jwk["x"].as_str().unwrap().as_bytes()).unwrap(),
    )
    .unwrap();
    assert_eq!(status(&app, &confused).await, 401);
    let shared = encode(
        &Header::new(Algorithm::HS256),
        &json!({"sub": "x", "scope": "admin", "exp": now + 600, "iss": "berth", "aud": "berth-api"}),
        &EncodingKey::from_secret(SECRET.as_bytes()).unwrap(),
    )
    .unwrap();
    assert_eq!(status(&app, &shared).await, 401, "no fallback to the shared secret");

    // The provider drops k1: once the cached set ages out, k1 tokens are refused; k2 keeps working.
    *idp.document.lock().unwrap() = set(&[&k2]);
    until_status(&app, &t1, 401, "the removed key stops verifying").await;
    assert_eq!(status(&app, &t2).await, 200);
}

async fn a_jwks_file_and_provider_claim_names(app: TestApp) {
    let backend = app.backend;
    drop(app);
    let dir = tempfile::TempDir::new().unwrap();
    let (k1, k2) = (key(dir.path(), "file-1"), key(dir.path(), "file-2"));
    let file = dir.path().join("jwks.json");
    std::fs::write(&file, set(&[&k1])).unwrap();
    let Some(app) = TestApp::spawn_with(
        backend,
        &[
            ("BERTH_JWT_JWKS_FILE", file.to_str().unwrap()),
            ("BERTH_JWT_JWKS_MIN_REFRESH_SECS", "1"),
            ("BERTH_JWT_SCOPE_CLAIM", "scp"),
            ("BERTH_JWT_WORKSPACES_CLAIM", "https://berth.example/workspaces"),
        ],
    )
    .await
    else {
        return;
    };
    // Scopes as a list under the provider's claim name; `scope` itself means nothing here.
    let admin = token(&k1, json!({"scp": ["admin"]}));
    let r = app
        .call(
            Method::POST,
            "/api/v1/workspaces",
            Some(&admin),
            Some(json!({"name": "idp"})),
        )
        .await
        .ok(201);
    let ws = r["id"].as_str().unwrap().to_string();
    let wrong_claim = token(&k1, json!({"scope": "admin"}));
    app.call(Method::GET, "/api/v1/workspaces", Some(&wrong_claim), None)
        .await
        .problem(403, "insufficient_scope");
    let spaced = token(&k1, json!({"scp": "tasks:read workspaces:admin"}));
    assert_eq!(status(&app, &spaced).await, 200, "a space-separated string works too");
    // The workspace list under the provider's claim name limits what the token sees (I33).
    let other = uuid::Uuid::now_v7().to_string();
    let limited = token(
        &k1,
        json!({"scp": ["admin"], "https://berth.example/workspaces": [other]}),
    );
    let seen = app
        .call(Method::GET, "/api/v1/workspaces", Some(&limited), None)
        .await
        .ok(200);
    assert!(seen["items"].as_array().unwrap().is_empty(), "{seen}");
    let mine = token(&k1, json!({"scp": ["admin"], "https://berth.example/workspaces": [ws]}));
    let seen = app
        .call(Method::GET, "/api/v1/workspaces", Some(&mine), None)
        .await
        .ok(200);
    assert_eq!(seen["items"].as_array().unwrap().len(), 1, "{seen}");

    // The file is read again for an unknown kid: a key added to it verifies.
    std::fs::write(&file, set(&[&k1, &k2])).unwrap();
    until_status(&app, &token(&k2, json!({"scp": ["admin"]})), 200, "the file's new key").await;
    // A broken file is kept out at startup with one line naming the setting.
    std::fs::write(&file, "{\"keys\": []}").unwrap();
    let mut config = app.config.clone();
    config.jwt_key = berth::config::JwtKey::Jwks {
        source: berth::config::JwksSource::File(file.clone()),
        min_refresh: Duration::from_secs(1),
        max_age: Duration::from_secs(300),
    };
    let err = berth::auth::JwtVerifier::from_config(&config).err().expect("refused");
    assert!(err.to_string().starts_with("invalid BERTH_JWT_JWKS_FILE"), "{err}");
}
