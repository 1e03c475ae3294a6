#!/bin/bash
# device_suite.sh: the GPU checks of docs/gpu.md in one run, on a machine with a GPU, CUDA 13
# (cudart, cuBLAS; NCCL from the toolkit or PyTorch's wheel) and PyTorch, from the bundle that
# tests/gpu/device_bundle.sh made (.gpu/bundle.tar.xz), run from the repository's root.
#
# Steps, each bounded by its own timeout, each logged to $OUT (or /tmp/gpu-out) as NAME.txt and
# summarized as "STEP NAME rc=N seconds=S" lines at the end:
#   env        the GPU, driver, where the CUDA libraries were found, python3's torch
#   equiv      test_backend_equiv cuda (the backend against the CPU, function by function,
#              layer by layer, a DLRM and DeepFM step, short training runs)
#   bench      ps-bench gpu --json (the worker's step against PyTorch on the same GPU)
#   worker     ps-worker trains DLRM on ps-datagen data with --device=cuda and =cpu, --local and
#              against a ps-server (sync), and the test AUC of each (they should agree to ~1e-3)
#   memcheck   compute-sanitizer --tool memcheck on test_backend_equiv cuda
# With --more (a second call, once those passed): the full ps-bench gpu (batch 32768 too),
# compute-sanitizer's initcheck, racecheck and synccheck on test_backend_equiv, a two-worker
# sync job on the one GPU (dense allreduce through NCCL) against a ps-server that is also the
# coordinator, and `modes`: one GPU worker against a ps-server in sync, ssp:2 and async mode,
# batch 4096 and 16384 (where a step's time goes: samples/s beside the time spent waiting for
# pulls).
# --only=NAME,NAME runs just those steps (env always runs).
# Usage: tests/gpu/device_suite.sh [--full-bench] [--skip-memcheck] [--more] [--only=NAMES]
set -u
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp/gpu-out}
mkdir -p "$out"
quick=--quick
memcheck=1
more=0
only=
for a in "$@"; do
    case $a in
    --full-bench) quick= ;;
    --skip-memcheck) memcheck=0 ;;
    --more) more=1 ;;
    --only=*) only=,${a#--only=}, ;;
    *) echo "usage: $0 [--full-bench] [--skip-memcheck] [--more] [--only=NAMES]" >&2; exit 2 ;;
    esac
done
summary=()
step() { # step NAME TIMEOUT CMD...: runs CMD under a timeout, output to the log and $out/NAME.txt
    local name=$1 limit=$2 t0 rc
    shift 2
    [ -z "$only" ] || [ "$name" = env ] || [[ $only == *,$name,* ]] || return 0
    echo "=== $name: $*"
    t0=$(date +%s)
    timeout --kill-after=10 "$limit" "$@" > "$out/$name.txt" 2>&1
    rc=$?
    tail -n 40 "$out/$name.txt"
    summary+=("STEP $name rc=$rc seconds=$(( $(date +%s) - t0 ))")
}

e=/tmp/ember-gpu
rm -rf "$e" && mkdir -p "$e" && tar -C "$e" -xJf .gpu/bundle.tar.xz || { echo "no bundle" >&2; exit 1; }
# CUDA's libraries: the toolkit's, then any pip wheel's (PyTorch brings NCCL as nvidia-nccl-cu13).
libs=$e/b/lib
for d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib; do
    [ -d "$d" ] && libs=$libs:$d
done
for n in libcudart.so.13 libcublas.so.13 libcublasLt.so.13 libnccl.so.2; do
    if ! LD_LIBRARY_PATH=$libs ldd "$e/b/lib/libember_cuda.so" | grep -q "$n => /"; then
        f=$(find /usr /opt -name "$n" 2>/dev/null | head -n 1)
        [ -n "$f" ] && libs=$libs:$(dirname "$f")
    fi
done
export LD_LIBRARY_PATH=$libs
export PATH=/usr/local/cuda/bin:$PATH
# ps-bench runs the PyTorch reference with the python3 it was configured with (/usr/bin/python3)
# from the source tree it was built in: make both resolve here.
src=$(cat "$e/b/source_dir")
if [ "$src" != "$PWD" ] && [ ! -e "$src" ]; then mkdir -p "$(dirname "$src")" && ln -s "$PWD" "$src"; fi
if ! /usr/bin/python3 -c 'import torch' 2>/dev/null; then
    py=$(command -v python3)
    if [ -n "$py" ] && [ "$py" != /usr/bin/python3 ] && "$py" -c 'import torch' 2>/dev/null; then
        [ -e /usr/bin/python3 ] && mv /usr/bin/python3 /usr/bin/python3.orig
        printf '#!/bin/sh\nexec %s "$@"\n' "$py" > /usr/bin/python3 && chmod +x /usr/bin/python3
    fi
fi

envcheck() {
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv
    nproc
    LD_LIBRARY_PATH=$libs ldd "$e/b/lib/libember_cuda.so" | grep -E 'cuda|cublas|nccl|not found'
    LD_LIBRARY_PATH=$libs ldd "$e/b/bin/ps-bench" | grep 'not found'
    /usr/bin/python3 -c 'import torch; print("torch", torch.__version__, torch.cuda.get_device_name(0))'
    command -v compute-sanitizer nvcc
    return 0
}
worker() {
    local d=/tmp/ember-gpu-worker b=$e/b/bin port=$((20000 + RANDOM % 10000)) dev
    rm -rf "$d" && mkdir -p "$d"
    "$b/ps-datagen" --rows=${ROWS:-200000} --test-rows=$(( ${ROWS:-200000} / 8 )) --vocab-max=200000 --out="$d/train.tsv" \
        --test-out="$d/test.tsv" --oracle-out="$d/oracle.json" 2>/dev/null
    cat "$d/oracle.json"; echo
    split -n l/2 -d --additional-suffix=.tsv "$d/train.tsv" "$d/part-"
    for dev in cuda cpu; do
        "$b/ps-worker" --local --device=$dev --train="$d/train.tsv" --test="$d/test.tsv" \
            --batch=4096 --bottom=512,256,16 --top=512,256,1 --json --progress-every=0 \
            2>"$d/err-$dev.txt" | tail -n 1
        echo "local $dev rc=${PIPESTATUS[0]}"; grep -E "dense math|rror|cannot" "$d/err-$dev.txt"
    done
    "$b/ps-server" --port=$port --grpc-port=$((port + 1)) --tables="name=emb,dim=16" 2>"$d/server.txt" &
    local spid=$!
    sleep 2
    for dev in cuda cpu; do
        "$b/ps-worker" --servers=127.0.0.1:$port --device=$dev --fresh --train="$d/train.tsv" \
            --test="$d/test.tsv" --batch=4096 --json --progress-every=0 2>"$d/derr-$dev.txt" | tail -n 1
        echo "server $dev rc=${PIPESTATUS[0]}"; grep -E "dense math|rror|cannot" "$d/derr-$dev.txt"
    done
    kill $spid; wait $spid
    bash tests/integration/worker_device.sh "$b"
}
# Two workers of one sync job: on the one GPU (NCCL cannot form on one device: the dense
# gradients go through the host, Gloo), on the CPU, and one on each; the AUCs should agree.
nccl() {
    local d=/tmp/ember-gpu-worker b=$e/b/bin port=$((20000 + RANDOM % 10000)) r pids
    "$b/ps-server" --port=$port --grpc-port=$((port + 1)) --coordinator --tables="name=emb,dim=16" \
        2>"$d/nserver.txt" &
    local spid=$!
    sleep 2
    local g=${NCCL_DEVICE:-cuda} pair devs
    for pair in $g,$g cpu,cpu $g,cpu; do # both on the GPU, both on the CPU, one each
        pids=()
        IFS=, read -r -a devs <<<"$pair"
        for r in 0 1; do
            "$b/ps-worker" --servers=127.0.0.1:$port --coordinator=127.0.0.1:$((port + 1)) \
                --world=2 --rank=$r --job=j${pair/,/-} --device=${devs[r]} --fresh --push-order=rank \
                --train="$d/part-00.tsv,$d/part-01.tsv" --test="$d/test.tsv" --batch=4096 \
                --timeout-ms=20000 --json --progress-every=0 >"$d/n$r.json" 2>"$d/n$r.txt" &
            pids+=($!)
        done
        wait "${pids[@]}"
        for r in 0 1; do
            echo "$pair rank $r:"; tail -n 1 "$d/n$r.json"; grep -v -E "^\s*$" "$d/n$r.txt" | tail -n 8
        done
    done
    kill $spid; wait $spid
}
# One GPU worker against one ps-server in each consistency mode: how far the sync chain (pull,
# compute, push, acknowledgement, next pull) holds the GPU back; each parsing on the reader thread
# and on the default parse threads, then the reader alone (ps-bench data).
modes() {
    local d=/tmp/ember-gpu-worker b=$e/b/bin port=$((20000 + RANDOM % 10000)) m batch
    if [ ! -s "$d/train.tsv" ]; then
        mkdir -p "$d"
        "$b/ps-datagen" --rows=200000 --test-rows=25000 --vocab-max=200000 --out="$d/train.tsv" \
            --test-out="$d/test.tsv" 2>/dev/null
    fi
    "$b/ps-server" --port=$port --grpc-port=$((port + 1)) --tables="name=emb,dim=16" \
        2>"$d/mserver.txt" &
    local spid=$!
    sleep 2
    local pt
    for pt in 0 -1; do # parsing on the reader thread; on the default parse threads
        for batch in 4096 16384; do
            for m in sync ssp:2 async; do
                "$b/ps-worker" --servers=127.0.0.1:$port --device=cuda --fresh --mode=$m \
                    --train="$d/train.tsv" --batch=$batch --parse-threads=$pt --json \
                    --progress-every=0 2>"$d/merr.txt" | tail -n 1 | /usr/bin/python3 -c '
import json,sys
d=json.load(sys.stdin)
print("parse threads %s batch %s mode %-6s %9.0f samples/s, pull wait %.3f of %.3f s" % (
      sys.argv[1], sys.argv[2], sys.argv[3], d["samples_per_s"], d["pull_wait_s"], d["seconds"]))
' $pt $batch $m
            done
        done
    done
    "$b/ps-bench" data --quick | tail -n 5
    kill $spid; wait $spid
}
export e libs
export -f envcheck worker nccl modes
step env 60 bash -c envcheck
step equiv 120 "$e/b/tests/test_backend_equiv" cuda
[ $more = 1 ] || step bench 200 "$e/b/bin/ps-bench" gpu $quick --json
if [ $memcheck = 1 ]; then
    step memcheck 170 compute-sanitizer --tool memcheck --error-exitcode 3 \
        "$e/b/tests/test_backend_equiv" cuda
fi
step worker 150 bash -c worker
if [ $more = 1 ] || [ -n "$only" ]; then
    step nccl 120 bash -c nccl
    for t in initcheck synccheck; do
        step $t 120 compute-sanitizer --tool $t --error-exitcode 3 "$e/b/tests/test_backend_equiv" cuda
    done
    # racecheck runs the kernels ~100x slower: the training runs on a fifth of the rows
    step racecheck 300 compute-sanitizer --tool racecheck --error-exitcode 3 \
        "$e/b/tests/test_backend_equiv" cuda --short
    step modes 240 bash -c modes
    step benchfull 300 "$e/b/bin/ps-bench" gpu --json
fi
printf '%s\n' "${summary[@]}" | tee "$out/summary.txt"
