/* pw_backend.h: the math and memory the models need, as a table of functions, one per device.
 *
 * Models, layers, the dense optimizer and the trainer call only these functions for anything
 * that touches model memory, so the same code runs on the CPU (OpenBLAS), and on a GPU (cuBLAS
 * and CUDA kernels, worker/gpu/) by swapping the table.
 *
 * DESIGN
 * - Memory: every pointer a math function takes is DEVICE memory from `alloc` (for the CPU
 *   backends, host memory: `host_memory` is true and host pointers may be passed too). Host code
 *   never reads or writes device memory; it moves data with upload / download (synchronous: they
 *   return once the data arrived, ordered after every function called before them). The
 *   "cpu:checked" backend keeps device memory unreadable to host code between calls, so a test
 *   that runs the trainer on it proves the trainer obeys this rule without a GPU.
 * - Order: functions run in the order they are called (the GPU backend queues them on one
 *   stream); results are visible to host code after download.
 * - Overlap: upload_async and download_async move data on a second lane (a second stream) while
 *   the compute functions run; host memory they use should come from host_alloc (pinned) and is
 *   the backend's until copy_wait returns. An async upload is visible to every function called
 *   after it; an async download copies what the functions called before it wrote. The caller
 *   makes sure no queued function still uses the destination of an async upload (the trainer
 *   double-buffers: it uploads step t+1's inputs while step t computes), and that no function
 *   called after an async download writes its source before copy_wait.
 * - Errors: allocation returns NULL; every other failure of a device (a kernel that failed, a
 *   lost device) is sticky and reported by `error` (0 while none), which the trainer checks after
 *   every step.
 * - Matrices are row-major and dense unless a leading dimension (ld, in floats) is given.
 * - ABI: a table loaded from a module (pw_backend_open) must carry PW_BACKEND_ABI.
 *
 * Thread rule: a backend instance is used by one thread at a time (the trainer's thread), and by
 * another thread only after that thread called `bind` (when the backend has it).
 */
#ifndef PW_BACKEND_H
#define PW_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define PW_BACKEND_ABI     6    /* bumped on any change to the table below */
#define PW_POOL_FIELDS_MAX 1024 /* fields a pooled sample may have (nf) */
#define PW_FM_K_MAX        1024 /* factors an FM row may have (k) */

typedef enum { PW_OPT_SGD, PW_OPT_ADAGRAD, PW_OPT_ADAM } pw_opt_kind_t;

/* One dense optimizer step's settings (pw_dense_optim.h computes the bias corrections). */
typedef struct pw_opt_step_args {
    pw_opt_kind_t kind;
    float lr, beta1, beta2, eps;
    float bc1, bc2; /* adam: 1 - beta1^t, 1 - beta2^t */
} pw_opt_step_args_t;

typedef struct pw_backend pw_backend_t;

/* Collectives over device memory (NCCL on the GPU backend), formed like pw_coll's groups
 * (pw_coll.h: a rendezvous store, a key prefix new for every formation, rank, size, a timeout
 * on every call). Errors as pw_coll's; after one the communicator is unusable: destroy it and
 * form a new one under a new prefix. A communicator is used by one thread at a time, which may
 * be another thread than the backend's; its buffers must be complete (see sync) before a call. */
struct pw_kv;
typedef struct pw_dcoll pw_dcoll_t;
typedef struct pw_dcoll_ops {
    int (*create)(pw_backend_t *be, const struct pw_kv *kv, const char *prefix, int rank, int size,
                  int timeout_ms, pw_dcoll_t **out);
    /* buf (n floats of device memory) = the sum over the ranks, in place. */
    int (*allreduce_sum)(pw_dcoll_t *c, float *buf, size_t n);
    void (*destroy)(pw_dcoll_t *c); /* NULL: nothing */
} pw_dcoll_ops_t;

struct pw_backend {
    int abi;                     /* PW_BACKEND_ABI */
    const char *name;            /* e.g. "cpu-openblas", "cuda:0 NVIDIA H100 80GB HBM3" */
    bool host_memory;            /* device memory is host memory (CPU backends) */
    const pw_dcoll_ops_t *dcoll; /* collectives over device memory, or NULL (use pw_coll) */
    /* With dcoll: the physical device's identity, the same in every process that uses it (the
     * GPU's UUID, "GPU-..."): NCCL cannot put two members of a group on one device. */
    const char *device_id;

    /* ---- memory ---- */
    /* bytes of device memory, zeroed, or NULL (no memory, or bytes == 0). */
    void *(*alloc)(pw_backend_t *be, size_t bytes);
    void (*free)(pw_backend_t *be, void *p); /* p NULL: nothing */
    void (*upload)(pw_backend_t *be, void *dst, const void *src_host, size_t bytes);
    void (*download)(pw_backend_t *be, void *dst_host, const void *src, size_t bytes);
    void (*upload_async)(pw_backend_t *be, void *dst, const void *src_host, size_t bytes);
    void (*download_async)(pw_backend_t *be, void *dst_host, const void *src, size_t bytes);
    void (*copy_wait)(pw_backend_t *be); /* the async copies are done */
    void (*sync)(pw_backend_t *be);      /* every function called so far is done */
    /* device->device; the two ranges must not overlap (a device's copy is undefined there) */
    void (*copy)(pw_backend_t *be, void *dst, const void *src, size_t bytes);
    void (*zero)(pw_backend_t *be, void *p, size_t bytes);
    /* Host memory the device copies from and to fastest (pinned for a GPU), zeroed, or NULL;
     * host_free(NULL) does nothing. */
    void *(*host_alloc)(pw_backend_t *be, size_t bytes);
    void (*host_free)(pw_backend_t *be, void *p);
    /* 0, or the first device failure (PC_EIO) with its message in msg (may be NULL). */
    int (*error)(pw_backend_t *be, char *msg, size_t len);
    /* Release the backend (the CPU backend's table is static: nothing). */
    void (*close)(pw_backend_t *be);
    /* Make the calling thread the one that uses the backend from now on (a GPU: its device
     * current on this thread); NULL: any thread may (the CPU backends). A caller that hands
     * the backend from thread to thread (ps-serve's request threads, one at a time under a
     * lock) calls it first on each. */
    void (*bind)(pw_backend_t *be);

    /* ---- dense math ---- */
    /* C (m x n) = alpha * op(A) * op(B) + beta * C, op(A) m x k, op(B) k x n; A is stored
     * k x m when trans_a, B n x k when trans_b. */
    void (*gemm)(pw_backend_t *be, bool trans_a, bool trans_b, int m, int n, int k, float alpha,
                 const float *a, const float *b, float beta, float *c);
    /* count independent gemms as above; matrix i at a + i * sa, b + i * sb, c + i * sc. */
    void (*gemm_batched)(pw_backend_t *be, bool trans_a, bool trans_b, int m, int n, int k,
                         float alpha, const float *a, size_t sa, const float *b, size_t sb,
                         float beta, float *c, size_t sc, int count);
    /* y (rows x cols) += bias broadcast over rows, then y = max(y, 0) when relu. */
    void (*bias_act)(pw_backend_t *be, int rows, int cols, const float *bias, bool relu, float *y);
    /* out[c] = beta * out[c] + sum over rows of x[r][c]. */
    void (*col_sum)(pw_backend_t *be, int rows, int cols, const float *x, float beta, float *out);
    /* dx = dy where y > 0, else 0 (dx may be dy). */
    void (*relu_grad)(pw_backend_t *be, size_t n, const float *y, const float *dy, float *dx);
    /* dst rows (rows x cols, leading dimension ldd) = src rows (leading dimension lds); the
     * two must not overlap (as copy). */
    void (*copy2d)(pw_backend_t *be, int rows, int cols, const float *src, int lds, float *dst,
                   int ldd);
    /* dst rows += src rows (as copy2d). */
    void (*add2d)(pw_backend_t *be, int rows, int cols, const float *src, int lds, float *dst,
                  int ldd);
    void (*scale)(pw_backend_t *be, size_t n, float alpha, float *x); /* x *= alpha */
    void (*fill)(pw_backend_t *be, size_t n, float value, float *x);

    /* ---- DLRM interaction ---- */
    /* For each of n samples, full (f x f, at full + s * f * f) holds all dot products: out row s
     * (at out + s * ldo) gets its strict lower triangle, row-major: (1,0), (2,0), (2,1), ... */
    void (*tril_pack)(pw_backend_t *be, int n, int f, const float *full, float *out, int ldo);
    /* The reverse for gradients: full (f x f per sample) = g + g^T where g holds grad's values in
     * the strict lower triangle (grad row s at grad + s * ldg), zeros elsewhere. */
    void (*tril_unpack)(pw_backend_t *be, int n, int f, const float *grad, int ldg, float *full);
    /* The same without the f x f matrices, or NULL (then pw_layers.c runs gemm_batched with the
     * two above: the GPU's strided-batched GEMM is its fast path). interact: z (f x d per
     * sample, at z + s * f * d) -> out row s gets <z_i, z_j> for i > j in tril_pack's order.
     * interact_grad: dz (f x d per sample, written) = (G + G^T) z, G as in tril_unpack. */
    void (*interact)(pw_backend_t *be, int n, int f, int d, const float *z, float *out, int ldo);
    void (*interact_grad)(pw_backend_t *be, int n, int f, int d, const float *z, const float *grad,
                          int ldg, float *dz);

    /* ---- embeddings ---- */
    /* dst row j (d floats) = src row idx[j], for j < n. */
    void (*gather_rows)(pw_backend_t *be, size_t n, const uint32_t *idx, const float *src, int d,
                        float *dst);
    /* dst row idx[j] += alpha * src row j, for j < n (duplicate idx add up). */
    void (*scatter_add_rows)(pw_backend_t *be, size_t n, const uint32_t *idx, const float *src,
                             int d, float alpha, float *dst);
    /* Pooling. Sample s (of n) has features j in [off[s], off[s + 1]) with field[j] (< nf <=
     * PW_POOL_FIELDS_MAX) and value val[j], and feature j's row at rows + j * ld (d floats used).
     * out (n x nf x d) gets, for each (s, f), the sum over the features of field f of val[j] * row
     * (mean: divided by their count); fields without features get zeros. */
    void (*pool)(pw_backend_t *be, int n, const size_t *off, const uint16_t *field,
                 const float *val, int nf, int d, const float *rows, int ld, bool mean, float *out);
    /* Its gradient: val[j] * dout[s][field[j]] (mean: divided by the count) is ADDED to the d
     * floats at drows + j * ld (other columns untouched), so several uses of a row (FM and deep
     * parts) sum up. Duplicate keys keep separate gradients (the trainer sums them). */
    void (*pool_grad)(pw_backend_t *be, int n, const size_t *off, const uint16_t *field,
                      const float *val, int nf, int d, const float *dout, int ld, bool mean,
                      float *drows);
    /* Optional (NULL: gather_rows, pool, pool_grad into zeroed rows, scatter_add_rows): the two
     * above with feature j's row at urows + inv[j] * d, no row per feature. pool_unique writes
     * out as pool does; pool_grad_unique adds alpha * (its pool_grad's value) to row inv[j] of
     * ugrads, feature by feature in order: the same sums, to the bit, as the four calls. */
    void (*pool_unique)(pw_backend_t *be, int n, const size_t *off, const uint16_t *field,
                        const float *val, int nf, int d, const float *urows, const uint32_t *inv,
                        bool mean, float *out);
    void (*pool_grad_unique)(pw_backend_t *be, int n, const size_t *off, const uint16_t *field,
                             const float *val, int nf, int d, const float *dout, bool mean,
                             const uint32_t *inv, float alpha, float *ugrads);
    /* Factorization machine (Rendle 2010). Feature j of sample s (j in [off[s], off[s + 1])) has
     * value x_j = val[j] and row rows + j * (k + 1) = [w, v_1 .. v_k] (k <= PW_FM_K_MAX; k = 0 is
     * logistic regression). logits[s] += sum_j w_j x_j + 1/2 sum_e ((sum_j v_je x_j)^2 -
     * sum_j v_je^2 x_j^2). */
    void (*fm)(pw_backend_t *be, int n, const size_t *off, const float *val, int k,
               const float *rows, float *logits);
    /* Its gradient: drows (one row of k + 1 per feature) written from dlogits. */
    void (*fm_grad)(pw_backend_t *be, int n, const size_t *off, const float *val, int k,
                    const float *rows, const float *dlogits, float *drows);

    /* ---- loss and optimizer ---- */
    /* Binary cross-entropy on logits: loss[0] (device memory) gets the mean over n; p (may be
     * NULL) sigmoid(logits), dlogits (may be NULL) (sigmoid(z) - y) / n. Stable for any z; the
     * sum is taken in double, in a fixed order. */
    void (*bce)(pw_backend_t *be, int n, const float *logits, const float *labels, float *p,
                float *dlogits, float *loss);
    /* One optimizer step on w[0..n) with gradient g and state s1 (adagrad G, adam m), s2 (adam
     * v) (NULL when the optimizer has none); see pw_dense_optim.h. */
    void (*opt_step)(pw_backend_t *be, const pw_opt_step_args_t *a, size_t n, float *w,
                     const float *g, float *s1, float *s2);
};

/* The CPU backend (OpenBLAS sgemm, loops elsewhere): a static table, thread-safe (stateless). */
pw_backend_t *pw_backend_cpu(void);

/* Call first in main(), before any thread or file: when OpenBLAS fell back to its pre-AVX2
 * kernels on a CPU it does not know (a newer model) whose features run newer ones, execute this
 * program again (same pid, argv) with OPENBLAS_CORETYPE naming them; nothing when the variable
 * is set (the user's choice; after the second pass, pw_backend_open's line names the fallback it
 * replaced). Returns when nothing is to be done or the execution failed (logged). */
void pw_blas_select(char **argv);

/* The OpenBLAS kernels in use, e.g. "SkylakeX" (openblas_get_corename). */
const char *pw_blas_core(void);

/* OpenBLAS threads for the CPU backend's GEMMs: n >= 1, or 0 for the online CPUs less one (the
 * reader and the store's calls run on threads of their own beside the step), at least 1.
 * Nothing when OPENBLAS_NUM_THREADS or OMP_NUM_THREADS is set (the user's choice), or n < 0.
 * Returns the threads OpenBLAS uses. */
int pw_blas_threads(int n);

/* A backend for `device`:
 *   "cpu"          the CPU backend;
 *   "cpu:checked"  the CPU backend with device memory unreadable outside backend calls (slow;
 *                  for testing code against the memory rule above);
 *   "cuda" / "cuda:N"  GPU N (default 0) through the CUDA module (libember_cuda.so, found next
 *                  to the executable, in ../lib, or on the loader's path); fails if it cannot;
 *   "auto"         cuda:0 when the module loads and finds a GPU, else cpu.
 * *why gets one line saying which backend was chosen and why (auto: why not the GPU).
 * PC_EINVAL (unknown device), PC_EUNAVAIL (the GPU or its module is not usable; *why says why),
 * PC_ENOMEM. Close with pw_backend_close. */
int pw_backend_open(const char *device, pw_backend_t **out, char *why, size_t why_len);
void pw_backend_close(pw_backend_t *be); /* NULL: nothing */

/* Entry point the CUDA module exports (dlsym name "pw_cuda_backend_open"): open GPU `device`;
 * 0 with the table, or an error with the reason in why. log writes a line to the worker's error
 * log (the module links nothing of the worker's). */
typedef int (*pw_cuda_open_fn)(int device, void (*log)(const char *msg), pw_backend_t **out,
                               char *why, size_t why_len);

#endif
