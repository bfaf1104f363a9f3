//! A test agent speaking berth's agent protocol (a subset of the Pi coding agent's RPC mode): JSON
//! commands on stdin, one per line (`prompt`, `abort`, `get_state`, `extension_ui_response`); JSON events
//! on stdout (`response`, `agent_start`, `message_*`, `extension_ui_request`, `agent_end`).
//!
//! A prompt's text is a directive:
//! - `pwd`: reply with the working directory
//! - `write NAME TEXT`: write a file in the working directory
//! - `env NAME`: reply with an environment variable
//! - `history`: with `--session PATH`, reply with how many prompts the conversation file holds
//! - `envkeys`: reply with the names of every environment variable, sorted, space-separated
//! - `ask`: ask a confirm question and wait for the answer
//! - `ask-timeout MS`: ask a select question that expires after MS milliseconds, and keep working
//! - `notify`: send fire-and-forget UI notices (notify, setStatus, setTitle), then reply `notified`
//! - `hang`: start working and never finish (until aborted)
//! - `crash`: exit with status 3
//! - `stream N`: N streamed output events, a tool call, and token usage
//! - `usage IN OUT COST`: a reply whose usage reports these figures (believable or not)
//! - `deltas N RATE`: N Pi text deltas (`delta 0 `, `delta 1 `, ...), RATE a second, each with the whole
//!   message so far in `message` and `partial` as Pi sends them; then `message_end` with the full text
//! - `flood-line BYTES`: one line of BYTES without a newline, then the newline, then `flooded`
//! - `flood-lines COUNT`: COUNT lines of 1 MiB (tool output updates) as fast as the pipe takes them,
//!   then `flooded`
//! - `try WHAT ARG`: what a hostile agent would try, replying `ok ...` or `refused ...`: `read PATH`,
//!   `write PATH`, `connect HOST:PORT` (replies with what the server sent first), `mount DIR`, `umount DIR`,
//!   `unshare`, `ptrace PID`, `fork N` (how many of N children could start), `alloc MIB` (touches MIB)
//! - anything else: echo it back
//!
//! While a turn runs (`hang`), a plain `prompt` is refused as Pi refuses it, and a `steer` or `follow_up`
//! ends the turn with a reply `steer TEXT` / `follow_up TEXT`.
//!
//! - `child`: start a child process (`sleep 600`) in the agent's process group, as a tool would, and reply
//!   `child PID`
//!
//! Flags: `--ignore-abort` (a `hang` ignores `abort`), `--ignore-term` (SIGTERM is ignored),
//! `--ignore-eof` (the agent stays when its stdin closes, until it is killed).
use std::io::{BufRead, Write};

fn emit(v: serde_json::Value) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{v}");
    let _ = out.flush();
}

fn reply(text: &str) {
    use serde_json::json;
    emit(json!({"type": "message_start", "message": {"role": "assistant"}}));
    emit(json!({"type": "message_update", "message": {"role": "assistant"}, "delta": text}));
    emit(json!({"type": "message_end", "message": {"role": "assistant", "content": [{"type": "text", "text": text}]}}));
}

fn main() {
    use serde_json::json;
    let args: Vec<String> = std::env::args().collect();
    let ignore_abort = args.iter().any(|a| a == "--ignore-abort");
    if args.iter().any(|a| a == "--ignore-term") {
        // SAFETY: installing SIG_IGN for SIGTERM has no preconditions.
        unsafe {
            libc::signal(libc::SIGTERM, libc::SIG_IGN);
        }
    }
    // `--session PATH` (as berth passes a Pi profile): a conversation file like Pi's, a header line with the
    // conversation's id and one line per prompt, written from the first prompt on.
    let session_file = args
        .iter()
        .position(|a| a == "--session")
        .and_then(|i| args.get(i + 1))
        .map(std::path::PathBuf::from);
    let mut conversation_id = session_file
        .as_ref()
        .and_then(|p| std::fs::read_to_string(p).ok())
        .and_then(|t| t.lines().next().map(str::to_string))
        .and_then(|l| serde_json::from_str::<serde_json::Value>(&l).ok())
        .and_then(|h| h["id"].as_str().map(str::to_string));
    let mut working = false;
    let mut asked: Option<String> = None;
    let stdin = std::io::stdin();
    for line in stdin.lock().lines() {
        let Ok(line) = line else { break };
        let Ok(cmd) = serde_json::from_str::<serde_json::Value>(&line) else {
            emit(json!({"type": "response", "success": false, "error": "not JSON"}));
            continue;
        };
        match cmd["type"].as_str().unwrap_or_default() {
            "prompt" if working => {
                // As Pi does: a plain prompt while a turn runs is refused.
                emit(
                    json!({"type": "response", "id": cmd["id"], "command": "prompt", "success": false, "error": "Agent is already processing. Specify streamingBehavior ('steer' or 'followUp') to queue the message."}),
                );
            }
            "steer" | "follow_up" if working => {
                // A `hang` turn reads it and ends with it.
                emit(json!({"type": "response", "id": cmd["id"], "command": cmd["type"], "success": true}));
                working = false;
                reply(&format!(
                    "{} {}",
                    cmd["type"].as_str().unwrap_or_default(),
                    cmd["message"].as_str().unwrap_or_default()
                ));
                emit(json!({"type": "agent_end"}));
            }
            "prompt" => {
                let text = cmd["message"].as_str().unwrap_or_default().to_string();
                emit(json!({"type": "response", "id": cmd["id"], "command": "prompt", "success": true}));
                if let Some(path) = &session_file {
                    let id = conversation_id
                        .get_or_insert_with(|| format!("conv-{}-{}", std::process::id(), text.len()))
                        .clone();
                    let mut lines = std::fs::read_to_string(path).unwrap_or_default();
                    if lines.is_empty() {
                        lines = format!("{}\n", json!({"type": "session", "version": 3, "id": id}));
                    }
                    lines.push_str(&format!("{}\n", json!({"type": "message", "text": text})));
                    std::fs::write(path, lines).unwrap();
                }
                emit(json!({"type": "agent_start"}));
                emit(json!({"type": "message_start", "message": {"role": "user", "content": text}}));
                let mut words = text.splitn(3, ' ');
                match words.next().unwrap_or_default() {
                    "pwd" => reply(&std::env::current_dir().unwrap().display().to_string()),
                    "write" => {
                        let name = words.next().unwrap_or("out.txt");
                        let body = words.next().unwrap_or_default();
                        std::fs::write(name, body).unwrap();
                        reply(&format!("wrote {name}"));
                    }
                    // How many prompts this conversation has seen, this one included (it spans relaunches).
                    "history" => {
                        let n = session_file
                            .as_ref()
                            .and_then(|p| std::fs::read_to_string(p).ok())
                            .map_or(0, |t| t.lines().count().saturating_sub(1));
                        reply(&format!("history {n}"));
                    }
                    "env" => reply(&std::env::var(words.next().unwrap_or_default()).unwrap_or_default()),
                    "envkeys" => {
                        let mut keys: Vec<String> = std::env::vars_os()
                            .map(|(k, _)| k.to_string_lossy().into_owned())
                            .collect();
                        keys.sort();
                        reply(&keys.join(" "));
                    }
                    "crash" => std::process::exit(3),
                    "child" => {
                        // Never waited for: like a tool left running, it is to outlive this agent.
                        #[allow(clippy::zombie_processes)]
                        let child = std::process::Command::new("sleep")
                            .arg("600")
                            .stdin(std::process::Stdio::null())
                            .stdout(std::process::Stdio::null())
                            .stderr(std::process::Stdio::null())
                            .spawn()
                            .unwrap();
                        reply(&format!("child {}", child.id()));
                    }
                    "stream" => {
                        // `stream N`: N output events, each flushed, as a working agent streams text.
                        let n: usize = words.next().and_then(|w| w.parse().ok()).unwrap_or(10);
                        emit(json!({"type": "tool_execution_start", "toolName": "bash"}));
                        for i in 0..n {
                            emit(
                                json!({"type": "message_update", "message": {"role": "assistant"}, "delta": format!("chunk {i} ")}),
                            );
                            std::thread::sleep(std::time::Duration::from_millis(2));
                        }
                        emit(json!({"type": "tool_execution_end", "toolName": "bash"}));
                        emit(
                            json!({"type": "message_end", "message": {"role": "assistant", "content": [{"type": "text", "text": format!("streamed {n}")}], "usage": {"input": 10, "output": 20, "cost": {"total": 0.5}}}}),
                        );
                    }
                    "usage" => {
                        // `usage IN OUT COST`: a reply reporting these figures, whatever they are.
                        let rest: Vec<&str> = words.by_ref().flat_map(|w| w.split(' ')).collect();
                        let mut figures = rest.into_iter();
                        let mut num = || -> serde_json::Value {
                            let w = figures.next().unwrap_or("0");
                            w.parse::<i64>()
                                .map(serde_json::Value::from)
                                .or_else(|_| w.parse::<f64>().map(serde_json::Value::from))
                                .unwrap_or(serde_json::Value::Null)
                        };
                        let (input, output, cost) = (num(), num(), num());
                        emit(
                            json!({"type": "message_end", "message": {"role": "assistant", "model": "liar-1", "content": [{"type": "text", "text": "used"}], "usage": {"input": input, "output": output, "cost": {"total": cost}}}}),
                        );
                    }
                    "deltas" => {
                        let n: usize = words.next().and_then(|w| w.parse().ok()).unwrap_or(100);
                        let rate: f64 = words
                            .next()
                            .and_then(|w| w.parse().ok())
                            .filter(|r: &f64| *r > 0.0)
                            .unwrap_or(100.0);
                        let start = std::time::Instant::now();
                        let mut text = String::new();
                        emit(json!({"type": "message_start", "message": {"role": "assistant", "content": []}}));
                        for i in 0..n {
                            let delta = format!("delta {i} ");
                            text.push_str(&delta);
                            let partial = json!({"role": "assistant", "content": [{"type": "text", "text": text}]});
                            emit(
                                json!({"type": "message_update", "message": partial, "assistantMessageEvent": {"type": "text_delta", "contentIndex": 0, "delta": delta, "partial": partial}}),
                            );
                            // Paced against the start, so a late wake-up does not slow the whole stream.
                            let next = start + std::time::Duration::from_secs_f64((i + 1) as f64 / rate);
                            if let Some(wait) = next.checked_duration_since(std::time::Instant::now()) {
                                std::thread::sleep(wait);
                            }
                        }
                        emit(
                            json!({"type": "message_end", "message": {"role": "assistant", "content": [{"type": "text", "text": text}]}}),
                        );
                    }
                    "flood-line" => {
                        let bytes: usize = words.next().and_then(|w| w.parse().ok()).unwrap_or(1 << 20);
                        let mut out = std::io::stdout().lock();
                        let chunk = vec![b'x'; 1 << 16];
                        let _ = out.write_all(br#"{"type":"message_update","delta":""#);
                        let mut left = bytes;
                        while left > 0 {
                            let n = left.min(chunk.len());
                            if out.write_all(&chunk[..n]).is_err() {
                                break;
                            }
                            left -= n;
                        }
                        let _ = out.write_all(b"\"}\n");
                        let _ = out.flush();
                        drop(out);
                        reply("flooded");
                    }
                    "flood-lines" => {
                        let count: usize = words.next().and_then(|w| w.parse().ok()).unwrap_or(16);
                        let body = "y".repeat(1 << 20);
                        for i in 0..count {
                            emit(
                                json!({"type": "tool_execution_update", "toolName": "bash", "n": i, "partialResult": {"content": [{"type": "text", "text": body}]}}),
                            );
                        }
                        reply("flooded");
                    }
                    "hang" => {
                        working = true;
                        continue;
                    }
                    "ask-timeout" => {
                        // A question with its own timeout (Pi resolves it with a default when it passes).
                        let ms: u64 = words.next().and_then(|w| w.parse().ok()).unwrap_or(200);
                        emit(
                            json!({"type": "extension_ui_request", "id": "q-timed", "method": "select", "title": "Pick", "options": ["a", "b"], "timeout": ms}),
                        );
                        working = true;
                        continue;
                    }
                    "ask" => {
                        let id = format!("q-{}", std::process::id());
                        emit(
                            json!({"type": "extension_ui_request", "id": id, "method": "confirm", "title": "Proceed?", "message": "Shall I go on?"}),
                        );
                        asked = Some(id);
                        continue;
                    }
                    "notify" => {
                        // Fire-and-forget notices (they carry ids too), then an ordinary reply.
                        emit(
                            json!({"type": "extension_ui_request", "id": "n-notify", "method": "notify", "message": "working on it", "notifyType": "info"}),
                        );
                        emit(
                            json!({"type": "extension_ui_request", "id": "n-status", "method": "setStatus", "statusKey": "ext", "statusText": "busy"}),
                        );
                        emit(
                            json!({"type": "extension_ui_request", "id": "n-title", "method": "setTitle", "title": "berth test"}),
                        );
                        reply("notified");
                    }
                    "try" => reply(&attempt(
                        words.next().unwrap_or_default(),
                        words.next().unwrap_or_default(),
                    )),
                    _ => reply(&text),
                }
                emit(json!({"type": "agent_end"}));
            }
            "abort" => {
                emit(json!({"type": "response", "command": "abort", "success": true}));
                if working && !ignore_abort {
                    working = false;
                    emit(json!({"type": "agent_end", "aborted": true}));
                }
            }
            "get_state" => emit(
                json!({"type": "response", "id": cmd["id"], "command": "get_state", "success": true, "data": {
                    "isStreaming": working,
                    "sessionId": conversation_id,
                    "sessionFile": session_file,
                    "sessionName": std::env::var("TEST_AGENT_SESSION_NAME").ok(),
                    "thinkingLevel": "off",
                    "model": {"id": "echo", "provider": "test"},
                }}),
            ),
            "get_commands" => emit(
                json!({"type": "response", "id": cmd["id"], "command": "get_commands", "success": true, "data": {"commands": [{"name": "review", "source": "prompt"}]}}),
            ),
            "get_available_models" => emit(
                json!({"type": "response", "id": cmd["id"], "command": "get_available_models", "success": true, "data": {"models": [{"id": "echo", "provider": "test"}]}}),
            ),
            "extension_ui_response" => {
                if asked.as_deref() == cmd["id"].as_str() {
                    asked = None;
                    reply(&format!("answered {}", cmd["confirmed"]));
                    emit(json!({"type": "agent_end"}));
                }
            }
            other => emit(json!({"type": "response", "command": other, "success": false, "error": "unknown command"})),
        }
    }
    if args.iter().any(|a| a == "--ignore-eof") {
        loop {
            std::thread::sleep(std::time::Duration::from_secs(3600));
        }
    }
}

/// One thing a hostile agent tries (`try WHAT ARG`): `ok ...` when it worked, `refused ...` with the error.
fn attempt(what: &str, arg: &str) -> String {
    use std::io::{Read, Write};
    let result: Result<String, String> = match what {
        "read" => std::fs::read(arg)
            .map(|b| format!("{} bytes", b.len()))
            .map_err(|e| e.to_string()),
        "write" => std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(arg)
            .and_then(|mut f| f.write_all(b"written by a hostile agent\n"))
            .map(|_| "written".into())
            .map_err(|e| e.to_string()),
        "connect" => {
            use std::net::ToSocketAddrs;
            arg.to_socket_addrs()
                .map_err(|e| e.to_string())
                .and_then(|mut a| a.next().ok_or_else(|| "no address".to_string()))
                .and_then(|a| {
                    std::net::TcpStream::connect_timeout(&a, std::time::Duration::from_secs(3))
                        .map_err(|e| e.to_string())
                })
                .map(|mut s| {
                    let _ = s.set_read_timeout(Some(std::time::Duration::from_secs(3)));
                    let mut got = String::new();
                    let _ = s.read_to_string(&mut got);
                    format!("connected {}", got.trim())
                })
        }
        "mount" => syscall_result(unsafe {
            let dir = std::ffi::CString::new(arg).unwrap();
            libc::mount(c"none".as_ptr(), dir.as_ptr(), c"tmpfs".as_ptr(), 0, std::ptr::null())
        }),
        "umount" => syscall_result(unsafe {
            let dir = std::ffi::CString::new(arg).unwrap();
            libc::umount2(dir.as_ptr(), libc::MNT_DETACH)
        }),
        "unshare" => syscall_result(unsafe { libc::unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWNS) }),
        "ptrace" => syscall_result(unsafe {
            libc::ptrace(libc::PTRACE_ATTACH, arg.parse::<libc::pid_t>().unwrap_or(1), 0, 0) as libc::c_int
        }),
        "fork" => {
            let n: usize = arg.parse().unwrap_or(1);
            let mut children = Vec::new();
            for _ in 0..n {
                // SAFETY: the child only pauses until it is killed.
                match unsafe { libc::fork() } {
                    0 => loop {
                        unsafe { libc::pause() };
                    },
                    pid if pid > 0 => children.push(pid),
                    _ => break,
                }
            }
            for pid in &children {
                unsafe {
                    libc::kill(*pid, libc::SIGKILL);
                    libc::waitpid(*pid, std::ptr::null_mut(), 0);
                }
            }
            Ok(format!("forked {}", children.len()))
        }
        "alloc" => {
            let mib: usize = arg.parse().unwrap_or(1);
            let mut held: Vec<Vec<u8>> = Vec::new();
            for _ in 0..mib {
                held.push(vec![1u8; 1024 * 1024]);
            }
            Ok(format!(
                "allocated {}",
                held.iter().map(Vec::len).sum::<usize>() / (1024 * 1024)
            ))
        }
        other => Err(format!("unknown attempt {other}")),
    };
    match result {
        Ok(what) => format!("ok {what}"),
        Err(why) => format!("refused {why}"),
    }
}

fn syscall_result(rc: libc::c_int) -> Result<String, String> {
    if rc == 0 {
        Ok("done".into())
    } else {
        Err(std::io::Error::last_os_error().to_string())
    }
}
