//! A test agent speaking berth's agent protocol (a subset of the Pi coding agent's RPC mode): JSON
//! commands on stdin, one per line (`prompt`, `abort`, `get_state`, `extension_ui_response`); JSON events
//! on stdout (`response`, `agent_start`, `message_*`, `extension_ui_request`, `agent_end`).
//!
//! A prompt's text is a directive:
//! - `pwd`: reply with the working directory
//! - `write NAME TEXT`: write a file in the working directory
//! - `env NAME`: reply with an environment variable
//! - `envkeys`: reply with the names of every environment variable, sorted, space-separated
//! - `ask`: ask a confirm question and wait for the answer
//! - `notify`: send fire-and-forget UI notices (notify, setStatus, setTitle), then reply `notified`
//! - `hang`: start working and never finish (until aborted)
//! - `crash`: exit with status 3
//! - `stream N`: N streamed output events, a tool call, and token usage
//! - `deltas N RATE`: N Pi text deltas (`delta 0 `, `delta 1 `, ...), RATE a second, each with the whole
//!   message so far in `message` and `partial` as Pi sends them; then `message_end` with the full text
//! - `flood-line BYTES`: one line of BYTES without a newline, then the newline, then `flooded`
//! - `flood-lines COUNT`: COUNT lines of 1 MiB (tool output updates) as fast as the pipe takes them,
//!   then `flooded`
//! - anything else: echo it back
//!
//! Flags: `--ignore-abort` (a `hang` ignores `abort`), `--ignore-term` (SIGTERM is ignored).
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
            "prompt" => {
                let text = cmd["message"].as_str().unwrap_or_default().to_string();
                emit(json!({"type": "response", "command": "prompt", "success": true}));
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
                    "env" => reply(&std::env::var(words.next().unwrap_or_default()).unwrap_or_default()),
                    "envkeys" => {
                        let mut keys: Vec<String> = std::env::vars_os()
                            .map(|(k, _)| k.to_string_lossy().into_owned())
                            .collect();
                        keys.sort();
                        reply(&keys.join(" "));
                    }
                    "crash" => std::process::exit(3),
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
                        for method in ["notify", "setStatus", "setTitle"] {
                            emit(
                                json!({"type": "extension_ui_request", "id": format!("n-{method}"), "method": method, "message": "working on it"}),
                            );
                        }
                        reply("notified");
                    }
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
                json!({"type": "response", "command": "get_state", "success": true, "data": {"isStreaming": working}}),
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
}
