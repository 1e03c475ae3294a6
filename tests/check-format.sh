#!/usr/bin/env bash
# tests/check-format.sh: fail when a tracked C/C++/CUDA source differs from .clang-format.
# Fix with: git ls-files '*.c' '*.h' '*.cc' '*.cu' | xargs clang-format -i
set -euo pipefail
cd "$(dirname "$0")/.."
command -v clang-format >/dev/null || { echo "clang-format missing (deploy/install-deps.sh)"; exit 1; }
files=$(git ls-files '*.c' '*.h' '*.cc' '*.cpp' '*.cu' 2>/dev/null || true)
[ -n "$files" ] || # not a git checkout: every source directory
  files=$(find common ps-server serve worker bench tests \( -name '*.[ch]' -o -name '*.cc' \
    -o -name '*.cpp' -o -name '*.cu' \) 2>/dev/null)
bad=0
for f in $files; do
  if ! clang-format --dry-run -Werror "$f" >/dev/null 2>&1; then
    echo "not formatted: $f"
    clang-format --dry-run -Werror "$f" 2>&1 | head -n 6
    bad=1
  fi
done
[ $bad -eq 0 ] && echo "format ok"
exit $bad
