/* pw_fm.c: see pw_fm.h. */
#include "pw_fm.h"

#include <string.h>

/* sum[j] = sum_i v_ij x_i over sample s's features. */
static void factor_sums(size_t a, size_t b, const float *val, int k, const float *rows,
                        float *sum) {
    memset(sum, 0, (size_t)k * sizeof(float));
    for (size_t i = a; i < b; i++) {
        const float *v = rows + i * (size_t)(k + 1) + 1;
        for (int j = 0; j < k; j++)
            sum[j] += v[j] * val[i];
    }
}

void pw_fm_forward(int batch, const size_t *off, const float *val, int k, const float *rows,
                   float *logits) {
    float sum[PW_FM_K_MAX];
    for (int s = 0; s < batch; s++) {
        factor_sums(off[s], off[s + 1], val, k, rows, sum);
        double lin = 0, sq = 0, pair = 0;
        for (size_t i = off[s]; i < off[s + 1]; i++) {
            const float *r = rows + i * (size_t)(k + 1);
            const double x = val[i];
            lin += r[0] * x;
            for (int j = 0; j < k; j++)
                sq += (double)r[1 + j] * r[1 + j] * x * x;
        }
        for (int j = 0; j < k; j++)
            pair += (double)sum[j] * sum[j];
        logits[s] += (float)(lin + 0.5 * (pair - sq));
    }
}

void pw_fm_backward(int batch, const size_t *off, const float *val, int k, const float *rows,
                    const float *dlogits, float *drows) {
    float sum[PW_FM_K_MAX];
    for (int s = 0; s < batch; s++) {
        factor_sums(off[s], off[s + 1], val, k, rows, sum);
        const float g = dlogits[s];
        for (size_t i = off[s]; i < off[s + 1]; i++) {
            const float *r = rows + i * (size_t)(k + 1);
            float *d = drows + i * (size_t)(k + 1);
            const float x = val[i];
            d[0] = g * x;
            for (int j = 0; j < k; j++) /* d/dv_ij = x_i sum_j - v_ij x_i^2 */
                d[1 + j] = g * x * (sum[j] - r[1 + j] * x);
        }
    }
}
