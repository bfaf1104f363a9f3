"""Static checks of the deployment files, for a CI machine where no container engine can run containers
(.ci/deploy-check says so and runs this instead of building the image).

- deploy/compose.fleet.yml (two berth nodes, each with a disk of its own, on one PostgreSQL) passes the
  same schema and rules per berth service, with its node id and advertised URL.
- docker-compose.yml is valid against the Compose Specification's JSON schema, and the berth service runs
  agents the way the README promises: the image's `agents` target, the host user's uid/gid, `init`, a stop
  grace period above berth's shutdown budget, `berth healthcheck`, secrets through `*_FILE` variables from
  compose secrets, repositories and worktrees bind-mounted at the same absolute path inside and out, and the
  mounted berth.toml.
- The Dockerfile has the stages compose and the default build name; the `agents` stage pins the Pi that the
  integration tests pin (tests/pi/package.json); every file a stage copies from the build context exists and
  is not excluded by .dockerignore.
- deploy/berth.toml has a `pi` agent profile speaking the Pi protocol that passes model credentials from the
  environment instead of holding them.

Usage: check.py <compose_spec.json>
"""
import fnmatch
import json
import re
import sys
import tomllib
from pathlib import Path

import jsonschema
import yaml

ROOT = Path(__file__).resolve().parents[2]
failures = []


def check(ok, message):
    if not ok:
        failures.append(message)


def compose(schema_path, name="docker-compose.yml", nodes=("",)):
    """One compose file: its schema, and the rules for each berth service in it (`berth` + suffix per node:
    docker-compose.yml has one; deploy/compose.fleet.yml has berth-a and berth-b, each with a disk of its
    own: its data directory, repositories and worktree root, none shared with the other)."""
    doc = yaml.safe_load((ROOT / name).read_text())
    schema = json.loads(Path(schema_path).read_text())
    validator = jsonschema.Draft201909Validator(schema)
    for error in validator.iter_errors(doc):
        failures.append(f"{name}: {'/'.join(map(str, error.path))}: {error.message}")
    data_dirs = set()
    for node in nodes:
        service = f"berth{'-' + node.lower() if node else ''}"
        berth = doc["services"][service]
        suffix = f"_{node}" if node else ""
        where = f"{name} {service}"
        if node == "" or "build" in berth:
            check(berth.get("build", {}).get("target") == "agents", f"{where} builds the image's `agents` target")
        check(berth.get("user") and re.fullmatch(r"\$\{UID[^}]*\}:\$\{GID[^}]*\}", berth["user"]),
              f"{where} runs as ${{UID}}:${{GID}}")
        check(berth.get("init") is True, f"{where}: init: true")
        check("SYS_ADMIN" in berth.get("cap_add", []), f"{where}: cap_add SYS_ADMIN (berth makes each box's network)")
        opts = set(berth.get("security_opt", []))
        check({"seccomp=unconfined", "apparmor=unconfined"} <= opts,
              f"{where}: security_opt lets bubblewrap make the box's namespaces")
        grace = re.fullmatch(r"(\d+)s", str(berth.get("stop_grace_period", "")))
        budget = int(env_budget(berth.get("environment", {})))
        check(grace and int(grace.group(1)) > budget,
              f"{where}: stop_grace_period above berth's shutdown budget (BERTH_SHUTDOWN_SECS, {budget} s)")
        test = berth.get("healthcheck", {}).get("test", [])
        check(test[:3] == ["CMD", "berth", "healthcheck"], f"{where}: the healthcheck runs `berth healthcheck`")
        env = berth.get("environment", {})
        secrets = set(berth.get("secrets", []))
        for var, secret in [("BERTH_DATABASE_URL_FILE", "database_url"), ("BERTH_JWT_SECRET_FILE", "jwt_secret")]:
            check(env.get(var) == f"/run/secrets/{secret}" and secret in secrets,
                  f"{where}: {var} from the compose secret {secret}")
            check(doc.get("secrets", {}).get(secret, {}).get("file"), f"{name}: the secret {secret} is a file")
        for var in ["BERTH_JWT_SECRET", "BERTH_DATABASE_URL"]:
            check(var not in env, f"{where}: {var} is not set in plain text (use {var}_FILE)")
        check(env.get("BERTH_CONFIG") == "/etc/berth/berth.toml", f"{where}: BERTH_CONFIG names the mounted file")
        volumes = berth.get("volumes", [])
        check("./deploy/berth.toml:/etc/berth/berth.toml:ro" in volumes, f"{where}: deploy/berth.toml is mounted read-only")
        for var, setting in [("BERTH_REPOS_DIR", "BERTH_REPO_ROOTS"), ("BERTH_WORKTREES_DIR", "BERTH_WORKTREE_ROOT")]:
            same = f"${{{var}{suffix}}}:${{{var}{suffix}}}"
            check(same in volumes, f"{where}: {var}{suffix} is bind-mounted at the same path inside and out ({same})")
            check(str(env.get(setting, "")).startswith(f"${{{var}{suffix}"), f"{where}: {setting} is {var}{suffix}")
        data = [v for v in volumes if str(v).endswith(":/var/lib/berth")]
        check(len(data) == 1, f"{where}: one data directory at /var/lib/berth")
        data_dirs.update(data)
        if node:
            check(env.get("BERTH_NODE_ID") == f"node-{node.lower()}", f"{where}: BERTH_NODE_ID is node-{node.lower()}")
            check(env.get("BERTH_ADVERTISE_URL") == f"http://{service}:8080",
                  f"{where}: BERTH_ADVERTISE_URL is where the other node reaches it (http://{service}:8080)")
    check(len(data_dirs) == len(nodes), f"{name}: every node has a data directory of its own")
    pg = doc["services"]["postgres"]
    check(pg.get("environment", {}).get("POSTGRES_PASSWORD_FILE"), f"{name}: PostgreSQL's password from a file")


def env_budget(env):
    """BERTH_SHUTDOWN_SECS as the compose file sets it, else its default in the one table of settings."""
    if "BERTH_SHUTDOWN_SECS" in env:
        return env["BERTH_SHUTDOWN_SECS"]
    table = (ROOT / "src/config/settings.rs").read_text()
    default = re.search(r'"shutdown_secs",\s*Is\("(\d+)"\)', table)
    check(default, "src/config/settings.rs defines shutdown_secs with a default")
    return default.group(1) if default else 0


def dockerignored(path):
    rules = [l.strip() for l in (ROOT / ".dockerignore").read_text().splitlines() if l.strip() and not l.startswith("#")]
    ignored = False
    for rule in rules:
        negate = rule.startswith("!")
        pattern = rule[1:] if negate else rule
        pattern = pattern.lstrip("/").removeprefix("**/")
        parts = Path(path).parts
        hit = any(fnmatch.fnmatch("/".join(parts[: i + 1]), pattern) for i in range(len(parts)))
        if hit:
            ignored = not negate
    return ignored


def dockerfile():
    text = (ROOT / "Dockerfile").read_text()
    stages = re.findall(r"^FROM\s+\S+(?:\s+AS\s+(\S+))?", text, re.M)
    check("runtime" in stages and "agents" in stages and "builder" in stages, f"stages builder, runtime, agents: {stages}")
    check(re.search(r"^FROM runtime\s*$", text, re.M), "the default target is the runtime stage")
    check(text.count("bubblewrap") >= 2, "the runtime and agents stages install bubblewrap (every agent's box)")
    check(text.count("setcap cap_sys_admin+ep /usr/local/bin/berth") >= 2,
          "berth's binary may make the boxes' network namespaces (setcap) in both stages")
    pinned = json.loads((ROOT / "tests/pi/package.json").read_text())["dependencies"]["@mariozechner/pi-coding-agent"]
    arg = re.search(r"^ARG PI_VERSION=(\S+)", text, re.M)
    check(arg and arg.group(1) == pinned, f"the agents stage pins Pi {pinned}, as tests/pi does")
    for line in re.findall(r"^COPY\s+(?!--from)(.+)$", text, re.M):
        sources = line.split()[:-1]
        for src in sources:
            check((ROOT / src).exists(), f"COPY source {src} exists")
            check(not dockerignored(src), f"COPY source {src} is not excluded by .dockerignore")


def berth_toml():
    config = tomllib.loads((ROOT / "deploy/berth.toml").read_text())
    pi = config.get("agents", {}).get("pi")
    check(pi is not None, "deploy/berth.toml has a pi profile")
    if pi:
        check(pi.get("command") == "pi" and pi.get("protocol") == "pi", "the pi profile runs pi with the Pi protocol")
        check("--mode" in pi.get("args", []) and "rpc" in pi.get("args", []), "the pi profile uses Pi's RPC mode")
        check("ANTHROPIC_API_KEY" in pi.get("pass_env", []), "model credentials are passed from the environment")
        check(not any("KEY" in k for k in pi.get("env", {})), "no credential is written into the file")


compose(sys.argv[1])
compose(sys.argv[1], "deploy/compose.fleet.yml", ("A", "B"))
dockerfile()
berth_toml()
if failures:
    print("deployment checks failed:", *failures, sep="\n  ")
    sys.exit(1)
print("deployment checks passed: compose schema and rules, Dockerfile stages and sources, deploy/berth.toml")
