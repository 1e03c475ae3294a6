#!/usr/bin/env bash
# etcd_cluster.sh: real etcd members on loopback for the tests (Debian's etcd-server 3.4).
#
#   etcd_cluster.sh start DIR N    start N members (free ports), wait (at most 30 s a try; 3
#                                  tries when a port was taken) until the cluster answers;
#                                  DIR/endpoints gets "127.0.0.1:P1,...", DIR/pid-<i> each
#                                  member's pid, DIR/client-<i> its endpoint
#   etcd_cluster.sh leader DIR     the index of the member that is the leader now
#   etcd_cluster.sh kill DIR I     kill -9 member I
#   etcd_cluster.sh stop1 DIR I    stop member I (SIGSTOP: its connections stay open)
#   etcd_cluster.sh stop DIR       kill every member (and remove their data)
# Exit 77 (ctest's skip) from start when etcd is not installed. Every wait is bounded.
set -euo pipefail
cmd=${1:?usage: etcd_cluster.sh start|leader|kill|stop1|stop DIR [ARG]} dir=${2:?DIR}
export ETCDCTL_API=3

free_port() {
  /usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

case "$cmd" in
  start)
    n=${3:-1}
    command -v etcd >/dev/null || { echo "SKIP: etcd is not installed (apt-get install etcd-server etcd-client)"; exit 77; }
    mkdir -p "$dir"
    # A port picked free may be taken before etcd binds it (another test's connection gets it as
    # its source port): a member that exits on "address already in use" is started again, with
    # every member on new ports, at most 3 times in all. The wait is bounded by the clock, not by
    # a count of health checks (one check against a dead member takes its whole timeout).
    for ((attempt = 1; attempt <= 3; attempt++)); do
      cluster="" eps=""
      for ((i = 0; i < n; i++)); do
        c=$(free_port) p=$(free_port)
        echo "127.0.0.1:$c" >"$dir/client-$i"
        echo "$p" >"$dir/peer-$i"
        cluster+="${cluster:+,}e$i=http://127.0.0.1:$p"
        eps+="${eps:+,}127.0.0.1:$c"
      done
      rm -rf "$dir"/data-*
      for ((i = 0; i < n; i++)); do
        c=$(cat "$dir/client-$i") p=$(cat "$dir/peer-$i")
        etcd --name "e$i" --data-dir "$dir/data-$i" \
          --listen-client-urls "http://$c" --advertise-client-urls "http://$c" \
          --listen-peer-urls "http://127.0.0.1:$p" --initial-advertise-peer-urls "http://127.0.0.1:$p" \
          --initial-cluster "$cluster" --initial-cluster-state new --initial-cluster-token "t-$$-$attempt" \
          --logger zap --log-level error >"$dir/log-$i" 2>&1 &
        echo $! >"$dir/pid-$i"
      done
      echo "$eps" >"$dir/endpoints"
      deadline=$((SECONDS + 30)) dead=""
      while ((SECONDS < deadline)); do
        for ((i = 0; i < n; i++)); do
          kill -0 "$(cat "$dir/pid-$i")" 2>/dev/null || dead+=" $i"
        done
        [ -n "$dead" ] && break
        if timeout 3 etcdctl --endpoints="$eps" --dial-timeout=1s --command-timeout=2s \
          endpoint health >/dev/null 2>&1; then
          exit 0
        fi
        sleep 0.2
      done
      if [ -z "$dead" ]; then
        echo "etcd did not come up in 30 s:"; tail -n 5 "$dir"/log-*; exit 1
      fi
      for f in "$dir"/pid-*; do kill -9 "$(cat "$f")" 2>/dev/null || true; done
      wait 2>/dev/null || true
      if ! grep -q "address already in use" "$dir"/log-*; then
        echo "etcd member(s)$dead exited:"; tail -n 5 "$dir"/log-*; exit 1
      fi
      echo "etcd member(s)$dead found a port taken (attempt $attempt); starting again on new ports" >&2
    done
    echo "etcd: ports taken on 3 attempts:"; tail -n 5 "$dir"/log-*; exit 1
    ;;
  leader)
    for f in "$dir"/client-*; do
      i=${f##*-}
      kill -0 "$(cat "$dir/pid-$i")" 2>/dev/null || continue
      st=$(timeout 5 etcdctl --endpoints="$(cat "$f")" --dial-timeout=1s endpoint status -w fields 2>/dev/null) || continue
      me=$(sed -n 's/^"MemberID" : //p' <<<"$st") lead=$(sed -n 's/^"Leader" : //p' <<<"$st")
      if [ -n "$me" ] && [ "$me" = "$lead" ]; then echo "$i"; exit 0; fi
    done
    echo "no leader" >&2; exit 1
    ;;
  kill)
    i=${3:?member index}
    kill -9 "$(cat "$dir/pid-$i")" 2>/dev/null || true
    ;;
  stop1)
    i=${3:?member index}
    kill -STOP "$(cat "$dir/pid-$i")"
    ;;
  stop)
    for f in "$dir"/pid-*; do
      [ -e "$f" ] || continue
      kill -9 "$(cat "$f")" 2>/dev/null || true
    done
    rm -rf "$dir"/data-*
    ;;
  *) echo "etcd_cluster.sh: unknown command $cmd" >&2; exit 2 ;;
esac
