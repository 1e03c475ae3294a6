#!/usr/bin/env bash
# systemd_verify.sh SRC BIN: deploy/systemd's units pass `systemd-analyze verify` (with ExecStart
# pointed at BIN/ps-server in a temp copy: verify needs the binary to exist), keep the hardening
# and stop behaviour the README promises, and every PS_SERVER_* they or the example
# EnvironmentFile set is a real ps-server setting (ps-server ignores unknown variables, so a typo
# would be silent). The settings are then loaded by ps-server itself (--print-config).
set -euo pipefail
src=$1 bin=$2
command -v systemd-analyze >/dev/null ||
  { echo "SKIP: no systemd-analyze (apt-get install systemd: deploy/install-deps.sh)"; exit 77; }
tmp=$(mktemp -d /tmp/systemd-verify.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
bad=0
say() { echo "FAIL: $*"; bad=1; }
for u in ps-server.service ps-server@.service; do
  f=$src/deploy/systemd/$u
  name=$u
  [ "$u" = ps-server@.service ] && name=ps-server@0.service # a template verifies as an instance
  grep -q '^ExecStart=/opt/emberps/bin/ps-server$' "$f" || say "$u: ExecStart is not /opt/emberps/bin/ps-server"
  sed "s|^ExecStart=/opt/emberps/bin/ps-server|ExecStart=$bin/ps-server|" "$f" >"$tmp/$name"
  # verify exits 1 on some errors and only warns ("Failed to parse ..., ignoring") on others:
  # a clean unit prints nothing, so any message fails the test.
  rc=0
  out=$(systemd-analyze verify "$tmp/$name" 2>&1) || rc=$?
  out=$(grep -v '^$' <<<"$out" || true)
  [ $rc -eq 0 ] && [ -z "$out" ] || say "$u: systemd-analyze verify (exit $rc): $out"
  for want in '^NoNewPrivileges=yes$' '^ProtectSystem=strict$' '^ProtectHome=yes$' '^PrivateTmp=yes$' \
      '^RestrictAddressFamilies=AF_INET AF_INET6 AF_UNIX$' '^User=emberps$' '^Restart=on-failure$' \
      '^KillSignal=SIGTERM$' '^ReadWritePaths=/var/lib/emberps' '^EnvironmentFile=/etc/emberps/ps-server.env$'; do
    grep -Eq "$want" "$f" || say "$u: no line $want"
  done
  t=$(sed -n 's/^TimeoutStopSec=\([0-9]*\)$/\1/p' "$f")
  [ -n "$t" ] && [ "$t" -ge 60 ] || say "$u: TimeoutStopSec '$t' leaves no time for the exit checkpoint"
  # the data directories are under ReadWritePaths
  rw=$(sed -n 's/^ReadWritePaths=//p' "$f")
  for d in $(grep -o 'PS_SERVER_\(CKPT\|TIER\)_DIR=[^ ]*' "$f" | cut -d= -f2); do
    [[ $d == "$rw"/* ]] || say "$u: $d is not under ReadWritePaths=$rw"
  done
done
# Every PS_SERVER_* name is a setting of this ps-server.
known=$("$bin/ps-server" --print-config | sed -n 's/^\([a-z_0-9]*\) = .*/\1/p' | tr a-z A-Z)
for v in $(cat "$src"/deploy/systemd/* | grep -o 'PS_SERVER_[A-Z_0-9]\+' | sort -u); do
  grep -qx "${v#PS_SERVER_}" <<<"$known" || say "$v is not a ps-server setting"
done
# The example EnvironmentFile, as systemd passes it, is accepted by ps-server.
if ! out=$(env -i $(grep -v '^#' "$src/deploy/systemd/ps-server.env" | grep .) \
    "$bin/ps-server" --print-config 2>&1); then say "ps-server refuses ps-server.env: $out"; fi
[ $bad = 0 ] && echo "PASS: units verified"
exit $bad
