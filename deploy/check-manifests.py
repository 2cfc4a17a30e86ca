#!/usr/bin/env python3
"""Check the Kubernetes manifests in deploy/k8s without a cluster.

    python3 deploy/check-manifests.py [DIR]     # default: deploy/k8s next to this script
    python3 deploy/check-manifests.py --self-test

Reads every *.yaml in DIR (PyYAML: `pip install pyyaml` if `import yaml` fails) and checks what the
gateway needs from them: the kinds; selectors that match the pod labels; probes on /readyz and
/healthz; Service ports that reach container ports, and listeners, advertise address and public URL
that agree with them; a grace period longer than the drain timeout; the PodDisruptionBudget; the
security context; secrets from a Secret volume; data on a volumeClaimTemplate; a start file per
replica in which only gateway-0 bootstraps, guarded by peers = every other replica; the autoscaling example (DIR/autoscaling/*.yaml,
applied by hand) targets the StatefulSet, never scales down and has a start file per ordinal. With the kubernetes-validate package installed, every
object is also validated strictly (no unknown fields) against the API schemas of Kubernetes 1.28.
Prints one line per problem and exits 1 if there is any. --self-test breaks copies of the
manifests one way at a time and requires each to fail.
"""

import copy
import re
import sys
from pathlib import Path

try:
    import yaml
except ImportError:
    sys.exit("check-manifests: PyYAML is missing: pip install pyyaml")

DEFAULT_DIR = Path(__file__).resolve().parent / "k8s"
DRAIN_TIMEOUT_MS_DEFAULT = 30000
# What the image sets (deploy/Dockerfile): the listeners' ports and the data dir.
IMAGE_ENV = {"GATEWAY_LISTEN": "0.0.0.0:8080", "GATEWAY_CLUSTER_LISTEN": "0.0.0.0:7070", "GATEWAY_DATA_DIR": "/data"}


def load(directory):
    """The objects of every *.yaml in `directory` as (file name, object), and the problems of its
    kustomization (a manifest it does not list is never applied)."""
    docs, listed, problems = [], None, []
    files = sorted(Path(directory).glob("*.yaml"))
    for path in files:
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") == "Kustomization":
                listed = set(doc.get("resources", []))
            elif doc:
                docs.append((path.name, doc))
    # Optional objects applied by hand (not listed by the kustomization): the autoscaling example.
    for path in sorted((Path(directory) / "autoscaling").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                docs.append((f"autoscaling/{path.name}", doc))
    if listed is not None:
        names = {p.name for p in files}
        for name in sorted(names - listed - {"kustomization.yaml"}):
            problems.append(f"kustomization.yaml: resources do not list {name}")
        for name in sorted(listed - names):
            problems.append(f"kustomization.yaml: lists {name}, which does not exist")
    return docs, problems


def matches(selector, labels):
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def setting(container, flag, env_name):
    """A serve setting from the container's args (--flag=value or --flag value), its env, or the image."""
    args = [str(a) for a in container.get("args", [])]
    for i, a in enumerate(args):
        if a.startswith(f"--{flag}="):
            return a.split("=", 1)[1]
        if a == f"--{flag}" and i + 1 < len(args):
            return args[i + 1]
    for e in container.get("env", []):
        if e.get("name") == env_name and "value" in e:
            return str(e["value"])
    return IMAGE_ENV.get(env_name)


def port_of(addr):
    m = re.search(r":(\d+)(?:/.*)?$", addr or "")
    return int(m.group(1)) if m else None


def check(docs):
    """Every problem found, as 'file: Kind name: message'."""
    errors = []
    by_kind = {}
    for fname, d in docs:
        by_kind.setdefault(d["kind"], []).append((fname, d))

    def err(fname, d, msg):
        errors.append(f"{fname}: {d['kind']} {d.get('metadata', {}).get('name', '?')}: {msg}")

    for kind in ("StatefulSet", "Service", "PodDisruptionBudget", "ConfigMap"):
        if kind not in by_kind:
            errors.append(f"no {kind} in the manifests")
    if len(by_kind.get("StatefulSet", [])) != 1:
        errors.append("expected exactly one StatefulSet")
        return errors
    fname, sts = by_kind["StatefulSet"][0]
    spec = sts.get("spec", {})
    tmpl = spec.get("template", {})
    labels = tmpl.get("metadata", {}).get("labels", {})
    pod = tmpl.get("spec", {})
    replicas = spec.get("replicas", 1)
    if not matches(spec.get("selector", {}).get("matchLabels"), labels):
        err(fname, sts, f"selector {spec.get('selector')} does not match the pod labels {labels}")
    if replicas < 3 or replicas % 2 == 0:
        err(fname, sts, f"replicas {replicas}: a quorum that survives one loss needs an odd number >= 3")
    if spec.get("podManagementPolicy") != "Parallel":
        err(fname, sts, "podManagementPolicy must be Parallel (after a full stop no pod is ready without its peers)")
    containers = pod.get("containers", [])
    gw = next((c for c in containers if c.get("name") == "gateway"), None)
    if gw is None:
        err(fname, sts, "no container named gateway")
        return errors
    ports = {p.get("name"): p["containerPort"] for p in gw.get("ports", [])}
    numbers = set(ports.values())
    listen, cluster_listen = port_of(setting(gw, "listen", "GATEWAY_LISTEN")), port_of(
        setting(gw, "cluster-listen", "GATEWAY_CLUSTER_LISTEN"))
    for what, port in (("device listener", listen), ("cluster listener", cluster_listen)):
        if port not in numbers:
            err(fname, sts, f"the {what} port {port} is not a containerPort ({ports})")
    args = [str(a) for a in gw.get("args", [])]
    if not args or args[0] != "serve":
        err(fname, sts, f"args must start with serve: {args[:1]}")
    env = {e.get("name"): e for e in gw.get("env", [])}
    for var, field in (("POD_NAME", "metadata.name"), ("POD_NAMESPACE", "metadata.namespace")):
        if env.get(var, {}).get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") != field:
            err(fname, sts, f"env {var} must come from the downward API field {field}")
    service_name = spec.get("serviceName")
    advertise = setting(gw, "cluster-advertise", "GATEWAY_CLUSTER_ADVERTISE") or ""
    want = f"$(POD_NAME).{service_name}.$(POD_NAMESPACE).svc.cluster.local:{cluster_listen}"
    if advertise != want:
        err(fname, sts, f"--cluster-advertise {advertise!r}: expected {want!r} (stable per pod, dialable by peers)")
    public = setting(gw, "public-url", "GATEWAY_PUBLIC_URL") or ""
    if not public.startswith("ws") or port_of(public) != listen:
        err(fname, sts, f"--public-url {public!r} must be a ws(s):// URL on the device port {listen}")
    if setting(gw, "name", "GATEWAY_NAME") != "$(POD_NAME)":
        err(fname, sts, "--name must be $(POD_NAME): node names are the stable pod names")

    # Probes: httpGet (the image has no shell) on the cluster listener.
    for probe, path in (("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")):
        get = gw.get(probe, {}).get("httpGet")
        if not get:
            err(fname, sts, f"{probe} must be an httpGet on {path}")
            continue
        port = ports.get(get.get("port"), get.get("port"))
        if get.get("path") != path or port != cluster_listen:
            err(fname, sts, f"{probe} must GET {path} on the cluster port {cluster_listen}, not {get}")

    # Drain: the grace period must outlast the drain timeout (and any preStop).
    drain_ms = int(setting(gw, "drain-timeout-ms", "GATEWAY_DRAIN_TIMEOUT_MS") or DRAIN_TIMEOUT_MS_DEFAULT)
    pre_stop = gw.get("lifecycle", {}).get("preStop", {}).get("sleep", {}).get("seconds", 0)
    grace = pod.get("terminationGracePeriodSeconds", 30)
    if grace * 1000 <= drain_ms + pre_stop * 1000:
        err(fname, sts, f"terminationGracePeriodSeconds {grace} must exceed the drain timeout "
                        f"({drain_ms} ms) plus preStop ({pre_stop} s)")

    # Security context.
    psc, csc = pod.get("securityContext", {}), gw.get("securityContext", {})
    if not (csc.get("runAsNonRoot", psc.get("runAsNonRoot")) is True):
        err(fname, sts, "runAsNonRoot must be true")
    if csc.get("runAsUser", psc.get("runAsUser", 10001)) == 0:
        err(fname, sts, "runAsUser must not be 0")
    if csc.get("readOnlyRootFilesystem") is not True:
        err(fname, sts, "readOnlyRootFilesystem must be true")
    if csc.get("allowPrivilegeEscalation") is not False:
        err(fname, sts, "allowPrivilegeEscalation must be false")
    if "ALL" not in csc.get("capabilities", {}).get("drop", []):
        err(fname, sts, "capabilities.drop must include ALL")
    res = gw.get("resources", {})
    if not res.get("requests") or not res.get("limits", {}).get("memory"):
        err(fname, sts, "resources need requests and a memory limit")

    # Volumes: data on a claim template, secrets from a Secret, start files from a ConfigMap.
    mounts = {m["name"]: m for m in gw.get("volumeMounts", [])}
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    claims = {c.get("metadata", {}).get("name") for c in spec.get("volumeClaimTemplates", [])}
    data_dir = setting(gw, "data-dir", "GATEWAY_DATA_DIR")
    data = [n for n, m in mounts.items() if m.get("mountPath") == data_dir]
    if not data or data[0] not in claims:
        err(fname, sts, f"the data dir {data_dir} must be mounted from a volumeClaimTemplate (claims: {claims})")

    def mounted_from(path):
        """(volume, key) of the volume mount holding `path`, or None."""
        for name, m in mounts.items():
            root = m.get("mountPath", "").rstrip("/") + "/"
            if path.startswith(root):
                return volumes.get(name), path[len(root):]
        return None

    for flag, env_name in (("cluster-secret-file", "GATEWAY_CLUSTER_SECRET_FILE"),
                           ("device-secret-file", "GATEWAY_DEVICE_SECRET_FILE"),
                           ("backend-secret-file", "GATEWAY_BACKEND_SECRET_FILE")):
        path = setting(gw, flag, env_name)
        src = mounted_from(path or "")
        if not path or not src or not (src[0] or {}).get("secret", {}).get("secretName"):
            err(fname, sts, f"--{flag} {path!r} must be a file of a mounted Secret volume")
    for e in gw.get("env", []):
        if e.get("name", "").endswith("_SECRET") and "value" in e:
            err(fname, sts, f"env {e['name']} holds a secret in the manifest")

    # Start files: one per replica from a ConfigMap of the manifests; only gateway-0 bootstraps.
    config = setting(gw, "config", "GATEWAY_CONFIG") or ""
    src = mounted_from(config.replace("$(POD_NAME).toml", "x"))
    cm_name = (src[0] or {}).get("configMap", {}).get("name") if src else None
    cms = {d["metadata"]["name"]: (f, d) for f, d in by_kind.get("ConfigMap", [])}
    if "$(POD_NAME)" not in config or cm_name not in cms:
        err(fname, sts, f"--config {config!r} must be a per-pod file ($(POD_NAME).toml) of a ConfigMap in the manifests")
    else:
        cf, cm = cms[cm_name]
        seed = f"{sts['metadata']['name']}-0"
        for i in range(replicas):
            pod_name = f"{sts['metadata']['name']}-{i}"
            text = cm.get("data", {}).get(f"{pod_name}.toml")
            if text is None:
                err(cf, cm, f"no {pod_name}.toml for replica {i}")
                continue
            joins = re.findall(r'^\s*join\s*=\s*"([^"]*)"', text, re.M)
            if i == 0 and (joins or re.search(r"^\s*standby\s*=\s*true", text, re.M)):
                err(cf, cm, f"{pod_name}.toml must bootstrap (no join, no standby)")
            if i == 0:
                # The bootstrap guard: a lost volume must not bootstrap a second cluster.
                line = re.search(r"^\s*peers\s*=\s*\[([^\]]*)\]", text, re.M)
                peers = re.findall(r'"([^"]*)"', line.group(1)) if line else []
                want = {f"{sts['metadata']['name']}-{k}.{service_name}" for k in range(1, replicas)}
                hosts = [p.rsplit(":", 1)[0] for p in peers if port_of(p) == cluster_listen]
                if any(not any(h == w or h.startswith(w + ".") for h in hosts) for w in want):
                    err(cf, cm, f"{pod_name}.toml must guard its bootstrap with peers = every other replica "
                                f"({', '.join(sorted(want))}, port {cluster_listen}), not {peers}")
            if i > 0 and (len(joins) != 1 or not joins[0].startswith(f"{seed}.{service_name}")
                          or port_of(joins[0]) != cluster_listen):
                err(cf, cm, f"{pod_name}.toml must join {seed}.{service_name}...:{cluster_listen}, not {joins}")

    # Autoscaling: the HPA targets this StatefulSet, never scales down (a scale-down must run
    # `gateway scale-in` first), and every ordinal it may create has a start file.
    for f, hpa in by_kind.get("HorizontalPodAutoscaler", []):
        s = hpa.get("spec", {})
        ref = s.get("scaleTargetRef", {})
        if ref.get("kind") != "StatefulSet" or ref.get("name") != sts["metadata"]["name"]:
            err(f, hpa, f"scaleTargetRef {ref} is not the StatefulSet {sts['metadata']['name']}")
        if s.get("behavior", {}).get("scaleDown", {}).get("selectPolicy") != "Disabled":
            err(f, hpa, "behavior.scaleDown.selectPolicy must be Disabled: scale in with `gateway scale-in`")
        data = cms.get(cm_name, (None, {}))[1].get("data", {})
        for i in range(int(s.get("maxReplicas", 0))):
            if f"{sts['metadata']['name']}-{i}.toml" not in data:
                err(f, hpa, f"maxReplicas {s.get('maxReplicas')}: no start file for {sts['metadata']['name']}-{i}")

    # Services: selectors, target ports; the peers' Service is headless and publishes unready pods.
    services = {d["metadata"]["name"]: (f, d) for f, d in by_kind.get("Service", [])}
    if service_name not in services:
        err(fname, sts, f"serviceName {service_name!r} is not a Service of the manifests")
    for name, (f, svc) in services.items():
        s = svc.get("spec", {})
        if not matches(s.get("selector"), labels):
            err(f, svc, f"selector {s.get('selector')} does not match the pod labels {labels}")
        for p in s.get("ports", []):
            target = p.get("targetPort", p.get("port"))
            if ports.get(target, target) not in numbers:
                err(f, svc, f"port {p.get('name')} targets {target!r}, which is no container port ({ports})")
        targets = {ports.get(p.get("targetPort"), p.get("targetPort", p.get("port"))) for p in s.get("ports", [])}
        if name == service_name:
            if s.get("clusterIP") != "None":
                err(f, svc, "the StatefulSet's serviceName must be headless (clusterIP: None)")
            if s.get("publishNotReadyAddresses") is not True:
                err(f, svc, "publishNotReadyAddresses must be true: peers resolve each other before they are ready")
            if cluster_listen not in targets:
                err(f, svc, f"must expose the cluster port {cluster_listen}")
    if not any(listen in {ports.get(p.get("targetPort"), p.get("targetPort")) for p in d["spec"].get("ports", [])}
               for n, (_, d) in services.items() if n != service_name):
        errors.append(f"no Service besides {service_name} exposes the device port {listen}")

    # Disruption budget: at most one voter away.
    pdbs = by_kind.get("PodDisruptionBudget", [])
    if pdbs and not any(matches(d["spec"].get("selector", {}).get("matchLabels"), labels) for _, d in pdbs):
        errors.append("no PodDisruptionBudget selects the gateway pods")
    for f, d in pdbs:
        s = d.get("spec", {})
        if s.get("maxUnavailable") != 1 and s.get("minAvailable") != replicas // 2 + 1:
            err(f, d, f"must allow at most one pod away (maxUnavailable: 1), not {s}")
    return errors


def schema_problems(docs, version="1.28.0"):
    """Strict validation against the Kubernetes API schemas (kubernetes-validate, which ships them),
    or None when that package is not installed."""
    try:
        import kubernetes_validate
    except ImportError:
        return None
    problems = []
    for fname, d in docs:
        try:
            kubernetes_validate.validate(d, version, strict=True)
        except kubernetes_validate.ValidationError as e:
            path = ".".join(str(p) for p in e.path)
            problems.append(f"{fname}: {d['kind']} {d['metadata'].get('name')}: schema {version}: {path}: {e.message}")
    return problems


def break_copies(docs):
    """Broken variants of the manifests: (what is broken, docs)."""

    def variant(what, edit):
        d = copy.deepcopy(docs)
        kinds = {}
        for _, doc in d:
            kinds.setdefault(doc["kind"], []).append(doc)
        edit(kinds)
        return what, [(f, doc) for f, doc in d if not doc.get("_drop")]

    def gw(k):
        return k["StatefulSet"][0]["spec"]["template"]["spec"]["containers"][0]

    def headless(k):
        return next(s for s in k["Service"] if s["spec"].get("clusterIP") == "None")

    return [
        variant("selector does not match labels",
                lambda k: k["StatefulSet"][0]["spec"]["selector"]["matchLabels"].update(app="other")),
        variant("readiness probe removed", lambda k: gw(k).pop("readinessProbe")),
        variant("liveness probe on the device port", lambda k: gw(k)["livenessProbe"]["httpGet"].update(port="devices")),
        variant("grace period shorter than the drain timeout",
                lambda k: k["StatefulSet"][0]["spec"]["template"]["spec"].update(terminationGracePeriodSeconds=30)),
        variant("PodDisruptionBudget removed", lambda k: k["PodDisruptionBudget"][0].update(_drop=True)),
        variant("PodDisruptionBudget allows two away", lambda k: k["PodDisruptionBudget"][0]["spec"].update(maxUnavailable=2)),
        variant("root filesystem writable", lambda k: gw(k)["securityContext"].update(readOnlyRootFilesystem=False)),
        variant("capabilities kept", lambda k: gw(k)["securityContext"].pop("capabilities")),
        variant("headless Service hides unready pods", lambda k: headless(k)["spec"].pop("publishNotReadyAddresses")),
        variant("Service targets a port the container lacks",
                lambda k: headless(k)["spec"]["ports"][0].update(targetPort=7071)),
        variant("container port differs from the listener", lambda k: gw(k)["ports"][1].update(containerPort=7000)),
        variant("advertise address not per pod",
                lambda k: gw(k)["args"].__setitem__(3, "--cluster-advertise=gateway:7070")),
        variant("gateway-2 bootstraps a second cluster",
                lambda k: k["ConfigMap"][0]["data"].update({"gateway-2.toml": "# nothing\n"})),
        variant("gateway-0 bootstraps without peers (a lost volume splits the cluster)",
                lambda k: k["ConfigMap"][0]["data"].update({"gateway-0.toml": "# nothing\n"})),
        variant("gateway-0 guards with a peer missing",
                lambda k: k["ConfigMap"][0]["data"].update(
                    {"gateway-0.toml": 'peers = ["gateway-1.gateway-peers:7070"]\n'})),
        variant("secret in the environment",
                lambda k: gw(k)["env"].append({"name": "GATEWAY_CLUSTER_SECRET", "value": "x" * 32})),
        variant("data dir not on a claim", lambda k: k["StatefulSet"][0]["spec"].pop("volumeClaimTemplates")),
        variant("autoscaler scales down",
                lambda k: k["HorizontalPodAutoscaler"][0]["spec"]["behavior"]["scaleDown"].update(selectPolicy="Max")),
        variant("autoscaler beyond the start files",
                lambda k: k["HorizontalPodAutoscaler"][0]["spec"].update(maxReplicas=6)),
    ]


def main():
    args = sys.argv[1:]
    if args == ["--self-test"]:
        docs, problems = load(DEFAULT_DIR)
        base = problems + check(docs)
        if base:
            print("\n".join(base))
            sys.exit("check-manifests: the manifests themselves fail; fix them first")
        missed = 0
        for what, broken in break_copies(docs):
            found = check(broken)
            print(f"{'caught' if found else 'MISSED'}: {what}" + (f" -> {found[0]}" if found else ""))
            missed += not found
        if missed:
            sys.exit(f"check-manifests: {missed} broken copies passed")
        print("check-manifests: self-test ok: every broken copy failed")
        return
    directory = Path(args[0]) if args else DEFAULT_DIR
    docs, problems = load(directory)
    schema = schema_problems(docs)
    errors = problems + (schema or []) + check(docs)
    if schema is None:
        print("check-manifests: API schemas not checked (pip install kubernetes-validate to check them too)")
    for e in errors:
        print(f"{directory}/{e}" if re.match(r"[\w.-]+\.yaml: ", e) else f"{directory}: {e}")
    if errors:
        sys.exit(f"check-manifests: {len(errors)} problems in {directory}")
    kinds = ", ".join(sorted({d['kind'] for _, d in docs}))
    checked = "" if schema is None else "; strict API schemas of Kubernetes 1.28 hold"
    print(f"check-manifests: {directory}: ok ({len(docs)} objects: {kinds}{checked})")


if __name__ == "__main__":
    main()
