#!/usr/bin/env bash
# serve_e2e.sh CHECKOUT BIN_DIR SERVE_CHECK: ps-serve following a 2-worker training job, end to
# end with the real programs (docs/serving.md):
#   1. a replica started before training follows 2 servers while 2 workers train (sync); rank 0
#      publishes its dense model every 10 steps and writes coordinated checkpoints (versions);
#      Predict answers while training runs;
#   2. after training, once every source's lag is 0 and the final model is in: every row of the
#      replica equals the servers' (serve_check), and Predict's scores of the whole test file equal
#      ps-worker's final evaluation (--predictions) within 1e-6;
#   3. versions under a steady Predict load: load an older one (pinned, its step in the reply),
#      rollback, a damaged version refused while the current one keeps serving, follow again;
#      a published model whose watermark names no server is refused:
#      no request of the load failed; the newest published model removed (a trainer's rollback
#      prunes the versions after the one it goes back to): the replica serves the one before;
#   4. bad input: a malformed line (PC_EPARSE), a batch over max_batch (PC_ETOOBIG), an unknown
#      model (PC_ENOTFOUND), Push to the replica (PC_EREADONLY); the daemon stays up;
#   5. kill -9 of the replica, restart: it starts from the newest version's checkpoints, catches
#      up through the stream and holds the servers' rows again;
#   6. kill -9 of a training server: the replica keeps serving its last rows (Predict, Lookup)
#      and shows the source down; the server restarted (restoring its checkpoint): the replica
#      rescans it and holds its rows again.
set -euo pipefail
checkout=$1 bin=$2 check=$3
dir=$(mktemp -d /tmp/ember-serve-XXXXXX)
serve_pid="" load_pid=""
cluster() { "$checkout/deploy/local-cluster.sh" "$@" --dir="$dir/cluster" --bin-dir="$bin" \
  --base-port="$base"; }
cleanup() {
  [ -n "$load_pid" ] && kill "$load_pid" 2>/dev/null
  [ -n "$serve_pid" ] && kill -9 "$serve_pid" 2>/dev/null
  cluster down >/dev/null 2>&1 || true
  rm -rf "$dir"
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*"
  [ -f "$dir/serve.log" ] && tail -n 30 "$dir/serve.log"
  exit 1
}
in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
for _ in $(seq 50); do
  base=$((20000 + RANDOM % 10000)) # below the ephemeral ports (32768 on): no client takes them
  in_use $base || in_use $((base + 1)) || in_use $((base + 100)) || in_use $((base + 101)) ||
    in_use $((base + 2000)) || in_use $((base + 2001)) || break
done

"$bin/ps-datagen" --rows=40000 --test-rows=3000 --out="$dir/train.tsv" \
  --test-out="$dir/test.tsv" --seed=7 2>/dev/null
split -n l/2 -d "$dir/train.tsv" "$dir/part-"
cluster up --servers=2 >/dev/null
map=$(cat "$dir/cluster/cluster.map")

start_serve() { # the replica, live, with versions; waits for its port file
  rm -f "$dir/serve.port"
  "$bin/ps-serve" --follow="$map" --publish-dir="$dir/publish" --versions="$dir/jobckpt" \
    --grpc-port=0 --metrics-port=-1 --max-batch=4096 --port-file="$dir/serve.port" --tables-poll-ms=1000 \
    --log-level=info >>"$dir/serve.log" 2>&1 &
  serve_pid=$!
  for _ in $(seq 300); do [ -s "$dir/serve.port" ] && break; sleep 0.1; done
  [ -s "$dir/serve.port" ] || fail "ps-serve did not start"
  sport=$(head -n 1 "$dir/serve.port")
}
psctl() { "$bin/psctl" --server=127.0.0.1:"$sport" --timeout-ms=30000 "$@"; }
json_num() { sed -n "s/.*\"$1\":\([-0-9.e+]*\).*/\1/p"; }

echo "== 1. a replica follows 2 workers training"
start_serve
common=(--servers="$map" --coordinator="$(cat "$dir/cluster/coordinator")" --world=2
  --train="$dir/part-00,$dir/part-01" --job=serve-e2e --batch=256 --device=cpu
  --progress-every=0 --ckpt-every=25 --ckpt-dir="$dir/jobckpt"
  --server-grpc="$(cat "$dir/cluster/grpc")")
"$bin/ps-worker" "${common[@]}" --rank=1 >"$dir/w1.log" 2>&1 &
w1=$!
"$bin/ps-worker" "${common[@]}" --rank=0 --test="$dir/test.tsv" --predictions="$dir/pred.txt" \
  --publish-dir="$dir/publish" --publish-every=10 --json >"$dir/w0.json" 2>"$dir/w0.log" &
w0=$!
scored=0 # Predict while training runs (once a published model is in)
while kill -0 $w0 2>/dev/null; do
  if psctl serve predict "$dir/test.tsv" 4 >"$dir/live.txt" 2>/dev/null; then
    scored=$((scored + 1))
  fi
  sleep 0.2
done
wait $w0 || { tail -n 20 "$dir/w0.log"; fail "rank 0 failed"; }
wait $w1 || { tail -n 20 "$dir/w1.log"; fail "rank 1 failed"; }
echo "Predict answered $scored times while training ran; the last:"
cat "$dir/live.txt"
final=$(ls "$dir/publish" | sed -n 's/^dense-0*\([0-9][0-9]*\)$/\1/p' | sort -n | tail -n 1)
[ -n "$final" ] || fail "nothing published"

echo "== 2. caught up: rows equal the servers', scores equal ps-worker's (model $final)"
ok=0
for _ in $(seq 300); do
  st=$(psctl --json serve status)
  lagging=$(echo "$st" | grep -o '"lag_entries":[0-9]*' | grep -v ':0$' || true)
  version=$(echo "$st" | json_num model_version)
  if [ -z "$lagging" ] && [ "$version" = "$final" ]; then ok=1; break; fi
  sleep 0.1
done
[ $ok = 1 ] || fail "the replica did not catch up: $st"
echo "$st" | grep -q '"map_version":[1-9]' || fail "the replica names no map version: $st"
"$check" "$map" "127.0.0.1:$sport" emb || fail "the replica's rows differ from the servers'"
psctl --json serve predict "$dir/test.tsv" 3000 >"$dir/scores.json" || fail "Predict failed"
tr -d '[]' <"$dir/scores.json" | sed 's/.*"scores"://; s/,"model_version".*//' | tr ',' '\n' \
  >"$dir/scores.txt"
[ "$(wc -l <"$dir/scores.txt")" = 3000 ] || fail "$(wc -l <"$dir/scores.txt") scores"
paste "$dir/scores.txt" "$dir/pred.txt" | awk '
  { d = $1 - $2; if (d < 0) d = -d; if (d > m) m = d }
  END { printf "largest |Predict - ps-worker| over %d samples: %.3g\n", NR, m; exit !(m <= 1e-6) }' ||
  fail "Predict's scores differ from ps-worker's evaluation"

echo "== 3. versions under a steady Predict load"
psctl serve versions
versions=($(psctl serve versions | awk '{print $1}'))
[ ${#versions[@]} -ge 2 ] || fail "fewer than 2 versions"
(
  n=0 bad=0
  while [ ! -f "$dir/stop-load" ]; do
    if psctl serve predict "$dir/test.tsv" 32 >/dev/null 2>>"$dir/load.err"; then n=$((n + 1));
    else bad=$((bad + 1)); fi
  done
  echo "$n $bad" >"$dir/load.txt"
) &
load_pid=$!
old=${versions[0]}
psctl serve load "$old" || fail "load $old"
psctl --json serve predict "$dir/test.tsv" 2 | grep -q "\"model_version\":$old,\"pinned\":true" ||
  fail "a pinned reply does not name version $old"
psctl serve rollback "$old" >/dev/null || fail "rollback $old"
newest=${versions[${#versions[@]} - 1]}
bad_step=$((newest + 1000))
cp -r "$dir/jobckpt/step-$(printf '%020d' "$newest")" "$dir/jobckpt/step-$(printf '%020d' $bad_step)"
printf 'garbage' | dd of="$dir/jobckpt/step-$(printf '%020d' $bad_step)/model" bs=1 seek=40 \
  conv=notrunc 2>/dev/null
if psctl serve load $bad_step 2>"$dir/bad.err"; then fail "a damaged version was loaded"; fi
cat "$dir/bad.err"
psctl --json serve predict "$dir/test.tsv" 2 | grep -q "\"model_version\":$old," ||
  fail "the replica stopped serving version $old after a refused load"
psctl --json serve status | grep -q '"refused_versions":[1-9]' || fail "the refusal is not counted"
psctl serve follow || fail "follow"
psctl --json serve predict "$dir/test.tsv" 2 | grep -q "\"model_version\":$final,\"pinned\":false" ||
  fail "not back to live model $final"
touch "$dir/stop-load"
wait $load_pid
load_pid=""
read -r nreq nbad <"$dir/load.txt"
echo "steady load during the swaps: $nreq requests, $nbad failed"
[ "$nbad" = 0 ] || { cat "$dir/load.err"; fail "requests failed during version swaps"; }
[ "$nreq" -gt 0 ] || fail "no request ran during the swaps"

echo "== 3b. the trainer rolled back: its newest published model is older than the one served"
prev=$(ls "$dir/publish" | sed -n 's/^dense-0*\([0-9][0-9]*\)$/\1/p' | sort -n | tail -n 2 | head -n 1)
[ "$prev" != "$final" ] || fail "one published model only"
mv "$dir/publish/dense-$(printf '%020d' "$final")" "$dir/dense-final"
model_becomes() { # model_becomes STEP: the live model is STEP within 10 s
  for _ in $(seq 100); do
    [ "$(psctl --json serve status | json_num model_version)" = "$1" ] && return 0
    sleep 0.1
  done
  return 1
}
model_becomes "$prev" || fail "the replica kept model $final after the trainer went back to $prev"
mv "$dir/dense-final" "$dir/publish/dense-$(printf '%020d' "$final")"
model_becomes "$final" || fail "the replica did not take model $final again"
# the step served, published anew in place (a rollback, then training back to that step between
# two of the replica's looks): its model is another, loaded again (it was kept)
pubf="$dir/publish/dense-$(printf '%020d' "$final")"
cp -r "$pubf" "$dir/dense-again" && rm -rf "$pubf" && mv "$dir/dense-again" "$pubf"
for _ in $(seq 100); do
  grep -q "published model $final was written again" "$dir/serve.log" && break
  sleep 0.1
done
grep -q "published model $final was written again" "$dir/serve.log" ||
  fail "the replica kept model $final after it was published anew"
model_becomes "$final" || fail "the replica did not load model $final anew"
echo "rolled back to published model $prev and forward to $final; $final published anew: loaded again"

echo "== 3c. a published model whose watermark names no server, or a table not held, is refused"
refused_becomes() { # refused_becomes N: refused_versions is N within 10 s
  for _ in $(seq 100); do
    [ "$(psctl --json serve status | json_num refused_versions)" = "$1" ] && return 0
    sleep 0.1
  done
  return 1
}
src="$dir/publish/dense-$(printf '%020d' "$final")"
ref0=$(psctl --json serve status | json_num refused_versions)
bad=$((final + 1000))
rm -rf "$dir/badpub" && cp -r "$src" "$dir/badpub"
# a model trained without servers (--local): nothing of the servers' to pair it with
grep -v '^server ' "$src/watermark" >"$dir/badpub/watermark"
mv "$dir/badpub" "$dir/publish/dense-$(printf '%020d' "$bad")"
refused_becomes $((ref0 + 1)) || fail "a published model whose watermark names no server was served"
[ "$(psctl --json serve status | json_num model_version)" = "$final" ] ||
  fail "the replica left model $final for one whose watermark names no server"
psctl --json serve status | grep -o '"last_refusal":"[^"]*"'
rm -rf "$dir/publish/dense-$(printf '%020d' "$bad")"
# a watermark of a table the replica does not hold: refused once the servers' tables answered
# without it (one --tables-poll-ms look), not waited for for ever (a newer step: a
# step refused once is not looked at again)
bad=$((bad + 1))
ref0=$(psctl --json serve status | json_num refused_versions)
rm -rf "$dir/badpub" && cp -r "$src" "$dir/badpub"
sed 's/^table .*/table other/' "$src/watermark" >"$dir/badpub/watermark"
mv "$dir/badpub" "$dir/publish/dense-$(printf '%020d' "$bad")"
refused_becomes $((ref0 + 1)) || fail "a published model of a table the replica lacks was not refused"
psctl --json serve status | grep -q '"last_refusal":"[^"]*not one the replica holds' ||
  fail "the refusal does not name the table: $(psctl --json serve status)"
rm -rf "$dir/publish/dense-$(printf '%020d' "$bad")"

echo "== 4. bad input"
expect_err() { # expect_err CODE ARGS...: psctl ARGS fails naming CODE
  local code=$1
  shift
  if psctl "$@" >/dev/null 2>"$dir/err.txt"; then fail "psctl $* succeeded"; fi
  grep -q "$code" "$dir/err.txt" || { cat "$dir/err.txt"; fail "psctl $*: no $code"; }
}
printf '1\t1\t2\n' >"$dir/short.tsv"
expect_err PC_EPARSE serve predict "$dir/short.tsv"
head -n 1 "$dir/test.tsv" | sed 's/^\([01]\)\t[^\t]*/\1\tnan/' >"$dir/nan.tsv"
expect_err PC_EPARSE serve predict "$dir/nan.tsv"
for _ in 1 2; do cat "$dir/test.tsv"; done >"$dir/big.tsv"
expect_err PC_ETOOBIG serve predict "$dir/big.tsv" 5000
expect_err PC_ENOTFOUND --model=other serve predict "$dir/test.tsv" 2
expect_err PC_EREADONLY create "name=x,dim=4"
psctl serve predict "$dir/test.tsv" 2 >/dev/null || fail "the daemon is not answering after bad input"

echo "== 5. kill -9 of the replica, restart: it catches up from the newest version that loads"
kill -9 "$serve_pid"
wait "$serve_pid" 2>/dev/null || true
start_serve
ok=0
for _ in $(seq 300); do
  st=$(psctl --json serve status 2>/dev/null || true)
  lagging=$(echo "$st" | grep -o '"lag_entries":[0-9]*' | grep -v ':0$' || true)
  if [ -n "$st" ] && [ -z "$lagging" ] && echo "$st" | grep -q '"state":"following"'; then
    ok=1
    break
  fi
  sleep 0.1
done
[ $ok = 1 ] || fail "the restarted replica did not catch up: $st"
"$check" "$map" "127.0.0.1:$sport" emb || fail "the restarted replica's rows differ"
grep -q "starting from version $newest," "$dir/serve.log" ||
  fail "the restarted replica did not start from version $newest (the damaged $bad_step skipped)"
if echo "$st" | grep -q '"rescans":[1-9]'; then fail "the restarted replica rescanned: $st"; fi
echo "$st" | grep -q '"refused_versions":1,' || fail "the damaged version was not refused at start"
echo "== 6. kill -9 of training server 1, restart: the replica serves on, then resumes"
read -r _ p1 g1 m1 pid1 < <(sed -n 2p "$dir/cluster/servers.txt")
kill -9 "$pid1"
ok=0
for _ in $(seq 100); do
  st=$(psctl --json serve status)
  if echo "$st" | grep -q '"state":"down"'; then ok=1; break; fi
  sleep 0.1
done
[ $ok = 1 ] || fail "the killed server's source is not down: $st"
psctl serve predict "$dir/test.tsv" 4 >/dev/null || fail "Predict failed while a server is down"
rm -f "$dir/cluster/port-1"
nohup "$bin/ps-server" --port="$p1" --grpc-port="$g1" --metrics-port="$m1" \
  --cluster-map-file="$dir/cluster/cluster.map" --server-index=1 --tables="name=emb,dim=16" \
  --ckpt-dir="$dir/cluster/ckpt-1" --port-file="$dir/cluster/port-1" \
  >>"$dir/cluster/logs/server-1.log" 2>&1 &
sed -i "2s/ [0-9]*\$/ $!/" "$dir/cluster/servers.txt"
ok=0
for _ in $(seq 300); do
  st=$(psctl --json serve status 2>/dev/null || true)
  lagging=$(echo "$st" | grep -o '"lag_entries":[0-9]*' | grep -v ':0$' || true)
  if [ -z "$lagging" ] && ! echo "$st" | grep -q '"state":"\(down\|scanning\|starting\)"'; then
    ok=1
    break
  fi
  sleep 0.1
done
[ $ok = 1 ] || fail "the replica did not resume the restarted server: $st"
"$check" "$map" "127.0.0.1:$sport" emb || fail "rows differ after the server's restart"
echo "ok"
