//! Authentication: JWT verification with a pinned algorithm, the `Principal` it yields (scopes,
//! workspace tenancy, optional session binding) and token minting for `berth token`.
use crate::ids::{SessionId, WorkspaceId};
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde::{Deserialize, Serialize};

mod claims;
pub mod jwks;
pub use crate::scope;
pub use scope::Scope;

use std::sync::Arc;

use jwks::Jwks;

use crate::config::{Config, JwtKey};
use crate::error::{Error, Result};

/// Who is calling, as proven by a verified token.
#[derive(Debug, Clone)]
pub struct Principal {
    pub sub: String,
    scopes: Vec<Scope>,
    /// `None`: every workspace.
    workspaces: Option<Vec<WorkspaceId>>,
    /// An agent's token: it may act only on this session (and read its task and environment).
    pub session_id: Option<SessionId>,
    /// The token's `name` and `email` claims, when it has them (the author of what berth commits for it).
    pub name: Option<String>,
    pub email: Option<String>,
}

impl Principal {
    /// A principal carried by something other than a token (a stream ticket records its minting token's).
    pub fn new(
        sub: String,
        scopes: Vec<Scope>,
        workspaces: Option<Vec<WorkspaceId>>,
        session_id: Option<SessionId>,
    ) -> Principal {
        Principal {
            sub,
            scopes,
            workspaces,
            session_id,
            name: None,
            email: None,
        }
    }

    /// The scopes as the token listed them (`admin` not expanded).
    pub fn scopes(&self) -> &[Scope] {
        &self.scopes
    }

    pub fn has(&self, scope: Scope) -> bool {
        self.scopes.contains(&Scope::Admin) || self.scopes.contains(&scope)
    }

    pub fn require(&self, scope: Scope) -> Result<()> {
        if self.has(scope) {
            Ok(())
        } else {
            Err(Error::InsufficientScope(scope))
        }
    }

    /// I33: a resource in a workspace outside the token's list is reported missing, never forbidden.
    pub fn sees_workspace(&self, workspace_id: WorkspaceId) -> bool {
        self.workspaces.as_ref().is_none_or(|ids| ids.contains(&workspace_id))
    }

    /// The workspaces this token is limited to, if any (for list filters).
    pub fn workspace_filter(&self) -> Option<&[WorkspaceId]> {
        self.workspaces.as_deref()
    }

    /// The same principal without its session binding (for reading an environment through a session the
    /// token was already allowed to read).
    pub fn without_session(mut self) -> Principal {
        self.session_id = None;
        self
    }

    /// The capability for operations a session-bound token must not perform (anything not about its
    /// session): refused for an agent's token, so a function that takes an `UnboundPrincipal` needs no check.
    pub fn unbound(self) -> Result<UnboundPrincipal> {
        if self.session_id.is_some() {
            Err(Error::SessionBound)
        } else {
            Ok(UnboundPrincipal(self))
        }
    }
}

/// A principal proven not to be bound to a session. Only `Principal::unbound` makes one.
#[derive(Debug, Clone)]
pub struct UnboundPrincipal(Principal);

impl std::ops::Deref for UnboundPrincipal {
    type Target = Principal;
    fn deref(&self) -> &Principal {
        &self.0
    }
}

#[derive(Debug, Serialize, Deserialize)]
pub struct Claims {
    pub sub: String,
    #[serde(default)]
    pub scope: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspaces: Option<Vec<WorkspaceId>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<SessionId>,
    pub exp: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iat: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iss: Option<String>,
    /// A string or a list (RFC 7519); jsonwebtoken has validated it before this is read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aud: Option<serde_json::Value>,
}

/// Where verification keys come from: one key with one algorithm, or a JWKS chosen by `kid`.
enum Keys {
    Static(jwks::Key),
    Set(Arc<Jwks>),
}

/// Verifies tokens with a pinned algorithm per key and, for a shared secret, mints them.
pub struct JwtVerifier {
    keys: Keys,
    encoding: Option<EncodingKey>,
    algorithm: Algorithm,
    validation: Validation,
    issuer: String,
    audience: String,
    /// The claims that carry the scopes and the workspace list (`scope` and `workspaces` by default).
    scope_claim: String,
    workspaces_claim: String,
}

impl JwtVerifier {
    pub fn from_config(config: &Config) -> anyhow::Result<JwtVerifier> {
        let (keys, encoding, algorithm) = match &config.jwt_key {
            JwtKey::Secret { secret, .. } => (
                Keys::Static(jwks::Key {
                    decoding: DecodingKey::from_secret(secret)?,
                    algorithm: Algorithm::HS256,
                }),
                Some(EncodingKey::from_secret(secret)?),
                Algorithm::HS256,
            ),
            JwtKey::PublicKeyPem(pem) => {
                let key = if let Ok(key) = DecodingKey::from_ed_pem(pem) {
                    jwks::Key {
                        decoding: key,
                        algorithm: Algorithm::EdDSA,
                    }
                } else {
                    let key = DecodingKey::from_rsa_pem(pem).map_err(|e| {
                        anyhow::anyhow!("invalid BERTH_JWT_PUBLIC_KEY_FILE: not an Ed25519 or RSA public key: {e}")
                    })?;
                    jwks::Key {
                        decoding: key,
                        algorithm: Algorithm::RS256,
                    }
                };
                let algorithm = key.algorithm;
                (Keys::Static(key), None, algorithm)
            }
            JwtKey::Jwks {
                source,
                min_refresh,
                max_age,
            } => (
                Keys::Set(Arc::new(Jwks::new(source.clone(), *min_refresh, *max_age)?)),
                None,
                Algorithm::RS256,
            ),
        };
        let mut validation = Validation::new(algorithm);
        validation.algorithms = vec![algorithm];
        validation.set_issuer(&[config.jwt_issuer.as_str()]);
        validation.set_audience(&[config.jwt_audience.as_str()]);
        validation.set_required_spec_claims(&["exp", "iss", "aud", "sub"]);
        validation.leeway = 30;
        validation.validate_exp = true;
        validation.validate_nbf = true;
        Ok(JwtVerifier {
            keys,
            encoding,
            algorithm,
            validation,
            issuer: config.jwt_issuer.clone(),
            audience: config.jwt_audience.clone(),
            scope_claim: config.jwt_scope_claim.clone(),
            workspaces_claim: config.jwt_workspaces_claim.clone(),
        })
    }

    /// Verifies a bearer token with the keys at hand (a JWKS's cached keys: nothing is fetched). Every
    /// failure is the same opaque 401: the reason goes to the log only.
    pub fn verify(&self, token: &str) -> Result<Principal> {
        match &self.keys {
            Keys::Static(key) => self.verify_with(token, key),
            Keys::Set(set) => {
                let kid = header_kid(token)?;
                let key = set.cached(kid.as_deref()).ok_or_else(unknown_kid)?;
                self.verify_with(token, &key)
            }
        }
    }

    /// `verify`, reading the JWKS again first when the token names a key the cache lacks (or the cache
    /// is older than its age), at most once per minimum interval.
    pub async fn authenticate(&self, token: &str) -> Result<Principal> {
        match &self.keys {
            Keys::Static(key) => self.verify_with(token, key),
            Keys::Set(set) => {
                let kid = header_kid(token)?;
                let key = set.key(kid.as_deref()).await.ok_or_else(unknown_kid)?;
                self.verify_with(token, &key)
            }
        }
    }

    /// Reads the JWKS once (at startup), so the first request does not wait for it.
    pub async fn warm_up(&self) {
        if let Keys::Set(set) = &self.keys {
            set.refresh().await;
        }
    }

    fn verify_with(&self, token: &str, key: &jwks::Key) -> Result<Principal> {
        // The validation built at startup fits every static key; a JWKS key of another algorithm gets
        // its own copy (a clone allocates its claim and audience sets: not per request when avoidable).
        let other;
        let validation = if self.validation.algorithms == [key.algorithm] {
            &self.validation
        } else {
            other = Validation {
                algorithms: vec![key.algorithm],
                ..self.validation.clone()
            };
            &other
        };
        let data = jsonwebtoken::decode::<serde_json::Map<String, serde_json::Value>>(token, &key.decoding, validation)
            .map_err(|e| {
                tracing::debug!(error = %e, "token rejected");
                Error::Unauthenticated("invalid or expired token")
            })?;
        claims::principal(data.claims, &self.scope_claim, &self.workspaces_claim)
    }

    pub fn mint(
        &self,
        sub: &str,
        scopes: &[Scope],
        workspaces: Option<Vec<WorkspaceId>>,
        session_id: Option<SessionId>,
        ttl: std::time::Duration,
    ) -> anyhow::Result<String> {
        let key = self.encoding.as_ref().ok_or_else(|| {
            anyhow::anyhow!("berth verifies with a public key and cannot mint tokens; use the matching private key")
        })?;
        let now = chrono::Utc::now().timestamp();
        let claims = Claims {
            sub: sub.to_string(),
            scope: scopes.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(" "),
            workspaces,
            session_id,
            exp: now + ttl.as_secs() as i64,
            iat: Some(now),
            iss: Some(self.issuer.clone()),
            aud: Some(serde_json::Value::String(self.audience.clone())),
        };
        Ok(jsonwebtoken::encode(&Header::new(self.algorithm), &claims, key)?)
    }
}

/// The `kid` of a token's header (`None` when it has none); a token whose header does not parse is refused.
fn header_kid(token: &str) -> Result<Option<String>> {
    let header = jsonwebtoken::decode_header(token).map_err(|e| {
        tracing::debug!(error = %e, "token rejected");
        Error::Unauthenticated("invalid or expired token")
    })?;
    Ok(header.kid)
}

fn unknown_kid() -> Error {
    tracing::debug!("token rejected: no key in the JWKS has its kid");
    Error::Unauthenticated("invalid or expired token")
}

/// Parses "90s", "30m", "1h", "7d" or plain seconds.
pub fn parse_ttl(s: &str) -> std::result::Result<std::time::Duration, String> {
    let s = s.trim();
    let (num, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: u64 = num
        .parse()
        .map_err(|_| format!("invalid ttl {s:?}: expected e.g. 30m, 1h, 7d"))?;
    let secs = match unit {
        "" | "s" => n,
        "m" => n * 60,
        "h" => n * 3600,
        "d" => n * 86400,
        _ => return Err(format!("invalid ttl {s:?}: unit must be s, m, h or d")),
    };
    if secs == 0 {
        return Err("ttl must be positive".into());
    }
    Ok(std::time::Duration::from_secs(secs))
}
