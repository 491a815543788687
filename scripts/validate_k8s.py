"""The checks of scripts/validate-k8s.sh (run by it, with the venv's Python).

There is no kustomize or kubectl here, so a kustomization is rendered by the small subset of
kustomize that deploy/k8s uses, and refused when it uses anything else (an unknown field is an
error, never ignored):

- `resources`: files (every document in them) and directories holding a kustomization.yaml;
- `namespace`: set on every namespaced object;
- `secretGenerator` with `envs` (KEY=VALUE lines) or `files`, with
  `generatorOptions.disableNameSuffixHash: true` (no hash suffixes are rendered);
- `images`: `name` with `newName`, `newTag` or `digest` (as `kustomize edit set image` writes);
- `patches` with `path`: strategic-merge patches matched by kind, name and namespace; lists of
  objects with a `name` (containers, env, volumes, ...) merge by name, other lists are replaced;
  `$patch: delete` removes the object.

Then every object is checked against the Kubernetes schemas (kubernetes-validate, strict: an
unknown field is an error), a ScaledObject against KEDA's CRD schema (unknown fields refused
too), and what a schema cannot see (see `fleet_checks`).

Usage: validate_k8s.py kustomize DIR STAND_INS K8S_VERSION CRD REDIS_START
       (STAND_INS: comma-separated paths of secrets.env, users.acl to use where missing)
       validate_k8s.py nats-values FILE USERS_CONF NATS_VERSION CONF_OUT
       validate_k8s.py redis-cluster-values FILE SECRETS_ENV
Prints each fault as `<file or object>: <what>` and exits 1 when there is one.
"""

import base64
import copy
import os
import re
import sys

import jsonschema
import kubernetes_validate
import yaml

KUSTOMIZATION_FIELDS = {
    "apiVersion", "kind", "namespace", "resources", "patches", "secretGenerator",
    "generatorOptions", "images",
}
CLUSTER_SCOPED = {"Namespace", "CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding",
                  "PersistentVolume", "StorageClass", "PriorityClass"}
SECRET_NAME = re.compile(r"(PASSWORD|TOKEN|SECRETS?_KEY|API_KEY|PRIVATE)", re.I)


class Fault(Exception):
    pass


def load_docs(path):
    try:
        with open(path, encoding="utf-8") as f:
            return [d for d in yaml.safe_load_all(f) if d is not None]
    except yaml.YAMLError as e:
        raise Fault(f"{path}: not valid YAML: {e}")


def parse_env_file(path):
    values = {}
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            if "=" not in line:
                raise Fault(f"{path}:{n}: not KEY=VALUE")
            k, v = line.split("=", 1)
            values[k] = v
    return values


def shown(path):
    """PATH from the `deploy` directory's parent: deploy/k8s/…, in a broken copy too."""
    parts = os.path.abspath(path).split(os.sep)
    return os.sep.join(parts[len(parts) - 1 - parts[::-1].index("deploy"):]) \
        if "deploy" in parts else path


def ident(doc):
    md = doc.get("metadata") or {}
    return (doc.get("kind"), md.get("name"), md.get("namespace"))


def show(doc):
    kind, name, ns = ident(doc)
    return f"{kind}/{name}" + (f" (namespace {ns})" if ns else "")


def merge(base, patch):
    """Strategic merge, the part deploy/k8s uses."""
    if isinstance(base, dict) and isinstance(patch, dict):
        out = dict(base)
        for k, v in patch.items():
            out[k] = merge(base[k], v) if k in base else copy.deepcopy(v)
        return out
    if (isinstance(base, list) and isinstance(patch, list)
            and all(isinstance(x, dict) and "name" in x for x in base + patch)):
        out = [copy.deepcopy(x) for x in base]
        for item in patch:
            for i, have in enumerate(out):
                if have["name"] == item["name"]:
                    out[i] = merge(have, item)
                    break
            else:
                out.append(copy.deepcopy(item))
        return out
    return copy.deepcopy(patch)


def render(directory, stand_ins, seen=()):
    """The objects `kustomize build DIRECTORY` would give, for the subset above."""
    directory = os.path.abspath(directory)
    if directory in seen:
        raise Fault(f"{directory}: a kustomization that includes itself")
    path = os.path.join(directory, "kustomization.yaml")
    if not os.path.isfile(path):
        raise Fault(f"{directory}: no kustomization.yaml")
    docs = load_docs(path)
    if len(docs) != 1 or not isinstance(docs[0], dict):
        raise Fault(f"{path}: not one YAML mapping")
    k = docs[0]
    for field in k:
        if field not in KUSTOMIZATION_FIELDS:
            raise Fault(f"{path}: {field!r} is not a field this checker renders "
                        "(extend scripts/validate_k8s.py, or do without it)")
    if k.get("kind") != "Kustomization":
        raise Fault(f"{path}: kind is not Kustomization")

    def local(name, what):
        p = os.path.normpath(os.path.join(directory, name))
        if not os.path.exists(p):
            # The git-ignored files an operator writes (secrets.env, users.acl): the checks'
            # own stand-ins, made by the same scripts.
            if os.path.basename(p) in stand_ins:
                return stand_ins[os.path.basename(p)]
            raise Fault(f"{path}: {what} names {name}, which does not exist")
        return p

    objects = []
    for name in k.get("resources") or []:
        p = local(name, "resources")
        if os.path.isdir(p):
            objects += render(p, stand_ins, seen + (directory,))
        else:
            for doc in load_docs(p):
                if not isinstance(doc, dict) or "kind" not in doc:
                    raise Fault(f"{p}: a document that is not a Kubernetes object")
                doc["_source"] = shown(p)
                objects.append(doc)

    options = k.get("generatorOptions") or {}
    for gen in k.get("secretGenerator") or []:
        if not options.get("disableNameSuffixHash"):
            raise Fault(f"{path}: secretGenerator without generatorOptions."
                        "disableNameSuffixHash: true (this checker renders no hash suffix)")
        unknown = set(gen) - {"name", "namespace", "envs", "files", "type"}
        if unknown:
            raise Fault(f"{path}: secretGenerator {gen.get('name')}: {sorted(unknown)} not "
                        "rendered by this checker")
        data = {}
        for env in gen.get("envs") or []:
            for key, value in parse_env_file(local(env, "secretGenerator.envs")).items():
                data[key] = base64.b64encode(value.encode()).decode()
        for f in gen.get("files") or []:
            with open(local(f, "secretGenerator.files"), "rb") as fh:
                data[os.path.basename(f)] = base64.b64encode(fh.read()).decode()
        md = {"name": gen["name"]}
        if gen.get("namespace"):
            md["namespace"] = gen["namespace"]
        objects.append({"apiVersion": "v1", "kind": "Secret", "metadata": md,
                        "type": gen.get("type", "Opaque"), "data": data,
                        "_source": shown(path)})

    for patch in k.get("patches") or []:
        if set(patch) != {"path"}:
            raise Fault(f"{path}: patches: only `path:` entries are rendered by this checker")
        p = local(patch["path"], "patches")
        for pdoc in load_docs(p):
            target = [i for i, o in enumerate(objects)
                      if o.get("kind") == pdoc.get("kind")
                      and o["metadata"].get("name") == pdoc["metadata"].get("name")
                      and (pdoc["metadata"].get("namespace") in (None, o["metadata"].get("namespace"),
                                                                 k.get("namespace")))]
            if not target:
                raise Fault(f"{p}: patches {pdoc.get('kind')}/{pdoc['metadata'].get('name')}, "
                            "which the kustomization does not have")
            i = target[0]
            if pdoc.get("$patch") == "delete":
                del objects[i]
            else:
                source = objects[i]["_source"]
                objects[i] = merge(objects[i], pdoc)
                objects[i]["_source"] = source

    for image in k.get("images") or []:
        unknown = set(image) - {"name", "newName", "newTag", "digest"}
        if unknown or "name" not in image:
            raise Fault(f"{path}: images: {sorted(unknown) or 'no name'} not rendered by this "
                        "checker")
        for _, spec in pod_specs(objects):
            for c in spec.get("containers", []) + spec.get("initContainers", []):
                name = re.split(r"[@]|:(?=[^/]*$)", c["image"])[0]
                if name == image["name"]:
                    new = image.get("newName", name)
                    if image.get("digest"):
                        c["image"] = f"{new}@{image['digest']}"
                    else:
                        tag = image.get("newTag") or (c["image"][len(name) + 1:] or "latest")
                        c["image"] = f"{new}:{tag}"

    if k.get("namespace"):
        for o in objects:
            if o["kind"] not in CLUSTER_SCOPED:
                o["metadata"]["namespace"] = k["namespace"]
    return objects


def crd_schema(crd_path):
    """The CRD's OpenAPI v3 schema, with unknown fields refused (as `kubectl apply`'s strict
    field validation does) where the schema does not say it keeps them."""
    crd = load_docs(crd_path)[0]
    versions = {v["name"]: v for v in crd["spec"]["versions"]}
    schema = copy.deepcopy(versions["v1alpha1"]["schema"]["openAPIV3Schema"])

    def close(s):
        if isinstance(s, dict):
            if (s.get("type") == "object" and "properties" in s
                    and "additionalProperties" not in s
                    and not s.get("x-kubernetes-preserve-unknown-fields")):
                s["additionalProperties"] = False
            for v in s.values():
                close(v)
        elif isinstance(s, list):
            for v in s:
                close(v)
    close(schema)
    schema["properties"]["metadata"] = {"type": "object"}
    return crd["spec"]["group"], crd["spec"]["names"]["kind"], schema


def schema_checks(objects, k8s_version, crd):
    group, crd_kind, so_schema = crd
    faults = []
    for o in objects:
        doc = {k: v for k, v in o.items() if k != "_source"}
        where = f"{o['_source']}: {show(o)}"
        if o["kind"] == crd_kind and o.get("apiVersion", "").startswith(group + "/"):
            validator = jsonschema.Draft7Validator(so_schema)
            for e in sorted(validator.iter_errors(doc), key=lambda e: list(e.path)):
                at = ".".join(str(x) for x in e.path)
                faults.append(f"{where}: {at or '(top)'}: {e.message} (KEDA's CRD schema)")
            continue
        try:
            kubernetes_validate.validate(doc, k8s_version, strict=True)
        except kubernetes_validate.SchemaNotFoundError:
            faults.append(f"{where}: no Kubernetes {k8s_version} schema for "
                          f"{o.get('apiVersion')} {o['kind']}")
        except kubernetes_validate.ValidationError as e:
            path = ".".join(str(x) for x in e.path)
            message = e.message
            faults.append(f"{where}: {path or '(top)'}: {message} "
                          f"(Kubernetes {k8s_version} schema)")
    return faults


def pod_specs(objects):
    for o in objects:
        if o["kind"] in ("Deployment", "StatefulSet", "DaemonSet", "Job"):
            yield o, o["spec"]["template"]["spec"]


def env_value(container, name):
    for e in container.get("env") or []:
        if e["name"] == name:
            return e.get("value")
    return None


def fleet_checks(objects, redis_start):
    """What no schema sees: references resolve, secrets stay in Secrets, containers are locked
    down, the workers' drain fits, KEDA watches the workers' consumer."""
    faults = []
    by = {}
    for o in objects:
        by.setdefault(o["kind"], {})[o["metadata"]["name"]] = o
    secrets = {n: {k: base64.b64decode(v).decode() for k, v in (s.get("data") or {}).items()}
               for n, s in by.get("Secret", {}).items()}
    configmaps = by.get("ConfigMap", {})

    # Secrets only in Secrets: no value of a Secret anywhere else, no secret-looking key in a
    # ConfigMap.
    values = {v for s in secrets.values() for v in s.values() if len(v) >= 8}
    for o in objects:
        if o["kind"] == "Secret":
            continue
        text = yaml.safe_dump({k: v for k, v in o.items() if k != "_source"})
        for v in values:
            if v in text:
                faults.append(f"{o['_source']}: {show(o)}: holds a secret's value in clear; "
                              "refer to the Secret instead")
        if o["kind"] == "ConfigMap":
            for key in o.get("data") or {}:
                if SECRET_NAME.search(key) and not key.endswith("_FILE"):
                    faults.append(f"{o['_source']}: {show(o)}: data.{key} looks like a secret: "
                                  "secrets go in the Secret, never in a ConfigMap")

    for o, spec in pod_specs(objects):
        where = f"{o['_source']}: {show(o)}"
        sel = (o["spec"].get("selector") or {}).get("matchLabels") or {}
        labels = o["spec"]["template"]["metadata"].get("labels") or {}
        if any(labels.get(k) != v for k, v in sel.items()):
            faults.append(f"{where}: spec.selector does not match the pod template's labels")
        pod_sc = spec.get("securityContext") or {}
        volumes = {v["name"]: v for v in spec.get("volumes") or []}
        claims = {c["metadata"]["name"] for c in o["spec"].get("volumeClaimTemplates") or []}
        for v in volumes.values():
            for kind, field, rendered in (("configMap", "name", configmaps),
                                          ("secret", "secretName", secrets)):
                ref = v.get(kind)
                if ref and not ref.get("optional") and ref.get(field) not in rendered:
                    faults.append(f"{where}: volume {v['name']!r} names {kind} "
                                  f"{ref.get(field)!r}, which is not rendered")
        for c in spec.get("containers", []) + spec.get("initContainers", []):
            cw = f"{where}: container {c['name']}"
            sc = c.get("securityContext") or {}
            if not sc.get("readOnlyRootFilesystem"):
                faults.append(f"{cw}: securityContext.readOnlyRootFilesystem is not true")
            if sc.get("allowPrivilegeEscalation") is not False:
                faults.append(f"{cw}: securityContext.allowPrivilegeEscalation is not false")
            if "ALL" not in ((sc.get("capabilities") or {}).get("drop") or []):
                faults.append(f"{cw}: securityContext.capabilities.drop has no ALL")
            if not (sc.get("runAsNonRoot") or pod_sc.get("runAsNonRoot")):
                faults.append(f"{cw}: runAsNonRoot is not true")
            for r in ("cpu", "memory"):
                if r not in ((c.get("resources") or {}).get("requests") or {}):
                    faults.append(f"{cw}: no resources.requests.{r}")
            for m in c.get("volumeMounts") or []:
                if m["name"] not in volumes and m["name"] not in claims:
                    faults.append(f"{cw}: mounts volume {m['name']!r}, which the pod does not "
                                  "have")
            for word in (c.get("command") or []) + (c.get("args") or []):
                if re.search(r"://[^/:@\s]+:[^@\s]+@|--(token|secrets-key)\b", str(word)):
                    faults.append(f"{cw}: a secret on the command line ({str(word)[:12]}…): "
                                  "`ps` shows it; use the environment from the Secret")
            # $(VAR) is expanded only from variables defined before it (else it stays literal,
            # and e.g. a password would be the text "$(DELTA_NATS_PASSWORD)").
            defined = set()
            for ef in c.get("envFrom") or []:
                ref = (ef.get("configMapRef") or {}).get("name")
                if ref is not None:
                    if ref not in configmaps:
                        faults.append(f"{cw}: envFrom names ConfigMap {ref!r}, which is not "
                                      "rendered")
                    else:
                        defined |= set(configmaps[ref].get("data") or {})
            for e in c.get("env") or []:
                literal = e.get("value")
                if (literal is not None and SECRET_NAME.search(e["name"])
                        and not e["name"].endswith("_FILE")):
                    faults.append(f"{cw}: env {e['name']} looks like a secret but has a value "
                                  "in the manifest: take it from the Secret (secretKeyRef)")
                for password in re.findall(r"://[^/:@\s]+:([^@\s]+)@", literal or ""):
                    if not re.fullmatch(r"\$\([A-Za-z_][A-Za-z0-9_]*\)", password):
                        faults.append(f"{cw}: env {e['name']} carries a password in clear: "
                                      "write $(VAR) with VAR from the Secret")
                for ref in re.findall(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", e.get("value") or ""):
                    if ref not in defined:
                        faults.append(f"{cw}: env {e['name']} uses $({ref}), which is not "
                                      "defined before it")
                key_ref = (e.get("valueFrom") or {}).get("secretKeyRef")
                # An agent's tool may ask for any variable in its `env:` but a DELTA_* one:
                # the fleet's own logins must have DELTA_* names.
                if (key_ref and "PASSWORD" in key_ref.get("key", "")
                        and not e["name"].startswith("DELTA_")):
                    faults.append(f"{cw}: env {e['name']} holds {key_ref['key']}: name it "
                                  "DELTA_… so that no agent's tool can ask for it (env:)")
                if key_ref and not key_ref.get("optional"):
                    s = secrets.get(key_ref["name"])
                    if s is None:
                        faults.append(f"{cw}: env {e['name']}: no Secret {key_ref['name']!r}")
                    elif key_ref["key"] not in s:
                        faults.append(f"{cw}: env {e['name']}: Secret {key_ref['name']!r} has "
                                      f"no key {key_ref['key']!r}")
                defined.add(e["name"])
            work = env_value(c, "DELTA_WORK_DIR")
            if work is not None:
                mounts = {m["mountPath"]: m["name"] for m in c.get("volumeMounts") or []}
                if "emptyDir" not in volumes.get(mounts.get(work), {}):
                    faults.append(f"{cw}: DELTA_WORK_DIR {work} is not an emptyDir mount (the "
                                  "root filesystem is read-only)")
            grace = env_value(c, "DELTA_GRACE_S")
            if grace is not None:
                period = spec.get("terminationGracePeriodSeconds", 30)
                if period < int(grace) + 15:
                    faults.append(f"{where}: terminationGracePeriodSeconds {period} does not "
                                  f"cover DELTA_GRACE_S {grace} and the checkpoints after it "
                                  "(give it at least 15 s more)")

    gateway = by.get("Deployment", {}).get("delta-gateway")
    if gateway is None:
        faults.append("no Deployment delta-gateway")
    else:
        labels = gateway["spec"]["template"]["metadata"]["labels"]
        c = gateway["spec"]["template"]["spec"]["containers"][0]
        if ((c.get("readinessProbe") or {}).get("httpGet") or {}).get("path") != "/readyz":
            faults.append(f"{gateway['_source']}: {show(gateway)}: the readiness probe is not "
                          "GET /readyz")
        if not (c.get("livenessProbe") or {}).get("httpGet"):
            faults.append(f"{gateway['_source']}: {show(gateway)}: no HTTP liveness probe")

        def selects(o):
            sel = o["spec"].get("selector") or {}
            sel = sel.get("matchLabels", sel) if o["kind"] == "PodDisruptionBudget" else sel
            return sel and all(labels.get(k) == v for k, v in sel.items())
        if not any(selects(o) for o in by.get("PodDisruptionBudget", {}).values()):
            faults.append("no PodDisruptionBudget selects the gateway's pods")
        if not any(selects(o) for o in by.get("Service", {}).values()):
            faults.append("no Service selects the gateway's pods")

    workers = by.get("Deployment", {}).get("delta-worker")
    scaled = list(by.get("ScaledObject", {}).values())
    if workers is None:
        faults.append("no Deployment delta-worker")
    if len(scaled) != 1:
        faults.append(f"{len(scaled)} ScaledObjects: one is expected, for the workers")
    for so in scaled:
        where = f"{so['_source']}: {show(so)}"
        spec = so["spec"]
        target = spec["scaleTargetRef"]["name"]
        if target not in by.get("Deployment", {}):
            faults.append(f"{where}: scales Deployment {target!r}, which is not rendered")
        if spec.get("minReplicaCount", 0) not in (0, 1):
            faults.append(f"{where}: minReplicaCount is {spec.get('minReplicaCount')}: 0 or 1")
        triggers = [t for t in spec.get("triggers") or [] if t.get("type") == "nats-jetstream"]
        # One trigger per consumer of the job stream: start jobs and resume jobs.
        consumers = ("delta-workers", "delta-resumes")
        got = sorted(str((t.get("metadata") or {}).get("consumer")) for t in triggers)
        if got != sorted(consumers):
            faults.append(f"{where}: nats-jetstream triggers on {got}: one on each of "
                          f"{list(consumers)} is expected")
        for t in triggers:
            md = t.get("metadata") or {}
            for key, want in (("stream", "DELTA_JOBS"), ("account", "$G")):
                if md.get(key) != want:
                    faults.append(f"{where}: trigger {key} is {md.get(key)!r}, not {want!r}")
            if md.get("consumer") not in consumers:
                faults.append(f"{where}: trigger consumer is {md.get('consumer')!r}, not one of "
                              f"{list(consumers)} (the workers' durable consumers)")
            if not str(md.get("natsServerMonitoringEndpoint", "")).endswith(":8222"):
                faults.append(f"{where}: natsServerMonitoringEndpoint is not NATS's monitoring "
                              "port 8222")
            if workers is not None:
                c = workers["spec"]["template"]["spec"]["containers"][0]
                concurrency = env_value(c, "DELTA_WORKER_CONCURRENCY") or "16"
                if str(md.get("lagThreshold")) != concurrency:
                    faults.append(f"{where}: lagThreshold {md.get('lagThreshold')} is not the "
                                  f"workers' DELTA_WORKER_CONCURRENCY {concurrency}")

    policies = list(by.get("NetworkPolicy", {}).values())
    if not any(p["spec"].get("podSelector") == {}
               and set(p["spec"].get("policyTypes") or []) == {"Ingress", "Egress"}
               and not p["spec"].get("ingress") and not p["spec"].get("egress")
               for p in policies):
        faults.append("no NetworkPolicy denies all ingress and egress by default")
    own = {((p["spec"].get("podSelector") or {}).get("matchLabels") or {}).get(
        "app.kubernetes.io/name") for p in policies}
    for o, _ in pod_specs(objects):
        name = o["spec"]["template"]["metadata"]["labels"].get("app.kubernetes.io/name")
        if name not in own:
            faults.append(f"{o['_source']}: {show(o)}: no NetworkPolicy of its own")

    # One Redis or a cluster, the same for every program; on a cluster every write waits for a
    # replica (a failover loses nothing acknowledged), on one Redis fsync-always.
    config = (configmaps.get("delta-config") or {}).get("data") or {}
    modes = {}
    for o, spec in pod_specs(objects):
        for c in spec["containers"]:
            if env_value(c, "DELTA_REDIS_URL") is not None:
                modes[f"{o['_source']}: {show(o)}"] = env_value(c, "DELTA_REDIS_CLUSTER") == "1"
    if len(set(modes.values())) > 1:
        faults.append("DELTA_REDIS_CLUSTER differs between the programs: "
                      + ", ".join(f"{k} {'1' if v else 'unset'}" for k, v in modes.items()))
    cluster = any(modes.values())
    durability = config.get("DELTA_REDIS_DURABILITY", "")
    if cluster and durability not in ("", "replica"):
        faults.append(f"a Redis Cluster with DELTA_REDIS_DURABILITY={durability}: a failover "
                      "loses writes the replica had not received; use replica")
    if cluster and "redis" in by.get("StatefulSet", {}):
        faults.append("cluster mode, yet the single Redis StatefulSet is still deployed")

    start = by.get("ConfigMap", {}).get("redis-start")
    if start is not None:
        with open(redis_start, encoding="utf-8") as f:
            if (start.get("data") or {}).get("start.sh") != f.read():
                faults.append(f"{start['_source']}: {show(start)}: start.sh is not "
                              "deploy/redis/start.sh byte for byte: copy it again")
    return faults


def kustomize(directory, stand_ins, k8s_version, crd_path, redis_start):
    stand_ins = {os.path.basename(p): p for p in stand_ins.split(",") if p}
    objects = render(directory, stand_ins)
    return (schema_checks(objects, k8s_version, crd_schema(crd_path))
            + fleet_checks(objects, redis_start))


def nats_values(path, users_conf, nats_version, conf_out):
    """The NATS chart's values: the users as deploy/nats/users.conf, the tests' server version,
    three servers with JetStream on files; writes a server config for `nats-server -t`."""
    docs = load_docs(path)
    if len(docs) != 1 or not isinstance(docs[0], dict):
        raise Fault(f"{path}: not one YAML mapping")
    v, faults = docs[0], []
    cfg = v.get("config") or {}
    with open(users_conf, encoding="utf-8") as f:
        users = f.read()
    if ((v.get("configMap") or {}).get("merge") or {}).get("data", {}).get("users.conf") != users:
        faults.append(f"{path}: configMap.merge.data.users.conf is not deploy/nats/users.conf "
                      "byte for byte: copy it again")
    if "users.conf" not in (cfg.get("merge") or {}).values():
        faults.append(f"{path}: config.merge does not include users.conf")
    tag = str(((v.get("container") or {}).get("image") or {}).get("tag", ""))
    if not tag.startswith(f"{nats_version}-"):
        faults.append(f"{path}: container.image.tag {tag!r} is not nats-server {nats_version}, "
                      "the version deploy/install-servers.sh gives the tests: keep them in step")
    cluster = cfg.get("cluster") or {}
    if not cluster.get("enabled") or cluster.get("replicas") != 3:
        faults.append(f"{path}: config.cluster is not 3 servers")
    js = cfg.get("jetstream") or {}
    if not js.get("enabled") or not (js.get("fileStore") or {}).get("enabled"):
        faults.append(f"{path}: config.jetstream is not on, with file storage")
    env = (v.get("container") or {}).get("env") or {}
    config_lines = "\n".join(l for l in users.splitlines() if not l.lstrip().startswith("#"))
    for name in sorted(set(re.findall(r"\$(DELTA_[A-Z_]+)", config_lines))):
        ref = ((env.get(name) or {}).get("valueFrom") or {}).get("secretKeyRef") or {}
        if ref.get("name") != "delta-secrets" or ref.get("key") != name:
            faults.append(f"{path}: container.env.{name}: not the key {name} of the Secret "
                          "delta-secrets (users.conf needs it)")
    if (cfg.get("monitor") or {}).get("enabled") is False:
        faults.append(f"{path}: config.monitor is off: KEDA's scaler reads it")
    # The parts nats-server can judge: the users and the JetStream settings given.
    with open(conf_out, "w", encoding="utf-8") as f:
        f.write("include ./users.conf\njetstream {\n  store_dir: /tmp/unused\n")
        for key, value in (js.get("merge") or {}).items():
            f.write(f"  {key}: {value}\n")
        f.write("}\n")
    with open(os.path.join(os.path.dirname(conf_out), "users.conf"), "w", encoding="utf-8") as f:
        f.write(((v.get("configMap") or {}).get("merge") or {}).get("data", {}).get(
            "users.conf", ""))
    return faults


def redis_cluster_values(path, secrets_env):
    docs = load_docs(path)
    if len(docs) != 1 or not isinstance(docs[0], dict):
        raise Fault(f"{path}: not one YAML mapping")
    v, faults = docs[0], []
    cluster = v.get("cluster") or {}
    if cluster.get("nodes", 0) < 6 or cluster.get("replicas", 0) < 1:
        faults.append(f"{path}: cluster: fewer than 3 masters each with a replica")
    redis = v.get("redis") or {}
    conf = redis.get("configmap") or ""
    if str(redis.get("useAOFPersistence")) != "yes":
        faults.append(f"{path}: redis.useAOFPersistence is not \"yes\"")
    for line in ("appendfsync always", "maxmemory-policy noeviction", "aclfile "):
        if line not in conf:
            faults.append(f"{path}: redis.configmap has no `{line.strip()}`")
    key = v.get("existingSecretPasswordKey")
    if v.get("existingSecret") != "delta-secrets" or key not in parse_env_file(secrets_env):
        faults.append(f"{path}: the password is not a key of delta-secrets that "
                      "deploy/make-env.sh writes")
    mounts = {m["name"] for m in redis.get("extraVolumeMounts") or []}
    acl = [x for x in redis.get("extraVolumes") or []
           if (x.get("secret") or {}).get("secretName") == "delta-redis-acl"]
    if not acl or acl[0]["name"] not in mounts:
        faults.append(f"{path}: the Secret delta-redis-acl (the ACL file) is not mounted")
    return faults


def main(argv):
    mode, args = argv[1], argv[2:]
    try:
        if mode == "kustomize":
            faults = kustomize(*args)
        elif mode == "nats-values":
            faults = nats_values(*args)
        elif mode == "redis-cluster-values":
            faults = redis_cluster_values(*args)
        else:
            raise Fault(f"unknown mode {mode}")
    except Fault as e:
        faults = [str(e)]
    for f in faults:
        print(f)
    return 1 if faults else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
