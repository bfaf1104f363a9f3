//! Secrets and generated identities: the JWT key (a secret, a `*_FILE`, a public key, or one generated
//! into the data directory with mode 0600) and files created once (the node id).
use std::path::{Path, PathBuf};

use super::source::Source;
use super::{ConfigError, JwksSource, JwtKey, bad};
use std::time::Duration;

pub(super) fn load_jwt_key(src: &Source, data_dir: &Path) -> Result<JwtKey, ConfigError> {
    let url = src.get("jwt_jwks_url")?;
    let file = src.get("jwt_jwks_file")?;
    let source = match (url, file) {
        (Some(_), Some(_)) => {
            return Err(bad("BERTH_JWT_JWKS_URL", "give a JWKS URL or a JWKS file, not both"));
        }
        (Some(url), None) => {
            if !(url.starts_with("https://") || url.starts_with("http://")) {
                return Err(bad(
                    "BERTH_JWT_JWKS_URL",
                    format!("{url:?}: must be an http:// or https:// URL"),
                ));
            }
            Some(JwksSource::Url(url))
        }
        (None, Some(path)) => Some(JwksSource::File(PathBuf::from(path))),
        (None, None) => None,
    };
    if let Some(source) = source {
        return Ok(JwtKey::Jwks {
            source,
            min_refresh: Duration::from_secs(src.num("jwt_jwks_min_refresh_secs")?),
            max_age: Duration::from_secs(src.positive("jwt_jwks_cache_secs")?),
        });
    }
    if let Some(path) = src.get("jwt_public_key_file")?.map(PathBuf::from) {
        let pem =
            std::fs::read(&path).map_err(|e| bad("BERTH_JWT_PUBLIC_KEY_FILE", format!("{}: {e}", path.display())))?;
        return Ok(JwtKey::PublicKeyPem(pem));
    }
    if let Some(secret) = src.get("jwt_secret")? {
        return secret_key("BERTH_JWT_SECRET", secret.into_bytes());
    }
    if let Some(path) = src.get("jwt_secret_file")?.map(PathBuf::from) {
        let bytes =
            std::fs::read(&path).map_err(|e| bad("BERTH_JWT_SECRET_FILE", format!("{}: {e}", path.display())))?;
        return secret_key("BERTH_JWT_SECRET_FILE", trim_newline(bytes));
    }
    let (bytes, created) = read_or_create(&data_dir.join("jwt-secret"), || {
        let mut raw = [0u8; 48];
        getrandom::fill(&mut raw).expect("the operating system's random source");
        use base64::Engine;
        base64::engine::general_purpose::URL_SAFE_NO_PAD
            .encode(raw)
            .into_bytes()
    })
    .map_err(|e| bad("BERTH_JWT_SECRET", e))?;
    if created {
        tracing::info!(path = %data_dir.join("jwt-secret").display(), "generated a JWT signing secret");
    }
    match secret_key("BERTH_JWT_SECRET", trim_newline(bytes))? {
        JwtKey::Secret { secret, .. } => Ok(JwtKey::Secret {
            secret,
            generated: true,
            created,
        }),
        other => Ok(other),
    }
}

/// Reads the file a `*_FILE` setting names (trailing newline trimmed), if it is set.
pub(super) fn secret_from_file(var: &str, path: Option<String>) -> Result<Option<String>, ConfigError> {
    let Some(path) = path else {
        return Ok(None);
    };
    let bytes = std::fs::read(&path).map_err(|e| bad(var, format!("{path}: {e}")))?;
    let text = String::from_utf8(trim_newline(bytes)).map_err(|_| bad(var, format!("{path}: not UTF-8")))?;
    Ok(Some(text))
}

fn secret_key(setting: &str, secret: Vec<u8>) -> Result<JwtKey, ConfigError> {
    if secret.len() < 32 {
        return Err(bad(setting, "an HS256 secret must be at least 32 bytes"));
    }
    Ok(JwtKey::Secret {
        secret,
        generated: false,
        created: false,
    })
}

fn trim_newline(mut bytes: Vec<u8>) -> Vec<u8> {
    while matches!(bytes.last(), Some(b'\n' | b'\r')) {
        bytes.pop();
    }
    bytes
}

/// Reads a small file from the data dir, or creates it with mode 0600 (atomically: a racing process
/// either wins the create or reads the winner's content). Returns the content and whether it was created.
pub(super) fn read_or_create(path: &Path, make: impl FnOnce() -> Vec<u8>) -> Result<(Vec<u8>, bool), String> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    match std::fs::read(path) {
        Ok(bytes) if !bytes.is_empty() => return Ok((bytes, false)),
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(format!("{}: {e}", path.display())),
    }
    let content = make();
    let tmp = path.with_extension(format!("tmp-{}", std::process::id()));
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(|e| format!("{}: {e}", tmp.display()))?;
    f.write_all(&content)
        .and_then(|_| f.sync_all())
        .map_err(|e| format!("{}: {e}", tmp.display()))?;
    // hard_link fails if the target exists, so the first writer wins and everyone reads its value.
    let created = match std::fs::hard_link(&tmp, path) {
        Ok(()) => true,
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => false,
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            return Err(format!("{}: {e}", path.display()));
        }
    };
    let _ = std::fs::remove_file(&tmp);
    let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok((bytes, created))
}
