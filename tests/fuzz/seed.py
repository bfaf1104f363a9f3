#!/usr/bin/env python3
"""Seed a fresh berth server with one of each resource, then write schemathesis dictionaries of their ids.

Used by .ci/spec-fuzz. Without seeding, every `{id}` the fuzzer sends is a random UUID (404) and every list
is empty, so the response schemas of real resources would never be checked. The dictionaries let
tests/fuzz/schemathesis.toml draw real ids some of the time.

Destructive operations (delete, archive) get their own "doomed" resources, so the ones every other
operation reads stay alive for the whole run.

usage: seed.py BASE_URL TOKEN REPO_ROOT OUT_DIR [AGENT_PROFILE]
REPO_ROOT holds the git repositories `demo`, `spare` and `fresh` (the script makes them); `fresh` is left
unregistered so that the fuzzer's registration can succeed. With AGENT_PROFILE (a profile running
berth-test-agent), some sessions run an agent, one of them waiting on an attention request.
Only the standard library: it runs before, and independently of, the fuzzer's own dependencies.
"""

import json
import os
import sys
import time
import urllib.error
import urllib.request


def main() -> int:
    base, token, repo_root, out_dir = sys.argv[1:5]
    agent = sys.argv[5] if len(sys.argv) > 5 else None
    api = base.rstrip("/") + "/api/v1"

    def call(method: str, path: str, body=None, expect=(200, 201, 202, 204)):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(api + path, data=data, method=method)
        req.add_header("Authorization", f"Bearer {token}")
        if data is not None:
            req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=60) as resp:
                status, raw = resp.status, resp.read()
        except urllib.error.HTTPError as err:
            status, raw = err.code, err.read()
        if status not in expect:
            raise SystemExit(f"seed: {method} {path} answered {status}: {raw[:500]!r}")
        return json.loads(raw) if raw else None

    ids: dict[str, list[str]] = {}

    def keep(name: str, *values) -> None:
        ids.setdefault(name, []).extend(v for v in values if v is not None)

    def new_task(ws_id: str, body: dict) -> dict:
        return call("POST", f"/workspaces/{ws_id}/tasks", body)

    def new_session(task_id: str, body: dict) -> dict:
        s = call("POST", f"/tasks/{task_id}/sessions", body)
        keep("environment_ids", s.get("task_environment_id"))
        return s

    # Two workspaces: the first holds everything; the second is empty and the only one offered to
    # `DELETE /workspaces/{id}?confirm_name=`.
    ws = call("POST", "/workspaces", {"name": "fuzz-seed"})
    empty = call("POST", "/workspaces", {"name": "fuzz-seed-empty"})
    keep("workspace_ids", ws["id"], empty["id"])
    keep("deletable_workspace_ids", empty["id"])
    keep("deletable_workspace_names", empty["name"])

    repo = call("POST", f"/workspaces/{ws['id']}/repositories", {"path": os.path.join(repo_root, "demo")})
    spare = call("POST", f"/workspaces/{ws['id']}/repositories", {"path": os.path.join(repo_root, "spare")})
    keep("repository_ids", repo["id"], spare["id"])
    keep("deletable_repository_ids", spare["id"], repo["id"])  # spare is unused: deleting it succeeds
    keep("repo_paths", *(os.path.join(repo_root, name) for name in ("fresh", "demo", "spare")))
    slot = [{"repository_id": repo["id"]}]

    # The main task: a worktree environment shared by two sessions that do not start an agent.
    task = new_task(ws["id"], {"title": "seed", "repositories": [{**slot[0], "branch": "feature/seed"}]})
    s1 = new_session(task["id"], {"executor_type": "worktree", "start": False})
    s2 = new_session(task["id"], {"executor_type": "worktree", "start": False, "name": "second"})
    keep("task_ids", task["id"])
    keep("session_ids", s1["id"], s2["id"])
    if s1.get("task_environment_id"):
        call("POST", f"/environments/{s1['task_environment_id']}/git-status/refresh")

    # A subtask inheriting its parent's environment, a quick chat, and a task working in the repository.
    sub = new_task(ws["id"], {"title": "child", "parent_task_id": task["id"], "workspace_mode": "inherit_parent"})
    chat = new_task(ws["id"], {"title": "chat", "kind": "quick_chat"})
    local = new_task(ws["id"], {"title": "local", "repositories": slot})
    s3 = new_session(local["id"], {"executor_type": "local", "start": False})
    keep("task_ids", sub["id"], chat["id"], local["id"])
    keep("session_ids", s3["id"])

    if agent:
        # An agent that streams a turn then idles, and one waiting on a confirm question.
        a1 = new_session(task["id"], {"executor_type": "worktree", "agent_profile": agent, "prompt": "stream 5"})
        a2 = new_session(local["id"], {"executor_type": "local", "agent_profile": agent, "prompt": "ask"})
        keep("session_ids", a1["id"], a2["id"])
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            snap = call("GET", f"/sessions/{a2['id']}/snapshot")
            pending = [r["id"] for r in snap.get("attention_requests", [])]
            if pending:
                keep("attention_request_ids", *pending)
                break
            time.sleep(0.2)
        else:
            raise SystemExit(f"seed: the agent never asked (session state {snap.get('state')})")

    # Doomed tasks and sessions, for delete and archive: a bare task, one with a worktree, a parent with a
    # child (cascade), and an archived one (unarchive); extra sessions on the main task.
    d1 = new_task(ws["id"], {"title": "doomed"})
    d2 = new_task(ws["id"], {"title": "doomed worktree", "repositories": [{**slot[0], "branch": "feature/doomed"}]})
    new_session(d2["id"], {"executor_type": "worktree", "start": False})
    d3 = new_task(ws["id"], {"title": "doomed parent", "repositories": slot})
    d4 = new_task(ws["id"], {"title": "doomed child", "parent_task_id": d3["id"]})
    archived = new_task(ws["id"], {"title": "archived", "repositories": [{**slot[0], "branch": "feature/old"}]})
    new_session(archived["id"], {"executor_type": "worktree", "start": False})
    result = call("POST", f"/tasks/{archived['id']}/archive")
    keep("cleanup_job_ids", *(job["id"] for job in result.get("cleanup_jobs", [])))
    keep("doomed_task_ids", d1["id"], d2["id"], d3["id"], d4["id"])
    keep("archived_task_ids", archived["id"], d1["id"], d2["id"])
    for _ in range(3):
        keep("doomed_session_ids", new_session(task["id"], {"executor_type": "worktree", "start": False})["id"])

    os.makedirs(out_dir, exist_ok=True)
    names = [
        "workspace_ids", "deletable_workspace_ids", "deletable_workspace_names", "repository_ids",
        "deletable_repository_ids", "repo_paths", "task_ids", "doomed_task_ids", "archived_task_ids", "session_ids",
        "doomed_session_ids", "environment_ids", "cleanup_job_ids", "attention_request_ids",
    ]  # fmt: skip
    for name in names:
        values = ids.get(name) or ["00000000-0000-7000-8000-000000000000"]  # no such resource (no agent)
        with open(os.path.join(out_dir, f"{name}.dict"), "w", encoding="utf-8") as fd:
            for value in values:
                fd.write(json.dumps(value, ensure_ascii=False) + "\n")  # libFuzzer format: a quoted string
    print("seed: " + ", ".join(f"{len(ids.get(n, []))} {n}" for n in names))
    return 0


if __name__ == "__main__":
    sys.exit(main())
