#!/bin/sh
# Starts redis-server for docker-compose.yml with a user per role (docs/security.md): writes the
# ACL file from the passwords in the environment, then runs redis-server on it with the arguments
# given. The `default` user is off, so every connection must log in. These rules are what
# `delta_store::redis::access` gives for the prefix `delta`; a test
# (tests/tests/security_servers.rs) fails when the two differ, and runs this script with a real
# redis-server to check what each role can and cannot do.
#
#   DELTA_REDIS_GATEWAY_PASSWORD, DELTA_REDIS_WORKER_PASSWORD, DELTA_REDIS_ADMIN_PASSWORD
#       required; letters and digits only (e.g. `openssl rand -hex 24`)
#   DELTA_REDIS_ACL_FILE   where the ACL file goes (default /tmp/users.acl, readable by Redis only)
set -eu

for name in DELTA_REDIS_GATEWAY_PASSWORD DELTA_REDIS_WORKER_PASSWORD DELTA_REDIS_ADMIN_PASSWORD; do
  eval "value=\${$name:-}"
  case "$value" in
    "" | *[!A-Za-z0-9]*)
      echo "error: set $name to letters and digits only (e.g. openssl rand -hex 24)" >&2
      exit 64
      ;;
  esac
done

acl="${DELTA_REDIS_ACL_FILE:-/tmp/users.acl}"
umask 077
cat >"$acl" <<ACL
user default off resetpass ~* &* +@all
user delta-gateway on >$DELTA_REDIS_GATEWAY_PASSWORD resetkeys ~delta:* resetchannels -@all +@read +@write +@scripting +@connection +@transaction -@admin -@dangerous -script|flush -script|kill -function -scan -randomkey -dbsize -select -move +cluster|slots +cluster|shards +asking
user delta-worker on >$DELTA_REDIS_WORKER_PASSWORD resetkeys ~delta:* resetchannels -@all +@read +@write +@scripting +@connection +@transaction -@admin -@dangerous -script|flush -script|kill -function -scan -randomkey -dbsize -select -move +cluster|slots +cluster|shards +asking
user delta-admin on >$DELTA_REDIS_ADMIN_PASSWORD ~* &* +@all
ACL
exec redis-server --aclfile "$acl" "$@"
