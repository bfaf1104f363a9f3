#!/usr/bin/env python3
"""A hostile Agent Client Protocol agent (tests/api/acp/hostile.rs): on each prompt it asks berth to write
files inside and outside the session's worktree (through '..', an absolute path elsewhere, a symbolic
link, the worktree's .git) and to read a file outside it, then reports what berth answered (and the MCP
servers its conversation was opened with) as its message.
With HOSTILE_AUTH=1 it refuses to open a conversation until authenticated (-32000)."""
import json, os, sys

def send(msg):
    msg["jsonrpc"] = "2.0"
    sys.stdout.write(json.dumps(msg) + "\n")
    sys.stdout.flush()

def read():
    line = sys.stdin.readline()
    if not line:
        sys.exit(0)
    return json.loads(line)

next_id = 100
def ask(method, params):
    """A request to berth; returns its answer (notifications meanwhile are ignored)."""
    global next_id
    next_id += 1
    send({"id": next_id, "method": method, "params": params})
    while True:
        msg = read()
        if msg.get("id") == next_id and "method" not in msg:
            return msg

session = None
while True:
    msg = read()
    method, mid, params = msg.get("method"), msg.get("id"), msg.get("params") or {}
    if method == "initialize":
        send({"id": mid, "result": {"protocolVersion": 1, "agentCapabilities": {"loadSession": True},
              "agentInfo": {"name": "hostile", "version": "1"},
              "authMethods": [{"id": "hostile-key", "name": "Hostile key"}]}})
    elif method == "session/new":
        if os.environ.get("HOSTILE_AUTH") == "1":
            send({"id": mid, "error": {"code": -32000, "message": "Authentication required"}})
        else:
            session = "hostile-1"
            cwd = params["cwd"]
            mcp = params.get("mcpServers")
            send({"id": mid, "result": {"sessionId": session}})
    elif method == "session/prompt":
        outside = os.path.dirname(cwd)
        attempts = {
            "inside": ("fs/write_text_file", {"path": cwd + "/ok/inside.txt", "content": "fine\n"}),
            "dotdot": ("fs/write_text_file", {"path": cwd + "/../escaped.txt", "content": "x"}),
            "absolute": ("fs/write_text_file", {"path": outside + "/absolute.txt", "content": "x"}),
            "link": ("fs/write_text_file", {"path": cwd + "/link/linked.txt", "content": "x"}),
            "git": ("fs/write_text_file", {"path": cwd + "/.git", "content": "gitdir: /nowhere"}),
            "read_outside": ("fs/read_text_file", {"path": outside + "/secret.txt"}),
            "read_inside": ("fs/read_text_file", {"path": cwd + "/ok/inside.txt"}),
        }
        report = {"mcp": mcp}
        for name, (m, p) in attempts.items():
            p["sessionId"] = session
            answer = ask(m, p)
            report[name] = answer.get("error", {}).get("code", "ok") if "error" in answer else (answer.get("result") or {}).get("content", "ok")
        send({"method": "session/update", "params": {"sessionId": session, "update": {
            "sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": json.dumps(report, sort_keys=True)}}}})
        send({"id": mid, "result": {"stopReason": "end_turn"}})
    elif method == "session/cancel":
        pass
    elif mid is not None:
        send({"id": mid, "error": {"code": -32601, "message": "not offered"}})
