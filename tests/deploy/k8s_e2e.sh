#!/usr/bin/env bash
# k8s_e2e.sh SRC BIN: the deploy/k8s layout end to end on this machine, without a cluster.
#
# Every command and environment comes from the rendered manifests (tests/deploy/k8s_tool.py pod:
# the containers' args, probes, ConfigMap, Secret, downward API), so they cannot drift. What
# differs from Kubernetes, all of it (k8s_tool.py's docstring has the details):
#   - DNS: a getent on PATH answers 127.0.0.1 for the per-server Services
#     (ps-server-<i>.<namespace>.svc), which emberps-entrypoint resolves into the cluster map;
#   - ports: every server on 127.0.0.1, so EMBER_PORT_STRIDE=1 (server i: port + i) from a free
#     base instead of 7400/7500/9400; workers' /metrics on any free port;
#   - volumes: directories under a temp dir; 0.0.0.0 -> 127.0.0.1; fewer generated rows;
#   - the kubelet: this script (start, readiness probe, SIGKILL, restart, SIGTERM).
# 2 servers (StatefulSet pods 0 and 1, server 0 the coordinator) and 2 workers (Indexed Job
# pods 0 and 1, datagen init container first) train with TLS on both planes and the token (the
# Secret gets tls.crt, tls.key and ca.crt, made by deploy/make-certs.sh for 127.0.0.1, as
# `kubectl create secret --from-file` would put them) and coordinated checkpoints into the
# shared claim; worker 1 is killed with SIGKILL mid-run and started again with the same command
# (a replacement pod of the same index); both must finish, the shared claim must hold a job
# checkpoint naming both servers; the servers stop on SIGTERM with a checkpoint and exit 0.
# A serving replica (a pod of the Deployment ps-serve, started with the servers as the Deployment
# would be) follows both servers over TLS with the token, takes the models rank 0 publishes into
# the shared claim, and scores the test file's first rows through psctl serve predict (what
# `kubectl exec ... psctl serve predict` runs) once it serves the job's last published model; it
# stops on SIGTERM with exit 0. Not run here: a real cluster (no kind, no registry, no image), so
# neither the Service's load balancing nor the Deployment's rollout is exercised.
# K8S_E2E_ETCD=1: the same with EMBER_COORDINATOR set to an etcd member started here (the
# workers coordinate through etcd, server 0's Coordinator service keeps its state there).
set -euo pipefail
src=$1 bin=$2
py=/usr/bin/python3
tool=$src/tests/deploy/k8s_tool.py
if ! $py -c 'import yaml' 2>/dev/null; then
  echo "SKIP: /usr/bin/python3 has no yaml module (apt-get install python3-yaml: deploy/install-deps.sh)"
  exit 77
fi
for p in ps-server ps-worker ps-serve psctl ps-datagen; do
  [ -x "$bin/$p" ] || { echo "FAIL: no $bin/$p"; exit 1; }
done

tmp=$(mktemp -d /tmp/k8s-e2e.XXXXXX)
pids=()
cleanup() {
  local p
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  [ -d "$tmp/etcd" ] && bash "$src/tests/support/etcd_cluster.sh" stop "$tmp/etcd" >/dev/null 2>&1
  if [ "${keep:-0}" = 1 ]; then echo "kept $tmp"; else rm -rf "$tmp"; fi
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*"
  for f in "$tmp"/logs/*; do echo "== $f"; tail -n 25 "$f"; done
  keep=1
  exit 1
}

# Render as kubectl apply -k would (kubectl kustomize when there is a kubectl, else the
# renderer of the subset deploy/k8s uses).
if command -v kubectl >/dev/null && kubectl kustomize "$src/deploy/k8s" >"$tmp/all.yaml" 2>/dev/null; then
  echo "rendered with kubectl kustomize"
else
  $py "$tool" render "$src/deploy/k8s" >"$tmp/all.yaml"
  echo "rendered with k8s_tool.py render"
fi
ns=$($py -c 'import sys, yaml; print([o for o in yaml.safe_load_all(open(sys.argv[1])) if o["kind"] == "StatefulSet"][0]["metadata"]["namespace"])' "$tmp/all.yaml")

# TLS material into the Secret (tls.crt, tls.key, ca.crt), which turns TLS on everywhere.
bash "$src/deploy/make-certs.sh" "$tmp/certs" >/dev/null 2>&1 || fail "deploy/make-certs.sh"
$py - "$tmp/all.yaml" "$tmp/certs" <<'EOF' || fail "adding the TLS files to the Secret"
import sys, yaml
docs = list(yaml.safe_load_all(open(sys.argv[1])))
d = sys.argv[2]
sec = [o for o in docs if o["kind"] == "Secret" and o["metadata"]["name"] == "emberps-secret"][0]
for key, f in (("tls.crt", "server.pem"), ("tls.key", "server.key"), ("ca.crt", "ca.pem")):
    sec["stringData"][key] = open(f"{d}/{f}").read()
yaml.safe_dump_all(docs, open(sys.argv[1], "w"))
EOF

# getent: the cluster's DNS for the per-server Services, the system's for anything else.
mkdir -p "$tmp/shim" "$tmp/logs"
cat >"$tmp/shim/getent" <<EOF
#!/bin/sh
case "\$2" in
  ps-server-[0-9]*.$ns.svc) echo "127.0.0.1       STREAM \$2"; exit 0 ;;
esac
exec /usr/bin/getent "\$@"
EOF
chmod +x "$tmp/shim/getent"
export PATH="$tmp/shim:$bin:$PATH"

# (below 32768, where Linux's ephemeral ports start: above it any test's outgoing connection
# could hold one of these, as it once held the replica's metrics port)
base=$((20000 + ($$ % 600) * 20))
sets=(--set EMBER_PORT_STRIDE=1 --set EMBER_DATA_PORT=$base --set EMBER_GRPC_PORT=$((base + 5))
      --set EMBER_METRICS_PORT=$((base + 10)) --set EMBER_DATAGEN_ROWS=300000
      --set EMBER_DATAGEN_TEST_ROWS=5000 --set EMBER_JOBCKPT_EVERY=40
      --set EMBER_SERVE_GRPC_PORT=$((base + 15)) --set EMBER_SERVE_METRICS_PORT=$((base + 16)))
if [ "${K8S_E2E_ETCD:-0}" = 1 ]; then
  bash "$src/tests/support/etcd_cluster.sh" start "$tmp/etcd" 1 || exit $?
  sets+=(--set "EMBER_COORDINATOR=etcd://$(cat "$tmp/etcd/endpoints")/k8s-e2e")
  echo "coordinator: etcd at $(cat "$tmp/etcd/endpoints")"
fi
gen() { $py "$tool" pod "$tmp/all.yaml" "$@" "$tmp/pods" "${sets[@]}"; }
for i in 0 1; do
  gen StatefulSet ps-server ps-server $i >"$tmp/server-$i.sh"
  $py "$tool" pod "$tmp/all.yaml" StatefulSet ps-server ps-server $i "$tmp/pods" "${sets[@]}" \
    --probe readiness >"$tmp/ready-$i.sh"
  gen Job ps-worker datagen $i >"$tmp/datagen-$i.sh"
  gen Job ps-worker ps-worker $i >"$tmp/worker-$i.sh"
done
gen Deployment ps-serve ps-serve 0 >"$tmp/serve-0.sh"
gen Deployment ps-serve ps-serve 0 --probe readiness >"$tmp/serve-ready-0.sh"
gen Deployment ps-serve ps-serve 0 --probe liveness >"$tmp/serve-live-0.sh"
echo "server 1 runs: $(tail -n 1 "$tmp/server-1.sh" | grep -o 'emberps-entrypoint.sh.*')"
echo "replica runs: $(tail -n 1 "$tmp/serve-0.sh" | grep -o 'emberps-entrypoint.sh.*')"
echo "worker 1 runs: $(tail -n 1 "$tmp/worker-1.sh" | grep -o 'emberps-entrypoint.sh.*')"
t0=$(date +%s)

# The StatefulSet's pods (podManagementPolicy Parallel: together).
spids=()
for i in 0 1; do
  bash "$tmp/server-$i.sh" >"$tmp/logs/server-$i.log" 2>&1 &
  pids+=($!) spids+=($!)
done
for i in 0 1; do # the readiness probe, as the kubelet runs it: bounded
  ok=0
  for ((t = 0; t < 100; t++)); do
    if bash "$tmp/ready-$i.sh" 2>/dev/null; then ok=1; break; fi
    kill -0 "${spids[$i]}" 2>/dev/null || fail "server $i exited before it was ready"
    sleep 0.2
  done
  [ $ok = 1 ] || fail "server $i not ready in 20 s"
done
echo "servers ready after $(($(date +%s) - t0)) s"

# The Deployment's pod (one here: two would share 127.0.0.1's ports): follows both servers.
bash "$tmp/serve-0.sh" >"$tmp/logs/serve-0.log" 2>&1 &
pids+=($!) rpid=$!
ok=0
for ((t = 0; t < 100; t++)); do
  if bash "$tmp/serve-live-0.sh" 2>/dev/null; then ok=1; break; fi
  kill -0 "$rpid" 2>/dev/null || fail "the replica exited before it was live"
  sleep 0.2
done
[ $ok = 1 ] || fail "the replica not live in 20 s"
bash "$tmp/serve-ready-0.sh" 2>/dev/null && fail "the replica is ready before any model was published"
echo "replica live (not ready: no model yet) after $(($(date +%s) - t0)) s"

# The Job's pods: the init container, then the worker.
for i in 0 1; do
  bash "$tmp/datagen-$i.sh" >"$tmp/logs/datagen-$i.log" 2>&1 || fail "datagen $i failed"
done
wpids=()
for i in 0 1; do
  bash "$tmp/worker-$i.sh" >"$tmp/worker-$i.json" 2>"$tmp/logs/worker-$i.log" &
  pids+=($!) wpids+=($!)
done

# Rank 1's step at the coordinator (server 0's gRPC port), through psctl as an operator would.
token=$(cat "$tmp/pods/ps-server-0/secret/token")
step1() {
  psctl --server=127.0.0.1:$((base + 5)) --token="$token" --tls-ca="$tmp/certs/ca.pem" \
    --timeout-ms=2000 workers emberps \
    2>/dev/null | awk '$1 == "1" && $2 == "training" { print $4 }'
}
killed_at=""
for ((t = 0; t < 300; t++)); do
  s=$(step1 || true)
  if [ -n "$s" ] && [ "$s" -ge 10 ]; then killed_at=$s; break; fi
  kill -0 "${wpids[1]}" 2>/dev/null || fail "worker 1 ended before step 10 (data too small?)"
  sleep 0.1
done
[ -n "$killed_at" ] || fail "worker 1 did not reach step 10 in 30 s"
kill -9 "${wpids[1]}"
wait "${wpids[1]}" 2>/dev/null || true
echo "worker 1 killed with SIGKILL at step $killed_at; started again with the same command"
mv "$tmp/logs/worker-1.log" "$tmp/logs/worker-1-killed.log"
bash "$tmp/worker-1.sh" >"$tmp/worker-1.json" 2>"$tmp/logs/worker-1.log" &
pids+=($!) wpids[1]=$!

for i in 0 1; do
  done_=0
  for ((t = 0; t < 600; t++)); do
    kill -0 "${wpids[$i]}" 2>/dev/null || { done_=1; break; }
    sleep 0.1
  done
  [ $done_ = 1 ] || fail "worker $i did not finish within 60 s of the restart"
  rc=0
  wait "${wpids[$i]}" || rc=$?
  [ $rc -eq 0 ] || fail "worker $i exited $rc"
done
$py - "$tmp/worker-0.json" "$tmp/worker-1.json" <<'EOF' || fail "the workers' summaries"
import json, sys
w0 = json.load(open(sys.argv[1]))
w1 = json.load(open(sys.argv[2]))
auc = w0.get("auc")
print(f"rank 0: {w0['samples']} samples, test AUC {auc}; the restarted rank 1 read the rest of "
      f"its share: {w1['samples']} samples")
assert auc is not None and auc > 0.6, "rank 0's test AUC"
# The replacement continued the killed worker's share at its recorded position: it read the rest.
assert 0 < w1["samples"] < w0["samples"] - 1000, "the restarted rank 1 did not resume mid-share"
EOF
grep -q -i "rejoin\|generation" "$tmp/logs/worker-1.log" "$tmp/logs/worker-0.log" ||
  fail "no worker log line about the rejoin (generation)"
grep -q -i "TLS" "$tmp/logs/server-0.log" || fail "server 0 does not say it serves TLS"
if [ "${K8S_E2E_ETCD:-0}" = 1 ]; then # the job's state is in etcd, not in server 0
  grep -q "state kept in etcd" "$tmp/logs/server-0.log" || fail "server 0 does not keep its state in etcd"
  keys=$(ETCDCTL_API=3 timeout 10 etcdctl --endpoints="$(cat "$tmp/etcd/endpoints")" get --prefix \
    --keys-only /k8s-e2e/emberps/ | grep -c . || true)
  [ "$keys" -gt 0 ] || fail "no job keys under /k8s-e2e/ in etcd"
  echo "etcd holds $keys keys of the job under /k8s-e2e/emberps/"
fi

# The job's coordinated checkpoints, in the claim both worker pods mount.
jc=$tmp/pods/claims/emberps-jobckpt
[ -s "$jc/LATEST" ] || fail "no coordinated checkpoint (LATEST) in the shared claim"
step=$(cat "$jc/LATEST")
man=$jc/$(printf 'step-%020d' "$step")/manifest
grep -Eq '^servers [0-9]+ [0-9]+$' "$man" ||
  fail "the job checkpoint of step $step does not name both servers' checkpoints"
echo "coordinated checkpoint of step $step in the shared claim: $(tr '\n' ';' <"$man")"

# Scoring through the replica, as `kubectl exec deploy/ps-serve -- psctl serve predict` would:
# once it serves the last model rank 0 published into the shared claim.
pub=$jc/publish
last=$(find "$pub" -maxdepth 1 -name 'dense-*' -printf '%f\n' 2>/dev/null | sed 's/^dense-0*//' | sort -n | tail -n 1)
[ -n "$last" ] || fail "rank 0 published no dense model into the shared claim ($pub)"
sport=$((base + 15))
rctl=(psctl --server="127.0.0.1:$sport" --token="$token" --tls-ca="$tmp/certs/ca.pem" --timeout-ms=5000)
v=""
for ((t = 0; t < 200; t++)); do
  v=$("${rctl[@]}" --json serve status 2>/dev/null | $py -c 'import json, sys; print(json.load(sys.stdin)["model_version"])' || true)
  [ "$v" = "$last" ] && break
  kill -0 "$rpid" 2>/dev/null || fail "the replica exited"
  sleep 0.1
done
[ "$v" = "$last" ] || fail "the replica serves model version '$v', not rank 0's last published $last, after 20 s"
bash "$tmp/serve-ready-0.sh" 2>/dev/null || fail "the replica serves a model but is not ready"
"${rctl[@]}" serve status >"$tmp/serve-status.txt" 2>&1 || fail "psctl serve status: $(cat "$tmp/serve-status.txt")"
# the lines piped in, as deploy/k8s/README.md does it (the pod's root filesystem is read-only)
head -n 8 "$tmp/pods/ps-worker-0/data/test.tsv" | "${rctl[@]}" serve predict /dev/stdin 8 >"$tmp/predict.txt" 2>&1 ||
  fail "psctl serve predict: $(cat "$tmp/predict.txt")"
n=$(awk '$1 ~ /^[0-9.e-]+$/ && $1 >= 0 && $1 <= 1 && NF == 1' "$tmp/predict.txt" | wc -l)
[ "$n" -eq 8 ] || fail "psctl serve predict: $n probabilities, not 8: $(cat "$tmp/predict.txt")"
grep -q "^model version $last " "$tmp/predict.txt" || fail "the scores are not of model version $last"
[ "$(grep -c ': following' "$tmp/serve-status.txt")" -eq 2 ] ||
  fail "the replica does not follow both servers: $(cat "$tmp/serve-status.txt")"
echo "replica: $(head -n 1 "$tmp/serve-status.txt"); scores: $(head -n 8 "$tmp/predict.txt" | tr '\n' ' ')"
grep -q "TLS" "$tmp/logs/serve-0.log" || fail "the replica does not say it serves TLS"
kill -TERM "$rpid"
rc=0
wait "$rpid" || rc=$?
[ $rc -eq 0 ] || fail "the replica exited $rc on SIGTERM"
echo "replica scored 8 test rows with model version $last and stopped on SIGTERM"

# The StatefulSet's pods stop: SIGTERM, a checkpoint, exit 0 (terminationGracePeriodSeconds).
for i in 0 1; do kill -TERM "${spids[$i]}"; done
for i in 0 1; do
  rc=0
  wait "${spids[$i]}" || rc=$?
  [ $rc -eq 0 ] || fail "server $i exited $rc on SIGTERM"
  [ -n "$(ls -A "$tmp/pods/ps-server-$i/ckpt")" ] || fail "server $i wrote no checkpoint into its claim"
done
echo "PASS: k8s layout end to end in $(($(date +%s) - t0)) s"
