#!/bin/sh
# worker_bad_data.sh BIN_DIR: ps-worker --local on data it cannot use, as a user meets it. Each
# case must exit 1 with exactly one line "ps-worker: FILE: why" on stderr:
#   - a small file (under 1000 lines) all malformed: "no usable samples: N lines read, N
#     malformed (first: line 1: ...)";
#   - an empty file: "no usable samples: 0 lines read";
#   - a libffm file read as libsvm: every line malformed, with a hint about --format;
#   - a libffm line with a field past the model's --fields: counted malformed, the rest trained;
#   - a CSV spec with too few columns: "expected 2 columns, got 4";
#   - a good training file with an all-bad test file: the test file named;
#   - a small file over --max-error-rate (20 of 200 lines bad): refused at 0.01 (the default),
#     trained at --max-error-rate=0.2 with the per-file counts in the text and JSON summaries;
#   - the same two on two parse threads: the same refusal, counts and test AUC;
#   - --max-error-rate=1 on an all-bad file: still no usable samples;
#   - good data and a dense learning rate the model diverges at: exit 1 at the first step whose
#     loss is not finite, no model saved;
#   - good data with pushes larger than the credits: it trains (it hung).
set -eu
bin=$1
dir=$(mktemp -d /tmp/ember-baddata-XXXXXX)
trap 'rm -rf "$dir"' EXIT
fails=0

# run NAME ARGS...: ps-worker --local (bounded), stdout to $dir/NAME.out, stderr to NAME.err;
# its exit status in $rc.
run() {
    name=$1
    shift
    rc=0
    timeout 120 "$bin/ps-worker" --local --model=lr --batch=64 --progress-every=0 "$@" \
        >"$dir/$name.out" 2>"$dir/$name.err" || rc=$?
}

# expect_fail NAME FILE PATTERN: exit 1 and exactly one stderr line "ps-worker: FILE: ..."
# that matches PATTERN (grep -E).
expect_fail() {
    name=$1 file=$2 pattern=$3
    lines=$(grep -c "^ps-worker: $file: " "$dir/$name.err" || true)
    if [ "$rc" -ne 1 ] || [ "$lines" -ne 1 ] ||
        ! grep "^ps-worker: $file: " "$dir/$name.err" | grep -q -E "$pattern"; then
        echo "FAIL: $name: exit $rc (want 1), $lines lines naming $file (want 1) matching: $pattern"
        cat "$dir/$name.err"
        fails=$((fails + 1))
    else
        echo "ok: $name: $(grep "^ps-worker: $file: " "$dir/$name.err")"
    fi
}

"$bin/ps-datagen" --rows=200 --test_rows=0 --vocab_max=500 --out="$dir/good.tsv" >/dev/null 2>&1

# Under 1000 lines, all malformed.
i=0
while [ $i -lt 812 ]; do
    echo "not a criteo line $i"
    i=$((i + 1))
done >"$dir/bad.tsv"
run allbad --train="$dir/bad.tsv"
expect_fail allbad "$dir/bad.tsv" \
    "no usable samples: 812 lines read, 812 malformed \(first: line 1: expected 40 tab-separated fields, got 1\)"

# An empty file.
: >"$dir/empty.tsv"
run empty --train="$dir/empty.tsv"
expect_fail empty "$dir/empty.tsv" "no usable samples: 0 lines read, 0 malformed$"

# libffm read as libsvm.
printf '1 0:3:1 1:7:1\n0 0:4:1 1:9:0.5\n1 0:3:1 1:8:1\n' >"$dir/a.ffm"
run ffm --format=libsvm --train="$dir/a.ffm"
expect_fail ffm "$dir/a.ffm" \
    "no usable samples: 3 lines read, 3 malformed \(first: line 1: feature 1: expected idx:val, got '0:3:1'\).*--format"

# A libffm line with a field past the model's count (--fields=2, field 5): one malformed line,
# counted and skipped, the file trained (the step refused the whole batch and the run stopped).
awk 'BEGIN { for (i = 1; i <= 200; i++)
  if (i == 50) print "1 0:3:1 5:7:1"; else print (i % 2) " 0:" (i % 13) ":1 1:" (i % 7) ":1" }' \
    >"$dir/f.ffm"
run ffm_field --model=deepfm --fields=2 --format=libffm --train="$dir/f.ffm"
if [ "$rc" -ne 0 ] || ! grep -q "^train $dir/f.ffm: 200 lines read, 199 samples, 1 malformed$" "$dir/ffm_field.out" ||
    ! grep -q "f.ffm:50: feature 2: field 5, the model has 2 fields" "$dir/ffm_field.err"; then
    echo "FAIL: a libffm field past --fields: exit $rc (want 0), or not counted as one malformed line:"
    cat "$dir/ffm_field.out" "$dir/ffm_field.err"
    fails=$((fails + 1))
else
    echo "ok: a libffm field past --fields is one malformed line"
fi

# A CSV spec with too few columns (the file has 4).
printf '1,31,2.5,1260759144\n1,1029,4.0,1260759179\n2,10,5.0,1260759185\n' >"$dir/r.csv"
run csv --format=csv --csv=threshold=4,columns=cat:label --train="$dir/r.csv"
expect_fail csv "$dir/r.csv" "expected 2 columns, got 4.*--csv"

# A good training file, an all-bad test file.
run badtest --train="$dir/good.tsv" --test="$dir/bad.tsv"
expect_fail badtest "$dir/bad.tsv" "no usable samples: 812 lines read, 812 malformed"

# 20 of 200 lines bad: over the default rate (a small file is checked at its end); allowed with
# --max-error-rate=0.2, and counted per file in both summaries.
awk 'NR % 10 == 3 { print "garbage"; next } { print }' "$dir/good.tsv" >"$dir/some.tsv"
run rate --train="$dir/some.tsv"
expect_fail rate "$dir/some.tsv" "20 of 200 lines malformed, over max_error_rate 0.01 \(first: line 3: "
run allowed --parse-threads=0 --max-error-rate=0.2 --train="$dir/some.tsv" --test="$dir/good.tsv" --json
if [ "$rc" -ne 0 ] ||
    ! grep -q "\"train_files\":\[{\"path\":\"$dir/some.tsv\",\"lines\":200,\"samples\":180,\"malformed\":20}\]" "$dir/allowed.out" ||
    ! grep -q "\"test_files\":\[{\"path\":\"$dir/good.tsv\",\"lines\":200,\"samples\":200,\"malformed\":0}\]" "$dir/allowed.out"; then
    echo "FAIL: --max-error-rate=0.2: exit $rc (want 0), or no per-file counts in the JSON:"
    cat "$dir/allowed.out" "$dir/allowed.err"
    fails=$((fails + 1))
else
    echo "ok: --max-error-rate=0.2 trains; JSON: $(grep -o '"train_files".*' "$dir/allowed.out")"
fi
# On two parse threads: the same refusal, and the same counts, loss and test AUC.
run rate_pt --parse-threads=2 --train="$dir/some.tsv"
expect_fail rate_pt "$dir/some.tsv" "20 of 200 lines malformed, over max_error_rate 0.01 \(first: line 3: "
run allowed_pt --parse-threads=2 --max-error-rate=0.2 --train="$dir/some.tsv" --test="$dir/good.tsv" --json
auc() { grep -o -E '"(train_loss|auc|logloss)":[^,]*' "$1" | tr '\n' ' '; }
if [ "$rc" -ne 0 ] || [ -z "$(auc "$dir/allowed.out")" ] ||
    [ "$(auc "$dir/allowed_pt.out")" != "$(auc "$dir/allowed.out")" ] ||
    ! grep -q "\"train_files\":\[{\"path\":\"$dir/some.tsv\",\"lines\":200,\"samples\":180,\"malformed\":20}\]" "$dir/allowed_pt.out"; then
    echo "FAIL: --parse-threads=2: exit $rc, $(auc "$dir/allowed_pt.out") (want $(auc "$dir/allowed.out")), or other counts:"
    cat "$dir/allowed_pt.out" "$dir/allowed_pt.err"
    fails=$((fails + 1))
else
    echo "ok: --parse-threads=2 trains the same: $(auc "$dir/allowed_pt.out")"
fi
run allowed_text --max_error_rate=0.2 --train="$dir/some.tsv"
if [ "$rc" -ne 0 ] ||
    ! grep -q "^train $dir/some.tsv: 200 lines read, 180 samples, 20 malformed$" "$dir/allowed_text.out"; then
    echo "FAIL: the text summary has no per-file counts (exit $rc):"
    cat "$dir/allowed_text.out" "$dir/allowed_text.err"
    fails=$((fails + 1))
else
    echo "ok: text summary: $(grep "^train " "$dir/allowed_text.out")"
fi

# Every line may be malformed, but no sample at all is still an error.
run rate1 --max-error-rate=1 --train="$dir/bad.tsv"
expect_fail rate1 "$dir/bad.tsv" "no usable samples: 812 lines read, 812 malformed"

# Good data, a learning rate the dense model diverges at (SGD at 100): the job stops at the first
# step whose loss is not finite (it trained on with NaN weights and wrote them out before).
"$bin/ps-datagen" --rows=3000 --test-rows=10 --out="$dir/gen.tsv" --test-out="$dir/gen_test.tsv" 2>/dev/null
run diverged --model=dlrm --train="$dir/gen.tsv" --dense-optimizer=sgd --dense-lr=100 \
    --save-dense="$dir/diverged.dense"
if [ "$rc" -ne 1 ] || ! grep -q "the loss is not finite at step .*: the dense model diverged" "$dir/diverged.err" ||
    [ -e "$dir/diverged.dense" ]; then
    echo "FAIL: a diverging model: exit $rc (want 1), or no 'diverged' line, or a model saved:"
    cat "$dir/diverged.err"
    fails=$((fails + 1))
else
    echo "ok: a diverging model stops the job: $(grep -o 'the loss is not finite at step [0-9]*' "$dir/diverged.err")"
fi

# Pushes larger than the credits (--credit-kib=64, 4096-sample batches): the step's mark, which
# waits for its pushes, once held credits they needed, and the first step hung for ever.
run credit --model=dlrm --batch=4096 --train="$dir/gen.tsv" --credit-kib=64
if [ "$rc" -ne 0 ]; then
    echo "FAIL: pushes over --credit-kib=64: exit $rc (124: hung)"
    cat "$dir/credit.err"
    fails=$((fails + 1))
else
    echo "ok: pushes over --credit-kib=64 train"
fi

[ "$fails" -eq 0 ] || { echo "FAIL: $fails cases"; exit 1; }
echo "ok"
