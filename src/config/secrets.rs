//! Secrets and generated identities: the JWT key (a secret, a `*_FILE`, a public key, or one generated
//! into the data directory with mode 0600) and files created once (the node id).
use std::path::{Path, PathBuf};

use super::{ConfigError, Env, FileConfig, JwtKey, bad};

pub(super) fn load_jwt_key(env: &dyn Env, file: &FileConfig, data_dir: &Path) -> Result<JwtKey, ConfigError> {
    if let Some(path) = env
        .get("BERTH_JWT_PUBLIC_KEY_FILE")
        .map(PathBuf::from)
        .or(file.jwt_public_key_file.clone())
    {
        let pem =
            std::fs::read(&path).map_err(|e| bad("BERTH_JWT_PUBLIC_KEY_FILE", format!("{}: {e}", path.display())))?;
        return Ok(JwtKey::PublicKeyPem(pem));
    }
    if let Some(secret) = env.get("BERTH_JWT_SECRET").or(file.jwt_secret.clone()) {
        return secret_key("BERTH_JWT_SECRET", secret.into_bytes());
    }
    if let Some(path) = env
        .get("BERTH_JWT_SECRET_FILE")
        .map(PathBuf::from)
        .or(file.jwt_secret_file.clone())
    {
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
        }),
        other => Ok(other),
    }
}

/// Reads `VAR_FILE`'s file (trailing newline trimmed), if the variable is set.
pub(super) fn secret_from_file(env: &dyn Env, var: &str) -> Result<Option<String>, ConfigError> {
    let Some(path) = env.get(var) else {
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
