/* pw_backend.h: the math the models need, as a table of functions, one table per device.
 *
 * Models and layers call only these functions, so the same code runs on the CPU (OpenBLAS) and,
 * later, on the GPU (cuBLAS and kernels) by swapping the table. Matrices are row-major and
 * dense; pointers refer to the backend's memory (host memory for the CPU backend).
 *
 * Thread rule: functions are pure over their arguments; the CPU backend may use OpenBLAS's own
 * threads inside gemm (OPENBLAS_NUM_THREADS).
 */
#ifndef PW_BACKEND_H
#define PW_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define PW_POOL_FIELDS_MAX 1024 /* fields a pooled sample may have (nf) */

typedef struct pw_backend {
    const char *name;
    /* C (m x n) = alpha * op(A) * op(B) + beta * C, op(A) m x k, op(B) k x n; A is stored
     * k x m when trans_a, B n x k when trans_b. */
    void (*gemm)(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float *a,
                 const float *b, float beta, float *c);
    /* y (rows x cols) += bias broadcast over rows. */
    void (*add_bias)(int rows, int cols, const float *bias, float *y);
    /* out[c] = beta * out[c] + sum over rows of x[r][c]. */
    void (*col_sum)(int rows, int cols, const float *x, float beta, float *out);
    /* y = max(x, 0) (y may be x). */
    void (*relu)(size_t n, const float *x, float *y);
    /* dx = dy where y > 0, else 0 (dx may be dy). */
    void (*relu_grad)(size_t n, const float *y, const float *dy, float *dx);
    /* Embedding pooling. Sample s (of n) has features j in [off[s], off[s + 1]) with field[j]
     * (< nf <= PW_POOL_FIELDS_MAX) and value val[j], and feature j's row at rows + j * ld (d floats
     * used). out (n x nf x d) gets, for each (s, f), the sum over the features of field f of val[j]
     * * row (mean: divided by their count); fields without features get zeros. */
    void (*pool)(int n, const size_t *off, const uint16_t *field, const float *val, int nf, int d,
                 const float *rows, int ld, bool mean, float *out);
    /* Its gradient scattered back to the features: val[j] * dout[s][field[j]] (mean: divided by
     * the count) is ADDED to the d floats at drows + j * ld (other columns untouched), so several
     * uses of a row (FM and deep parts) sum up.
     * Duplicate keys keep separate gradients (the table's push sums them). */
    void (*pool_grad)(int n, const size_t *off, const uint16_t *field, const float *val, int nf,
                      int d, const float *dout, int ld, bool mean, float *drows);
} pw_backend_t;

/* The CPU backend (OpenBLAS sgemm). */
const pw_backend_t *pw_backend_cpu(void);

#endif
