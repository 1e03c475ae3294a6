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

static const pw_backend_t k_cpu = {"cpu-openblas", cpu_gemm, cpu_add_bias,
                                   cpu_col_sum,    cpu_relu, cpu_relu_grad};

const pw_backend_t *pw_backend_cpu(void) {
    return &k_cpu;
}
