#!/bin/bash
# device_bundle.sh: packs what the GPU suite (tests/gpu/device_suite.sh) needs on a machine that
# has a GPU but none of EmberPS's build dependencies: the binaries of BUILD (default: build),
# the CUDA module, and every shared library they load except the C runtime's and CUDA's own
# (the GPU machine brings those), into .gpu/bundle.tar.xz (git ignores .gpu/ through
# .git/info/exclude). The binaries were linked against Debian 12's glibc, which newer systems
# run. Usage: tests/gpu/device_bundle.sh [BUILD]
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build}
[ -f "$build/lib/libember_cuda.so" ] || { echo "no $build/lib/libember_cuda.so (nvcc missing at configure time?)" >&2; exit 1; }
grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo /.gpu/ >> .git/info/exclude
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/b/bin" "$stage/b/lib" "$stage/b/tests"
bins="ps-bench ps-worker ps-server psctl ps-datagen"
for b in $bins; do cp "$build/bin/$b" "$stage/b/bin/"; done
cp "$build/tests/test_backend_equiv" "$stage/b/tests/"
cp -P "$build"/lib/libember_cuda.so "$build"/lib/libpsclient.so* "$stage/b/lib/"
{ for b in $bins; do ldd "$build/bin/$b"; done; ldd "$build/tests/test_backend_equiv"; } |
    awk '/=>/ {print $3}' | sort -u |
    grep -v -E '/(libc|libm|libpthread|libdl|librt|libgcc_s|libstdc\+\+)\.so|/cuda|libcudart|libcublas|libnccl' |
    while read -r lib; do cp -L "$lib" "$stage/b/lib/"; done
# ps-bench runs bench/dlrm_torch.py from the source tree it was built in: say which
sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$build/CMakeCache.txt" > "$stage/b/source_dir"
mkdir -p .gpu
tar -C "$stage" -cJf .gpu/bundle.tar.xz b
echo "$(du -h .gpu/bundle.tar.xz | cut -f1) .gpu/bundle.tar.xz: $(ls "$stage/b/lib" | wc -l) libraries"
