#!/bin/sh
# worker_predictions.sh BIN_DIR: ps-worker --predictions=FILE writes the final evaluation's
# predicted probability of every test sample, one per line in test-stream order:
#   - as many lines as the test samples the summary counts, each a probability in [0, 1];
#   - the AUC recomputed from the file and the test file's labels (sort + awk, ties averaged as
#     pw_auc does) equals the printed one to 1e-9 ("%.9g" gives each float back exactly);
#   - with --test absent, --predictions is refused (exit 2, naming --test).
set -eu
export LC_ALL=C
bin=$1
dir=$(mktemp -d /tmp/ember-wpred-XXXXXX)
trap 'rm -rf "$dir"' EXIT
"$bin/ps-datagen" --rows=6000 --test-rows=1500 --out="$dir/train.tsv" \
  --test-out="$dir/test.tsv" 2>/dev/null
"$bin/ps-worker" --local --device=cpu --train="$dir/train.tsv" --test="$dir/test.tsv" \
  --batch=256 --predictions="$dir/pred.txt" --json >"$dir/out.json"
cat "$dir/out.json"
json() { sed -n "s/.*\"$1\":\([^,}]*\).*/\1/p" "$dir/out.json"; }
nsamples=$(json test_samples)
auc=$(json auc)
nlines=$(wc -l <"$dir/pred.txt")
[ "$nlines" -eq "$nsamples" ] || { echo "FAIL: $nlines predictions for $nsamples test samples"; exit 1; }
[ "$nsamples" -eq 1500 ] || { echo "FAIL: $nsamples test samples, want 1500"; exit 1; }
awk '$1 < 0 || $1 > 1 || $1 != $1 + 0 { print "FAIL: line " NR ": " $0; bad = 1 } END { exit bad }' \
  "$dir/pred.txt"
ls "$dir" | grep -q tmp && { echo "FAIL: a temporary file left"; exit 1; }
# score<TAB>label, sorted by score; tie-averaged ranks of the positives
cut -f1 "$dir/test.tsv" | paste "$dir/pred.txt" - | sort -g -k1,1 >"$dir/scored.txt"
recomputed=$(awk -F '\t' '
  function flush() { rank_sum += tp * (i0 + 1 + n) / 2; pos += tp; tp = 0 }
  { if (NR > 1 && $1 != prev) { flush(); i0 = n } ; n++; if ($2 > 0.5) tp++; prev = $1 }
  END { flush(); neg = n - pos; printf "%.12f\n", (rank_sum - pos * (pos + 1) / 2) / (pos * neg) }
' "$dir/scored.txt")
echo "auc printed $auc, recomputed from the file $recomputed"
awk -v a="$auc" -v b="$recomputed" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d < 1e-9) }' ||
  { echo "FAIL: the AUC from the predictions differs"; exit 1; }
rc=0
"$bin/ps-worker" --local --device=cpu --train="$dir/train.tsv" --predictions="$dir/p2.txt" \
  >/dev/null 2>"$dir/err.txt" || rc=$?
cat "$dir/err.txt"
[ "$rc" -eq 2 ] && grep -q -- "--predictions needs a test stream" "$dir/err.txt" ||
  { echo "FAIL: --predictions without --test: exit $rc"; exit 1; }
echo "ok"
