/* pw_backend_cuda.cu: the GPU backend (libember_cuda.so): cuBLAS for every GEMM, CUDA kernels
 * for the rest, on one stream.
 *
 * The worker loads this module with dlopen (pw_backend.c) and calls pw_cuda_backend_open; the
 * module links cudart and cuBLAS (which load without a driver) and never libcuda, so on a machine
 * without a GPU the open fails with the runtime's reason instead of the worker not starting.
 *
 * DESIGN
 * - Two streams: compute (every function, in call order) and copy (upload_async,
 *   download_async). An async upload records an event the compute stream waits for; an async
 *   download waits for an event recorded on the compute stream; copy_wait synchronizes the copy
 *   stream. upload and download synchronize the compute stream, so host code sees finished
 *   results and may reuse its buffers at once.
 * - Errors: the first failure of any CUDA or cuBLAS call is kept (file, line, call, the library's
 *   message) and reported by error(); later calls go on (a sticky CUDA error fails them too).
 *   Allocation failures return NULL and are not sticky.
 * - Determinism: everything but scatter_add_rows (atomicAdd of duplicate keys' gradients) and
 *   cuBLAS's own choice of algorithms adds in a fixed order.
 * - Kernels are plain grid-stride loops over the output elements: a thread per (sample, column)
 *   for pooling and FM, so a sample's features are read row-contiguously by a warp, and no
 *   output is written by two threads (no atomics, no races).
 *
 * - NCCL (dcoll): a communicator per group generation, non-blocking, so every call can be
 *   bounded: the unique id comes from rank 0 through the group's rendezvous store (the
 *   coordinator), initialization and each allreduce are polled until done, failed (a peer
 *   reported an error) or past the timeout, and then aborted: the worker re-forms the group as it
 *   does after a Gloo failure. Allreduces run on the communicator's own stream; the trainer
 *   completes the buffer (sync) before it hands it over.
 *
 * Thread rule: one thread at a time, the thread that opened it or one that called bind since
 * (cudaSetDevice is per thread); a communicator sets its device on the thread that calls it, and
 * its collectives and the backend's allocations and frees exclude each other (mem_hold).
 */
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

extern "C" {
#include "pc_error.h"
#include "pw_backend.h"
#include "pw_coll.h"
}
#include "pw_cuda.h"

namespace {

struct cuda_be {
    pw_backend_t t; /* first: the table handed out */
    int dev;
    cudaStream_t stream, copy; /* compute, copies */
    cudaEvent_t ev;            /* ordering between them */
    cublasHandle_t blas;
    int failed; /* 0, or PC_EIO after the first failure */
    char msg[320];
    float *ones; /* col_sum's vector of ones */
    size_t nones;
    double *loss; /* bce: per-sample losses */
    size_t nloss;
    char name[160];
    char uuid[48];                /* "GPU-" and the device's UUID, as nvidia-smi prints it */
    void (*log)(const char *msg); /* the worker's error log */
    pthread_mutex_t mem_mu;       /* pw_cuda::mem_hold: allocations against NCCL collectives */
};

cuda_be *of(pw_backend_t *be) {
    return reinterpret_cast<cuda_be *>(be);
}

void fail(cuda_be *b, const char *file, int line, const char *call, const char *what) {
    if (b->failed)
        return;
    b->failed = PC_EIO;
    snprintf(b->msg, sizeof b->msg, "%s:%d: %s: %s", file, line, call, what);
}

/* Translate CUDA and cuBLAS status once, here (the project's rule for third-party errors). */
#define CU(b, call)                                                       \
    do {                                                                  \
        cudaError_t e_ = (call);                                          \
        if (e_ != cudaSuccess)                                            \
            fail((b), __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
    } while (0)
#define CB(b, call)                                                          \
    do {                                                                     \
        cublasStatus_t s_ = (call);                                          \
        if (s_ != CUBLAS_STATUS_SUCCESS)                                     \
            fail((b), __FILE__, __LINE__, #call, cublasGetStatusString(s_)); \
    } while (0)
#define LAUNCHED(b) CU((b), cudaGetLastError())

constexpr int kThreads = 256;

unsigned blocks(size_t n) {
    size_t g = (n + kThreads - 1) / kThreads;
    return (unsigned)(g < 1 ? 1 : g > 65535 * 4 ? 65535 * 4 : g);
}

#define GRID_LOOP(i, n)                                                     \
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (n); \
         i += (size_t)gridDim.x * blockDim.x)

/* ---- kernels ---- */

__global__ void k_bias_act(size_t n, int cols, const float *bias, bool relu, float *y) {
    GRID_LOOP(i, n) {
        const float v = y[i] + bias[i % cols];
        y[i] = relu && !(v > 0) && v == v ? 0.0f : v; /* as the CPU: -0 becomes 0, NaN stays */
    }
}

__global__ void k_relu_grad(size_t n, const float *y, const float *dy, float *dx) {
    GRID_LOOP(i, n) dx[i] = y[i] > 0 ? dy[i] : 0.0f;
}

__global__ void k_add2d(int rows, int cols, const float *src, int lds, float *dst, int ldd) {
    GRID_LOOP(i, (size_t)rows * cols) {
        const size_t r = i / cols, c = i % cols;
        dst[r * ldd + c] += src[r * lds + c];
    }
}

__global__ void k_scale(size_t n, float alpha, float *x) {
    GRID_LOOP(i, n) x[i] *= alpha;
}

__global__ void k_fill(size_t n, float v, float *x) {
    GRID_LOOP(i, n) x[i] = v;
}

/* Row i and column j (i > j) of packed position k of a strict lower triangle. */
__device__ void tril_pos(int k, int *i, int *j) {
    int r = (int)((1.0f + sqrtf(1.0f + 8.0f * (float)k)) * 0.5f);
    while (r * (r - 1) / 2 > k)
        r--;
    while ((r + 1) * r / 2 <= k)
        r++;
    *i = r;
    *j = k - r * (r - 1) / 2;
}

__global__ void k_tril_pack(int n, int f, const float *full, float *out, int ldo) {
    const int np = f * (f - 1) / 2;
    GRID_LOOP(x, (size_t)n * np) {
        const size_t s = x / np;
        const int k = (int)(x % np);
        int i, j;
        tril_pos(k, &i, &j);
        out[s * ldo + k] = full[s * f * f + i * f + j];
    }
}

__global__ void k_tril_unpack(int n, int f, const float *grad, int ldg, float *full) {
    GRID_LOOP(x, (size_t)n * f * f) {
        const size_t s = x / (f * f);
        const int i = (int)(x % (f * f)) / f, j = (int)(x % (f * f)) % f;
        const int hi = i > j ? i : j, lo = i > j ? j : i;
        full[x] = i == j ? 0.0f : grad[s * ldg + hi * (hi - 1) / 2 + lo];
    }
}

__global__ void k_gather(size_t n, const uint32_t *idx, const float *src, int d, float *dst) {
    GRID_LOOP(x, n * d) {
        const size_t j = x / d;
        dst[x] = src[(size_t)idx[j] * d + x % d];
    }
}

__global__ void k_scatter_add(size_t n, const uint32_t *idx, const float *src, int d, float alpha,
                              float *dst) {
    GRID_LOOP(x, n * d) {
        const size_t j = x / d;
        atomicAdd(&dst[(size_t)idx[j] * d + x % d], alpha * src[x]);
    }
}

/* Feature j's weight in its sample's pool: val (sum) or val / the features of its field (mean). */
__device__ float pool_weight(const size_t *off, const uint16_t *field, const float *val, size_t s,
                             size_t j, bool mean) {
    if (!mean)
        return val[j];
    int count = 0;
    for (size_t i = off[s]; i < off[s + 1]; i++)
        count += field[i] == field[j];
    return val[j] / (float)count;
}

__global__ void k_pool(int n, const size_t *off, const uint16_t *field, const float *val, int nf,
                       int d, const float *rows, int ld, bool mean, float *out) {
    GRID_LOOP(x, (size_t)n * d) {
        const size_t s = x / d;
        const int e = (int)(x % d);
        float *o = out + s * nf * d;
        for (int f = 0; f < nf; f++)
            o[f * d + e] = 0.0f;
        for (size_t j = off[s]; j < off[s + 1]; j++)
            o[field[j] * d + e] += pool_weight(off, field, val, s, j, mean) * rows[j * ld + e];
    }
}

__global__ void k_pool_grad(int n, const size_t *off, const uint16_t *field, const float *val,
                            int nf, int d, const float *dout, int ld, bool mean, float *drows) {
    GRID_LOOP(x, (size_t)n * d) {
        const size_t s = x / d;
        const int e = (int)(x % d);
        for (size_t j = off[s]; j < off[s + 1]; j++)
            drows[j * ld + e] +=
                pool_weight(off, field, val, s, j, mean) * dout[(s * nf + field[j]) * d + e];
    }
}

__global__ void k_fm(int n, const size_t *off, const float *val, int k, const float *rows,
                     float *logits) {
    GRID_LOOP(s, (size_t)n) {
        double lin = 0, sq = 0, pair = 0;
        for (size_t j = off[s]; j < off[s + 1]; j++)
            lin += (double)rows[j * (k + 1)] * val[j];
        for (int e = 0; e < k; e++) {
            float sum = 0;
            for (size_t j = off[s]; j < off[s + 1]; j++) {
                const float v = rows[j * (k + 1) + 1 + e] * val[j];
                sum += v;
                sq += (double)v * v;
            }
            pair += (double)sum * sum;
        }
        logits[s] += (float)(lin + 0.5 * (pair - sq));
    }
}

/* Thread (s, c): column c of every feature row of sample s (c = 0: the linear weight). */
__global__ void k_fm_grad(int n, const size_t *off, const float *val, int k, const float *rows,
                          const float *dlogits, float *drows) {
    const int w = k + 1;
    GRID_LOOP(x, (size_t)n * w) {
        const size_t s = x / w;
        const int c = (int)(x % w);
        const float g = dlogits[s];
        float sum = 0;
        if (c > 0)
            for (size_t j = off[s]; j < off[s + 1]; j++)
                sum += rows[j * w + c] * val[j];
        for (size_t j = off[s]; j < off[s + 1]; j++) {
            const float xj = val[j];
            drows[j * w + c] = c == 0 ? g * xj : g * xj * (sum - rows[j * w + c] * xj);
        }
    }
}

__global__ void k_bce(int n, const float *z, const float *y, float *p, float *dz, double *loss) {
    GRID_LOOP(i, (size_t)n) {
        const double zi = z[i], yi = y[i];
        loss[i] = log1p(exp(-fabs(zi))) + (zi > 0 ? zi : 0) - yi * zi;
        const double s = zi >= 0 ? 1 / (1 + exp(-zi)) : exp(zi) / (1 + exp(zi));
        if (p)
            p[i] = (float)s;
        if (dz)
            dz[i] = (float)((s - yi) / n);
    }
}

/* One block: *out = the mean of loss[0 .. n), summed in a fixed order. */
__global__ void k_mean(int n, const double *loss, float *out) {
    __shared__ double part[kThreads];
    double acc = 0;
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        acc += loss[i];
    part[threadIdx.x] = acc;
    __syncthreads();
    for (int h = blockDim.x / 2; h > 0; h /= 2) {
        if ((int)threadIdx.x < h)
            part[threadIdx.x] += part[threadIdx.x + h];
        __syncthreads();
    }
    if (threadIdx.x == 0)
        *out = (float)(part[0] / n);
}

__global__ void k_opt(pw_opt_step_args_t a, size_t n, float *w, const float *g, float *s1,
                      float *s2) {
    GRID_LOOP(i, n) {
        const float gi = g[i];
        if (a.kind == PW_OPT_SGD) {
            w[i] -= a.lr * gi;
        } else if (a.kind == PW_OPT_ADAGRAD) {
            s1[i] += gi * gi;
            w[i] -= a.lr * gi / (sqrtf(s1[i]) + a.eps);
        } else {
            s1[i] = a.beta1 * s1[i] + (1 - a.beta1) * gi;
            s2[i] = a.beta2 * s2[i] + (1 - a.beta2) * gi * gi;
            w[i] -= a.lr * (s1[i] / a.bc1) / (sqrtf(s2[i] / a.bc2) + a.eps);
        }
    }
}

/* ---- the table ---- */

void *g_alloc(pw_backend_t *be, size_t bytes) {
    cuda_be *b = of(be);
    void *p = nullptr;
    if (!bytes)
        return nullptr;
    cudaError_t e;
    {
        const pw_cuda::mem_hold hold(&b->mem_mu);
        e = cudaMalloc(&p, bytes);
    }
    if (e == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError(); /* out of memory is not sticky */
        return nullptr;
    }
    if (e != cudaSuccess) { /* a device that failed: sticky */
        fail(b, __FILE__, __LINE__, "cudaMalloc", cudaGetErrorString(e));
        return nullptr;
    }
    /* Zeroed on the copy stream, which both an async upload into it (copy stream order) and any
     * compute (the event) come after. */
    CU(b, cudaMemsetAsync(p, 0, bytes, b->copy));
    CU(b, cudaEventRecord(b->ev, b->copy));
    CU(b, cudaStreamWaitEvent(b->stream, b->ev, 0));
    return p;
}

void g_free(pw_backend_t *be, void *p) {
    cuda_be *b = of(be);
    if (!p)
        return;
    const pw_cuda::mem_hold hold(&b->mem_mu);
    CU(b, cudaFree(p));
}

void g_upload(pw_backend_t *be, void *dst, const void *src, size_t bytes) {
    cuda_be *b = of(be);
    if (!bytes)
        return;
    CU(b, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, b->stream));
    CU(b, cudaStreamSynchronize(b->stream));
}

void g_download(pw_backend_t *be, void *dst, const void *src, size_t bytes) {
    cuda_be *b = of(be);
    if (!bytes)
        return;
    CU(b, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, b->stream));
    CU(b, cudaStreamSynchronize(b->stream));
}

void g_upload_async(pw_backend_t *be, void *dst, const void *src, size_t bytes) {
    cuda_be *b = of(be);
    if (!bytes)
        return;
    CU(b, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, b->copy));
    CU(b, cudaEventRecord(b->ev, b->copy));
    CU(b, cudaStreamWaitEvent(b->stream, b->ev, 0)); /* later compute sees the data */
}

void g_download_async(pw_backend_t *be, void *dst, const void *src, size_t bytes) {
    cuda_be *b = of(be);
    if (!bytes)
        return;
    CU(b, cudaEventRecord(b->ev, b->stream)); /* after the compute queued so far */
    CU(b, cudaStreamWaitEvent(b->copy, b->ev, 0));
    CU(b, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, b->copy));
}

void g_copy_wait(pw_backend_t *be) {
    cuda_be *b = of(be);
    CU(b, cudaStreamSynchronize(b->copy));
}

void g_bind(pw_backend_t *be) {
    cuda_be *b = of(be);
    CU(b, cudaSetDevice(b->dev));
}

void g_sync(pw_backend_t *be) {
    cuda_be *b = of(be);
    CU(b, cudaStreamSynchronize(b->stream));
    CU(b, cudaStreamSynchronize(b->copy));
}

void g_copy(pw_backend_t *be, void *dst, const void *src, size_t bytes) {
    cuda_be *b = of(be);
    if (bytes && dst != src)
        CU(b, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, b->stream));
}

void g_zero(pw_backend_t *be, void *p, size_t bytes) {
    cuda_be *b = of(be);
    if (bytes)
        CU(b, cudaMemsetAsync(p, 0, bytes, b->stream));
}

void *g_host_alloc(pw_backend_t *be, size_t bytes) {
    cuda_be *b = of(be);
    void *p = nullptr;
    if (!bytes)
        return nullptr;
    cudaError_t e;
    {
        const pw_cuda::mem_hold hold(&b->mem_mu);
        e = cudaHostAlloc(&p, bytes, cudaHostAllocDefault);
    }
    if (e == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError(); /* out of (pinnable) memory is not sticky */
        return nullptr;
    }
    if (e != cudaSuccess) { /* a device that failed: sticky, as g_alloc's */
        fail(b, __FILE__, __LINE__, "cudaHostAlloc", cudaGetErrorString(e));
        return nullptr;
    }
    memset(p, 0, bytes);
    return p;
}

void g_host_free(pw_backend_t *be, void *p) {
    cuda_be *b = of(be);
    if (!p)
        return;
    const pw_cuda::mem_hold hold(&b->mem_mu);
    CU(b, cudaFreeHost(p));
}

int g_error(pw_backend_t *be, char *msg, size_t len) {
    cuda_be *b = of(be);
    if (!b->failed) { /* a kernel that failed since the last synchronization */
        const cudaError_t e = cudaStreamQuery(b->stream);
        if (e != cudaSuccess && e != cudaErrorNotReady)
            fail(b, __FILE__, __LINE__, "cudaStreamQuery", cudaGetErrorString(e));
    }
    if (msg && len)
        snprintf(msg, len, "%s", b->failed ? b->msg : "");
    return b->failed;
}

void g_close(pw_backend_t *be) {
    cuda_be *b = of(be);
    cudaFree(b->ones);
    cudaFree(b->loss);
    if (b->blas)
        cublasDestroy(b->blas);
    if (b->ev)
        cudaEventDestroy(b->ev);
    if (b->copy)
        cudaStreamDestroy(b->copy);
    if (b->stream)
        cudaStreamDestroy(b->stream);
    pthread_mutex_destroy(&b->mem_mu);
    free(b);
}

/* Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: swap the operands. */
void g_gemm(pw_backend_t *be, bool ta, bool tb, int m, int n, int k, float alpha, const float *a,
            const float *bm, float beta, float *c) {
    cuda_be *b = of(be);
    CB(b, cublasSgemm(b->blas, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, n, m,
                      k, &alpha, bm, tb ? k : n, a, ta ? m : k, &beta, c, n));
}

void g_gemm_batched(pw_backend_t *be, bool ta, bool tb, int m, int n, int k, float alpha,
                    const float *a, size_t sa, const float *bm, size_t sb, float beta, float *c,
                    size_t sc, int count) {
    cuda_be *b = of(be);
    CB(b, cublasSgemmStridedBatched(b->blas, tb ? CUBLAS_OP_T : CUBLAS_OP_N,
                                    ta ? CUBLAS_OP_T : CUBLAS_OP_N, n, m, k, &alpha, bm, tb ? k : n,
                                    (long long)sb, a, ta ? m : k, (long long)sa, &beta, c, n,
                                    (long long)sc, count));
}

void g_bias_act(pw_backend_t *be, int rows, int cols, const float *bias, bool relu, float *y) {
    cuda_be *b = of(be);
    const size_t n = (size_t)rows * cols;
    k_bias_act<<<blocks(n), kThreads, 0, b->stream>>>(n, cols, bias, relu, y);
    LAUNCHED(b);
}

void g_col_sum(pw_backend_t *be, int rows, int cols, const float *x, float beta, float *out) {
    cuda_be *b = of(be);
    if (rows <= 0 || cols <= 0) { /* (cuBLAS leaves y as it is for no rows, refuses no columns) */
        if (cols > 0) {
            k_scale<<<blocks((size_t)cols), kThreads, 0, b->stream>>>((size_t)cols, beta, out);
            LAUNCHED(b);
        }
        return;
    }
    if ((size_t)rows > b->nones) { /* a vector of ones as long as the batch */
        const pw_cuda::mem_hold hold(&b->mem_mu);
        CU(b, cudaFree(b->ones));
        b->ones = nullptr;
        b->nones = 0;
        if (cudaMalloc(&b->ones, (size_t)rows * sizeof(float)) != cudaSuccess) {
            fail(b, __FILE__, __LINE__, "cudaMalloc(ones)", "out of device memory");
            return;
        }
        b->nones = (size_t)rows;
        k_fill<<<blocks(b->nones), kThreads, 0, b->stream>>>(b->nones, 1.0f, b->ones);
        LAUNCHED(b);
    }
    const float one = 1.0f;
    /* x seen column-major is cols x rows: out = x^T-major * ones */
    CB(b, cublasSgemv(b->blas, CUBLAS_OP_N, cols, rows, &one, x, cols, b->ones, 1, &beta, out, 1));
}

void g_relu_grad(pw_backend_t *be, size_t n, const float *y, const float *dy, float *dx) {
    cuda_be *b = of(be);
    k_relu_grad<<<blocks(n), kThreads, 0, b->stream>>>(n, y, dy, dx);
    LAUNCHED(b);
}

void g_copy2d(pw_backend_t *be, int rows, int cols, const float *src, int lds, float *dst,
              int ldd) {
    cuda_be *b = of(be);
    if (rows > 0 && cols > 0)
        CU(b, cudaMemcpy2DAsync(dst, (size_t)ldd * sizeof(float), src, (size_t)lds * sizeof(float),
                                (size_t)cols * sizeof(float), (size_t)rows,
                                cudaMemcpyDeviceToDevice, b->stream));
}

void g_add2d(pw_backend_t *be, int rows, int cols, const float *src, int lds, float *dst, int ldd) {
    cuda_be *b = of(be);
    k_add2d<<<blocks((size_t)rows * cols), kThreads, 0, b->stream>>>(rows, cols, src, lds, dst,
                                                                     ldd);
    LAUNCHED(b);
}

void g_scale(pw_backend_t *be, size_t n, float alpha, float *x) {
    cuda_be *b = of(be);
    k_scale<<<blocks(n), kThreads, 0, b->stream>>>(n, alpha, x);
    LAUNCHED(b);
}

void g_fill(pw_backend_t *be, size_t n, float v, float *x) {
    cuda_be *b = of(be);
    k_fill<<<blocks(n), kThreads, 0, b->stream>>>(n, v, x);
    LAUNCHED(b);
}

void g_tril_pack(pw_backend_t *be, int n, int f, const float *full, float *out, int ldo) {
    cuda_be *b = of(be);
    const size_t total = (size_t)n * f * (f - 1) / 2;
    if (!total)
        return;
    k_tril_pack<<<blocks(total), kThreads, 0, b->stream>>>(n, f, full, out, ldo);
    LAUNCHED(b);
}

void g_tril_unpack(pw_backend_t *be, int n, int f, const float *grad, int ldg, float *full) {
    cuda_be *b = of(be);
    const size_t total = (size_t)n * f * f;
    k_tril_unpack<<<blocks(total), kThreads, 0, b->stream>>>(n, f, grad, ldg, full);
    LAUNCHED(b);
}

void g_gather_rows(pw_backend_t *be, size_t n, const uint32_t *idx, const float *src, int d,
                   float *dst) {
    cuda_be *b = of(be);
    if (!n)
        return;
    k_gather<<<blocks(n * d), kThreads, 0, b->stream>>>(n, idx, src, d, dst);
    LAUNCHED(b);
}

void g_scatter_add_rows(pw_backend_t *be, size_t n, const uint32_t *idx, const float *src, int d,
                        float alpha, float *dst) {
    cuda_be *b = of(be);
    if (!n)
        return;
    k_scatter_add<<<blocks(n * d), kThreads, 0, b->stream>>>(n, idx, src, d, alpha, dst);
    LAUNCHED(b);
}

void g_pool(pw_backend_t *be, int n, const size_t *off, const uint16_t *field, const float *val,
            int nf, int d, const float *rows, int ld, bool mean, float *out) {
    cuda_be *b = of(be);
    k_pool<<<blocks((size_t)n * d), kThreads, 0, b->stream>>>(n, off, field, val, nf, d, rows, ld,
                                                              mean, out);
    LAUNCHED(b);
}

void g_pool_grad(pw_backend_t *be, int n, const size_t *off, const uint16_t *field,
                 const float *val, int nf, int d, const float *dout, int ld, bool mean,
                 float *drows) {
    cuda_be *b = of(be);
    k_pool_grad<<<blocks((size_t)n * d), kThreads, 0, b->stream>>>(n, off, field, val, nf, d, dout,
                                                                   ld, mean, drows);
    LAUNCHED(b);
}

void g_fm(pw_backend_t *be, int n, const size_t *off, const float *val, int k, const float *rows,
          float *logits) {
    cuda_be *b = of(be);
    k_fm<<<blocks((size_t)n), kThreads, 0, b->stream>>>(n, off, val, k, rows, logits);
    LAUNCHED(b);
}

void g_fm_grad(pw_backend_t *be, int n, const size_t *off, const float *val, int k,
               const float *rows, const float *dlogits, float *drows) {
    cuda_be *b = of(be);
    k_fm_grad<<<blocks((size_t)n * (k + 1)), kThreads, 0, b->stream>>>(n, off, val, k, rows,
                                                                       dlogits, drows);
    LAUNCHED(b);
}

void g_bce(pw_backend_t *be, int n, const float *z, const float *y, float *p, float *dz,
           float *out) {
    cuda_be *b = of(be);
    if (n < 1) {
        CU(b, cudaMemsetAsync(out, 0, sizeof(float), b->stream));
        return;
    }
    if ((size_t)n > b->nloss) {
        const pw_cuda::mem_hold hold(&b->mem_mu);
        CU(b, cudaFree(b->loss));
        b->loss = nullptr;
        b->nloss = 0;
        if (cudaMalloc(&b->loss, (size_t)n * sizeof(double)) != cudaSuccess) {
            fail(b, __FILE__, __LINE__, "cudaMalloc(loss)", "out of device memory");
            return;
        }
        b->nloss = (size_t)n;
    }
    k_bce<<<blocks((size_t)n), kThreads, 0, b->stream>>>(n, z, y, p, dz, b->loss);
    LAUNCHED(b);
    k_mean<<<1, kThreads, 0, b->stream>>>(n, b->loss, out);
    LAUNCHED(b);
}

void g_opt_step(pw_backend_t *be, const pw_opt_step_args_t *a, size_t n, float *w, const float *g,
                float *s1, float *s2) {
    cuda_be *b = of(be);
    if (!n)
        return;
    k_opt<<<blocks(n), kThreads, 0, b->stream>>>(*a, n, w, g, s1, s2);
    LAUNCHED(b);
}

} // namespace

/* What the NCCL part (pw_cuda_nccl.cu) needs of a backend. */
pw_cuda::device_info pw_cuda::info(pw_backend_t *be) {
    return {of(be)->dev, of(be)->log, &of(be)->mem_mu};
}

extern "C" __attribute__((visibility("default"))) int
pw_cuda_backend_open(int device, void (*log)(const char *msg), pw_backend_t **out, char *why,
                     size_t why_len) {
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess) {
        snprintf(why, why_len, "no usable GPU: cudaGetDeviceCount: %s", cudaGetErrorString(e));
        (void)cudaGetLastError();
        return PC_EUNAVAIL;
    }
    if (device < 0 || device >= count) {
        snprintf(why, why_len, "no GPU %d (%d present)", device, count);
        return PC_EUNAVAIL;
    }
    cudaDeviceProp prop;
    if ((e = cudaGetDeviceProperties(&prop, device)) != cudaSuccess ||
        (e = cudaSetDevice(device)) != cudaSuccess) {
        snprintf(why, why_len, "GPU %d: %s", device, cudaGetErrorString(e));
        return PC_EUNAVAIL;
    }
    if (prop.major < 8) {
        snprintf(why, why_len,
                 "GPU %d (%s) has compute capability %d.%d; the module is built for "
                 "8.0 and 9.0 (and newer through PTX)",
                 device, prop.name, prop.major, prop.minor);
        return PC_EUNAVAIL;
    }
    cuda_be *b = static_cast<cuda_be *>(calloc(1, sizeof *b));
    if (!b)
        return PC_ENOMEM;
    pthread_mutex_init(&b->mem_mu, nullptr); /* (g_close destroys it) */
    b->dev = device;
    b->log = log;
    snprintf(b->name, sizeof b->name, "cuda:%d %.100s (sm_%d%d)", device, prop.name, prop.major,
             prop.minor);
    const unsigned char *u = reinterpret_cast<const unsigned char *>(prop.uuid.bytes);
    snprintf(b->uuid, sizeof b->uuid,
             "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0], u[1],
             u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14],
             u[15]);
    if ((e = cudaStreamCreateWithFlags(&b->stream, cudaStreamNonBlocking)) != cudaSuccess ||
        (e = cudaStreamCreateWithFlags(&b->copy, cudaStreamNonBlocking)) != cudaSuccess ||
        (e = cudaEventCreateWithFlags(&b->ev, cudaEventDisableTiming)) != cudaSuccess) {
        snprintf(why, why_len, "GPU %d: streams: %s", device, cudaGetErrorString(e));
        g_close(&b->t);
        return PC_EUNAVAIL;
    }
    cublasStatus_t s = cublasCreate(&b->blas);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasSetStream(b->blas, b->stream);
    if (s == CUBLAS_STATUS_SUCCESS) /* fp32 stays fp32: no TF32 unless asked for */
        s = cublasSetMathMode(b->blas, CUBLAS_DEFAULT_MATH);
    if (s != CUBLAS_STATUS_SUCCESS) {
        snprintf(why, why_len, "GPU %d: cuBLAS: %s", device, cublasGetStatusString(s));
        g_close(&b->t);
        return PC_EUNAVAIL;
    }
    b->t.abi = PW_BACKEND_ABI;
    b->t.name = b->name;
    b->t.host_memory = false;
    b->t.dcoll = &pw_cuda::nccl_ops;
    b->t.device_id = b->uuid;
    b->t.alloc = g_alloc;
    b->t.free = g_free;
    b->t.upload = g_upload;
    b->t.download = g_download;
    b->t.upload_async = g_upload_async;
    b->t.download_async = g_download_async;
    b->t.copy_wait = g_copy_wait;
    b->t.sync = g_sync;
    b->t.copy = g_copy;
    b->t.zero = g_zero;
    b->t.host_alloc = g_host_alloc;
    b->t.host_free = g_host_free;
    b->t.error = g_error;
    b->t.close = g_close;
    b->t.bind = g_bind;
    b->t.gemm = g_gemm;
    b->t.gemm_batched = g_gemm_batched;
    b->t.bias_act = g_bias_act;
    b->t.col_sum = g_col_sum;
    b->t.relu_grad = g_relu_grad;
    b->t.copy2d = g_copy2d;
    b->t.add2d = g_add2d;
    b->t.scale = g_scale;
    b->t.fill = g_fill;
    b->t.tril_pack = g_tril_pack;
    b->t.tril_unpack = g_tril_unpack;
    b->t.gather_rows = g_gather_rows;
    b->t.scatter_add_rows = g_scatter_add_rows;
    b->t.pool = g_pool;
    b->t.pool_grad = g_pool_grad;
    b->t.fm = g_fm;
    b->t.fm_grad = g_fm_grad;
    b->t.bce = g_bce;
    b->t.opt_step = g_opt_step;
    *out = &b->t;
    return 0;
}
