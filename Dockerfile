# berth: control plane for coding agents working in git worktrees.
#
#   docker build -t berth .                      # berth and git (target: runtime)
#   docker build --target agents -t berth-agents . # plus Node and the pinned Pi (what compose builds)
#   docker run --rm -p 127.0.0.1:8080:8080 -e BERTH_JWT_SECRET=... -v berth-data:/var/lib/berth berth
#
# See docker-compose.yml (and the README's "docker compose" section) for PostgreSQL and agents.

# ---------------------------------------------------------------------------
# Build stage
# ---------------------------------------------------------------------------
FROM rust:1.95-slim-bookworm AS builder

# rust:*-slim ships gcc and libc6-dev, which is all the C code (ring, bundled
# SQLite) needs; TLS is rustls, so no OpenSSL/pkg-config.
WORKDIR /build

# 1. Dependency layer: manifests + lockfile with stub sources, so that the
#    (slow) dependency build is cached until Cargo.toml/Cargo.lock change.
COPY Cargo.toml Cargo.lock ./
COPY migration/Cargo.toml migration/Cargo.toml
# Every target the manifest declares must exist, even those not built here (the test agent, the bench).
RUN mkdir -p src/bin migration/src benches/suite \
 && echo 'fn main() {}' > src/main.rs \
 && echo 'fn main() {}' > src/bin/berth-test-agent.rs \
 && echo 'fn main() {}' > benches/suite/main.rs \
 && touch src/lib.rs migration/src/lib.rs \
 && cargo build --release --locked --bin berth \
 && rm -rf src migration/src benches

# 2. Real sources. COPY keeps the context's mtimes, which may be older than
#    the stub build; touch them so cargo rebuilds berth and migration. The
#    context has no .git: the commit GET /version reports comes from the
#    BERTH_GIT_COMMIT build argument (compose passes it; "unknown" without).
ARG BERTH_GIT_COMMIT=
ENV BERTH_GIT_COMMIT=${BERTH_GIT_COMMIT}
COPY build.rs ./
COPY src ./src
COPY migration/src ./migration/src
COPY benches ./benches
RUN find build.rs src migration/src benches -type f -exec touch {} + \
 && cargo build --release --locked --bin berth \
 && cp target/release/berth /berth

# ---------------------------------------------------------------------------
# runtime: berth and git, nothing else (the default target's base)
# ---------------------------------------------------------------------------
FROM debian:bookworm-slim AS runtime

# berth shells out to the git CLI for worktree mutations, and builds every agent's box with bubblewrap.
RUN apt-get update \
 && apt-get install -y --no-install-recommends git ca-certificates bubblewrap libcap2-bin \
 && rm -rf /var/lib/apt/lists/*

# The image runs as whatever uid compose gives it (`user: "${UID}:${GID}"`: the host user's, so the
# repositories and worktrees it writes stay that user's). berth's own uid is only the default.
RUN groupadd --system --gid 10001 berth \
 && useradd --system --uid 10001 --gid berth \
      --home-dir /var/lib/berth --no-create-home --shell /usr/sbin/nologin berth \
 && mkdir -p /var/lib/berth /etc/berth \
 && chown berth:berth /var/lib/berth

COPY --from=builder /berth /usr/local/bin/berth
# berth runs as the host user's uid, and makes each agent box's network namespace itself: that needs
# CAP_SYS_ADMIN (compose adds it to the container's bounding set; README "What an agent can reach").
RUN setcap cap_sys_admin+ep /usr/local/bin/berth

ENV BERTH_DATA_DIR=/var/lib/berth \
    BERTH_BIND=0.0.0.0:8080 \
    BERTH_LOG_FORMAT=json \
    HOME=/var/lib/berth

WORKDIR /var/lib/berth
USER 10001:10001

EXPOSE 8080

# `berth healthcheck` exits 0 when GET /readyz answers 200 on the configured bind address.
HEALTHCHECK --interval=10s --timeout=5s --start-period=20s --retries=3 CMD ["berth", "healthcheck"]

ENTRYPOINT ["berth"]
CMD ["serve"]

# ---------------------------------------------------------------------------
# agents: runtime plus Node and the pinned Pi coding agent (what docker-compose.yml builds)
# ---------------------------------------------------------------------------
# Pi needs Node 20 or newer; Debian bookworm ships 18, so this stage starts from Node's own bookworm image
# (the same Debian release and glibc the berth binary was built against).
FROM node:22-bookworm-slim AS agents

RUN apt-get update \
 && apt-get install -y --no-install-recommends git ca-certificates bubblewrap libcap2-bin \
 && rm -rf /var/lib/apt/lists/*

# The Pi the integration tests run (tests/pi pins it and locks its whole dependency tree): `npm ci`
# installs exactly that tree, never a newer one.
ARG PI_VERSION=0.73.1
WORKDIR /opt/pi
COPY tests/pi/package.json tests/pi/package-lock.json ./
RUN grep -q "\"@mariozechner/pi-coding-agent\": \"${PI_VERSION}\"" package.json \
 && npm ci --omit=dev --no-audit --no-fund \
 && ln -s /opt/pi/node_modules/.bin/pi /usr/local/bin/pi \
 && pi --version

RUN groupadd --system --gid 10001 berth \
 && useradd --system --uid 10001 --gid berth \
      --home-dir /var/lib/berth --no-create-home --shell /usr/sbin/nologin berth \
 && mkdir -p /var/lib/berth /etc/berth \
 && chown berth:berth /var/lib/berth

COPY --from=builder /berth /usr/local/bin/berth
# berth runs as the host user's uid, and makes each agent box's network namespace itself: that needs
# CAP_SYS_ADMIN (compose adds it to the container's bounding set; README "What an agent can reach").
RUN setcap cap_sys_admin+ep /usr/local/bin/berth

# HOME is the data directory: Pi keeps its settings under ~/.pi unless PI_CODING_AGENT_DIR says otherwise.
ENV BERTH_DATA_DIR=/var/lib/berth \
    BERTH_BIND=0.0.0.0:8080 \
    BERTH_LOG_FORMAT=json \
    HOME=/var/lib/berth

WORKDIR /var/lib/berth
USER 10001:10001

EXPOSE 8080

HEALTHCHECK --interval=10s --timeout=5s --start-period=20s --retries=3 CMD ["berth", "healthcheck"]

ENTRYPOINT ["berth"]
CMD ["serve"]

# ---------------------------------------------------------------------------
# The default target (`docker build .`): berth and git only.
# ---------------------------------------------------------------------------
FROM runtime
