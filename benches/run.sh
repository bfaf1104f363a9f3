#!/usr/bin/env bash
# The benchmark suite (issue 9; BENCHMARKS.md): builds in release mode, then measures berth against the
# bare work it wraps on SQLite and, when PostgreSQL answers, on PostgreSQL. Results go to stdout and to
# target/bench-results.md. Benchmarks are not tests: CI only builds them (`cargo bench --no-run`).
set -euo pipefail
cd "$(dirname "$0")/.."

# wrk drives the HTTP load (Debian's package; nothing is vendored).
if ! command -v wrk >/dev/null 2>&1; then
  DEBIAN_FRONTEND=noninteractive apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wrk
fi

PG_URL="${BERTH_BENCH_POSTGRES_URL:-postgres://postgres@127.0.0.1:5432/postgres}"
if psql "$PG_URL" -Atqc 'SELECT 1' >/dev/null 2>&1; then
  export BERTH_BENCH_POSTGRES_URL="$PG_URL"
else
  echo "PostgreSQL is not reachable at $PG_URL: SQLite only" >&2
  unset BERTH_BENCH_POSTGRES_URL
fi

# Machine description for the results file.
{
  echo "machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), $(uname -srm)"
  echo "cpu: $(awk -F: '/model name/ {print $2; exit}' /proc/cpuinfo | sed 's/^ *//')"
  echo "rustc: $(rustc --version); wrk: $(wrk -v 2>&1 | head -n1)"
  echo "date: $(date -u +%Y-%m-%dT%H:%MZ)"
} | tee /dev/stderr > /tmp/berth-bench-machine.txt

cargo bench --locked --bench suite "$@"
target_dir="${CARGO_TARGET_DIR:-target}"
{ cat /tmp/berth-bench-machine.txt; echo; cat "$target_dir/bench-results.md"; } > "$target_dir/bench-results.tmp" \
  && mv "$target_dir/bench-results.tmp" "$target_dir/bench-results.md"
