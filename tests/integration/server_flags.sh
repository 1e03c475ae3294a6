#!/bin/sh
# server_flags.sh BIN_DIR: ps-server's and psctl's exit statuses where they once misled:
#   --restore-id without --ckpt-dir   exit 2, naming --ckpt-dir (it started with empty tables,
#                                     believing it restored)
#   --no_<flag>                       as --no-<flag> ('-' and '_' are one)
#   a failed exit checkpoint          SIGTERM exits 1 (it exited 0: the pushes since the last
#                                     checkpoint were gone without a sign)
#   psctl reshard wait abc            exit 2 (it waited 0 seconds)
# Every wait is bounded.
set -eu
bin=$1
dir=$(mktemp -d /tmp/ember-sflags-XXXXXX)
pid=""
trap '[ -n "$pid" ] && kill -9 "$pid" 2>/dev/null; rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

rc=0
timeout 10 "$bin/ps-server" --port=0 --grpc-port=0 --metrics-port=-1 --restore-id=5 2>"$dir/err" || rc=$?
cat "$dir/err"
[ "$rc" = 2 ] && grep -q -- "--restore-id needs --ckpt-dir" "$dir/err" ||
  fail "--restore-id without --ckpt-dir: exit $rc"

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
echo "ok"
