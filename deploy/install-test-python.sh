#!/usr/bin/env bash
# Installs, idempotently into <repo>/.tools/venv (DELTA_TOOLS_DIR moves it), the independent
# implementations the tests check the fleet's channels against:
#   standardwebhooks  verifies webhook signatures (Standard Webhooks' own library)
#   cloudevents       decodes the fleet's events (the CloudEvents SDK for Python)
#   jsonschema        checks each event against its JSON Schema in docs/events/
#   mcp               the official MCP Python SDK, the client of the gateway's /mcp
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
TOOLS="${DELTA_TOOLS_DIR:-$ROOT/.tools}"
VENV="$TOOLS/venv"
PACKAGES=("standardwebhooks==1.1.0" "cloudevents==2.2.0" "jsonschema==4.26.0" "mcp==2.3.0")

[ -x "$VENV/bin/pip" ] || python3 -m venv "$VENV"
missing=()
for p in "${PACKAGES[@]}"; do
  name="${p%%==*}"
  want="${p##*==}"
  have="$("$VENV/bin/pip" show "$name" 2>/dev/null | sed -n 's/^Version: //p' || true)"
  [ "$have" = "$want" ] || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  "$VENV/bin/pip" install -q --disable-pip-version-check "${missing[@]}"
fi
echo "python for the tests: $VENV/bin/python ($(printf '%s ' "${PACKAGES[@]}"))"
