#!/bin/sh
# server_flags.sh BIN_DIR: ps-server's and psctl's exit statuses where they once misled:
#   --restore-id without --ckpt-dir   exit 2, naming --ckpt-dir (it started with empty tables,
#                                     believing it restored)
#   --no_<flag>                       as --no-<flag> ('-' and '_' are one)
#   PS_SERVER_CONFIG                  the config file it names is read (it was ignored)
#   --print-config                    tokens not shown (it printed them)
#   a failed exit checkpoint          SIGTERM exits 1 (it exited 0: the pushes since the last
#                                     checkpoint were gone without a sign)
#   psctl reshard wait abc            exit 2 (it waited 0 seconds)
#   psctl reshard wait inf            exit 2 (it waited for ever)
#   --port=0 with a map and no --server-index: exit 2 (it took server 0's slots)
#   --ckpt-interval-s without --ckpt-dir: said (it never checkpointed, silently)
#   a map file of 700 servers (9 KB)  read whole (it was cut at 8 KB: a parse error, or a wrong
#                                     owner)
#   SIGHUP with a map file of the same version: not taken, said why; a newer one: taken
#   SIGTERM while the start waits for an unreachable --cluster-coordinator: exit 0 at once (it
#                                     was held for 20 quarter leases, then exit 1); the port file
#                                     is removed at a stop (it outlived the server)
#   SIGTERM while the restore reads: a stop once it is over, exit 0 (killed by the default
#                                     action; dropped as a container's pid 1); an earlier run's
#                                     port file is removed at the start (a script read it)
#   an empty --cluster-map-file       exit 1 (restarted by systemd); one that does not exist or
#                                     parse: 2
#   a second server on a running one's --ckpt-dir: exit 1 naming the first (both wrote there)
#   a --tier-dir that is, holds or lies in --ckpt-dir: exit 2 (the tier emptied it at start)
#   --tables changed for a table the checkpoint brings: said (it was ignored without a word)
#   a bad table spec, coordinator store or cluster_coordinator=self without --coordinator:
#                                     exit 2 before any restore (found after it: minutes of
#                                     restore, the tier's files replaced, exit 1)
# Every wait is bounded.
set -eu
bin=$1
dir=$(mktemp -d /tmp/ember-sflags-XXXXXX)
pid=""
trap '[ -n "$pid" ] && kill -9 "$pid" 2>/dev/null; rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
# map_exit WANT FILE WHAT: ps-server with --cluster-map-file=FILE exits WANT
map_exit() {
  rc=0
  timeout 10 "$bin/ps-server" --port=0 --grpc-port=-1 --metrics-port=-1 \
    --server-index=0 --cluster-map-file="$2" 2>"$dir/err" || rc=$?
  [ "$rc" = "$1" ] || { cat "$dir/err"; fail "$3: exit $rc, want $1"; }
}
# stopped_in_start LOG WHAT: the server $pid, sent SIGTERM during its start, ends within 15 s
# with exit 0 and says it stopped during the start
stopped_in_start() {
  for _ in $(seq 150); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$pid" 2>/dev/null; then
    kill -9 "$pid"; tail -n 5 "$1"; fail "SIGTERM $2: running 15 s later"
  fi
  rc=0
  wait "$pid" || rc=$?
  pid=""
  [ "$rc" = 0 ] || { tail -n 5 "$1"; fail "SIGTERM $2: exit $rc, want 0"; }
  grep -q "signal 15 during the start: stopped" "$1" || { cat "$1"; fail "no line about the stop $2"; }
}

rc=0
timeout 10 "$bin/ps-server" --port=0 --grpc-port=0 --metrics-port=-1 --restore-id=5 2>"$dir/err" || rc=$?
cat "$dir/err"
[ "$rc" = 2 ] && grep -q -- "--restore-id needs --ckpt-dir" "$dir/err" ||
  fail "--restore-id without --ckpt-dir: exit $rc"

# a map file that cannot be read now (empty: being rewritten) is exit 1, which systemd
# restarts; one that does not parse is a setting's error, exit 2 (both were 2)
: >"$dir/empty.map"
map_exit 1 "$dir/empty.map" "an empty --cluster-map-file"
map_exit 2 "$dir/no-such.map" "a --cluster-map-file that does not exist"
echo "version=1;servers=nonsense" >"$dir/bad.map"
map_exit 2 "$dir/bad.map" "a --cluster-map-file that does not parse"

# a config file named by the environment is read (PS_SERVER_CONFIG was ignored)
echo "grpc_threads = 3" >"$dir/server.conf"
PS_SERVER_CONFIG="$dir/server.conf" "$bin/ps-server" --print-config >"$dir/cfg" 2>&1 ||
  { cat "$dir/cfg"; fail "PS_SERVER_CONFIG: ps-server failed"; }
grep -q "grpc_threads *= *3" "$dir/cfg" || { cat "$dir/cfg"; fail "PS_SERVER_CONFIG not read"; }
# --print-config does not print tokens (its output goes to logs)
"$bin/ps-server" --token=s3cret-value --print-config >"$dir/cfg" 2>&1
! grep -q "s3cret-value" "$dir/cfg" || { cat "$dir/cfg"; fail "--print-config printed the token"; }
grep -q "^# token = (set, not shown)" "$dir/cfg" || { cat "$dir/cfg"; fail "--print-config: no token line"; }

rc=0
"$bin/ps-server" --no_ckpt_on_exit --print-config >"$dir/cfg" 2>&1 || rc=$?
[ "$rc" = 0 ] && grep -q "ckpt_on_exit *= *false" "$dir/cfg" || { cat "$dir/cfg"; fail "--no_ckpt_on_exit: exit $rc"; }

mkdir -p "$dir/ckpt"
"$bin/ps-server" --port=0 --grpc-port=0 --metrics-port=-1 --tables=name=emb,dim=4 \
  --ckpt-dir="$dir/ckpt" --port-file="$dir/ports" 2>"$dir/server.log" &
pid=$!
for _ in $(seq 100); do [ -s "$dir/ports" ] && break; sleep 0.1; done
[ -s "$dir/ports" ] || { cat "$dir/server.log"; fail "ps-server did not start"; }
rm -rf "$dir/ckpt" # the exit checkpoint has nowhere to go
touch "$dir/ckpt"  # (a file where the directory was)
kill -TERM "$pid"
rc=0
wait "$pid" || rc=$?
pid=""
[ "$rc" = 1 ] || { tail -n 5 "$dir/server.log"; fail "a failed exit checkpoint: exit $rc, want 1"; }
grep -q "checkpoint (exit) failed" "$dir/server.log" || fail "no line about the exit checkpoint"

rc=0
"$bin/psctl" --coordinator=127.0.0.1:1 reshard wait abc 2>"$dir/err" || rc=$?
[ "$rc" = 2 ] || { cat "$dir/err"; fail "reshard wait abc: exit $rc, want 2"; }
rc=0 # a wait without end
timeout 10 "$bin/psctl" --coordinator=127.0.0.1:1 reshard wait inf 2>"$dir/err" || rc=$?
[ "$rc" = 2 ] || { cat "$dir/err"; fail "reshard wait inf: exit $rc, want 2"; }

rc=0
timeout 10 "$bin/ps-server" --port=0 --grpc-port=0 --metrics-port=-1 \
  --cluster-map="version=1;servers=127.0.0.1:7400;slots=0-16383:0" 2>"$dir/err" || rc=$?
[ "$rc" = 2 ] && grep -q -- "--port=0 (any free port) with a cluster map" "$dir/err" ||
  { cat "$dir/err"; fail "--port=0 with a map: exit $rc"; }

# A stop removes the port file; then settings wrong in themselves are refused before that
# server's checkpoint is restored.
"$bin/ps-server" --port=0 --grpc-port=0 --metrics-port=-1 --tables=name=emb,dim=4 \
  --ckpt-dir="$dir/ck2" --port-file="$dir/ports3" 2>"$dir/server3.log" &
pid=$!
for _ in $(seq 100); do [ -s "$dir/ports3" ] && break; sleep 0.1; done
[ -s "$dir/ports3" ] || { cat "$dir/server3.log"; fail "ps-server did not start"; }
# a second server on the same checkpoint directory (and port file) is refused at once, naming
# the first, whose port file stays (two writers pruned each other's checkpoints; it removed the
# live server's port file)
rc=0
timeout 10 "$bin/ps-server" --port=0 --grpc-port=0 --metrics-port=-1 --tables=name=emb,dim=4 \
  --ckpt-dir="$dir/ck2" --port-file="$dir/ports3" 2>"$dir/err" || rc=$?
[ "$rc" = 1 ] && grep -q "is in use by another ps-server (pid $pid)" "$dir/err" ||
  { cat "$dir/err"; fail "a second server on one checkpoint directory: exit $rc, want 1"; }
[ -s "$dir/ports3" ] || fail "the second server removed the first one's port file"
# a tier directory that holds the checkpoints (or lies inside them) is refused: it is emptied at
# every start (every checkpoint was wiped)
mkdir -p "$dir/ck4"
touch "$dir/ck4/keep"
for tier in "$dir/ck4" "$dir/ck4/tier" "$dir"; do
  rc=0
  timeout 10 "$bin/ps-server" --port=0 --grpc-port=0 --metrics-port=-1 --ckpt-dir="$dir/ck4" \
    --tier-dir="$tier" 2>"$dir/err" || rc=$?
  [ "$rc" = 2 ] && grep -q "overlap" "$dir/err" && [ -e "$dir/ck4/keep" ] ||
    { cat "$dir/err"; fail "--tier-dir=$tier beside --ckpt-dir=$dir/ck4: exit $rc, want 2"; }
done
kill -TERM "$pid"
wait "$pid" || { tail -n 5 "$dir/server3.log"; fail "the checkpointing server did not stop cleanly"; }
pid=""
[ ! -e "$dir/ports3" ] || fail "the port file outlived the stop"
rc=0
timeout 10 "$bin/ps-server" --port=0 --grpc-port=0 --metrics-port=-1 --ckpt-dir="$dir/ck2" \
  --tables="name=emb,dim=abc" 2>"$dir/err" || rc=$?
[ "$rc" = 2 ] && grep -q "dim: 'abc' is not an integer" "$dir/err" &&
  ! grep -q "restored checkpoint" "$dir/err" || { cat "$dir/err"; fail "a bad table spec: exit $rc"; }
rc=0
timeout 10 "$bin/ps-server" --port=0 --grpc-port=0 --metrics-port=-1 --ckpt-dir="$dir/ck2" \
  --coordinator --coordinator-store=bogus 2>"$dir/err" || rc=$?
[ "$rc" = 2 ] && ! grep -q "restored checkpoint" "$dir/err" ||
  { cat "$dir/err"; fail "coordinator_store=bogus: exit $rc"; }
rc=0
timeout 10 "$bin/ps-server" --port=0 --grpc-port=0 --metrics-port=-1 --ckpt-dir="$dir/ck2" \
  --cluster-coordinator=self 2>"$dir/err" || rc=$?
[ "$rc" = 2 ] && grep -q "cluster_coordinator=self needs --coordinator" "$dir/err" ||
  { cat "$dir/err"; fail "cluster_coordinator=self without --coordinator: exit $rc"; }

# A table the checkpoint brings keeps its settings; a --tables that asks for others is told which
# (a changed optimizer was ignored without a word)
for opt in adagrad adam; do
  "$bin/ps-server" --port=0 --grpc-port=-1 --metrics-port=-1 --ckpt-dir="$dir/ck6" \
    --tables="name=emb,dim=4,optimizer=$opt" --port-file="$dir/ports6" 2>"$dir/server6.log" &
  pid=$!
  for _ in $(seq 100); do [ -s "$dir/ports6" ] && break; sleep 0.1; done
  [ -s "$dir/ports6" ] || { cat "$dir/server6.log"; fail "ps-server did not start"; }
  kill -TERM "$pid"
  wait "$pid" || { tail -n 5 "$dir/server6.log"; fail "ps-server ($opt) did not stop cleanly"; }
  pid=""
done
grep -q "table emb: restored with the checkpoint's settings; --tables asks for optimizer=adam (checkpoint: optimizer=adagrad)" "$dir/server6.log" ||
  { cat "$dir/server6.log"; fail "a changed optimizer of a restored table was not said"; }

# A map file of 700 servers (this one owns every slot), then reloads by SIGHUP; the interval
# without a directory is said.
port=$(/usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
others=$(seq 1 699 | sed 's/^/10.0.0.1:/' | paste -sd, -)
echo "version=1;servers=127.0.0.1:$port,$others;slots=0-16383:0" >"$dir/map"
[ "$(wc -c <"$dir/map")" -gt 8192 ] || fail "the map file is not over 8 KB"
"$bin/ps-server" --port="$port" --grpc-port=0 --metrics-port=-1 --tables=name=emb,dim=4 \
  --cluster-map-file="$dir/map" --port-file="$dir/ports2" --ckpt-interval-s=5 2>"$dir/server2.log" &
pid=$!
for _ in $(seq 100); do [ -s "$dir/ports2" ] && break; sleep 0.1; done
[ -s "$dir/ports2" ] || { cat "$dir/server2.log"; fail "ps-server did not start on a 9 KB map file"; }
grep -q -- "--ckpt-interval-s=5 without --ckpt-dir: no checkpoints are written" "$dir/server2.log" ||
  { cat "$dir/server2.log"; fail "--ckpt-interval-s without --ckpt-dir: not said"; }
kill -HUP "$pid" # the same version: not taken
for _ in $(seq 50); do grep -q "not newer than the map followed" "$dir/server2.log" && break; sleep 0.1; done
grep -q "version 1 is not newer than the map followed (1)" "$dir/server2.log" ||
  { cat "$dir/server2.log"; fail "SIGHUP with the same map version: no refusal"; }
sed -i 's/^version=1;/version=2;/' "$dir/map"
kill -HUP "$pid"
for _ in $(seq 50); do grep -q "cluster map reloaded: version 2 (ok)" "$dir/server2.log" && break; sleep 0.1; done
grep -q "cluster map reloaded: version 2 (ok)" "$dir/server2.log" ||
  { cat "$dir/server2.log"; fail "SIGHUP with version 2: not taken"; }
kill -TERM "$pid"
wait "$pid" || { tail -n 5 "$dir/server2.log"; fail "the 9 KB map server did not stop cleanly"; }
pid=""
# SIGTERM while the start retries an unreachable --cluster-coordinator (a quarter lease is 150 s)
"$bin/ps-server" --port=0 --grpc-port=0 --metrics-port=-1 --cluster-coordinator=127.0.0.1:1 \
  --lease-ms=600000 2>"$dir/server4.log" &
pid=$!
for _ in $(seq 100); do grep -q "no cluster map from the coordinator\|cannot give every slot" "$dir/server4.log" && break; sleep 0.1; done
sleep 0.5
kill -TERM "$pid"
stopped_in_start "$dir/server4.log" "during a start on an unreachable coordinator"
# SIGTERM while the restore reads (its manifest a FIFO: the read waits for a writer): taken as a
# stop once the restore is over, exit 0 (the default action killed it: 143; as a container's
# pid 1 the signal was dropped and the server went on to serve)
mkdir -p "$dir/ck5/ckpt-00000000000000000001"
mkfifo "$dir/ck5/ckpt-00000000000000000001/MANIFEST.json"
echo stale >"$dir/ports5" # an earlier run's, killed: removed at the start
"$bin/ps-server" --port=0 --grpc-port=-1 --metrics-port=-1 --ckpt-dir="$dir/ck5" \
  --port-file="$dir/ports5" 2>"$dir/server5.log" &
pid=$!
sleep 0.5
kill -TERM "$pid"
sleep 0.2
timeout 5 sh -c ": > '$dir/ck5/ckpt-00000000000000000001/MANIFEST.json'" || true
stopped_in_start "$dir/server5.log" "during the restore"
[ ! -e "$dir/ports5" ] || fail "an earlier run's port file outlived a start that never served"
echo "ok"
