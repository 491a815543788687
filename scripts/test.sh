#!/usr/bin/env bash
# The project's test command: formatting, lints and every test of the workspace.
# It installs what the tests need first, so it works on a fresh machine with a Rust toolchain.
#
#   scripts/test.sh             one nats-server and one redis-server per test fleet
#   scripts/test.sh --cluster   the same, with every fleet the test harness starts on a 3-node
#                               NATS cluster and a Redis Cluster of 3 masters with a replica each
#                               (DELTA_TEST_CLUSTER=1; docs/testing.md#on-clusters)
set -euo pipefail
cd "$(dirname "$0")/.."

for arg in "$@"; do
  case "$arg" in
    --cluster) export DELTA_TEST_CLUSTER=1 ;;
    -h | --help)
      sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'
      exit 0
      ;;
    *)
      echo "scripts/test.sh: unknown argument \`$arg\` (use --cluster, or nothing)" >&2
      exit 2
      ;;
  esac
done

installed=$(rustup component list --installed 2>/dev/null || true)
for component in rustfmt clippy; do
  if ! grep -q "^$component" <<<"$installed"; then
    rustup component add "$component"
  fi
done

echo "== servers for the tests (redis-server, nats-server)"
deploy/install-servers.sh

echo "== Python libraries the tests check the channels with (standardwebhooks, cloudevents)"
deploy/install-test-python.sh

echo "== browser for the web inbox's tests (chromium, chromedriver)"
deploy/install-browser.sh

echo "== docker-compose.yml and its configs (no container engine needed)"
scripts/validate-compose.sh

echo "== deploy/k8s: Kubernetes manifests, KEDA ScaledObject, chart values (no cluster needed)"
scripts/validate-k8s.sh

echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy"
cargo clippy --workspace --all-targets -- -D warnings
echo "== the fleet's programs (delta-gateway, delta-worker: the tests start them as processes)"
cargo build --workspace --bins
if [ "${DELTA_TEST_CLUSTER:-}" = 1 ]; then
  echo "== cargo test (fleets on clusters: DELTA_TEST_CLUSTER=1)"
else
  echo "== cargo test"
fi
cargo test --workspace
