//! The seam's vocabulary: what berth asks of an agent, what an agent's lines mean, and what a protocol
//! answers. Every protocol module speaks these; nothing here names a wire message.
use serde_json::Value;

use super::fs;
pub use crate::config::AgentProtocol as Protocol;

/// What berth asks of an agent.
#[derive(Debug, Clone, PartialEq)]
pub enum Command {
    /// A new turn (or, for Pi, a `/command` run outside any turn).
    Prompt(String),
    /// A message for the working agent, read before its next model call.
    Steer(String),
    /// End the current turn; the agent lives on.
    Abort,
    /// An answer to a question the agent asked (its request id as berth shows it).
    Answer {
        request_id: String,
        answer: Answer,
    },
    /// Who the agent is and what it offers now (Pi: state, commands, models).
    AskState,
    AskCommands,
    AskModels,
    /// ACP's connection and conversation set-up.
    Initialize,
    NewConversation {
        cwd: String,
    },
    LoadConversation {
        id: String,
        cwd: String,
    },
    ResumeConversation {
        id: String,
        cwd: String,
    },
    /// A mode or a configuration option (a model, say) the agent offers.
    SetMode(String),
    SetOption {
        option_id: String,
        value: Value,
    },
}

/// An answer to an agent's question: a `value` (Pi's select, input, editor), `confirmed` (Pi's
/// confirm), an `option_id` (ACP's permission options), or `cancelled` (any).
#[derive(Debug, Clone, PartialEq)]
pub enum Answer {
    Value(String),
    Confirmed(bool),
    Option(String),
    Cancelled,
}

/// What an agent's line (or berth's own command) means for its session.
#[derive(Debug, Clone, PartialEq)]
pub enum Signal {
    /// A turn began: the agent works.
    TurnStarted,
    /// The turn is over (`stop_reason` where the protocol gives one: ACP's `end_turn`, `max_tokens`,
    /// `max_turn_requests`, `refusal`, `cancelled`, or `error` when the agent failed the prompt).
    TurnSettled {
        stop_reason: Option<String>,
    },
    /// A question waiting for an answer; `request` is what snapshots show (its `id` answers it).
    Question {
        request: Value,
        timeout_ms: Option<u64>,
    },
    /// A question nobody can answer any more (its own timeout passed; the agent took its default).
    QuestionExpired {
        id: Value,
    },
    /// Every pending question is over (the turn ended, or was cancelled).
    QuestionsCleared,
    /// A tool started (its name or title), or the running one ended.
    ToolStarted(String),
    ToolEnded,
    /// How many messages the agent holds in its own queue.
    Queue(usize),
    /// A complete assistant message, for the transcript.
    Assistant(Value),
    /// What a model call cost, as the agent reported it; berth checks the figures.
    Usage(UsageReport),
    /// What the agent said about itself, for snapshots.
    Notice(Notice),
}

/// An agent's usage report, its figures as it wrote them (unchecked: the domain refuses a negative, a
/// fraction or an absurd one).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct UsageReport {
    pub model: Option<String>,
    pub input: Value,
    pub output: Value,
    pub cache_read: Value,
    pub cache_write: Value,
    /// The cost, in `currency`.
    pub cost: Value,
    pub currency: Option<String>,
    /// The cost is a running total of the agent's session (ACP's `usage_update`), not this call's.
    pub cumulative: bool,
}

/// What an agent tells about itself that a snapshot shows.
#[derive(Debug, Clone, PartialEq)]
pub enum Notice {
    /// A status line set (`Some`) or cleared (`None`).
    Status {
        key: String,
        text: Option<String>,
    },
    Title(Value),
    Notify {
        message: Value,
        kind: String,
    },
    /// Facts merged into what is known (its name for the session, model, modes, commands, plan, usage,
    /// the agent's identity and capabilities).
    Learned(serde_json::Map<String, Value>),
}

/// A piece of a streamed content block. Consecutive deltas of one `run` merge into one recorded line,
/// which the run renders in the agent's own shape (`coalesced` counting the deltas it holds).
#[derive(Debug, Clone, PartialEq)]
pub struct Delta {
    pub run: Run,
    pub text: String,
}

/// What consecutive deltas add to: the protocol, the delta's kind, its block and its conversation (what a
/// protocol does not use is null). `Run::render` (the protocol's) writes the one line for a run.
#[derive(Debug, Clone, PartialEq)]
pub struct Run {
    pub protocol: Protocol,
    pub kind: Option<String>,
    pub block: Value,
    pub conversation: Value,
}

/// One agent line, decoded.
#[derive(Debug, Default)]
pub struct Inbound {
    /// What the session records of it (`runtime.output`), in the agent's own shape; `None`: nothing.
    pub record: Option<Value>,
    /// A streamed piece, held and coalesced instead of recorded one by one.
    pub delta: Option<Delta>,
    pub signals: Vec<Signal>,
    /// The answer to one of berth's requests: who waits for it, and what it says.
    pub reply: Option<(String, Reply)>,
    /// A request of the agent berth serves itself (a file read or write inside the worktree).
    pub serve: Option<fs::Request>,
    /// Lines berth owes the agent at once (answers to what berth does not offer).
    pub send: Vec<Value>,
}

/// An agent's answer to a request of berth's.
#[derive(Debug, Clone, PartialEq)]
pub enum Reply {
    Ok(Value),
    /// Refused, with the agent's reason and, where it gave one, its error code.
    Refused {
        reason: String,
        code: Option<i64>,
    },
    /// A prompt refused because a turn is still running: it waits for the turn.
    Busy,
}

/// The lines a command becomes.
#[derive(Debug, Default)]
pub struct Outgoing {
    pub lines: Vec<Value>,
    /// The request id whose answer the caller waits for; `None`: delivered once written.
    pub awaits: Option<String>,
    /// Whether the agent works once this is written (a prompt: yes; Pi's `/command`: no).
    pub working: Option<bool>,
    /// What sending it means at once (an ACP prompt starts a turn; a cancel ends the questions).
    pub signals: Vec<Signal>,
}

/// What a protocol cannot do.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Unsupported {
    #[error("the agent does not take steering messages")]
    Steer,
    #[error("the agent's protocol has no such command")]
    Command,
}

/// What the agent said about itself when its connection opened (ACP's `initialize`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Introduction {
    pub info: Value,
    pub can_load: bool,
    pub can_resume: bool,
    pub auth_methods: Vec<Value>,
    /// Whether it takes a message into a running turn (`_session/steering`, advertised in `_meta`).
    pub steering: bool,
}

/// What a command came to.
#[derive(Debug, Clone, PartialEq)]
pub enum Delivery {
    /// Taken (with the agent's answer, where it gives one).
    Accepted(serde_json::Value),
    Refused {
        reason: String,
        code: Option<i64>,
    },
    /// A prompt refused because a turn runs: it waits for the turn.
    Busy,
    Unsupported(Unsupported),
    /// Written, and no answer came in time (the agent has it).
    NoAnswer,
    /// No live agent.
    Gone,
}

/// What an answer to a question came to.
#[derive(Debug, Clone, PartialEq)]
pub enum Answered {
    Sent,
    NotPending,
    Unfit(&'static str, String),
}
