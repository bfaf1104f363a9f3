// One end-to-end scenario through a client generated with openapi-typescript + openapi-fetch from the
// committed openapi/openapi.json (run by .ci/clients, which starts the server and generates the types).
//
// Environment: BERTH_URL (http://host:port), BERTH_TOKEN (an admin token), BERTH_CI_REPO (the canonical
// path of a git repository with one commit, inside BERTH_REPO_ROOTS), BERTH_WORKTREE_ROOT (where berth
// creates worktrees). The server has an agent profile `test` running berth-test-agent.
//
// workspace -> repository -> task -> two sessions with the test agent (one shared worktree) -> events
// replay -> a message and its reply -> session delete (the worktree stays) -> git status refresh ->
// archive -> its cleanup job reaches `succeeded` and the worktree is gone, the branch kept.
import { execFileSync } from "node:child_process";
import { existsSync, realpathSync, rmSync } from "node:fs";
import { join } from "node:path";
import createClient from "openapi-fetch";
import type { components, paths } from "./generated/berth";

type Schemas = components["schemas"];
type Event = Schemas["Event"];
type Session = Schemas["Session"];

const CLIENT = "typescript";
const WAIT_MS = 60_000;
const POLL_MS = 50;

function env(name: string): string {
  const v = process.env[name];
  if (!v) throw new Error(`${name} is not set`);
  return v;
}

const baseUrl = env("BERTH_URL");
const token = env("BERTH_TOKEN");
const repoPath = env("BERTH_CI_REPO");
const worktreeRoot = realpathSync(env("BERTH_WORKTREE_ROOT"));

const api = createClient<paths>({ baseUrl, headers: { Authorization: `Bearer ${token}` } });

let step = "start";
function log(msg: string): void {
  console.log(`[${CLIENT}] ${msg}`);
}
function begin(name: string): void {
  step = name;
  log(name);
}

class ScenarioError extends Error {}
function check(cond: unknown, msg: string): asserts cond {
  if (!cond) throw new ScenarioError(`${step}: ${msg}`);
}
function eq<T>(actual: T, expected: T, what: string): void {
  check(actual === expected, `${what}: expected ${JSON.stringify(expected)}, got ${JSON.stringify(actual)}`);
}

// What every openapi-fetch call returns: the typed success body or the typed problem+json body.
type Outcome<T> = { data?: T; error?: Schemas["Problem"] | unknown; response: Response };

/** The call answered `status`; returns its typed body. */
function expectStatus<T>(what: string, r: Outcome<T>, status: number): T {
  if (r.response.status !== status) {
    throw new ScenarioError(
      `${step}: ${what} answered ${r.response.status} (expected ${status}): ${JSON.stringify(r.error ?? r.data)}`,
    );
  }
  check(r.response.headers.get("x-request-id"), `${what}: no X-Request-Id header`);
  return r.data as T;
}

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/** Polls `probe` until it returns a value, or fails after the deadline with `what` and the last state. */
async function until<T>(what: string, probe: () => Promise<T | undefined>, last: () => unknown = () => ""): Promise<T> {
  const deadline = Date.now() + WAIT_MS;
  for (;;) {
    const v = await probe();
    if (v !== undefined) return v;
    if (Date.now() > deadline) {
      throw new ScenarioError(`${step}: timed out after ${WAIT_MS} ms waiting for ${what}; last seen: ${JSON.stringify(last())}`);
    }
    await sleep(POLL_MS);
  }
}

/** A field of a JSON value another party wrote (the agent's own events, under `runtime.output`). */
function field(v: unknown, ...path: (string | number)[]): unknown {
  let cur = v;
  for (const k of path) {
    if (cur === null || typeof cur !== "object") return undefined;
    cur = (cur as Record<string | number, unknown>)[k];
  }
  return cur;
}

/** Replays every event from the start, page by page (`after` = the last seq seen). */
async function replay(): Promise<Event[]> {
  const out: Event[] = [];
  let after = 0;
  let instance: string | undefined;
  for (;;) {
    const query = { after, limit: 200, ...(instance === undefined ? {} : { instance_id: instance }) };
    const page = expectStatus("listEvents", await api.GET("/api/v1/events", { params: { query } }), 200);
    check(!page.truncated, `the replay after ${after} is truncated`);
    instance ??= page.instance_id;
    eq(page.instance_id, instance, "instance_id across pages");
    if (page.events.length === 0) {
      check(page.latest_seq >= after, `latest_seq ${page.latest_seq} < after ${after}`);
      return out;
    }
    for (const e of page.events) {
      check(e.seq > after, `seq ${e.seq} is not after ${after}`);
      after = e.seq;
      out.push(e);
    }
  }
}

/** The texts a session's agent replied with, in order, from the `runtime.output` events. */
/** The seq and text of each reply of a session's agent, in order, from the `runtime.output` events. */
function replyEvents(events: Event[], session: string): [number, string][] {
  const out: [number, string][] = [];
  for (const e of events) {
    // `type` discriminates the union: here `e.data` is typed as a `runtime.output` event's data.
    if (e.type !== "runtime.output" || e.session_id !== session) continue;
    const agent = e.data.event;
    if (field(agent, "type") === "message_end" && field(agent, "message", "role") === "assistant") {
      out.push([e.seq, String(field(agent, "message", "content", 0, "text"))]);
    }
  }
  return out;
}

function replies(events: Event[], session: string): string[] {
  return replyEvents(events, session).map(([, text]) => text);
}

/**
 * Waits for berth's completion capture of the session's last turn (seed 004). It runs after the turn
 * settles, so a refresh racing it may answer with it: the newest observation is current whatever its
 * kind (I22). Once it is recorded, a refresh is the newest.
 */
async function waitCompletionCapture(session: string): Promise<void> {
  let seen: string[] = [];
  await until(
    `the completion capture of session ${session}'s last turn`,
    async () => {
      const events = await replay();
      const lastReply = Math.max(0, ...replyEvents(events, session).map(([seq]) => seq));
      const captures = events.filter(
        (e) => e.type === "git_status.updated" && e.session_id === session && e.seq > lastReply,
      );
      seen = captures.map((e) => `${e.seq}:${e.type === "git_status.updated" ? e.data.kind : ""}`);
      return captures.some((e) => e.type === "git_status.updated" && e.data.kind === "completion") ? true : undefined;
    },
    () => seen,
  );
}

async function waitReplies(session: string, n: number): Promise<string[]> {
  let seen: string[] = [];
  return until(
    `${n} agent replies of session ${session}`,
    async () => {
      seen = replies(await replay(), session);
      return seen.length >= n ? seen : undefined;
    },
    () => seen,
  );
}

async function getSession(id: string): Promise<Session> {
  return expectStatus("getSession", await api.GET("/api/v1/sessions/{id}", { params: { path: { id } } }), 200);
}

async function waitState(id: string, states: Session["state"][]): Promise<Session> {
  let s: Session | undefined;
  return until(
    `session ${id} in ${states.join("|")}`,
    async () => {
      s = await getSession(id);
      return states.includes(s.state) ? s : undefined;
    },
    () => s?.state,
  );
}

function git(...args: string[]): string {
  return execFileSync("git", ["-C", repoPath, ...args], { encoding: "utf8" }).trim();
}

async function main(): Promise<void> {
  const started = Date.now();
  const suffix = `${Date.now().toString(36)}-${process.pid}`;
  const branch = `client-e2e/${CLIENT}-${suffix}`;

  begin("agent profiles");
  const profiles = expectStatus("listAgentProfiles", await api.GET("/api/v1/agent-profiles"), 200);
  check(
    profiles.items.some((p) => p.name === "test"),
    `no agent profile "test": ${JSON.stringify(profiles.items)}`,
  );

  begin("workspace");
  const wsName = `${CLIENT}-client-${suffix}`;
  const wsRes = await api.POST("/api/v1/workspaces", { body: { name: wsName } });
  const ws = expectStatus("create_workspace", wsRes, 201);
  eq(ws.name, wsName, "workspace name");
  check(wsRes.response.headers.get("location"), "create_workspace: no Location header");

  begin("repository");
  const repo = expectStatus(
    "registerRepository",
    await api.POST("/api/v1/workspaces/{id}/repositories", {
      params: { path: { id: ws.id } },
      body: { path: repoPath },
    }),
    201,
  );
  eq(repo.path, repoPath, "repository path");
  eq(repo.workspace_id, ws.id, "repository workspace_id");

  begin("task");
  const task = expectStatus(
    "createTask",
    await api.POST("/api/v1/workspaces/{id}/tasks", {
      params: { path: { id: ws.id } },
      body: {
        title: `E2E through the ${CLIENT} client`,
        repositories: [{ repository_id: repo.id, branch }],
      },
    }),
    201,
  );
  eq(task.workspace_id, ws.id, "task workspace_id");
  eq(task.repositories.length, 1, "task repositories");
  eq(task.kind, "standard", "task kind");
  check(!task.archived_at, "a new task is archived");

  begin("two sessions with the test agent");
  const createSession = async () =>
    expectStatus(
      "createSession",
      await api.POST("/api/v1/tasks/{id}/sessions", {
        params: { path: { id: task.id } },
        body: { executor_type: "worktree", agent_profile: "test", prompt: "pwd" },
      }),
      201,
    );
  const s1 = await createSession();
  const s2 = await createSession();
  check(s1.id !== s2.id, "both sessions have one id");
  for (const s of [s1, s2]) {
    eq(s.task_id, task.id, "session task_id");
    eq(s.agent_profile, "test", "session agent_profile");
    eq(s.desired_open, true, "session desired_open");
    check(s.execution_id, `session ${s.id} has no execution_id: the agent did not start`);
  }
  const workspacePath = s1.workspace_path;
  check(workspacePath, "session 1 has no workspace_path");
  eq(s2.workspace_path, workspacePath, "session 2 workspace_path (one shared worktree)");
  eq(s2.task_environment_id, s1.task_environment_id, "session 2 task_environment_id");
  check(existsSync(workspacePath), `the worktree ${workspacePath} does not exist`);
  check(
    realpathSync(workspacePath).startsWith(worktreeRoot + "/"),
    `the worktree ${workspacePath} is outside BERTH_WORKTREE_ROOT ${worktreeRoot}`,
  );

  begin("environment");
  const envId = s1.task_environment_id;
  check(envId, "session 1 has no task_environment_id");
  const environment = expectStatus(
    "getTaskEnvironment",
    await api.GET("/api/v1/tasks/{id}/environment", { params: { path: { id: task.id } } }),
    200,
  );
  eq(environment.id, envId, "environment id");
  eq(environment.status, "ready", "environment status");
  eq(environment.executor_type, "worktree", "environment executor_type");
  eq(environment.workspace_path, workspacePath, "environment workspace_path");
  eq(environment.repos.length, 1, "environment repos");
  eq(environment.repos[0]?.repository_id, repo.id, "environment repo repository_id");
  eq(environment.repos[0]?.worktree_branch, branch, "environment repo worktree_branch");

  begin("events replay: both agents run in the shared worktree");
  eq((await waitReplies(s1.id, 1))[0], workspacePath, "session 1 agent's pwd");
  eq((await waitReplies(s2.id, 1))[0], workspacePath, "session 2 agent's pwd");
  const events = await replay();
  const ofTask = events.filter((e) => e.task_id === task.id).map((e) => e.type);
  const expected: Event["type"][] = [
    "task.created",
    "environment.created",
    "environment.ready",
    "session.created",
    "session.state_changed",
  ];
  for (const t of expected) {
    check(ofTask.includes(t), `no ${t} event for the task: ${JSON.stringify(ofTask)}`);
  }
  check(
    events.some((e) => e.type === "workspace.created" && e.workspace_id === ws.id),
    "no workspace.created event",
  );

  begin("a message and its reply");
  await waitState(s1.id, ["idle"]);
  const text = `hello from the ${CLIENT} client`;
  const accepted = expectStatus(
    "sendSessionMessage",
    await api.POST("/api/v1/sessions/{id}/messages", { params: { path: { id: s1.id } }, body: { text } }),
    202,
  );
  eq(accepted.text, text, "send_message stored the text");
  eq(accepted.session_id, s1.id, "send_message's session");
  eq((await waitReplies(s1.id, 2))[1], text, "session 1 agent's echo");

  begin("session delete");
  await waitState(s2.id, ["idle"]);
  const del = await api.DELETE("/api/v1/sessions/{id}", { params: { path: { id: s2.id } } });
  expectStatus("delete_session", del, 204);
  const gone = await api.GET("/api/v1/sessions/{id}", { params: { path: { id: s2.id } } });
  eq(gone.response.status, 404, "get_session after delete");
  eq(gone.error?.code, "not_found", "problem code after delete");
  eq(gone.response.headers.get("content-type"), "application/problem+json", "error content type");
  check(existsSync(workspacePath), `deleting a session removed the worktree ${workspacePath}`);
  const left = expectStatus(
    "listTaskSessions",
    await api.GET("/api/v1/tasks/{id}/sessions", { params: { path: { id: task.id } } }),
    200,
  );
  eq(JSON.stringify(left.items.map((s) => s.id)), JSON.stringify([s1.id]), "the task's sessions after delete");

  begin("git status refresh");
  await waitState(s1.id, ["idle"]);
  expectStatus(
    "sendSessionMessage",
    await api.POST("/api/v1/sessions/{id}/messages", {
      params: { path: { id: s1.id } },
      body: { text: "write notes.txt work in progress" },
    }),
    202,
  );
  eq((await waitReplies(s1.id, 3))[2], "wrote notes.txt", "session 1 agent's write");
  await waitCompletionCapture(s1.id);
  const refresh = async () =>
    expectStatus(
      "refreshEnvironmentGitStatus",
      await api.POST("/api/v1/environments/{id}/git-status/refresh", { params: { path: { id: envId } } }),
      200,
    );
  const dirty = await refresh();
  eq(dirty.items.length, 1, "git status items");
  const st = dirty.items[0]!;
  eq(st.task_environment_id, envId, "git status task_environment_id");
  eq(st.repository_id, repo.id, "git status repository_id");
  eq(st.branch, branch, "git status branch");
  eq(st.kind, "live", "git status kind");
  eq(st.head_commit, git("rev-parse", "HEAD"), "git status head_commit");
  const notes = st.files.find((f) => f.path === "notes.txt");
  check(notes, `notes.txt is not in the git status: ${JSON.stringify(st.files)}`);
  eq(notes.worktree_status, "untracked", "notes.txt worktree_status");
  const viaSession = expectStatus(
    "getSessionGitStatus",
    await api.GET("/api/v1/sessions/{id}/git-status", { params: { path: { id: s1.id } } }),
    200,
  );
  eq(viaSession.items[0]?.task_environment_id, envId, "session git status task_environment_id");
  // A clean worktree again, so that archive may remove it.
  rmSync(join(workspacePath, "notes.txt"));
  const clean = await refresh();
  eq(JSON.stringify(clean.items[0]?.files), "[]", "git status files after removing notes.txt");

  begin("archive");
  await waitState(s1.id, ["idle"]);
  const archived = expectStatus(
    "archiveTask",
    await api.POST("/api/v1/tasks/{id}/archive", { params: { path: { id: task.id } } }),
    202,
  );
  eq(archived.task.id, task.id, "archived task id");
  check(archived.task.archived_at, "the archived task has no archived_at");
  eq(archived.cleanup_jobs.length, 1, "archive cleanup jobs");
  const job = archived.cleanup_jobs[0]!;
  eq(job.trigger, "archive", "cleanup job trigger");
  eq(job.task_id, task.id, "cleanup job task_id");
  eq(job.task_environment_id, envId, "cleanup job task_environment_id");

  begin("cleanup job succeeded");
  let lastJob: Schemas["CleanupJob"] = job;
  const done = await until(
    `cleanup job ${job.id} to succeed`,
    async () => {
      lastJob = expectStatus(
        "getCleanupJob",
        await api.GET("/api/v1/cleanup-jobs/{id}", { params: { path: { id: job.id } } }),
        200,
      );
      check(
        !["failed", "cancelled"].includes(lastJob.state),
        `cleanup job ${job.id} is ${lastJob.state}: ${lastJob.last_error}`,
      );
      return lastJob.state === "succeeded" ? lastJob : undefined;
    },
    () => lastJob,
  );
  check(done.completed_at, "the succeeded job has no completed_at");
  check(!existsSync(workspacePath), `the worktree ${workspacePath} still exists after cleanup`);
  check(!git("worktree", "list", "--porcelain").includes(workspacePath), "git still lists the removed worktree");
  eq(git("branch", "--list", branch), branch, "the task's branch is kept");
  const s1After = await getSession(s1.id);
  eq(s1After.state, "cancelled", "session 1 state after archive");
  eq(s1After.desired_open, false, "session 1 desired_open after archive");
  const succeeded = expectStatus(
    "listCleanupJobs",
    await api.GET("/api/v1/cleanup-jobs", { params: { query: { task_id: task.id, state: "succeeded" } } }),
    200,
  );
  check(succeeded.items.some((j) => j.id === job.id), "the job is not listed as succeeded");
  const tail = await replay();
  check(
    tail.some((e) => e.type === "task.archived" && e.task_id === task.id),
    "no task.archived event",
  );
  check(
    tail.some((e) => e.type === "cleanup_job.updated" && e.data.cleanup_job_id === job.id && e.data.state === "succeeded"),
    "no cleanup_job.updated event with state succeeded",
  );

  log(`OK in ${Date.now() - started} ms`);
}

main().catch((e: unknown) => {
  console.error(`[${CLIENT}] FAILED: ${e instanceof ScenarioError ? e.message : e instanceof Error ? e.stack : String(e)}`);
  process.exit(1);
});
