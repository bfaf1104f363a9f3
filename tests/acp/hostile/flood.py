#!/usr/bin/env python3
"""A hostile Agent Client Protocol agent for berth's memory bounds (tests/api/agent_memory.rs). On a prompt,
by FLOOD_MODE:
- "flood": writes a file of FLOOD_MIB MiB in its worktree, asks berth to read it FLOOD_COUNT times at once
  and never reads its stdin again (berth must end it, not grow);
- "burst": writes a 2 MiB file, asks berth to read it FLOOD_COUNT times at once, reads nothing for two
  seconds (the answers wait in the pipe), then reads every answer and reports how many came back with
  the file and which errors came back (JSON, as its message);
- "write": asks berth to write its worktree's .git (refused) with a content marker, and reports the code."""
import json, os, sys, time

def send(msg):
    msg["jsonrpc"] = "2.0"
    sys.stdout.write(json.dumps(msg) + "\n")
    sys.stdout.flush()

def read():
    line = sys.stdin.readline()
    if not line:
        sys.exit(0)
    return json.loads(line)

def big_file(path, mib):
    line = ("x" * 1023) + "\n"
    with open(path, "w") as f:
        for _ in range(mib * 1024):
            f.write(line)

mode = os.environ.get("FLOOD_MODE", "flood")
count = int(os.environ.get("FLOOD_COUNT", "60"))
session = "flood-1"
while True:
    msg = read()
    method, mid, params = msg.get("method"), msg.get("id"), msg.get("params") or {}
    if method == "initialize":
        send({"id": mid, "result": {"protocolVersion": 1, "agentCapabilities": {},
              "agentInfo": {"name": "flood", "version": "1"}}})
    elif method == "session/new":
        cwd = params["cwd"]
        send({"id": mid, "result": {"sessionId": session}})
    elif method == "session/prompt":
        if mode == "write":
            send({"id": 7, "method": "fs/write_text_file", "params": {"sessionId": session,
                  "path": cwd + "/.git", "content": "MARKER-" + "c" * 4096}})
            while True:
                answer = read()
                if answer.get("id") == 7 and "method" not in answer:
                    break
            report = {"code": (answer.get("error") or {}).get("code")}
        else:
            mib = int(os.environ.get("FLOOD_MIB", "16")) if mode == "flood" else 2
            path = cwd + "/big.txt"
            # Just under berth's largest read (16 MiB), so that every read is served.
            big_file(path, mib)
            if mode == "flood":
                with open(path, "r+") as f:
                    f.truncate(mib * 1024 * 1024 - 4096)
            burst = "".join(json.dumps({"jsonrpc": "2.0", "id": 1000 + i, "method": "fs/read_text_file",
                                        "params": {"sessionId": session, "path": path}}) + "\n"
                            for i in range(count))
            sys.stdout.write(burst)
            sys.stdout.flush()
            if mode == "flood":
                while True:
                    time.sleep(3600)
            time.sleep(2)
            served, errors = 0, []
            while served + len(errors) < count:
                answer = read()
                if "method" in answer or not isinstance(answer.get("id"), int) or answer["id"] < 1000:
                    continue
                if "error" in answer:
                    errors.append(answer["error"])
                else:
                    served += 1
            report = {"served": served, "errors": len(errors),
                      "codes": sorted({e.get("code") for e in errors}),
                      "message": errors[0].get("message") if errors else None}
        send({"method": "session/update", "params": {"sessionId": session, "update": {
            "sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": json.dumps(report)}}}})
        send({"id": mid, "result": {"stopReason": "end_turn"}})
    elif method == "session/cancel":
        pass
    elif mid is not None and method is not None:
        send({"id": mid, "error": {"code": -32601, "message": "not offered"}})
