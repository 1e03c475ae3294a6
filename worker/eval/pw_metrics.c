/* pw_metrics.c: see pw_metrics.h. */
#include "pw_metrics.h"

#include <math.h>
#include <stdlib.h>

typedef struct sl {
    float s;
    float y;
} sl_t;

static int cmp_score(const void *a, const void *b) {
    const float x = ((const sl_t *)a)->s, y = ((const sl_t *)b)->s;
    return x < y ? -1 : x > y;
}

double pw_auc(const float *scores, const float *labels, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (isnan(scores[i])) /* no order holds them (qsort's comparator must be one) */
            return NAN;
    sl_t *v = malloc((n ? n : 1) * sizeof *v);
    if (!v)
        return NAN;
    for (size_t i = 0; i < n; i++)
        v[i] = (sl_t){scores[i], labels[i]};
    qsort(v, n, sizeof *v, cmp_score);
    /* Sum of the (1-based, tie-averaged) ranks of the positives. */
    double rank_sum = 0, pos = 0;
    for (size_t i = 0; i < n;) {
        size_t j = i;
        double tp = 0;
        while (j < n && v[j].s == v[i].s)
            tp += v[j++].y > 0.5f;
        rank_sum += tp * ((double)(i + 1) + (double)j) / 2; /* ranks i+1 .. j */
        pos += tp;
        i = j;
    }
    free(v);
    const double neg = (double)n - pos;
    if (pos == 0 || neg == 0)
        return NAN;
    return (rank_sum - pos * (pos + 1) / 2) / (pos * neg);
}

double pw_logloss(const float *probs, const float *labels, size_t n) {
    double sum = 0;
    for (size_t i = 0; i < n; i++) {
        double p = probs[i] < 1e-7f ? 1e-7 : probs[i] > 1 - 1e-7 ? 1 - 1e-7 : probs[i];
        sum -= labels[i] > 0.5f ? log(p) : log1p(-p);
    }
    return n ? sum / (double)n : NAN;
}
