#!/usr/bin/env bash
# etcd_train.sh SRC BIN: a 2-worker job coordinated through a 3-member etcd cluster, whose
# leader is killed with SIGKILL mid-training. Real etcd members on loopback
# (tests/support/etcd_cluster.sh); two ps-servers with replicas whose cluster map and leases live
# in that etcd (--cluster-coordinator=etcd://..., docs/server.md "Replicas and failover"), the
# first one's Coordinator service keeping its state there too (--coordinator-store); two
# ps-workers with --coordinator=etcd://<all members>.
#   - while training, `psctl workers JOB` lists both ranks, through the server (state in etcd)
#     and with --coordinator=etcd://... (etcd directly);
#   - the leader is killed after both workers made progress; both workers finish (exit 0), rank
#     0 reports a test AUC, and the longest gap between rank 0's steps after the kill is printed
#     (etcd's election and the coordinator store's retries: a pause, not an error);
#   - no worker log says its group was lost or re-formed because of the kill, no worker lost a
#     push or rolled back, and no server took another's slots (both kept their leases through
#     etcd's election).
# Exit 77 (skip) without etcd. Every wait is bounded.
set -euo pipefail
src=$1 bin=$2
ec=$src/tests/support/etcd_cluster.sh
command -v etcd >/dev/null || { echo "SKIP: etcd is not installed (deploy/install-deps.sh)"; exit 77; }
tmp=$(mktemp -d /tmp/ember-etcd-train-XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  bash "$ec" stop "$tmp/etcd" >/dev/null 2>&1 || true
  if [ "${keep:-0}" = 1 ]; then echo "kept $tmp"; else rm -rf "$tmp"; fi
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*"
  for f in "$tmp"/*.log; do echo "== $f"; tail -n 20 "$f"; done
  keep=1
  exit 1
}
free_port() {
  /usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

bash "$ec" start "$tmp/etcd" 3 || fail "etcd did not start"
eps=$(cat "$tmp/etcd/endpoints")
url="etcd://$eps/job-test"
echo "etcd members: $eps"

"$bin/ps-datagen" --rows=240000 --test-rows=5000 --out="$tmp/train.tsv" --test-out="$tmp/test.tsv" 2>/dev/null
split -n l/2 -d "$tmp/train.tsv" "$tmp/part-"
dport=$(free_port) gport=$(free_port) dport1=$(free_port)
map="version=1;servers=127.0.0.1:$dport,127.0.0.1:$dport1;slots=0-8191:0,8192-16383:1"
"$bin/ps-server" --port="$dport" --grpc-port="$gport" --metrics-port=-1 --tables=name=emb,dim=8 \
  --coordinator --coordinator-store="$url" --cluster-map="$map" --cluster-coordinator="$url" \
  --log-level=info >"$tmp/server.log" 2>&1 &
pids+=($!)
"$bin/ps-server" --port="$dport1" --grpc-port=0 --metrics-port=-1 --tables=name=emb,dim=8 \
  --cluster-map="$map" --cluster-coordinator="$url" --log-level=info >"$tmp/server1.log" 2>&1 &
pids+=($!)
replicated=0 # both servers up, the map in etcd naming backups
for ((t = 0; t < 150; t++)); do
  m=$("$bin/psctl" --server="127.0.0.1:$gport" --timeout-ms=1000 map 2>/dev/null || true)
  if grep -q "0-8191:0/1" <<<"$m" && grep -q "8192-16383:1/0" <<<"$m"; then replicated=1; break; fi
  sleep 0.1
done
[ $replicated = 1 ] || fail "the servers did not publish a replicated map: $m"
grep -q "state kept in etcd" "$tmp/server.log" || fail "the server does not keep its coordinator state in etcd"
grep -q "cluster map and leases in etcd://" "$tmp/server1.log" || fail "server 1 does not keep the map in etcd"

common=(--servers="127.0.0.1:$dport" --coordinator="$url" --world=2 --dim=8 --bottom=32,8
        --batch=256 --train="$tmp/part-00,$tmp/part-01" --job=etcdjob --lease-ms=3000
        --progress-every=0 --log-level=info)
"$bin/ps-worker" "${common[@]}" --rank=1 --json >"$tmp/w1.json" 2>"$tmp/w1.log" &
w1=$! pids+=($w1)
"$bin/ps-worker" "${common[@]}" --rank=0 --test="$tmp/test.tsv" --step-log="$tmp/steps0" --json \
  >"$tmp/w0.json" 2>"$tmp/w0.log" &
w0=$! pids+=($w0)

# both ranks listed through the server's Coordinator service (its state is etcd's)
listed=0
for ((t = 0; t < 300; t++)); do
  out=$("$bin/psctl" --server="127.0.0.1:$gport" --timeout-ms=2000 workers etcdjob 2>/dev/null || true)
  if [ "$(awk '$2 == "training"' <<<"$out" | wc -l)" -eq 2 ]; then listed=1; break; fi
  kill -0 $w0 2>/dev/null || fail "rank 0 ended early"
  sleep 0.1
done
[ $listed = 1 ] || fail "psctl workers did not list both ranks training: $out"
echo "psctl workers etcdjob (through the server, from etcd):"
echo "$out"
direct=$("$bin/psctl" --coordinator="$url" --timeout-ms=5000 workers etcdjob) ||
  fail "psctl --coordinator=etcd://... workers"
[ "$(awk '$2 == "training" || $2 == "joining"' <<<"$direct" | wc -l)" -eq 2 ] ||
  fail "psctl --coordinator=$url workers does not list both ranks: $direct"
echo "psctl --coordinator=etcd://... workers etcdjob (etcd directly): $(wc -l <<<"$direct") lines"
steps_before=0 # mid-training: after rank 0's 20th step
for ((t = 0; t < 300; t++)); do
  steps_before=$(grep -c " end " "$tmp/steps0" 2>/dev/null || true)
  [ "${steps_before:-0}" -ge 20 ] && break
  kill -0 $w0 2>/dev/null || fail "rank 0 ended early"
  sleep 0.1
done
[ "${steps_before:-0}" -ge 20 ] || fail "rank 0 did not reach step 20 in 30 s"
leader=$(bash "$ec" leader "$tmp/etcd") || fail "no etcd leader"
killed_ns=$(/usr/bin/python3 -c 'import time; print(time.monotonic_ns())') # the step log's clock
bash "$ec" kill "$tmp/etcd" "$leader"
echo "etcd leader (member $leader) killed with SIGKILL after rank 0's step $steps_before"

for w in $w0 $w1; do
  ok=0
  for ((t = 0; t < 1200; t++)); do
    kill -0 $w 2>/dev/null || { ok=1; break; }
    sleep 0.1
  done
  [ $ok = 1 ] || fail "a worker did not finish within 120 s"
  rc=0
  wait $w || rc=$?
  [ $rc -eq 0 ] || fail "a worker exited $rc"
done
/usr/bin/python3 - "$tmp/w0.json" "$tmp/steps0" "$killed_ns" <<'PY' || fail "rank 0's summary"
import json, sys
w0 = json.load(open(sys.argv[1]))
# step log lines: rank round start|end CLOCK_MONOTONIC-ns
ev = {}
for line in open(sys.argv[2]):
    f = line.split()
    if len(f) == 4:
        ev.setdefault(int(f[1]), {})[f[2]] = int(f[3])
steps = sorted((e["start"], e["end"]) for e in ev.values() if "start" in e and "end" in e)
killed = int(sys.argv[3])
after = [s for s in steps if s[1] >= killed]
gaps = [b[0] - a[1] for a, b in zip(steps, steps[1:]) if b[0] >= killed]
print(f"rank 0: {w0['samples']} samples, test AUC {w0.get('auc')}, {len(after)} steps after the "
      f"kill; longest gap between steps after it: {max(gaps, default=0) / 1e9:.2f} s")
assert w0.get("auc") and w0["auc"] > 0.6, "rank 0's test AUC"
assert w0["lost_pushes"] == 0 and w0["rollbacks"] == 0, "rank 0 lost pushes or rolled back"
assert len(after) > 10, "the job went on after the kill"
PY
if grep -qiE "generation [1-9]|lost worker|group .*re-?form" "$tmp/w0.log" "$tmp/w1.log"; then
  fail "the etcd leader's death disturbed the worker group"
fi
if grep -qE "lost its lease|came back without its rows" "$tmp/server.log" "$tmp/server1.log"; then
  fail "the etcd leader's death made a server take another's slots"
fi
grep -hE "lease lapsed|confirmed as primary" "$tmp/server.log" "$tmp/server1.log" | tail -n 4 || true
echo "PASS: a 2-worker job on 2 replicated servers went on through the etcd leader's death"
