#!/usr/bin/env bash
# local_cluster.sh CHECKOUT BIN_DIR [CMAKE BUILD_DIR]: deploy/local-cluster.sh used from outside
# the checkout, writing nowhere in it (as from a read-only checkout or an installed build):
#   1. up --bin-dir=BIN_DIR --dir=<absolute, outside> --servers=1 from another directory, status,
#      down, status (no cluster);
#   2. the same through EMBER_BIN_DIR and EMBER_RUN_DIR, the run directory relative to the
#      current one;
#   3. with CMAKE: `cmake --install --component programs` into a temporary prefix, then its
#      bin/emberps-local-cluster with no --bin-dir (it finds the programs beside it);
#   4. up --secure (the installed script when 3 ran, it finds emberps-make-certs beside it): TLS
#      and a token: status works (it uses the cluster's CA and token), psctl without the CA
#      fails to connect (exit 3), with the CA but no token is refused (exit 1);
# and, after all, no new file in the checkout (git status, build directories aside) and none in
# the current directory but the run directory of 2. Ports: a free base P (P, P+100, P+2000).
set -euo pipefail
checkout=$1 bin=$2 cmake=${3:-} build=${4:-}
script=$checkout/deploy/local-cluster.sh
tmp=$(mktemp -d /tmp/ember-lcluster-XXXXXX)
dirs=()
cleanup() {
  for d in "${dirs[@]}"; do "$script" down --dir="$d" >/dev/null 2>&1 || true; done
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; exit 1; }

# New untracked or ignored files of the checkout, build directories aside (empty when not git).
new_files() {
  git -C "$checkout" status --porcelain --ignored --untracked-files=all 2>/dev/null |
    grep -E '^(\?\?|!!) ' | grep -v -E '^(\?\?|!!) build[^/]*/' | sort || true
}
before=$(new_files)

in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
free_base() {
  local p
  for _ in $(seq 50); do
    p=$((20000 + RANDOM % 10000)) # below the ephemeral ports (32768 on): no client takes them
    in_use $p || in_use $((p + 100)) || in_use $((p + 2000)) || { echo $p; return; }
  done
  fail "no free ports"
}

# cycle DIR: up, status, down, status with the cluster in DIR, run as "${lc[@]}" COMMAND
# "${flags[@]}" ARGS...
lc() { "${lc[@]}" "$1" "${flags[@]}" "${@:2}"; }
cycle() {
  local d=$1 base out pid
  dirs+=("$d")
  for attempt in 1 2 3; do # a port taken between the check and the bind: another base
    base=$(free_base)
    if out=$(lc up --servers=1 --base-port="$base" 2>&1); then break; fi
    echo "$out"
    [ $attempt -lt 3 ] || fail "up did not start a server"
    lc down >/dev/null 2>&1 || true
  done
  echo "$out"
  [ -s "$d/cluster.map" ] && [ -s "$d/servers.txt" ] || fail "up wrote no map in $d"
  grep -q "127.0.0.1:$base" "$d/cluster.map" || fail "map of $d without port $base"
  out=$(lc status) || fail "status: $out"
  echo "$out"
  echo "$out" | grep -q "^server 0 (pid [0-9]*, data :$base, gRPC :$((base + 100))" ||
    fail "status does not show server 0"
  if [ -f "$d/secure" ]; then
    local rc=0
    [ -s "$d/tls/ca.pem" ] && [ "$(stat -c %a "$d/token")" = 600 ] || fail "no CA or token in $d"
    "$bin/psctl" --server=127.0.0.1:$((base + 100)) --timeout-ms=3000 health >/dev/null 2>&1 || rc=$?
    [ $rc = 3 ] || fail "psctl without the CA: exit $rc, not 3"
    rc=0
    "$bin/psctl" --tls-ca="$d/tls/ca.pem" --server=127.0.0.1:$((base + 100)) --timeout-ms=3000 \
      health >/dev/null 2>&1 || rc=$?
    [ $rc = 1 ] || fail "psctl without the token: exit $rc, not 1"
  fi
  pid=$(awk '{print $5}' "$d/servers.txt")
  lc down
  # stopped: gone, or exited and not reaped yet by whoever adopted it (a zombie)
  if kill -0 "$pid" 2>/dev/null && [ "$(ps -o stat= -p "$pid" | cut -c1)" != Z ]; then
    fail "server $pid still running after down"
  fi
  out=$(lc status) && fail "status after down succeeded: $out"
  echo "$out" | grep -q "no cluster in $d" || fail "status after down: $out"
  [ -d "$d/ckpt-0" ] || fail "no checkpoint directory in $d"
}

mkdir -p "$tmp/cwd"
cd "$tmp/cwd"

echo "== 1. --bin-dir and an absolute --dir, from another directory"
lc=("$script") flags=(--bin-dir="$bin" --dir="$tmp/run1")
cycle "$tmp/run1"

echo "== 2. EMBER_BIN_DIR, EMBER_RUN_DIR relative to the current directory"
lc=(env EMBER_BIN_DIR="$bin" EMBER_RUN_DIR=rel/run2 "$script") flags=()
cycle "$tmp/cwd/rel/run2"

if [ -n "$cmake" ]; then
  echo "== 3. an installed build: emberps-local-cluster finds the programs beside it"
  "$cmake" --install "$build" --prefix "$tmp/inst" --component programs >/dev/null
  [ -x "$tmp/inst/bin/emberps-local-cluster" ] && [ -x "$tmp/inst/bin/ps-server" ] ||
    fail "install did not put emberps-local-cluster and ps-server in bin/"
  lc=(env -u EMBER_BIN_DIR -u EMBER_RUN_DIR "$tmp/inst/bin/emberps-local-cluster")
  flags=(--dir="$tmp/run3")
  cycle "$tmp/run3"
fi

echo "== 4. --secure: TLS on both planes and a token"
if [ -n "$cmake" ]; then
  lc=(env -u EMBER_BIN_DIR -u EMBER_RUN_DIR "$tmp/inst/bin/emberps-local-cluster")
else
  lc=("$script")
fi
flags=(--bin-dir="$bin" --dir="$tmp/run4" --secure)
cycle "$tmp/run4"

extra=$(ls -A "$tmp/cwd" | grep -v -x rel || true)
[ -z "$extra" ] || fail "files written into the current directory: $extra"
after=$(new_files)
[ "$before" = "$after" ] ||
  fail "new files in the checkout: $(comm -13 <(echo "$before") <(echo "$after") | tr '\n' ' ')"
echo "ok"
