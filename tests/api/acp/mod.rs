//! The real Agent Client Protocol agents, pinned in `tests/acp/<agent>` and installed by
//! `.ci/acp`, run fully offline against the suite's scripted model server, each with its own HOME: opencode
//! (OpenAI Chat Completions), Claude Code through claude-agent-acp (Anthropic Messages), Codex through
//! codex-acp (OpenAI Responses) and Gemini CLI (Gemini `streamGenerateContent`). Everything goes through
//! the real berth server on both databases.
//!
//! Without an agent installed its tests pass without running and say so on stderr; with `CI` set a missing
//! agent is a failure.
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Once;

use serde_json::json;
use tempfile::TempDir;

use crate::helpers::TestApp;
use crate::model_server::ModelServer;

mod check;
mod hostile;
mod scenarios;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Opencode,
    Claude,
    Codex,
    Gemini,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Opencode => "opencode",
            Kind::Claude => "claude",
            Kind::Codex => "codex",
            Kind::Gemini => "gemini",
        }
    }

    /// The pinned version, as `tests/acp/<agent>/package.json` holds it.
    fn pinned(self) -> &'static str {
        match self {
            Kind::Opencode => "1.18.33",
            Kind::Claude => "0.101.0",
            Kind::Codex => "2.6.0",
            Kind::Gemini => "0.61.0",
        }
    }

    /// The installed package (its package.json) and the launch command (path relative to the repository).
    fn package_and_command(self) -> (&'static str, Vec<&'static str>) {
        match self {
            Kind::Opencode => (
                "opencode-linux-x64",
                vec!["node_modules/opencode-linux-x64/bin/opencode", "acp", "--pure"],
            ),
            Kind::Claude => (
                "@agentclientprotocol/claude-agent-acp",
                vec![
                    "node",
                    "node_modules/@agentclientprotocol/claude-agent-acp/dist/index.js",
                ],
            ),
            Kind::Codex => ("@agentclientprotocol/codex-acp", vec!["node_modules/.bin/codex-acp"]),
            Kind::Gemini => ("@google/gemini-cli", vec!["node_modules/.bin/gemini", "--acp"]),
        }
    }
}

static MISSING: Once = Once::new();

/// The agent's install directory, or `None` (with a notice past the harness's capture) when it is not
/// installed. With `CI` set a missing agent panics: CI installs them with `.ci/acp`, never skips.
fn installed(kind: Kind) -> Option<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/acp")
        .join(kind.name());
    let (package, _) = kind.package_and_command();
    let manifest = dir.join("node_modules").join(package).join("package.json");
    let version = std::fs::read_to_string(&manifest)
        .ok()
        .and_then(|s| serde_json::from_str::<serde_json::Value>(&s).ok())
        .and_then(|v| v["version"].as_str().map(str::to_string));
    if version.as_deref() == Some(kind.pinned()) {
        return Some(dir);
    }
    let why = format!(
        "{} {} is not installed in {} (found {version:?}; install it with .ci/acp)",
        kind.name(),
        kind.pinned(),
        dir.display()
    );
    if std::env::var_os("CI").is_some_and(|v| !v.is_empty()) {
        panic!("CI is set but the ACP agent tests cannot run: {why}");
    }
    MISSING.call_once(|| {
        let _ = writeln!(
            std::io::stderr(),
            "\nnote: some ACP agent tests did not run: {why}; they pass without running\n"
        );
    });
    None
}

/// One agent for one test: its install, the scripted model server, and a HOME of its own (kept across
/// restarts: the agents keep their conversations there).
pub struct Agent {
    pub kind: Kind,
    pub model: ModelServer,
    dir: PathBuf,
    home: TempDir,
}

impl Agent {
    pub async fn start(kind: Kind) -> Option<Agent> {
        let dir = installed(kind)?;
        let model = ModelServer::start().await;
        // The agents' side calls (titles) carry the user's text: scripted replies are for turns.
        model.scripts_need_tools();
        let home = TempDir::new().unwrap();
        Some(Agent { kind, model, dir, home })
    }

    fn home(&self) -> &Path {
        self.home.path()
    }

    /// The profile an operator would write (README, "Agents that speak ACP"), pointed at the model server.
    pub fn profile(&self) -> berth::config::AgentProfile {
        let (_, command) = self.kind.package_and_command();
        let resolve = |part: &str| {
            if part.starts_with("node_modules/") {
                self.dir.join(part).display().to_string()
            } else {
                part.to_string()
            }
        };
        let home = self.home().display().to_string();
        let mut env = BTreeMap::from([
            ("HOME".to_string(), home.clone()),
            ("XDG_CONFIG_HOME".to_string(), format!("{home}/.config")),
            ("XDG_DATA_HOME".to_string(), format!("{home}/.local/share")),
            ("XDG_CACHE_HOME".to_string(), format!("{home}/.cache")),
            ("XDG_STATE_HOME".to_string(), format!("{home}/.local/state")),
            ("NO_PROXY".to_string(), "127.0.0.1,localhost".to_string()),
        ]);
        let (mut mode, mut fs_read) = (None, None);
        let put = |env: &mut BTreeMap<String, String>, pairs: &[(&str, String)]| {
            for (k, v) in pairs {
                env.insert(k.to_string(), v.clone());
            }
        };
        match self.kind {
            Kind::Opencode => {
                let config = self.home().join("opencode.json");
                let body = json!({
                    "$schema": "https://opencode.ai/config.json",
                    "autoupdate": false,
                    "share": "disabled",
                    "model": "mock/mock-model",
                    "small_model": "mock/mock-model",
                    "enabled_providers": ["mock"],
                    "provider": {"mock": {
                        "npm": "@ai-sdk/openai-compatible",
                        "name": "Mock",
                        "options": {"baseURL": self.model.base_url(), "apiKey": "dummy"},
                        "models": {"mock-model": {"name": "Mock Model", "tool_call": true,
                            "limit": {"context": 128000, "output": 4096}}},
                    }},
                    "permission": {"edit": "ask", "bash": "ask", "webfetch": "deny"},
                    "lsp": false,
                    "formatter": false,
                });
                std::fs::write(&config, body.to_string()).unwrap();
                env.insert("OPENCODE_CONFIG".into(), config.display().to_string());
                for flag in [
                    "AUTOUPDATE",
                    "MODELS_FETCH",
                    "LSP_DOWNLOAD",
                    "DEFAULT_PLUGINS",
                    "SHARE",
                    "CLAUDE_CODE",
                    "EXTERNAL_SKILLS",
                    "PROJECT_CONFIG",
                ] {
                    env.insert(format!("OPENCODE_DISABLE_{flag}"), "1".into());
                }
            }
            Kind::Claude => put(
                &mut env,
                &[
                    ("ANTHROPIC_BASE_URL", self.model.origin()),
                    ("ANTHROPIC_API_KEY", "dummy".into()),
                    ("CLAUDE_CONFIG_DIR", format!("{home}/.claude")),
                    ("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1".into()),
                    ("DISABLE_AUTOUPDATER", "1".into()),
                    ("DISABLE_TELEMETRY", "1".into()),
                    ("DISABLE_ERROR_REPORTING", "1".into()),
                    ("DISABLE_NON_ESSENTIAL_MODEL_CALLS", "1".into()),
                    ("ANTHROPIC_MODEL", "claude-sonnet-4-5".into()),
                    ("ANTHROPIC_SMALL_FAST_MODEL", "claude-haiku-4-5".into()),
                ],
            ),
            Kind::Codex => {
                let codex_home = self.home().join(".codex");
                std::fs::create_dir_all(&codex_home).unwrap();
                let config = format!(
                    r#"model = "gpt-5.5"
model_provider = "mock"
approval_policy = "on-request"
sandbox_mode = "danger-full-access"
check_for_update_on_startup = false

[model_providers.mock]
name = "Mock"
base_url = "{}"
env_key = "MOCK_API_KEY"
wire_api = "responses"
request_max_retries = 0
stream_max_retries = 0

[analytics]
enabled = false
"#,
                    self.model.base_url()
                );
                std::fs::write(codex_home.join("config.toml"), config).unwrap();
                put(
                    &mut env,
                    &[
                        ("CODEX_HOME", codex_home.display().to_string()),
                        ("MOCK_API_KEY", "dummy".into()),
                        ("OPENAI_API_KEY", "dummy".into()),
                        ("RUST_LOG", "warn".into()),
                    ],
                );
                // Its default mode sends approvals to a second model call instead of the client.
                mode = Some("read-only".to_string());
            }
            Kind::Gemini => {
                let dir = self.home().join(".gemini");
                std::fs::create_dir_all(&dir).unwrap();
                let settings = json!({
                    "security": {"auth": {"selectedType": "gemini-api-key"}},
                    "general": {"disableAutoUpdate": true, "disableUpdateNag": true},
                    "privacy": {"usageStatisticsEnabled": false},
                    "telemetry": {"enabled": false},
                    "model": {"name": "gemini-2.5-flash"},
                });
                std::fs::write(dir.join("settings.json"), settings.to_string()).unwrap();
                put(
                    &mut env,
                    &[
                        ("GEMINI_API_KEY", "dummy".into()),
                        ("GOOGLE_GEMINI_BASE_URL", self.model.origin()),
                        ("GEMINI_CLI_NO_RELAUNCH", "true".into()),
                        ("GEMINI_SANDBOX", "false".into()),
                    ],
                );
                // gemini-cli 0.61 cannot create a new file through a client that offers reads.
                fs_read = Some(false);
            }
        }
        berth::config::AgentProfile {
            command: resolve(command[0]),
            args: command[1..].iter().map(|a| resolve(a)).collect(),
            env,
            pass_env: Vec::new(),
            protocol: berth::config::AgentProtocol::Acp,
            mode,
            fs_read,
            mcp_servers: Vec::new(),
            // In its box: its own HOME (kept across restarts by the test) and the model server, nothing else.
            writable_paths: vec![self.home().to_path_buf()],
            endpoints: vec![self.model.endpoint()],
            ..Default::default()
        }
    }
}

/// Replaces the app `both_backends!` made with one on the same backend that also has this agent's
/// profile (named after the agent). `None` when the agent is not installed (outside CI) or the backend is
/// not configured.
pub async fn with_agent(app: TestApp, kind: Kind) -> Option<(TestApp, Agent)> {
    let backend = app.backend;
    drop(app);
    let agent = Agent::start(kind).await?;
    let profiles = vec![(kind.name().to_string(), agent.profile())];
    let app = TestApp::spawn_with_profiles(backend, &[], profiles).await?;
    Some((app, agent))
}
