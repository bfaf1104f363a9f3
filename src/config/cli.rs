//! The settings as command-line flags (`berth serve --help` lists each with its variable and default),
//! flags laid over the environment, and `berth config`'s rendering of the effective configuration.
use std::collections::BTreeMap;

use clap::parser::ValueSource;
use clap::{Arg, ArgMatches, Args, FromArgMatches};

use super::settings::{Fallback, SETTINGS};
use super::{Config, Env};

/// The flags given on the command line, by variable name. Values clap took from the environment or a
/// default are left out: `Config::load` reads those itself, in its own order (variable, file, default).
#[derive(Debug, Clone, Default)]
pub struct SettingsArgs {
    pub flags: BTreeMap<String, String>,
}

impl SettingsArgs {
    /// The flags over `base` (the process environment).
    pub fn over<'a>(&'a self, base: &'a dyn Env) -> Layered<'a> {
        Layered { flags: self, base }
    }
}

pub struct Layered<'a> {
    flags: &'a SettingsArgs,
    base: &'a dyn Env,
}

impl Env for Layered<'_> {
    fn get(&self, name: &str) -> Option<String> {
        match self.flags.flags.get(name) {
            Some(v) if !v.is_empty() => Some(v.clone()),
            _ => self.base.get(name),
        }
    }
}

impl FromArgMatches for SettingsArgs {
    fn from_arg_matches(matches: &ArgMatches) -> Result<Self, clap::Error> {
        let mut flags = BTreeMap::new();
        for s in SETTINGS {
            if matches.value_source(s.key) == Some(ValueSource::CommandLine)
                && let Some(v) = matches.get_one::<String>(s.key)
            {
                flags.insert(s.var(), v.clone());
            }
        }
        Ok(SettingsArgs { flags })
    }

    fn update_from_arg_matches(&mut self, matches: &ArgMatches) -> Result<(), clap::Error> {
        *self = SettingsArgs::from_arg_matches(matches)?;
        Ok(())
    }
}

impl Args for SettingsArgs {
    fn augment_args(cmd: clap::Command) -> clap::Command {
        let mut cmd = cmd.next_help_heading("Settings (flag, else variable, else the file's key, else default)");
        for s in SETTINGS {
            let mut help = s.help.to_string();
            if s.in_file {
                help.push_str(&format!(" [toml: {}]", s.key));
            }
            let mut arg = Arg::new(s.key)
                .long(s.flag())
                .env(s.var())
                .value_name(value_name(s.key))
                .hide_env_values(s.secret);
            match s.default {
                Fallback::Value(v) => arg = arg.default_value(v),
                Fallback::Computed(how) => help.push_str(&format!(" [default: {how}]")),
                Fallback::None => {}
            }
            cmd = cmd.arg(arg.help(help));
        }
        cmd
    }

    fn augment_args_for_update(cmd: clap::Command) -> clap::Command {
        Self::augment_args(cmd)
    }
}

fn value_name(key: &str) -> &'static str {
    match key.rsplit('_').next() {
        Some("ms") => "MS",
        Some("secs") => "SECS",
        Some("file" | "dir" | "root" | "config") => "PATH",
        Some("url") => "URL",
        _ => "VALUE",
    }
}

/// The effective configuration as TOML, which `BERTH_CONFIG` accepts back: every setting with a value
/// (secrets redacted and commented out), then the agent profiles with their `env` values redacted (they carry credentials).
pub fn render(config: &Config) -> String {
    let mut out = String::from("# berth's effective configuration (secrets redacted)\n");
    for s in SETTINGS.iter().filter(|s| s.in_file) {
        match (s.show)(config) {
            // Commented out, so the output loads back without a placeholder for a key.
            Some(value) if s.secret => out.push_str(&format!("# {} = {value}\n", s.key)),
            Some(value) => out.push_str(&format!("{} = {value}\n", s.key)),
            None => out.push_str(&format!("# {} is not set\n", s.key)),
        }
    }
    for (name, profile) in &config.agents {
        let mut table = toml::Table::new();
        table.insert("command".into(), profile.command.clone().into());
        table.insert(
            "args".into(),
            toml::Value::Array(profile.args.iter().cloned().map(toml::Value::from).collect()),
        );
        let env: toml::Table = profile
            .env
            .keys()
            .map(|k| (k.clone(), toml::Value::from("<redacted>")))
            .collect();
        table.insert("env".into(), toml::Value::Table(env));
        let protocol = match profile.protocol {
            super::AgentProtocol::JsonLines => "jsonl",
            super::AgentProtocol::Pi => "pi",
            super::AgentProtocol::Acp => "acp",
        };
        table.insert("protocol".into(), protocol.into());
        if let Some(mode) = &profile.mode {
            table.insert("mode".into(), mode.clone().into());
        }
        if let Some(read) = profile.fs_read {
            table.insert("fs_read".into(), read.into());
        }
        if !profile.mcp_servers.is_empty() {
            let servers = profile.mcp_servers.iter().map(mcp_server).collect();
            table.insert("mcp_servers".into(), toml::Value::Array(servers));
        }
        let mut agents = toml::Table::new();
        agents.insert(name.clone(), toml::Value::Table(table));
        let mut root = toml::Table::new();
        root.insert("agents".into(), toml::Value::Table(agents));
        out.push('\n');
        out.push_str(&toml::to_string(&root).unwrap_or_default());
    }
    out
}

/// One `[[agents.<name>.mcp_servers]]` table, its `env` and `headers` values redacted.
fn mcp_server(server: &super::McpServer) -> toml::Value {
    let redacted = |m: &std::collections::BTreeMap<String, String>| -> toml::Table {
        m.keys().map(|k| (k.clone(), toml::Value::from("<redacted>"))).collect()
    };
    let mut t = toml::Table::new();
    match server {
        super::McpServer::Stdio {
            name,
            command,
            args,
            env,
        } => {
            t.insert("name".into(), name.clone().into());
            t.insert("command".into(), command.clone().into());
            t.insert("args".into(), args.clone().into());
            t.insert("env".into(), toml::Value::Table(redacted(env)));
        }
        super::McpServer::Remote {
            name,
            url,
            transport,
            headers,
        } => {
            t.insert("name".into(), name.clone().into());
            t.insert("url".into(), url.clone().into());
            let transport = match transport {
                super::McpTransport::Http => "http",
                super::McpTransport::Sse => "sse",
            };
            t.insert("transport".into(), transport.into());
            t.insert("headers".into(), toml::Value::Table(redacted(headers)));
        }
    }
    toml::Value::Table(t)
}
