# berth: control plane for coding agents working in git worktrees.
#
#   docker build -t berth .
#   docker run --rm -p 127.0.0.1:8080:8080 -e BERTH_JWT_SECRET=... -v berth-data:/var/lib/berth berth
#
# See docker-compose.yml for a Postgres-backed setup.

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
#    the stub build; touch them so cargo rebuilds berth and migration.
COPY src ./src
COPY migration/src ./migration/src
COPY benches ./benches
RUN find src migration/src benches -type f -exec touch {} + \
 && cargo build --release --locked --bin berth \
 && cp target/release/berth /berth

# ---------------------------------------------------------------------------
# Runtime stage
# ---------------------------------------------------------------------------
FROM debian:bookworm-slim

# berth shells out to the git CLI for worktree mutations.
RUN apt-get update \
 && apt-get install -y --no-install-recommends git ca-certificates \
 && rm -rf /var/lib/apt/lists/*

RUN groupadd --system --gid 10001 berth \
 && useradd --system --uid 10001 --gid berth \
      --home-dir /var/lib/berth --no-create-home --shell /usr/sbin/nologin berth \
 && mkdir -p /var/lib/berth \
 && chown berth:berth /var/lib/berth

COPY --from=builder /berth /usr/local/bin/berth

ENV BERTH_DATA_DIR=/var/lib/berth \
    BERTH_BIND=0.0.0.0:8080 \
    BERTH_LOG_FORMAT=json

# Declared after the chown so a fresh named volume is seeded with berth's ownership.
VOLUME ["/var/lib/berth"]
WORKDIR /var/lib/berth
USER berth:berth

EXPOSE 8080

# No HEALTHCHECK: the image deliberately has no curl/wget. Probe GET /healthz
# (liveness) and GET /readyz (readiness, unauthenticated) from the orchestrator.

ENTRYPOINT ["berth"]
CMD ["serve"]
