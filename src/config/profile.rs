//! Agent profiles: what `[agents.<name>]` in the config file says about an agent, its protocol, its MCP
//! servers and its box (`crate::runtime::sandbox` builds the box from it).
use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::Deserialize;

/// An agent profile: defined only in the config file, never accepted over HTTP (decision 7).
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct AgentProfile {
    pub command: String,
    #[serde(default)]
    pub args: Vec<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Names of berth's own environment variables handed on to the agent, when set (model
    /// credentials come from the operator's environment, never written into the configuration file).
    #[serde(default)]
    pub pass_env: Vec<String>,
    /// How berth talks to the agent beyond the JSON-lines commands every agent speaks.
    #[serde(default)]
    pub protocol: AgentProtocol,
    /// ACP: the session mode berth sets once a conversation is open (an agent's own mode ids, for
    /// example codex's `read-only`, which sends its permission requests to berth).
    #[serde(default)]
    pub mode: Option<String>,
    /// ACP: whether berth offers the agent `fs/read_text_file` (default true). gemini-cli 0.61 cannot
    /// create a new file through a client that offers reads (it mistakes "not found" for a failure).
    #[serde(default)]
    pub fs_read: Option<bool>,
    /// ACP: the MCP servers handed to the agent with every conversation it opens or loads
    /// (`[[agents.<name>.mcp_servers]]`).
    #[serde(default)]
    pub mcp_servers: Vec<McpServer>,
    /// The agent's box (`bwrap`, the default) or none at all (`none`: berth warns at every start).
    #[serde(default)]
    pub sandbox: SandboxMode,
    /// The box's own network with only `endpoints` (`box`, the default), or the host's (`host`).
    #[serde(default)]
    pub network: NetworkMode,
    /// `host:port` the agent may reach from its box, each at the same name and port (a loopback address or a
    /// host name; a name resolves in the box only to its endpoint).
    #[serde(default)]
    pub endpoints: Vec<String>,
    /// Files of the operator's home (`~/...`) the agent needs to log in, bound read-only at the same place
    /// in the session's home; `home_files_writable` for those the agent refreshes.
    #[serde(default)]
    pub home_files: Vec<String>,
    #[serde(default)]
    pub home_files_writable: Vec<String>,
    /// Further directories the box shows: read-only (tools, a shared cache) and read-write.
    #[serde(default)]
    pub read_only_paths: Vec<PathBuf>,
    #[serde(default)]
    pub writable_paths: Vec<PathBuf>,
    /// Limits for the agent and everything it starts (defaults: `agent_memory_max_mib`, `agent_pids_max`).
    #[serde(default)]
    pub memory_max_mib: Option<u64>,
    #[serde(default)]
    pub pids_max: Option<u64>,
}

/// Whether the agent runs in a box (`crate::runtime::sandbox`).
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum SandboxMode {
    #[default]
    Bwrap,
    None,
}

/// Which network the agent's box has.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum NetworkMode {
    #[default]
    Box,
    Host,
}

/// An MCP server an ACP agent connects to: one it starts (`command`, `args`, `env`), or one it reaches at
/// a `url` (`transport` `http`, the default, or `sse`; `headers`). Values may be secrets: `berth config`
/// redacts `env` and `headers`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(untagged)]
pub enum McpServer {
    Stdio {
        name: String,
        command: String,
        #[serde(default)]
        args: Vec<String>,
        #[serde(default)]
        env: BTreeMap<String, String>,
    },
    Remote {
        name: String,
        url: String,
        #[serde(default)]
        transport: McpTransport,
        #[serde(default)]
        headers: BTreeMap<String, String>,
    },
}

#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum McpTransport {
    #[default]
    Http,
    Sse,
}

/// `jsonl`: berth's minimal JSON-lines protocol, nothing kept between launches. `pi`: the Pi coding agent's
/// RPC mode, whose conversation berth keeps in a file of its own per session and hands back on every
/// relaunch (`--session <file>`), so the agent continues the same conversation (seed 002). `acp`: the
/// Agent Client Protocol, whose conversation the agent keeps under an id berth records and loads again.
/// How each is spoken lives in `crate::agent`.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
pub enum AgentProtocol {
    #[default]
    #[serde(rename = "jsonl")]
    JsonLines,
    #[serde(rename = "pi")]
    Pi,
    #[serde(rename = "acp")]
    Acp,
}
