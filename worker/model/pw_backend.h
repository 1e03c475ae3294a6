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
} pw_backend_t;

/* The CPU backend (OpenBLAS sgemm). */
const pw_backend_t *pw_backend_cpu(void);

#endif
