//! The agent seam: every agent protocol berth speaks lives here, behind one vocabulary. Above this module
//! (`runtime/`, `domain/sessions/`) berth sends typed [`Command`]s and receives typed [`Signal`]s; it never
//! names a protocol's wire messages and never asks which protocol it talks to. The architecture test
//! fails the build otherwise.
//!
//! | protocol | module | what it is |
//! | --- | --- | --- |
//! | `jsonl` | [`jsonl`] | berth's minimal JSON-lines protocol (README, "Bring your own agent") |
//! | `pi` | [`pi`] | the Pi coding agent's RPC mode |
//! | `acp` | [`acp`] | the Agent Client Protocol (JSON-RPC 2.0 over stdio): Claude Code, Codex, Gemini CLI, opencode |
//!
//! A [`Wire`] is one agent process's side of the conversation: it turns commands into lines for the
//! agent's stdin (remembering what it asked, when the protocol needs to) and the agent's lines into what
//! berth records, the signals they mean, and the answers berth owes the agent (ACP's `fs/*`, served by
//! [`fs`] inside the admitted worktree only).
use std::path::Path;

use serde_json::Value;

pub mod about;
pub mod acp;
pub mod fs;
pub mod jsonl;
pub mod lines;
pub mod pi;
mod types;

pub use types::{
    Answer, Answered, Command, Delivery, Delta, Inbound, Introduction, Notice, Outgoing, Protocol, Reply, Run, Signal,
    Unsupported, UsageReport,
};

impl Run {
    /// The one line that stands for `count` deltas of this run, their `text` joined.
    pub fn render(&self, text: &str, count: usize) -> Value {
        match self.protocol {
            Protocol::Acp => acp::render(self, text, count),
            Protocol::Pi | Protocol::JsonLines => pi::render(self, text, count),
        }
    }
}

/// One agent process's side of its protocol.
#[derive(Debug)]
pub enum Wire {
    Lines(jsonl::Wire),
    Pi(pi::Wire),
    Acp(Box<acp::Wire>),
}

impl Wire {
    pub fn new(protocol: Protocol) -> Wire {
        match protocol {
            Protocol::JsonLines => Wire::Lines(jsonl::Wire),
            Protocol::Pi => Wire::Pi(pi::Wire::default()),
            Protocol::Acp => Wire::Acp(Box::new(acp::Wire::new(true, &[]))),
        }
    }

    /// The wire for an agent of this profile.
    pub fn for_profile(profile: &crate::config::AgentProfile) -> Wire {
        match profile.protocol {
            Protocol::Acp => Wire::Acp(Box::new(acp::Wire::new(
                profile.fs_read.unwrap_or(true),
                &profile.mcp_servers,
            ))),
            other => Wire::new(other),
        }
    }

    /// The lines `command` becomes; `id` names it when the caller waits for an answer.
    pub fn encode(&mut self, command: &Command, id: String) -> Result<Outgoing, Unsupported> {
        match self {
            Wire::Lines(w) => w.encode(command),
            Wire::Pi(w) => w.encode(command, id),
            Wire::Acp(w) => w.encode(command, id),
        }
    }

    pub fn decode(&mut self, line: Value) -> Inbound {
        match self {
            Wire::Lines(w) => w.decode(line),
            Wire::Pi(w) => w.decode(line),
            Wire::Acp(w) => w.decode(line),
        }
    }

    /// Whether `answer` fits the pending `request` (a wrong shape is refused; the question stays).
    pub fn fits(&self, request: &Value, answer: &Answer) -> Result<(), (&'static str, String)> {
        match self {
            Wire::Lines(_) | Wire::Pi(_) => pi::fits(request, answer),
            Wire::Acp(_) => acp::fits(request, answer),
        }
    }

    /// The answer to a berth-served request, as the line for the agent.
    pub fn served(&self, id: Value, result: Result<Value, fs::Failure>) -> Value {
        acp::served(id, result)
    }

    /// The arguments a launch adds to the profile's (Pi: the session's own conversation file).
    pub fn launch_args(protocol: Protocol, conversation: &Path) -> Vec<String> {
        match protocol {
            Protocol::Pi => pi::launch_args(conversation),
            Protocol::JsonLines | Protocol::Acp => Vec::new(),
        }
    }

    /// What the agent said when the connection opened (ACP only).
    pub fn introduction(&self) -> Option<&Introduction> {
        match self {
            Wire::Acp(w) => w.introduction(),
            _ => None,
        }
    }
}

/// What a protocol keeps between launches, and how a relaunch finds it again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Memory {
    /// Nothing: every launch starts afresh.
    None,
    /// A file berth keeps per session and hands back (Pi).
    File,
    /// The agent keeps it under an id berth records and asks for again (ACP's `session/load`).
    Agent,
}

pub fn memory(protocol: Protocol) -> Memory {
    match protocol {
        Protocol::JsonLines => Memory::None,
        Protocol::Pi => Memory::File,
        Protocol::Acp => Memory::Agent,
    }
}

/// Whether berth asks the agent about itself (Pi's `get_state`) after a launch and after each turn.
pub fn asks_state(protocol: Protocol) -> bool {
    protocol == Protocol::Pi
}

/// Whether the agent takes a steering message mid-turn, from its protocol and what it said about itself
/// (a session's recorded facts). ACP version 1 has no such message: an agent takes one only when its
/// `initialize` advertised the steering extension (the `identity` berth recorded says so).
pub fn steers(protocol: Protocol, known: Option<&Value>) -> bool {
    match protocol {
        Protocol::Pi | Protocol::JsonLines => true,
        Protocol::Acp => known.is_some_and(|k| k["identity"]["steering"] == true),
    }
}
