/* pw_fm.c: see pw_fm.h. */
#include "pw_fm.h"

#include <string.h>

#define K_MAX 1024

void pw_fm_forward(int batch, int nf, int k, const float *rows, float *logits) {
    const int w = k + 1;
    float sum[K_MAX];
    for (int s = 0; s < batch; s++) {
        const float *r = rows + (size_t)s * nf * w;
        double lin = 0, sq = 0;
        memset(sum, 0, (size_t)k * sizeof(float));
        for (int f = 0; f < nf; f++) {
            lin += r[f * w];
            for (int j = 0; j < k; j++) {
                const float v = r[f * w + 1 + j];
                sum[j] += v;
                sq += (double)v * v;
            }
        }
        double pair = 0;
        for (int j = 0; j < k; j++)
            pair += (double)sum[j] * sum[j];
        logits[s] += (float)(lin + 0.5 * (pair - sq));
    }
}

void pw_fm_backward(int batch, int nf, int k, const float *rows, const float *dlogits,
                    float *drows) {
    const int w = k + 1;
    float sum[K_MAX];
    for (int s = 0; s < batch; s++) {
        const float *r = rows + (size_t)s * nf * w;
        float *d = drows + (size_t)s * nf * w;
        const float g = dlogits[s];
        memset(sum, 0, (size_t)k * sizeof(float));
        for (int f = 0; f < nf; f++)
            for (int j = 0; j < k; j++)
                sum[j] += r[f * w + 1 + j];
        for (int f = 0; f < nf; f++) {
            d[f * w] = g;
            for (int j = 0; j < k; j++) /* d/dv_fj = sum_j - v_fj */
                d[f * w + 1 + j] = g * (sum[j] - r[f * w + 1 + j]);
        }
    }
}
