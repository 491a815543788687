#!/usr/bin/env bash
# Writes the secrets docker-compose.yml needs into .env (or the file given), readable by you only:
# the secrets key, the operator token, and a password per role for Redis and NATS. A variable the
# file already has is kept (so running it again after an upgrade only adds what is new); nothing
# is printed. Usage: bash deploy/make-env.sh [file]   (default: .env at the repository's root)
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
FILE="${1:-$ROOT/.env}"
command -v openssl >/dev/null || { echo "error: openssl is needed to make random secrets" >&2; exit 1; }
umask 077
touch "$FILE"
chmod 600 "$FILE"
add() { # NAME BYTES
  grep -q "^$1=" "$FILE" || echo "$1=$(openssl rand -hex "$2")" >>"$FILE"
}
add DELTA_SECRETS_KEY 32
for v in DELTA_GATEWAY_TOKEN \
  DELTA_REDIS_GATEWAY_PASSWORD DELTA_REDIS_WORKER_PASSWORD DELTA_REDIS_ADMIN_PASSWORD \
  DELTA_NATS_GATEWAY_PASSWORD DELTA_NATS_WORKER_PASSWORD DELTA_NATS_BOT_PASSWORD \
  DELTA_NATS_ADMIN_PASSWORD DELTA_NATS_SLACK_PASSWORD; do
  add "$v" 24
done
echo "wrote $FILE (mode 600)"
