"""One end-to-end scenario through a client generated with openapi-python-client from the committed
openapi/openapi.json (run by .ci/clients, which starts the server and generates and installs the client).

Environment: BERTH_URL (http://host:port), BERTH_TOKEN (an admin token), BERTH_CI_REPO (the canonical
path of a git repository with one commit, inside BERTH_REPO_ROOTS), BERTH_WORKTREE_ROOT (where berth
creates worktrees). The server has an agent profile `test` running berth-test-agent.

workspace -> repository -> task -> two sessions with the test agent (one shared worktree) -> events
replay -> a message and its reply -> session delete (the worktree stays) -> git status refresh ->
archive -> its cleanup job reaches `succeeded` and the worktree is gone, the branch kept.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from http import HTTPStatus
from typing import Any, Protocol, TypeVar
from uuid import UUID

import httpx
from berth_client import AuthenticatedClient
from berth_client.api.cleanup import get_cleanup_job, list_cleanup_jobs
from berth_client.api.environments import get_task_environment
from berth_client.api.events import list_events
from berth_client.api.git_status import refresh_environment_git_status, get_session_git_status
from berth_client.api.repositories import register_repository
from berth_client.api.sessions import (
    create_session,
    delete_session,
    get_session,
    list_agent_profiles,
    list_task_sessions,
    send_session_message,
)
from berth_client.api.tasks import archive_task, create_task
from berth_client.api.workspaces import create_workspace
from berth_client.models import (
    Message,
    AgentProfileList,
    ArchiveResult,
    CleanupJob,
    CleanupJobList,
    CleanupJobState,
    CreateSession,
    CreateTask,
    CreateWorkspace,
    Environment,
    EnvironmentStatus,
    ErrorCode,
    CleanupJobUpdatedEvent,
    EventPage,
    RuntimeOutputEvent,
    ExecutorType,
    GitStatusList,
    GitStatusUpdatedEvent,
    Problem,
    RegisterRepository,
    Repository,
    SendMessage,
    Session,
    SessionList,
    SessionState,
    Task,
    TaskKind,
    TaskRepositoryInput,
    Workspace,
)
from berth_client.types import UNSET, Response, Unset

CLIENT = "python"
WAIT_S = 60.0
POLL_S = 0.05

T = TypeVar("T")


def env(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        raise SystemExit(f"[{CLIENT}] {name} is not set")
    return value


BASE_URL = env("BERTH_URL")
TOKEN = env("BERTH_TOKEN")
REPO_PATH = env("BERTH_CI_REPO")
WORKTREE_ROOT = os.path.realpath(env("BERTH_WORKTREE_ROOT"))

api = AuthenticatedClient(base_url=BASE_URL, token=TOKEN, raise_on_unexpected_status=True, timeout=httpx.Timeout(30.0))

step = "start"


class ScenarioError(Exception):
    pass


def log(msg: str) -> None:
    print(f"[{CLIENT}] {msg}", flush=True)


def begin(name: str) -> None:
    global step
    step = name
    log(name)


def check(cond: object, msg: str) -> None:
    if not cond:
        raise ScenarioError(f"{step}: {msg}")


def eq(actual: object, expected: object, what: str) -> None:
    check(actual == expected, f"{what}: expected {expected!r}, got {actual!r}")


def expect(what: str, r: Response[Any], status: int, kind: type[T]) -> T:
    """The call answered `status` with a body the generated client parsed as `kind`."""
    if r.status_code != status:
        raise ScenarioError(
            f"{step}: {what} answered {int(r.status_code)} (expected {status}): {r.content.decode(errors='replace')}"
        )
    check(r.headers.get("x-request-id"), f"{what}: no X-Request-Id header")
    check(isinstance(r.parsed, kind), f"{what}: the body parsed as {type(r.parsed).__name__}, not {kind.__name__}")
    return r.parsed  # type: ignore[return-value]


def until(what: str, probe: Callable[[], T | None], last: Callable[[], object] = lambda: "") -> T:
    """Polls `probe` until it returns a value, or fails after the deadline with `what` and the last state."""
    deadline = time.monotonic() + WAIT_S
    while True:
        value = probe()
        if value is not None:
            return value
        if time.monotonic() > deadline:
            raise ScenarioError(f"{step}: timed out after {WAIT_S:.0f} s waiting for {what}; last seen: {last()!r}")
        time.sleep(POLL_S)


def field(value: Any, *path: str | int) -> Any:
    """A field of a JSON value another party wrote (the agent's own events, under `runtime.output`)."""
    for key in path:
        if isinstance(value, dict) and isinstance(key, str):
            value = value.get(key)
        elif isinstance(value, list) and isinstance(key, int) and key < len(value):
            value = value[key]
        else:
            return None
    return value


class Event(Protocol):
    """What every member of the spec's `Event` union has (each has its own typed `data`; narrow with
    isinstance to read it)."""

    @property
    def seq(self) -> int: ...
    @property
    def type_(self) -> str: ...
    @property
    def workspace_id(self) -> None | Unset | UUID: ...
    @property
    def task_id(self) -> None | Unset | UUID: ...
    @property
    def session_id(self) -> None | Unset | UUID: ...


def replay() -> list[Event]:
    """Replays every event from the start, page by page (`after` = the last seq seen)."""
    out: list[Event] = []
    after = 0
    instance: UUID | None = None
    while True:
        page = expect(
            "list_events",
            list_events.sync_detailed(
                client=api, after=after, limit=200, instance_id=instance if instance else UNSET
            ),
            200,
            EventPage,
        )
        check(not page.truncated, f"the replay after {after} is truncated")
        instance = instance or page.instance_id
        eq(page.instance_id, instance, "instance_id across pages")
        if not page.events:
            check(page.latest_seq >= after, f"latest_seq {page.latest_seq} < after {after}")
            return out
        for e in page.events:
            check(e.seq > after, f"seq {e.seq} is not after {after}")
            after = e.seq
            out.append(e)


def reply_events(events: list[Event], session: UUID) -> list[tuple[int, str]]:
    """The seq and text of each reply of a session's agent, in order, from the `runtime.output` events."""
    out = []
    for e in events:
        # The union is discriminated by `type`: a runtime.output event's `data.event` is the agent's own.
        if not isinstance(e, RuntimeOutputEvent) or e.session_id != session:
            continue
        agent = e.data.event.additional_properties
        if field(agent, "type") == "message_end" and field(agent, "message", "role") == "assistant":
            out.append((e.seq, str(field(agent, "message", "content", 0, "text"))))
    return out


def replies(events: list[Event], session: UUID) -> list[str]:
    """The texts a session's agent replied with, in order."""
    return [text for _, text in reply_events(events, session)]


def wait_completion_capture(session: UUID) -> None:
    """Waits for berth's completion capture of the session's last turn (seed 004). It runs after the
    turn settles, so a refresh racing it may answer with it: the newest observation is current whatever
    its kind (I22). Once it is recorded, a refresh is the newest."""
    seen: list[str] = []

    def probe() -> bool | None:
        nonlocal seen
        events = replay()
        last_reply = max((seq for seq, _ in reply_events(events, session)), default=0)
        captures = [
            e
            for e in events
            if isinstance(e, GitStatusUpdatedEvent) and e.session_id == session and e.seq > last_reply
        ]
        seen = [f"{e.seq}:{e.data.kind}" for e in captures]
        return True if any(e.data.kind == "completion" for e in captures) else None

    until(f"the completion capture of session {session}'s last turn", probe, lambda: seen)


def wait_replies(session: UUID, n: int) -> list[str]:
    seen: list[str] = []

    def probe() -> list[str] | None:
        nonlocal seen
        seen = replies(replay(), session)
        return seen if len(seen) >= n else None

    return until(f"{n} agent replies of session {session}", probe, lambda: seen)


def fetch_session(sid: UUID) -> Session:
    return expect("get_session", get_session.sync_detailed(sid, client=api), 200, Session)


def wait_state(sid: UUID, *states: SessionState) -> Session:
    last: Session | None = None

    def probe() -> Session | None:
        nonlocal last
        last = fetch_session(sid)
        return last if last.state in states else None

    return until(f"session {sid} in {'|'.join(states)}", probe, lambda: last.state if last else None)


def git(*args: str) -> str:
    return subprocess.run(["git", "-C", REPO_PATH, *args], check=True, capture_output=True, text=True).stdout.strip()


def main() -> None:
    started = time.monotonic()
    suffix = f"{int(time.time() * 1000):x}-{os.getpid()}"
    branch = f"client-e2e/{CLIENT}-{suffix}"

    begin("agent profiles")
    profiles = expect(
        "list_agent_profiles",
        list_agent_profiles.sync_detailed(client=api),
        200,
        AgentProfileList,
    )
    check(any(p.name == "test" for p in profiles.items), f"no agent profile 'test': {profiles.items!r}")

    begin("workspace")
    ws_name = f"{CLIENT}-client-{suffix}"
    r = create_workspace.sync_detailed(client=api, body=CreateWorkspace(name=ws_name))
    ws = expect("create_workspace", r, 201, Workspace)
    eq(ws.name, ws_name, "workspace name")
    check(r.headers.get("location"), "create_workspace: no Location header")

    begin("repository")
    repo = expect(
        "register_repository",
        register_repository.sync_detailed(ws.id, client=api, body=RegisterRepository(path=REPO_PATH)),
        201,
        Repository,
    )
    eq(repo.path, REPO_PATH, "repository path")
    eq(repo.workspace_id, ws.id, "repository workspace_id")

    begin("task")
    task = expect(
        "create_task",
        create_task.sync_detailed(
            ws.id,
            client=api,
            body=CreateTask(
                title=f"E2E through the {CLIENT} client",
                repositories=[TaskRepositoryInput(repository_id=repo.id, branch=branch)],
            ),
        ),
        201,
        Task,
    )
    eq(task.workspace_id, ws.id, "task workspace_id")
    eq(len(task.repositories), 1, "task repositories")
    eq(task.kind, TaskKind.STANDARD, "task kind")
    check(not task.archived_at, "a new task is archived")

    begin("two sessions with the test agent")

    def new_session() -> Session:
        body = CreateSession(executor_type=ExecutorType.WORKTREE, agent_profile="test", prompt="pwd")
        return expect("create_session", create_session.sync_detailed(task.id, client=api, body=body), 201, Session)

    s1 = new_session()
    s2 = new_session()
    check(s1.id != s2.id, "both sessions have one id")
    for s in (s1, s2):
        eq(s.task_id, task.id, "session task_id")
        eq(s.agent_profile, "test", "session agent_profile")
        eq(s.desired_open, True, "session desired_open")
        check(isinstance(s.execution_id, UUID), f"session {s.id} has no execution_id: the agent did not start")
    workspace_path = s1.workspace_path
    check(isinstance(workspace_path, str) and workspace_path, "session 1 has no workspace_path")
    assert isinstance(workspace_path, str)
    eq(s2.workspace_path, workspace_path, "session 2 workspace_path (one shared worktree)")
    eq(s2.task_environment_id, s1.task_environment_id, "session 2 task_environment_id")
    check(os.path.isdir(workspace_path), f"the worktree {workspace_path} does not exist")
    check(
        os.path.realpath(workspace_path).startswith(WORKTREE_ROOT + "/"),
        f"the worktree {workspace_path} is outside BERTH_WORKTREE_ROOT {WORKTREE_ROOT}",
    )

    begin("environment")
    env_id = s1.task_environment_id
    check(isinstance(env_id, UUID), "session 1 has no task_environment_id")
    assert isinstance(env_id, UUID)
    environment = expect(
        "get_task_environment",
        get_task_environment.sync_detailed(task.id, client=api),
        200,
        Environment,
    )
    eq(environment.id, env_id, "environment id")
    eq(environment.status, EnvironmentStatus.READY, "environment status")
    eq(environment.executor_type, ExecutorType.WORKTREE, "environment executor_type")
    eq(environment.workspace_path, workspace_path, "environment workspace_path")
    eq(len(environment.repos), 1, "environment repos")
    eq(environment.repos[0].repository_id, repo.id, "environment repo repository_id")
    eq(environment.repos[0].worktree_branch, branch, "environment repo worktree_branch")

    begin("events replay: both agents run in the shared worktree")
    eq(wait_replies(s1.id, 1)[0], workspace_path, "session 1 agent's pwd")
    eq(wait_replies(s2.id, 1)[0], workspace_path, "session 2 agent's pwd")
    events = replay()
    of_task = [e.type_ for e in events if e.task_id == task.id]
    for t in ("task.created", "environment.created", "environment.ready", "session.created", "session.state_changed"):
        check(t in of_task, f"no {t} event for the task: {of_task}")
    check(any(e.type_ == "workspace.created" and e.workspace_id == ws.id for e in events), "no workspace.created event")

    begin("a message and its reply")
    wait_state(s1.id, SessionState.IDLE)
    text = f"hello from the {CLIENT} client"
    accepted = expect(
        "send_session_message",
        send_session_message.sync_detailed(s1.id, client=api, body=SendMessage(text=text)),
        202,
        Message,
    )
    eq(accepted.text, text, "send_session_message stored the text")
    eq(accepted.session_id, s1.id, "send_session_message's session")
    eq(wait_replies(s1.id, 2)[1], text, "session 1 agent's echo")

    begin("session delete")
    wait_state(s2.id, SessionState.IDLE)
    r = delete_session.sync_detailed(s2.id, client=api)
    eq(r.status_code, HTTPStatus.NO_CONTENT, f"delete_session status ({r.content!r})")
    gone = get_session.sync_detailed(s2.id, client=api)
    eq(gone.status_code, HTTPStatus.NOT_FOUND, "get_session after delete")
    check(isinstance(gone.parsed, Problem), f"the 404 body parsed as {type(gone.parsed).__name__}, not Problem")
    assert isinstance(gone.parsed, Problem)
    eq(gone.parsed.code, ErrorCode.NOT_FOUND, "problem code after delete")
    eq(gone.headers.get("content-type"), "application/problem+json", "error content type")
    check(os.path.isdir(workspace_path), f"deleting a session removed the worktree {workspace_path}")
    left = expect("list_task_sessions", list_task_sessions.sync_detailed(task.id, client=api), 200, SessionList)
    eq([s.id for s in left.items], [s1.id], "the task's sessions after delete")

    begin("git status refresh")
    wait_state(s1.id, SessionState.IDLE)
    expect(
        "send_session_message",
        send_session_message.sync_detailed(s1.id, client=api, body=SendMessage(text="write notes.txt work in progress")),
        202,
        Message,
    )
    eq(wait_replies(s1.id, 3)[2], "wrote notes.txt", "session 1 agent's write")
    wait_completion_capture(s1.id)

    def refresh() -> GitStatusList:
        return expect("refresh_environment_git_status", refresh_environment_git_status.sync_detailed(env_id, client=api), 200, GitStatusList)

    dirty = refresh()
    eq(len(dirty.items), 1, "git status items")
    st = dirty.items[0]
    eq(st.task_environment_id, env_id, "git status task_environment_id")
    eq(st.repository_id, repo.id, "git status repository_id")
    eq(st.branch, branch, "git status branch")
    eq(st.kind, "live", "git status kind")
    eq(st.head_commit, git("rev-parse", "HEAD"), "git status head_commit")
    notes = [f for f in st.files if f.path == "notes.txt"]
    check(notes, f"notes.txt is not in the git status: {st.files!r}")
    eq(notes[0].worktree_status, "untracked", "notes.txt worktree_status")
    via_session = expect("get_session_git_status", get_session_git_status.sync_detailed(s1.id, client=api), 200, GitStatusList)
    eq(via_session.items[0].task_environment_id, env_id, "session git status task_environment_id")
    # A clean worktree again, so that archive may remove it.
    os.remove(os.path.join(workspace_path, "notes.txt"))
    eq(refresh().items[0].files, [], "git status files after removing notes.txt")

    begin("archive")
    wait_state(s1.id, SessionState.IDLE)
    archived = expect("archive_task", archive_task.sync_detailed(task.id, client=api), 202, ArchiveResult)
    eq(archived.task.id, task.id, "archived task id")
    check(archived.task.archived_at, "the archived task has no archived_at")
    eq(len(archived.cleanup_jobs), 1, "archive cleanup jobs")
    job = archived.cleanup_jobs[0]
    eq(job.trigger, "archive", "cleanup job trigger")
    eq(job.task_id, task.id, "cleanup job task_id")
    eq(job.task_environment_id, env_id, "cleanup job task_environment_id")

    begin("cleanup job succeeded")
    last_job: CleanupJob = job

    def probe() -> CleanupJob | None:
        nonlocal last_job
        last_job = expect("get_cleanup_job", get_cleanup_job.sync_detailed(job.id, client=api), 200, CleanupJob)
        check(
            last_job.state not in (CleanupJobState.FAILED, CleanupJobState.CANCELLED),
            f"cleanup job {job.id} is {last_job.state}: {last_job.last_error}",
        )
        return last_job if last_job.state == CleanupJobState.SUCCEEDED else None

    done = until(f"cleanup job {job.id} to succeed", probe, lambda: last_job.to_dict())
    check(done.completed_at, "the succeeded job has no completed_at")
    check(not os.path.exists(workspace_path), f"the worktree {workspace_path} still exists after cleanup")
    check(workspace_path not in git("worktree", "list", "--porcelain"), "git still lists the removed worktree")
    eq(git("branch", "--list", branch).strip("* "), branch, "the task's branch is kept")
    s1_after = fetch_session(s1.id)
    eq(s1_after.state, SessionState.CANCELLED, "session 1 state after archive")
    eq(s1_after.desired_open, False, "session 1 desired_open after archive")
    succeeded = expect(
        "list_cleanup_jobs",
        list_cleanup_jobs.sync_detailed(client=api, task_id=task.id, state=CleanupJobState.SUCCEEDED),
        200,
        CleanupJobList,
    )
    check(any(j.id == job.id for j in succeeded.items), "the job is not listed as succeeded")
    tail = replay()
    check(any(e.type_ == "task.archived" and e.task_id == task.id for e in tail), "no task.archived event")
    check(
        any(
            isinstance(e, CleanupJobUpdatedEvent)
            and e.data.cleanup_job_id == job.id
            and e.data.state == CleanupJobState.SUCCEEDED
            for e in tail
        ),
        "no cleanup_job.updated event with state succeeded",
    )

    log(f"OK in {(time.monotonic() - started) * 1000:.0f} ms")


if __name__ == "__main__":
    try:
        main()
    except ScenarioError as e:
        print(f"[{CLIENT}] FAILED: {e}", file=sys.stderr)
        sys.exit(1)
