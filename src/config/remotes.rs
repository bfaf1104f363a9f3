//! `[remotes."<host>"]` tables of the file: what berth uses to push to a remote on that host (`host` or
//! `host:port`, as the remote's URL has it) and to open pull requests there. The token comes from a file
//! (`token_file`, a mounted secret) or an environment variable (`token_env`), never from the file
//! itself; it is redacted everywhere.
//!
//! ```toml
//! [remotes."github.com"]
//! token_file = "/run/secrets/github_token"   # or token_env = "GITHUB_TOKEN"
//! username = "x-access-token"                # the HTTP user git sends (default)
//! api_url = "https://api.github.com"         # pull requests (default: api.github.com for github.com,
//!                                            # https://<host>/api/v3 for GitHub Enterprise)
//! ```
use std::collections::BTreeMap;

use serde::Deserialize;

use super::{ConfigError, Env, bad};

#[derive(Clone)]
pub struct RemoteHost {
    pub username: String,
    pub token: Option<String>,
    pub api_url: String,
}

impl std::fmt::Debug for RemoteHost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteHost")
            .field("username", &self.username)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("api_url", &self.api_url)
            .finish()
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Raw {
    username: Option<String>,
    token_file: Option<String>,
    token_env: Option<String>,
    api_url: Option<String>,
}

pub(super) fn take_remotes(env: &dyn Env, file: &mut toml::Table) -> Result<BTreeMap<String, RemoteHost>, ConfigError> {
    let path = env.get("BERTH_CONFIG").unwrap_or_default();
    let Some(value) = file.remove("remotes") else {
        return Ok(BTreeMap::new());
    };
    let raw: BTreeMap<String, Raw> = value
        .try_into()
        .map_err(|e: toml::de::Error| bad("BERTH_CONFIG", format!("{path}: remotes: {}", e.message())))?;
    let mut out = BTreeMap::new();
    for (host, r) in raw {
        let setting = format!("BERTH_CONFIG remotes.\"{host}\"");
        let token = match (&r.token_file, &r.token_env) {
            (Some(_), Some(_)) => return Err(bad(&setting, "give token_file or token_env, not both")),
            (Some(file), None) => Some(
                std::fs::read_to_string(file)
                    .map_err(|e| bad(&setting, format!("token_file {file}: {e}")))?
                    .trim_end_matches(['\n', '\r'])
                    .to_string(),
            ),
            (None, Some(var)) => Some(
                std::env::var(var)
                    .ok()
                    .filter(|v| !v.is_empty())
                    .ok_or_else(|| bad(&setting, format!("token_env {var} is not set")))?,
            ),
            (None, None) => None,
        };
        let host = host.to_ascii_lowercase();
        let api_url = r.api_url.unwrap_or_else(|| {
            if host == "github.com" {
                "https://api.github.com".into()
            } else {
                format!("https://{host}/api/v3")
            }
        });
        if !(api_url.starts_with("https://") || api_url.starts_with("http://")) {
            return Err(bad(&setting, "api_url must be an http(s) URL"));
        }
        out.insert(
            host,
            RemoteHost {
                username: r.username.unwrap_or_else(|| "x-access-token".into()),
                token,
                api_url: api_url.trim_end_matches('/').to_string(),
            },
        );
    }
    Ok(out)
}
