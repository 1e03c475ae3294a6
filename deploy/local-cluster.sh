#!/usr/bin/env bash
# deploy/local-cluster.sh: run EmberPS servers on this machine (loopback), for the quickstart and
# for users who want to train their own data through the same setup.
#
#   deploy/local-cluster.sh up [--servers=N] [--dir=DIR] [--bin-dir=BIN] [--base-port=P]
#                              [--table=SPEC] [--rollback=JOBCKPT_DIR] [--secure]
#   deploy/local-cluster.sh status [--dir=DIR] [--bin-dir=BIN]
#   deploy/local-cluster.sh down [--dir=DIR]
#
# up starts N ps-servers (default 2) sharing one cluster map (slots split evenly); server 0 is
# also the coordinator. Server i serves the data plane on P+i, gRPC on P+100+i and metrics on
# P+2000+i (P default 7400), checkpoints into DIR/ckpt-i every 60 s and on stop, and logs to
# DIR/logs/server-i.log. It creates the table SPEC (default: "name=emb,dim=16", a 16-dim table with the default settings) unless
# a checkpoint brings it back. DIR then holds:
#   cluster.map     the map (pass it, or any server's host:port, to ps-worker --servers)
#   servers.txt     one line per server: index data-port grpc-port metrics-port pid
#   coordinator     host:gRPC port of the coordinator (ps-worker --coordinator)
#   grpc            the servers' gRPC addresses, comma-separated (ps-worker --server-grpc)
# --rollback=JOBCKPT_DIR starts each server from its checkpoint listed in the latest coordinated
# checkpoint of JOBCKPT_DIR (ps-worker --ckpt-dir; then start the workers with
# --resume=checkpoint): the whole job rolled back to one consistent point.
# --secure: both planes speak TLS and want a token. DIR/tls gets a private CA and a certificate for
# 127.0.0.1 (deploy/make-certs.sh, valid 30 days; kept across restarts), DIR/token a random token
# (mode 600). Clients then need the CA and the token, e.g.
#   PS_WORKER_TOKEN=$(cat DIR/token) ps-worker --tls-ca=DIR/tls/ca.pem ...
#   PSCTL_TOKEN=$(cat DIR/token) psctl --tls-ca=DIR/tls/ca.pem --server=127.0.0.1:7500 health
# status prints each server's health through psctl; down stops them (SIGTERM: each writes a
# checkpoint and exits 0).
#
# Where things are (relative paths are taken from the current directory; the script writes
# nothing outside DIR, so a read-only checkout or an installed build works):
#   DIR   --dir, else $EMBER_RUN_DIR, else run/cluster in the checkout this script is in, else
#         (an installed script) ${XDG_STATE_HOME:-~/.local/state}/emberps/cluster.
#   BIN   ps-server and psctl: --bin-dir, else $EMBER_BIN_DIR, else build/bin of the checkout
#         (tests/run.sh or deploy/quickstart.sh build it), else the script's own directory when
#         they are beside it (`cmake --install build --component programs` installs the script
#         as bin/emberps-local-cluster), else the directory of `command -v ps-server`.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here") # the checkout, when the script is deploy/local-cluster.sh in one

cmd=${1:-}
[ -n "$cmd" ] && shift
n=2 dir=${EMBER_RUN_DIR:-} bin=${EMBER_BIN_DIR:-} base=7400 rollback="" secure=0
table="name=emb,dim=16" # every other setting: the table defaults (ps-server --help-tables)
for a in "$@"; do
  case "$a" in
    --servers=*) n=${a#*=} ;;
    --dir=*) dir=${a#*=} ;;
    --bin-dir=*) bin=${a#*=} ;;
    --base-port=*) base=${a#*=} ;;
    --table=*) table=${a#*=} ;;
    --rollback=*) rollback=${a#*=} ;;
    --secure) secure=1 ;;
    *) echo "local-cluster.sh: unknown argument $a" >&2; exit 2 ;;
  esac
done
if [ -z "$dir" ]; then
  if [ -f "$root/CMakeLists.txt" ] && [ -d "$root/deploy" ]; then
    dir=$root/run/cluster
  else
    dir=${XDG_STATE_HOME:-$HOME/.local/state}/emberps/cluster
  fi
fi
case "$dir" in /*) ;; *) dir=$PWD/$dir ;; esac
if [ -z "$bin" ]; then
  if [ -x "$root/build/bin/ps-server" ]; then
    bin=$root/build/bin
  elif [ -x "$here/ps-server" ]; then
    bin=$here
  elif command -v ps-server >/dev/null; then
    bin=$(dirname "$(command -v ps-server)")
  else
    bin=$root/build/bin # not there: up says so
  fi
fi
case "$bin" in /*) ;; *) bin=$PWD/$bin ;; esac

up() {
  [ -x "$bin/ps-server" ] ||
    { echo "local-cluster.sh: no $bin/ps-server (build first, or give --bin-dir=DIR)" >&2; exit 1; }
  if [ -f "$dir/servers.txt" ]; then # any server of it still running: stopped first
    local alive=0
    while read -r i dp gp mp pid; do ours "$pid" "$i" && alive=1; done <"$dir/servers.txt"
    [ $alive = 0 ] || { echo "local-cluster.sh: servers of a cluster in $dir still run (down first)" >&2; exit 1; }
  fi
  mkdir -p "$dir/logs"
  local tls=() token=""
  rm -f "$dir/secure"
  if [ "$secure" = 1 ]; then
    local certs=$here/make-certs.sh
    [ -x "$certs" ] || certs=$here/emberps-make-certs # an installed script
    # made again when missing or expiring within a day (the servers would start, no client connect)
    { [ -s "$dir/tls/server.pem" ] && openssl x509 -checkend 86400 -noout -in "$dir/tls/server.pem" >/dev/null 2>&1; } ||
      EMBER_CERT_DAYS=30 "$certs" "$dir/tls" ||
      { echo "local-cluster.sh: cannot make TLS certificates (openssl)" >&2; exit 1; }
    [ -s "$dir/token" ] || (umask 077 && openssl rand -hex 16 >"$dir/token")
    token=$(cat "$dir/token")
    tls=(--tls-cert="$dir/tls/server.pem" --tls-key="$dir/tls/server.key")
    : >"$dir/secure"
  fi
  : >"$dir/servers.txt"
  local addrs="" slots="" per=$((16384 / n))
  for ((i = 0; i < n; i++)); do
    addrs+="${addrs:+,}127.0.0.1:$((base + i))"
    local lo=$((i * per)) hi=$(((i + 1) * per - 1))
    [ $i -eq $((n - 1)) ] && hi=16383
    slots+="${slots:+,}$lo-$hi:$i"
  done
  echo "version=1;servers=$addrs;slots=$slots" >"$dir/cluster.map"
  local ids=()
  if [ -n "$rollback" ]; then # the servers' checkpoint ids in the latest job checkpoint
    local step
    step=$(cat "$rollback/LATEST" 2>/dev/null) || { echo "local-cluster.sh: no $rollback/LATEST" >&2; exit 1; }
    read -r -a ids < <(sed -n 's/^servers //p' "$rollback/step-$(printf %020d "$step")/manifest") ||
      true # (none read: said below)
    [ ${#ids[@]} -eq "$n" ] || { echo "local-cluster.sh: $rollback lists ${#ids[@]} servers, not $n" >&2; exit 1; }
    echo "rolling back to the job checkpoint after step $step (server checkpoints ${ids[*]})"
  fi
  local grpc=""
  for ((i = 0; i < n; i++)); do
    local extra=()
    [ $i -eq 0 ] && extra+=(--coordinator)
    [ ${#ids[@]} -gt 0 ] && extra+=(--restore-id="${ids[$i]}")
    grpc+="${grpc:+,}127.0.0.1:$((base + 100 + i))"
    rm -f "$dir/port-$i"
    env ${token:+PS_SERVER_TOKEN="$token"} nohup "$bin/ps-server" "${tls[@]}" --port=$((base + i)) --grpc-port=$((base + 100 + i)) \
      --metrics-port=$((base + 2000 + i)) --cluster-map-file="$dir/cluster.map" \
      --server-index=$i --tables="$table" --ckpt-dir="$dir/ckpt-$i" --ckpt-interval-s=60 --ckpt-keep=10 \
      --port-file="$dir/port-$i" "${extra[@]}" >"$dir/logs/server-$i.log" 2>&1 &
    echo "$i $((base + i)) $((base + 100 + i)) $((base + 2000 + i)) $!" >>"$dir/servers.txt"
  done
  # every server serves once its checkpoint is restored (a large one takes minutes): waited for
  # while it runs, at most START_WAIT_S (1800) seconds
  while read -r i dp gp mp pid; do
    for ((t = 0; t < ${START_WAIT_S:-1800} * 20; t++)); do
      [ -s "$dir/port-$i" ] && break
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.05
    done
    if [ ! -s "$dir/port-$i" ]; then
      echo "local-cluster.sh: server $i did not start; its log:" >&2
      tail -n 20 "$dir/logs/server-$i.log" >&2
      down; exit 1
    fi
  done <"$dir/servers.txt"
  echo "127.0.0.1:$((base + 100))" >"$dir/coordinator"
  echo "$grpc" >"$dir/grpc"
  echo "cluster up: $n servers, map $dir/cluster.map, coordinator $(cat "$dir/coordinator")," \
       "logs $dir/logs"
  [ "$secure" = 1 ] && echo "secure: TLS on both planes and a token; clients need" \
       "--tls-ca=$dir/tls/ca.pem and the token of $dir/token (PS_WORKER_TOKEN, PSCTL_TOKEN)"
  return 0
}

# psctl with the cluster's CA and token when it runs --secure.
psctl_secure() {
  if [ -f "$dir/secure" ]; then
    PSCTL_TOKEN=$(cat "$dir/token") "$bin/psctl" --tls-ca="$dir/tls/ca.pem" "$@"
  else
    "$bin/psctl" "$@"
  fi
}

status() {
  [ -f "$dir/servers.txt" ] || { echo "no cluster in $dir"; return 1; }
  local bad=0
  while read -r i dp gp mp pid; do
    if kill -0 "$pid" 2>/dev/null && out=$(psctl_secure --server=127.0.0.1:$gp --timeout-ms=2000 health 2>&1); then
      echo "server $i (pid $pid, data :$dp, gRPC :$gp, metrics :$mp): $(echo "$out" | tr '\n' ' ')"
    else
      echo "server $i (pid $pid): DOWN"; bad=1
    fi
  done <"$dir/servers.txt"
  return $bad
}

# Whether pid is still server $2 of this cluster (after a reboot or a crash the number may be
# another process's, which down must not signal): its command line names this directory's port
# file. (Not its binary: down may be given another --bin-dir, and a rebuild replaces the file.)
ours() {
  tr '\0' '\n' <"/proc/$1/cmdline" 2>/dev/null | grep -qxF -- "--port-file=$dir/port-$2"
}

down() {
  [ -f "$dir/servers.txt" ] || return 0
  while read -r i dp gp mp pid; do ours "$pid" "$i" && kill -TERM "$pid" 2>/dev/null || true; done <"$dir/servers.txt"
  # a server writes its exit checkpoint before it exits: waited for up to STOP_WAIT_S (300, as
  # the systemd units and Kubernetes allow), then killed, which loses what it had not written
  local wait=${STOP_WAIT_S:-300}
  while read -r i dp gp mp pid; do
    for ((t = 0; t < wait * 20; t++)); do ours "$pid" "$i" || break; sleep 0.05; done
    ours "$pid" "$i" && { echo "server $i did not stop in $wait s: killing it (its exit checkpoint is lost)" >&2; kill -9 "$pid"; }
  done <"$dir/servers.txt"
  rm -f "$dir/servers.txt"
  echo "cluster down ($dir)"
}

case "$cmd" in
  up) up ;;
  status) status ;;
  down) down ;;
  *) echo "usage: deploy/local-cluster.sh up|status|down [--servers=N] [--dir=DIR] [--bin-dir=BIN] [--base-port=P] [--table=SPEC] [--rollback=JOBCKPT_DIR] [--secure]" >&2; exit 2 ;;
esac
