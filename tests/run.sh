#!/usr/bin/env bash
# tests/run.sh: install dependencies, configure, build and run the whole EmberPS test suite.
#
#   tests/run.sh            Release build in build/, every test (what CI runs)
#   tests/run.sh --asan     ASan + UBSan build in build-asan/
#   tests/run.sh --tsan     TSan build in build-tsan/
#   tests/run.sh -L unit    extra arguments go to ctest (here: only the unit label)
#
# Also checks that every C/C++/CUDA source is clang-formatted. Exit status 0 only when the build,
# the format check and every test pass.
set -euo pipefail
cd "$(dirname "$0")/.."

sanitize=none
build=build
if [ "${1:-}" = "--asan" ]; then sanitize=address; build=build-asan; shift; fi
if [ "${1:-}" = "--tsan" ]; then sanitize=thread; build=build-tsan; shift; fi

deploy/install-deps.sh

echo "== format check"
tests/check-format.sh

echo "== configure and build ($build, sanitizer: $sanitize)"
mkdir -p "$build"
# With a CUDA toolkit the GPU module must build (EMBER_CUDA=ON fails the configure otherwise),
# so a toolkit that CMake stops finding is an error, not a silently CPU-only suite.
cuda=AUTO
if [ -x /usr/local/cuda/bin/nvcc ] || command -v nvcc >/dev/null; then cuda=ON; fi
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DEMBER_SANITIZE="$sanitize" \
      -DEMBER_WERROR=ON -DEMBER_CUDA="$cuda" >"$build/configure.log" 2>&1 ||
    { cat "$build/configure.log"; exit 1; }
grep -E "EmberPS: CUDA module" "$build/configure.log" || true
cmake --build "$build" -j2

echo "== tests"
export TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 suppressions=$PWD/tests/tsan.supp ${TSAN_OPTIONS:-}"
export ASAN_OPTIONS="detect_leaks=1 abort_on_error=1 ${ASAN_OPTIONS:-}"
export LSAN_OPTIONS="suppressions=$PWD/tests/lsan.supp ${LSAN_OPTIONS:-}"
export UBSAN_OPTIONS="print_stacktrace=1 halt_on_error=1 ${UBSAN_OPTIONS:-}"
ctest --test-dir "$build" --output-on-failure --no-tests=error --timeout 600 "$@"
