#!/usr/bin/env bash
# Runs the hitl-basic variants BENCHMARKS.md reports, one JSON line each, into bench-results.jsonl
# (or $1). Release build; servers installed if missing. About ten minutes on two cores.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-bench-results.jsonl}"
cargo build -q --release --bin delta --bin delta-gateway --bin delta-worker
B=target/release/delta
: >"$OUT"
run() {
  echo "== delta bench hitl-basic $*" >&2
  echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
  "$B" bench hitl-basic --install "$@" | tee -a "$OUT"
}
for _ in 1 2 3; do run --runs 2000 --concurrency 64 --workers 2 --answer-via http; done
run --runs 2000 --concurrency 64 --workers 2 --answer-via nats
run --runs 2000 --concurrency 64 --workers 1
run --runs 2000 --concurrency 64 --workers 4
run --runs 500 --concurrency 1 --workers 2
run --runs 20 --concurrency 1 --journal-len 10
run --runs 20 --concurrency 1 --journal-len 10000
run --runs 640 --concurrency 64 --journal-len 10
run --runs 640 --concurrency 64 --journal-len 10000
run --runs 2000 --concurrency 64 --paused-probe 1000
run --runs 2000 --concurrency 64 --echo process
run --runs 2000 --concurrency 64 --fsync everysec
run --runs 2000 --concurrency 64 --cluster
