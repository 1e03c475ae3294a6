#!/usr/bin/env bash
# emberps-entrypoint: the image's ENTRYPOINT. The first argument says what the container runs:
#
#   server [FLAG...]    ps-server, index from the pod's ordinal hostname (ps-server-3 -> 3)
#   worker [FLAG...]    ps-worker, rank from JOB_COMPLETION_INDEX (an Indexed Job), the servers'
#                       data and gRPC addresses (--servers, --server-grpc) from the Services
#   serve [FLAG...]     ps-serve, the online serving replica: follows every server of the
#                       cluster map (--follow) with the Secret's token and TLS toward them,
#                       serves gRPC with the same token and TLS (PS_SERVE_* settings: ConfigMap)
#   health              exit 0 when this pod's ps-server answers psctl health (probes)
#   health serve        exit 0 when this pod's ps-serve can score: the grpc.health.v1 Check of
#                       emberps.Serving (psctl probe) is SERVING once a dense model is in
#                       (readiness: no Predict traffic before)
#   health serve-live   exit 0 when this pod's ps-serve answers the Check of "" (liveness)
#   datagen DIR PARTS [FLAG...]  ps-datagen into DIR, training rows split into PARTS files
#   psctl|ps-server|ps-worker|ps-serve|ps-datagen [ARG...]   that program as is
#   anything else       run it (a shell for debugging)
#
# server, worker and serve add the cluster flags derived from the environment; FLAGs given after
# them win (the programs take the last value of a flag). Environment:
#   EMBER_SERVERS         number of servers (the StatefulSet's replicas)           (required)
#   EMBER_SERVER_NAME     the StatefulSet's name, also its pods' prefix            (ps-server)
#   EMBER_SERVER_DOMAIN   DNS name of server i: EMBER_SERVER_NAME-i.EMBER_SERVER_DOMAIN
#                         (default ${POD_NAMESPACE}.svc: the per-server Services of deploy/k8s,
#                         whose ClusterIPs stay when a pod moves)
#   EMBER_DATA_PORT, EMBER_GRPC_PORT, EMBER_METRICS_PORT                         (7400 7500 9400)
#   EMBER_SERVE_GRPC_PORT, EMBER_SERVE_METRICS_PORT   ps-serve's ports              (7600 9600)
#   EMBER_PORT_STRIDE     server i listens on PORT + i * STRIDE (0 in Kubernetes; the kind-free
#                         test runs every server on 127.0.0.1 with 1)                      (0)
#   EMBER_SECRET_DIR      files of the Secret: token, and TLS (tls.crt, tls.key, ca.crt) when
#                         the programs take them                              (/etc/emberps/secret)
#   EMBER_COORDINATOR     "" (server 0's Coordinator service, state in its memory), or an etcd
#                         cluster, etcd://HOST:PORT[,HOST:PORT...][/PREFIX]: the workers talk
#                         to it directly and server 0's Coordinator service (psctl workers)
#                         keeps its state there, so the job survives server 0's death      ("")
#   EMBER_RESOLVE_TIMEOUT_S  how long a server's DNS name may take to resolve          (120)
#   HOSTNAME, JOB_COMPLETION_INDEX, POD_IP, POD_NAMESPACE: set by Kubernetes (the manifests).
#
# The cluster map names servers by IPv4 address (libpsclient connects to IPv4 host:port), so
# the DNS names are resolved here, with getent, for a bounded time (a Service's name resolves
# once it exists). A name that does not resolve in time exits 1 (the pod is restarted, a Job
# counts a failure against its backoff limit); a wrong setting exits 2 (the Job's pod-failure
# policy fails the job at once). A failure inside a command substitution ends the script
# (inherit_errexit): the map is built before the exec, which would have started the server
# with an empty or partial map. ps-server's own PS_SERVER_* environment variables (the ConfigMap) carry its
# other settings, and ps-serve's PS_SERVE_* its (--host, the publish and versions directories are
# the Deployment's).
set -euo pipefail
shopt -s inherit_errexit

name=${EMBER_SERVER_NAME:-ps-server}
dport=${EMBER_DATA_PORT:-7400}
gport=${EMBER_GRPC_PORT:-7500}
mport=${EMBER_METRICS_PORT:-9400}
stride=${EMBER_PORT_STRIDE:-0}
sgport=${EMBER_SERVE_GRPC_PORT:-7600}
smport=${EMBER_SERVE_METRICS_PORT:-9600}
secret=${EMBER_SECRET_DIR:-/etc/emberps/secret}

die() { echo "emberps-entrypoint: $*" >&2; exit 2; }

# resolve NAME: its IPv4 address (NAME itself when it is one), waiting up to
# EMBER_RESOLVE_TIMEOUT_S for DNS (then exit 1: a transient failure, unlike die's).
resolve() {
  local n=$1 ip="" t wait_s=${EMBER_RESOLVE_TIMEOUT_S:-120}
  [ -n "$n" ] || die "no server name to resolve (set POD_NAMESPACE or EMBER_SERVER_DOMAIN)"
  if [[ $n =~ ^[0-9]+\.[0-9]+\.[0-9]+\.[0-9]+$ ]]; then echo "$n"; return; fi
  [[ $wait_s =~ ^[0-9]+$ ]] || die "EMBER_RESOLVE_TIMEOUT_S=$wait_s is not a count of seconds"
  wait_s=$((10#$wait_s)) # (08: not octal)
  for ((t = 0; t < 2 * wait_s; t++)); do
    ip=$(getent ahostsv4 "$n" 2>/dev/null | awk 'NR == 1 { print $1 }') || true
    [ -n "$ip" ] && { echo "$ip"; return; }
    [ $t -eq 0 ] && echo "emberps-entrypoint: waiting for $n to resolve" >&2
    sleep 0.5
  done
  echo "emberps-entrypoint: $n did not resolve in $wait_s s" >&2
  exit 1
}

server_host() { echo "$name-$1.${EMBER_SERVER_DOMAIN:-${POD_NAMESPACE:?POD_NAMESPACE unset}.svc}"; }

# The cluster map: EMBER_SERVERS servers, slots split evenly (as deploy/local-cluster.sh does).
cluster_map() {
  local n=${EMBER_SERVERS:?EMBER_SERVERS unset} per addrs="" slots="" i lo hi
  [[ $n =~ ^[1-9][0-9]*$ ]] || die "EMBER_SERVERS=$n is not a count"
  per=$((16384 / n))
  for ((i = 0; i < n; i++)); do
    addrs+="${addrs:+,}$(resolve "$(server_host $i)"):$((dport + i * stride))"
    lo=$((i * per)) hi=$(((i + 1) * per - 1))
    [ $i -eq $((n - 1)) ] && hi=16383
    slots+="${slots:+,}$lo-$hi:$i"
  done
  echo "version=1;servers=$addrs;slots=$slots"
}

# The Secret's files. ps-server and ps-serve take them by environment (PS_SERVER_*, PS_SERVE_*:
# the token stays off the command line); ps-worker and psctl by flags, ps-serve's toward the
# training servers too. TLS is on when tls.crt, tls.key and ca.crt are there (tls_client_auth: set
# PS_SERVER_TLS_CLIENT_AUTH, PS_SERVE_TLS_CLIENT_AUTH in the ConfigMap). Without a token and
# without TLS, a bind beyond loopback (PS_SERVER_HOST, PS_SERVE_HOST 0.0.0.0) is refused unless
# PS_SERVER_INSECURE_REMOTE / PS_SERVE_INSECURE_REMOTE=true say so.
token="" client=() tls=() follow=() # flags of ps-worker and psctl; psctl's TLS only; ps-serve's
if [ -s "$secret/token" ]; then
  token=$(cat "$secret/token")
  export PS_SERVER_TOKEN=$token
  client+=(--token="$token")
fi
if [ -s "$secret/tls.crt" ] && [ -s "$secret/tls.key" ] && [ -s "$secret/ca.crt" ]; then
  export PS_SERVER_TLS_CERT=$secret/tls.crt PS_SERVER_TLS_KEY=$secret/tls.key
  export PS_SERVER_TLS_CA=$secret/ca.crt
  tls=(--tls-ca="$secret/ca.crt" --tls-cert="$secret/tls.crt" --tls-key="$secret/tls.key")
  client+=("${tls[@]}")
  follow=(--follow-tls-ca="$secret/ca.crt" --follow-tls-cert="$secret/tls.crt"
          --follow-tls-key="$secret/tls.key")
fi

cmd=${1:-}
[ $# -gt 0 ] && shift
case "$cmd" in
  server)
    host=${HOSTNAME:?HOSTNAME unset}
    idx=${host##*-}
    [[ $host == "$name-"* && $idx =~ ^[0-9]+$ ]] ||
      die "hostname $host is not $name-<ordinal> (a StatefulSet pod)"
    [ "$idx" -lt "${EMBER_SERVERS:?EMBER_SERVERS unset}" ] ||
      die "$host: ordinal $idx but EMBER_SERVERS=$EMBER_SERVERS (scale the Services and the map too)"
    extra=()
    [ "$idx" -eq 0 ] && extra+=(--coordinator) # server 0 is also the job's coordinator
    [ "$idx" -eq 0 ] && [ -n "${EMBER_COORDINATOR:-}" ] && extra+=(--coordinator-store="$EMBER_COORDINATOR")
    map=$(cluster_map)
    exec ps-server --cluster-map="$map" --server-index="$idx" \
      --port=$((dport + idx * stride)) --grpc-port=$((gport + idx * stride)) \
      --metrics-port=$((mport + idx * stride)) "${extra[@]}" "$@"
    ;;
  worker)
    rank=${JOB_COMPLETION_INDEX:?JOB_COMPLETION_INDEX unset (run workers as an Indexed Job)}
    grpcs="" # every server's gRPC address, in map order (coordinated checkpoints)
    for ((i = 0; i < ${EMBER_SERVERS:?EMBER_SERVERS unset}; i++)); do
      grpcs+="${grpcs:+,}$(resolve "$(server_host $i)"):$((gport + i * stride))"
    done
    if [ -n "${EMBER_COORDINATOR:-}" ]; then coord=$EMBER_COORDINATOR; else
      coord=$(resolve "$(server_host 0)"):$gport
    fi
    map=$(cluster_map)
    exec ps-worker --servers="$map" --rank="$rank" --server-grpc="$grpcs" \
      --coordinator="$coord" --host="${POD_IP:-127.0.0.1}" "${client[@]}" "$@"
    ;;
  serve)
    # The replica: every server of the map, by the same addresses the workers use. Its own gRPC
    # port with the same token (also the admin token: LoadVersion, Follow) and TLS.
    if [ -n "$token" ]; then export PS_SERVE_TOKEN=$token PS_SERVE_FOLLOW_TOKEN=$token; fi
    if [ ${#tls[@]} -gt 0 ]; then
      export PS_SERVE_TLS_CERT=$secret/tls.crt PS_SERVE_TLS_KEY=$secret/tls.key
      export PS_SERVE_TLS_CA=$secret/ca.crt
    fi
    map=$(cluster_map)
    exec ps-serve --follow="$map" --grpc-port="$sgport" --metrics-port="$smport" \
      "${follow[@]}" "$@"
    ;;
  health)
    # this pod's ps-serve: grpc.health.v1, no token needed. serve: emberps.Serving, SERVING once
    # a dense model is in (readiness); serve-live: service "", the process answers (liveness)
    if [ "${1:-}" = serve ]; then
      exec psctl --server="127.0.0.1:$sgport" --timeout-ms=2000 "${tls[@]}" probe emberps.Serving >/dev/null
    fi
    if [ "${1:-}" = serve-live ]; then
      exec psctl --server="127.0.0.1:$sgport" --timeout-ms=2000 "${tls[@]}" probe >/dev/null
    fi
    # This pod's server (the probe runs in its container): index from the hostname as above.
    idx=${HOSTNAME##*-}
    [[ $idx =~ ^[0-9]+$ ]] || idx=0
    exec psctl --server="127.0.0.1:$((gport + idx * stride))" --timeout-ms=2000 "${client[@]}" health >/dev/null
    ;;
  datagen)
    [ $# -ge 2 ] || die "usage: datagen DIR PARTS [ps-datagen FLAG...]"
    dir=$1 parts=$2
    shift 2
    mkdir -p "$dir"
    ps-datagen --out="$dir/all.tsv" --test-out="$dir/test.tsv" "$@"
    # Files are split among workers by rank (file i -> rank i % world): PARTS files, by lines.
    (cd "$dir" && split -n "l/$parts" -d -a 2 all.tsv part- && rm -f all.tsv)
    ;;
  ps-server | ps-worker | ps-serve | psctl | ps-datagen) exec "$cmd" "$@" ;;
  "") die "usage: emberps-entrypoint server|worker|serve|health [serve|serve-live]|datagen|psctl|ps-server|ps-worker|ps-serve|ps-datagen [ARG...]" ;;
  *) exec "$cmd" "$@" ;;
esac
