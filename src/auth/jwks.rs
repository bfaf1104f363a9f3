//! Verification keys from a JSON Web Key Set (RFC 7517), for tokens an identity provider signs: a URL
//! fetched and cached (`BERTH_JWT_JWKS_URL`) or a local file (`BERTH_JWT_JWKS_FILE`), read again when
//! the set is older than its cache age or a token names a `kid` the set lacks, at most once per minimum
//! interval. Each key carries its algorithm; symmetric keys are never taken from a set.
use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, JwkSet, KeyAlgorithm, PublicKeyUse};
use jsonwebtoken::{Algorithm, DecodingKey};

pub use crate::config::JwksSource;

/// A verification key and the one algorithm it verifies.
#[derive(Clone)]
pub struct Key {
    pub decoding: DecodingKey,
    pub algorithm: Algorithm,
}

#[derive(Default)]
struct Cached {
    /// By `kid`; a key without one is under "" (usable only by a token without a `kid`).
    keys: HashMap<String, Key>,
    /// When the set was last read successfully, and when a read was last tried.
    fetched: Option<Instant>,
    attempted: Option<Instant>,
}

pub struct Jwks {
    source: JwksSource,
    client: reqwest::Client,
    min_refresh: Duration,
    max_age: Duration,
    cache: RwLock<Cached>,
    /// One read at a time: concurrent requests with an unknown `kid` wait for the same read.
    refreshing: tokio::sync::Mutex<()>,
}

impl Jwks {
    pub fn new(source: JwksSource, min_refresh: Duration, max_age: Duration) -> anyhow::Result<Jwks> {
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .user_agent(concat!("berth/", env!("CARGO_PKG_VERSION")))
            .build()?;
        let jwks = Jwks {
            source,
            client,
            min_refresh,
            max_age,
            cache: RwLock::default(),
            refreshing: tokio::sync::Mutex::new(()),
        };
        // A file is read at once, so a broken one stops startup instead of failing every request.
        if let JwksSource::File(path) = &jwks.source {
            let text = std::fs::read_to_string(path)
                .map_err(|e| anyhow::anyhow!("invalid BERTH_JWT_JWKS_FILE: {}: {e}", path.display()))?;
            let keys = parse(&text).map_err(|e| anyhow::anyhow!("invalid BERTH_JWT_JWKS_FILE: {e}"))?;
            let now = Instant::now();
            *jwks.write() = Cached {
                keys,
                fetched: Some(now),
                attempted: Some(now),
            };
        }
        Ok(jwks)
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Cached> {
        self.cache.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Cached> {
        self.cache.write().unwrap_or_else(|e| e.into_inner())
    }

    /// The cached key for `kid`, reading nothing.
    pub fn cached(&self, kid: Option<&str>) -> Option<Key> {
        self.read().keys.get(kid.unwrap_or("")).cloned()
    }

    /// The key for `kid`: from the cache (a stale cache is read again in the background, so no request
    /// waits on the provider for a key it has); for a `kid` the cache lacks, after reading the set again
    /// (when the last read was at least the minimum interval ago; otherwise what the cache has).
    pub async fn key(self: &Arc<Self>, kid: Option<&str>) -> Option<Key> {
        let (found, fresh) = {
            let c = self.read();
            let fresh = c.fetched.is_some_and(|t| t.elapsed() < self.max_age);
            (c.keys.get(kid.unwrap_or("")).cloned(), fresh)
        };
        match found {
            Some(key) => {
                // Not while a read runs already (a burst of requests spawns one read, not many).
                if !fresh && self.refreshing.try_lock().is_ok() {
                    let me = self.clone();
                    tokio::spawn(async move { me.refresh().await });
                }
                Some(key)
            }
            None => {
                self.refresh().await;
                self.cached(kid)
            }
        }
    }

    /// Reads the set again unless a read was tried less than the minimum interval ago. A failed read
    /// keeps the keys the cache has (an identity provider's outage does not log everyone out).
    pub async fn refresh(&self) {
        let _one = self.refreshing.lock().await;
        if self.read().attempted.is_some_and(|t| t.elapsed() < self.min_refresh) {
            return;
        }
        self.write().attempted = Some(Instant::now());
        match self.fetch().await {
            Ok(keys) => {
                tracing::info!(keys = keys.len(), source = ?self.source, "read the JWKS");
                let mut c = self.write();
                c.keys = keys;
                c.fetched = Some(Instant::now());
            }
            Err(e) => {
                tracing::warn!(source = ?self.source, error = %e, "reading the JWKS failed; keeping the cached keys")
            }
        }
    }

    async fn fetch(&self) -> Result<HashMap<String, Key>, String> {
        let text = match &self.source {
            JwksSource::File(path) => tokio::fs::read_to_string(path)
                .await
                .map_err(|e| format!("{}: {e}", path.display()))?,
            JwksSource::Url(url) => {
                let r = self.client.get(url).send().await.map_err(|e| format!("{url}: {e}"))?;
                if !r.status().is_success() {
                    return Err(format!("{url}: HTTP {}", r.status()));
                }
                r.text().await.map_err(|e| format!("{url}: {e}"))?
            }
        };
        parse(&text)
    }
}

/// The signing keys of a JWKS document, by `kid`. Encryption keys, symmetric keys and keys of an
/// algorithm berth does not verify are left out; a set with none left is an error.
pub fn parse(text: &str) -> Result<HashMap<String, Key>, String> {
    let set: JwkSet = serde_json::from_str(text).map_err(|e| format!("not a JWKS: {e}"))?;
    let mut keys = HashMap::new();
    for jwk in &set.keys {
        if matches!(jwk.common.public_key_use, Some(PublicKeyUse::Encryption)) {
            continue;
        }
        let Some(algorithm) = algorithm_of(jwk.common.key_algorithm, &jwk.algorithm) else {
            tracing::debug!(kid = ?jwk.common.key_id, "skipping a JWKS key berth does not verify with");
            continue;
        };
        let Ok(decoding) = DecodingKey::from_jwk(jwk) else {
            tracing::debug!(kid = ?jwk.common.key_id, "skipping a malformed JWKS key");
            continue;
        };
        keys.insert(
            jwk.common.key_id.clone().unwrap_or_default(),
            Key { decoding, algorithm },
        );
    }
    if keys.is_empty() {
        return Err("the JWKS has no signing key berth can use (RSA, EC P-256/P-384 or Ed25519)".into());
    }
    Ok(keys)
}

/// The key's algorithm: its `alg` when given (never an HMAC one), else the one its type implies.
fn algorithm_of(alg: Option<KeyAlgorithm>, params: &AlgorithmParameters) -> Option<Algorithm> {
    use Algorithm::*;
    let implied = match params {
        AlgorithmParameters::RSA(_) => Some(RS256),
        AlgorithmParameters::EllipticCurve(p) => match p.curve {
            EllipticCurve::P256 => Some(ES256),
            EllipticCurve::P384 => Some(ES384),
            _ => None,
        },
        AlgorithmParameters::OctetKeyPair(p) if p.curve == EllipticCurve::Ed25519 => Some(EdDSA),
        _ => None,
    }?;
    let Some(alg) = alg else {
        return Some(implied);
    };
    let stated = Algorithm::try_from(alg).ok()?;
    let family_matches = match implied {
        RS256 => matches!(stated, RS256 | RS384 | RS512 | PS256 | PS384 | PS512),
        other => stated == other,
    };
    family_matches.then_some(stated)
}
