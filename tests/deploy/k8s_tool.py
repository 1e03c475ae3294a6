#!/usr/bin/env python3
"""Helpers of the deploy/ tests (Debian's python3-yaml only).

  k8s_tool.py render DIR                 kustomize DIR (the subset deploy/k8s uses) to stdout
  k8s_tool.py check RENDERED             the layout's cross-references (exit 1 with the reasons):
                                         servers, Services, ports, world, claims, and the serving
                                         replicas (Deployment and Service ps-serve, the claim the
                                         workers publish to)
  k8s_tool.py pod RENDERED KIND NAME CONTAINER INDEX ROOT [--set K=V]... [--probe readiness]
                                         a bash script (stdout) that runs that container of pod
                                         INDEX as Kubernetes would, on this machine

`pod` takes the container's args (or a probe's command), its environment (envFrom ConfigMaps,
env values, configMap/secret keys, the downward API) and its volumes from the YAML, so the
kind-free test runs exactly what the manifests say. Substitutions, all of them here:
  - HOSTNAME = <StatefulSet name>-INDEX, JOB_COMPLETION_INDEX = INDEX (Indexed Jobs),
    metadata.namespace = the object's namespace, status.podIP = 127.0.0.1;
  - the image's ENTRYPOINT (emberps-entrypoint) = deploy/container/emberps-entrypoint.sh; the
    programs come from PATH (the test puts build/bin first);
  - every volume's mountPath = ROOT/<pod>/<volume> (emptyDir and claim templates: a directory;
    a Secret: its keys written there as files), a named claim's = ROOT/claims/<claim> (shared by
    the pods mounting it, as a ReadWriteMany volume is), in args and environment values;
  - 0.0.0.0 = 127.0.0.1 (tests bind loopback only);
  - --set K=V overrides an environment variable after all that (the test: EMBER_PORT_STRIDE=1
    so servers share 127.0.0.1, free ports, fewer generated rows);
  - a worker's --metrics-port = 0 (any free port: two workers share the host).
DNS names are left to emberps-entrypoint, which resolves them with getent: the test puts a
getent on PATH that answers 127.0.0.1 for them.
"""
import base64
import os
import re
import shlex
import sys

import yaml

CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "PersistentVolume"}


def render(d):
    with open(os.path.join(d, "kustomization.yaml")) as f:
        k = yaml.safe_load(f)
    known = {"apiVersion", "kind", "namespace", "labels", "resources", "images"}
    extra = set(k) - known
    if extra:
        sys.exit(f"render: kustomization fields this renderer does not know: {sorted(extra)}")
    docs = []
    for r in k["resources"]:
        with open(os.path.join(d, r)) as f:
            docs += [x for x in yaml.safe_load_all(f) if x]
    for o in docs:
        md = o.setdefault("metadata", {})
        if k.get("namespace") and o["kind"] not in CLUSTER_SCOPED:
            md["namespace"] = k["namespace"]
        for lab in k.get("labels", []):
            md.setdefault("labels", {}).update(lab["pairs"])
        spec = (o.get("spec") or {}).get("template", {}).get("spec", {})
        for c in spec.get("containers", []) + spec.get("initContainers", []):
            for im in k.get("images", []):
                if c["image"].split(":")[0] == im["name"]:
                    c["image"] = f'{im.get("newName", im["name"])}:{im.get("newTag", "latest")}'
    return docs


def load(path):
    with open(path) as f:
        return [x for x in yaml.safe_load_all(f) if x]


def find(docs, kind, name):
    for o in docs:
        if o["kind"] == kind and o["metadata"]["name"] == name:
            return o
    sys.exit(f"no {kind}/{name} in the manifests")


def flag(args, name):
    for a in args:
        if a.startswith(f"--{name}="):
            return a.split("=", 1)[1]
    return None


def check(docs):
    bad = []
    cm = find(docs, "ConfigMap", "emberps-config")["data"]
    sts = find(docs, "StatefulSet", "ps-server")
    job = find(docs, "Job", "ps-worker")
    n = sts["spec"]["replicas"]
    if int(cm["EMBER_SERVERS"]) != n:
        bad.append(f"EMBER_SERVERS={cm['EMBER_SERVERS']} but the StatefulSet has {n} replicas")
    if sts["spec"]["serviceName"] != cm["EMBER_SERVER_NAME"] or sts["metadata"]["name"] != cm["EMBER_SERVER_NAME"]:
        bad.append("StatefulSet name / serviceName differ from EMBER_SERVER_NAME")
    svc = find(docs, "Service", sts["spec"]["serviceName"])
    if svc["spec"].get("clusterIP") != "None":
        bad.append("the StatefulSet's Service is not headless")
    for i in range(n):  # one ClusterIP Service per server, selecting that pod
        s = find(docs, "Service", f"{sts['metadata']['name']}-{i}")
        if s["spec"]["selector"] != {"statefulset.kubernetes.io/pod-name": f"{sts['metadata']['name']}-{i}"}:
            bad.append(f"Service {s['metadata']['name']} does not select pod {i}")
        ports = {p["name"]: p["port"] for p in s["spec"]["ports"]}
        for key, pn in (("EMBER_DATA_PORT", "data"), ("EMBER_GRPC_PORT", "grpc"), ("EMBER_METRICS_PORT", "metrics")):
            if ports.get(pn) != int(cm[key]):
                bad.append(f"Service {s['metadata']['name']} port {pn} is {ports.get(pn)}, {key}={cm[key]}")
    c = sts["spec"]["template"]["spec"]["containers"][0]
    cports = {p["name"]: p["containerPort"] for p in c["ports"]}
    for key, pn in (("EMBER_DATA_PORT", "data"), ("EMBER_GRPC_PORT", "grpc"), ("EMBER_METRICS_PORT", "metrics")):
        if cports.get(pn) != int(cm[key]):
            bad.append(f"server containerPort {pn} is {cports.get(pn)}, {key}={cm[key]}")
    ann = sts["spec"]["template"]["metadata"]["annotations"]
    if ann.get("prometheus.io/port") != cm["EMBER_METRICS_PORT"]:
        bad.append("the servers' prometheus.io/port is not EMBER_METRICS_PORT")
    mounts = {m["mountPath"] for m in c["volumeMounts"]}
    for key in ("PS_SERVER_CKPT_DIR", "PS_SERVER_TIER_DIR"):
        if cm.get(key) and cm[key] not in mounts:
            bad.append(f"{key}={cm[key]} is not a mounted volume (a claim) of the server")
    claims = {t["metadata"]["name"] for t in sts["spec"]["volumeClaimTemplates"]}
    if not {"ckpt", "tier"} <= claims:
        bad.append("the StatefulSet lacks the ckpt and tier claims")
    js = job["spec"]
    w = js["template"]["spec"]["containers"][0]
    world = flag(w["args"], "world")
    if js.get("completionMode") != "Indexed":
        bad.append("the worker Job is not Indexed")
    if not (str(js["completions"]) == str(js["parallelism"]) == world):
        bad.append(f"completions {js['completions']}, parallelism {js['parallelism']}, --world={world} differ")
    train = flag(w["args"], "train") or ""
    if world and len(train.split(",")) % int(world):
        bad.append(f"--train lists {len(train.split(','))} files for {world} ranks")
    for ic in js["template"]["spec"].get("initContainers", []):
        if ic["args"][0] == "datagen" and ic["args"][2] != world:
            bad.append(f"datagen writes {ic['args'][2]} parts for --world={world}")
    if js["template"]["spec"]["restartPolicy"] != "Never":
        bad.append("worker restartPolicy must be Never (a new pod of the same index = kill -9 + restart)")
    ck = flag(w["args"], "ckpt-dir")
    if ck:  # coordinated checkpoints: every rank reads them back, so one shared claim
        mounts = {m["mountPath"]: m["name"] for m in w.get("volumeMounts", [])}
        vols = {v["name"]: v for v in js["template"]["spec"].get("volumes", [])}
        pvc = vols.get(mounts.get(ck), {}).get("persistentVolumeClaim", {}).get("claimName")
        claims = [o for o in docs if o["kind"] == "PersistentVolumeClaim"
                  and o["metadata"]["name"] == pvc]
        if not claims or "ReadWriteMany" not in claims[0]["spec"]["accessModes"]:
            bad.append(f"the workers' --ckpt-dir={ck} is not a mounted ReadWriteMany claim")
    wann = js["template"]["metadata"]["annotations"]
    if wann.get("prometheus.io/port") != flag(w["args"], "metrics-port"):
        bad.append("the workers' prometheus.io/port is not their --metrics-port")
    check_serve(docs, cm, sts, job, bad)
    for b in dict.fromkeys(bad):
        print("check:", b)
    return 1 if bad else 0


def selects(sel, labels):
    return bool(sel) and all(labels.get(k) == v for k, v in sel.items())


def on_claim(docs, podspec, c, path):
    """(claim, path inside it, mounted read-only) of a path in container c; None: not on a claim."""
    vols = {v["name"]: v for v in podspec.get("volumes", [])}
    best = None
    for m in c.get("volumeMounts", []):
        mp = m["mountPath"].rstrip("/")
        if path == mp or path.startswith(mp + "/"):
            if best is None or len(mp) > len(best[0]):
                best = (mp, m)
    if best is None:
        return None
    pvc = vols.get(best[1]["name"], {}).get("persistentVolumeClaim")
    if not pvc:
        return None
    return pvc["claimName"], path[len(best[0]):].strip("/"), best[1].get("readOnly", False)


def check_serve(docs, cm, sts, job, bad):
    """The serving replicas: Deployment ps-serve, its Service, ports, claim, probes."""
    dep = find(docs, "Deployment", "ps-serve")
    svc = find(docs, "Service", "ps-serve")
    ps = dep["spec"]["template"]["spec"]
    tl = dep["spec"]["template"]["metadata"].get("labels", {})
    if not selects(dep["spec"]["selector"].get("matchLabels"), tl):
        bad.append("Deployment ps-serve's selector does not match its pod template's labels")
    if not selects(svc["spec"].get("selector"), tl):
        bad.append("Service ps-serve does not select the ps-serve pods")
    for other in (sts, job):  # and nothing else: no server or worker behind the serving port
        if selects(svc["spec"].get("selector"), other["spec"]["template"]["metadata"].get("labels", {})):
            bad.append(f"Service ps-serve also selects the {other['kind']}'s pods")
    if dep["spec"].get("replicas", 1) < 2:
        bad.append("Deployment ps-serve has fewer than 2 replicas")
    cs = [c for c in ps["containers"] if c["name"] == "ps-serve"]
    if not cs:
        bad.append("Deployment ps-serve has no container ps-serve")
        return
    c = cs[0]
    if c.get("args", [None])[0] != "serve":
        bad.append("the ps-serve container does not run emberps-entrypoint serve")
    sc = ps.get("securityContext", {})
    if not sc.get("runAsNonRoot") or sc.get("seccompProfile", {}).get("type") != "RuntimeDefault":
        bad.append("the ps-serve pods are not runAsNonRoot with seccomp RuntimeDefault")
    if c.get("securityContext", {}).get("allowPrivilegeEscalation") is not False:
        bad.append("the ps-serve container allows privilege escalation")
    if not c.get("resources", {}).get("requests") or not c.get("resources", {}).get("limits"):
        bad.append("the ps-serve container has no resource requests and limits")
    for pr, what in (("readinessProbe", "serve"), ("livenessProbe", "serve-live")):
        if c.get(pr, {}).get("exec", {}).get("command") != ["emberps-entrypoint", "health", what]:
            bad.append(f"the ps-serve {pr} is not emberps-entrypoint health {what}")
    cports = {p["name"]: p["containerPort"] for p in c["ports"]}
    sports = {p["name"]: p for p in svc["spec"]["ports"]}
    for key, pn in (("EMBER_SERVE_GRPC_PORT", "grpc"), ("EMBER_SERVE_METRICS_PORT", "metrics")):
        if key not in cm or cports.get(pn) != int(cm[key]):
            bad.append(f"ps-serve containerPort {pn} is {cports.get(pn)}, {key}={cm.get(key)}")
    g = sports.get("grpc")
    if not g or g["port"] != int(cm.get("EMBER_SERVE_GRPC_PORT", 0)) or g.get("targetPort") not in ("grpc", cports.get("grpc")):
        bad.append("Service ps-serve's grpc port is not the replicas' EMBER_SERVE_GRPC_PORT")
    ann = dep["spec"]["template"]["metadata"].get("annotations", {})
    if ann.get("prometheus.io/port") != cm.get("EMBER_SERVE_METRICS_PORT"):
        bad.append("the replicas' prometheus.io/port is not EMBER_SERVE_METRICS_PORT")
    if cm.get("PS_SERVE_HOST") not in ("0.0.0.0", "::"):
        bad.append("PS_SERVE_HOST does not bind every address: the Service cannot reach the replicas")
    # Every claim a pod mounts exists.
    claims = {o["metadata"]["name"]: o for o in docs if o["kind"] == "PersistentVolumeClaim"}
    for o in (dep, job):
        for v in o["spec"]["template"]["spec"].get("volumes", []):
            cn = v.get("persistentVolumeClaim", {}).get("claimName")
            if cn and cn not in claims:
                bad.append(f"{o['kind']} {o['metadata']['name']} mounts claim {cn}, which is not in the manifests")
    # The published models and the versions: where the Job's rank 0 writes them, on a shared claim.
    js = job["spec"]["template"]["spec"]
    w = js["containers"][0]
    for sflag, wflag in (("publish-dir", "publish-dir"), ("versions", "ckpt-dir")):
        sv, wv = flag(c["args"], sflag), flag(w["args"], wflag)
        if not sv:
            bad.append(f"the ps-serve container gives no --{sflag}")
            continue
        sl, wl = on_claim(docs, ps, c, sv), wv and on_claim(docs, js, w, wv)
        if not sl:
            bad.append(f"ps-serve --{sflag}={sv} is not on a mounted claim")
        elif not wl or sl[:2] != wl[:2]:
            bad.append(f"ps-serve --{sflag}={sv} is not the workers' --{wflag}={wv} (claim and path)")
        elif "ReadWriteMany" not in claims.get(sl[0], {}).get("spec", {}).get("accessModes", []):
            bad.append(f"ps-serve --{sflag}: claim {sl[0]} is not ReadWriteMany")
        elif not sl[2]:
            bad.append(f"ps-serve mounts claim {sl[0]} writable (it only reads it)")


def pod(docs, kind, name, cname, index, root, sets, probe):
    o = find(docs, kind, name)
    ns = o["metadata"].get("namespace", "default")
    spec = o["spec"]["template"]["spec"]
    cs = [c for c in spec.get("containers", []) + spec.get("initContainers", []) if c["name"] == cname]
    if not cs:
        sys.exit(f"{kind}/{name} has no container {cname}")
    c = cs[0]
    podname = f"{name}-{index}"
    env = {"HOSTNAME": podname}
    if kind == "Job" and o["spec"].get("completionMode") == "Indexed":
        env["JOB_COMPLETION_INDEX"] = str(index)
    vols = {v["name"]: v for v in spec.get("volumes", [])}
    paths = {}
    for m in c.get("volumeMounts", []):
        v = vols.get(m["name"], {})
        if "persistentVolumeClaim" in v:  # a named claim: one volume every pod mounting it shares
            host = os.path.join(root, "claims", v["persistentVolumeClaim"]["claimName"])
        else:
            host = os.path.join(root, podname, m["name"])
        paths[m["mountPath"]] = host
        os.makedirs(host, exist_ok=True)
        if "secret" in v:
            sec = find(docs, "Secret", v["secret"]["secretName"])
            for key, val in (sec.get("stringData") or {}).items():
                open(os.path.join(host, key), "w").write(val)
            for key, val in (sec.get("data") or {}).items():
                open(os.path.join(host, key), "wb").write(base64.b64decode(val))

    def sub(s):
        s = str(s)
        for mp, host in sorted(paths.items(), key=lambda x: -len(x[0])):
            s = re.sub(re.escape(mp) + r"(?=/|$|,)", host, s)
        return s.replace("0.0.0.0", "127.0.0.1")

    for ef in c.get("envFrom", []):
        if "configMapRef" in ef:
            env.update(find(docs, "ConfigMap", ef["configMapRef"]["name"])["data"])
    for e in c.get("env", []):
        if "value" in e:
            env[e["name"]] = e["value"]
            continue
        vf = e["valueFrom"]
        if "fieldRef" in vf:
            fp = vf["fieldRef"]["fieldPath"]
            env[e["name"]] = {"metadata.namespace": ns, "status.podIP": "127.0.0.1",
                              "metadata.name": podname}[fp]
        elif "configMapKeyRef" in vf:
            r = vf["configMapKeyRef"]
            env[e["name"]] = find(docs, "ConfigMap", r["name"])["data"][r["key"]]
        elif "secretKeyRef" in vf:
            r = vf["secretKeyRef"]
            env[e["name"]] = find(docs, "Secret", r["name"])["stringData"][r["key"]]
    env = {k: sub(v) for k, v in env.items()}
    for kv in sets:
        k, v = kv.split("=", 1)
        env[k] = v
    here = os.path.dirname(os.path.abspath(__file__))
    entry = os.path.normpath(os.path.join(here, "..", "..", "deploy", "container", "emberps-entrypoint.sh"))
    if probe:
        argv = c[f"{probe}Probe"]["exec"]["command"]
    else:
        argv = (c.get("command") or ["emberps-entrypoint"]) + c.get("args", [])
    argv = [re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), a) for a in argv]
    argv = [sub(a) for a in argv]
    argv = [re.sub(r"^--metrics-port=\d+$", "--metrics-port=0", a) if kind == "Job" else a for a in argv]
    if argv[0] == "emberps-entrypoint":
        argv[0] = entry
    out = ["#!/usr/bin/env bash", f"# {kind}/{name} pod {podname} container {cname}" + (f" ({probe} probe)" if probe else "")]
    # A pod's environment is its own; the sanitizers' options pass through (tests/run.sh --tsan).
    keep = " ".join(f'${{{v}:+{v}="${v}"}}' for v in ("TSAN_OPTIONS", "ASAN_OPTIONS", "UBSAN_OPTIONS"))
    out.append("exec env -i PATH=\"$PATH\" " + keep + " "
               + " ".join(shlex.quote(f"{k}={v}") for k, v in sorted(env.items()))
               + " " + " ".join(shlex.quote(a) for a in argv))
    print("\n".join(out))


def main():
    a = sys.argv[1:]
    if not a:
        sys.exit(__doc__)
    if a[0] == "render":
        print(yaml.safe_dump_all(render(a[1]), sort_keys=False), end="")
    elif a[0] == "check":
        sys.exit(check(load(a[1])))
    elif a[0] == "pod":
        sets, probe, rest = [], None, []
        i = 1
        while i < len(a):
            if a[i] == "--set":
                sets.append(a[i + 1]); i += 2
            elif a[i] == "--probe":
                probe = a[i + 1]; i += 2
            else:
                rest.append(a[i]); i += 1
        path, kind, name, cname, index, root = rest
        pod(load(path), kind, name, cname, int(index), root, sets, probe)
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
