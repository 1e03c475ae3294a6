#!/bin/sh
# worker_flags.sh BIN_DIR: ps-worker's answers to bad flags name the flag and what it takes.
#   --format=parquet       exit 2: "--format: 'parquet' is not one of criteo, libsvm, libffm, csv"
#   no --train             exit 2, naming --train
#   deepfm on libffm       exit 2, naming --fields (the format does not give the field count)
#   --push-order=rank      exit 2 outside sync, naming the mode it needs
#   --server-grpc=a,,b     exit 2, naming the empty entry
#   --local --table=dim=8  exit 1 at the start, naming the model's width
#   --help                 flags as the docs write them (--ckpt-dir), both spellings accepted
#   SIGTERM as pid 1       it ends at once (the kernel dropped the default action's signal)
set -eu
bin=$1
dir=$(mktemp -d /tmp/ember-wflags-XXXXXX)
trap 'rm -rf "$dir"' EXIT
printf '1 0:1:1 1:2:1\n0 0:3:1 1:4:1\n' >"$dir/t.ffm"

expect() { # expect RC TEXT ARGS...: ps-worker ARGS exits RC and says TEXT on stderr
  want=$1 text=$2
  shift 2
  rc=0
  "$bin/ps-worker" "$@" >/dev/null 2>"$dir/err.txt" || rc=$?
  cat "$dir/err.txt"
  [ "$rc" -eq "$want" ] || { echo "FAIL: ps-worker $* exited $rc, want $want"; exit 1; }
  grep -q -F -- "$text" "$dir/err.txt" || { echo "FAIL: ps-worker $*: no \"$text\""; exit 1; }
}

expect 2 "--format: 'parquet' is not one of criteo, libsvm, libffm, csv" \
  --local --device=cpu --format=parquet --train="$dir/t.ffm"
expect 2 "--train: give the training data" --local --device=cpu
expect 2 "needs --fields" --local --device=cpu --format=libffm --model=deepfm --train="$dir/t.ffm"
expect 2 "--push-order=rank needs --mode=sync" --local --device=cpu --format=libffm \
  --mode=async --push-order=rank --train="$dir/t.ffm"
expect 2 "--server-grpc=127.0.0.1:1,,127.0.0.1:2 has an empty entry" --local --device=cpu \
  --format=libffm --train="$dir/t.ffm" --server-grpc=127.0.0.1:1,,127.0.0.1:2
# (exit 1: a failed start; the setting named, not a first pull's "wrong dimension" alone)
expect 1 "dim=8, but the model's rows are 16 wide" --local --device=cpu --format=libffm \
  --train="$dir/t.ffm" --table=dim=8
"$bin/ps-worker" --help >"$dir/help.txt"
grep -q -- "--ckpt-dir=<str>" "$dir/help.txt" || { echo "FAIL: --help does not show --ckpt-dir"; exit 1; }
grep -q -- "'-' or '_'" "$dir/help.txt" || { echo "FAIL: --help does not say both forms work"; exit 1; }
# SIGTERM to a worker that is pid 1 of its pid namespace (a container's, the entrypoint execs
# it): it ends (143) within a second; the kernel dropped the default action's signal, and the
# worker waited for SIGKILL. Its training data a FIFO nobody writes: it waits there.
if unshare -pf true 2>/dev/null; then
  mkfifo "$dir/never"
  unshare -pf "$bin/ps-worker" --local --device=cpu --train="$dir/never" >/dev/null 2>&1 &
  outer=$!
  inner=""
  for _ in $(seq 50); do
    inner=$(pgrep -P "$outer" ps-worker || true)
    [ -n "$inner" ] && break
    sleep 0.1
  done
  [ -n "$inner" ] || { kill -9 "$outer"; echo "FAIL: the worker in its pid namespace did not start"; exit 1; }
  sleep 0.5
  kill -TERM "$inner"
  for _ in $(seq 20); do kill -0 "$inner" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$inner" 2>/dev/null; then
    kill -9 "$inner"
    echo "FAIL: ps-worker as pid 1 still ran 2 s after SIGTERM"
    exit 1
  fi
  wait "$outer" || true
else
  echo "SKIPPED: pid 1 under SIGTERM (unshare -p needs CAP_SYS_ADMIN)"
fi
echo "ok"
