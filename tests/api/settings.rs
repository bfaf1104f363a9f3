//! Settings an operator can discover. `berth serve --help` lists every setting with its variable, TOML
//! key and default; `berth config` prints the effective configuration, secrets redacted; `berth token`
//! does not mint with a secret it just made up.
use std::process::{Command, Output};

use berth::config::settings::{Fallback, SETTINGS};

fn berth(args: &[&str], vars: &[(&str, &str)], dir: &std::path::Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_berth"))
        .args(args)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .envs(vars.iter().copied())
        .current_dir(dir)
        .output()
        .unwrap()
}

fn text(out: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&out.stdout).to_string(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

#[test]
fn serve_help_lists_every_setting_with_variable_key_and_default() {
    let dir = tempfile::TempDir::new().unwrap();
    let out = berth(
        &["serve", "--help"],
        &[("BERTH_JWT_SECRET", "do-not-show-me-0123456789abcdef-xx")],
        dir.path(),
    );
    let (help, _) = text(&out);
    assert!(out.status.success(), "{help}");
    // clap wraps long lines; compare without the wrapping.
    let flat = help.split_whitespace().collect::<Vec<_>>().join(" ");
    for s in SETTINGS {
        assert!(
            flat.contains(&format!("--{} <", s.flag())),
            "--{} missing:\n{help}",
            s.flag()
        );
        assert!(
            flat.contains(&format!("[env: {}", s.var())),
            "{} missing:\n{help}",
            s.var()
        );
        if s.in_file {
            assert!(
                flat.contains(&format!("[toml: {}]", s.key)),
                "{} key missing:\n{help}",
                s.key
            );
        }
        match s.default {
            Fallback::Value(v) => assert!(flat.contains(&format!("[default: {v}]")), "{} default:\n{help}", s.key),
            Fallback::Computed(how) => assert!(flat.contains(&format!("[default: {how}]")), "{}:\n{help}", s.key),
            Fallback::None => {}
        }
    }
    assert!(
        !help.contains("do-not-show-me"),
        "a secret's value is not shown:\n{help}"
    );
    assert!(!flat.contains("FAILPOINT"), "the test failpoint is no setting");
}

#[test]
fn the_readme_documents_every_setting() {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    for s in SETTINGS {
        assert!(readme.contains(&format!("`{}`", s.var())), "README lacks {}", s.var());
    }
}

#[test]
fn config_prints_the_effective_configuration_with_secrets_redacted() {
    let dir = tempfile::TempDir::new().unwrap();
    let data = dir.path().join("data");
    let file = dir.path().join("berth.toml");
    std::fs::write(&file, "git_timeout_secs = 33\nevent_buffer = 77\n").unwrap();
    let out = berth(
        &["config", "--event-buffer", "88", "--data-dir", data.to_str().unwrap()],
        &[
            ("BERTH_CONFIG", file.to_str().unwrap()),
            ("BERTH_JWT_SECRET", "0123456789abcdef0123456789abcdef-hidden"),
            ("BERTH_DATABASE_URL", "postgres://berth:pw-hidden@db/berth"),
            ("BERTH_BIND", "0.0.0.0:9999"),
        ],
        dir.path(),
    );
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stderr}");
    assert!(stdout.contains("git_timeout_secs = 33\n"), "from the file:\n{stdout}");
    assert!(stdout.contains("event_buffer = 88\n"), "the flag wins:\n{stdout}");
    assert!(
        stdout.contains("bind = \"0.0.0.0:9999\"\n"),
        "from the environment:\n{stdout}"
    );
    assert!(stdout.contains("cleanup_workers = 2\n"), "defaults too:\n{stdout}");
    let data = data.canonicalize().unwrap();
    assert!(
        stdout.contains(&format!("data_dir = \"{}\"", data.display())),
        "{stdout}"
    );
    assert!(!stdout.contains("hidden"), "{stdout}");
    assert!(stdout.contains("<redacted>"), "{stdout}");
    // A bad value is one line naming the setting, and exit 2.
    let out = berth(&["config", "--git-timeout-secs", "soon"], &[], dir.path());
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("invalid BERTH_GIT_TIMEOUT_SECS"), "{stderr}");
}

#[test]
fn token_refuses_a_secret_it_just_generated_and_names_the_data_dir() {
    let dir = tempfile::TempDir::new().unwrap();
    let data = dir.path().join("elsewhere");
    let args = ["token", "--sub", "me", "--scope", "admin"];
    let vars = [("BERTH_DATA_DIR", data.to_str().unwrap())];
    let out = berth(&args, &vars, dir.path());
    let (stdout, stderr) = text(&out);
    let data = data.canonicalize().unwrap();
    assert!(!out.status.success(), "refused: {stdout}");
    assert!(stdout.is_empty(), "no token: {stdout}");
    assert!(
        stderr.contains(&data.display().to_string()),
        "names the data dir: {stderr}"
    );
    assert!(stderr.contains("--new-secret"), "{stderr}");
    assert!(
        !data.join("jwt-secret").exists(),
        "the made-up secret is not left behind"
    );

    let with = [&args[..], &["--new-secret"]].concat();
    let out = berth(&with, &vars, dir.path());
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains(&data.display().to_string()), "{stderr}");
    assert!(data.join("jwt-secret").exists());
    let token = stdout.trim().to_string();

    // Now the data dir has a secret: minting needs no flag, and a server on that dir accepts both tokens.
    let out = berth(&args, &vars, dir.path());
    let (again, stderr) = text(&out);
    assert!(out.status.success(), "{stderr}");
    let env: std::collections::BTreeMap<String, String> =
        [("BERTH_DATA_DIR".to_string(), data.display().to_string())].into();
    let config = berth::config::Config::load(&env).unwrap();
    let verifier = berth::auth::JwtVerifier::from_config(&config).unwrap();
    for t in [token.as_str(), again.trim()] {
        assert_eq!(verifier.verify(t).unwrap().sub, "me");
    }
}
