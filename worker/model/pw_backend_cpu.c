/* pw_backend_cpu.c: the CPU backend: OpenBLAS for GEMM, plain loops (auto-vectorized) for the
 * elementwise parts. */
#include "pw_backend.h"

#include <cblas.h>

static void cpu_gemm(bool ta, bool tb, int m, int n, int k, float alpha, const float *a,
                     const float *b, float beta, float *c) {
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n,
                k, alpha, a, ta ? m : k, b, tb ? k : n, beta, c, n);
}

static void cpu_add_bias(int rows, int cols, const float *bias, float *y) {
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++)
            y[(size_t)r * cols + c] += bias[c];
}

static void cpu_col_sum(int rows, int cols, const float *x, float beta, float *out) {
    for (int c = 0; c < cols; c++)
        out[c] *= beta;
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++)
            out[c] += x[(size_t)r * cols + c];
}

static void cpu_relu(size_t n, const float *x, float *y) {
    for (size_t i = 0; i < n; i++)
        y[i] = x[i] > 0 ? x[i] : 0.0f;
}

static void cpu_relu_grad(size_t n, const float *y, const float *dy, float *dx) {
    for (size_t i = 0; i < n; i++)
        dx[i] = y[i] > 0 ? dy[i] : 0.0f;
}

/* Per field of sample s, the factor its features are scaled by: 1 / count for mean, else 1. */
static void field_scale(const size_t *off, const uint16_t *field, int s, int nf, bool mean,
                        float *scale) {
    for (int f = 0; f < nf; f++)
        scale[f] = 0;
    for (size_t j = off[s]; j < off[s + 1]; j++)
        scale[field[j]] += 1;
    for (int f = 0; f < nf; f++)
        scale[f] = mean && scale[f] > 0 ? 1.0f / scale[f] : 1.0f;
}

static void cpu_pool(int n, const size_t *off, const uint16_t *field, const float *val, int nf,
                     int d, const float *rows, int ld, bool mean, float *out) {
    float scale[PW_POOL_FIELDS_MAX];
    for (int s = 0; s < n; s++) {
        float *o = out + (size_t)s * nf * d;
        for (size_t i = 0; i < (size_t)nf * d; i++)
            o[i] = 0;
        field_scale(off, field, s, nf, mean, scale);
        for (size_t j = off[s]; j < off[s + 1]; j++) {
            const float w = val[j] * scale[field[j]];
            const float *r = rows + j * (size_t)ld;
            float *of = o + (size_t)field[j] * d;
            for (int e = 0; e < d; e++)
                of[e] += w * r[e];
        }
    }
}

static void cpu_pool_grad(int n, const size_t *off, const uint16_t *field, const float *val, int nf,
                          int d, const float *dout, int ld, bool mean, float *drows) {
    float scale[PW_POOL_FIELDS_MAX];
    for (int s = 0; s < n; s++) {
        field_scale(off, field, s, nf, mean, scale);
        for (size_t j = off[s]; j < off[s + 1]; j++) {
            const float w = val[j] * scale[field[j]];
            const float *g = dout + ((size_t)s * nf + field[j]) * d;
            float *r = drows + j * (size_t)ld;
            for (int e = 0; e < d; e++)
                r[e] += w * g[e];
        }
    }
}

static const pw_backend_t k_cpu = {"cpu-openblas", cpu_gemm,      cpu_add_bias, cpu_col_sum,
                                   cpu_relu,       cpu_relu_grad, cpu_pool,     cpu_pool_grad};

const pw_backend_t *pw_backend_cpu(void) {
    return &k_cpu;
}
