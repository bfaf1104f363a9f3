//! Configuration: defaults, files, environment and secrets, and the errors that name the setting.
use super::*;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

fn env(pairs: &[(&str, &str)], dir: &Path) -> BTreeMap<String, String> {
    let mut m: BTreeMap<String, String> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    m.entry("BERTH_DATA_DIR".into())
        .or_insert_with(|| dir.display().to_string());
    m
}

#[test]
fn defaults_need_no_configuration_and_keep_generated_values() {
    let dir = tempfile::TempDir::new().unwrap();
    let c = Config::load(&env(&[], dir.path())).unwrap();
    let data = dir.path().canonicalize().unwrap();
    assert_eq!(c.bind.to_string(), "127.0.0.1:8080");
    assert_eq!(
        c.database_url,
        format!("sqlite://{}?mode=rwc", data.join("berth.db").display())
    );
    assert_eq!(c.worktree_root, data.join("worktrees"));
    assert!(c.worktree_root.is_dir());
    assert_eq!((c.jwt_issuer.as_str(), c.jwt_audience.as_str()), ("berth", "berth-api"));
    assert_eq!(c.log_format, LogFormat::Text);
    assert!(c.repo_roots.is_none());
    let JwtKey::Secret { secret, generated } = &c.jwt_key else {
        panic!("expected a secret")
    };
    assert!(generated);
    let mode = std::fs::metadata(data.join("jwt-secret")).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "the secret is private");
    // A second start reads the same secret and node id.
    let again = Config::load(&env(&[], dir.path())).unwrap();
    let JwtKey::Secret { secret: secret2, .. } = &again.jwt_key else {
        panic!()
    };
    assert_eq!(secret, secret2);
    assert_eq!(c.node_id, again.node_id);
}

#[test]
fn bad_values_name_the_setting() {
    let dir = tempfile::TempDir::new().unwrap();
    let cases = [
        ("BERTH_BIND", "nonsense"),
        ("BERTH_LOG_FORMAT", "xml"),
        ("BERTH_DB_MAX_CONNECTIONS", "many"),
        ("BERTH_DB_MAX_CONNECTIONS", "0"),
        ("BERTH_STREAM_INTERVAL_MS", "0"),
        ("BERTH_DATABASE_URL", "mysql://x"),
        ("BERTH_JWT_SECRET", "short"),
        ("BERTH_JWT_SECRET_FILE", "/nonexistent/secret"),
        ("BERTH_REPO_ROOTS", "/nonexistent/root"),
        ("BERTH_CONFIG", "/nonexistent/berth.toml"),
        ("BERTH_CORS_ORIGINS", "*"),
        ("BERTH_CORS_ORIGINS", "https://app.example/"),
        ("BERTH_CORS_ORIGINS", "app.example"),
        ("BERTH_CORS_ORIGINS", "https://ok.example,http://x:port"),
    ];
    for (var, value) in cases {
        let err = Config::load(&env(&[(var, value)], dir.path())).unwrap_err();
        assert_eq!(err.setting, var, "{err}");
        assert!(err.to_string().starts_with(&format!("invalid {var}: ")), "{err}");
        assert!(!err.to_string().contains('\n'), "one line: {err}");
    }
}

#[test]
fn file_then_environment_then_secret_files() {
    let dir = tempfile::TempDir::new().unwrap();
    let file = dir.path().join("berth.toml");
    std::fs::write(
        &file,
        "bind = \"127.0.0.1:9000\"\njwt_issuer = \"from-file\"\nlog_format = \"json\"\n[agents.pi]\ncommand = \"pi\"\nargs = [\"--mode\", \"rpc\"]\n",
    )
    .unwrap();
    let secret = dir.path().join("secret");
    std::fs::write(&secret, "0123456789abcdef0123456789abcdef\n").unwrap();
    let url = dir.path().join("url");
    std::fs::write(&url, "postgres://u:p@db/berth\n").unwrap();
    let c = Config::load(&env(
        &[
            ("BERTH_CONFIG", file.to_str().unwrap()),
            ("BERTH_BIND", "127.0.0.1:9001"),
            ("BERTH_JWT_SECRET_FILE", secret.to_str().unwrap()),
            ("BERTH_DATABASE_URL_FILE", url.to_str().unwrap()),
        ],
        dir.path(),
    ))
    .unwrap();
    assert_eq!(c.bind.port(), 9001, "the environment wins over the file");
    assert_eq!(c.jwt_issuer, "from-file");
    assert_eq!(c.log_format, LogFormat::Json);
    assert_eq!(c.database_url, "postgres://u:p@db/berth");
    assert_eq!(c.agents["pi"].args, vec!["--mode", "rpc"]);
    assert!(c.cors_origins.is_empty(), "no CORS by default");
    let JwtKey::Secret { secret, generated } = &c.jwt_key else {
        panic!()
    };
    assert_eq!(secret.as_slice(), b"0123456789abcdef0123456789abcdef");
    assert!(!generated);
    // Unknown keys in the file are refused, naming the file setting.
    std::fs::write(&file, "bnid = \"x\"\n").unwrap();
    let err = Config::load(&env(&[("BERTH_CONFIG", file.to_str().unwrap())], dir.path())).unwrap_err();
    assert_eq!(err.setting, "BERTH_CONFIG");
    assert!(err.reason.contains("bnid"), "{err}");
}
