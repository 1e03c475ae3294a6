#!/bin/sh
# worker_device.sh BIN_DIR: ps-worker's --device choice as a user meets it, on any machine.
#   --device=auto      trains, after one line naming the backend and why (the GPU, or the CPU
#                      with the reason there is no GPU backend);
#   --device=cuda:1023 (a GPU no machine has) exits 1 with the reason, never a crash;
#   --device=tpu       exits 2 (a bad setting);
#   OpenBLAS's kernels: on a CPU with AVX2 and FMA the line names kernels newer than SSE3's (a
#   DYNAMIC_ARCH OpenBLAS that does not know the CPU falls back to Prescott's: ps-worker then runs
#   itself again with OPENBLAS_CORETYPE, pw_blas_select), and OPENBLAS_CORETYPE set by the user
#   is kept as it is.
set -eu
bin=$1
dir=$(mktemp -d /tmp/ember-device-XXXXXX)
trap 'rm -rf "$dir"' EXIT
"$bin/ps-datagen" --rows=3000 --test_rows=0 --vocab_max=500 --out="$dir/train.tsv" >/dev/null 2>&1
"$bin/ps-worker" --local --device=auto --train="$dir/train.tsv" --batch=256 --json \
    >"$dir/out.json" 2>"$dir/err.txt" || { cat "$dir/err.txt"; echo "FAIL: auto did not train"; exit 1; }
cat "$dir/err.txt"
grep -q -E "dense math on .*\(--device auto: (a GPU is present|no GPU backend: .+)\)" "$dir/err.txt" ||
    { echo "FAIL: no line saying which backend auto chose and why"; exit 1; }
grep -q '"device":' "$dir/out.json" || { echo "FAIL: no device in the summary"; exit 1; }
if grep -q -w avx2 /proc/cpuinfo && grep -q -w fma /proc/cpuinfo &&
    grep -q "no GPU backend" "$dir/err.txt"; then
  if grep -q -E "OpenBLAS (Prescott|Core2|Penryn|Dunnington|Nehalem|Atom|Sandybridge) kernels" "$dir/err.txt"; then
    echo "FAIL: OpenBLAS runs pre-AVX2 kernels on a CPU with AVX2"; exit 1
  fi
  OPENBLAS_CORETYPE=Prescott "$bin/ps-worker" --local --device=cpu --train="$dir/train.tsv" \
      --batch=256 --blas-threads=3 >/dev/null 2>"$dir/err.txt" || { cat "$dir/err.txt"; echo "FAIL: Prescott run"; exit 1; }
  grep -q "(--device cpu; OpenBLAS Prescott kernels, 3 threads)" "$dir/err.txt" ||
      { cat "$dir/err.txt"; echo "FAIL: the user's OPENBLAS_CORETYPE or --blas-threads was not kept"; exit 1; }
fi
rc=0
"$bin/ps-worker" --local --device=cuda:1023 --train="$dir/train.tsv" 2>"$dir/err.txt" >/dev/null || rc=$?
cat "$dir/err.txt"
[ "$rc" -eq 1 ] || { echo "FAIL: --device=cuda:1023 exited $rc, want 1"; exit 1; }
grep -q "cannot use cuda:1023: " "$dir/err.txt" || { echo "FAIL: no reason given"; exit 1; }
rc=0
"$bin/ps-worker" --local --device=tpu --train="$dir/train.tsv" 2>"$dir/err.txt" >/dev/null || rc=$?
[ "$rc" -eq 2 ] || { echo "FAIL: --device=tpu exited $rc, want 2"; exit 1; }
grep -q "unknown device" "$dir/err.txt" || { echo "FAIL: no message for a bad device"; exit 1; }
echo "ok"
