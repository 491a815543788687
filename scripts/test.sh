#!/usr/bin/env bash
# The project's test command: formatting, lints and every test of the workspace.
# It installs what the tests need first, so it works on a fresh machine with a Rust toolchain.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! rustup component list --installed 2>/dev/null | grep -q '^rustfmt'; then
  rustup component add rustfmt clippy
fi

echo "== servers for the tests (redis-server, nats-server)"
deploy/install-servers.sh

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
echo "== cargo test"
cargo test --workspace
