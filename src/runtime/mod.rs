//! Agent processes (seed 002): one process per session (I27), spawned only in an admitted workspace
//! (I17), talking JSON lines over stdio, stopped with escalation (I28). The runtime reports what happens
//! as `RuntimeEvent`s; the domain decides what they mean for sessions.
use crate::ids::{ExecutionId, SessionId};
use std::collections::{HashMap, VecDeque};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
use tokio::process::Command as Process;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, oneshot, watch};

use crate::agent::lines::{held_bytes, parsed_bound, skip_line};
use crate::agent::{Delta, Inbound, Reply, Signal, Wire};
use crate::config::{AgentProfile, SandboxMode};

pub mod check;
mod commands;
mod orphans;
pub mod sandbox;
mod stdin;
mod stop;
pub use crate::agent::lines::{MAX_LINE, REPORT_BYTES};
use crate::executor::admission::AdmittedWorkspace;
pub use orphans::{Orphan, end_orphan};
pub use stdin::Limits;
const STDERR_TAIL: usize = 16 * 1024;
/// Agent reports waiting to be recorded; past this, agents' output waits in their pipes.
const REPORT_BUFFER: usize = 1024;
/// An agent's line buffer goes back to this capacity after a long line.
const LINE_KEEP: usize = 64 * 1024;

#[derive(Debug)]
pub enum RuntimeEvent {
    /// One line the agent printed, decoded by its protocol (or what berth's own command meant at once).
    Output {
        session_id: SessionId,
        execution_id: ExecutionId,
        /// What the session records of it (`runtime.output`), in the agent's own shape.
        record: Option<serde_json::Value>,
        /// A streamed piece, coalesced with its run.
        delta: Option<Delta>,
        signals: Vec<Signal>,
        /// The line's share of `REPORT_BYTES`: drop it once the line is recorded.
        held: InFlight,
    },
    /// The process ended; `expected` when berth stopped it.
    Exited {
        session_id: SessionId,
        execution_id: ExecutionId,
        code: Option<i32>,
        expected: bool,
        stderr_tail: String,
        /// The kernel ended it (or something it started) at its box's memory limit.
        out_of_memory: bool,
        /// berth ended it: it stopped reading its stdin with its queue full (`BERTH_AGENT_STDIN_QUEUE_MAX_BYTES`).
        not_reading: bool,
    },
    /// The agent asked its box for a name no listed endpoint has (refused; each name once per agent).
    EgressRefused {
        session_id: SessionId,
        execution_id: ExecutionId,
        address: String,
    },
}

struct Agent {
    execution_id: ExecutionId,
    /// The agent's protocol: what berth's commands become, what its lines mean.
    wire: Mutex<Wire>,
    /// The admitted workspace (canonical): the only place berth serves the agent files from.
    root: std::path::PathBuf,
    /// berth's own commands waiting for the agent's answer (matched by `id`).
    waiting: Mutex<HashMap<String, oneshot::Sender<Reply>>>,
    /// What the agent holds in its own queue (steering plus follow-up messages).
    agent_queue: std::sync::atomic::AtomicUsize,
    /// Deliveries of the inbox to this agent, one at a time.
    dispatch: Arc<tokio::sync::Mutex<()>>,
    /// Attention requests the agent is waiting on (I31: they belong to this session only).
    pending: Mutex<Vec<serde_json::Value>>,
    /// The tool the agent is running, between its start and its end.
    tool: Mutex<Option<String>>,
    pid: u32,
    stdin: Mutex<Option<mpsc::UnboundedSender<stdin::Line>>>,
    /// The bytes queued towards its stdin and the requests it has of berth, both bounded.
    queue: Arc<stdin::Queue>,
    working: watch::Sender<bool>,
    exited: watch::Receiver<bool>,
    /// The exit status, once the process is gone.
    exit_code: Mutex<Option<i32>>,
    stopping: std::sync::atomic::AtomicBool,
}

/// A report's share of the in-flight output budget (`REPORT_BYTES`), returned when dropped.
#[derive(Debug)]
pub struct InFlight(Option<OwnedSemaphorePermit>);

impl InFlight {
    pub fn bytes(&self) -> usize {
        self.0.as_ref().map_or(0, OwnedSemaphorePermit::num_permits)
    }

    /// For a report berth makes itself (no agent line behind it).
    fn none() -> InFlight {
        InFlight(None)
    }
}

pub struct Runtime {
    agents: Mutex<HashMap<SessionId, Arc<Agent>>>,
    /// Bounded in count and, through `in_flight`, in bytes: a flooding agent waits on its stdout pipe
    /// instead of growing berth's memory.
    events: mpsc::Sender<RuntimeEvent>,
    in_flight: Arc<Semaphore>,
    /// After `abort`, and after closing stdin: how long to wait before escalating.
    grace: Duration,
    /// After SIGTERM: how long before SIGKILL.
    term_grace: Duration,
    /// The runtime that built this one (the process's): agents and their pipes' tasks live there, not on
    /// the HTTP worker that launched them, which ends with the server (and would drop and SIGKILL them).
    home: tokio::runtime::Handle,
    /// Each session's dispatch lock, while an agent or a dispatch holds it: an agent restarted after a
    /// crash takes the lock of the one before, so its first dispatch waits until the dispatch that
    /// handed the crashed agent its message has recorded it delivered (it is not handed over again).
    dispatch_locks: Mutex<HashMap<SessionId, std::sync::Weak<tokio::sync::Mutex<()>>>>,
    /// Where and how agents' boxes are built.
    boxes: sandbox::Boxes,
    /// Each agent's bounds: its requests of berth in flight, the bytes queued towards its stdin.
    limits: Limits,
}

#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    #[error("the session already has a live agent process")]
    AlreadyRunning,
    #[error("could not start the agent command: {0}")]
    Spawn(std::io::Error),
    #[error("could not build the agent's box: {0}")]
    Box(String),
}

impl Runtime {
    pub fn new(
        grace: Duration,
        term_grace: Duration,
        boxes: sandbox::Boxes,
        limits: Limits,
    ) -> (Arc<Runtime>, mpsc::Receiver<RuntimeEvent>) {
        let (events, rx) = mpsc::channel(REPORT_BUFFER);
        (
            Arc::new(Runtime {
                agents: Mutex::new(HashMap::new()),
                events,
                in_flight: Arc::new(Semaphore::new(REPORT_BYTES)),
                grace,
                term_grace,
                home: tokio::runtime::Handle::current(),
                dispatch_locks: Mutex::new(HashMap::new()),
                boxes,
                limits,
            }),
            rx,
        )
    }

    pub fn is_live(&self, session_id: SessionId) -> bool {
        self.agents.lock().unwrap().contains_key(&session_id)
    }

    pub fn live_count(&self) -> usize {
        self.agents.lock().unwrap().len()
    }

    /// Bytes of agent output parsed or waiting to be recorded (at most `REPORT_BYTES`).
    pub fn bytes_in_flight(&self) -> usize {
        REPORT_BYTES - self.in_flight.available_permits()
    }

    /// Reports a name the agent's box refused; dropped when the report channel is full (counted anyway).
    fn refusals(&self, session_id: SessionId, execution_id: ExecutionId) -> sandbox::net::OnRefused {
        let events = self.events.clone();
        Arc::new(move |address| {
            let _ = events.try_send(RuntimeEvent::EgressRefused {
                session_id,
                execution_id,
                address,
            });
        })
    }

    /// Where and how agents' boxes are built (the session's home, what a box allows).
    pub fn boxes(&self) -> &sandbox::Boxes {
        &self.boxes
    }

    /// Starts the agent in the admitted workspace — the only way a process gets a working directory — in
    /// its box unless its profile says `sandbox = "none"`. `conversation` is the file berth keeps the
    /// agent's conversation in (Pi), which the box shows.
    pub fn spawn(
        &self,
        ws: &AdmittedWorkspace,
        profile: &AgentProfile,
        session_id: SessionId,
        execution_id: ExecutionId,
        conversation: Option<&std::path::Path>,
    ) -> Result<u32, SpawnError> {
        // The child, its reaping and every task below belong to the home runtime.
        let _home = self.home.enter();
        let mut agents = self.agents.lock().unwrap();
        if agents.contains_key(&session_id) {
            return Err(SpawnError::AlreadyRunning);
        }
        // An agent sees an allow-list of berth's environment, never its secrets or database URL (an agent
        // holding BERTH_JWT_SECRET could mint an admin token): then its profile's, then its session's.
        let (mut process, mut held) = match profile.sandbox {
            SandboxMode::Bwrap => self
                .boxes
                .boxed(
                    sandbox::Agent {
                        profile,
                        session_id,
                        execution_id,
                        cwd: ws.path(),
                        trees: ws.trees(),
                        conversation,
                        dir: None,
                        refused: Some(self.refusals(session_id, execution_id)),
                    },
                    agent_env(profile),
                )
                .map_err(SpawnError::Box)?,
            SandboxMode::None => {
                tracing::warn!(%session_id, "the agent runs without a box (its profile says sandbox = \"none\"): it can read what berth's user can");
                (agent_process(profile), sandbox::Held::default())
            }
        };
        let child = process
            .env("BERTH_SESSION_ID", session_id.to_string())
            .env("BERTH_EXECUTION_ID", execution_id.to_string())
            .current_dir(ws.path())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true)
            .spawn();
        // The child holds its own copy of the seccomp filter's pipe.
        held.filter = None;
        if let Err(e) = &child
            && e.kind() == std::io::ErrorKind::NotFound
        {
            // Which one was missing: the workspace (its directory is the agent's) or the program.
            tracing::warn!(%session_id, cwd = %ws.path().display(), cwd_exists = ws.path().is_dir(),
                program = ?process.as_std().get_program(), "the agent's command or workspace was not found");
        }
        let mut child = child.map_err(SpawnError::Spawn)?;
        let pid = child.id().unwrap_or_default();
        let (stdin_tx, stdin_rx) = mpsc::unbounded_channel::<stdin::Line>();
        let queue = Arc::new(stdin::Queue::new(self.limits));
        let (working, _) = watch::channel(false);
        let (exited_tx, exited) = watch::channel(false);
        let root = ws.path().canonicalize().unwrap_or_else(|_| ws.path().to_path_buf());
        let agent = Arc::new(Agent {
            execution_id,
            wire: Mutex::new(Wire::for_profile(profile)),
            root,
            waiting: Mutex::new(HashMap::new()),
            agent_queue: std::sync::atomic::AtomicUsize::new(0),
            dispatch: self.session_dispatch_lock(session_id),
            pid,
            stdin: Mutex::new(Some(stdin_tx)),
            queue: queue.clone(),
            pending: Mutex::new(Vec::new()),
            tool: Mutex::new(None),
            working,
            exited,
            exit_code: Mutex::new(None),
            stopping: std::sync::atomic::AtomicBool::new(false),
        });
        agents.insert(session_id, agent.clone());
        drop(agents);

        // stdin: commands in the order they were queued (I27: serialized per session), bounded in bytes.
        let stdin = child.stdin.take().expect("piped stdin");
        tokio::spawn(stdin::write_lines(stdin, stdin_rx, queue));
        // stderr: a bounded tail, for the failure message.
        let tail = Arc::new(Mutex::new(VecDeque::<u8>::new()));
        let mut stderr = child.stderr.take().expect("piped stderr");
        let tail_w = tail.clone();
        let stderr_task = tokio::spawn(async move {
            let mut buf = [0u8; 4096];
            while let Ok(n) = stderr.read(&mut buf).await {
                if n == 0 {
                    break;
                }
                let mut t = tail_w.lock().unwrap();
                t.extend(&buf[..n]);
                while t.len() > STDERR_TAIL {
                    t.pop_front();
                }
            }
        });
        // stdout: LF-delimited JSON lines (never split on U+2028/U+2029, which JSON strings may hold).
        // Memory per agent: this line buffer (at most MAX_LINE + 1, back to LINE_KEEP after a long line),
        // the reader's 64 KiB, the stderr tail; what is parsed or queued counts in REPORT_BYTES.
        let stdout = child.stdout.take().expect("piped stdout");
        let events = self.events.clone();
        let in_flight = self.in_flight.clone();
        let agent_r = agent.clone();
        let stdout_task = tokio::spawn(async move {
            let mut reader = BufReader::with_capacity(64 * 1024, stdout);
            let mut line = Vec::new();
            loop {
                if line.capacity() > LINE_KEEP {
                    line = Vec::new();
                }
                line.clear();
                match (&mut reader)
                    .take(MAX_LINE as u64 + 1)
                    .read_until(b'\n', &mut line)
                    .await
                {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                }
                if line.len() > MAX_LINE {
                    // An endless line is read through, never kept.
                    line = Vec::new();
                    if skip_line(&mut reader).await.is_err() {
                        break;
                    }
                    tracing::warn!(%session_id, "dropped an oversized agent output line");
                    continue;
                }
                let bound = parsed_bound(&line);
                if bound > REPORT_BYTES {
                    tracing::warn!(%session_id, "dropped an agent output line too dense to parse within the budget");
                    continue;
                }
                let Ok(mut held) = in_flight.clone().acquire_many_owned(bound as u32).await else {
                    break;
                };
                let Some(line) = crate::agent::lines::parse(&line) else {
                    continue;
                };
                // Keep only the share of what the stripped line holds.
                let keep = held_bytes(&line).min(bound);
                drop(held.split(bound - keep));
                let inbound = agent_r.wire.lock().unwrap().decode(line);
                let Inbound {
                    record,
                    delta,
                    signals,
                    reply,
                    serve,
                    send,
                } = inbound;
                // An answer to one of berth's own commands goes to whoever waits for it.
                if let Some((id, reply)) = reply
                    && let Some(tx) = agent_r.waiting.lock().unwrap().remove(&id)
                {
                    let _ = tx.send(reply);
                }
                for line in send {
                    agent_r.write(line);
                }
                if let Some(request) = serve {
                    agent_r.serve(request);
                }
                agent_r.apply(&events, session_id, execution_id, &signals);
                if record.is_none() && delta.is_none() && signals.is_empty() {
                    continue;
                }
                let _ = events
                    .send(RuntimeEvent::Output {
                        session_id,
                        execution_id,
                        record,
                        delta,
                        signals,
                        held: InFlight(Some(held)),
                    })
                    .await;
            }
            // No answer can come any more: whoever waits for one hears so now, not at its deadline.
            agent_r.waiting.lock().unwrap().clear();
        });
        // Exit: report once the output is drained, then forget the agent.
        let boxed = profile.sandbox == SandboxMode::Bwrap;
        let events = self.events.clone();
        let agent_e = agent.clone();
        tokio::spawn(async move {
            let status = child.wait().await;
            // bwrap's own process ended without berth stopping it (killed, say): what it left in the box
            // holds the pipes, so the whole group goes now.
            if boxed && !agent_e.stopping.load(std::sync::atomic::Ordering::Acquire) {
                orphans::signal_group(pid, libc::SIGKILL);
            }
            let _ = stdout_task.await;
            let _ = stderr_task.await;
            let stderr_tail =
                String::from_utf8_lossy(&tail.lock().unwrap().iter().copied().collect::<Vec<u8>>()).into_owned();
            let expected = agent_e.stopping.load(std::sync::atomic::Ordering::Acquire);
            let code = status.ok().and_then(|s| s.code());
            let out_of_memory = held.cgroup.as_ref().is_some_and(sandbox::cgroup::Group::out_of_memory);
            let not_reading = agent_e.queue.not_reading();
            tracing::debug!(%session_id, ?code, expected, out_of_memory, not_reading, %stderr_tail, "an agent exited");
            drop(held);
            *agent_e.exit_code.lock().unwrap() = code;
            let _ = exited_tx.send(true);
            let _ = events
                .send(RuntimeEvent::Exited {
                    session_id,
                    execution_id,
                    code,
                    expected,
                    stderr_tail,
                    out_of_memory,
                    not_reading,
                })
                .await;
        });
        Ok(pid)
    }

    /// Forgets an agent whose exit was reported (called by the domain when it records the exit).
    pub fn forget(&self, session_id: SessionId, execution_id: ExecutionId) {
        let mut agents = self.agents.lock().unwrap();
        if agents.get(&session_id).is_some_and(|a| a.execution_id == execution_id) {
            agents.remove(&session_id);
        }
    }

    /// The lock that makes deliveries to this session's agent one at a time; `None` without a live agent.
    /// The session's dispatch lock: the previous execution's while anything still holds it, else new.
    fn session_dispatch_lock(&self, session_id: SessionId) -> Arc<tokio::sync::Mutex<()>> {
        let mut locks = self.dispatch_locks.lock().unwrap();
        locks.retain(|_, lock| lock.strong_count() > 0);
        if let Some(lock) = locks.get(&session_id).and_then(std::sync::Weak::upgrade) {
            return lock;
        }
        let lock = Arc::new(tokio::sync::Mutex::new(()));
        locks.insert(session_id, Arc::downgrade(&lock));
        lock
    }

    pub fn dispatch_lock(&self, session_id: SessionId) -> Option<Arc<tokio::sync::Mutex<()>>> {
        self.agents.lock().unwrap().get(&session_id).map(|a| a.dispatch.clone())
    }

    /// How many messages the agent holds in its own queue.
    pub fn agent_queue(&self, session_id: SessionId) -> usize {
        self.agents
            .lock()
            .unwrap()
            .get(&session_id)
            .map_or(0, |a| a.agent_queue.load(std::sync::atomic::Ordering::Acquire))
    }

    /// The ids of the sessions whose agents run here.
    pub fn live_sessions(&self) -> Vec<SessionId> {
        self.agents.lock().unwrap().keys().copied().collect()
    }

    /// The tool the session's agent is running, if any.
    pub fn active_tool(&self, session_id: SessionId) -> Option<String> {
        self.agents
            .lock()
            .unwrap()
            .get(&session_id)
            .and_then(|a| a.tool.lock().unwrap().clone())
    }

    /// The attention requests pending on this session.
    pub fn attention(&self, session_id: SessionId) -> Vec<serde_json::Value> {
        self.agents
            .lock()
            .unwrap()
            .get(&session_id)
            .map(|a| a.pending.lock().unwrap().clone())
            .unwrap_or_default()
    }

    pub fn is_working(&self, session_id: SessionId) -> bool {
        self.agents
            .lock()
            .unwrap()
            .get(&session_id)
            .is_some_and(|a| *a.working.borrow())
    }
}

/// The variables of berth's own environment an agent inherits: what a program needs to find its tools,
/// its home, its locale and its terminal. Everything else (every `BERTH_*` setting and secret, database
/// URLs, cloud credentials) stays with berth; a profile passes what its agent needs through `env`.
pub const INHERITED_ENV: [&str; 6] = ["PATH", "HOME", "LANG", "TERM", "USER", "TMPDIR"];

/// The agent's process as a profile describes it: its command and arguments, and an allow-list of berth's
/// environment (never its secrets or database URL), then the profile's `pass_env`, then its `env`.
pub(crate) fn agent_process(profile: &AgentProfile) -> Process {
    let mut process = Process::new(&profile.command);
    process.args(&profile.args).env_clear().envs(agent_env(profile));
    process
}

/// The agent's environment: the allow-list of berth's, then the profile's `pass_env`, then its `env`.
pub(crate) fn agent_env(profile: &AgentProfile) -> Vec<(std::ffi::OsString, std::ffi::OsString)> {
    inherited_env()
        .chain(
            profile
                .pass_env
                .iter()
                .filter_map(|k| std::env::var_os(k).map(|v| (k.into(), v))),
        )
        .chain(profile.env.iter().map(|(k, v)| (k.into(), v.into())))
        .collect()
}

fn inherited_env() -> impl Iterator<Item = (std::ffi::OsString, std::ffi::OsString)> {
    std::env::vars_os().filter(|(k, _)| {
        k.to_str()
            .is_some_and(|k| INHERITED_ENV.contains(&k) || k.starts_with("LC_"))
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::Runtime;
    use crate::ids::SessionId;

    /// A restarted agent's dispatch waits for the crashed one's (the message it was handed is recorded
    /// delivered first): the lock is the same while anything holds it, and a fresh one once nothing does.
    #[tokio::test]
    async fn a_restarted_agent_shares_the_dispatch_lock_of_one_still_in_flight() {
        let dir = tempfile::tempdir().unwrap();
        let boxes = super::sandbox::Boxes::at(dir.path().to_path_buf(), 64, 64);
        let (rt, _reports) = Runtime::new(
            Duration::from_millis(10),
            Duration::from_millis(10),
            boxes,
            super::Limits::default(),
        );
        let session = SessionId::now_v7();
        let first = rt.session_dispatch_lock(session);
        let in_flight = first.clone().lock_owned().await;
        drop(first); // the crashed agent is gone; its dispatch still holds the lock
        let restarted = rt.session_dispatch_lock(session);
        assert!(
            restarted.try_lock().is_err(),
            "the restarted agent waits for the dispatch in flight"
        );
        drop(in_flight);
        assert!(restarted.try_lock().is_ok());
        let weak = Arc::downgrade(&restarted);
        drop(restarted);
        assert!(weak.upgrade().is_none(), "nothing keeps a lock nobody holds");
        let other = rt.session_dispatch_lock(SessionId::now_v7());
        assert_eq!(
            rt.dispatch_locks.lock().unwrap().len(),
            1,
            "dead entries are pruned: {other:?}"
        );
    }
}
