#!/usr/bin/env bash
# Writes users.acl beside this script (git-ignored, readable by you only) for the Redis Cluster
# of this overlay: the rules deploy/redis/start.sh gives the single Redis, taken from that file,
# with the passwords from deploy/k8s/secrets.env (or the file given). One change: the `default`
# user is on, with the admin password, because Bitnami's chart runs its own cluster commands
# (creating the cluster, replicas following their masters) as `default` with `requirepass`.
# Usage: bash deploy/k8s/redis-cluster/make-acl.sh [secrets.env [users.acl]]
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ENV_FILE="${1:-$HERE/../secrets.env}"
OUT="${2:-$HERE/users.acl}"
START="$HERE/../../redis/start.sh"
[ -r "$ENV_FILE" ] || { echo "error: no $ENV_FILE: run bash deploy/make-env.sh deploy/k8s/secrets.env" >&2; exit 1; }
set -a
# shellcheck disable=SC1090
. "$ENV_FILE"
set +a
for name in DELTA_REDIS_GATEWAY_PASSWORD DELTA_REDIS_WORKER_PASSWORD DELTA_REDIS_ADMIN_PASSWORD; do
  value="${!name:-}"
  case "$value" in
    "" | *[!A-Za-z0-9]*) echo "error: $name in $ENV_FILE must be letters and digits only" >&2; exit 64 ;;
  esac
done
# The lines of start.sh's here-document, with their $VARIABLES expanded.
rules="$(sed -n '/<<ACL$/,/^ACL$/{/<<ACL$/d;/^ACL$/d;p}' "$START")"
[ -n "$rules" ] || { echo "error: no ACL here-document in $START" >&2; exit 1; }
umask 077
eval "cat <<ACL
$rules
ACL" | sed "s/^user default off resetpass /user default on >$DELTA_REDIS_ADMIN_PASSWORD /" >"$OUT"
echo "wrote $OUT (mode 600)"
