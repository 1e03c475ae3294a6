#!/usr/bin/env bash
# deploy/quickstart.sh: the main job, end to end on one machine (a fresh Debian 12, as root).
#
# Installs the dependencies (apt), builds, generates a Criteo-format dataset with ps-datagen
# (a planted model, so the best possible AUC is known), starts 2 servers (server 0 is also the
# coordinator) and 2 workers on loopback, trains one epoch in sync mode with a live progress
# line, prints the final AUC next to the oracle's, answers an online Lookup of a trained
# embedding through psctl, and stops everything cleanly. A ps-serve replica follows the servers
# from the start (docs/serving.md): while training still runs it scores the test file's first
# rows through Predict (the scores, the model version and the sparse watermark are printed).
# Everything lands in run/quickstart/ (data, cluster logs and checkpoints, worker logs, the
# published models and the replica's log).
#
#   deploy/quickstart.sh                       # 500k training rows
#   QUICKSTART_ROWS=2000000 deploy/quickstart.sh
#   QUICKSTART_BASE_PORT=17400 deploy/quickstart.sh   # if 7400.. are taken
#   deploy/quickstart.sh --secure              # TLS on both planes and a token (local-cluster.sh)
set -euo pipefail
secure=()
for a in "$@"; do
  case "$a" in
    --secure) secure=(--secure) ;;
    *) echo "usage: deploy/quickstart.sh [--secure]" >&2; exit 2 ;;
  esac
done
cd "$(dirname "$0")/.."
rows=${QUICKSTART_ROWS:-500000}
base=${QUICKSTART_BASE_PORT:-7400}
run=run/quickstart
bin=build/bin

echo "== dependencies"
deploy/install-deps.sh
echo "== build (build/, Release)"
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j2 --target programs >build/build.log 2>&1 ||
  { tail -n 30 build/build.log; exit 1; } # (the tests: README's second command builds them)

# a cluster an earlier run left up (killed with it) goes first: its files are removed next
deploy/local-cluster.sh down --dir="$run/cluster" >/dev/null 2>&1 || true
rm -rf "$run"
mkdir -p "$run/data" "$run/workers"
echo "== data: $rows training rows, $((rows / 10)) test rows (ps-datagen)"
$bin/ps-datagen --rows="$rows" --test-rows=$((rows / 10)) --out="$run/data/train.tsv" \
  --test-out="$run/data/test.tsv" --oracle-out="$run/data/oracle.json" 2>"$run/data/datagen.log" ||
  { tail -n 5 "$run/data/datagen.log"; exit 1; }
split -n l/2 -d "$run/data/train.tsv" "$run/data/part-" # one file per worker (rank i: part-0i)
rm "$run/data/train.tsv"

echo "== cluster: 2 servers (server 0 also the coordinator)"
cluster() { deploy/local-cluster.sh "$@" --dir="$run/cluster" --base-port="$base"; }
workers=()
serve_pid=""
cleanup() {
  for p in "${workers[@]}"; do kill "$p" 2>/dev/null || true; done
  [ -n "$serve_pid" ] && kill "$serve_pid" 2>/dev/null || true # (set -e stops a trap early)
  cluster down >/dev/null 2>&1 || true
}
trap cleanup EXIT
cluster up "${secure[@]}"
tls=() # with --secure: the cluster's CA for every client, its token through the environment
if [ ${#secure[@]} -gt 0 ]; then
  tls=(--tls-ca="$run/cluster/tls/ca.pem")
  PS_WORKER_TOKEN=$(cat "$run/cluster/token") PSCTL_TOKEN=$(cat "$run/cluster/token")
  export PS_WORKER_TOKEN PSCTL_TOKEN
fi

echo "== serving: a ps-serve replica follows the servers (gRPC port $((base + 200)))"
serve_tls=() # the replica speaks to the servers like the workers do, and serves plaintext gRPC
if [ ${#tls[@]} -gt 0 ]; then
  serve_tls=(--follow-tls-ca="$run/cluster/tls/ca.pem")
  PS_SERVE_FOLLOW_TOKEN=$(cat "$run/cluster/token")
  export PS_SERVE_FOLLOW_TOKEN
fi
$bin/ps-serve "${serve_tls[@]}" --follow="$(cat "$run/cluster/cluster.map")" \
  --publish-dir="$run/publish" --grpc-port=$((base + 200)) --metrics-port=$((base + 2200)) \
  >"$run/serve.log" 2>&1 &
serve_pid=$!

echo "== training: 2 workers, sync mode, DLRM (dim 16, 13-64-16, 128-64-1), batch 1024"
common=("${tls[@]}" --servers="$(cat "$run/cluster/cluster.map")" --coordinator="$(cat "$run/cluster/coordinator")"
        --world=2 --train="$run/data/part-00,$run/data/part-01" --job=quickstart)
$bin/ps-worker "${common[@]}" --rank=1 --progress-every=0 --json \
  >"$run/workers/worker-1.json" 2>"$run/workers/worker-1.log" &
workers+=($!)
$bin/ps-worker "${common[@]}" --rank=0 --test="$run/data/test.tsv" --progress-every=50000 \
  --save-dense="$run/workers/dense.model" --publish-dir="$run/publish" --publish-every=20 --json \
  >"$run/workers/worker-0.json" 2> >(tee "$run/workers/worker-0.log" >&2) &
workers+=($!)
scored=0 # the replica scores the first test rows once a published model has reached it
while [ $scored = 0 ] && kill -0 "${workers[1]}" 2>/dev/null; do
  if $bin/psctl --server=127.0.0.1:$((base + 200)) serve predict "$run/data/test.tsv" 5 \
    >"$run/predict.txt" 2>/dev/null; then
    scored=1
    echo "== online Predict while training runs: \$ psctl --server=127.0.0.1:$((base + 200)) serve predict $run/data/test.tsv 5"
    cat "$run/predict.txt"
  else
    sleep 1
  fi
done
for p in "${workers[@]}"; do # each worker's status: a failure says which, from its log
  wait "$p" || { tail -n 20 "$run"/workers/worker-*.log; echo "quickstart: a worker failed" >&2; exit 1; }
done
workers=()
for _ in $(seq 20); do # a short run may end before the first published model reached the replica
  [ $scored = 1 ] && break
  if $bin/psctl --server=127.0.0.1:$((base + 200)) serve predict "$run/data/test.tsv" 5 \
    >"$run/predict.txt" 2>/dev/null; then
    scored=1
    echo "== online Predict after training: \$ psctl --server=127.0.0.1:$((base + 200)) serve predict $run/data/test.tsv 5"
    cat "$run/predict.txt"
  else
    sleep 0.5
  fi
done
[ $scored = 1 ] || echo "(the replica had no model: see $run/serve.log)"

python_free_json() { # the number after "key": in a one-line JSON file
  sed -n "s/.*\"$2\":\([-0-9.e+]*\).*/\1/p" "$1"
}
auc=$(python_free_json "$run/workers/worker-0.json" auc)
logloss=$(python_free_json "$run/workers/worker-0.json" logloss)
sps=$(python_free_json "$run/workers/worker-0.json" samples_per_s)
oauc=$(python_free_json "$run/data/oracle.json" oracle_auc)
ologloss=$(python_free_json "$run/data/oracle.json" oracle_logloss)
printf '== result: test AUC %.4f (oracle %.4f), logloss %.4f (oracle %.4f); %.0f samples/s per worker\n' \
  "$auc" "$oauc" "$logloss" "$ologloss" "$sps"

echo "== online lookup: the embedding of field 0's value in the first test row that has one"
value=$(awk -F'\t' '$15 != "" { print $15; exit }' "$run/data/test.tsv")
read -r key _ _ _ owner < <($bin/psctl "${tls[@]}" --server=127.0.0.1:$((base + 100)) key 0 "$value")
echo "\$ psctl ${tls[*]} --server=127.0.0.1:$((base + 100 + owner)) lookup emb $key"
$bin/psctl "${tls[@]}" --server=127.0.0.1:$((base + 100 + owner)) lookup emb "$key"

echo "== the replica after training: \$ psctl --server=127.0.0.1:$((base + 200)) serve status"
$bin/psctl --server=127.0.0.1:$((base + 200)) serve status || true

echo "== stopping (servers checkpoint on the way out)"
trap - EXIT
kill "$serve_pid" 2>/dev/null && wait "$serve_pid" 2>/dev/null || true
cluster down
echo "done: data, logs and checkpoints are in $run/"
