#!/usr/bin/env bash
# k8s_validate.sh SRC BIN VENV: deploy/k8s rendered as `kubectl apply -k` would (kubectl kustomize
# when there is a kubectl; always also tests/deploy/k8s_tool.py render, and the two must agree),
# validated offline against the Kubernetes 1.37 schemas (kubernetes-validate --strict, from the
# venv deploy/install-deps.sh --venv makes), the layout's cross-references (k8s_tool.py check:
# replicas, Services, ports, world, claims, the ps-serve Deployment and Service), and every
# setting the manifests and emberps-entrypoint give the programs is one they have (PS_SERVER_*
# in ps-server --print-config, PS_SERVE_* in ps-serve --print-config; the worker's flags in
# ps-worker --help, the replicas' in ps-serve --help): the programs ignore unknown variables, so
# a misspelt one would be silent.
set -euo pipefail
src=$1 bin=$2 venv=$3
py=/usr/bin/python3
tool=$src/tests/deploy/k8s_tool.py
$py -c 'import yaml' 2>/dev/null || { echo "SKIP: no python3-yaml (deploy/install-deps.sh)"; exit 77; }
[ -x "$venv/bin/kubernetes-validate" ] ||
  { echo "SKIP: no $venv/bin/kubernetes-validate (deploy/install-deps.sh --venv=$venv; PyPI unreachable?)"; exit 77; }
tmp=$(mktemp -d /tmp/k8s-validate.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
$py "$tool" render "$src/deploy/k8s" >"$tmp/all.yaml"
if command -v kubectl >/dev/null && kubectl kustomize "$src/deploy/k8s" >"$tmp/kubectl.yaml" 2>"$tmp/err"; then
  $py - "$tmp/all.yaml" "$tmp/kubectl.yaml" <<'PY' || { echo "FAIL: k8s_tool.py render and kubectl kustomize differ"; exit 1; }
import sys, yaml
k = lambda o: (o["kind"], o["metadata"]["name"])
a, b = (sorted(yaml.safe_load_all(open(p)), key=k) for p in sys.argv[1:])
sys.exit(0 if a == b else 1)
PY
  echo "kubectl kustomize and k8s_tool.py render agree"
  cp "$tmp/kubectl.yaml" "$tmp/all.yaml"
else
  echo "no kubectl: rendered with k8s_tool.py render only"
fi
"$venv/bin/kubernetes-validate" --strict --quiet -k 1.37.0 "$tmp/all.yaml" || { echo "FAIL: kubernetes-validate"; exit 1; }
$py "$tool" check "$tmp/all.yaml" || { echo "FAIL: k8s_tool.py check"; exit 1; }
bad=0
entry=$src/deploy/container/emberps-entrypoint.sh
known=$("$bin/ps-server" --print-config | sed -n 's/^\([a-z_0-9]*\) = .*/\1/p' | tr a-z A-Z)
for v in $(cat "$tmp/all.yaml" "$entry" | grep -o 'PS_SERVER_[A-Z_0-9]\+' | sort -u); do
  grep -qx "${v#PS_SERVER_}" <<<"$known" || { echo "FAIL: $v is not a ps-server setting"; bad=1; }
done
[ -x "$bin/ps-serve" ] || { echo "FAIL: no $bin/ps-serve"; exit 1; }
known=$("$bin/ps-serve" --print-config | sed -n 's/^\([a-z_0-9]*\) = .*/\1/p' | tr a-z A-Z)
nserve=0
for v in $(cat "$tmp/all.yaml" "$entry" | grep -o 'PS_SERVE_[A-Z_0-9]\+' | sort -u); do
  nserve=$((nserve + 1))
  grep -qx "${v#PS_SERVE_}" <<<"$known" || { echo "FAIL: $v is not a ps-serve setting"; bad=1; }
done
[ $nserve -gt 0 ] || { echo "FAIL: no PS_SERVE_* setting found (the ConfigMap sets PS_SERVE_HOST)"; bad=1; }
whelp=$("$bin/ps-worker" --help 2>&1)
for f in $($py -c '
import sys, yaml
for o in yaml.safe_load_all(open(sys.argv[1])):
    if o["kind"] == "Job":
        for c in o["spec"]["template"]["spec"]["containers"]:
            print(" ".join(a.split("=")[0] for a in c["args"][1:]))' "$tmp/all.yaml") \
    --servers --rank --coordinator --host --token; do # the last: what emberps-entrypoint adds
  grep -q -- "^  $f=" <<<"$whelp" || { echo "FAIL: ps-worker has no $f"; bad=1; }
done
shelp=$("$bin/ps-serve" --help 2>&1)
for f in $($py -c '
import sys, yaml
for o in yaml.safe_load_all(open(sys.argv[1])):
    if o["kind"] == "Deployment" and o["metadata"]["name"] == "ps-serve":
        for c in o["spec"]["template"]["spec"]["containers"]:
            print(" ".join(a.split("=")[0] for a in c["args"][1:]))' "$tmp/all.yaml") \
    --follow --grpc-port --metrics-port --follow-tls-ca --follow-tls-cert --follow-tls-key; do
  grep -q -- "^  $f=" <<<"$shelp" || { echo "FAIL: ps-serve has no $f"; bad=1; }
done
# and what emberps-entrypoint adds: the serve) branch's flags, the follow=(...) TLS flags
for f in $({ sed -n '/^  serve)$/,/;;$/p' "$entry"; grep -o -- '--follow-[a-z-]*=' "$entry"; } |
    grep -o -- '--[a-z][a-z-]*=' | tr -d = | sort -u); do
  grep -q -- "^  $f=" <<<"$shelp" || { echo "FAIL: emberps-entrypoint serve gives ps-serve $f, which it lacks"; bad=1; }
done
[ $bad = 0 ] && echo "PASS: manifests valid"
exit $bad
